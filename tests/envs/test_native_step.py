"""The native env step (substeps, mj_rnePostConstraint, the task's fields copied out, in one pass) must give exactly
the numbers of `Batch.step` and the per-env Python loop it replaces, and where it cannot be had (no compiler, a
batch wrapper it cannot read) the env must fall back to them with one warning."""
from __future__ import annotations

import dataclasses
import shutil
import warnings

import numpy as np
import pytest

from rl_core.envs import BatchedMujocoEnv, DynamicsRandomization, get_task, native_step
from rl_core.envs.native_step import NativeStep

NUM_ENVS = 5
STEPS = 150

needs_compiler = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler: the native path cannot be built here"
)


def _python_loop_env(monkeypatch: pytest.MonkeyPatch, *args, **kwargs) -> BatchedMujocoEnv:
    """A BatchedMujocoEnv built as if the native path were unavailable (`Batch.step`, the per-env `get_data` loop)."""
    with monkeypatch.context() as patch:
        patch.setattr(NativeStep, "for_batch", classmethod(lambda cls, *args, **kwargs: None))
        return BatchedMujocoEnv(*args, **kwargs)


def _assert_same_trajectories(native: BatchedMujocoEnv, loop: BatchedMujocoEnv, actions: np.ndarray) -> int:
    """Step both with `actions`; every returned array and derived field must be equal bit for bit.
    Returns the number of episodes that ended (so a test can check resets were exercised)."""
    ended = 0
    for a in actions:
        expected, result = loop.step(a), native.step(a)
        for field in dataclasses.fields(expected):
            assert np.array_equal(getattr(expected, field.name), getattr(result, field.name)), field.name
        for name, value in loop.derived.items():
            assert np.array_equal(value, native.derived[name]), name
        ended += int((expected.terminated | expected.truncated).sum())
    return ended


@needs_compiler
@pytest.mark.parametrize("randomization", [None, DynamicsRandomization.symmetric(0.3)], ids=["plain", "randomized"])
@pytest.mark.parametrize("name", ["Ant-v5", "Humanoid-v5", "Hopper-v5"])
def test_native_matches_the_python_loop_bit_for_bit(
    name: str, randomization: DynamicsRandomization | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also through resets, and with per-env models (randomization), on two threads; Hopper reads no MjData field
    beyond its state (the substeps alone)."""
    task = get_task(name)
    if name == "Ant-v5":  # also cacc and cfrc_int, which no registered task reads
        task = dataclasses.replace(task, name="Ant-all-post-constraint",
                                   derived_fields=(*task.derived_fields, "cacc", "cfrc_int"))
    args = (task, NUM_ENVS)
    kwargs = {"seed": 3, "nthread": 2, "randomization": randomization}
    native = BatchedMujocoEnv(*args, **kwargs)
    assert native._native_step is not None
    loop = _python_loop_env(monkeypatch, *args, **kwargs)
    # wide actions topple Humanoid and flip Ant now and then, so episodes end and envs reset mid-run
    actions = np.random.default_rng(0).uniform(task.action_low, task.action_high, (STEPS, NUM_ENVS, native.action_dim))
    ended = _assert_same_trajectories(native, loop, actions)
    if "cfrc_ext" in native.derived:
        assert np.abs(native.derived["cfrc_ext"]).max() > 0  # contacts happened: the comparison is not of zeros
    assert ended > 0


@needs_compiler
def test_state_restored_into_a_native_env_continues_like_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    task = get_task("Humanoid-v5")
    native = BatchedMujocoEnv(task, NUM_ENVS, seed=1)
    loop = _python_loop_env(monkeypatch, task, NUM_ENVS, seed=1)
    actions = np.random.default_rng(2).uniform(-0.4, 0.4, (40, NUM_ENVS, native.action_dim))
    for a in actions[:20]:
        loop.step(a)
    native.set_state(loop.get_state())
    _assert_same_trajectories(native, loop, actions[20:])


def test_without_a_compiler_falls_back_to_the_loop_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("GYMFLOW_CACHE_DIR", str(tmp_path / "cache"))
    task = get_task("Ant-v5")
    with pytest.warns(RuntimeWarning, match="per-env Python loop"):
        env = BatchedMujocoEnv(task, 2, seed=0)
    assert env._native_step is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = BatchedMujocoEnv(task, 2, seed=0)
    actions = np.random.default_rng(0).uniform(-1, 1, (20, 2, env.action_dim))
    _assert_same_trajectories(env, again, actions)
    assert np.abs(env.derived["cfrc_ext"]).max() > 0


@needs_compiler
def test_an_unexpected_batch_wrapper_layout_falls_back_instead_of_crashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mjBatch* is read from pybind11's instance layout; a layout where it is not found must only warn."""
    # 8 is ob_type: the wrapper's type object, not the batch
    monkeypatch.setattr("rl_core.envs.native_step._PYBIND11_VALUE_OFFSET", 8)
    with pytest.warns(RuntimeWarning, match="does not hold its mjBatch"):
        env = BatchedMujocoEnv(get_task("Ant-v5"), 2, seed=0)
    assert env._native_step is None
    env.step(np.zeros((2, env.action_dim)))


@needs_compiler
def test_the_probe_names_what_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """`native_step_problem` (what tests/test_fast_paths.py requires on the reference machine) runs the same checks
    as an env: a build, then the wrapper's layout."""
    probe = native_step._probe.__wrapped__  # uncached
    assert probe(None, str(tmp_path / "cache")) is None
    assert "failed" in probe(str(tmp_path / "no-such-cc"), str(tmp_path / "other-cache"))
    monkeypatch.setattr(native_step, "_PYBIND11_VALUE_OFFSET", 8)
    assert "does not hold its mjBatch" in probe(None, str(tmp_path / "cache"))


def test_outputs_that_are_not_the_batch_s_fields_are_refused() -> None:
    """A wrong shape, dtype or name would make the native copies write out of bounds: refused before any step."""
    env = BatchedMujocoEnv(get_task("Ant-v5"), 2, seed=0)
    batch = env._batch
    for outputs in ({"xpos": np.zeros((2, 3))}, {"xpos": np.zeros((2, env.model.nbody, 3), np.float32)},
                    {"not_a_field": np.zeros((2, 3))}, {"xpos": np.zeros((2, 3, env.model.nbody)).transpose(0, 2, 1)}):
        with pytest.raises(ValueError, match="step output"):
            NativeStep.for_batch(batch, 5, post_constraint=False, outputs=outputs)
