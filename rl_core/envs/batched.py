"""Batched MuJoCo environments on MuJoCo's native `mujoco.batch.Batch`.

One `Batch` steps all envs on a native thread pool; observations, rewards and resets are computed
for the whole batch in numpy, so no Python runs per env per step (except on the rare reset).

Auto-reset: when an episode ends (terminated, or truncated at the time limit), `step` returns the
final observation in `StepResult.final_obs` and the first observation of the next episode in
`StepResult.obs`, like stable-baselines3's vector envs (gymnasium 1.x defaults to resetting on the
*next* step instead).

Reset noise is counter-based: env g's episode e draws from `default_rng([seed, g, e])`, so the
state needed to continue exactly is the physics state, three counters per env, and the derived MjData
fields a task reads (`Task.derived_fields`): after a step those describe the state before the last
substep, so they cannot be recomputed from the physics state and are captured with it.

Contact forces (`cfrc_ext`, with `cacc`, `cfrc_int`) come from `mj_rnePostConstraint`, which gymnasium
calls after every step but `mujoco.batch` never runs. A force sensor would not do: under RK4 sensors see the
substep's first stage, gymnasium's call its last. So each env step is one native pass over the batch's threads
(`native_step.NativeStep`, through the C API's `mjb_apply`): each simulation's substeps, then, for tasks that read
contact forces, mj_rnePostConstraint on its own MjData, then the fields the task reads copied out. Where that
cannot be built (no C compiler) it warns once and falls back to `Batch.step`, its outputs, and a per-env loop that
copies each env's MjData out and runs mj_rnePostConstraint from Python: the same numbers, but slower.

Optional per-env dynamics randomization (`DynamicsRandomization`) gives each simulation its own masses,
friction and damping through the batch's per-simulation model fields; it is a function of (seed, global env
index), so restoring a state into a batch built with the same arguments continues exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import mujoco
import mujoco.batch
import numpy as np

from rl_core.config.randomization import DynamicsRandomization
from rl_core.envs.native_step import NativeStep
from rl_core.envs.randomization import randomize_batch
from rl_core.envs.task import Task, load_model

# MjData fields only mj_rnePostConstraint computes; zero after a reset, as mj_resetData leaves them and
# gymnasium's mj_forward does not compute them
POST_CONSTRAINT_FIELDS = frozenset({"cacc", "cfrc_int", "cfrc_ext"})
# MjData fields that together make the integration state (mjSTATE_INTEGRATION): restoring them makes the
# next step bit-identical to an uninterrupted one (qacc_warmstart matters: the solver starts from it).
PHYSICS_STATE_FIELDS = ("time", "qpos", "qvel", "act", "qacc_warmstart", "ctrl", "qfrc_applied", "xfrc_applied")
COUNTER_FIELDS = ("episode_step", "episode_return", "episode_index")


@dataclass
class StepResult:
    """One batch step. `final_obs[i]` is meaningful only where `terminated[i] | truncated[i]`."""

    obs: np.ndarray  # (N, obs_dim) float64, first obs of the new episode where one ended
    reward: np.ndarray  # (N,) float64
    terminated: np.ndarray  # (N,) bool
    truncated: np.ndarray  # (N,) bool
    final_obs: np.ndarray  # (N, obs_dim) float64
    finished_returns: np.ndarray  # undiscounted returns of the episodes that ended in this step


class BatchedMujocoEnv:
    """`num_envs` copies of `task`, stepped together; envs are numbered globally from `env_offset`."""

    def __init__(
        self,
        task: Task,
        num_envs: int,
        seed: int,
        env_offset: int = 0,
        nthread: int = 1,
        randomization: DynamicsRandomization | None = None,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.task = task
        self.num_envs = num_envs
        self.seed = seed
        self.env_offset = env_offset
        model = load_model(task)
        self.model = model
        self.dt = model.opt.timestep * task.frame_skip
        self.action_dim = model.nu
        self._batch = mujoco.batch.Batch(model, nsim=num_envs, nthread=nthread, persistent=True)
        self.randomization = randomization if randomization and not randomization.is_identity else None
        # (N, nbody) masses of each env's model, for tasks that weigh bodies (Humanoid's centre of mass)
        self.body_mass = np.broadcast_to(model.body_mass, (num_envs, model.nbody))
        if self.randomization:
            self.body_mass = randomize_batch(self._batch, model, self.randomization, seed, env_offset)
        self._physics = {
            name: self._batch.bind(name)
            for name in PHYSICS_STATE_FIELDS
            if self._batch.bind(name).size > 0
        }
        self.qpos = self._physics["qpos"]
        self.qvel = self._physics["qvel"]
        self._ctrl = self._physics["ctrl"]
        self._outputs = {
            name: self._batch.bind(name) for name in task.derived_fields if name not in POST_CONSTRAINT_FIELDS
        }
        self._post_constraint = [name for name in task.derived_fields if name in POST_CONSTRAINT_FIELDS]
        self._scratch = mujoco.MjData(model)  # one env's MjData: field shapes, and the fallback's copy
        fields = {name: getattr(self._scratch, name) for name in task.derived_fields}
        self.derived = {name: np.zeros((num_envs, *field.shape), field.dtype) for name, field in fields.items()}
        self._native_step = NativeStep.for_batch(
            self._batch, task.frame_skip, post_constraint=bool(self._post_constraint), outputs=self.derived
        )
        self._post_models: list[mujoco.MjModel] = []
        if self._native_step is None and self._post_constraint:
            # the fallback's mj_rnePostConstraint needs each env's own model once dynamics differ per env
            self._post_models = (
                [self._batch.get_model(i) for i in range(num_envs)] if self.randomization else [model] * num_envs
            )
        self._init_qpos = model.qpos0.copy()
        self._init_qvel = np.zeros(model.nv)
        self.episode_step = np.zeros(num_envs, dtype=np.int64)
        self.episode_return = np.zeros(num_envs, dtype=np.float64)
        self.episode_index = np.zeros(num_envs, dtype=np.int64)
        self._reset_rows = self._state_after_reset_data()
        self._reset_envs(np.arange(num_envs))
        self.obs_dim = self.observe().shape[1]

    @property
    def action_low(self) -> np.ndarray:
        """(action_dim,) lower bound of the actions `step` accepts (larger ones are clipped)."""
        return np.full(self.action_dim, self.task.action_low)

    @property
    def action_high(self) -> np.ndarray:
        """(action_dim,) upper bound of the actions `step` accepts."""
        return np.full(self.action_dim, self.task.action_high)

    def observe(self) -> np.ndarray:
        """(N, obs_dim) float64 observation of the current state."""
        return self.task.observation(self)

    def step(self, actions: np.ndarray) -> StepResult:
        """Apply `actions` (clipped to the task's action range) for `frame_skip` physics steps."""
        action = np.clip(actions, self.task.action_low, self.task.action_high)
        x_before = np.array(self.task.x_position(self), dtype=np.float64)  # a copy: the views move on
        self._ctrl[:] = action
        if self._native_step is not None:
            self._native_step()  # the substeps, contact forces and `derived`, in one pass
        else:
            self._batch.step(nstep=self.task.frame_skip)
            self._read_derived_after_step()
        obs = self.observe()
        reward = self.task.reward(self, action, x_before, self.dt)
        terminated = self.task.terminated(self)
        self.episode_step += 1
        self.episode_return += reward
        truncated = (self.episode_step >= self.task.max_episode_steps) & ~terminated
        done = terminated | truncated
        finished = self.episode_return[done].copy()
        final_obs = obs
        if done.any():
            final_obs = obs.copy()
            ended = np.flatnonzero(done)
            self.episode_index[ended] += 1
            self._reset_envs(ended)
            obs = self.observe()
        return StepResult(obs, reward, terminated, truncated, final_obs, finished)

    def start_new_episodes(self) -> None:
        """End every env's episode where it stands and start its next one (gymnasium's `reset()` without a seed)."""
        self.episode_index += 1
        self._reset_envs(np.arange(self.num_envs))

    def _state_after_reset_data(self) -> np.ndarray:
        """(N, nstate) each simulation's integration state after `mj_resetData` with its own model: one shared
        row unless dynamics differ per env.

        An episode starts from these rows instead of a `Batch.reset` call: a batch call wakes the native pool's
        parked worker (which costs more than the reset's arithmetic), and a reset already pays one, for the
        forward that computes the new state. The rows are the whole state `mj_resetData` writes and the next step
        reads; the reset also zeroes the env's warning counters, as `mj_resetData` does, and the MjData's other
        fields are recomputed by that forward.
        """
        self._batch.reset(stage=mujoco.mjtStage.mjSTAGE_NONE)
        rows = self._batch.state.copy()
        return rows if self.randomization else np.broadcast_to(rows[0].copy(), rows.shape)  # not the N rows

    def _reset_envs(self, ids: np.ndarray) -> None:
        """Reset envs `ids` to the task's reset distribution for their current episode index.

        The forward that computes the new state's MjData fields runs only for tasks that read some (`derived`):
        the next step's `mj_step` recomputes every field from the state rows, and a forward writes none of them
        (`qacc_warmstart` is saved by the integrator), so the steps are bit-identical without it. It saves a batch
        call on every step where an episode ends: 1.1-1.2% of a 64-env Hopper and Walker2d step under random actions
        (paired windows), whose episodes end ~3 times a step."""
        self._batch.state[ids] = self._reset_rows[ids]
        self._batch.warning[ids] = 0
        for i in ids:
            rng = np.random.default_rng([self.seed, self.env_offset + int(i), int(self.episode_index[i])])
            self.qpos[i], self.qvel[i] = self.task.reset(self._init_qpos, self._init_qvel, rng)
        if self._outputs:  # see the docstring
            self._batch.forward(ids=ids)
            for name, output in self._outputs.items():
                self.derived[name][ids] = output[ids]
        for name in self._post_constraint:
            self.derived[name][ids] = 0.0
        self.episode_step[ids] = 0
        self.episode_return[ids] = 0.0

    def _read_derived_after_step(self) -> None:
        """Without the native step: refresh `derived` from the batch's outputs, and run mj_rnePostConstraint
        per env where the task needs it."""
        for name, output in self._outputs.items():
            self.derived[name][:] = output
        if self._post_constraint:
            for i in range(self.num_envs):
                self._batch.get_data(i, self._scratch)
                mujoco.mj_rnePostConstraint(self._post_models[i], self._scratch)
                for name in self._post_constraint:
                    self.derived[name][i] = getattr(self._scratch, name)

    def get_state(self) -> dict[str, np.ndarray]:
        """A copy of everything needed to continue bit-exactly: physics, episode counters, derived fields."""
        state = {f"physics.{name}": view.copy() for name, view in self._physics.items()}
        state.update({name: getattr(self, name).copy() for name in COUNTER_FIELDS})
        state.update({f"derived.{name}": value.copy() for name, value in self.derived.items()})
        return state

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore a `get_state()` copy; shapes must match this batch."""
        targets = {f"physics.{name}": view for name, view in self._physics.items()}
        targets.update({name: getattr(self, name) for name in COUNTER_FIELDS})
        targets.update({f"derived.{name}": value for name, value in self.derived.items()})
        for key, target in targets.items():
            if key not in state:
                raise ValueError(f"env state {key}: missing; a {self.task.name} state holds {sorted(targets)}")
            if state[key].shape != target.shape:
                raise ValueError(f"env state {key}: expected shape {target.shape}, found {state[key].shape}")
        for key, target in targets.items():
            target[:] = state[key]
