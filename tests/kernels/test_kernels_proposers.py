"""The proposer plug-in: proposals from an OpenAI-compatible endpoint are checked in a subprocess, never in-process.

A tiny chat endpoint on 127.0.0.1 (stdlib http.server in a thread) answers with fixed proposals: one right, one wrong.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

import gymflow_kernels as kernels
from gymflow_kernels.proposers import (
    ChatEndpointProposer,
    RenamedVariable,
    evaluate_proposals,
    extract_code,
    proposer_from_env,
)

SHAPE = {"T": 16, "N": 4}

GOOD = '''```python
import torch

def candidate(rewards, values, dones, next_value, gamma, lam):
    nonterminal = 1 - dones
    next_values = torch.cat([values[1:], next_value[None]])
    deltas = rewards + gamma * next_values * nonterminal - values
    advantages = torch.empty_like(rewards)
    last = torch.zeros_like(next_value)
    for t in range(rewards.shape[0] - 1, -1, -1):
        last = deltas[t] + gamma * lam * nonterminal[t] * last
        advantages[t] = last
    return advantages, advantages + values
```'''

WRONG = '''Here is a faster version:
```python
import torch

def candidate(rewards, values, dones, next_value, gamma, lam):
    return rewards.clone(), rewards + values  # ignores discounting entirely
```'''

HANGS = "```python\nwhile True:\n    pass\n```"


class ChatEndpoint(ThreadingHTTPServer):
    """Answers every POST to /v1/chat/completions with one choice per configured reply; records the requests."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.replies, self.requests = replies, []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    server: ChatEndpoint

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, body))
        choices = [{"index": i, "message": {"role": "assistant", "content": text}}
                   for i, text in enumerate(self.server.replies)]
        payload = json.dumps({"id": "test", "object": "chat.completion", "choices": choices}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint(request: pytest.FixtureRequest) -> Iterator[ChatEndpoint]:
    server = ChatEndpoint(request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize("endpoint", [[GOOD, WRONG]], indirect=True)
def test_right_proposal_is_verified_and_saved_wrong_one_rejected(endpoint: ChatEndpoint, tmp_cache_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMFLOW_KERNEL_PROPOSER_URL", endpoint.url)
    monkeypatch.setenv("GYMFLOW_KERNEL_PROPOSER_MODEL", "tiny-coder")
    proposer, message = proposer_from_env()
    assert proposer is not None and "tiny-coder" in message
    good, wrong = kernels.autotune("gae", [SHAPE], min_run_time=0.005, proposer=proposer).buckets[0].proposals
    assert good.verified and good.median_s and "saved for review" in good.reason
    assert not wrong.verified and "differs" in wrong.reason and wrong.median_s is None
    saved = list((tmp_cache_dir / "kernels" / "proposed" / "gae").iterdir())
    assert len(saved) == 1 and "def candidate" in saved[0].read_text()  # only the right one is kept
    path, body = endpoint.requests[0]
    assert path == "/v1/chat/completions" and body["model"] == "tiny-coder" and body["n"] == 2
    assert "def gae_reference" in body["messages"][1]["content"]
    bucket = kernels.autotune("gae", [SHAPE]).buckets[0]
    assert bucket.cache_hit and bucket.winner in kernels.get_op("gae").implementations()  # never a proposal


@pytest.mark.parametrize("endpoint", [[HANGS]], indirect=True)
def test_proposal_that_never_returns_is_killed_after_the_timeout(endpoint: ChatEndpoint) -> None:
    proposer = ChatEndpointProposer(endpoint.url, "tiny-coder")
    (result,) = evaluate_proposals(kernels.get_op("gae"), SHAPE, proposer, n=1, min_run_time=0.005, timeout_s=3)
    assert not result.verified and "timeout" in result.reason


def test_without_a_url_the_proposer_is_skipped_with_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GYMFLOW_KERNEL_PROPOSER_URL", raising=False)
    proposer, message = proposer_from_env()
    assert proposer is None and "GYMFLOW_KERNEL_PROPOSER_URL is not set" in message


@pytest.mark.parametrize("old", ["GYMFLOW_KERNEL_GENERATOR_URL", "GYMFLOW_KERNEL_GENERATOR_MODEL",
                                 "GYMFLOW_KERNEL_GENERATOR_API_KEY"])
def test_a_variable_under_its_former_name_is_an_error_not_read(old: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even with the new names set too: the old one is refused, never silently read or ignored."""
    monkeypatch.setenv("GYMFLOW_KERNEL_PROPOSER_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("GYMFLOW_KERNEL_PROPOSER_MODEL", "tiny-coder")
    monkeypatch.setenv(old, "http://127.0.0.1:8000/v1")
    new = old.replace("GENERATOR", "PROPOSER")
    with pytest.raises(RenamedVariable, match=f"{old} is no longer read.*{old} -> {new}"):
        proposer_from_env()


def test_unreachable_endpoint_is_reported_not_raised() -> None:
    proposer = ChatEndpointProposer("http://127.0.0.1:9/v1", "tiny-coder", timeout_s=2)  # discard port: refused
    (result,) = evaluate_proposals(kernels.get_op("gae"), SHAPE, proposer)
    assert not result.verified and "failed" in result.reason and "127.0.0.1:9" in result.reason


def test_extract_code_takes_the_first_fenced_block_or_the_whole_reply() -> None:
    assert extract_code(WRONG).startswith("import torch")
    assert extract_code("def candidate(): pass") == "def candidate(): pass"


class _Fixed:
    """A proposer of fixed sources."""

    name = "fixed"

    def __init__(self, *sources: str) -> None:
        self.sources = list(sources)

    def propose(self, op, n: int) -> list[str]:
        return self.sources[:n]


def test_a_proposal_runs_without_credentials_network_or_unbounded_memory(monkeypatch, tmp_path) -> None:
    import socket

    monkeypatch.setenv("GYMFLOW_KERNEL_PROPOSER_API_KEY", "sk-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    spy = ("import os, socket\n"
           "seen = sorted(k for k in os.environ if 'SECRET' in k or 'API_KEY' in k)\n"
           "try:\n"
           f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).close(); net = 'connected'\n"
           "except OSError as err:\n"
           "    net = type(err).__name__\n"
           "raise RuntimeError(f'env={seen} net={net} cwd={os.getcwd()}')\n")
    hog = "big = bytearray(16 << 30)\n"
    try:
        spied, hogged = evaluate_proposals(kernels.get_op("gae"), SHAPE, _Fixed(spy, hog), n=2, min_run_time=0.005,
                                           timeout_s=60)
    finally:
        listener.close()
    assert "env=[]" in spied.reason and "cwd=/" in spied.reason and "gymflow-proposal-" in spied.reason
    assert "net=connected" not in spied.reason
    assert not hogged.verified and "MemoryError" in hogged.reason
