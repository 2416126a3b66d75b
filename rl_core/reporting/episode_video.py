"""Videos of a stored policy: deterministic episodes rendered offscreen with MuJoCo, encoded as MP4 or GIF.

Episode k starts in the state evaluation's env k starts in (same evaluation seed and global env index), so with
the same version the video shows episodes that `evaluate_control_version` scored. A frame shows the state an action is
taken in; an episode's terminal state is not drawn, because the env starts its next episode within the step
that ends it. Native tasks are rendered from a copy of env 0's qpos/qvel into a private MjData (the batch keeps
its MjData inside `mujoco.batch`); `gym:` envs built on gymnasium's MujocoEnv the same way from their own MjData.

GL: MuJoCo picks its OpenGL backend from MUJOCO_GL when `mujoco` is imported, which in any process that builds
an env is before this module runs. Rendering therefore sets MUJOCO_GL=egl when it is unset and reruns MuJoCo's
backend selection if it was made for another value. Only rendering does this; training never needs GL.
"""
from __future__ import annotations

import importlib
import math
import os
import posixpath
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import fsspec
import imageio.v2 as imageio
import mujoco
import numpy as np

from rl_core.algos.base import build_policy
from rl_core.algos.ppo.evaluation import EVAL_SEED_OFFSET, Actions
from rl_core.checkpoint import CheckpointStore
from rl_core.config.control import ControlRunConfig
from rl_core.config.randomization import DynamicsRandomization
from rl_core.data import RunLayout
from rl_core.envs.batched import BatchedMujocoEnv
from rl_core.envs.gym_backend import GymnasiumBatch
from rl_core.envs.registry import make_batch
from rl_core.seeding import derive_seed

FORMATS = ("mp4", "gif")
DEFAULT_GL = "egl"  # Mesa's EGL renders without a display (llvmpipe on a CPU-only machine)
INSTALL_HINT = (
    "offscreen rendering needs EGL or OSMesa: on Debian/Ubuntu `apt-get install libegl1 libegl-mesa0 "
    "libgl1-mesa-dri` (MUJOCO_GL=egl, the default) or `apt-get install libosmesa6` (MUJOCO_GL=osmesa); "
    "training does not need it"
)
TRACK_CAMERA = "track"  # what gymnasium's MJCF files call the camera that follows the body
SHADOW_MAP_SIZE = 1024  # pixels per side of the shadow map (see offscreen_renderer)


class VideoWriter(Protocol):
    """What frames are written to (imageio's writers): (height, width, 3) uint8 frames, then `close`."""

    def append_data(self, frame: np.ndarray) -> None: ...

    def close(self) -> None: ...


class RenderUnavailable(RuntimeError):
    """No OpenGL context could be made for offscreen rendering; the message says what to install."""


@dataclass
class Recording:
    """What `record_episodes` saw: per-episode returns and lengths, and how the frames were sampled."""

    fps: int
    frame_every: int  # one frame per `frame_every` env steps, so the video plays in real time at `fps`
    frames: int = 0
    returns: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    complete: list[bool] = field(default_factory=list)  # False: cut at max_steps before the episode ended


def offscreen_renderer(model: mujoco.MjModel, width: int, height: int) -> mujoco.Renderer:
    """A `mujoco.Renderer` for `model` (its offscreen buffer widened to fit), or RenderUnavailable."""
    backend = os.environ.setdefault("MUJOCO_GL", DEFAULT_GL)
    model.vis.global_.offwidth = max(model.vis.global_.offwidth, width)
    model.vis.global_.offheight = max(model.vis.global_.offheight, height)
    # the shadow map is drawn every frame at this size; MuJoCo's 4096 default dominates software (llvmpipe)
    # rendering, and at video sizes 1024 looks the same
    model.vis.quality.shadowsize = min(model.vis.quality.shadowsize, SHADOW_MAP_SIZE)
    try:
        from mujoco.rendering.classic import gl_context

        if gl_context._MUJOCO_GL != backend.lower().strip():
            importlib.reload(gl_context)  # reruns MuJoCo's backend choice for the current MUJOCO_GL
        return mujoco.Renderer(model, height=height, width=width)
    except Exception as err:  # each backend fails in its own way: ImportError, AttributeError, FatalError, ...
        raise RenderUnavailable(f"could not create an OpenGL context with MUJOCO_GL={backend} "
                                f"({type(err).__name__}: {err}); {INSTALL_HINT}") from err


def _physics(env: BatchedMujocoEnv | GymnasiumBatch):
    """(model, seconds per env step, state) of env 0: `state()` gives its current (qpos, qvel)."""
    if isinstance(env, BatchedMujocoEnv):
        return env.model, env.dt, lambda: (env.qpos[0], env.qvel[0])
    inner = env._vec.envs[0].unwrapped  # GymnasiumBatch keeps its SyncVectorEnv private; env 0 is all we read
    model, data = getattr(inner, "model", None), getattr(inner, "data", None)
    renderable = isinstance(model, mujoco.MjModel) and isinstance(data, mujoco.MjData)
    if not renderable:  # the env name is the problem, hence a ValueError like every bad env name
        raise ValueError(f"gym:{env.env_id} is not a MuJoCo env (no MjModel/MjData on {type(inner).__name__}); "
                         "videos need a native task or a gymnasium MujocoEnv such as gym:HalfCheetah-v5")
    return model, model.opt.timestep * inner.frame_skip, lambda: (data.qpos, data.qvel)


def _camera(model: mujoco.MjModel, name: str | None) -> str | mujoco.MjvCamera:
    """The named camera; else the model's tracking camera; else a free camera following the root body."""
    names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)]
    if name is not None:
        if name not in names:
            raise ValueError(f"camera {name!r}: the model's named cameras are {[n for n in names if n]} "
                             "(None: its tracking camera or a free one)")
        return name
    if TRACK_CAMERA in names:
        return TRACK_CAMERA
    camera = mujoco.MjvCamera()
    mujoco.mjv_defaultFreeCamera(model, camera)
    if model.nbody > 1:
        camera.type = mujoco.mjtCamera.mjCAMERA_TRACKING
        camera.trackbodyid = 1
    return camera


def frame_rate(dt: float, max_fps: int) -> tuple[int, int]:
    """(fps, frame_every): a frame every `frame_every` env steps of `dt` seconds, real time at `fps` <= max_fps."""
    frame_every = max(1, math.ceil(1.0 / (dt * max_fps)))
    return max(1, round(1.0 / (dt * frame_every))), frame_every


def record_episodes(
    env_name: str,
    actions: Actions,
    open_writer: Callable[[int], VideoWriter],
    *,
    seed: int,
    episodes: int = 1,
    max_steps: int = 1000,
    width: int = 480,
    height: int = 360,
    camera: str | None = None,
    max_fps: int = 60,
    randomization: DynamicsRandomization | None = None,
) -> Recording:
    """Play `episodes` episodes of `actions` (at most `max_steps` steps each) and write their frames to the writer
    `open_writer(fps)` returns (closed here).

    Episode k runs in env k of `make_batch(env_name, ·, seed)` (a batch of one with env_offset k).
    """
    renderer = writer = recording = None
    try:
        for k in range(episodes):
            env = make_batch(env_name, 1, seed, env_offset=k, randomization=randomization)
            model, dt, state = _physics(env)
            if renderer is None:  # every episode's env has this model: build the GL context once
                data, view = mujoco.MjData(model), _camera(model, camera)
                renderer = offscreen_renderer(model, width, height)
                recording = Recording(*frame_rate(dt, max_fps))
                writer = open_writer(recording.fps)
            episode_return, step, ended = 0.0, 0, False
            while step < max_steps and not ended:
                if step % recording.frame_every == 0:
                    data.qpos[:], data.qvel[:] = state()
                    mujoco.mj_forward(model, data)
                    renderer.update_scene(data, camera=view)
                    writer.append_data(renderer.render())
                    recording.frames += 1
                result = env.step(actions(env.observe()))
                episode_return += float(result.reward[0])
                ended = bool(result.terminated[0] or result.truncated[0])
                step += 1
            recording.returns.append(episode_return)
            recording.steps.append(step)
            recording.complete.append(ended)
    finally:
        if writer is not None:
            writer.close()
        if renderer is not None:
            renderer.close()
    return recording


def video_writer(path: str, fmt: str, fps: int) -> VideoWriter:
    """An imageio writer of an H.264 MP4 (imageio-ffmpeg's ffmpeg) or a looping GIF (Pillow) at `path`."""
    if fmt == "mp4":
        return imageio.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264", pixelformat="yuv420p",
                                  quality=None, macro_block_size=2, ffmpeg_log_level="error",
                                  output_params=["-crf", "23", "-movflags", "+faststart"])
    return imageio.get_writer(path, format="GIF", mode="I", duration=1000.0 / fps, loop=0)


def render_version(
    cfg: ControlRunConfig,
    version: int | None = None,
    *,
    episodes: int = 1,
    fmt: str = "mp4",
    max_steps: int = 1000,
    width: int = 480,
    height: int = 360,
    camera: str | None = None,
    max_fps: int = 60,
) -> dict:
    """Render `episodes` deterministic episodes of checkpoint `version` (None: the newest loadable one) and store
    the video at `RunLayout(cfg.run_url).video(version, fmt)`; returns where, and what it shows."""
    if fmt not in FORMATS:
        raise ValueError(f"video format {fmt!r}: allowed {', '.join(FORMATS)}")
    if episodes < 1 or max_steps < 1 or max_fps < 1:
        raise ValueError(f"episodes, max_steps and max_fps must be >= 1 (got {episodes}, {max_steps}, {max_fps})")
    if width < 2 or height < 2 or width % 2 or height % 2:
        raise ValueError(f"video size {width}x{height}: width and height must be even and >= 2 (H.264's 4:2:0)")
    snapshot = CheckpointStore(RunLayout(cfg.run_url).checkpoints).load(version)
    policy = build_policy(cfg)
    policy.load_state(snapshot.tensors)
    url = RunLayout(cfg.run_url).video(snapshot.version, fmt)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gymflow-video-") as tmp:
        local = str(Path(tmp) / f"video.{fmt}")
        recording = record_episodes(
            cfg.env.name, policy.deterministic_action, lambda fps: video_writer(local, fmt, fps),
            seed=derive_seed(cfg.seed, EVAL_SEED_OFFSET), episodes=episodes, max_steps=max_steps, width=width,
            height=height, camera=camera, max_fps=max_fps, randomization=cfg.env.randomization)
        video = Path(local).read_bytes()
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    fs.pipe_file(path, video)
    return {"url": url, "path": path, "version": snapshot.version, "format": fmt, "frames": recording.frames,
            "fps": recording.fps, "frame_every": recording.frame_every, "width": width, "height": height,
            "episodes": episodes, "returns": recording.returns, "steps": recording.steps,
            "complete": recording.complete, "bytes": len(video),
            "seconds": round(time.perf_counter() - started, 3)}

