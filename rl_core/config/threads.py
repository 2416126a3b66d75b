"""torch thread counts of gymflow's processes, and the cores a rank's update kernels may use. Kernels are tuned at the
thread counts (winners are looked up by the calling process's count), and eager autograd's float sums depend on them,
so they are part of what a run computes; the cores (`update_cores`) change only the speed."""

import os

from rl_core.config.agent import AgentRunConfig, AnyRunConfig

TRAINER_THREADS = 1
"""A process that trains a learner (a trainer rank, the in-process loop): ranks share the machine's cores, and the
tiny MLP gains nothing from more."""

ENV_WORKER_THREADS = 1
"""An env worker: workers share the cores, and a rollout step's tiny policy batch gains nothing from more."""

SCORE_THREADS = 1
"""GAE in the score step, in whichever process scores (a flow's, the in-process loop). Its tuned winner is looked up by
the calling thread count, so a count of its own, not the process's, makes every entry point compute the same bits."""



def learner_threads(cfg: AnyRunConfig) -> int:
    """torch threads of a process that trains `cfg`'s learner or generates for it: an agent run's own `threads` (its
    generator and trainer take turns on the cores), else `TRAINER_THREADS`."""
    return cfg.threads if isinstance(cfg, AgentRunConfig) else TRAINER_THREADS


def update_cores(num_ranks: int, overlap: bool) -> int:
    """Cores a trainer rank's update kernels may use (`gymflow_kernels.using_cores`; their results do not depend on
    it). In the sequential schedule the env workers wait while the ranks update, so the ranks share every core; with
    `overlap` the next collection runs beside the update and each rank keeps to one."""
    if overlap:
        return 1
    return max(1, len(os.sched_getaffinity(0)) // num_ranks)
