"""A whole run with fake credentials (S3 keys for its store, a kernel proposer's API key): none of them appears in the
command's output, Prefect's database (flow run parameters, task results, artifacts, logs), Ray's session files (its
logs, the runtime_env it stored) or any object the run stored."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SECRETS = {"AWS_ACCESS_KEY_ID": "AKIAGYMFLOWFAKE4LEAK", "AWS_SECRET_ACCESS_KEY": "fake+Gymflow/Secret9f3e1c7b2d",
           "GYMFLOW_KERNEL_PROPOSER_API_KEY": "sk-gymflow-fake-proposer-5a1d"}


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def test_fake_credentials_reach_no_output_database_ray_file_or_stored_object(tmp_path: Path) -> None:
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        s3 = s3fs.S3FileSystem(key=SECRETS["AWS_ACCESS_KEY_ID"], secret=SECRETS["AWS_SECRET_ACCESS_KEY"],
                               client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)
        s3.mkdir("leak-bucket")
        env = {**os.environ, **SECRETS, "AWS_ENDPOINT_URL": endpoint, "PREFECT_HOME": str(tmp_path / "prefect"),
               "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(tmp_path / "prefect" / "results"), "RAY_TMPDIR": str(ray_tmp)}
        done = subprocess.run([sys.executable, "-m", "flows.tooling.cli", "train", "--preset", "tiny", "--run-name", "leak",
                               "--store", "s3://leak-bucket/runs"], env=env, capture_output=True, check=False,
                              timeout=600)
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
        stored = {path: s3.cat_file(path) for path in s3.find("leak-bucket")}
        assert any(p.endswith("00000002.commit") for p in stored), sorted(stored)
        prefect_files, ray_files = _files(tmp_path / "prefect"), _files(ray_tmp)
        assert any(p.endswith("prefect.db") for p in prefect_files) and any("session_" in p for p in ray_files)
        places = {"stdout": done.stdout, "stderr": done.stderr, **prefect_files, **ray_files, **stored}
        for name, secret in SECRETS.items():
            leaks = [place for place, data in places.items() if secret.encode() in data]
            assert not leaks, f"{name} appears in {leaks}"
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
