"""PPO's update: it improves its objective, and K gloo ranks compute what one process computes."""
from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rl_core.algos.base import UpdateHooks
from rl_core.algos.ppo.update import RolloutBatch, ppo_loss, ppo_update, summarize_epochs
from rl_core.config.control import PPOConfig
from rl_core.config.threads import update_cores
from rl_core.data import read_tensors, write_tensors
from rl_core.optim.instability import UnstableUpdate
from rl_core.policies.mlp import ActorCritic
from tests.spawned_ranks import end_rank

CFG = PPOConfig(update_epochs=2, minibatch_size=64)


def _setup(seed: int = 0) -> tuple[ActorCritic, torch.optim.Optimizer, RolloutBatch]:
    torch.manual_seed(seed)
    model = ActorCritic(17, 6)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4, eps=1e-5)
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(256, 17, generator=g)
    with torch.no_grad():
        dist_ = model.distribution(obs)
        actions = dist_.sample()
        logprobs = dist_.log_prob(actions).sum(-1)
        values = model.value(obs)
    adv = torch.randn(256, generator=g)
    return model, optimizer, RolloutBatch(obs, actions, logprobs, values, adv, values + adv)


def test_update_lowers_the_loss_and_reports_metrics() -> None:
    model, optimizer, batch = _setup()
    idx = torch.arange(len(batch))
    before, _ = ppo_loss(model, batch, idx, batch.advantages, CFG)
    metrics = summarize_epochs(ppo_update(model, optimizer, batch, CFG, generator_seed=0, learning_rate=1e-3))
    after, _ = ppo_loss(model, batch, idx, batch.advantages, CFG)
    assert after < before
    assert metrics["minibatch_steps"] == 8 and metrics["epochs"] == 2
    assert np.isfinite(list(metrics.values())).all()


def test_update_resumed_at_an_epoch_boundary_is_bit_identical() -> None:
    """Stop after epoch 0, restore model and Adam from that point, run epoch 1: same bytes as running both."""
    model, optimizer, batch = _setup()
    ppo_update(model, optimizer, batch, CFG, generator_seed=5, learning_rate=1e-3)
    resumed_model, resumed_opt, _ = _setup()
    saved: dict = {}

    def stop_after_first(epochs: list, last: bool) -> None:
        saved["model"] = {k: v.clone() for k, v in resumed_model.state_dict().items()}
        saved["opt"] = resumed_opt.state_dict()
        saved["epochs"] = list(epochs)
        raise KeyboardInterrupt  # the "failure" right after the epoch's checkpoint

    try:
        ppo_update(resumed_model, resumed_opt, batch, CFG, generator_seed=5, learning_rate=1e-3,
                   hooks=UpdateHooks(on_epoch_end=stop_after_first))
    except KeyboardInterrupt:
        pass
    fresh_model, fresh_opt, _ = _setup(seed=9)  # a new process: other initial weights, then restored
    fresh_model.load_state_dict(saved["model"])
    fresh_opt.load_state_dict(saved["opt"])
    ppo_update(fresh_model, fresh_opt, batch, CFG, generator_seed=5, learning_rate=1e-3, done=saved["epochs"])
    for name, value in model.state_dict().items():
        assert torch.equal(value, fresh_model.state_dict()[name]), name


def test_a_minibatch_with_a_nan_loss_is_skipped_and_the_others_step() -> None:
    model, optimizer, batch = _setup()
    batch.returns[3] = float("nan")  # one sample: the one minibatch per epoch that holds it
    metrics = summarize_epochs(ppo_update(model, optimizer, batch, CFG, generator_seed=0, learning_rate=1e-3))
    assert metrics["skipped_updates"] == 2 and metrics["minibatch_steps"] == 6
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())
    untouched, _, _ = _setup()
    assert all(not torch.equal(a, b) for a, b in zip(model.parameters(), untouched.parameters()))  # six steps ran


def test_nonfinite_updates_in_a_row_abandon_the_update_without_stepping() -> None:
    model, optimizer, batch = _setup()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch.advantages[:] = float("inf")
    cfg = CFG.model_copy(update={"nonfinite_limit": 2})
    with pytest.raises(UnstableUpdate, match=r"PPO: 2 minibatch updates in a row had a non-finite loss or gradient "
                                             r"\(the last at epoch 0, minibatch 1; 2 skipped"):
        ppo_update(model, optimizer, batch, cfg, generator_seed=0, learning_rate=1e-3)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def _rank_main(rank: int, world: int, port: int, out_dir: str, nan_row: int | None = None) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

    def all_reduce_mean(t: torch.Tensor) -> None:
        dist.all_reduce(t)
        t.div_(world)

    model, optimizer, batch = _setup()
    if nan_row is not None:
        batch.returns[nan_row] = float("nan")
    ppo_update(model, optimizer, batch, CFG, generator_seed=0, learning_rate=3e-4,
               hooks=UpdateHooks(rank=rank, world_size=world, all_reduce_mean=all_reduce_mean))
    write_tensors(f"file://{out_dir}/rank{rank}.safetensors",
                  {k: v.detach().numpy() for k, v in model.state_dict().items()})
    end_rank()  # the group destroyed, then no teardown (see tests/spawned_ranks.py)


@pytest.mark.parametrize("nan_row", [None, 3], ids=["finite", "nan-on-one-rank"])
def test_two_gloo_ranks_match_one_process(tmp_path, nan_row: int | None) -> None:
    """Also when one rank's share of a minibatch has a NaN loss: both ranks skip that minibatch, as one process does."""
    torch.set_num_threads(1)
    model, optimizer, batch = _setup()
    if nan_row is not None:
        batch.returns[nan_row] = float("nan")
    ppo_update(model, optimizer, batch, CFG, generator_seed=0, learning_rate=3e-4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank_main, args=(2, port, str(tmp_path), nan_row), nprocs=2, join=True)
    rank0 = read_tensors(f"file://{tmp_path}/rank0.safetensors")[0]
    rank1 = read_tensors(f"file://{tmp_path}/rank1.safetensors")[0]
    for name, value in model.state_dict().items():
        assert np.array_equal(rank0[name], rank1[name]), f"ranks disagree on {name}"
        np.testing.assert_allclose(rank0[name], value.numpy(), atol=1e-6, err_msg=name)


def test_update_cores_shares_the_machine_between_ranks_and_keeps_to_one_beside_a_collection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert update_cores(num_ranks=1, overlap=False) == 2  # the env workers wait: both cores
    assert update_cores(num_ranks=2, overlap=False) == 1  # a core per rank
    assert update_cores(num_ranks=4, overlap=False) == 1
    assert update_cores(num_ranks=1, overlap=True) == 1  # the next collection runs beside the update
