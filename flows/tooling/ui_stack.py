"""A local Prefect UI for gymflow: a server, the `gymflow` work pool, prefect.yaml's deployments and a worker.

    python -m flows.tooling.ui_stack start [--port 4200] [--host 127.0.0.1]    # make ui; gymflow ui
    python -m flows.tooling.ui_stack stop                                       # make ui-stop; gymflow ui --stop
    python -m flows.tooling.ui_stack status

Everything lives in one folder, `.gymflow-ui/` at the repository root (or GYMFLOW_UI_HOME): Prefect's home with its
database (so runs stay in the UI across restarts), the logs, and `state.json`, which records the process group of the
server and of the worker that `start` made. `stop` signals exactly those groups (checked against each leader's start
time, so a reused pid is never signalled), and first the flow runs that worker started, then removes the state file.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PORT = 4200
DEFAULT_HOST = "127.0.0.1"
POOL = "gymflow"
SERVER_START_S = 180.0  # generous: the first start also creates the database
WORKER_START_S = 120.0
STOP_GRACE_S = 20.0


class UiStackError(RuntimeError):
    """The stack could not start: the message says what was found and what to do."""


def default_home() -> Path:
    return Path(os.environ.get("GYMFLOW_UI_HOME") or REPO / ".gymflow-ui")


def prefect_executable() -> str:
    beside = Path(sys.executable).parent / "prefect"  # the venv's CLI, whether or not the venv is activated
    return str(beside) if beside.exists() else shutil.which("prefect") or "prefect"


def prefect_env(home: Path, api_url: str) -> dict[str, str]:
    """The environment of the server, the prefect commands and the worker (and so of every flow run it starts)."""
    env = {**os.environ,
           "PREFECT_HOME": str(home / "prefect"),
           "PREFECT_API_URL": api_url,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_WORKER_QUERY_SECONDS": "5"}  # half Prefect's default: a run started in the UI begins sooner
    env.pop("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", None)  # a setting of the temporary API, not a server's
    return env


# --- the processes: started in their own group, found again by (pid, start time) ---

def _processes() -> dict[int, tuple[str, int, int, int, int]]:
    """Every live process on Linux: pid -> (state, parent pid, process group, session, start time in clock ticks)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _proc_stat(int(entry.name))) is not None:
            table[int(entry.name)] = stat
    return table


def _proc_stat(pid: int) -> tuple[str, int, int, int, int] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])


def _group_members(pgid: int, started: int | None) -> list[int]:
    """Live (non-zombie) processes of group `pgid` that started no earlier than its leader did."""
    if not Path("/proc/self/stat").exists():  # not Linux: the group as the kernel knows it
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    return [pid for pid, (state, _, group, _, start) in _processes().items()
            if group == pgid and state != "Z" and (started is None or start >= started)]


def _is_ours(proc: dict) -> bool:
    """The recorded process group still has its leader (same pid, same start time), or members it left behind."""
    stat = _proc_stat(proc["pid"])
    if stat is not None and stat[4] != proc.get("started"):
        return False  # the pid now belongs to another process
    return bool(_group_members(proc["pid"], proc.get("started")))


def _flow_runs_of(worker: dict) -> list[dict]:
    """The flow-run processes the worker started: its descendants that lead a session of their own (Prefect starts
    each flow run in a new session; the run's local Ray lives in that session)."""
    if not _is_ours(worker) or not Path("/proc/self/stat").exists():
        return []
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (_, parent, *_) in table.items():
        children.setdefault(parent, []).append(pid)
    runs, todo = [], list(children.get(worker["pid"], []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        state, _, _, session, start = table[pid]
        if session == pid and state != "Z":
            runs.append({"pid": pid, "started": start})
    return runs


def _spawn(args: list[str], env: dict[str, str], log: Path) -> dict:
    """Start `args` from the repository root in a new session (its own process group), output to `log`."""
    with open(log, "ab") as out:
        process = subprocess.Popen(args, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    stat = _proc_stat(process.pid)
    return {"pid": process.pid, "started": stat[4] if stat else None, "command": " ".join(args), "log": str(log)}


def _terminate(proc: dict, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to the leader alone, so it can end what it started in order (a flow run reports Crashed, then stops
    its Ray; signalled together, Ray dies first and the run aborts without a word to the server, left Running);
    then SIGTERM to the whole group (a Prefect worker's second SIGTERM is its SIGKILL); then SIGKILL."""
    pgid, started = proc["pid"], proc.get("started")
    steps = ((lambda sig: os.kill(pgid, sig), signal.SIGTERM, 0.75 * grace_s),
             (lambda sig: os.killpg(pgid, sig), signal.SIGTERM, 0.25 * grace_s),
             (lambda sig: os.killpg(pgid, sig), signal.SIGKILL, 5.0))
    for send, sig, wait_s in steps:
        if not _is_ours(proc):
            break
        try:
            send(sig)
        except ProcessLookupError:
            continue  # the leader is gone: on to its group's members
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_members(pgid, started):
            _reap(pgid)
            time.sleep(0.2)
    _reap(pgid)


def _reap(pid: int) -> None:
    """Collect the exit status when the leader is this process's child (start and stop in one process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


# --- the state file ---

def _state_path(home: Path) -> Path:
    return home / "state.json"


def read_state(home: Path | None = None) -> dict | None:
    path = _state_path(home or default_home())
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def _write_state(home: Path, state: dict) -> None:
    path = _state_path(home)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(path)


def running(home: Path | None = None) -> dict | None:
    """The state of a stack started from `home` whose processes still run; None when none does."""
    state = read_state(home)
    if state and any(_is_ours(p) for p in state["processes"].values()):
        return state
    return None


# --- start and stop ---

def _check_port(host: str, port: int) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            probe.bind((host, port))
            return
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise UiStackError(f"cannot listen on {host}:{port}: {err}") from err
    what = "something else"
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/api/health", timeout=2):
            what = "a Prefect server that this command did not start from this folder"
    except (OSError, ValueError):
        pass
    raise UiStackError(f"port {port} on {host} is in use by {what}: stop it, or choose another port "
                       f"(`make ui UI_PORT={port + 1}`, `gymflow ui --port {port + 1}`); `ss -tlnp 'sport = :{port}'` "
                       "shows which process holds it")


def _wait_for_health(api_url: str, server: dict, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=2):
                return
        except OSError:
            if not _is_ours(server):
                raise UiStackError(f"the Prefect server exited while starting; its log: {server['log']}\n"
                                   + _tail(server["log"])) from None
            if time.monotonic() > deadline:
                raise UiStackError(f"the Prefect server did not answer {api_url}/health within {timeout_s:.0f} s; "
                                   f"its log: {server['log']}") from None
            time.sleep(0.5)


def _wait_for_worker(api_url: str, name: str, worker: dict, timeout_s: float) -> None:
    """Until the worker has registered with the pool (its first heartbeat): then a run is picked up."""
    request = urllib.request.Request(f"{api_url}/work_pools/{POOL}/workers/filter", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                if any(w.get("name") == name for w in json.load(answer)):
                    return
        except (OSError, ValueError):
            pass
        if not _is_ours(worker):
            raise UiStackError(f"the worker exited while starting; its log: {worker['log']}\n"
                               + _tail(worker["log"]))
        if time.monotonic() > deadline:
            raise UiStackError(f"the worker did not register with pool {POOL!r} within {timeout_s:.0f} s; "
                               f"its log: {worker['log']}")
        time.sleep(0.5)


def _prefect(args: list[str], env: dict[str, str], log: Path, timeout_s: float = 600) -> int:
    """Run a `prefect` command to completion from the repository root, its output appended to `log`."""
    with open(log, "ab") as out:
        out.write(f"\n$ prefect {' '.join(args)}\n".encode())
        out.flush()
        return subprocess.run([prefect_executable(), *args], env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                              stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False).returncode


def _tail(log: str | Path, lines: int = 20) -> str:
    try:
        return "\n".join(Path(log).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def start(port: int = DEFAULT_PORT, host: str = DEFAULT_HOST, home: Path | str | None = None) -> int:
    """Start the server, pool, deployments and worker, print where to click; the exit status (0 started or already
    running, 1 failed to start or running in part, 2 the port is taken, 130 interrupted)."""
    home = Path(home) if home is not None else default_home()
    began = time.monotonic()
    if (state := running(home)) is not None:
        exited = [name for name, proc in state["processes"].items() if not _is_ours(proc)]
        if exited:
            print(f"The gymflow UI at {state['url']} runs only in part ({', '.join(exited)} exited; see "
                  f"{_shown(home / 'logs')}): `make ui-stop`, then `make ui` again.", file=sys.stderr)
            return 1
        pids = ", ".join(f"{name} pid {proc['pid']}" for name, proc in state["processes"].items())
        print(f"The gymflow UI is already running: {state['url']} ({pids}). To restart it: `make ui-stop` "
              "(or `gymflow ui --stop`), then `make ui`.")
        return 0
    _state_path(home).unlink(missing_ok=True)  # a stack that died on its own
    try:
        _check_port(host, port)
    except UiStackError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    url = f"http://{host}:{port}"
    api_url = f"{url}/api"
    env = prefect_env(home, api_url)
    prefect = prefect_executable()
    state = {"url": url, "api_url": api_url, "prefect_home": env["PREFECT_HOME"], "processes": {}}
    print(f"Starting the Prefect server on {url} (log: {_shown(logs / 'server.log')}) ...", flush=True)
    try:
        # Recorded as soon as each process exists, so `stop` finds it even if a later step fails.
        state["processes"]["server"] = _spawn([prefect, "server", "start", "--host", host, "--port", str(port)],
                                              env, logs / "server.log")
        _write_state(home, state)
        _wait_for_health(api_url, state["processes"]["server"], SERVER_START_S)
        deploy_log = logs / "deploy.log"
        if _prefect(["work-pool", "inspect", POOL], env, deploy_log) != 0:
            print(f"Creating the {POOL!r} process work pool ...", flush=True)
            if _prefect(["work-pool", "create", POOL, "--type", "process"], env, deploy_log) != 0:
                raise UiStackError(f"`prefect work-pool create {POOL}` failed; its output: {deploy_log}\n"
                                   + _tail(deploy_log))
        print("Deploying prefect.yaml (prefect --no-prompt deploy --all) ...", flush=True)
        if _prefect(["--no-prompt", "deploy", "--all"], env, deploy_log) != 0:
            raise UiStackError(f"`prefect deploy --all` failed; its output: {deploy_log}\n" + _tail(deploy_log))
        worker_name = f"gymflow-ui-{int(time.time())}"
        print(f"Starting worker {worker_name} on pool {POOL!r} (log: {_shown(logs / 'worker.log')}) ...", flush=True)
        state["processes"]["worker"] = _spawn([prefect, "worker", "start", "--pool", POOL, "--name", worker_name],
                                              env, logs / "worker.log")
        state["worker_name"] = worker_name
        _write_state(home, state)
        _wait_for_worker(api_url, worker_name, state["processes"]["worker"], WORKER_START_S)
    except (UiStackError, OSError, subprocess.TimeoutExpired) as err:
        print(f"error: {err}\nStopping what was started ...", file=sys.stderr)
        stop(home, quiet=True)
        return 1
    except KeyboardInterrupt:
        print("interrupted: stopping what was started ...", file=sys.stderr)
        stop(home, quiet=True)
        return 130
    state["ready_s"] = round(time.monotonic() - began, 1)
    _write_state(home, state)
    print(_where_to_click(state, logs))
    return 0


def stop(home: Path | str | None = None, quiet: bool = False) -> int:
    """Stop the flow runs of the recorded worker, then exactly the process groups `start` recorded (worker, then
    server), and remove the state file; exit status 0."""
    home = Path(home) if home is not None else default_home()
    state = read_state(home)
    if state is None:
        if not quiet:
            print(f"No gymflow UI to stop (no {_shown(_state_path(home))}).")
        return 0
    # Flow runs first, while the server is up to record them Crashed (a retry continues them); then the worker,
    # which would otherwise kill its runs without a word to the server, leaving them Running; the server last.
    worker = state["processes"].get("worker")
    for run in _flow_runs_of(worker) if worker else []:
        _terminate(run)
        if not quiet:
            print(f"flow run process {run['pid']} of the worker: stopped (it shows as Crashed; Retry continues it)")
    for name in ("worker", "server"):
        if (proc := state["processes"].get(name)) is not None:
            alive = _is_ours(proc)
            if alive:
                _terminate(proc)
            if not quiet:
                print(f"{name}: {'stopped' if alive else 'was not running'} (process group {proc['pid']})")
    _state_path(home).unlink(missing_ok=True)
    if not quiet:
        print(f"The gymflow UI at {state['url']} is stopped; its runs stay in {_shown(Path(state['prefect_home']))} "
              "for the next `make ui`.")
    return 0


def status(home: Path | str | None = None) -> int:
    """Print whether a stack runs; exit status 0 when it does, 1 when not."""
    home = Path(home) if home is not None else default_home()
    state = running(home)
    if state is None:
        print("The gymflow UI is not running (`make ui` starts it).")
        return 1
    for name, proc in state["processes"].items():
        print(f"{name}: pid {proc['pid']} {'running' if _is_ours(proc) else 'exited'}; log {_shown(proc['log'])}")
    print(f"UI: {state['url']}")
    return 0


def _shown(path: str | Path) -> str:
    """A path as the operator would type it from the repository root."""
    path = Path(path)
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def _where_to_click(state: dict, logs: Path) -> str:
    url = state["url"]
    prefect = _shown(prefect_executable())
    return f"""
The gymflow UI is ready ({state['ready_s']} s): {url}

  Deployments   {url}/deployments
                train-control/train or train-agent/agent-train: Run > Quick run, or Custom run to set
                preset, run_name, seed, ...
  Flow runs     {url}/runs
                open a run: its task graph; tab Artifacts: <run>-progress, <run>-metrics, <run>-summary (the
                learning curve), <run>-checkpoints
  Work pool     {url}/work-pools/work-pool/{POOL} (worker {state['worker_name']})

From a shell:
  export PREFECT_API_URL={state['api_url']}
  {prefect} deployment run 'train-control/train' --param preset=quick --param run_name=my-run
  {prefect} deployment run 'train-agent/agent-train' --param preset=quick --param run_name=my-agent

Runs write under ./runs. The nightly and agent-nightly deployments run on their schedules (02:00 and 02:30 UTC)
while this worker runs: pause them on the Deployments page if you do not want them here.
Logs: {_shown(logs / 'server.log')}, {_shown(logs / 'worker.log')} (flow runs log there too), \
{_shown(logs / 'deploy.log')}
Prefect's database: {_shown(Path(state['prefect_home']))} (runs stay across restarts)
Stop: make ui-stop (or gymflow ui --stop)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.tooling.ui_stack", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start_parser = sub.add_parser("start", help="start the server, pool, deployments and worker")
    start_parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"(default: {DEFAULT_PORT})")
    start_parser.add_argument("--host", default=DEFAULT_HOST, help=f"(default: {DEFAULT_HOST})")
    sub.add_parser("stop", help="stop exactly what start started")
    sub.add_parser("status", help="is it running, and where are its logs")
    args = parser.parse_args(argv)
    if args.command == "start":
        return start(port=args.port, host=args.host)
    return stop() if args.command == "stop" else status()


if __name__ == "__main__":
    sys.exit(main())
