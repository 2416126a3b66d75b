"""simulate, and a served session, on a two-node Ray cluster started on this machine, joined through RAY_ADDRESS with
no code change.

The cluster (a head and a second node with its own `second_node` resource, one CPU each) lives in a host
subprocess, and a driver subprocess runs the env pool (or the env service's host pool) with one worker per CPU, so
the two workers must land on different nodes. Everything stays on 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0).

Why not two `ray start` commands: with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, Ray 2.60's `ray start --address`
refuses to start a second node ("Multi-node Ray clusters are not supported on Windows and OSX"), and without
it the second node resolves 127.0.0.1 to the machine's network address and cannot reach a loopback head. Ray's
own multi-node test helper, `ray.cluster_utils.Cluster`, starts the same raylet and GCS processes on loopback.

Only what this test started is stopped: closing the host's stdin shuts its cluster down; then anything left
in the host's process group or the cluster's session is killed by pid.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_core.runtime.local_ray import kill_local_ray_of

pytestmark = pytest.mark.slow

HOST = """
import sys
from ray.cluster_utils import Cluster

cluster = Cluster(initialize_head=True, shutdown_at_exit=True,
                  head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False})
cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={"second_node": 1})
print(cluster.address, flush=True)
sys.stdin.read()  # until the test closes stdin
cluster.shutdown()
"""
DRIVER = """
import json, sys
from rl_core.algos.base import build_learner
from rl_core.config.presets import build_control_config
from rl_core.runtime.control.env_pool import EnvWorkerPool
from rl_core.runtime.commits import commit_initial

cfg = build_control_config("tiny", run_name="two-node", store=sys.argv[1], num_ranks=1)
commit_initial(cfg, build_learner(cfg).state())
pool = EnvWorkerPool(cfg)
parts = pool.simulate(0, 0)
print(json.dumps({"nodes": pool.nodes(), "env_steps": sum(p["env_steps"] for p in parts)}))
pool.shutdown()
"""


SERVE_DRIVER = """
import asyncio, json
import numpy as np, ray
from rl_core.envs import make_batch
from rl_core.runtime.serving.host_pool import EnvHostPool

pool = EnvHostPool(2)
pool.start()
shards = pool.place("spanning", 64, 32)
actions = np.random.default_rng(0).uniform(-1, 1, (50, 64, 6))

async def session():
    await asyncio.gather(*(pool.call(s, "open", "HalfCheetah-v5", "mujoco", s.count, 3, s.offset) for s in shards))
    observed = []
    for step in actions:
        parts = await asyncio.gather(*(pool.call(s, "step", step[s.offset:s.offset + s.count]) for s in shards))
        observed.append(np.concatenate([p["obs"] for p in parts]))
    return observed, [s.key in pool._lanes for s in shards], [shard.host for shard in shards]

observed, lanes, hosts = asyncio.run(session())
local = make_batch("HalfCheetah-v5", 64, 3)
same = all(np.array_equal(local.step(step).obs, obs) for step, obs in zip(actions, observed))
nodes = [ray.get(pool._hosts[h].lane.remote())["node"] for h in hosts]
print(json.dumps({"same": same, "lanes": lanes, "nodes": nodes, "driver": ray.get_runtime_context().get_node_id()}))
pool.shutdown()
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    """The environment of a driver of the two-node cluster (RAY_ADDRESS and the cluster's token)."""
    # Ray 2.60 turns token authentication on for clusters it starts: every process of this one shares a fresh
    # token through the environment, never the user's ~/.ray/auth_token.
    # Its own short temp dir (Ray's unix socket paths must stay under ~107 characters) keeps its session files
    # and address file out of /tmp/ray, where a plain ray.init() elsewhere on the machine would look.
    ray_tmp = tempfile.mkdtemp(prefix="gf-ray-", dir="/tmp")
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    host = subprocess.Popen([sys.executable, "-c", HOST], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        address = host.stdout.readline().strip()
        assert address.startswith("127.0.0.1:"), f"the cluster host did not start (exit code {host.poll()})"
        yield {**env, "RAY_ADDRESS": address}
    finally:
        host.stdin.close()
        try:
            host.wait(timeout=60)
        except subprocess.TimeoutExpired:
            host.kill()
        try:
            os.killpg(host.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        kill_local_ray_of(host.pid)  # the cluster's session is named after the host's pid
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _drive(cluster: dict[str, str], driver: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", driver, *args], env=cluster, capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_simulate_runs_on_two_nodes(cluster: dict[str, str], tmp_path) -> None:
    result = _drive(cluster, DRIVER, f"file://{tmp_path}/runs")
    assert result["env_steps"] == 2 * 4 * 16
    assert len(set(result["nodes"])) == 2, f"both workers ran on one node: {result['nodes']}"


def test_a_served_session_spans_two_nodes_stepping_the_other_nodes_envs_by_ray(cluster: dict[str, str]) -> None:
    """64 envs over a host on each node: the driver's node's shard is stepped through its host's step lane, the other
    node's by Ray calls (the lane is a local socket), and the session's observations are in-process `make_batch`'s."""
    result = _drive(cluster, SERVE_DRIVER)
    assert len(set(result["nodes"])) == 2, f"both hosts ran on one node: {result['nodes']}"
    assert result["lanes"] == [node == result["driver"] for node in result["nodes"]]
    assert result["same"]
