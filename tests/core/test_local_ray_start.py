"""`start_ray_in_background`: the command line starts Ray on a thread while it imports torch and Prefect.

Each check runs in a fresh interpreter: this test session already has its Ray (conftest), and a background start is
once per process.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local Ray of the child's own
    return subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)


def test_a_ray_started_in_the_background_outlives_its_start_and_serves_the_main_thread() -> None:
    # Ray starts its processes with PR_SET_PDEATHSIG, which fires when the starting *thread* ends: a thread that
    # returned after `ray.init` would take the GCS and the raylet with it, and the task below would never run.
    done = _python(
        "import signal, time, ray\n"
        "from rl_core.runtime.local_ray import ensure_ray, start_ray_in_background\n"
        "start_ray_in_background(2)\n"
        "ensure_ray(2)\n"
        "assert ray.is_initialized()\n"
        "assert callable(signal.getsignal(signal.SIGTERM)), 'the handler ray.init sets on the main thread'\n"
        "def flow_runs_handler(signum, frame):\n"
        "    pass\n"
        "signal.signal(signal.SIGTERM, flow_runs_handler)  # as a flow run installs its own\n"
        "ensure_ray(2)  # the flow's steps call it again\n"
        "assert signal.getsignal(signal.SIGTERM) is flow_runs_handler, 'a later ensure_ray replaced it'\n"
        "time.sleep(3)\n"
        "@ray.remote\n"
        "def answer():\n"
        "    return 42\n"
        "assert ray.get(answer.remote(), timeout=60) == 42\n"
        "ray.shutdown()\n"
        "print('served')\n"
    )
    assert done.returncode == 0 and "served" in done.stdout, done.stderr[-3000:]
    assert "SIGTERM handler is not set" not in done.stderr


def test_a_failed_background_start_is_raised_to_the_caller_that_waits() -> None:
    done = _python(
        "import rl_core.runtime.local_ray as local_ray\n"
        "def refused(num_cpus):\n"
        "    raise ConnectionError('the raylet did not start')\n"
        "local_ray._init_ray = refused\n"
        "local_ray.start_ray_in_background(2)\n"
        "try:\n"
        "    local_ray.ensure_ray(2)\n"
        "except ConnectionError as err:\n"
        "    print('raised:', err)\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "raised: the raylet did not start" in done.stdout
