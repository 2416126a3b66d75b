"""Nothing left behind in the temp dir: the benches' quick modes, an agent-flow drill with a killed generator, a bench
that fails midway and one stopped by SIGTERM, each a subprocess whose temp dir must be as empty after as before; and
a control run on S3 SIGKILLed, whose leftovers are all in its command's own folder until the command runs again.

Each runs with TMPDIR pointed at a fresh empty folder rather than with a listing of /tmp before and after: /tmp is
shared by every process on the machine (other test sessions, other users' runs), whose files a listing would count,
while everything these commands make goes through `tempfile` or TMPDIR (gymflow's own folders, Ray's, torch's,
vLLM's), so a fresh folder sees all of it and nothing else. Two folders stay out of it on purpose, pointed elsewhere:
Ray's sessions (RAY_TMPDIR: Ray keeps a session's logs after it ends, by design) and torch's compile cache
(TORCHINDUCTOR_CACHE_DIR: meant to outlive a command).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_core.private_temp import PrivateTempDir

ROOT = Path(__file__).resolve().parents[1]
ROLLOUT = [sys.executable, "bench/rollout.py", "--skip-agent", "--model", "small", "--batches", "2", "--rounds", "1",
           "--program-episodes", "quick=8"]


@contextlib.contextmanager
def short_temp_dir(prefix: str) -> Iterator[Path]:
    """A new folder at the top of the temp dir, removed after: Ray's and vLLM's socket paths must fit 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def temp() -> Iterator[Path]:
    """The fresh temp dir (TMPDIR) of the subprocesses."""
    with short_temp_dir("gf-temp-") as folder:
        yield folder


@pytest.fixture
def env(temp: Path, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The subprocesses' environment: `temp` as TMPDIR; Ray's sessions and torch's compile cache elsewhere."""
    with short_temp_dir("gf-ray-") as ray:
        yield {**os.environ, "TMPDIR": str(temp), "RAY_TMPDIR": str(ray), "PREFECT_HOME": str(tmp_path / "prefect"),
               "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}


def leftovers(temp: Path) -> list[str]:
    return sorted(str(p.relative_to(temp)) for p in temp.rglob("*"))


def gone_pid() -> int:
    """The pid of a process that has exited."""
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)


def test_a_private_temp_dir_goes_at_close_and_a_killed_process_s_with_the_next_one(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    orphaned = tmp_path / f"gymflow-x-{gone_pid()}-k2f9x1_q"
    kept = [tmp_path / f"gymflow-x-{os.getpid()}-a8d0qz3m",  # a live process's
            tmp_path / "gymflow-x-12345678",  # a plain mkdtemp's with the same prefix
            tmp_path / f"gymflow-x-5-ranks-{gone_pid()}-b7c1mm0p"]  # a trainer group's, of a run named x-5
    for path in [orphaned, *kept]:
        path.mkdir()
    (orphaned / "weights").write_bytes(b"left by a SIGKILL")
    private = PrivateTempDir("gymflow-x-")
    assert not orphaned.exists() and all(path.exists() for path in kept)
    (private.path / "model").mkdir()
    private.close()
    assert sorted(tmp_path.iterdir()) == sorted(kept)


@pytest.mark.slow
@pytest.mark.parametrize("command", [
    ROLLOUT,
    [sys.executable, "bench/checkpoint.py", "--quick", "--cases", "mlp_fp32", "--versions", "2"],
], ids=["rollout", "checkpoint"])
def test_a_bench_in_its_quick_mode_leaves_nothing(temp: Path, env: dict[str, str], command: list[str]) -> None:
    """bench/kernels.py (minutes at its least), ppo.py, resume.py and recovery.py (whole training runs) take too long
    here; they make their temp dir as these do (`use_private_temp_dir`)."""
    done = subprocess.run(command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert leftovers(temp) == []


@pytest.mark.slow
def test_simulate_scale_brings_a_pool_from_zero_to_a_first_step_and_leaves_nothing(temp: Path,
                                                                                 env: dict[str, str]) -> None:
    """bench/simulate.py `--scale` at N=100 only (the 100,000 of a real run takes ~18 GB): its JSON carries the figures
    per N."""
    command = [sys.executable, "bench/simulate.py", "--scale", "--scale-sizes", "100", "--scale-workers", "1",
               "--seconds", "0.2"]
    done = subprocess.run(command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["scale_100_s"] > 0 and out["scale_100_kb_per_env"] > 0 and out["scale_100_steps_per_s"] > 0
    assert out["scale_100k_s"].startswith("not measured")
    assert leftovers(temp) == []


@pytest.mark.slow
def test_an_agent_run_whose_generator_is_killed_leaves_nothing(temp: Path, env: dict[str, str],
                                                               tmp_path: Path) -> None:
    """The cheapest agent drill: the generator actor SIGKILLs itself mid-rollout and a replacement finishes the run."""
    faults = tmp_path / "faults"
    faults.mkdir()
    command = [sys.executable, "-m", "flows.tooling.cli", "train-agent", "--preset", "tiny", "--run-name", "drill",
               "--store", f"file://{tmp_path / 'runs'}"]
    env = {**env, "GYMFLOW_FAULT_DIR": str(faults), "GYMFLOW_FAULTS": "generator.generate:version=1,call=2,action=kill"}
    done = subprocess.run(command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert any(faults.iterdir()), "the fault never fired"
    assert leftovers(temp) == []


@pytest.mark.slow
def test_a_bench_that_fails_after_writing_its_weights_leaves_nothing(temp: Path, env: dict[str, str]) -> None:
    command = [*ROLLOUT[:-4], "--batches", "2,x", "--rounds", "1"]  # the bad batch size fails once weights are written
    done = subprocess.run(command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "invalid literal for int()" in done.stderr, done.stderr[-2000:]
    assert leftovers(temp) == []


@pytest.mark.slow
def test_a_bench_stopped_by_sigterm_midway_leaves_nothing(temp: Path, env: dict[str, str]) -> None:
    command = [*ROLLOUT[:-2], "--rounds", "1000000"]  # measures until stopped
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(temp.glob("gymflow-bench-rollout-*/model/config.json")):  # its weights are written
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the bench never wrote its weights"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert leftovers(temp) == []


@pytest.mark.slow
def test_a_training_run_sigkilled_on_s3_leaves_nothing_once_its_command_runs_again(
        temp: Path, env: dict[str, str], tmp_path: Path, s3_server) -> None:
    """`gymflow train` on an s3:// store, SIGKILLed (its whole process group) in iteration 3 once version 1 is
    committed: what it left is all in its own command folder (no TensorBoard staging folder: the scalars went to the
    store as they came, and are there), which the same command run again removes; after it ends, nothing is left."""
    import s3fs

    from rl_core.runtime.local_ray import kill_local_ray_of

    keys = {"AWS_ACCESS_KEY_ID": "AKIALEFTOVERS", "AWS_SECRET_ACCESS_KEY": "leftovers-secret"}
    fs = s3fs.S3FileSystem(key=keys["AWS_ACCESS_KEY_ID"], secret=keys["AWS_SECRET_ACCESS_KEY"],
                           client_kwargs={"endpoint_url": s3_server.endpoint}, skip_instance_cache=True)
    fs.mkdir("leftovers")
    faults = tmp_path / "faults"
    faults.mkdir()
    env = {**env, **keys, "AWS_ENDPOINT_URL": s3_server.endpoint, "GYMFLOW_FAULT_DIR": str(faults),
           "GYMFLOW_FAULTS": "simulate.rollout_end:iteration=2,worker=0,action=stall"}  # the kill lands there
    command = [sys.executable, "-m", "flows.tooling.cli", "train", "--preset", "tiny", "--iterations", "4",
               "--num-ranks", "1", "--run-name", "drill", "--store", "s3://leftovers/runs"]
    run = "leftovers/runs/drill"
    log = tmp_path / "killed.log"  # a file, not a pipe: nobody reads the command's output while it runs
    with open(log, "w") as output:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True, stdout=output,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not (any(faults.iterdir()) and fs.exists(f"{run}/checkpoints/versions/00000001.commit")
                   and fs.exists(f"{run}/tensorboard")):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the run never committed version 1 and stalled in iteration 3"
            fs.invalidate_cache()
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the command, its Prefect API and its Ray: a machine that died
        proc.wait()
        kill_local_ray_of(proc.pid)  # Ray workers (the stalled one among them) can outlive the group
    left = leftovers(temp)
    assert left and all(p.startswith(f"gymflow-command-{proc.pid}-") for p in left), left
    assert not [p for p in left if "gymflow-tb-" in p]
    assert _tensorboard_steps(fs, f"{run}/tensorboard", tmp_path / "killed") == [1]  # stored before the kill
    done = subprocess.run(command, cwd=ROOT, env=env, start_new_session=True, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert leftovers(temp) == []
    fs.invalidate_cache()
    assert _tensorboard_steps(fs, f"{run}/tensorboard", tmp_path / "finished") == [1, 2, 3, 4]


def _tensorboard_steps(fs, folder: str, local: Path) -> list[int]:
    """The steps TensorBoard reads from the run's event files (a copy in `local`)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    local.mkdir()
    for path in fs.find(folder):
        fs.get_file(path, str(local / path.rsplit("/", 1)[1]))
    events = EventAccumulator(str(local))
    events.Reload()
    return sorted({e.step for e in events.Scalars("train/env_steps_total")})


SERVE_AND_CLOSE = """
import sys
from rl_core.generation import GenerationRequest, SamplingParams
from rl_core.generation.vllm_generator import VLLMGenerator
from rl_core.policies.llama import LlamaLM
from rl_core.policies.llama_spec import LlamaSpec

model = LlamaLM(LlamaSpec(vocab_size=30, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=2, max_position_embeddings=128), seed=0)
request = GenerationRequest((3, 4, 5), SamplingParams(temperature=1.0, top_p=1.0, max_tokens=4), (0, 0))
closed = VLLMGenerator.from_model(model)
closed.update_weights({k: v.numpy() for k, v in model.hf_state_dict().items()}, 1)
assert len(closed.generate([request], 1)) == 1
closed.close()
left_open = VLLMGenerator.from_model(model)  # never closed: removed at exit
assert len(left_open.generate([request], 0)) == 1
"""


@pytest.mark.slow
def test_a_vllm_generator_leaves_nothing_closed_or_not(temp: Path, env: dict[str, str]) -> None:
    """Its model, weights, vLLM's FileStore file and IPC sockets (`make vllm-cpu` runs this; skipped without vLLM)."""
    from rl_core.generation.vllm_generator import vllm_available

    reason = vllm_available()
    if reason:
        pytest.skip(reason)
    done = subprocess.run([sys.executable, "-c", SERVE_AND_CLOSE], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert leftovers(temp) == []
