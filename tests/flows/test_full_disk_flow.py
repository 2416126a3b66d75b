"""The disk under a run's store fills up mid-run (a 64 MiB tmpfs, filled to the last byte once version 2 is
committed): the command fails with an error that says so, no committed version is lost or altered, and once space
is free the same command finishes the run, bit-identical to a run that never ran out of space."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_core.algos.base import policy_sha256
from rl_core.checkpoint import CheckpointStore
from tests.small_disk import small_disk

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

ITERATIONS = 6


@pytest.fixture(name="small_disk")
def small_disk_fixture(tmp_path) -> Iterator[Path]:
    with small_disk(tmp_path, "64m") as mount:
        yield mount


def _fill(disk: Path) -> Path:
    """A file taking every free byte of `disk`."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:  # unbuffered: each write either lands or raises ENOSPC
        for block in (1 << 20, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * block)
            except OSError:
                pass
    return filler


def test_a_full_disk_mid_run_fails_clearly_and_the_rerun_finishes_bit_identical(small_disk: Path, tmp_path) -> None:
    from rl_core.algos.ppo.in_process import train_in_process
    from rl_core.config.presets import build_control_config

    undisturbed = train_in_process(build_control_config("quick", run_name="undisturbed", seed=0, num_ranks=1,
                                                iterations=ITERATIONS))
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    cmd = [sys.executable, "-m", "flows.tooling.cli", "train", "--preset", "quick", "--seed", "0", "--num-ranks", "1",
           "--iterations", str(ITERATIONS), "--run-name", "full", "--store", f"file://{small_disk}/runs"]
    run = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    versions = small_disk / "runs" / "full" / "checkpoints" / "versions"
    deadline = time.monotonic() + 600
    while not (versions / "00000002.commit").exists():
        assert run.poll() is None and time.monotonic() < deadline, "the run did not reach version 2"
        time.sleep(0.05)
    filler = _fill(small_disk)
    before = {p.name: p.read_bytes() for p in versions.iterdir()}
    output = run.communicate(timeout=900)[0]
    assert run.returncode == 1, output[-3000:]
    assert "No space left on device" in output, output[-3000:]
    assert all((versions / name).read_bytes() == data for name, data in before.items())  # nothing lost or altered
    filler.unlink()
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    store = CheckpointStore(f"file://{small_disk}/runs/full/checkpoints")
    assert store.versions() == list(range(ITERATIONS + 1)) and store.verify()["errors"] == {}
    assert policy_sha256(store.load().tensors) == undisturbed.policy_sha256
