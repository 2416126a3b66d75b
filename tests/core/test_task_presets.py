"""Per-task PPO presets (rl_core/config/presets/ppo/<task>.yaml): shipped files validate, the measured tasks keep their
values, and the layers resolve in order: PPOConfig defaults < task file < size preset < explicit
`hyperparameters=`."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rl_core.config import presets
from rl_core.config.common import ConfigError
from rl_core.config.control import PPOConfig
from rl_core.config.presets import PRESET_DIR, build_control_config, task_preset
from rl_core.data.run_info import load_run_config, open_run

SHIPPED = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5"]

# What HalfCheetah and Hopper trained with before the preset files existed (`make train`'s measured figures and
# bench/ppo.py's Hopper runs): written out here, not read from the files, so a file edit that moves them fails.
MEASURED = {
    "learning_rate": 3e-4, "anneal_lr": True, "gamma": 0.99, "gae_lambda": 0.95, "update_epochs": 10,
    "minibatch_size": 512, "clip_coef": 0.2, "clip_vloss": False, "ent_coef": 0.0, "vf_coef": 0.5,
    "max_grad_norm": 0.5, "target_kl": None, "norm_adv": True, "hidden": (64, 64), "log_std_init": 0.0,
    "scale_rewards": True, "name": "ppo",
    "nonfinite_limit": 3,  # the instability guard: no effect on a run whose losses stay finite
}


@pytest.mark.parametrize("task", SHIPPED)
def test_shipped_preset_loads_and_fits_every_size_preset(task: str) -> None:
    assert (PRESET_DIR / "ppo" / f"{task}.yaml").is_file()
    values = task_preset("ppo", task)
    assert values and set(values) <= set(PPOConfig.model_fields)
    for size, preset in presets.CONTROL_PRESETS.items():  # validates: minibatch divides the batch, splits over the ranks
        cfg = build_control_config(size, run_name="r", env=task)
        from_file = {k: v for k, v in values.items() if k not in preset.get("algorithm", {}).get("ppo", {})}
        assert {k: getattr(cfg.algorithm, k) for k in from_file} == from_file


@pytest.mark.parametrize("task", ["HalfCheetah-v5", "Hopper-v5"])
def test_measured_tasks_keep_their_values(task: str) -> None:
    assert build_control_config("quick", run_name="r", env=task).algorithm.model_dump() == MEASURED
    assert build_control_config("full", run_name="r", env=task).algorithm.model_dump() == MEASURED


def test_default_env_gets_halfcheetah_values() -> None:
    cfg = build_control_config("quick", run_name="r")
    assert cfg.env.name == "HalfCheetah-v5" and cfg.algorithm.model_dump() == MEASURED


def test_humanoid_differs_where_its_file_says() -> None:
    ppo = build_control_config("quick", run_name="r", env="Humanoid-v5").algorithm
    assert ppo.hidden == (256, 256) and ppo.log_std_init == -2.0 and ppo.gamma == 0.95
    assert ppo.minibatch_size == 512 and ppo.learning_rate == 3e-4  # batch-shape values stay at the defaults


def test_task_without_a_file_gets_the_defaults() -> None:
    assert task_preset("ppo", "gym:Pendulum-v1") == {} and task_preset("ppo", "ReachingArm-v0") == {}
    assert task_preset("ppo", "../presets/HalfCheetah-v5") == {}  # a name, never a path
    assert build_control_config("quick", run_name="r", env="gym:Pendulum-v1").algorithm == PPOConfig()


def _preset_dir(tmp_path: Path, text: str, task: str = "HalfCheetah-v5") -> Path:
    (tmp_path / "ppo").mkdir(exist_ok=True)
    (tmp_path / "ppo" / f"{task}.yaml").write_text(text)
    return tmp_path


def test_layers_file_then_size_preset_then_explicit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(presets, "PRESET_DIR", _preset_dir(
        tmp_path, "learning_rate: 0.001\ngamma: 0.9\nminibatch_size: 64\nupdate_epochs: 7\nclip_coef: 0.1\n"))
    quick = build_control_config("quick", run_name="r").algorithm
    assert (quick.learning_rate, quick.gamma, quick.minibatch_size, quick.update_epochs) == (1e-3, 0.9, 64, 7)
    tiny = build_control_config("tiny", run_name="r", hyperparameters={"update_epochs": 3, "clip_coef": 0.3}).algorithm
    assert (tiny.learning_rate, tiny.gamma) == (1e-3, 0.9)  # from the file
    assert tiny.minibatch_size == 32  # the size preset beats the file
    assert (tiny.update_epochs, tiny.clip_coef) == (3, 0.3)  # explicit beats both
    assert tiny.gae_lambda == PPOConfig().gae_lambda  # in no layer: the default


def test_shipped_file_under_size_preset_and_explicit_override() -> None:
    ppo = build_control_config("tiny", run_name="r", env="Humanoid-v5", hyperparameters={"gamma": 0.99}).algorithm
    assert ppo.hidden == (256, 256) and ppo.minibatch_size == 32 and ppo.update_epochs == 2 and ppo.gamma == 0.99


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("learning_rate: 0.001\nlearnin_rate: 0.002\n", "learnin_rate"),  # unknown key
        ("minibatch_size: 0\n", "minibatch_size"),  # out of range
        ("hidden: wide\n", "hidden"),  # wrong type
    ],
)
def test_bad_preset_file_names_file_and_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            text: str, key: str) -> None:
    path = _preset_dir(tmp_path, text) / "ppo" / "HalfCheetah-v5.yaml"
    with pytest.raises(ConfigError) as err:
        task_preset("ppo", "HalfCheetah-v5", tmp_path)
    assert str(path) in str(err.value) and key in str(err.value)
    monkeypatch.setattr(presets, "PRESET_DIR", tmp_path)  # the same error when a run is configured
    with pytest.raises(ConfigError, match=key):
        build_control_config("quick", run_name="r")


def test_preset_file_must_be_a_mapping(tmp_path: Path) -> None:
    _preset_dir(tmp_path, "- 0.001\n- 0.99\n")
    with pytest.raises(ConfigError, match="HalfCheetah-v5.yaml: expected a mapping"):
        task_preset("ppo", "HalfCheetah-v5", tmp_path)


def test_resolved_config_round_trips_through_run_json() -> None:
    """A run stores its resolved values: reloading and continuing it does not re-read the preset files."""
    store = f"memory://gymflow-presets-{uuid.uuid4().hex}"
    cfg = build_control_config("tiny", run_name="humanoid", env="Humanoid-v5", store=store)
    assert open_run(cfg).is_new
    assert load_run_config(store, "humanoid") == cfg
    assert not open_run(cfg).is_new


def test_a_run_stored_in_the_flat_layout_continues() -> None:
    """A run.json written before the config had sections: the same run name continues it, a change is refused."""
    import json

    import fsspec

    store = f"memory://gymflow-flat-{uuid.uuid4().hex}"
    cfg = build_control_config("tiny", run_name="flat", store=store)
    nested = cfg.model_dump(mode="json")
    flat = {k: v for k, v in nested.items() if k not in ("env", "storage", "algorithm")}
    flat.update({"env_module": None, "env": nested["env"]["name"], "store": nested["storage"]["url"],
                 **{k: v for k, v in nested["env"].items() if k not in ("name", "module")},
                 **{k: v for k, v in nested["storage"].items() if k != "url"},
                 "ppo": {k: v for k, v in nested["algorithm"].items() if k != "name"}})
    with fsspec.open(f"{store}/flat/run.json", "w") as f:
        json.dump({"incarnation": "abc", "created": "2026-12-01T00:00:00+00:00", "config": flat}, f)
    assert load_run_config(store, "flat") == cfg
    info = open_run(cfg)
    assert not info.is_new and info.incarnation == "abc"
    with pytest.raises(ConfigError, match="algorithm.gamma: was 0.99, now 0.9"):
        open_run(build_control_config("tiny", run_name="flat", store=store, hyperparameters={"gamma": 0.9}))
