"""Invalid configurations fail up front with the field and what it allows."""
from __future__ import annotations

import pytest

from rl_core.config import ConfigError, build_config


@pytest.mark.parametrize(
    ("overrides", "field", "allowed"),
    [
        ({"iterations": -3}, "iterations", "greater than or equal to 1"),
        ({"env": "Nope-v0"}, "env", "allowed: Ant-v5, HalfCheetah-v5, Hopper-v5"),
        ({"num_ranks": 0}, "num_ranks", "greater than or equal to 1"),
        ({"store": "ftp://host/x"}, "store", "allowed: file, memory, s3"),
        ({"run_name": "a b/c"}, "run_name", "letters, digits"),
    ],
)
def test_invalid_field_is_named_with_allowed_values(overrides: dict, field: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config("quick", **{"run_name": "r", **overrides})
    assert f"{field}:" in str(err.value) and allowed in str(err.value)


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(ConfigError, match="preset: .*allowed: quick, full, tiny"):
        build_config("fast", run_name="r")


def test_minibatch_must_split_evenly_over_ranks() -> None:
    with pytest.raises(ConfigError, match="num_ranks 3 must divide"):
        build_config("quick", run_name="r", num_ranks=3)


def test_preset_then_overrides() -> None:
    cfg = build_config("tiny", run_name="r", iterations=5, ppo={"learning_rate": 1e-3})
    assert cfg.iterations == 5 and cfg.rollout_steps == 16
    assert cfg.ppo.learning_rate == 1e-3 and cfg.ppo.minibatch_size == 32


def test_file_store_becomes_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = build_config("tiny", run_name="r", store="runs")
    assert cfg.run_url == f"file://{tmp_path}/runs/r"
