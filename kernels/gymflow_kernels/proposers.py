"""Candidate proposers: code proposed from an op's reference source, checked in a subprocess, kept for review.

Why a subprocess: proposed code is untrusted (it may loop, crash the interpreter, or corrupt state), so it is never
executed in the tuner's process. `kernels.sandbox` loads one proposal, verifies it against the reference on the same
seeds and edge cases as a built-in candidate, times it, and prints one JSON line; the tuner kills it after a timeout.
A proposal that passes is saved under `<cache dir>/kernels/proposed/<op>/` for a person to read and add to the op's
module; it is reported, never dispatched, because dispatching it would run it in-process.

`ChatEndpointProposer` asks any OpenAI-compatible chat endpoint (e.g. `vllm serve MODEL` at http://HOST:8000/v1).
Configure it with GYMFLOW_KERNEL_PROPOSER_URL and GYMFLOW_KERNEL_PROPOSER_MODEL (and, where the endpoint wants a
key, GYMFLOW_KERNEL_PROPOSER_API_KEY); without a URL the proposer step is skipped with a message saying so. The
former names GYMFLOW_KERNEL_GENERATOR_* are an error (`RenamedVariable`), not read.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gymflow_kernels.cache import cache_dir
from gymflow_kernels.registry import Op
from gymflow_kernels.report import CandidateResult

SYSTEM_PROMPT = (
    "You write fast, exactly equivalent PyTorch implementations of reference functions. Answer with one ```python "
    "code block that defines a function named `candidate` with the reference's parameters and return value. "
    "You may import torch, numpy and math only. Never modify the arguments in place."
)


class CandidateProposer(Protocol):
    """Anything that proposes candidate source code for an op; each text must define `candidate`."""

    name: str

    def propose(self, op: Op, n: int) -> list[str]:
        """Up to `n` Python sources, each defining a function `candidate` with the reference's signature."""
        ...


class ProposerUnavailable(RuntimeError):
    """The proposer could not be asked (endpoint down, bad reply); the tuner reports it and carries on."""


def reference_prompt(op: Op) -> str:
    """What a proposer is shown: the op's conventions (its module docstring), the reference, the tolerances."""
    module = sys.modules.get(op.reference.__module__)
    conventions = (inspect.getdoc(module) or "") if module else ""
    tolerances = ", ".join(f"{d}: rtol={t.rtol:g} atol={t.atol:g}" for d, t in op.tolerances.items())
    grads = f" Gradients w.r.t. arguments {list(op.grad_argnums)} must match too." if op.grad_argnums else ""
    return (f"Op `{op.name}`.\n{conventions}\n\nReference implementation:\n```python\n"
            f"{inspect.getsource(op.reference)}```\n\nWrite a faster `candidate` whose outputs match within "
            f"{tolerances}.{grads}")


def extract_code(reply: str) -> str:
    """The first fenced code block of a chat reply, or the whole reply when it has none."""
    match = re.search(r"```(?:python|py)?[ \t]*\n(.*?)```", reply, re.DOTALL)
    return match.group(1) if match else reply


@dataclass
class ChatEndpointProposer:
    """Proposals from an OpenAI-compatible `/chat/completions` endpoint, asked once for `n` choices."""

    url: str
    """Base URL of the API, e.g. http://127.0.0.1:8000/v1."""
    model: str
    api_key: str | None = None
    timeout_s: float = 120.0
    temperature: float = 0.7
    name: str = "chat"

    def propose(self, op: Op, n: int) -> list[str]:
        body = {"model": self.model, "n": n, "temperature": self.temperature,
                "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                             {"role": "user", "content": reference_prompt(op)}]}
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        endpoint = f"{self.url.rstrip('/')}/chat/completions"
        request = urllib.request.Request(endpoint, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 - configured URL
                reply = json.load(response)
            return [extract_code(choice["message"]["content"]) for choice in reply["choices"]][:n]
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as exc:
            raise ProposerUnavailable(f"asking {endpoint} (model {self.model!r}) failed: "
                                      f"{type(exc).__name__}: {exc}") from exc


ENV_PREFIX = "GYMFLOW_KERNEL_PROPOSER_"
RENAMED = {f"GYMFLOW_KERNEL_GENERATOR_{suffix}": f"{ENV_PREFIX}{suffix}" for suffix in ("URL", "MODEL", "API_KEY")}
"""Former names of the variables: one still set is a configuration written for the old name, refused loudly."""


class RenamedVariable(ValueError):
    """A GYMFLOW_KERNEL_GENERATOR_* variable is set: it was renamed to GYMFLOW_KERNEL_PROPOSER_* and is not read."""


def proposer_from_env() -> tuple[ChatEndpointProposer | None, str]:
    """The configured chat proposer, or None and why it is skipped; `RenamedVariable` if an old name is set."""
    old = [name for name in RENAMED if name in os.environ]
    if old:
        renames = ", ".join(f"{name} -> {RENAMED[name]}" for name in old)
        raise RenamedVariable(f"{', '.join(old)} {'is' if len(old) == 1 else 'are'} no longer read: the kernel "
                              f"generator was renamed to the kernel proposer; rename the variable(s) ({renames}) "
                              "and unset the old name(s)")
    url = os.environ.get(f"{ENV_PREFIX}URL")
    if not url:
        return None, (f"kernel proposer skipped: {ENV_PREFIX}URL is not set; point it at an "
                      "OpenAI-compatible endpoint (e.g. http://127.0.0.1:8000/v1 from `vllm serve MODEL`) and set "
                      f"{ENV_PREFIX}MODEL to propose candidates")
    model = os.environ.get(f"{ENV_PREFIX}MODEL")
    if not model:
        return None, (f"kernel proposer skipped: {ENV_PREFIX}URL is {url} but "
                      f"{ENV_PREFIX}MODEL is not set; set it to the served model's name")
    proposer = ChatEndpointProposer(url, model, os.environ.get(f"{ENV_PREFIX}API_KEY"))
    return proposer, f"kernel proposer: {model} at {url}"


def evaluate_proposals(
    op: Op, shape: dict, proposer: CandidateProposer, *, n: int = 2, seeds: int = 3, min_run_time: float = 0.2,
    timeout_s: float = 300.0,
) -> list[CandidateResult]:
    """Ask `proposer` for `n` proposals and check each in its own subprocess; verified ones are saved for review."""
    try:
        sources = proposer.propose(op, n)
    except ProposerUnavailable as exc:
        return [CandidateResult(f"{proposer.name}:unavailable", verified=False, reason=str(exc))]
    return [_evaluate(op, shape, source, proposer.name, seeds, min_run_time, timeout_s) for source in sources]


SANDBOX_MEMORY_BYTES = 8 << 30  # address space of a proposal's process: torch's own mappings take ~3 GiB
SANDBOX_IMPORT_CPU_S = 30
KEPT_VARIABLES = ("PATH", "LANG", "LC_ALL", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _sandbox_env(tmp: str) -> dict[str, str]:
    """A scrubbed environment: no credentials (AWS_*, the proposer's API key), home and temp in the proposal's
    own directory; the package found through PYTHONPATH, whatever the working directory."""
    env = {k: os.environ[k] for k in KEPT_VARIABLES if k in os.environ}
    return {**env, "HOME": tmp, "TMPDIR": tmp, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}


def _cpu_seconds(timeout_s: float) -> int:
    """The CPU-time limit: what the wall-clock timeout allows on every core, plus importing torch, so a loop meets
    the timeout first and only a proposal burning many threads meets this."""
    return int(timeout_s * (os.cpu_count() or 1)) + SANDBOX_IMPORT_CPU_S


def _limit_resources(timeout_s: float) -> None:
    """In the child before it runs: CPU seconds (SIGXCPU at the limit) and address space."""
    import resource

    cpu = _cpu_seconds(timeout_s)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    resource.setrlimit(resource.RLIMIT_AS, (SANDBOX_MEMORY_BYTES, SANDBOX_MEMORY_BYTES))


@functools.cache
def _no_network() -> tuple[str, ...]:
    """`unshare -n` (a network namespace with no interface up) where this machine allows it, else nothing: the
    proposal then still runs with a scrubbed environment and limits, and the tuner's report says so once."""
    try:
        works = subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        works = False
    if not works:
        print("kernel proposals run without network isolation: `unshare -n` is not permitted here", file=sys.stderr)
    return ("unshare", "-n") if works else ()


def _evaluate(
    op: Op, shape: dict, source: str, origin: str, seeds: int, min_run_time: float, timeout_s: float
) -> CandidateResult:
    digest = hashlib.sha256(source.encode()).hexdigest()[:10]
    name = f"{origin}:{digest}"
    with tempfile.TemporaryDirectory(prefix="gymflow-proposal-") as tmp:
        path = Path(tmp) / f"{op.name}_{digest}.py"
        path.write_text(source)
        command = [*_no_network(), sys.executable, "-m", "gymflow_kernels.sandbox", op.name, json.dumps(shape),
                   str(path), str(seeds), str(min_run_time)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=tmp,
                                  env=_sandbox_env(tmp), preexec_fn=lambda: _limit_resources(timeout_s))
        except subprocess.TimeoutExpired:
            return CandidateResult(name, verified=False, reason=f"killed after the {timeout_s:g} s timeout")
    lines = done.stdout.strip().splitlines()
    if done.returncode == -signal.SIGXCPU:
        return CandidateResult(name, verified=False,
                               reason=f"killed at its CPU-time limit ({_cpu_seconds(timeout_s)} s)")
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return CandidateResult(name, verified=False, reason=f"sandbox exited with {done.returncode}: {tail}")
    result = CandidateResult(**{**json.loads(lines[-1]), "name": name})
    if result.verified:
        saved = cache_dir() / "kernels" / "proposed" / op.name / f"{digest}.py"
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(f"# proposed by {origin} for {op.name} at {shape}; verified, {result.speedup:.2f}x the "
                         f"reference. Review before adding it to kernels/.\n{source}")
        result.reason = f"proposal, not dispatched; saved for review to {saved}"
    return result
