"""Start or join Ray, keeping a machine-local Ray on 127.0.0.1.

A local Ray otherwise advertises the machine's network address and listens on every interface. With
`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (despite its name it applies on Linux) it uses 127.0.0.1 for everything.
`ensure_ray` applies that and the other local defaults (`LOCAL_RAY_DEFAULTS`) right before it starts a local Ray,
and only then: importing this package changes nothing, and a cluster named in `RAY_ADDRESS` is joined as it is.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from concurrent.futures import Future

import ray

from rl_core.config.agent import AgentRunConfig, AnyRunConfig
from rl_core.envs.agent import uses_simulator
from rl_core.runtime.faults import gymflow_env_vars

LOCAL_RAY_DEFAULTS = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # loopback only (see the module docstring)
    "RAY_USAGE_STATS_ENABLED": "0",
    # Ray starts workers at nice 15; here the workers *are* the job, and niced they lose the cores to the driver
    # and the Prefect API whenever the machine is busy.
    "RAY_worker_niceness": "0",
}
"""Environment a local Ray starts with (each a default: what the operator exported wins)."""

_inherited_env: dict[str, str] | None = None
"""GYMFLOW_* settings the workers of the local Ray this process started inherit (None: not a Ray of ours)."""

_init_lock = threading.Lock()  # one `ray.init` at a time: a caller that finds one under way waits for it
_background: threading.Thread | None = None  # `start_ray_in_background`'s thread (it lives as long as the process)
_background_start: Future[None] = Future()  # its `ensure_ray`'s outcome, raised again to the caller that waits
_background_waited = False  # whether a caller has waited for it (and taken its error)


def actor_cpus(cfg: AnyRunConfig) -> int:
    """Logical CPUs a run's Ray actors ask for. Control: one per env worker and per trainer rank. Agent: the
    generator, one per trainer rank and, for an env whose reward is a simulation, one per simulation worker."""
    if isinstance(cfg, AgentRunConfig):
        return 1 + cfg.num_ranks + (cfg.env.num_workers if uses_simulator(cfg.env.name) else 0)
    return cfg.env.num_workers + cfg.num_ranks


def ensure_ray(num_cpus: int | None = None) -> None:
    """Join `RAY_ADDRESS` if set, else start a local Ray with at least `num_cpus` logical CPUs; when
    `start_ray_in_background` began that already, wait for it (raising what it raised).

    Logical CPUs may exceed the cores: env workers and trainer ranks take turns (simulate, then
    train), so reserving a core each for both would leave half of them idle.
    """
    if threading.current_thread() is not _background:
        _wait_for_background_start()
    with _init_lock:
        _init_ray(num_cpus)


def start_ray_in_background(num_cpus: int | None = None) -> None:
    """Begin `ensure_ray(num_cpus)` on a thread and return at once; the next `ensure_ray` call waits for it.

    Why: `ray.init` is slow even on a quiet machine, most of it waiting for the processes it starts (its
    GCS, dashboard and raylet, each importing its modules), and a command can import torch and its own modules
    meanwhile instead of after.
    Two constraints shape it. Ray starts its processes with PR_SET_PDEATHSIG, which Linux fires when the *thread*
    that started them ends, not the process: so the thread stays (parked, a daemon) for the process's life. And
    only the main thread may set a signal handler: the SIGTERM handler `ray.init` sets (exit, so the exit handlers
    stop what the command started) is set by the `ensure_ray` call that waits, when that is the main thread.
    """
    global _background
    if ray.is_initialized() or _background is not None:
        return
    logging.getLogger("ray._private.worker").addFilter(_no_sigterm_warning)
    _background = threading.Thread(target=_start_and_stay, args=(num_cpus,), name="ray-start", daemon=True)
    _background.start()


def _start_and_stay(num_cpus: int | None) -> None:
    try:
        ensure_ray(num_cpus)
        _background_start.set_result(None)
    except BaseException as exc:  # noqa: BLE001 - handed to the caller that waits for this start
        _background_start.set_exception(exc)
    threading.Event().wait()  # never returns: Ray's processes are killed when this thread ends (see above)


def _no_sigterm_warning(record: logging.LogRecord) -> bool:
    """Drop the warning `ray.init` logs off the main thread: the waiting `ensure_ray` sets that handler itself."""
    return not record.getMessage().startswith("SIGTERM handler is not set")


def _wait_for_background_start() -> None:
    """Wait for the background start, once: the first caller gets its error, or (on the main thread) sets the SIGTERM
    handler; later callers return at once, so a handler installed since (a flow run's) is left alone."""
    global _background_waited
    if _background is None or _background_waited:
        return
    error = _background_start.exception()  # waits for the start
    with _init_lock:
        if _background_waited:
            return
        _background_waited = True
    if error is not None:
        raise error
    if threading.current_thread() is threading.main_thread() and ray.is_initialized():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # as `ray.init` sets it


def _init_ray(num_cpus: int | None) -> None:
    global _inherited_env
    if ray.is_initialized():
        return
    if not is_local_ray():
        check_ray_address_answers(os.environ["RAY_ADDRESS"])
        ray.init(namespace="gymflow", log_to_driver=False)
        return
    use_local_ray_defaults()
    cpus = max(os.cpu_count() or 1, num_cpus or 0)
    ray.init(num_cpus=cpus, namespace="gymflow", include_dashboard=False, log_to_driver=False)
    _inherited_env = gymflow_env_vars()  # a local Ray's workers start with this process's environment


RAY_ADDRESS_PROBE_TIMEOUT_S = 10.0
"""How long a connection to a `RAY_ADDRESS` may take to be accepted (a refused one fails at once)."""


def check_ray_address_answers(address: str) -> None:
    """Raise RuntimeError, naming `address` (a `RAY_ADDRESS`), when nothing accepts a connection where `ray.init` would
    dial it. Why: Ray itself keeps retrying for minutes, printing only its retry warnings, so a stopped cluster or a
    mistyped address looks like a hung command.
    Ray Client (`ray://...`) and "auto" addresses are left to Ray."""
    from ray._private.services import canonicalize_bootstrap_address, is_localhost, parse_address

    if "://" in address or address in ("auto", "local"):
        return
    target = canonicalize_bootstrap_address(address)  # a loopback host becomes the machine's address, as Ray dials
    host, port = parse_address(target)
    try:
        socket.create_connection((host, int(port)), timeout=RAY_ADDRESS_PROBE_TIMEOUT_S).close()
    except OSError as err:
        given = parse_address(address)
        hint = ""
        if given and is_localhost(given[0]) and not is_localhost(host):
            hint = (f"; Ray dials {host} for {given[0]} unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is set, which a Ray "
                    "started on this machine with that setting (listening on 127.0.0.1 only) needs here too")
        raise RuntimeError(f"RAY_ADDRESS={address}: nothing accepts connections at {target} ({err}){hint}; start that "
                           "cluster, correct the address, or unset RAY_ADDRESS to run on a Ray of this command's own"
                           ) from None


def shutdown_local_ray() -> None:
    """`ray.shutdown()` of a local Ray this process started, sooner than Ray's own exit handler would.

    Why: at exit, Ray's handler first sleeps 0.5 s so that workers' log lines reach the driver (this driver takes
    none: `log_to_driver=False`), then stops its processes one after another with a second's grace each, and its
    autoscaler monitor, stopped after the GCS it reports to, never exits within it: it is killed at the end of
    its grace, a large share of a command's exit. It holds no state, so it is killed first here, as Ray would a
    second later. A Ray joined through RAY_ADDRESS, or none, is left to Ray's handler; after this one, that
    handler has nothing left to do.
    """
    if _inherited_env is None or not ray.is_initialized():  # not a local Ray of ours (`_init_ray` sets it)
        return
    from ray._private import ray_constants

    node = getattr(ray._private.worker, "_global_node", None)
    for info in (getattr(node, "all_processes", None) or {}).get(ray_constants.PROCESS_TYPE_MONITOR, []):
        info.process.kill()
        info.process.wait(timeout=1)
    ray.shutdown()


def is_local_ray() -> bool:
    """Whether the Ray this process uses is one it starts on this machine (no cluster named in `RAY_ADDRESS`)."""
    return not os.environ.get("RAY_ADDRESS")


def use_local_ray_defaults() -> None:
    """Set `LOCAL_RAY_DEFAULTS` in this process's environment, which a local Ray's processes inherit.

    Ray reads the loopback switch into a module constant when it is imported, and the driver's own address
    choice uses that constant, so it is updated too when it was read before the variable was set: the result
    does not depend on whether anything imported ray first.
    """
    for name, value in LOCAL_RAY_DEFAULTS.items():
        os.environ.setdefault(name, value)
    from ray._common.utils import env_bool
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = env_bool(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, True)


def actor_options() -> dict:
    """Ray options every gymflow actor takes: the driver's GYMFLOW_* settings (fault drills, cache dir) as a
    runtime_env, which a cluster's workers need. Left out when the workers already inherit exactly these (a
    local Ray this process started): Ray then runs the actor in a worker process it started in advance instead
    of a new one for the runtime_env, sooner by a worker's start-up per actor."""
    env = gymflow_env_vars()
    return {} if env == _inherited_env else {"runtime_env": {"env_vars": env}}


NAME_RELEASE_TIMEOUT_S = 10.0  # how long a killed actor's name may linger before its replacement takes it


def wait_until_names_free(names: list[str]) -> None:
    """Wait (up to NAME_RELEASE_TIMEOUT_S in all) until killed actors' names are free: `ray.kill` is asynchronous,
    and an actor created under a lingering name with `get_if_exists` would be the dying one."""
    deadline = time.monotonic() + NAME_RELEASE_TIMEOUT_S
    for name in names:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name)
            except ValueError:
                break
            time.sleep(0.05)


def kill_local_ray_of(driver_pid: int) -> list[int]:
    """SIGKILL what remains of the local Ray that process `driver_pid` started; returns the pids killed.

    For crash drills: after `kill -9` of a driver, Ray workers that were starting can outlive it. Ray names
    a local session `session_<date>_<time>_<driver pid>` and passes that name to every process of it, so
    this finds exactly that session's processes (Linux /proc) and nothing else on the machine.
    """
    import re
    import signal
    from pathlib import Path

    pattern = re.compile(rf"session_\d{{4}}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_{driver_pid}\b")
    killed = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if pattern.search(cmdline):
            try:
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
            except ProcessLookupError:
                pass
    return killed
