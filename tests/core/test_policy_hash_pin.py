"""Pinned results: refactors are held to the exact bits the math gave before them.

A tiny in-process run (seed 0, reference kernels, one rank) must end at the same policy hash as at commit 2455d0d,
before the algorithm seam existed; so must the overlapped (decoupled PPO) schedule. The in-process loop computes the
flow's weights bit for bit (tests/flows/test_train_control.py), so this pins the flow too. A change that means to
alter the math updates these hashes in the same commit and says why. Float results can differ on another CPU
family (vector widths change summation order); the pins hold on the machines this project runs CI on.
"""
from __future__ import annotations

import pytest

from rl_core.algos.ppo.in_process import train_in_process
from rl_core.config.presets import build_control_config

PINNED = {
    "tiny": ({}, "47cadb5b294147fd14905eb2bb00366cc71b017519bd7edd8d3464a3a536ae1e"),
    "tiny-overlap-3": ({"overlap": True, "iterations": 3},
                       "6538db77eb8b19be13250c3bb2b796c248c167ab59ce3ab052e4164173b063ef"),
}


@pytest.mark.parametrize("name", PINNED)
def test_tiny_run_keeps_its_policy_hash(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    overrides, expected = PINNED[name]
    monkeypatch.setenv("GYMFLOW_KERNELS", "reference")
    result = train_in_process(build_control_config("tiny", run_name="pin", seed=0, num_ranks=1, **overrides))
    assert result.policy_sha256 == expected
