"""`Task.arena_bytes` (MJCF `<size memory>`): a smaller MjData arena compiles the same model and steps it bit for bit,
as long as it holds the most contacts and constraint rows the model can make, which HalfCheetah's worst pose shows."""
from __future__ import annotations

import dataclasses

import mujoco
import numpy as np
import pytest

from rl_core.envs import BatchedMujocoEnv, get_task, task_names
from rl_core.envs.halfcheetah import HALF_CHEETAH_V5
from rl_core.envs.task import load_model

HALF_CHEETAH_ARENA_BYTES = HALF_CHEETAH_V5.arena_bytes
"""HalfCheetah's arena: 1.5x the 42,376 bytes its worst pose uses (16 contacts, 70 constraint rows), against the MJCF's
6 MB."""


def model_fields(model: mujoco.MjModel) -> dict[str, object]:
    """Every array and number of a model and of its options, by name."""
    fields = {}
    for owner, prefix in ((model, ""), (model.opt, "opt.")):
        for name in dir(owner):
            value = getattr(owner, name) if not name.startswith("_") else None
            if isinstance(value, np.ndarray):
                fields[prefix + name] = (value.shape, value.tobytes())
            elif isinstance(value, (int, float)):
                fields[prefix + name] = value
    return fields


@pytest.mark.parametrize("name", task_names())
def test_an_arena_size_changes_nothing_else_in_the_model(name: str) -> None:
    task = get_task(name)
    default = load_model(dataclasses.replace(task, arena_bytes=None))
    small = load_model(dataclasses.replace(task, arena_bytes=1 << 16))
    assert small.narena == 1 << 16 and default.narena > 1 << 20
    a, b = model_fields(default), model_fields(small)
    assert {k for k in a if a[k] != b.get(k)} == {"narena"}


def worst_pose_warnings(arena_bytes: int) -> tuple[list[int], int, int]:
    """(arena warnings, arena bytes used, constraint rows) of one step from HalfCheetah's worst pose: sunk into the
    floor, every capsule touching it (2 contacts each), every leg joint past its limit."""
    model = load_model(dataclasses.replace(HALF_CHEETAH_V5, arena_bytes=arena_bytes))
    data = mujoco.MjData(model)
    data.qpos[1] = -1.0
    data.qpos[3:] = model.jnt_range[3:, 0] - 0.1
    mujoco.mj_step(model, data)
    full = [i for i in (mujoco.mjtWarning.mjWARN_CONTACTFULL, mujoco.mjtWarning.mjWARN_CNSTRFULL)
            if data.warning[i].number]
    return full, data.maxuse_arena, data.nefc


def test_halfcheetah_arena_holds_its_worst_pose(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # MuJoCo logs warnings to MUJOCO_LOG.TXT in the working directory
    full, used, rows = worst_pose_warnings(HALF_CHEETAH_ARENA_BYTES)
    assert not full and used <= HALF_CHEETAH_ARENA_BYTES and rows == 70  # 16 contacts x 4 pyramid rows + 6 limits
    with pytest.raises(mujoco.FatalError, match="increase <size memory"):  # the check sees an arena 1 byte short
        worst_pose_warnings(used - 1)
    full, _, rows = worst_pose_warnings(30_000)  # some smaller ones step on, without the constraints
    assert full and rows == 0


def test_halfcheetah_steps_bit_identically_with_its_small_arena() -> None:
    default = BatchedMujocoEnv(dataclasses.replace(HALF_CHEETAH_V5, arena_bytes=None), 16, seed=3)
    small = BatchedMujocoEnv(HALF_CHEETAH_V5, 16, seed=3)
    assert small.model.narena == HALF_CHEETAH_ARENA_BYTES < default.model.narena
    actions = np.random.default_rng(3).uniform(-1, 1, (1000, 16, small.action_dim))
    for a in actions:  # a whole 1000-step episode, ending in the time-limit reset
        default.step(a)
        small.step(a)
        assert np.array_equal(default.qpos, small.qpos) and np.array_equal(default.qvel, small.qvel)
    assert (small.episode_index == 1).all()
    data = mujoco.MjData(small.model)
    for i in range(16):
        small._batch.get_data(i, data)
        assert not any(w.number for w in data.warning), f"env {i}: {[w.number for w in data.warning]}"
        assert data.maxuse_arena <= HALF_CHEETAH_ARENA_BYTES
