"""Per-task PPO presets (rl_core/presets/<task>.yaml): shipped files validate, the measured tasks keep their
values, and the layers resolve in order: PPOConfig defaults < task file < size preset < explicit `ppo=`."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rl_core import config
from rl_core.config import PRESET_DIR, ConfigError, PPOConfig, build_config, task_ppo_preset
from rl_core.data.run_info import load_run_config, open_run

SHIPPED = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5"]

# What HalfCheetah and Hopper trained with before the preset files existed (`make train`'s measured figures and
# bench/ppo.py's Hopper runs): written out here, not read from the files, so a file edit that moves them fails.
MEASURED = {
    "learning_rate": 3e-4, "anneal_lr": True, "gamma": 0.99, "gae_lambda": 0.95, "update_epochs": 10,
    "minibatch_size": 512, "clip_coef": 0.2, "clip_vloss": False, "ent_coef": 0.0, "vf_coef": 0.5,
    "max_grad_norm": 0.5, "target_kl": None, "norm_adv": True, "hidden": (64, 64), "log_std_init": 0.0,
    "scale_rewards": True,
}


@pytest.mark.parametrize("task", SHIPPED)
def test_shipped_preset_loads_and_fits_every_size_preset(task: str) -> None:
    assert (PRESET_DIR / f"{task}.yaml").is_file()
    values = task_ppo_preset(task)
    assert values and set(values) <= set(PPOConfig.model_fields)
    for size, preset in config.PRESETS.items():  # validates: minibatch divides the batch, splits over the ranks
        cfg = build_config(size, run_name="r", env=task)
        from_file = {k: v for k, v in values.items() if k not in preset.get("ppo", {})}
        assert {k: getattr(cfg.ppo, k) for k in from_file} == from_file


@pytest.mark.parametrize("task", ["HalfCheetah-v5", "Hopper-v5"])
def test_measured_tasks_keep_their_values(task: str) -> None:
    assert build_config("quick", run_name="r", env=task).ppo.model_dump() == MEASURED
    assert build_config("full", run_name="r", env=task).ppo.model_dump() == MEASURED


def test_default_env_gets_halfcheetah_values() -> None:
    cfg = build_config("quick", run_name="r")
    assert cfg.env == "HalfCheetah-v5" and cfg.ppo.model_dump() == MEASURED


def test_humanoid_differs_where_its_file_says() -> None:
    ppo = build_config("quick", run_name="r", env="Humanoid-v5").ppo
    assert ppo.hidden == (256, 256) and ppo.log_std_init == -2.0 and ppo.gamma == 0.95
    assert ppo.minibatch_size == 512 and ppo.learning_rate == 3e-4  # batch-shape values stay at the defaults


def test_task_without_a_file_gets_the_defaults() -> None:
    assert task_ppo_preset("gym:Pendulum-v1") == {} and task_ppo_preset("ReachingArm-v0") == {}
    assert task_ppo_preset("../presets/HalfCheetah-v5") == {}  # a name, never a path
    assert build_config("quick", run_name="r", env="gym:Pendulum-v1").ppo == PPOConfig()


def _preset_dir(tmp_path: Path, text: str, task: str = "HalfCheetah-v5") -> Path:
    (tmp_path / f"{task}.yaml").write_text(text)
    return tmp_path


def test_layers_file_then_size_preset_then_explicit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "PRESET_DIR", _preset_dir(
        tmp_path, "learning_rate: 0.001\ngamma: 0.9\nminibatch_size: 64\nupdate_epochs: 7\nclip_coef: 0.1\n"))
    quick = build_config("quick", run_name="r").ppo
    assert (quick.learning_rate, quick.gamma, quick.minibatch_size, quick.update_epochs) == (1e-3, 0.9, 64, 7)
    tiny = build_config("tiny", run_name="r", ppo={"update_epochs": 3, "clip_coef": 0.3}).ppo
    assert (tiny.learning_rate, tiny.gamma) == (1e-3, 0.9)  # from the file
    assert tiny.minibatch_size == 32  # the size preset beats the file
    assert (tiny.update_epochs, tiny.clip_coef) == (3, 0.3)  # explicit beats both
    assert tiny.gae_lambda == PPOConfig().gae_lambda  # in no layer: the default


def test_shipped_file_under_size_preset_and_explicit_override() -> None:
    ppo = build_config("tiny", run_name="r", env="Humanoid-v5", ppo={"gamma": 0.99}).ppo
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
    path = _preset_dir(tmp_path, text) / "HalfCheetah-v5.yaml"
    with pytest.raises(ConfigError) as err:
        task_ppo_preset("HalfCheetah-v5", tmp_path)
    assert str(path) in str(err.value) and key in str(err.value)
    monkeypatch.setattr(config, "PRESET_DIR", tmp_path)  # the same error when a run is configured
    with pytest.raises(ConfigError, match=key):
        build_config("quick", run_name="r")


def test_preset_file_must_be_a_mapping(tmp_path: Path) -> None:
    _preset_dir(tmp_path, "- 0.001\n- 0.99\n")
    with pytest.raises(ConfigError, match="HalfCheetah-v5.yaml: expected a mapping"):
        task_ppo_preset("HalfCheetah-v5", tmp_path)


def test_resolved_config_round_trips_through_run_json() -> None:
    """A run stores its resolved values: reloading and continuing it does not re-read the preset files."""
    store = f"memory://gymflow-presets-{uuid.uuid4().hex}"
    cfg = build_config("tiny", run_name="humanoid", env="Humanoid-v5", store=store)
    assert open_run(cfg).is_new
    assert load_run_config(store, "humanoid") == cfg
    assert not open_run(cfg).is_new
