"""render_video: deterministic episodes of a stored version rendered offscreen, stored in the run, linked from an
artifact (`<run>-video`)."""
from __future__ import annotations

import base64
import os

import fsspec
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from rl_core.config.control import ControlRunConfig
from rl_core.reporting.episode_video import RenderUnavailable, render_version
from tasks.artifact_keys import artifact_key

RETRIES = 2
EMBED_GIF_BYTES = 2_000_000  # a GIF up to this size is shown in the artifact itself (base64 in the markdown)


def _worth_retrying(task, task_run, state) -> bool:
    """Retry what may pass next time (a store hiccup), not a missing GL library or a bad argument."""
    return not isinstance(state.data, (RenderUnavailable, ValueError))


@task(name="render_video", retries=RETRIES, retry_delay_seconds=2, retry_condition_fn=_worth_retrying,
      result_serializer="json")
def render_video(cfg: ControlRunConfig, version: int | None, episodes: int = 1, fmt: str = "mp4",
                 max_steps: int = 1000) -> dict:
    """Render `episodes` episodes (at most `max_steps` steps each) of `version` (None: the newest loadable) to
    `<run>/videos/v<version>.<fmt>` and link it from the run's `video` artifact; returns `render_version`'s dict."""
    result = render_version(cfg, version, episodes=episodes, fmt=fmt, max_steps=max_steps)
    result["artifact"] = artifact_key(cfg.run_name, "video")
    create_markdown_artifact(key=result["artifact"], markdown=video_markdown(cfg.run_name, result),
                             description=f"{cfg.run_name} version {result['version']}: {episodes} episode(s) rendered")
    get_run_logger().info("video of %s version %d: %s (%d frames at %d fps, %.1f s)", cfg.run_name,
                          result["version"], result["url"], result["frames"], result["fps"], result["seconds"])
    return result


def render_final_version(cfg: ControlRunConfig, version: int) -> dict | None:
    """The end of a run that asked for a video (`eval_video`, the nightly deployment): rendered, or a warning
    saying what to install where this machine has no GL; the run's outcome never depends on it."""
    try:
        return render_video(cfg, version)
    except RenderUnavailable as err:
        get_run_logger().warning("no video of version %d: %s", version, err)
        return None


def video_markdown(run_name: str, result: dict) -> str:
    """Where the video is, what it shows, and a GIF itself when it is small enough to embed."""
    returns = ", ".join(f"{r:.1f}" if done else f"{r:.1f} (cut at the step limit)"
                        for r, done in zip(result["returns"], result["complete"]))
    shows = (f"{result['episodes']} deterministic episode(s), {sum(result['steps'])} steps, returns {returns}; "
             f"{result['frames']} frames of {result['width']}x{result['height']} at {result['fps']} fps, "
             f"{result['bytes'] / 1e6:.2f} MB.")
    lines = [f"### {run_name}: version {result['version']}", shows, "",
             f"Video: [{os.path.basename(result['path'])}]({result['url']})"]
    if result["url"].startswith("file://"):
        where = f"Local file: `{result['path']}` (the UI cannot play a file:// video: open the file there)."
        lines += ["", where]
    if result["format"] == "gif" and result["bytes"] <= EMBED_GIF_BYTES:
        fs, path = fsspec.core.url_to_fs(result["url"])
        lines += ["", f"![episode](data:image/gif;base64,{base64.b64encode(fs.cat_file(path)).decode()})"]
    return "\n".join(lines)
