"""flows.evaluate: a stored version's deterministic episodes, recorded, reproducible, with clear errors; rendered to a
video in the run folder on request."""
from __future__ import annotations

import base64
import json

import fsspec
import imageio.v3 as iio
import pytest
from prefect.artifacts import Artifact

from flows.evaluate import evaluate_policy
from rl_core.algos.base import build_learner
from rl_core.checkpoint import VersionNotFoundError
from rl_core.config.common import ConfigError
from rl_core.config.presets import build_control_config
from rl_core.data.run_info import open_run
from rl_core.reporting.episode_video import render_version
from rl_core.runtime.commits import commit_initial
from tasks.render_video import video_markdown


@pytest.fixture
def stored_run(tmp_path):
    """A run with version 0 (the seeded learner) committed, made without Ray or a flow."""
    cfg = build_control_config("tiny", run_name="eval-me", store=f"file://{tmp_path}/runs", env="Hopper-v5")
    open_run(cfg)
    commit_initial(cfg, build_learner(cfg).state())
    return cfg


def test_evaluate_records_mean_and_std_and_repeats_exactly(stored_run, prefect_api) -> None:
    first = evaluate_policy("eval-me", stored_run.storage.url, episodes=3)
    assert first["version"] == 0 and first["episodes"] == 3 and first["env_steps"] == 0
    assert first["final_return_std"] >= 0 and first["final_return"] == first["final_return"]  # finite, not NaN
    fs, path = fsspec.core.url_to_fs(first["record"])
    assert json.loads(fs.cat_file(path))["final_return"] == first["final_return"]
    again = evaluate_policy("eval-me", stored_run.storage.url, version=0, episodes=3)
    assert {k: again[k] for k in ("final_return", "final_return_std", "policy_sha256")} == {
        k: first[k] for k in ("final_return", "final_return_std", "policy_sha256")}


def test_unknown_run_version_and_bad_episodes_are_clear_errors(stored_run, prefect_api) -> None:
    with pytest.raises(ConfigError, match="no run 'nope'"):
        evaluate_policy("nope", stored_run.storage.url)
    with pytest.raises(VersionNotFoundError, match="no version 7"):
        evaluate_policy("eval-me", stored_run.storage.url, version=7)
    with pytest.raises(ConfigError, match="episodes"):
        evaluate_policy("eval-me", stored_run.storage.url, episodes=0)


@pytest.mark.slow
def test_video_of_the_evaluated_version_is_stored_in_the_run_and_linked_from_an_artifact(
        stored_run, prefect_api, tmp_path) -> None:
    state = evaluate_policy("eval-me", stored_run.storage.url, episodes=1, video=True, return_state=True)
    result = state.result()
    video = result["video"]
    path = tmp_path / "runs" / "eval-me" / "videos" / "v00000000.mp4"
    assert video["version"] == result["version"] == 0 and video["path"] == str(path)
    assert path.stat().st_size == video["bytes"] > 0
    assert iio.imread(path.read_bytes(), extension=".mp4", index=None).shape == (video["frames"], 360, 480, 3)
    # the rendered episode is the one evaluation scored (evaluation's env 0, played to its end)
    assert video["complete"] == [True] and video["returns"][0] == pytest.approx(result["final_return"], rel=1e-9)
    artifact = Artifact.get(video["artifact"])
    assert video["artifact"] == "eval-me-video" and artifact.flow_run_id == state.state_details.flow_run_id
    assert f"]({video['url']})" in artifact.data and f"`{path}`" in artifact.data


def test_video_artifact_embeds_a_small_gif_and_links_an_mp4(stored_run) -> None:
    gif = render_version(stored_run, 0, fmt="gif", max_steps=6, width=64, height=48)
    markdown = video_markdown("eval-me", gif)
    embedded = markdown.split("![episode](data:image/gif;base64,")[1].rstrip(")")
    assert base64.b64decode(embedded) == fsspec.core.url_to_fs(gif["url"])[0].cat_file(gif["path"])
    mp4 = render_version(stored_run, 0, max_steps=6, width=64, height=48)
    assert "base64" not in video_markdown("eval-me", mp4) and mp4["url"] in video_markdown("eval-me", mp4)
