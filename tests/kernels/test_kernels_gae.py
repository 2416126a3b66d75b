"""GAE implementations: every candidate matches the reference, and the reference follows the documented convention."""

from __future__ import annotations

import pytest
import torch

from gymflow_kernels import CandidateUnavailable, get_op
from gymflow_kernels.gae import bucket, gae_blocked, gae_reference, make_inputs
from gymflow_kernels.verify import build_cases, verify

GAE = get_op("gae")
PURE_PYTHON = sorted(name for name in GAE.eligible("cpu") if name != "cpp")  # compile is opt-in: not in CI


@pytest.mark.parametrize("name", PURE_PYTHON)
def test_candidate_matches_reference_on_random_and_edge_inputs(name: str) -> None:
    verdict = verify(GAE, GAE.candidates[name], build_cases(GAE, {"T": 37, "N": 5}))
    assert verdict.ok, verdict.reason
    assert verdict.nonfinite == 0


def test_cpp_candidate_matches_reference() -> None:
    """Builds the C++ loop on first use (about a second); skipped with the reason where it cannot be built."""
    try:
        GAE.candidates["cpp"](*make_inputs({"T": 2, "N": 2}, 0))
    except CandidateUnavailable as exc:
        pytest.skip(f"C++ candidate unavailable here: {exc}")
    verdict = verify(GAE, GAE.candidates["cpp"], build_cases(GAE, {"T": 37, "N": 5}))
    assert verdict.ok, verdict.reason


@pytest.fixture(scope="module")
def long_horizon() -> tuple[tuple, tuple]:
    """T=2048 with a few episode ends, and the reference's answer (computed once: the loop is slow)."""
    inputs = make_inputs({"T": 2048, "N": 4, "p_done": 0.01}, seed=7)
    return inputs, gae_reference(*inputs)


@pytest.mark.parametrize("name", PURE_PYTHON)
def test_candidate_holds_tolerance_over_long_horizon_with_episode_ends(name: str, long_horizon) -> None:
    inputs, expected = long_horizon
    for want, got in zip(expected, GAE.candidates[name](*inputs)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("block", [2, 3, 16])
def test_blocked_is_exact_for_any_block_size(block: int) -> None:
    """Small blocks exercise several levels of block chaining and padding of a ragged last block."""
    inputs = make_inputs({"T": 50, "N": 3, "p_done": 0.2}, seed=1)
    for want, got in zip(gae_reference(*inputs), gae_blocked(*inputs, block=block)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_reference_cuts_bootstrap_at_episode_end() -> None:
    """dones[t] = 1 means the episode ended with the action at t: nothing flows back across it."""
    rewards = torch.tensor([[1.0], [1.0]])
    values = torch.zeros(2, 1)
    dones = torch.tensor([[0.0], [1.0]])
    advantages, returns = gae_reference(rewards, values, dones, torch.tensor([10.0]), gamma=0.5, lam=1.0)
    # t=1: delta = 1 (next_value ignored, episode ended); t=0: delta = 1, plus 0.5 * 1 * A_1
    torch.testing.assert_close(advantages, torch.tensor([[1.5], [1.0]]))
    torch.testing.assert_close(returns, advantages + values)


def test_bucket_rounds_up_to_powers_of_two() -> None:
    assert bucket(make_inputs({"T": 200, "N": 50}, 0)) == {"T": 256, "N": 64}
    assert bucket(make_inputs({"T": 256, "N": 64}, 0)) == {"T": 256, "N": 64}
    assert bucket(make_inputs({"T": 1, "N": 1}, 0)) == {"T": 1, "N": 1}


def test_make_inputs_edge_modes() -> None:
    assert make_inputs({"T": 4, "N": 2, "dones": "all"}, 0)[2].eq(1).all()
    assert make_inputs({"T": 4, "N": 2, "dones": "none"}, 0)[2].eq(0).all()
    with pytest.raises(ValueError, match="'dones' must be"):
        make_inputs({"T": 4, "N": 2, "dones": "some"}, 0)


def test_cpp_candidate_rejects_mismatched_shapes_instead_of_reading_out_of_bounds() -> None:
    rewards, values, dones, next_value, gamma, lam = make_inputs({"T": 4, "N": 3}, 0)
    try:
        with pytest.raises(ValueError, match=r"found \(4, 3\), \(4, 3\), \(4, 3\) and \(2,\)"):
            GAE.candidates["cpp"](rewards, values, dones, next_value[:2], gamma, lam)
    except CandidateUnavailable as exc:
        pytest.skip(f"C++ candidate unavailable here: {exc}")
