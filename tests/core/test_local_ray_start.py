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


def test_shutting_down_a_local_ray_leaves_none_of_its_processes() -> None:
    """`shutdown_local_ray` (the command line's exit) kills the autoscaler monitor itself, then shuts Ray down: no
    process of that Ray may be left, and the monitor must not be told to stop while the GCS lives (it then reports
    "The autoscaler failed" to the driver)."""
    done = _python(
        "import os, time, ray\n"
        "from ray._private import ray_constants\n"
        "from rl_core.runtime.local_ray import ensure_ray, shutdown_local_ray\n"
        "shutdown_local_ray()  # no Ray yet: nothing to do\n"
        "ensure_ray(2)\n"
        "node = ray._private.worker._global_node\n"
        "procs = [i.process for infos in node.all_processes.values() for i in infos]\n"
        "assert ray_constants.PROCESS_TYPE_MONITOR in node.all_processes, sorted(node.all_processes)\n"
        "shutdown_local_ray()\n"
        "assert not ray.is_initialized()\n"
        "left = [p.pid for p in procs if p.poll() is None]\n"
        "assert not left, f'still running: {left}'\n"
        "print('stopped', len(procs))\n"
    )
    assert done.returncode == 0 and "stopped" in done.stdout, done.stderr[-3000:]
    assert "autoscaler failed" not in done.stderr


def test_a_joined_ray_is_left_to_rays_own_exit_handler() -> None:
    """A Ray this process did not start (here: `ray.init` called directly, as for a cluster in RAY_ADDRESS) is
    not shut down by `shutdown_local_ray`."""
    done = _python(
        "import ray\n"
        "from rl_core.runtime.local_ray import shutdown_local_ray\n"
        "ray.init(num_cpus=1, include_dashboard=False)\n"
        "shutdown_local_ray()\n"
        "assert ray.is_initialized()\n"
        "ray.shutdown()\n"
        "print('left alone')\n"
    )
    assert done.returncode == 0 and "left alone" in done.stdout, done.stderr[-3000:]
