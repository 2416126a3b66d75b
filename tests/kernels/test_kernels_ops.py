"""Every op's candidates match its reference (outputs and gradients), on random and edge inputs, fp32 and bf16."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time

import pytest
import torch

import gymflow_kernels as kernels
from gymflow_kernels import COMPILE, CandidateUnavailable, get_op, registered_ops
from gymflow_kernels.verify import build_cases, verify

SHAPES = {
    "discounted_returns": {"T": 37, "N": 5},
    "ppo_loss": {"B": 37},
    "grpo_loss": {"B": 12, "T": 9},
    "token_logprobs": {"B": 2, "T": 5, "D": 16, "V": 50},
    "policy_mlp_forward": {"B": 9, "D": 17, "H": 16, "A": 6},
    "ppo_grad": {"B": 9, "D": 17, "H": 16, "A": 6},
}
"""Small test shapes per op (GAE has its own tests); edge cases come with each op."""

CPU_CANDIDATES = [(op, name) for op in SHAPES for name in get_op(op).eligible("cpu")]


def _verify_or_skip(op_name: str, name: str, shape: dict):
    op = get_op(op_name)
    verdict = verify(op, op.candidates[name], build_cases(op, shape))
    if verdict.reason and verdict.reason.startswith("unavailable:"):
        pytest.skip(f"{op_name}/{name} cannot run here: {verdict.reason}")
    return verdict


def test_every_op_of_the_issue_is_registered() -> None:
    assert {"gae", *SHAPES} <= set(registered_ops())


@pytest.mark.parametrize(("op_name", "name"), CPU_CANDIDATES, ids=[f"{o}-{n}" for o, n in CPU_CANDIDATES])
def test_candidate_matches_reference_outputs_and_gradients(op_name: str, name: str) -> None:
    verdict = _verify_or_skip(op_name, name, SHAPES[op_name])
    assert verdict.ok, verdict.reason
    assert verdict.nonfinite == 0


BF16 = [("ppo_loss", "fused"), ("grpo_loss", "fused"), ("token_logprobs", "logsumexp"), ("token_logprobs", "fused"),
        ("token_logprobs", "chunked"), ("policy_mlp_forward", "addmm"), ("policy_mlp_forward", "stacked")]
"""Not ppo_grad: a whole network's gradient summed in bf16 differs by a few percent with summation order alone."""


@pytest.mark.parametrize(("op_name", "name"), BF16, ids=[f"{o}-{n}" for o, n in BF16])
def test_torch_candidates_match_reference_in_bfloat16(op_name: str, name: str) -> None:
    """bf16 buckets are verified in bf16 (edge cases too), at the bf16 tolerance."""
    verdict = _verify_or_skip(op_name, name, {**SHAPES[op_name], "dtype": "bfloat16"})
    assert verdict.ok, verdict.reason


def test_float32_only_candidates_are_rejected_for_bfloat16_buckets_not_run_on_garbage() -> None:
    op = get_op("ppo_loss")
    verdict = verify(op, op.candidates["numpy"], build_cases(op, {"B": 8, "dtype": "bfloat16"}))
    assert not verdict.ok and "reads float32 CPU memory directly" in verdict.reason


def test_chunked_log_probs_match_for_any_chunk_size() -> None:
    """Tiny chunks exercise many chunks and a ragged last one, forward and backward."""
    from gymflow_kernels.logprobs import token_logprobs_chunked

    op = get_op("token_logprobs")
    for chunk_elements in (1, 50 * 3, 50 * 7):
        candidate = lambda h, w, t: token_logprobs_chunked(h, w, t, chunk_elements=chunk_elements)  # noqa: E731
        verdict = verify(op, candidate, build_cases(op, {"B": 3, "T": 7, "D": 8, "V": 50}))
        assert verdict.ok, verdict.reason


def test_wrong_gradient_is_rejected_even_when_the_loss_is_right() -> None:
    op = get_op("ppo_loss")

    def doubled_value_gradient(new_logprob, old_logprob, advantages, value, *rest):
        value = value + value.detach() * 0 + (value - value.detach())  # same value, twice the gradient
        return op.reference(new_logprob, old_logprob, advantages, value, *rest)

    verdict = verify(op, doubled_value_gradient, build_cases(op, {"B": 16}))
    assert not verdict.ok and "gradient w.r.t. argument 3 differs" in verdict.reason


def test_detached_loss_is_rejected() -> None:
    op = get_op("grpo_loss")

    def detached(*args):
        loss, *stats = op.reference(*args)
        return (loss.detach(), *stats)

    verdict = verify(op, detached, build_cases(op, SHAPES["grpo_loss"]))
    assert not verdict.ok and "carries no gradient" in verdict.reason


def test_ppo_loss_reference_is_bit_identical_to_the_trainers_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel reference repeats the readable loss of rl_core/algos/ppo/update.py op for op (nothing tuned: that loss
    runs itself), so an untuned run and one pinned to references compute the same bits."""
    from rl_core.algos.ppo.update import RolloutBatch, ppo_loss
    from rl_core.config.control import PPOConfig
    from rl_core.policies.mlp import ActorCritic

    monkeypatch.setenv("GYMFLOW_KERNELS", "reference")

    torch.manual_seed(0)
    model, B = ActorCritic(5, 2), 64
    batch = RolloutBatch(torch.randn(B, 5), torch.randn(B, 2), torch.randn(B) - 2, torch.randn(B), torch.randn(B),
                         torch.randn(B))
    idx, adv = torch.arange(0, B, 2), torch.randn(B // 2)
    for cfg in (PPOConfig(), PPOConfig(clip_vloss=True, ent_coef=0.01)):
        model.zero_grad()
        loss, stats = ppo_loss(model, batch, idx, adv, cfg)
        loss.backward()
        want = [loss.detach(), *stats.values(), *(p.grad.clone() for p in model.parameters())]
        model.zero_grad()
        dist = model.distribution(batch.obs[idx])
        outputs = get_op("ppo_loss").reference(
            dist.log_prob(batch.actions[idx]).sum(-1), batch.logprobs[idx], adv, model.value(batch.obs[idx]),
            batch.values[idx], batch.returns[idx], dist.entropy().sum(-1), cfg.clip_coef, cfg.vf_coef,
            cfg.ent_coef, cfg.clip_vloss)
        outputs[0].backward()
        found = [outputs[0].detach(), *outputs[1:], *(p.grad.clone() for p in model.parameters())]
        assert all(torch.equal(a, b) for a, b in zip(want, found))


@pytest.mark.parametrize("winner", ["fused", "numpy", "cpp"])
def test_ppo_loss_fast_path_is_the_tuned_kernel_called_by_keyword(winner: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a winner is tuned, rl_core's `ppo_loss` runs it (its fast path): same loss, statistics and gradients
    within the verifier's tolerance."""
    from rl_core.algos.ppo import update as ppo
    from rl_core.config.control import PPOConfig
    from rl_core.policies.mlp import ActorCritic

    torch.manual_seed(0)
    model, B = ActorCritic(5, 2), 64
    batch = ppo.RolloutBatch(torch.randn(B, 5), torch.randn(B, 2), torch.randn(B) - 2, torch.randn(B),
                             torch.randn(B), torch.randn(B))
    idx, adv, cfg = torch.arange(0, B, 2), torch.randn(B // 2), PPOConfig(clip_vloss=True, ent_coef=0.01)
    runs = []
    for chosen in (kernels.REFERENCE, winner):
        monkeypatch.setattr(ppo._ppo_loss, "choose", lambda *args, chosen=chosen: chosen)
        model.zero_grad()
        try:
            loss, stats = ppo.ppo_loss(model, batch, idx, adv, cfg)
        except CandidateUnavailable as err:  # the C++ one needs a compiler
            pytest.skip(str(err))
        loss.backward()
        runs.append([loss.detach(), *stats.values(), *(p.grad.clone() for p in model.parameters())])
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(*runs))


def test_ppo_grad_reference_is_bit_identical_to_the_trainers_autograd_path() -> None:
    """The update's fused route (`ppo_grad`, reference chosen) and its autograd route for other model shapes give
    the same bits, so which route a model takes changes nothing but speed; a tuned winner stays within 1e-5."""
    from rl_core.algos.ppo import update as ppo
    from rl_core.config.control import PPOConfig
    from rl_core.policies.mlp import ActorCritic

    torch.manual_seed(0)
    model, B = ActorCritic(5, 2), 64
    batch = ppo.RolloutBatch(torch.randn(B, 5), torch.randn(B, 2), torch.randn(B) - 2, torch.randn(B),
                             torch.randn(B), torch.randn(B))
    idx, adv = torch.arange(0, B, 2), torch.randn(B // 2)
    op = get_op("ppo_grad")
    for cfg in (PPOConfig(), PPOConfig(clip_vloss=True, ent_coef=0.01)):
        loss, stats = ppo.ppo_loss(model, batch, idx, adv, cfg)
        grads = torch.autograd.grad(loss, model.ordered_parameters)
        want = [torch.stack([loss.detach(), *stats.values()]), torch.cat([g.reshape(-1) for g in grads])]
        args = (batch.obs[idx], batch.actions[idx], batch.logprobs[idx], adv, batch.values[idx], batch.returns[idx],
                *model.ordered_parameters, cfg.clip_coef, cfg.vf_coef, cfg.ent_coef, cfg.clip_vloss)
        assert all(torch.equal(a, b) for a, b in zip(want, op.reference(*args)))
        for name in ("manual", "cpp"):
            found = op.candidates[name](*args)
            assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(want, found)), name


def test_triton_candidates_are_gpu_only_and_unavailable_without_cuda() -> None:
    for op_name in ("gae", "discounted_returns"):
        op = get_op(op_name)
        assert "triton" in op.candidates and "triton" not in op.eligible("cpu")
        assert "triton" in op.eligible("cuda")
    if not torch.cuda.is_available():
        op = get_op("discounted_returns")
        with pytest.raises(CandidateUnavailable, match="CUDA"):
            op.candidates["triton"](*op.make_inputs({"T": 4, "N": 2}, 0))


def test_compile_candidates_are_opt_in() -> None:
    for op_name in registered_ops():
        op = get_op(op_name)
        assert "compile" not in op.eligible("cpu")
        assert "compile" in op.eligible("cpu", {COMPILE})


@pytest.mark.skipif(os.environ.get("GYMFLOW_KERNELS_COMPILE") != "1",
                    reason="torch.compile smoke test: a cold compile takes minutes here; set GYMFLOW_KERNELS_COMPILE=1")
def test_compile_candidate_smoke() -> None:
    op = get_op("ppo_loss")
    verdict = verify(op, op.candidates["compile"], build_cases(op, {"B": 8}))
    assert verdict.ok, verdict.reason


TRITON_INTERPRETED_CHECK = """
import torch, triton
import gymflow_kernels.triton_scan as ts
from gymflow_kernels.gae import _deltas_and_decays, gae_reference, make_inputs
for shape, block in (({"T": 1, "N": 1}, 32), ({"T": 7, "N": 3, "dones": "all"}, 32), ({"T": 37, "N": 70}, 64)):
    r, v, d, nv, g, l = make_inputs(shape, 0)
    delta, decay = _deltas_and_decays(r, v, d, nv, g, l)
    out = torch.empty_like(delta)
    ts._backward_scan_kernel.fn[(triton.cdiv(shape["N"], block),)](delta, decay, out, shape["T"], shape["N"],
                                                                   BLOCK=block)
    torch.testing.assert_close(out, gae_reference(r, v, d, nv, g, l)[0], rtol=1e-4, atol=1e-4)
"""


def test_triton_scan_kernel_in_the_interpreter() -> None:
    """The Triton kernel's indexing and masking, checked on CPU by Triton's interpreter (the autotuner around it
    needs a GPU); skipped where triton is not installed, as on CPU-only machines."""
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # read when triton compiles: set before it is imported
    done = subprocess.run([sys.executable, "-c", TRITON_INTERPRETED_CHECK], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def _ppo_grad_on(cores: int, inputs: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    with kernels.using_cores(cores):
        return get_op("ppo_grad").candidates["cpp"](*inputs)


@pytest.mark.parametrize("shape", [*get_op("ppo_grad").edge_cases, {"B": 512, "D": 17, "H": 64, "A": 6}],
                         ids=lambda s: "x".join(f"{k}{v}" for k, v in s.items()))
def test_ppo_grad_cpp_on_two_cores_gives_the_same_bits_as_on_one(shape: dict) -> None:
    """The critic on the helper thread beside the actor: the same sums in the same order, so the same bits, call
    after call (the helper's hand-offs are exercised back to back and after it has gone to sleep)."""
    op = get_op("ppo_grad")
    inputs = op.make_inputs(shape, seed=3)
    want = _ppo_grad_on(1, inputs)
    for call in range(20):
        if call == 10:
            time.sleep(0.01)  # past the helper's spin: the next call wakes it from its condition variable
        found = _ppo_grad_on(2, inputs)
        assert all(torch.equal(a, b) for a, b in zip(want, found)), f"call {call}"


def test_ppo_grad_cpp_on_two_cores_from_two_threads_at_once_gives_each_its_own_bits() -> None:
    """Two callers share one helper (it holds one task): the second to arrive runs both halves itself."""
    op = get_op("ppo_grad")
    inputs = [op.make_inputs({"B": 256, "D": 17, "H": 64, "A": 6}, seed=seed) for seed in (5, 6)]
    want = [_ppo_grad_on(1, x) for x in inputs]

    def calls(k: int) -> bool:
        return all(all(torch.equal(a, b) for a, b in zip(want[k], _ppo_grad_on(2, inputs[k]))) for _ in range(200))

    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # ctypes drops the GIL: the two really overlap
        assert list(pool.map(calls, (0, 1))) == [True, True]


def _child_ppo_grad(inputs: tuple, queue: multiprocessing.Queue) -> None:
    queue.put([t.tolist() for t in _ppo_grad_on(2, inputs)])


def test_ppo_grad_cpp_on_two_cores_works_in_a_forked_child() -> None:
    """A fork inherits the parent's helper object but not its thread: the child starts its own instead of waiting
    forever for a thread that does not exist."""
    inputs = get_op("ppo_grad").make_inputs({"B": 64, "D": 17, "H": 64, "A": 6}, seed=4)
    want = _ppo_grad_on(2, inputs)  # the parent's helper is running
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_ppo_grad, args=(inputs, queue))
    child.start()
    try:
        found = queue.get(timeout=60)
        child.join(timeout=60)
    finally:
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert [t.tolist() for t in want] == found


def test_using_cores_refuses_less_than_one_core_and_restores_the_callers_count() -> None:
    with pytest.raises(ValueError, match="at least 1 core"), kernels.using_cores(0):
        pass
    with kernels.using_cores(2):
        assert kernels.parallel_cores() == 2
    assert kernels.parallel_cores() == 1
