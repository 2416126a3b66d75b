"""rl_core.reporting.episode_video: a stored version's episodes as an MP4 or GIF in the run folder, and a clear error without GL."""
from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import fsspec
import imageio.v3 as iio
import numpy as np
import pytest

from rl_core.algos.base import build_learner, build_policy
from rl_core.algos.ppo.evaluation import EVAL_SEED_OFFSET
from rl_core.checkpoint import CheckpointStore
from rl_core.config.presets import build_control_config
from rl_core.data import RunLayout
from rl_core.data.run_info import open_run
from rl_core.envs import make_batch
from rl_core.reporting.episode_video import frame_rate, render_version
from rl_core.runtime.commits import commit_initial
from rl_core.seeding import derive_seed

REPO = Path(__file__).resolve().parents[2]


def stored_run(tmp_path: Path, env: str):
    """A tiny run of `env` with version 0 (the seeded learner) committed."""
    cfg = build_control_config("tiny", run_name="render-me", store=f"file://{tmp_path}/runs", env=env)
    open_run(cfg)
    commit_initial(cfg, build_learner(cfg).state())
    return cfg


@pytest.mark.parametrize("env", ["HalfCheetah-v5", "gym:HalfCheetah-v5"])
def test_mp4_of_a_version_is_stored_in_the_run_and_decodes_to_the_frames_rendered(tmp_path, env) -> None:
    cfg = stored_run(tmp_path, env)
    result = render_version(cfg, 0, max_steps=30, width=160, height=120)
    assert result["url"] == RunLayout(cfg.run_url).video(0, "mp4")
    assert (result["fps"], result["frame_every"], result["frames"]) == (20, 1, 30)  # dt 0.05 s: every step
    assert result["steps"] == [30] and result["complete"] == [False]
    frames = iio.imread(Path(result["path"]).read_bytes(), extension=".mp4", index=None)
    assert frames.shape == (30, 120, 160, 3) and frames.dtype == np.uint8
    assert np.abs(frames[-1].astype(int) - frames[0]).mean() > 1.0  # the cheetah moves (and is drawn)
    assert iio.immeta(Path(result["path"]).read_bytes(), extension=".mp4")["fps"] == 20


def test_gif_shows_the_episodes_evaluation_scores_in_real_time(tmp_path) -> None:
    """Episode k starts where evaluation's env k does: the same actions, the same rewards."""
    cfg = stored_run(tmp_path, "Hopper-v5")
    max_steps = 40
    result = render_version(cfg, None, episodes=2, fmt="gif", max_steps=max_steps, width=64, height=48)
    assert result["url"].endswith("/videos/v00000000.gif") and result["version"] == 0
    dt = 0.002 * 4
    assert (result["fps"], result["frame_every"]) == frame_rate(dt, 60) == (42, 3)  # 125 steps/s, 1 frame in 3
    assert result["frames"] == sum(-(-steps // 3) for steps in result["steps"])
    frames = iio.imread(result["path"], index=None)
    assert frames.shape[:3] == (result["frames"], 48, 64)

    policy = build_policy(cfg)
    policy.load_state(CheckpointStore(RunLayout(cfg.run_url).checkpoints).load(0).tensors)
    env = make_batch(cfg.env.name, 2, derive_seed(cfg.seed, EVAL_SEED_OFFSET))
    returns, running = np.zeros(2), np.ones(2, dtype=bool)
    for _ in range(max_steps):
        step = env.step(policy.deterministic_action(env.observe()))
        returns += np.where(running, step.reward, 0.0)
        running &= ~(step.terminated | step.truncated)
    np.testing.assert_allclose(result["returns"], returns, rtol=1e-9)


def test_video_is_written_through_fsspec_to_any_store() -> None:
    cfg = build_control_config("tiny", run_name="render-me", store="memory://render-test/runs", env="HalfCheetah-v5")
    open_run(cfg)
    commit_initial(cfg, build_learner(cfg).state())
    try:
        result = render_version(cfg, 0, fmt="gif", max_steps=3, width=64, height=48)
        fs, path = fsspec.core.url_to_fs(result["url"])
        assert result["url"].startswith("memory://render-test/runs/render-me/videos/")
        assert iio.imread(fs.cat_file(path), extension=".gif", index=None).shape == (3, 48, 64, 3)
    finally:
        fsspec.filesystem("memory").rm("/render-test", recursive=True)


def test_bad_arguments_are_refused_before_rendering(tmp_path) -> None:
    cfg = stored_run(tmp_path, "HalfCheetah-v5")
    with pytest.raises(ValueError, match="video format 'avi'"):
        render_version(cfg, 0, fmt="avi")
    with pytest.raises(ValueError, match="even"):
        render_version(cfg, 0, width=161)
    with pytest.raises(ValueError, match="camera 'side'"):
        render_version(cfg, 0, max_steps=1, camera="side")
    with pytest.raises(ValueError, match="gym:Pendulum-v1 is not a MuJoCo env"):
        render_version(stored_run(tmp_path / "pendulum", "gym:Pendulum-v1"), 0, max_steps=1)


# Each case makes offscreen GL genuinely unavailable in a fresh process: glvnd's libEGL with no vendor driver to
# load (what a machine without libegl-mesa0 looks like), and MUJOCO_GL=osmesa where libOSMesa is not installed.
NO_EGL_DRIVER = {"__EGL_VENDOR_LIBRARY_FILENAMES": "/nonexistent/egl_vendor.json"}
CASES = [
    pytest.param(None, NO_EGL_DRIVER, "egl", id="default-egl-without-driver"),
    pytest.param("osmesa", {}, "osmesa", id="osmesa-without-libosmesa",
                 marks=pytest.mark.skipif(ctypes.util.find_library("OSMesa") is not None,
                                          reason="libOSMesa is installed here")),
]


@pytest.mark.parametrize(("set_gl", "env_vars", "backend"), CASES)
def test_without_gl_rendering_says_what_to_install(tmp_path, set_gl, env_vars, backend) -> None:
    cfg = stored_run(tmp_path, "HalfCheetah-v5")
    script = textwrap.dedent(f"""
        import os, sys
        from rl_core.data.run_info import load_run_config
        from rl_core.reporting.episode_video import RenderUnavailable, render_version
        cfg = load_run_config({cfg.storage.url!r}, {cfg.run_name!r})  # mujoco is imported by now, as in any run
        set_gl = {set_gl!r}
        if set_gl is not None:
            os.environ["MUJOCO_GL"] = set_gl
        try:
            render_version(cfg, 0, max_steps=2, width=64, height=48)
        except RenderUnavailable as err:
            print(err)
            sys.exit(3)
    """)
    environ = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    done = subprocess.run([sys.executable, "-c", script], check=False, cwd=REPO, env={**environ, **env_vars},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"MUJOCO_GL={backend}" in done.stdout
    assert "apt-get install libegl1" in done.stdout and "apt-get install libosmesa6" in done.stdout
    assert "training does not need it" in done.stdout
    assert not list((tmp_path / "runs").rglob("videos/*")), "nothing is stored when nothing was rendered"
