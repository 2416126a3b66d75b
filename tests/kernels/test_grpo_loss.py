"""The grpo_loss op's contract: the formula on a hand-worked example, per-token weights (masking, normalization,
a rank's share of a global minibatch) and every candidate verified against the reference."""

from __future__ import annotations

import os
from math import exp

import pytest
import torch
import torch.nn.functional as F

from gymflow_kernels import REFERENCE, CandidateUnavailable, get_op
from gymflow_kernels.verify import build_cases, verify

OP = get_op("grpo_loss")
IMPLEMENTATIONS = [REFERENCE, "fused", "cpp"]
"""What a plain run may dispatch to (the compile candidate is opt-in: verified below when asked for)."""


def run(name: str, *args: object) -> tuple[torch.Tensor, ...]:
    """`name`'s outputs; skips the test where the implementation cannot run (the C++ one needs a compiler)."""
    try:
        return OP.implementations()[name](*args)
    except CandidateUnavailable as err:
        pytest.skip(str(err))


def loss_and_grad(name: str, logprobs: torch.Tensor, *rest: object) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(outputs, d loss / d logprobs) of one call."""
    logprobs = logprobs.detach().requires_grad_(True)
    outputs = run(name, logprobs, *rest)
    return tuple(o.detach() for o in outputs), torch.autograd.grad(outputs[0], logprobs)[0]


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_matches_a_hand_computation(name: str) -> None:
    """B=2, T=3, each token picked to take one branch of min(); the last token has weight 0."""
    log_ratio = torch.tensor([[0.1, -0.5, 0.4], [0.3, 0.0, -0.1]])  # logprobs - old_logprobs
    log_ref_ratio = [[0.2, 0.0, -0.1], [0.0, 0.5, 0.1]]  # ref_logprobs - logprobs
    logprobs = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]])
    advantages = torch.tensor([1.0, -2.0])
    weights = torch.tensor([[0.25, 0.5, 0.125], [0.1, 0.2, 0.0]])
    clip_eps, beta = 0.2, 0.1
    # Row 0, A = 1: ratio e^0.1 lies inside [0.8, 1.2]; e^-0.5 = 0.61 lies below and min() keeps it (clipped, but
    # the gradient flows); e^0.4 = 1.49 lies above and min() keeps the constant 1.2 (no gradient).
    # Row 1, A = -2: e^0.3 = 1.35 lies above and min(-2 e^0.3, -2.4) keeps the unclipped; ratio 1 is a tie whose
    # branches have the same gradient; the last token has weight 0.
    k3 = [[exp(d) - d - 1 for d in row] for row in log_ref_ratio]
    loss = (0.25 * (-exp(0.1) + beta * k3[0][0]) + 0.5 * (-exp(-0.5) + beta * k3[0][1])
            + 0.125 * (-1.2 + beta * k3[0][2]) + 0.1 * (2 * exp(0.3) + beta * k3[1][0]) + 0.2 * (2 + beta * k3[1][1]))
    grad = [[0.25 * (-exp(0.1) + beta * (1 - exp(0.2))), 0.5 * (-exp(-0.5) + beta * (1 - exp(0.0))),
             0.125 * (0 + beta * (1 - exp(-0.1)))],
            [0.1 * (2 * exp(0.3) + beta * (1 - exp(0.0))), 0.2 * (2 + beta * (1 - exp(0.5))), 0.0]]
    kl = (k3[0][0] + k3[0][1] + k3[0][2] + k3[1][0] + k3[1][1]) / 5
    clip_fraction = 3 / 5  # e^-0.5, e^0.4 and e^0.3 of the five counted tokens

    outputs, found_grad = loss_and_grad(name, logprobs, logprobs - log_ratio, logprobs + torch.tensor(log_ref_ratio),
                                        advantages, weights, clip_eps, beta)
    torch.testing.assert_close(torch.stack(outputs), torch.tensor([loss, kl, clip_fraction]))
    torch.testing.assert_close(found_grad, torch.tensor(grad))


@pytest.mark.parametrize("padding", [-30.0, float("-inf"), float("nan")])
@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_a_token_of_weight_zero_changes_nothing(name: str, padding: float) -> None:
    """Whatever a weight-0 token's log-prob holds (another value, -inf, NaN), loss, statistics and gradient stay
    bit for bit the same; the token's own gradient is 0."""
    logprobs, old, ref, advantages, weights, clip_eps, beta = OP.make_inputs({"B": 16, "T": 9}, 0)
    dead = weights == 0
    assert dead.any() and (~dead).any()
    want, want_grad = loss_and_grad(name, logprobs, old, ref, advantages, weights, clip_eps, beta)
    found, found_grad = loss_and_grad(name, logprobs.masked_fill(dead, padding), old, ref, advantages, weights,
                                      clip_eps, beta)
    assert all(torch.equal(a, b) for a, b in zip(want, found))
    assert torch.equal(found_grad, want_grad) and not found_grad[dead].any()


@pytest.mark.parametrize("normalization", ["sequence", "token"])
@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_two_ranks_averaging_gradients_equal_one_process(name: str, normalization: str) -> None:
    """What the trainer relies on: each of K ranks takes its rows with the global minibatch's weights times K, and
    the mean of the ranks' gradients (what DDP's all-reduce makes) is the whole minibatch's gradient."""
    torch.manual_seed(0)
    B, T, D, ranks = 8, 6, 4, 2
    features, theta = torch.randn(B, T, D), torch.randn(D, requires_grad=True)

    def logprobs(rows: torch.Tensor) -> torch.Tensor:
        return -F.softplus(features[rows] @ theta)

    everything = torch.arange(B)
    old = logprobs(everything).detach() + 0.3 * torch.randn(B, T)
    ref = logprobs(everything).detach() + 0.3 * torch.randn(B, T)
    advantages = torch.randn(B)
    mask = (torch.arange(T) < torch.tensor([6, 2, 0, 5, 1, 6, 3, 4])[:, None]).float()
    weights = mask / (mask.sum(1, keepdim=True).clamp(min=1) * B) if normalization == "sequence" else mask / mask.sum()

    def loss(rows: torch.Tensor, scale: int) -> torch.Tensor:
        return run(name, logprobs(rows), old[rows], ref[rows], advantages[rows], weights[rows] * scale, 0.2, 0.04)[0]

    whole = torch.autograd.grad(loss(everything, 1), theta)[0]
    per_rank = [torch.autograd.grad(loss(rows, ranks), theta)[0] for rows in everything.chunk(ranks)]
    torch.testing.assert_close(torch.stack(per_rank).mean(0), whole, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_all_zero_weights_give_zeros_not_nan(name: str, beta: float) -> None:
    inputs = OP.make_inputs({"B": 4, "T": 5, "weights": "zero", "beta": beta}, 0)
    outputs, grad = loss_and_grad(name, *inputs)
    assert all(torch.equal(o, torch.tensor(0.0)) for o in outputs)
    assert torch.equal(grad, torch.zeros(4, 5))


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_mismatched_arguments_are_refused_not_broadcast(name: str) -> None:
    logprobs, old, ref, advantages, weights, clip_eps, beta = OP.make_inputs({"B": 4, "T": 5}, 0)
    with pytest.raises(ValueError, match=r"\[B\] advantages; found .*advantages \(4, 1\)"):
        run(name, logprobs, old, ref, advantages[:, None], weights, clip_eps, beta)
    with pytest.raises(ValueError, match="beta is 0.04 but ref_logprobs is None"):
        run(name, logprobs, old, None, advantages, weights, clip_eps, beta)


CANDIDATES = [
    pytest.param(name, marks=pytest.mark.skipif(
        name == "compile" and os.environ.get("GYMFLOW_KERNELS_COMPILE") != "1",
        reason="torch.compile: a cold compile takes minutes here; set GYMFLOW_KERNELS_COMPILE=1"))
    for name in OP.candidates
]


@pytest.mark.parametrize("name", CANDIDATES)
def test_every_candidate_passes_verification_at_the_default_shape_and_edge_cases(name: str) -> None:
    verdict = verify(OP, OP.candidates[name], build_cases(OP, OP.default_shapes[0]))
    if verdict.reason and verdict.reason.startswith("unavailable:"):
        pytest.skip(verdict.reason)
    assert verdict.ok, verdict.reason


def test_padding_that_leaks_into_the_loss_is_rejected() -> None:
    """The NaN-padding edge case has teeth: multiplying every token's term by its weight is not enough."""

    def leaky(logprobs, old, ref, advantages, weights, clip_eps, beta):
        loss, kl, clip_fraction = OP.reference(logprobs, old, ref, advantages, weights, clip_eps, beta)
        return loss + (logprobs * weights).sum() * 0, kl, clip_fraction  # NaN * 0 is NaN

    verdict = verify(OP, leaky, build_cases(OP, {"B": 4, "T": 3}))
    assert not verdict.ok and "NaN" in verdict.reason and "'padding': 'nan'" in verdict.reason
