"""Ending a torch.distributed rank that a test started with `torch.multiprocessing.spawn`."""
from __future__ import annotations

import os
import sys

import torch.distributed as dist


def end_rank() -> None:
    """Destroy the process group, then leave without the interpreter's teardown.

    Why: on a loaded machine a rank that had finished its work and destroyed its gloo group still aborted in the
    teardown ("terminate called without an active exception", SIGABRT: gloo's worker threads meet a finalizing
    interpreter, pytorch/pytorch#179291), failing a test whose results were already written. The rank has nothing
    left to do, so it exits as the gymflow command does after its exit handlers.
    """
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
