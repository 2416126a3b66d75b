"""The env service bench: what serving costs over stepping the same envs in process.

A server is started as `gymflow serve-envs --task HalfCheetah-v5 --port 0` in a subprocess (its env hosts on a local
Ray, `--workers` of them, default one per core) and driven from this process over loopback:

- latency: p50/p99 of one 64-env batch step, `--latency-steps` steps after 20 warm-up, through the WebSocket with
  gymflow's binary frames (`BatchClient`; the `serve_p99_ms_64` target is < 8 ms) and with OpenEnv's own client
  (`GenericEnvClient`, JSON); beside them the same step in process (`make_batch`, one thread);
- throughput: env steps/s of one session of N envs (`--sizes`, default 64, 1,024, 16,384) stepping random actions
  for `--seconds` (at least 3 steps), over binary frames, and of `make_batch(N)` stepped in this process with the
  same actions, on one thread or one per core, the faster: `serve_over_inprocess_<N>` is their ratio (target >= 0.8
  at 1,024). A session over `shard_envs` (512) envs is split over the hosts. At 1,024 the
  same through OpenEnv's JSON client too (`serve_json_over_inprocess_1024`);
- sessions: sessions opened (connect, a 1-env reset) and closed per second, one after another, for `--seconds`;
- `serve_100k_s`: from zero (no server, no Ray) to `--big-envs` (100,000) served envs stepping: a fresh server
  started, `--big-sessions` sessions opened at once holding the envs between them, and one step of each; skipped
  when the envs would not fit in available memory (~180 KiB per HalfCheetah env, as bench/scale.py measures).

Each figure is of this machine under whatever else runs on it: the load average is printed and in the JSON.

    python bench/serve.py [--sizes 64,1024,16384] [--seconds 3] [--workers 2] [--big-envs 100000]

Last line: one JSON object.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# Run as a script, this file's folder comes first on sys.path; the repository root goes there instead (see
# bench/simulate.py).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from openenv.core import GenericEnvClient  # noqa: E402

from rl_core.envs import make_batch  # noqa: E402
from rl_core.private_temp import use_private_temp_dir  # noqa: E402
from rl_core.runtime.serving import BatchClient  # noqa: E402

TASK = "HalfCheetah-v5"
ENV_MEMORY_GB = 180 / 2**20  # GiB per HalfCheetah env (bench/scale.py's measurement)
START_TIMEOUT_S = 300


class Server:
    """`gymflow serve-envs` in a subprocess, stopped with SIGTERM."""

    def __init__(self, workers: int | None) -> None:
        command = [sys.executable, "-m", "flows.tooling.cli", "serve-envs", "--task", TASK, "--port", "0"]
        command += ["--workers", str(workers)] if workers else []
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1])
        line = self.process.stdout.readline()  # type: ignore[union-attr]  # printed once the server is up
        found = re.search(r"at (http://gymflow:(\S+)@(127\.0\.0\.1:\d+)) ", line)
        if found is None:
            self.stop()
            raise RuntimeError(f"gymflow serve-envs did not start: {line!r}")
        self.client_url, self.token = found.group(1), found.group(2)
        self.base_url = f"http://{found.group(3)}"

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)


def available_gb() -> float:
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    return int(fields["MemAvailable"].split()[0]) / 2**20


def percentiles_ms(seconds: list[float]) -> tuple[float, float]:
    ms = np.array(seconds) * 1e3
    return round(float(np.percentile(ms, 50)), 3), round(float(np.percentile(ms, 99)), 3)


def random_actions(n: int, steps: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (steps, n, 6))


def inprocess_latency(n: int, steps: int) -> tuple[float, float]:
    env = make_batch(TASK, n, seed=0)
    times = []
    for action in random_actions(n, steps + 20):
        start = time.perf_counter()
        env.step(action)
        times.append(time.perf_counter() - start)
    return percentiles_ms(times[20:])


async def served_latency(server: Server, n: int, steps: int) -> tuple[float, float]:
    async with BatchClient(server.base_url, server.token) as env:
        await env.reset(num_envs=n, seed=0)
        times = []
        for action in random_actions(n, steps + 20):
            start = time.perf_counter()
            await env.step(action)
            times.append(time.perf_counter() - start)
    return percentiles_ms(times[20:])


async def openenv_latency(server: Server, n: int, steps: int) -> tuple[float, float]:
    async with GenericEnvClient(base_url=server.client_url) as env:
        await env.reset(num_envs=n, seed=0)
        times = []
        for action in random_actions(n, steps + 20):
            start = time.perf_counter()
            await env.step({"actions": action.tolist()})  # the list conversion is the client's, and timed
            times.append(time.perf_counter() - start)
    return percentiles_ms(times[20:])


def inprocess_rate(n: int, seconds: float) -> float:
    """Env steps/s of `make_batch(n)` in this process at its best: one stepping thread or one per core, the faster
    (the server steps on one host per core, so in process gets the cores too)."""
    rates = []
    for nthread in sorted({1, len(os.sched_getaffinity(0))}):
        env = make_batch(TASK, n, seed=0, nthread=nthread)
        actions = random_actions(n, 2)
        env.step(actions[0])
        steps, start = 0, time.perf_counter()
        while steps < 3 or time.perf_counter() - start < seconds:
            env.step(actions[steps % 2])
            steps += 1
        rates.append(n * steps / (time.perf_counter() - start))
        del env
    return max(rates)


async def served_rate(server: Server, n: int, seconds: float, json_client: bool = False) -> float:
    actions = random_actions(n, 2)
    if json_client:
        client = GenericEnvClient(base_url=server.client_url)
        payloads = [{"actions": a.tolist()} for a in actions]
    else:
        client = BatchClient(server.base_url, server.token)
        payloads = list(actions)
    async with client as env:
        await env.reset(num_envs=n, seed=0)
        await env.step(payloads[0])
        steps, start = 0, time.perf_counter()
        while steps < 3 or time.perf_counter() - start < seconds:
            await env.step(payloads[steps % 2])
            steps += 1
        return n * steps / (time.perf_counter() - start)


async def sessions_per_s(server: Server, seconds: float) -> float:
    opened, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        async with BatchClient(server.base_url, server.token) as env:
            await env.reset(num_envs=1)
        opened += 1
    return opened / (time.perf_counter() - start)


async def open_and_step(server: Server, sessions: int, per_session: int) -> None:
    async def one() -> None:
        async with BatchClient(server.base_url, server.token, open_timeout_s=START_TIMEOUT_S) as env:
            await env.reset(num_envs=per_session, seed=0)
            await env.step(np.zeros((per_session, 6)))

    await asyncio.gather(*(one() for _ in range(sessions)))


def big_start(workers: int | None, envs: int, sessions: int) -> dict[str, object]:
    """From zero to `envs` served envs stepping, in `sessions` sessions."""
    per_session = math.ceil(envs / sessions)
    need_gb = per_session * sessions * ENV_MEMORY_GB + 1.5
    label = f"{envs // 1000}k" if envs % 1000 == 0 else str(envs)
    if need_gb > 0.95 * available_gb():  # as bench/scale.py
        return {f"serve_{label}_s": f"skipped: {envs} envs need ~{need_gb:.1f} GB, {available_gb():.1f} GB available"}
    start = time.perf_counter()
    server = Server(workers)
    up_s = time.perf_counter() - start
    try:
        asyncio.run(open_and_step(server, sessions, per_session))
        total_s = time.perf_counter() - start
    finally:
        server.stop()
    return {f"serve_{label}_s": round(total_s, 2), f"serve_{label}_server_up_s": round(up_s, 2),
            f"serve_{label}_sessions": sessions}


def run(args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {"cores": len(os.sched_getaffinity(0)), "load_avg_1m_before": os.getloadavg()[0],
                              "serve_workers": args.workers or len(os.sched_getaffinity(0))}
    print(f"cores {out['cores']}, load average {os.getloadavg()[0]:.2f}; {TASK}; server workers "
          f"{out['serve_workers']}", flush=True)
    if args.big_envs:  # first, while this process holds no envs of its own: the from-zero start needs the memory
        big = big_start(args.workers, args.big_envs, args.big_sessions)
        out.update(big)
        print(big, flush=True)
    out["inprocess_p50_ms_64"], out["inprocess_p99_ms_64"] = inprocess_latency(64, args.latency_steps)
    server = Server(args.workers)
    try:
        out["serve_p50_ms_64"], out["serve_p99_ms_64"] = asyncio.run(served_latency(server, 64, args.latency_steps))
        out["serve_json_p50_ms_64"], out["serve_json_p99_ms_64"] = asyncio.run(
            openenv_latency(server, 64, args.latency_steps))
        print(f"64-env step, p50/p99 ms: in process {out['inprocess_p50_ms_64']}/{out['inprocess_p99_ms_64']}; "
              f"served, binary {out['serve_p50_ms_64']}/{out['serve_p99_ms_64']}; served, OpenEnv JSON "
              f"{out['serve_json_p50_ms_64']}/{out['serve_json_p99_ms_64']}", flush=True)
        for n in args.sizes:
            if 2 * n * ENV_MEMORY_GB > 0.9 * available_gb():
                out[f"serve_over_inprocess_{n}"] = "skipped: not enough memory"
                continue
            local, served = inprocess_rate(n, args.seconds), asyncio.run(served_rate(server, n, args.seconds))
            out[f"inprocess_steps_per_s_{n}"], out[f"serve_steps_per_s_{n}"] = round(local), round(served)
            out[f"serve_over_inprocess_{n}"] = round(served / local, 3)
            line = f"N {n:>6}: in process {local:9.0f} env steps/s; served (binary) {served:9.0f} = " \
                   f"{served / local:.2f}x"
            if n == 1024:
                served_json = asyncio.run(served_rate(server, n, args.seconds, json_client=True))
                out["serve_json_steps_per_s_1024"] = round(served_json)
                out["serve_json_over_inprocess_1024"] = round(served_json / local, 3)
                line += f"; served (OpenEnv JSON) {served_json:9.0f} = {served_json / local:.2f}x"
            print(line, flush=True)
        out["serve_sessions_per_s"] = round(asyncio.run(sessions_per_s(server, args.seconds)), 1)
        print(f"sessions opened and closed: {out['serve_sessions_per_s']}/s", flush=True)
    finally:
        server.stop()
    out["load_avg_1m_after"] = os.getloadavg()[0]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64,1024,16384", help="comma-separated envs per session")
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time of each rate")
    parser.add_argument("--latency-steps", type=int, default=500, help="timed 64-env steps")
    parser.add_argument("--workers", type=int, help="the server's env hosts (default: one per core)")
    parser.add_argument("--big-envs", type=int, default=100_000, help="envs of the from-zero start (0: skip it)")
    parser.add_argument("--big-sessions", type=int, default=16, help="sessions holding them")
    args = parser.parse_args()
    args.sizes = [int(n) for n in args.sizes.split(",")]
    use_private_temp_dir("gymflow-bench-serve-")  # removed at exit, after a failure or SIGTERM too
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
