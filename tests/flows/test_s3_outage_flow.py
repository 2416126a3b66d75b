"""The S3 endpoint of a run's store goes away mid-run (moto's server stopped after version 2, started again 8 s
later on the same port, with what it stored): the run recovers (the task retries, or the same command again when
they ran out) and ends bit-identical to a run that never saw the outage, with every version verifying."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from rl_core.algos.base import policy_sha256
from rl_core.checkpoint import CheckpointStore
from tests.s3_server import RestartableS3

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

ITERATIONS = 6
KEYS = {"AWS_ACCESS_KEY_ID": "AKIAOUTAGEFLOW", "AWS_SECRET_ACCESS_KEY": "outage-flow-secret"}


def test_an_s3_outage_mid_run_is_recovered_bit_identical(s3_server: RestartableS3, tmp_path) -> None:
    import s3fs

    from rl_core.algos.ppo.in_process import train_in_process
    from rl_core.config.presets import build_control_config

    undisturbed = train_in_process(build_control_config("quick", run_name="undisturbed", seed=0, num_ranks=1,
                                                iterations=ITERATIONS))
    fs = s3fs.S3FileSystem(key=KEYS["AWS_ACCESS_KEY_ID"], secret=KEYS["AWS_SECRET_ACCESS_KEY"],
                           client_kwargs={"endpoint_url": s3_server.endpoint}, skip_instance_cache=True)
    fs.mkdir("outage")
    env = {**os.environ, **KEYS, "AWS_ENDPOINT_URL": s3_server.endpoint, "PREFECT_HOME": str(tmp_path / "prefect")}
    cmd = [sys.executable, "-m", "flows.tooling.cli", "train", "--preset", "quick", "--seed", "0", "--num-ranks", "1",
           "--iterations", str(ITERATIONS), "--run-name", "outage", "--store", "s3://outage/runs"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    marker = "outage/runs/outage/checkpoints/versions/00000002.commit"
    deadline = time.monotonic() + 600
    while not fs.exists(marker):
        assert first.poll() is None and time.monotonic() < deadline, "the run did not reach version 2"
        fs.invalidate_cache()
        time.sleep(0.2)
    s3_server.stop()
    time.sleep(8)
    s3_server.start()
    output = first.communicate(timeout=900)[0]
    if first.returncode != 0:  # the retries ran out during the outage: the same command again, as a user would
        assert "StorageError" in output or "checkpoint store s3://outage/runs" in output or "Connect" in output, \
            output[-3000:]
        again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    store = CheckpointStore("s3://outage/runs/outage/checkpoints", storage_options={
        "key": KEYS["AWS_ACCESS_KEY_ID"], "secret": KEYS["AWS_SECRET_ACCESS_KEY"],
        "client_kwargs": {"endpoint_url": s3_server.endpoint}})
    assert store.versions() == list(range(ITERATIONS + 1)) and store.verify()["errors"] == {}
    assert policy_sha256(store.load().tensors) == undisturbed.policy_sha256
