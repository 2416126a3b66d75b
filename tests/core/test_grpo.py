"""GRPO's update: group-relative advantages as documented, an update that favours the better samples of a group, a
resume at an epoch boundary that changes nothing, and K gloo ranks that compute what one process computes."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rl_core.algos.base import UpdateHooks
from rl_core.algos.grpo.episodes import sampling_params
from rl_core.algos.grpo.learner import GRPOLearner, score
from rl_core.algos.grpo.phases import rollout_chunk
from rl_core.algos.grpo.update import (
    STD_EPS,
    ScoredTokens,
    UpdateStart,
    group_advantages,
    grpo_update,
    loss_weights,
    token_logprobs,
)
from rl_core.config.presets import build_agent_config
from rl_core.data import read_tensors, write_tensors
from rl_core.envs.agent import make_agent_env
from rl_core.generation.torch_generator import TorchGenerator
from rl_core.optim.instability import UnstableUpdate
from tests.spawned_ranks import end_rank


def _cfg(**options):
    return build_agent_config("tiny", run_name="grpo", env="Arithmetic-v0", max_tokens=6, prompts_per_iteration=4,
                              group_size=4, **options)


def _scored(cfg) -> dict[str, np.ndarray]:
    """One iteration's scored batch from real rollouts of the seeded model, with seeded rewards in [0, 1]."""
    learner = GRPOLearner(cfg)
    generator = TorchGenerator(learner.policy.model, version=0)
    make_env = lambda: make_agent_env(cfg.env.name)
    parts = [rollout_chunk(cfg, make_env, learner.policy.tokenizer, lambda r: generator.generate(r, 0), 64, 0, 0, c)
             for c in range(2)]
    arrays, metas = [p[0] for p in parts], [p[1] for p in parts]
    rng = np.random.default_rng(3)
    for a in arrays:
        a["rewards"] = rng.random(len(a["rewards"])).astype(np.float32)
    return score(cfg, arrays, metas)


def _start(learner: GRPOLearner, cfg, scored: ScoredTokens, hooks: UpdateHooks = UpdateHooks(),
           train_version: int = 0) -> UpdateStart:
    grpo = cfg.algorithm
    return UpdateStart.prepare(learner.policy.model, scored, sampling_params(cfg), train_version, grpo.max_staleness,
                               grpo.tis_cap, hooks)


def _update(cfg, batch: dict, hooks: UpdateHooks = UpdateHooks(), done=(), train_version: int = 0
            ) -> tuple[GRPOLearner, list]:
    torch.set_num_threads(1)
    learner = GRPOLearner(cfg)
    grpo = cfg.algorithm
    scored = ScoredTokens.from_arrays(batch)
    history = grpo_update(learner.policy.model, learner.optimizer, scored, params=sampling_params(cfg),
                          minibatches=grpo.minibatches, update_epochs=grpo.update_epochs, clip_eps=grpo.clip_eps,
                          beta=grpo.beta, token_level=grpo.token_level, max_grad_norm=grpo.max_grad_norm,
                          nonfinite_limit=grpo.nonfinite_limit,
                          generator_seed=5, start=_start(learner, cfg, scored, hooks, train_version), hooks=hooks,
                          done=done)
    return learner, history


def test_group_advantages_with_and_without_std_scaling() -> None:
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5], np.float32)
    groups = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    centred = group_advantages(rewards, groups, scale_std=False)
    np.testing.assert_allclose(centred, [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])
    scaled = group_advantages(rewards, groups, scale_std=True)
    np.testing.assert_allclose(scaled[:4], centred[:4] / (np.std(rewards[:4], ddof=1) + STD_EPS), rtol=1e-6)
    assert not scaled[4:].any()  # a group whose rewards are all equal teaches nothing (and is not NaN)


def test_sequence_and_token_level_weights() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    per_sequence = loss_weights(mask, global_rows=2, global_tokens=6, token_level=False, world_size=1)
    assert per_sequence.sum(1).tolist() == [0.5, 0.5]  # each completion weighs the same (GRPO)
    per_token = loss_weights(mask, global_rows=2, global_tokens=6, token_level=True, world_size=1)
    assert torch.allclose(per_token[mask > 0], torch.full((6,), 1 / 6))  # each token weighs the same (DAPO)


@pytest.mark.parametrize("token_level", [False, True])
def test_update_raises_the_logprobs_of_better_samples(token_level: bool) -> None:
    cfg = _cfg(token_level=token_level, update_epochs=1)
    batch = _scored(cfg)
    before = GRPOLearner(cfg)
    learner, history = _update(cfg, batch)
    scored = ScoredTokens.from_arrays(batch)
    tokens, mask = scored.tokens, scored.loss_mask[:, 1:]

    def sequence_logprob(model) -> torch.Tensor:
        with torch.no_grad():
            return (token_logprobs(model, tokens, sampling_params(cfg)) * mask).sum(1)

    gain = sequence_logprob(learner.policy.model) - sequence_logprob(before.policy.model)
    correlation = np.corrcoef(gain.numpy(), scored.advantages.numpy())[0, 1]
    assert correlation > 0.5, correlation
    assert history[0]["logprob_parity_max"] < 1e-5 and history[0]["grad_norm"] > 0


def test_update_resumed_at_an_epoch_boundary_is_bit_identical(tmp_path) -> None:
    cfg = _cfg(update_epochs=3, minibatches=2)
    batch = _scored(cfg)
    saved: dict = {}

    def save(history, last) -> None:
        if len(history) == 1:
            saved.update(state=learner_ref[0].state(), history=list(history))

    learner_ref: list = []
    full, _ = _update(cfg, batch)
    first = GRPOLearner(cfg)
    learner_ref.append(first)
    scored = ScoredTokens.from_arrays(batch)
    start = _start(first, cfg, scored)  # from the weights the update starts from, as the learner does
    grpo_update(first.policy.model, first.optimizer, scored, params=sampling_params(cfg), minibatches=2,
                update_epochs=3, clip_eps=0.2, beta=0.0, token_level=False, max_grad_norm=1.0, nonfinite_limit=3,
                generator_seed=5, start=start, hooks=UpdateHooks(on_epoch_end=save))
    resumed = GRPOLearner(cfg)
    resumed.load_state(saved["state"])
    grpo_update(resumed.policy.model, resumed.optimizer, scored, params=sampling_params(cfg), minibatches=2,
                update_epochs=3, clip_eps=0.2, beta=0.0, token_level=False, max_grad_norm=1.0, nonfinite_limit=3,
                generator_seed=5, start=start, done=saved["history"])
    for name, value in full.state().items():
        assert np.array_equal(value, resumed.state()[name]), name


def test_learner_state_holds_the_frozen_reference_when_beta_is_positive() -> None:
    cfg = _cfg(beta=0.05)
    learner = GRPOLearner(cfg)
    state = learner.state()
    assert any(k.startswith("reference.") for k in state) and not any(k.startswith("optim.") for k in state)
    learner.update(_scored(cfg), 0)
    after = learner.state()
    assert any(k.startswith("optim.") for k in after)
    for name in (k for k in state if k.startswith("reference.")):
        assert np.array_equal(state[name], after[name]), f"the reference moved: {name}"
    restored = GRPOLearner(cfg)
    restored.load_state(after)
    assert all(np.array_equal(v, restored.state()[k]) for k, v in after.items())


def test_nan_rewards_skip_every_step_and_the_limit_abandons_the_update() -> None:
    one_epoch, three_epochs = _cfg(update_epochs=1, minibatches=1), _cfg(update_epochs=3, minibatches=1)
    batch = _scored(one_epoch)
    batch["advantages"] = np.full_like(batch["advantages"], np.nan)
    untouched = GRPOLearner(one_epoch).policy_state()
    learner, history = _update(one_epoch, batch)  # one non-finite step, under the limit of 3: skipped
    assert history[0]["skipped_updates"] == 1 and history[0]["minibatch_steps"] == 0
    assert all(np.array_equal(v, untouched[k]) for k, v in learner.policy_state().items())
    with pytest.raises(UnstableUpdate, match=r"GRPO: 3 minibatch updates in a row had a non-finite loss or gradient "
                                             r"\(the last at epoch 2, minibatch 0; 3 skipped"):
        _update(three_epochs, batch)


def _rank_main(rank: int, world: int, out_dir: str, token_level: bool) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    # A FileStore rendezvous, as the trainer group uses on one machine: no port to race for.
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=world)

    def mean(t: torch.Tensor) -> None:
        dist.all_reduce(t)
        t.div_(world)

    def maximum(t: torch.Tensor) -> None:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)

    cfg = _cfg(token_level=token_level, minibatches=2, update_epochs=2)
    batch, _ = read_tensors(f"file://{out_dir}/batch.safetensors")
    learner, history = _update(cfg, batch, UpdateHooks(rank=rank, world_size=world, all_reduce_mean=mean,
                                                       all_reduce_max=maximum))
    write_tensors(f"file://{out_dir}/rank{rank}.safetensors", learner.policy.state(),
                  {"parity": history[0]["logprob_parity_max"]})
    end_rank()  # the group destroyed, then no teardown (see tests/spawned_ranks.py)


@pytest.mark.parametrize("token_level", [False, True])
def test_two_gloo_ranks_match_one_process(tmp_path, token_level: bool) -> None:
    cfg = _cfg(token_level=token_level, minibatches=2, update_epochs=2)
    batch = _scored(cfg)
    write_tensors(f"file://{tmp_path}/batch.safetensors", batch)
    one, history = _update(cfg, batch)
    mp.spawn(_rank_main, args=(2, str(tmp_path), token_level), nprocs=2, join=True)
    (rank0, meta0), (rank1, _) = (read_tensors(f"file://{tmp_path}/rank{k}.safetensors") for k in range(2))
    assert meta0["parity"] == pytest.approx(history[0]["logprob_parity_max"], abs=1e-6)
    for name, value in one.policy.state().items():
        assert np.array_equal(rank0[name], rank1[name]), f"ranks disagree on {name}"
        np.testing.assert_allclose(rank0[name], value, atol=1e-6, err_msg=name)


def test_stale_samples_are_corrected_by_truncated_importance_weights_and_too_stale_ones_dropped() -> None:
    """Samples of version 0 in the update of version 1 (S = 1): the ratio's denominator is the proximal policy's
    log-prob and each token weighs min(pi_prox / pi_behaviour, cap); with S = 0 they would be dropped."""
    cfg = _cfg(max_staleness=1, tis_cap=1.5)
    batch = _scored(cfg)  # generated by the seeded model: version 0
    learner = GRPOLearner(cfg)
    with torch.no_grad():  # the trainer's policy has moved on: version 1
        for param in learner.policy.model.parameters():
            param.mul_(1.01)
    scored = ScoredTokens.from_arrays(batch)
    start = _start(learner, cfg, scored, train_version=1)
    tokens, mask, behaviour = scored.trimmed(torch.arange(len(scored.tokens)))
    with torch.no_grad():
        proximal = token_logprobs(learner.policy.model, tokens, sampling_params(cfg))
    width = tokens.shape[1] - 1
    live = mask > 0
    torch.testing.assert_close(start.old_logprobs[:, :width][live], proximal[live])
    expected = (proximal - behaviour).exp().clamp(max=1.5)
    torch.testing.assert_close(start.importance[:, :width][live], expected[live])
    assert start.kept.all() and start.metrics["staleness_mean"] == 1.0 and "logprob_parity_max" not in start.metrics
    assert 0 < start.metrics["importance_weight_mean"] <= 1.5
    dropped = _start(learner, _cfg(max_staleness=0), scored, train_version=1)
    assert not dropped.kept.any() and dropped.metrics["dropped_rows"] == len(scored.tokens)
    _, history = _update(cfg, batch, train_version=1)  # an update of such a batch runs and reports it
    assert history[0]["staleness_mean"] == 1.0 and history[0]["grad_norm"] > 0


def test_fresh_samples_keep_the_synchronous_update_exactly() -> None:
    """With every sample of the trainer's own version, importance weights are exactly 1 and the denominators the
    behaviour log-probs: S only matters once samples are stale."""
    batch = _scored(_cfg())
    sync, _ = _update(_cfg(max_staleness=0), batch)
    lenient, _ = _update(_cfg(max_staleness=3), batch)
    for name, value in sync.state().items():
        assert np.array_equal(value, lenient.state()[name]), name
