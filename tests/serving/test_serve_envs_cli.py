"""`gymflow serve-envs`: a bad option is exit 2 with a message naming it, before anything starts; a good one serves
until SIGTERM, printing the URL an OpenEnv client connects to, and exits 0."""
from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest
from openenv.core import GenericEnvClient

COMMAND = [sys.executable, "-m", "flows.tooling.cli", "serve-envs"]


@pytest.mark.parametrize("options, message", [
    (["--task", "Pong-v5"], "unknown task 'Pong-v5'; servable: MuJoCo tasks"),
    (["--task", "Hopper-v5", "--num-envs", "0"], "num_envs: Input should be greater than or equal to 1"),
])
def test_a_bad_option_is_exit_2_naming_it(options: list[str], message: str) -> None:
    done = subprocess.run(COMMAND + options, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and message in done.stderr


@pytest.mark.slow
def test_the_command_serves_an_openenv_client_until_sigterm() -> None:
    server = subprocess.Popen(COMMAND + ["--task", "Hopper-v5", "--num-envs", "4", "--port", "0", "--workers", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()  # type: ignore[union-attr]
        url = re.search(r"at (http://gymflow:\S+@127\.0\.0\.1:\d+) ", line)
        assert url, line + server.stderr.read()  # type: ignore[union-attr]
        with GenericEnvClient(base_url=url.group(1)).sync() as env:
            assert len(env.reset(seed=0).observation["obs"]) == 4
            assert len(env.step({"actions": [[0.0] * 3] * 4}).observation["rewards"]) == 4
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    finally:
        server.kill()
        server.wait()
