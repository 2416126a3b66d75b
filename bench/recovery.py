"""Recovery from every fault kind we promise to survive: detected?, recovered?, work lost, time to resumed progress,
data lost, each measured on a real run of the `gymflow` command (Prefect, Ray actors, gloo ranks, a local store).

Each kind runs a control run (`train`; the generator's kind an agent run, `train-agent`) with the fault injected
at iteration K through GYMFLOW_FAULTS (rl_core/runtime/faults.py), or done to it from outside (SIGKILL of the whole
process group, a corrupt chunk of the newest version), followed where the fault ends the command by a rerun of the
same command, as a user would. Per kind:

- detected: Prefect retried the failed task run, the update was rolled back, the corrupt version was set aside, or,
  after SIGKILL, the rerun continued from the committed versions;
- recovered: the run completes with every version 0..N committed and verifying, and, where the fault does not
  change the math, the final policy is bit-identical to an uninterrupted run's (`bit_identical`);
- lost work: what the fault threw away, in seconds and env steps (tokens for the agent): the time between the
  newest durable artifact (a committed version, a step's output, an epoch checkpoint) and the fault, the iteration's
  experience when a simulate had to run again (the rollout chunks not yet written, for the agent: an upper bound),
  the whole version for a corrupt one (one interval by definition), the whole iteration for a non-finite update
  (its experience is not learned from); `lost_work_over_interval` divides the seconds by the checkpoint interval (the median time between
  two commits of the uninterrupted run);
- fault_to_progress_s: from the fault to the next committed version (a rerun's start-up included);
- data_lost: a version committed before the fault is gone or no longer verifies (the corrupted version itself is
  the fault's damage, and must come back), or a policy that should be bit-identical is not.

    python bench/recovery.py [--iterations 6] [--fault-iteration 3] [--only kind,kind] [--work-dir DIR]

Last line: one JSON object with `faults` (per kind: detected, recovered, bit_identical, lost_s, lost_env_steps or
lost_tokens, lost_work_over_interval, fault_to_progress_s, data_lost) and `all_recovered`.
Storage outages, a full disk and racing runs are drilled at the store and flow level by tests
(docs/guides/resume-and-faults.md), not here: they lose no work by design (the commit fails before anything is
visible, and the step retries).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from rl_core.checkpoint import CheckpointStore
from rl_core.private_temp import use_private_temp_dir
from rl_core.reporting.metric_sinks import read_metrics
from rl_core.runtime.local_ray import kill_local_ray_of


@dataclass
class Kind:
    """A fault kind: how to inject it and how its detection shows."""

    name: str
    flow: str  # "train" or "train-agent"
    spec: str | None  # GYMFLOW_FAULTS ({k}: the fault's iteration or version), None: done from outside
    detection: str  # "retried": Prefect retried a task run; "rolled_back", "set_aside", "continued": see detected()
    same_math: bool = True  # the final policy must be bit-identical to the uninterrupted run's
    extra: list[str] = field(default_factory=list)


KINDS = [
    Kind("train_exception", "train", "train.epoch_end:iteration={k},rank=0,epoch=1", "retried"),
    Kind("trainer_rank_killed", "train", "train.epoch_end:iteration={k},rank=1,epoch=1,action=kill", "retried"),
    Kind("env_worker_killed", "train", "simulate.rollout_end:iteration={k},worker=0,action=kill", "retried"),
    Kind("simulate_exception", "train", "simulate.rollout_end:iteration={k},worker=1", "retried"),
    Kind("process_group_sigkill", "train", "train.epoch_end:iteration={k},rank=0,epoch=1,action=stall", "continued"),
    Kind("corrupt_newest_version", "train", None, "set_aside"),
    Kind("nonfinite_update", "train", "train.batch:iteration={k},action=poison", "rolled_back", same_math=False,
         extra=["--nonfinite-limit", "2"]),
    Kind("generator_killed", "train-agent", "generator.generate:version={k},call=2,action=kill", "retried"),
]


def detected(kind: Kind, run_dir: Path, prefect_home: Path, iteration: int, fault_at: float) -> bool:
    """Whether the system noticed the fault: Prefect retried a task run (its database, which the command's own
    Prefect server kept under `prefect_home`); the update was rolled back (the iteration's metrics say so); the
    corrupt version was set aside; a rerun after SIGKILL continued from the committed versions (none redone)."""
    if kind.detection == "retried":
        with sqlite3.connect(prefect_home / "prefect.db") as db:
            return db.execute("SELECT count(*) FROM task_run WHERE run_count > 1").fetchone()[0] > 0
    if kind.detection == "rolled_back":
        records = {int(r["iteration"]): r for r in read_metrics(f"file://{run_dir}")}
        return records.get(iteration + 1, {}).get("rolled_back") == 1
    if kind.detection == "set_aside":
        return any((run_dir / "checkpoints" / "set-aside").glob("*.commit"))
    times = commit_times(run_dir)
    return sum(t < fault_at for t in times) > iteration  # every version before the kill still committed as it was


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.store = self.work / "runs"
        self.env = {**os.environ, "PREFECT_HOME": str(self.work / "prefect"),
                    "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(self.work / "prefect" / "results")}
        self.env.pop("GYMFLOW_FAULTS", None)
        self.references: dict[str, dict] = {}

    def command(self, flow: str, name: str, iterations: int, extra: list[str] = ()) -> list[str]:
        preset = ["--preset", "quick"] if flow == "train" else ["--preset", "tiny"]
        return [sys.executable, "-m", "flows.tooling.cli", flow, *preset, "--iterations", str(iterations), "--seed",
                str(self.args.seed), "--run-name", name, "--store", f"file://{self.store}", *extra]

    def run(self, cmd: list[str], env: dict | None = None, log: Path | None = None) -> tuple[int, str]:
        """Run to its end; (exit status, its output)."""
        done = subprocess.run(cmd, env=env or self.env, capture_output=True, text=True, start_new_session=True)
        out = done.stdout + done.stderr
        if log:
            log.write_text(out)
        return done.returncode, out

    def reference(self, flow: str) -> dict:
        """The uninterrupted run of `flow`: its summary, commit times and checkpoint interval."""
        if flow not in self.references:
            name = f"reference-{flow}"
            started = time.monotonic()
            status, out = self.run(self.command(flow, name, self.iterations(flow)), log=self.work / f"{name}.log")
            if status != 0:
                raise SystemExit(f"the uninterrupted {flow} run failed:\n{out[-3000:]}")
            commits = commit_times(self.store / name)
            self.references[flow] = {
                "summary": last_json(out), "interval_s": statistics.median(b - a for a, b in pairwise(commits[1:])),
                "per_iteration": per_iteration_work(self.store / name), "wall_s": time.monotonic() - started}
            ref = self.references[flow]
            print(f"reference {flow}: {self.iterations(flow)} iterations in {ref['wall_s']:.1f} s, checkpoint "
                  f"interval {ref['interval_s']:.2f} s", flush=True)
        return self.references[flow]

    def iterations(self, flow: str) -> int:
        return self.args.iterations if flow == "train" else self.args.agent_iterations

    def fault_iteration(self, flow: str) -> int:
        return self.args.fault_iteration if flow == "train" else 1

    def measure(self, kind: Kind) -> dict:
        ref = self.reference(kind.flow)
        name, k = kind.name, self.fault_iteration(kind.flow)
        run_dir, faults = self.store / name, self.work / f"faults-{name}"
        faults.mkdir()
        iterations = self.iterations(kind.flow)
        cmd = self.command(kind.flow, name, iterations, kind.extra)
        prefect_home = self.work / f"prefect-{name}"
        env = {**self.env, "GYMFLOW_FAULT_DIR": str(faults), "PREFECT_HOME": str(prefect_home),
               "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(prefect_home / "results")}
        rerun_env = {k: v for k, v in env.items() if k != "GYMFLOW_FAULTS"}
        if kind.spec:
            env["GYMFLOW_FAULTS"] = kind.spec.format(k=k)
        before: dict[int, str] = {}
        lost_versions = None  # None: lost work measured in seconds since the newest durable artifact
        if kind.name == "corrupt_newest_version":
            # The whole run, then its newest version damaged and the same command again (as after a power loss
            # or a bad disk): that version is set aside and trained again. Its work is what is lost: one version,
            # i.e. one checkpoint interval by definition (its measured seconds are reported as lost_s).
            status, out = self.run(cmd, env, self.work / f"{name}-0.log")
            before = committed_hashes(run_dir)
            before.pop(max(before))  # the version the fault damages: set aside, then committed again
            fault_at, lost_s = time.time(), intervals_of(run_dir)[-1]
            corrupt_newest_chunk(run_dir)
            lost_steps, lost_versions = ref["per_iteration"], 1
            status, out2 = self.run(cmd, env, self.work / f"{name}.log")
            out += out2
        elif kind.name == "process_group_sigkill":
            proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            marker = wait_for_marker(faults, proc)
            before = committed_hashes(run_dir)
            lost_s, lost_steps = durable_loss(run_dir, marker, k, ref["per_iteration"])
            fault_at = time.time()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kill_local_ray_of(proc.pid)
            status, out = self.run(cmd, rerun_env, self.work / f"{name}.log")
        else:
            log = self.work / f"{name}.log"
            with open(log, "w") as sink:
                proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=sink, stderr=subprocess.STDOUT,
                                        text=True)
                marker = wait_for_marker(faults, proc)
                fault_at = marker.stat().st_mtime
                before = committed_hashes(run_dir, older_than=fault_at)
                lost_s, lost_steps = durable_loss(run_dir, marker, k, ref["per_iteration"])
                status = proc.wait()
            out = log.read_text()
            if status != 0:  # the retries ran out: rerun the same command, as a user would
                status, out2 = self.run(cmd, rerun_env, self.work / f"{name}-rerun.log")
                out += out2
            if kind.name == "nonfinite_update":  # the whole iteration: its experience, scores and discarded update
                record = {int(r["iteration"]): r for r in read_metrics(f"file://{run_dir}")}[k + 1]
                lost_s, lost_steps = record["iteration_s"], ref["per_iteration"]
        noticed = detected(kind, run_dir, prefect_home, k, fault_at)
        return self.verdict(kind, ref, run_dir, status, noticed, before, fault_at, lost_s, lost_steps, lost_versions,
                            summary=last_json(out) if status == 0 else {})

    def verdict(self, kind: Kind, ref: dict, run_dir: Path, status: int, noticed: bool, before: dict[int, str],
                fault_at: float, lost_s: float, lost_steps: int, lost_versions: int | None, summary: dict) -> dict:
        iterations = self.iterations(kind.flow)
        store = CheckpointStore(f"file://{run_dir}/checkpoints")
        versions = store.versions() if status == 0 else []
        errors = store.verify()["errors"] if versions else {"all": "no run"}
        after = committed_hashes(run_dir)
        bit_identical = summary.get("policy_sha256") == ref["summary"]["policy_sha256"]
        kept = all(after.get(v) == h for v, h in before.items())
        recovered = status == 0 and versions == list(range(iterations + 1)) and not errors
        progress = [t for t in commit_times(run_dir) if t > fault_at]
        unit = "lost_tokens" if kind.flow == "train-agent" else "lost_env_steps"
        return {
            "detected": noticed,
            "recovered": recovered and (bit_identical or not kind.same_math),
            "bit_identical": bit_identical,
            "lost_s": round(lost_s, 3),
            unit: lost_steps,
            "lost_work_over_interval": lost_versions or round(lost_s / ref["interval_s"], 3),
            "fault_to_progress_s": round(progress[0] - fault_at, 2) if progress else None,
            "data_lost": not kept or (kind.same_math and not bit_identical),
        }


def last_json(out: str) -> dict:
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}


def commit_times(run_dir: Path) -> list[float]:
    return sorted(p.stat().st_mtime for p in (run_dir / "checkpoints" / "versions").glob("*.commit"))


def intervals_of(run_dir: Path) -> list[float]:
    times = commit_times(run_dir)
    return [b - a for a, b in pairwise(times)]


def committed_hashes(run_dir: Path, older_than: float | None = None) -> dict[int, str]:
    """Each committed version's manifest bytes, by version (those committed before `older_than`)."""
    versions = run_dir / "checkpoints" / "versions"
    return {int(p.stem): (versions / f"{p.stem}.json").read_text() for p in versions.glob("*.commit")
            if older_than is None or p.stat().st_mtime < older_than}


def per_iteration_work(run_dir: Path) -> int:
    """Env steps (control) or generated tokens (agent) of one iteration of a finished run."""
    record = read_metrics(f"file://{run_dir}")[-1]
    return int(record.get("env_steps") or record.get("tokens") or 0)


def wait_for_marker(faults: Path, proc: subprocess.Popen, timeout_s: float = 600) -> Path:
    """The fault's marker file (rl_core/runtime/faults.py writes it as the fault fires)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = list(faults.iterdir())
        if found:
            return found[0]
        if proc.poll() is not None:
            raise SystemExit(f"the run ended (status {proc.returncode}) before its fault fired")
        time.sleep(0.01)
    raise SystemExit("the fault did not fire")


def durable_loss(run_dir: Path, marker: Path, iteration: int, per_iteration: int) -> tuple[float, int]:
    """At the fault: seconds since the newest durable artifact, and the env steps / tokens that must be produced
    again: a control iteration's whole experience unless every worker's shard was written (simulate reruns in full),
    an agent iteration's rollout chunks not yet written (a retried rollout keeps the written ones)."""
    fault_at = marker.stat().st_mtime
    config = json.loads((run_dir / "run.json").read_text())["config"]
    durable = [p.stat().st_mtime for p in kept_outputs(run_dir, config.get("env", {}).get("num_workers", 1))]
    newest = max((t for t in durable if t <= fault_at), default=fault_at)
    if "rollout_groups_per_write" in config:  # an agent run
        chunks = -(-config["algorithm"]["prompts_per_iteration"] // config["rollout_groups_per_write"])
        written = len(list((run_dir / "trajectories" / f"{iteration:06d}").glob("chunk-*.safetensors")))
        return fault_at - newest, per_iteration * (chunks - min(written, chunks)) // chunks
    shards = list((run_dir / "steps" / f"{iteration:06d}").glob("experience-*.safetensors"))
    return fault_at - newest, 0 if len(shards) >= config["env"]["num_workers"] else per_iteration


def kept_outputs(run_dir: Path, workers: int) -> list[Path]:
    """What a rerun reuses: commit markers, the outputs of completed steps (an iteration's experience only when every
    worker's shard is there: a simulate that did not finish runs again in full), epoch checkpoints, and the rollout
    chunks already written (a retried rollout keeps them)."""
    kept = list((run_dir / "checkpoints" / "versions").glob("*.commit"))
    for iteration in (run_dir / "steps").glob("[0-9]*") if (run_dir / "steps").exists() else ():
        shards = list(iteration.glob("experience-*.safetensors"))
        kept += shards if len(shards) >= workers else []
        kept += [p for p in iteration.glob("*.safetensors") if not p.name.startswith("experience-")]
        kept += list(iteration.glob("train-progress/versions/*.commit"))
    if (run_dir / "trajectories").exists():
        kept += list((run_dir / "trajectories").rglob("chunk-*.safetensors"))
    return kept


def corrupt_newest_chunk(run_dir: Path) -> None:
    """Flip a byte in a chunk object only the newest version references."""
    store = CheckpointStore(f"file://{run_dir}/checkpoints")
    newest, *older = reversed(store.versions())
    shared = {c["chunk"] for v in older for t in store.manifest(v)["tensors"].values() for c in t["chunks"]}
    own = [c["chunk"] for t in store.manifest(newest)["tensors"].values() for c in t["chunks"]
           if c["chunk"] not in shared]
    path = run_dir / "checkpoints" / "chunks" / own[0][:2] / own[0]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=6, help="control runs (preset quick)")
    parser.add_argument("--agent-iterations", type=int, default=3, help="agent runs (preset tiny)")
    parser.add_argument("--fault-iteration", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated kinds (default: all)")
    parser.add_argument("--work-dir", type=Path, help="keep the runs and their logs here (default: a temp folder "
                        "removed at exit)")
    args = parser.parse_args()
    chosen = [k for k in KINDS if not args.only or k.name in args.only.split(",")]
    temp = use_private_temp_dir("gymflow-bench-recovery-")  # removed at exit, after a failure or SIGTERM too
    if args.work_dir:
        args.work_dir.mkdir(parents=True, exist_ok=True)
    bench = Bench(args, args.work_dir or temp)
    results = {}
    for kind in chosen:
        started = time.monotonic()
        results[kind.name] = bench.measure(kind)
        r = results[kind.name]
        print(f"{kind.name}: detected {r['detected']}, recovered {r['recovered']}, bit-identical "
              f"{r['bit_identical']}, lost {r['lost_s']:.2f} s = {r['lost_work_over_interval']:.2f} intervals, "
              f"fault to progress {r['fault_to_progress_s']} s, data lost {r['data_lost']} "
              f"({time.monotonic() - started:.0f} s)", flush=True)
    print(json.dumps({
        "faults": results,
        "all_recovered": all(r["recovered"] for r in results.values()),
        "all_detected": all(r["detected"] for r in results.values()),
        "any_data_lost": any(r["data_lost"] for r in results.values()),
        "max_lost_work_over_interval": max(r["lost_work_over_interval"] for r in results.values()),
        "checkpoint_interval_s": {f: round(r["interval_s"], 3) for f, r in bench.references.items()},
        "work_dir": str(args.work_dir) if args.work_dir else None,
    }))


if __name__ == "__main__":
    main()
