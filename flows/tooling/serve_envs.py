"""`gymflow serve-envs`: gymflow's tasks to OpenEnv clients (`rl_core.runtime.serving`), until interrupted. Its
imports wait for the command, so the rest of the command line starts without them."""
from __future__ import annotations

import argparse
import signal
import sys
import threading


def add_serve_envs_parser(sub: argparse._SubParsersAction, exit_codes: str) -> None:
    parser = sub.add_parser("serve-envs", help="serve tasks over OpenEnv's HTTP/WebSocket protocol",
                            description="Serves tasks to OpenEnv clients, one session = a batch of envs on Ray env "
                                        "hosts, until interrupted; prints the URL to connect to, which carries the "
                                        "server's random token (docs: guides/env-service.md).", epilog=exit_codes)
    parser.add_argument("--task", action="append", required=True, metavar="NAME",
                        help="a MuJoCo task or agent env to serve; repeat for several (the first is the default)")
    parser.add_argument("--num-envs", type=int, default=1, help="envs of a session whose reset names no num_envs "
                                                                "(default: 1, OpenEnv's single-env shapes)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port; 0 picks a free one (default: 8000)")
    parser.add_argument("--workers", type=int, help="Ray env-host actors (default: one per core)")


def serve_envs_command(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM (exit 0); options the config refuses exit 2."""
    from pydantic import ValidationError

    from flows.tooling.orphan_guard import guard
    from rl_core.config.common import ConfigError, format_validation_error
    from rl_core.runtime.serving import EnvService, ServeConfig

    options = {"tasks": args.task, "num_envs": args.num_envs, "host": args.host, "port": args.port,
               "workers": args.workers}
    try:
        service = EnvService(ServeConfig(**{k: v for k, v in options.items() if v is not None}))
    except ValidationError as err:
        print(f"error: {format_validation_error(err, 'invalid serve-envs options:')}", file=sys.stderr)
        return 2
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    guard()  # the env hosts and Ray end with this command, even when it is SIGKILLed
    stopped = threading.Event()
    with service:
        for signum in (signal.SIGINT, signal.SIGTERM):  # a server's ordinary end: exit 0, after stopping cleanly
            signal.signal(signum, lambda *_: stopped.set())
        print(f"serving {', '.join(service.cfg.tasks)} to OpenEnv clients at {service.client_url} (the token is the "
              "URL's password); Ctrl-C stops", flush=True)
        stopped.wait()
    print("stopped", file=sys.stderr)
    return 0
