"""The ops a run dispatches through `kernels`, with the shapes and thread counts it calls them at: what to tune."""
from __future__ import annotations

import kernels
from rl_core.config import RunConfig
from rl_core.envs import make_batch

Calls = dict[str, tuple[dict, int | None]]
"""op name -> (shape it is called with, torch thread count of the calling process; None: the current one)."""


def hot_ops(cfg: RunConfig, num_ranks: int = 1, trainer_threads: int | None = None,
            env_worker_threads: int | None = None) -> Calls:
    """Each dispatched op of a run, with the thread count of the process that calls it (winners are looked up by
    it): GAE over the whole rollout in the score step, the PPO gradient on one rank's share of a minibatch
    (`num_ranks` ranks), and the policy's forward pass on one env worker's envs at every step. A policy with two
    hidden layers of one width (the shape the MLP ops are tuned for) takes the whole minibatch gradient
    (`ppo_grad`); any other only the loss (`ppo_loss`). The defaults describe `train_in_process`: one process
    calls everything."""
    ops: Calls = {"gae": ({"T": cfg.rollout_steps, "N": cfg.num_workers * cfg.envs_per_worker}, None)}
    minibatch = cfg.ppo.minibatch_size // num_ranks
    if len(cfg.ppo.hidden) == 2 and cfg.ppo.hidden[0] == cfg.ppo.hidden[1]:
        probe = make_batch(cfg.env, 1, seed=0)  # only for the observation and action sizes
        widths = {"D": probe.obs_dim, "H": cfg.ppo.hidden[0], "A": probe.action_dim}
        ops["ppo_grad"] = ({"B": minibatch, **widths}, trainer_threads)
        ops["policy_mlp_forward"] = ({"B": cfg.envs_per_worker, **widths}, env_worker_threads)
    else:
        ops["ppo_loss"] = ({"B": minibatch}, trainer_threads)
    return ops


def tune_hot_ops(calls: Calls) -> list[kernels.TuneReport]:
    """Tune each op at its shape and thread count: a cache hit (milliseconds) once this machine has tuned it."""
    return [kernels.autotune(op, [shape], num_threads=threads) for op, (shape, threads) in calls.items()]
