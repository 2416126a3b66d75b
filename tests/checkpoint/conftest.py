"""Fixtures for the checkpoint store tests: store URLs on each backend, and a real S3 endpoint (moto)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import fsspec
import pytest


@pytest.fixture(params=["memory", "file"])
def url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """A fresh, empty store URL on each backend that needs no server."""
    if request.param == "file":
        yield f"file://{tmp_path}/run"
        return
    root = f"/ckpt-test-{uuid.uuid4().hex}"
    yield f"memory://{root}/run"
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on a free local port (port=0; moto 5.2.5 reports the bound port through
    get_host_and_port()). Yields its endpoint URL; stops the server and drops cached s3fs clients after."""
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()
