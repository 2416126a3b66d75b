"""The control flow end to end on a tiny configuration: real Prefect, Ray actors, gloo ranks, MuJoCo, store."""
from __future__ import annotations

import asyncio
import json
import os

import pytest

from rl_core.checkpoint import CheckpointStore
from rl_core.config.common import ConfigError
from tests.flows.flow_helpers import check_run_artifacts

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api", "local_ray")]


def _run(tmp_path, **kwargs) -> dict:
    from flows.train_control import train_control

    return train_control(preset="tiny", store=f"file://{tmp_path}/runs", **kwargs)


def _task_names(flow_run_id) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            return [r.name.rsplit("-", 1)[0] for r in runs]

    return asyncio.run(read())


def test_tiny_run_commits_every_iteration_and_evaluates(tmp_path) -> None:
    from flows.train_control import train_control

    state = train_control(preset="tiny", store=f"file://{tmp_path}/runs", run_name="e2e", return_state=True)
    summary = state.result()
    assert summary["iterations"] == 2 and summary["env_steps"] == 2 * 2 * 4 * 16
    assert summary["random_return"] < 0 and len(summary["policy_sha256"]) == 64
    assert 0 < summary["first_iteration_s"] < summary["loop_s"] < summary["wall_s"]  # each inside the next
    store = CheckpointStore(f"{summary['run_dir']}/checkpoints")
    assert store.versions() == [0, 1, 2]
    assert not os.path.exists(f"{tmp_path}/runs/e2e/steps") or not os.listdir(f"{tmp_path}/runs/e2e/steps")
    names = sorted(_task_names(state.state_details.flow_run_id))
    assert names.count("simulate") == 2 and names.count("score") == 2 and names.count("checkpoint_diff") == 2
    assert names.count("train_shard") == 4 and names.count("kernel_autotune") == 1
    tuned = json.loads((tmp_path / "runs" / "e2e" / "kernels" / "autotune.json").read_text())
    assert [op["op"] for op in tuned["ops"]] == ["gae", "ppo_grad", "policy_mlp_forward"]
    assert tuned == summary["kernels"]
    check_run_artifacts(state.state_details.flow_run_id, "e2e", 2, tmp_path / "runs" / "e2e")


def test_same_seed_same_weights_and_same_name_continues(tmp_path) -> None:
    a = _run(tmp_path, run_name="a", seed=3)
    b = _run(tmp_path, run_name="b", seed=3)
    assert a["policy_sha256"] == b["policy_sha256"]
    assert all(bucket["cache_hit"] for op in b["kernels"]["ops"] for bucket in op["buckets"])  # tuned once per machine
    again = _run(tmp_path, run_name="a", seed=3)  # nothing left to do: same weights, no new steps
    assert again["policy_sha256"] == a["policy_sha256"] and again["env_steps"] == a["env_steps"]
    longer = _run(tmp_path, run_name="a", seed=3, iterations=3)
    assert longer["env_steps"] == a["env_steps"] * 3 // 2
    assert CheckpointStore(f"{longer['run_dir']}/checkpoints").versions() == [0, 1, 2, 3]


@pytest.mark.parametrize("bad", [{"iterations": -1}, {"env": "Nope-v0"}, {"num_ranks": 0}])
def test_invalid_config_fails_at_start_and_writes_nothing(tmp_path, bad: dict) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        _run(tmp_path, run_name="bad", **bad)
    assert not (tmp_path / "runs").exists()


def test_unknown_store_scheme_fails_at_start(tmp_path) -> None:
    from flows.train_control import train_control

    with pytest.raises(ConfigError, match=r"storage.url \(--store\): .*allowed: file, memory, s3"):
        train_control(preset="tiny", run_name="bad", store="ftp://example/x")


def test_same_name_with_other_settings_is_refused(tmp_path) -> None:
    _run(tmp_path, run_name="c", seed=1, iterations=1)
    with pytest.raises(ConfigError, match="seed: was 1, now 2"):
        _run(tmp_path, run_name="c", seed=2, iterations=1)


def test_a_run_continues_on_another_number_of_env_workers(tmp_path, monkeypatch) -> None:
    """Its 8 envs trained on 2 workers, a run continues on 1 worker holding all 8 (restored from the checkpoint in
    global env order) and computes what the never re-split run computes (the in-process loop, whose weights the flow
    matches bit for bit, where split runs keep their bits: tests/pinned_runs.py; elsewhere within tolerance); a
    continuation with another number of envs is refused. Reference kernels: tuned winners may differ between batch
    sizes of 4 and 8."""
    from rl_core.config.presets import build_control_config
    from tests.pinned_runs import TOLERANCES, PinnedRun, split_differences, train_keeping_state

    monkeypatch.setenv("GYMFLOW_KERNELS", "reference")
    _run(tmp_path, run_name="r", iterations=1, num_ranks=1)  # the tiny preset: 2 workers x 4 envs
    resized = _run(tmp_path, run_name="r", iterations=2, num_ranks=1, num_workers=1, envs_per_worker=8)
    unsplit = train_keeping_state(build_control_config("tiny", run_name="r", iterations=2, num_ranks=1))
    store = CheckpointStore(f"{tmp_path}/runs/r/checkpoints")
    assert store.versions() == [0, 1, 2]
    assert store.load(2).tensors["env.episode_step"].tolist() == [2 * 16] * 8  # continued, not reset (HalfCheetah)
    continued = PinnedRun(resized["policy_sha256"], {k: v for k, v in store.load(2).tensors.items()
                                                     if k.startswith("model.")})
    assert not split_differences(unsplit, continued, TOLERANCES["tiny"])
    with pytest.raises(ConfigError, match="env.num_workers x env.envs_per_worker: was 8, now 16"):
        _run(tmp_path, run_name="r", iterations=3, num_ranks=1, num_workers=4, envs_per_worker=4)


def test_command_line_stops_the_actors_it_started_when_the_run_is_refused(tmp_path, capsys) -> None:
    """The CLI creates the run's actors before the flow starts; when the flow then refuses the run (another
    configuration under the same name), the command exits 2 and stops the actors it created. (A whole run through
    the command line: the SIGKILL test in test_resume.py.)"""
    import ray

    from flows.tooling.cli import main
    from rl_core.config.presets import build_control_config
    from rl_core.data.run_info import open_run

    store = f"file://{tmp_path}/runs"
    open_run(build_control_config("tiny", run_name="cli", store=store))  # an existing run, seed 0
    assert main(["train", "--preset", "tiny", "--run-name", "cli", "--store", store, "--seed", "9"]) == 2
    assert "seed: was 0, now 9" in capsys.readouterr().err.replace("\n", " ")
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if "gymflow-cli-" in a["name"]]


@pytest.mark.parametrize(
    ("env", "env_module"), [("ReachingArm-v0", "examples.reaching_arm"), ("gym:Pendulum-v1", None)]
)
def test_a_task_of_your_own_and_a_gymnasium_backend_train_by_name(tmp_path, env: str, env_module) -> None:
    """Ray workers import the task module themselves (through the config) and step the named env."""
    summary = _run(tmp_path, env=env, env_module=env_module, iterations=1)
    assert summary["env_steps"] == 2 * 4 * 16 and len(summary["policy_sha256"]) == 64
    assert CheckpointStore(f"{summary['run_dir']}/checkpoints").versions() == [0, 1]


@pytest.mark.parametrize("overlap", [False, True], ids=["sequential", "overlap"])
def test_the_flow_computes_what_rl_core_computes_in_one_process(tmp_path, overlap: bool) -> None:
    """With one rank, the orchestrated flow (Ray workers, store round trips, checkpoints, tuned kernels) and the
    in-process loop of rl_core produce bit-identical weights: orchestration adds no math. Both run at the trainer
    ranks' thread count, so both look up the same tuned kernel winners. With overlap both act one update stale;
    3 iterations, so a lag of another length in either would show."""
    import torch

    from rl_core.algos.ppo.in_process import train_in_process
    from rl_core.config.presets import build_control_config

    threads = torch.get_num_threads()
    flow = _run(tmp_path, run_name="orchestrated", seed=5, num_ranks=1, overlap=overlap, iterations=3)
    direct = train_in_process(build_control_config("tiny", run_name="direct", seed=5, num_ranks=1, overlap=overlap,
                                           iterations=3))
    assert torch.get_num_threads() == threads  # the caller's setting is restored
    assert direct.policy_sha256 == flow["policy_sha256"]
    assert direct.evaluation["final_return"] == flow["final_return"]


def test_a_run_that_asks_for_a_video_renders_its_final_version(tmp_path) -> None:
    """The nightly deployment's end (eval_video): the final version's episode as an MP4 in the run's folder,
    linked from the run's video artifact. An untrained pendulum falls within a few dozen steps: a short video."""
    import imageio.v3 as iio

    from flows.train_control import train_control
    from tests.flows.flow_helpers import artifacts

    state = train_control(preset="tiny", env="InvertedPendulum-v5", store=f"file://{tmp_path}/runs", run_name="film",
                          eval_video=True, return_state=True)
    frames = iio.imread(tmp_path / "runs" / "film" / "videos" / "v00000002.mp4")
    assert state.result()["iterations"] == 2 and len(frames) > 1 and frames.std() > 0
    assert "v00000002.mp4" in artifacts(state.state_details.flow_run_id)["film-video"].data


def test_a_second_flow_on_a_run_in_progress_stops_naming_the_first_and_changes_nothing(tmp_path) -> None:
    """Two flow runs of one run name at once: the first trains (here: stalled mid-update of iteration 1), the second
    stops at its start with RunBusy naming the first; every committed version still verifies."""
    import signal
    import subprocess
    import sys
    import time

    from flows.train_control import train_control
    from rl_core.data.run_lease import RunBusy

    store = f"file://{tmp_path}/runs"
    env = {**os.environ, "GYMFLOW_FAULTS": "train.epoch_end:iteration=1,rank=0,epoch=1,action=stall",
           "GYMFLOW_FAULT_DIR": str(tmp_path)}
    first = subprocess.Popen([sys.executable, "-m", "flows.tooling.cli", "train", "--preset", "tiny", "--run-name", "busy",
                              "--iterations", "3", "--store", store], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "runs" / "busy" / "checkpoints" / "versions" / "00000001.commit").exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first run never committed version 1"
            time.sleep(0.1)
        with pytest.raises(RunBusy, match=rf"run 'busy' at .* is being trained by another flow run .*process "
                                          rf"{first.pid}"):
            train_control(preset="tiny", store=store, run_name="busy", iterations=3)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert CheckpointStore(f"{tmp_path}/runs/busy/checkpoints").verify()["errors"] == {}
