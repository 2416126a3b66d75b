"""Importing gymflow sets none of its defaults; they are applied by explicit calls only.

Each check runs in a fresh interpreter whose environment has none of the variables, since this test session's
conftest sets them for every test.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PREFECT_SERVER_"))}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)


def test_imports_leave_the_environment_alone_and_ensure_ray_applies_loopback() -> None:
    done = _python(
        "import os\n"
        "import flows.train_control, flows.tooling.cli, rl_core.runtime.control.actors, tasks.simulate\n"
        "from flows.tooling.defaults import PREFECT_DEFAULTS\n"
        "from rl_core.runtime.local_ray import LOCAL_RAY_DEFAULTS\n"
        "ours = set(PREFECT_DEFAULTS) | set(LOCAL_RAY_DEFAULTS)\n"
        "assert not ours & set(os.environ), ours & set(os.environ)\n"
        "from ray._private import ray_constants\n"
        "assert ray_constants.ENABLE_RAY_CLUSTER  # ray was imported first: Linux's default\n"
        "from rl_core.runtime.local_ray import use_local_ray_defaults\n"
        "use_local_ray_defaults()\n"
        "assert os.environ['RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'] == '0' and not ray_constants.ENABLE_RAY_CLUSTER\n"
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_prefect_defaults_must_come_before_prefect() -> None:
    early = _python("from flows.tooling.defaults import apply_prefect_defaults; apply_prefect_defaults()\n"
                    "from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS as S\n"
                    "assert S.value() == 120, S.value()\n")
    assert early.returncode == 0, early.stderr[-2000:]
    late = _python("import prefect\nfrom flows.tooling.defaults import apply_prefect_defaults; apply_prefect_defaults()\n")
    assert late.returncode != 0 and "must run before prefect is imported" in late.stderr
