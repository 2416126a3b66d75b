"""PendulumGains-v0: write PD gains as text; the reward is how long they keep a MuJoCo pole up.

The prompt names a start state, e.g. "gains for InvertedPendulum tilt=+0.05 spin=-0.30:" (pole angle in rad and
angular velocity in rad/s); the action is a plan "kp=12.5 kd=1.2" ended by a newline. The plan drives
`InvertedPendulum-v5` (rl_core's batched MuJoCo env) from that state with the cart force

    u = kp * angle + kd * angular_velocity + CART_GAIN * (cart_position + cart_velocity)

and the reward is the fraction of `EPISODE_STEPS` steps the pole stays up (1.0: it never fell). The cart term is
fixed, not planned: without it the cart drifts into the end of the rail within the episode whatever the gains.

Plans are scored in batches: `evaluate_plans` steps every plan in one batched env, one env per plan, each from its
own problem's exact start state (no reset noise), so a plan scores the same alone or with others. A runtime that
scores plans elsewhere (on Ray env workers) passes its own `evaluator` with that signature.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rl_core.envs.agent.contract import Split, draw_problem, split_seeds
from rl_core.envs.batched import BatchedMujocoEnv
from rl_core.envs.registry import make_batch

STREAM = 0x50454E44  # "PEND"
SFT_STREAM = 0x53465450  # "SFTP": the gains the SFT warm start imitates
SFT_KP_RANGE = (0.0, 40.0)  # wider than the gains that work (about kp 5-20 with kd 0.5-2): RL has room to gain
SFT_KD_RANGE = (0.0, 6.0)
TASK = "InvertedPendulum-v5"
EPISODE_STEPS = 200  # 8 s of simulated time: long enough that a marginal controller falls, short enough to be cheap
KP_RANGE = (0.0, 50.0)
KD_RANGE = (0.0, 10.0)
CART_GAIN = 0.3
DEMO_GAINS = (10.0, 1.0)  # a plan that keeps the pole up from every start state of the problem space
MAX_TILT_STEPS = 12  # tilts -0.12 .. +0.12 rad in steps of 0.01 (the pole falls past 0.2)
MAX_SPIN_STEPS = 12  # spins -0.60 .. +0.60 rad/s in steps of 0.05
PROMPT = "gains for InvertedPendulum tilt={tilt:+.2f} spin={spin:+.2f}:"
GAIN = r"([0-9]{1,2}(?:\.[0-9]{1,2})?)"
PLAN = re.compile(rf"kp={GAIN} kd={GAIN}")
ALPHABET = "".join(sorted(set("gains for InvertedPendulum tilt= spin=:" + "kp= kd=\n" + "0123456789.+-")))
Plan = tuple[float, float]  # (kp, kd)
PlanEvaluator = Callable[[list[Plan], list[int]], list[float]]


@dataclass(frozen=True)
class PendulumProblem:
    """The pole's start state; the cart starts at rest in the middle of the rail."""

    tilt: float  # rad
    spin: float  # rad/s

    @property
    def text(self) -> str:
        """The prompt, which states the whole problem."""
        return PROMPT.format(tilt=self.tilt, spin=self.spin)


def draw_pendulum(rng: np.random.Generator) -> PendulumProblem:
    """A start state on the grid the prompt can state exactly."""
    tilt = int(rng.integers(-MAX_TILT_STEPS, MAX_TILT_STEPS + 1)) / 100
    spin = int(rng.integers(-MAX_SPIN_STEPS, MAX_SPIN_STEPS + 1)) / 20
    return PendulumProblem(tilt, spin)


def pendulum_problem(seed: int) -> PendulumProblem:
    """Problem `seed` (train seeds even, held-out odd; see `contract`)."""
    return draw_problem(STREAM, seed, draw_pendulum, lambda problem: problem.text)


def parse_plan(action: str) -> Plan:
    """(kp, kd) of a plan "kp=12.5 kd=1.2" (the text before the first newline), or a ValueError saying why not."""
    text = action.split("\n", 1)[0]
    match = PLAN.fullmatch(text)
    if match is None:
        raise ValueError(f"expected a plan like 'kp=12.5 kd=1.2' (at most 2 digits, then at most 2 decimals), "
                         f"found {text!r}")
    kp, kd = float(match.group(1)), float(match.group(2))
    for name, value, (low, high) in (("kp", kp, KP_RANGE), ("kd", kd, KD_RANGE)):
        if not low <= value <= high:
            raise ValueError(f"{name}={value:g} is outside [{low:g}, {high:g}]; write a gain in that range")
    return kp, kd


def start_from(env: BatchedMujocoEnv, problems: list[PendulumProblem]) -> None:
    """Put env i exactly in problem i's start state, with nothing left over from the batch's own reset noise."""
    state = env.get_state()
    for key in ("physics.qpos", "physics.qvel", "physics.qacc_warmstart", "physics.ctrl"):
        state[key][:] = 0.0
    state["physics.qpos"][:, 1] = [problem.tilt for problem in problems]
    state["physics.qvel"][:, 1] = [problem.spin for problem in problems]
    env.set_state(state)


def evaluate_plans(plans: list[Plan], seeds: list[int]) -> list[float]:
    """The reward of each plan on its problem: the fraction of `EPISODE_STEPS` the pole stays up, one batch for all."""
    if len(plans) != len(seeds):
        raise ValueError(f"evaluate_plans needs one seed per plan, got {len(plans)} plans and {len(seeds)} seeds")
    if not plans:
        return []
    env = make_batch(TASK, len(plans), seed=0)
    start_from(env, [pendulum_problem(seed) for seed in seeds])
    kp, kd = np.array(plans, dtype=np.float64).T  # (N,) each
    up = np.ones(len(plans), dtype=bool)
    survived = np.zeros(len(plans))
    obs = env.observe()  # (N, 4): cart position, pole angle, cart velocity, pole angular velocity
    for _ in range(EPISODE_STEPS):
        force = kp * obs[:, 1] + kd * obs[:, 3] + CART_GAIN * (obs[:, 0] + obs[:, 2])
        result = env.step(force[:, None])
        survived += result.reward * up  # the task's reward is 1 while up, 0 on the step the pole falls
        up &= ~result.terminated  # an env that fell is reset by the batch; its later steps no longer count
        if not up.any():
            break
        obs = result.obs
    return (survived / EPISODE_STEPS).tolist()


class PendulumGains:
    """Single turn: the action is a PD plan; the reward comes from simulating it (see `evaluate_plans`).

    info["correct"] is True when the pole stayed up for the whole episode (reward 1.0).
    """

    name = "PendulumGains-v0"
    uses_simulator = True  # takes an `evaluator`, which a runtime may route to its simulation workers
    alphabet = ALPHABET
    max_turns = 1
    stop = ("\n",)

    def __init__(self, evaluator: PlanEvaluator = evaluate_plans) -> None:
        self.evaluator = evaluator
        self._seed: int | None = None

    def reset(self, seed: int) -> str:
        """Start problem `seed`; returns its prompt."""
        prompt = pendulum_problem(seed).text
        self._seed = seed
        return prompt

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Simulate the plan; an unparseable or out-of-range plan earns 0 and says why in info["error"]."""
        if self._seed is None:
            raise RuntimeError(f"{self.name}: no episode is running; call reset(seed) first")
        seed, self._seed = self._seed, None
        try:
            plan = parse_plan(action)
        except ValueError as err:
            return "", 0.0, True, {"correct": False, "error": str(err)}
        reward = self.evaluator([plan], [seed])[0]
        return "", reward, True, {"correct": reward == 1.0, "kp": plan[0], "kd": plan[1]}

    def demonstration(self, seed: int) -> list[str]:
        """The scripted plan, which keeps the pole up from every start state."""
        return [f"kp={DEMO_GAINS[0]:.1f} kd={DEMO_GAINS[1]:.1f}\n"]

    def sft_demonstration(self, seed: int) -> list[str]:
        """What the SFT warm start imitates: a well-formed plan with gains drawn from (SFT_STREAM, seed) over ranges
        that hold good and bad plans alike, so the warm-started policy writes plans and RL learns which ones hold."""
        rng = np.random.default_rng([SFT_STREAM, seed])
        kp, kd = rng.uniform(*SFT_KP_RANGE), rng.uniform(*SFT_KD_RANGE)
        return [f"kp={kp:.1f} kd={kd:.1f}\n"]

    def problem_seeds(self, split: Split, count: int, start: int = 0) -> list[int]:
        """Seeds of `split`; train and held-out share neither seeds nor problems."""
        return split_seeds(split, count, start)
