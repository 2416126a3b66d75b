"""Processes the tests start can be stopped the way an operator stops them, however the session was started."""
from __future__ import annotations

import subprocess
import sys


def test_a_process_started_by_the_tests_gets_sigints_default() -> None:
    """A worker (`prefect worker start`) stops on SIGTERM by sending itself SIGINT; were SIGINT ignored (a session
    started as a background job of a script), the drills' workers would never stop (tests/conftest.py)."""
    child = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT).__name__)"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "default_int_handler"
