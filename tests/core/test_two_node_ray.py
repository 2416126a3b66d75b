"""simulate on a two-node Ray cluster started on this machine, joined through RAY_ADDRESS with no code change.

The cluster (a head and a second node with its own `second_node` resource, one CPU each) lives in a host
subprocess, and a driver subprocess runs the env pool with one worker per CPU, so the two workers must land on
different nodes. Everything stays on 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0).

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


def test_simulate_runs_on_two_nodes(tmp_path) -> None:
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
        done = subprocess.run([sys.executable, "-c", DRIVER, f"file://{tmp_path}/runs"],
                              env={**env, "RAY_ADDRESS": address}, capture_output=True, text=True, timeout=300,
                              cwd=Path(__file__).parents[2])
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["env_steps"] == 2 * 4 * 16
        assert len(set(result["nodes"])) == 2, f"both workers ran on one node: {result['nodes']}"
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
