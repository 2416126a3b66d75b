"""A local trainer group meets through a FileStore in a temp folder that a killed run cannot remove; the next group
removes the folders whose process is gone, and nothing else."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from rl_core.runtime.trainer_group import remove_orphaned_rendezvous_dirs


def test_only_the_folders_of_processes_that_are_gone_are_removed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)
    orphaned = tmp_path / f"gymflow-nightly-ranks-{gone}-k2f9x1"
    orphaned.mkdir()
    (orphaned / "store").write_bytes(b"rendezvous")
    kept = [
        tmp_path / f"gymflow-nightly-ranks-{os.getpid()}-a8d0qz",  # a live run's
        tmp_path / f"gymflow-my-ranks-run-ranks-{os.getpid()}-b7c1mm",  # a live run whose name holds "-ranks-"
        tmp_path / "gymflow-nightly-ranks-7ynl3cr7",  # the layout before the pid was in the name
        tmp_path / "gymflow-tests-0yjioe_t",  # not a rendezvous folder
    ]
    for path in kept:
        path.mkdir()
    assert remove_orphaned_rendezvous_dirs() == [str(orphaned)]
    assert not orphaned.exists()
    assert all(path.exists() for path in kept)
