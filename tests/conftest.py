"""Test-session isolation: Prefect, kernel caches and runs live in a temp dir; Ray stays on loopback.

Set before prefect or ray is imported (pytest imports this file first), so no test reads or writes the
user's ~/.prefect, tuned kernels or ./runs, and a cache hit can never leak in from a dev run.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile

_SESSION_DIR = tempfile.mkdtemp(prefix="gymflow-tests-")
# Removed when the session's process exits, whichever tests ran (a run of tests that start no Ray used to leave it).
atexit.register(shutil.rmtree, _SESSION_DIR, ignore_errors=True)
os.environ["PREFECT_HOME"] = os.path.join(_SESSION_DIR, "prefect")
os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = os.path.join(_SESSION_DIR, "prefect", "results")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
os.environ.setdefault("GYMFLOW_CACHE_DIR", os.path.join(_SESSION_DIR, "cache"))
os.environ.pop("RAY_ADDRESS", None)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

# A session started as a background job of a non-interactive shell (`make test &`, some CI runners) inherits SIGINT
# ignored, and so would every process it starts. Prefect's worker stops on SIGTERM by sending itself SIGINT: with
# SIGINT ignored it goes on polling (measured: still running 60 s after the drills' SIGTERM). Processes exec'd from
# here get SIGINT's default (tests/test_session_signals.py).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from tests.s3_server import RestartableS3  # noqa: E402

# Property tests (tests/*/test_*_fuzz.py): 50 cases each, no per-case deadline (a CI machine under load is slow, not
# wrong), and no example database left in the checkout; a failing case is printed with its reproduction.
settings.register_profile("gymflow", max_examples=50, deadline=None, database=None)
settings.load_profile("gymflow")


@pytest.fixture(scope="session")
def session_dir() -> Iterator[str]:
    """The session's private temp dir (removed at exit)."""
    yield _SESSION_DIR


@pytest.fixture(scope="session")
def local_ray(session_dir: str) -> Iterator[None]:
    """A Ray started by this test session (on 127.0.0.1), shut down by it: never someone else's Ray."""
    import ray

    from rl_core.runtime.local_ray import ensure_ray

    ensure_ray(4)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def prefect_api(session_dir: str) -> Iterator[None]:
    """A throw-away Prefect API and database for the session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def s3_server() -> Iterator[RestartableS3]:
    """A moto S3 server of this test's own, which the test may stop and restart (outage tests)."""
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    server = RestartableS3(moto_server)
    try:
        yield server
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()
