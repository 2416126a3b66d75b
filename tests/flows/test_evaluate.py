"""flows.evaluate: a stored version's deterministic episodes, recorded, reproducible, with clear errors."""
from __future__ import annotations

import json

import fsspec
import pytest

from flows.evaluate import evaluate_policy
from rl_core.algos.base import build_learner
from rl_core.checkpoint import VersionNotFoundError
from rl_core.config import ConfigError
from rl_core.data.run_info import open_run
from rl_core.run_presets import build_config
from rl_core.runtime.commits import commit_initial


@pytest.fixture
def stored_run(tmp_path):
    """A run with version 0 (the seeded learner) committed, made without Ray or a flow."""
    cfg = build_config("tiny", run_name="eval-me", store=f"file://{tmp_path}/runs", env="Hopper-v5")
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
