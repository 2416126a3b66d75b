"""Invalid configurations fail up front with the field and what it allows."""
from __future__ import annotations

import pytest

from rl_core.algos.preflight import preflight
from rl_core.config.common import ConfigError
from rl_core.config.presets import build_control_config


@pytest.mark.parametrize(
    ("overrides", "field", "allowed"),
    [
        ({"iterations": -3}, "iterations", "greater than or equal to 1"),
        ({"env": "Nope-v0"}, "env.name (--env)", "allowed: Ant-v5, HalfCheetah-v5, Hopper-v5"),
        ({"num_ranks": 0}, "num_ranks", "greater than or equal to 1"),
        ({"store": "ftp://host/x"}, "storage.url (--store)", "allowed: file, memory, s3"),
        ({"run_name": "a b/c"}, "run_name", "letters, digits"),
    ],
)
def test_invalid_field_is_named_with_allowed_values(overrides: dict, field: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        preflight(build_control_config("quick", **{"run_name": "r", **overrides}))  # the values, then the world
    assert f"{field}:" in str(err.value) and allowed in str(err.value)


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(ConfigError, match="preset: .*allowed: quick, full, tiny"):
        build_control_config("fast", run_name="r")


def test_minibatch_must_split_evenly_over_ranks() -> None:
    with pytest.raises(ConfigError, match="num_ranks 3 must divide"):
        build_control_config("quick", run_name="r", num_ranks=3)


def test_preset_then_overrides() -> None:
    cfg = build_control_config("tiny", run_name="r", iterations=5, hyperparameters={"learning_rate": 1e-3})
    assert cfg.iterations == 5 and cfg.env.rollout_steps == 16
    assert cfg.algorithm.learning_rate == 1e-3 and cfg.algorithm.minibatch_size == 32


def test_file_store_becomes_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = build_control_config("tiny", run_name="r", store="runs")
    assert cfg.run_url == f"file://{tmp_path}/runs/r"


def test_every_scalar_field_is_a_launch_option_and_nests_where_it_belongs() -> None:
    """The flow's parameters and the CLI's flags come from the models: a field added there is an option."""
    from rl_core.config.common import StorageConfig
    from rl_core.config.control import ControlRunConfig, EnvConfig
    from rl_core.config.launch_options import launch_options, nest_options

    options = launch_options()
    paths = {o.path for o in options.values() if o.path}
    for prefix, model in (((), ControlRunConfig), (("env",), EnvConfig), (("storage",), StorageConfig)):
        scalar = {f for f, info in model.model_fields.items() if f not in ControlRunConfig.SECTIONS and f != "randomization"}
        assert {(*prefix, f) for f in scalar} <= paths, model.__name__
    assert options["env"].path == ("env", "name") and options["store"].path == ("storage", "url")
    assert nest_options({"env": "Hopper-v5", "seed": 3, "store": None}) == {"env": {"name": "Hopper-v5"}, "seed": 3}
    with pytest.raises(ConfigError, match="unknown launch option envs; known: preset"):
        build_control_config("tiny", run_name="r", envs="Hopper-v5")


def test_a_config_in_the_flat_layout_reads_as_the_sectioned_one() -> None:
    """run.json and checkpoint meta written before the sections existed (flat fields, `ppo`) still load."""
    from rl_core.config.control import ControlRunConfig

    cfg = build_control_config("tiny", run_name="old", env="Hopper-v5", store="memory://x", hyperparameters={"gamma": 0.9})
    flat = {"run_name": "old", "seed": 0, "iterations": 2, "num_ranks": 2, "overlap": False, "eval_episodes": 1,
            "collective_timeout_s": 120.0, "env_module": None, "env": "Hopper-v5", "randomization": None,
            "num_workers": 2, "envs_per_worker": 4, "rollout_steps": 16, "store": "memory://x", "full_every": 8,
            "epoch_checkpoint_every": 1, "epoch_checkpoint_min_s": 0.0,
            "ppo": {k: v for k, v in cfg.algorithm.model_dump(mode="json").items() if k != "name"}}
    assert ControlRunConfig.model_validate(flat) == cfg


@pytest.mark.parametrize("options, named", [
    ({"seed": 2**70}, "seed"),
    ({"hyperparameters": {"hidden": ()}}, "algorithm.hidden"),
    ({"hyperparameters": {"hidden": (64, 0)}}, "algorithm.hidden.1"),
])
def test_values_that_would_fail_inside_an_actor_are_refused_at_start(options: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        build_control_config("tiny", run_name="bad", **options)


def test_the_default_store_is_resolved_where_the_config_is_made(tmp_path, monkeypatch) -> None:
    from rl_core.config.control import ControlRunConfig

    monkeypatch.chdir(tmp_path)
    assert ControlRunConfig(run_name="here", iterations=1).storage.url == f"file://{tmp_path}/runs"


def test_a_memory_store_is_refused_for_a_flow_naming_why() -> None:
    from rl_core.config.common import require_shared_store

    with pytest.raises(ConfigError, match="Ray actors"):
        require_shared_store("memory://runs")
    require_shared_store("file:///tmp/runs")


def test_the_config_package_is_data_and_imports_no_model_env_or_backend() -> None:
    """Parsing a config (every actor does) costs no torch, MuJoCo or transformers import: its checks of the world
    are the preflight's (`rl_core.algos.preflight`)."""
    import subprocess
    import sys

    code = ("import sys, rl_core.config.agent, rl_core.config.presets, rl_core.config.presets, "
            "rl_core.config.launch_options, rl_core.config.threads\n"
            "heavy = {'torch', 'mujoco', 'gymnasium', 'transformers', 'ray', 'prefect', 'numpy'}\n"
            "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))\n"
            "print(sorted(m for m in sys.modules if m.startswith('rl_core.') and not m.startswith('rl_core.config')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.split("\n")[:2] == ["[]", "[]"], done.stdout
