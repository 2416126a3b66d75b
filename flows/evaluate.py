"""Evaluate a stored version of a run: N deterministic episodes, mean and std of the return, recorded.

    python -m flows.tooling.cli evaluate --run-name HalfCheetah-v5-quick-s0 [--version 100] [--episodes 10] [--video]

Runs in this process (no Ray): the version is restored from the run's checkpoint store, the policy's
mean action is played in ``episodes`` envs seeded apart from training, and the result is written to
``<run>/evaluations/v<version>-<episodes>ep.json``, shown as a Prefect table artifact and printed as
the last line (JSON). Evaluating the same version again gives the same numbers. With ``video``, the
evaluated version also plays one episode rendered offscreen (``tasks/render_video.py``): stored under
``<run>/videos/`` and linked from the run's ``video`` artifact.
"""
from __future__ import annotations

import json

import fsspec
from prefect import flow, task
from prefect.artifacts import create_table_artifact

from rl_core.algos.ppo.evaluation import evaluate_control_version
from rl_core.algos.preflight import preflight
from rl_core.config.common import ConfigError
from rl_core.config.control import ControlRunConfig
from rl_core.data.run_info import load_run_config
from rl_core.reporting.episode_video import FORMATS
from tasks.render_video import render_video

RETRIES = 2


@task(name="evaluate_version", retries=RETRIES)
def evaluate_version_task(cfg: ControlRunConfig, version: int | None, episodes: int) -> dict:
    """Deterministic-policy episodes of one version (None: the newest loadable)."""
    return evaluate_control_version(cfg, version, episodes)


def record(cfg: ControlRunConfig, result: dict) -> str:
    """Write the result next to the run's checkpoints; returns its URL."""
    url = f"{cfg.run_url}/evaluations/v{result['version']:08d}-{result['episodes']}ep.json"
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(fs._parent(path), exist_ok=True)
    fs.pipe_file(path, json.dumps(result, indent=2).encode())
    return url


@flow(name="evaluate-policy")
def evaluate_policy(run_name: str, store: str = "file://./runs", version: int | None = None,
                    episodes: int = 10, video: bool = False, video_format: str = "mp4") -> dict:
    """Evaluate `version` of run `run_name` under `store` with `episodes` deterministic episodes; with `video`,
    render one of them to `video_format` (mp4 or gif) as well."""
    if episodes < 1:
        raise ConfigError(f"episodes: must be >= 1 (got {episodes})")
    if video and video_format not in FORMATS:
        raise ConfigError(f"video_format: {video_format!r} is not one of {', '.join(FORMATS)}")
    cfg = preflight(load_run_config(store, run_name))
    result = evaluate_version_task(cfg, version, episodes)
    result["record"] = record(cfg, result)
    create_table_artifact(
        key="evaluation", description=f"{run_name} version {result['version']}: {episodes} deterministic episodes",
        table=[{k: result[k] for k in ("version", "env_steps", "episodes", "final_return", "final_return_std",
                                       "random_return")}],
    )
    if video:
        result["video"] = render_video(cfg, result["version"], fmt=video_format)
    return result
