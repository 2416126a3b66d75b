"""Agent-owned episodes (`--agent module:callable`): the user's programs run here, their model calls are answered
through the run's OpenAI-compatible endpoint by the run's generator, and every call is recorded token-exact.

The pieces, each with one job:
- `ProgramEndpoint`: the endpoint server of this process (one per run, loopback, the run's random token), whose
  backend maps each live session to the `EpisodeCalls` recorder of its episode.
- `GenerationBatcher`: the sessions' calls arrive one by one from concurrent programs; it sends the ones waiting
  together to the generator actor (one Ray call, so the backend batches them). A generation's bits do not depend on
  its batch, so batching changes speed only.
- `run_programs`: every episode of a chunk as a program on one asyncio loop, each with its own session and a
  timeout; an episode whose program raises or times out is scored 0 with the error in its info, and the others go
  on. Each call is written as it completes (the rollout's safe points, `CallLog`), so a retried or resumed rollout
  re-runs an unfinished program and answers the calls it already made from the store, generating only what is new.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import queue
import secrets
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict

import fsspec
import httpx

from rl_core.algos.grpo.episodes import EpisodeSpec, Generate
from rl_core.algos.grpo.trajectories import Episode
from rl_core.config.agent import AgentRunConfig
from rl_core.envs.agent import AgentEnv
from rl_core.envs.agent.programs import AgentContext, AgentProgram, Problem, Result
from rl_core.generation import Generation, GenerationRequest
from rl_core.runtime.agent.chat_rendering import chat_format
from rl_core.runtime.agent.episode_calls import CallRecord, EpisodeCalls, segments
from rl_core.runtime.agent.openai_endpoint import EndpointServer, SessionEnded, openai_app
from rl_core.runtime.agent.openai_request import SamplingPolicy
from rl_core.runtime.agent.tool_calls import ToolFormat
from rl_core.runtime.faults import maybe_fail
from rl_core.runtime.loopback_server import new_token

MODEL_NAME = "gymflow-policy"
BATCH_WAIT_S = 0.02
"""How long the batcher waits for more calls after one arrives, unless every live session already asked. Each call
costs the stock client CPU on the programs' one event loop, so a rollout's calls arrive one after another: waiting for
them fills one batch, which the generator samples faster than several small ones (docs/benchmarks.md). A session busy
elsewhere (a tool, a simulation) delays the others by at most this."""


class GenerationBatcher:
    """Calls from concurrent sessions, sent to the generator together from one thread."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._live = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="gymflow-generation-batcher", daemon=True)
        self._thread.start()

    def live(self, change: int) -> None:
        """A session opened (+1) or closed (-1): the batcher stops waiting once every live session has asked."""
        with self._lock:
            self._live += change

    async def __call__(self, requests: list[GenerationRequest], generate: Generate) -> list[Generation]:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((requests, generate, future))
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Stop the batching thread once the calls queued before have been answered."""
        self._queue.put(None)

    def _serve(self) -> None:
        while (first := self._queue.get()) is not None:
            waiting = [first]
            deadline = time.monotonic() + BATCH_WAIT_S
            while len(waiting) < self._live and (left := deadline - time.monotonic()) > 0:
                try:
                    waiting.append(self._queue.get(timeout=left))
                except queue.Empty:
                    break
            # a call whose program stopped waiting (its rollout failed, it timed out) is not generated; the others
            # are marked running, so a later cancel leaves their answer to be set (and dropped)
            waiting = [item for item in waiting if item[2].set_running_or_notify_cancel()]
            for generate, items in _by_generate(waiting).items():
                requests = [request for asked, _, _ in items for request in asked]
                try:
                    answered = generate(requests)
                except BaseException as err:  # noqa: BLE001 - handed to every waiting call, raised there
                    for _, _, future in items:
                        future.set_exception(err)
                    continue
                start = 0
                for asked, _, future in items:
                    future.set_result(answered[start:start + len(asked)])
                    start += len(asked)


def _by_generate(waiting: list) -> dict:
    """Waiting calls grouped by the generate function they were sent with (one per rollout: its version)."""
    groups: dict = {}
    for item in waiting:
        groups.setdefault(item[1], []).append(item)
    return groups


class _Sessions:
    """The endpoint's backend: each live session's recorder, and the generate function of its rollout."""

    def __init__(self, batcher: GenerationBatcher) -> None:
        self.batcher = batcher
        self._open: dict[str, tuple[EpisodeCalls, Generate]] = {}
        self.broken: dict[str, BaseException] = {}
        """Per session, a failure of the generator or the store (not the program's): it fails the rollout, which
        a retry resumes from the calls recorded."""

    def open(self, session: str, calls: EpisodeCalls, generate: Generate) -> None:
        self._open[session] = (calls, generate)
        self.batcher.live(+1)

    def close(self, session: str) -> None:
        if self._open.pop(session, None) is not None:
            self.batcher.live(-1)

    def knows(self, session: str) -> bool:
        return session in self._open

    async def complete(self, session: str, prompt_ids: list[int], params, n: int, request_key: str
                       ) -> list[Generation]:
        opened = self._open.get(session)
        if opened is None:
            raise SessionEnded(f"session {session} has ended: its program returned or timed out")
        calls, generate = opened
        try:
            return await calls.call(prompt_ids, params, n, request_key,
                                    lambda requests: self.batcher(requests, generate))
        except (ValueError, SessionEnded):  # the request's fault: the program hears it as a 4xx
            raise
        except Exception as err:
            self.broken.setdefault(session, err)
            raise


class ProgramEndpoint:
    """The run's endpoint in this process, started on first use: loopback only, the run's random token."""

    def __init__(self, cfg: AgentRunConfig, tokenizer, context: int, tools: ToolFormat | None = None) -> None:
        """`tools`: the env's tool format (its `tool_format`), for a model without a chat template."""
        s = cfg.sampling
        self.token = new_token()
        self.sessions = _Sessions(GenerationBatcher())
        app = openai_app(self.sessions, model_name=MODEL_NAME, token=self.token, chat=chat_format(tokenizer, tools),
                         policy=SamplingPolicy(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                               max_tokens=s.max_tokens),
                         context=context)
        self.app = app
        self.server = EndpointServer(app).start()

    def close(self) -> None:
        self.server.stop()
        self.sessions.batcher.close()


class CallLog:
    """Each episode's calls as JSON files under a rollout chunk's folder: written as they complete (safe points),
    read back by a retried rollout; records of another policy version are not this rollout's."""

    def __init__(self, folder: str, version: int, **where: int) -> None:
        """`where`: the rollout's position (iteration, chunk), for the fault-injection point after each write."""
        self.folder, self.version, self.where = folder.rstrip("/"), version, where
        self.fs, self.path = fsspec.core.url_to_fs(self.folder)

    def _episode(self, spec: EpisodeSpec) -> str:
        return f"{self.path}/g{spec.group:04d}-s{spec.sample:03d}"

    def recorded(self, spec: EpisodeSpec) -> list[CallRecord]:
        """The calls an earlier attempt recorded for the episode, in order, cut at the first gap."""
        folder = self._episode(spec)
        if not self.fs.exists(folder):
            return []
        records = {}
        for path in self.fs.glob(f"{folder}/call-*.json"):
            try:
                record = CallRecord.from_json(json.loads(self.fs.cat_file(path)))
            except (ValueError, KeyError, TypeError):  # cut short by a crash: generated again
                continue
            if record.version == self.version:
                records[record.index] = record
        ordered = []
        while len(ordered) in records:
            ordered.append(records[len(ordered)])
        return ordered

    def writer(self, spec: EpisodeSpec, recorded: int):
        """The episode's `on_record`: the call's JSON, written whole (a temp file, then a rename). `recorded`: how
        many calls `recorded` gave back; a call written below that index follows a divergence, so the later records
        (which answered another program) are removed first."""
        folder = self._episode(spec)

        def write(record: CallRecord) -> None:
            self.fs.makedirs(folder, exist_ok=True)
            final = f"{folder}/call-{record.index:04d}.json"
            if record.index < recorded:
                for stale in self.fs.glob(f"{folder}/call-*.json"):
                    if int(stale.rsplit("-", 1)[1].split(".")[0]) > record.index:
                        self.fs.rm(stale)
            partial = f"{final}.partial"
            self.fs.pipe_file(partial, json.dumps(record.to_json()).encode())
            self.fs.mv(partial, final)
            maybe_fail("program.call_recorded", **self.where, group=spec.group, sample=spec.sample, call=record.index)

        async def on_record(record: CallRecord) -> None:
            await asyncio.to_thread(write, record)

        return on_record


class _SharedHTTP(httpx.AsyncClient):
    """The rollout's one HTTP client, shared by every episode's OpenAI client: an episode closing its client (as
    `async with` or `close()` does) leaves it open; the rollout closes it when its programs are done.

    Its transport hands each request to the endpoint's app in this process (`httpx.ASGITransport`), on the programs'
    own event loop: the same app, routes, token check and bytes as over the socket, without a TCP round trip and
    without the server thread's event loop taking turns with the programs' for the GIL (docs/benchmarks.md). A client
    a program builds itself, on `ctx.base_url`, goes through the socket as any other process's would."""

    async def aclose(self) -> None:
        return None

    async def close_shared(self) -> None:
        await super().aclose()


def run_programs(program: AgentProgram, specs: Sequence[EpisodeSpec], make_env, endpoint: ProgramEndpoint,
                 generate: Generate, counters: tuple[int, ...], version: int, split: str, timeout_s: float,
                 calls: CallLog | None = None) -> tuple[list[Episode], dict[str, float]]:
    """Every episode of `specs` as a run of `program`; the episodes (segments by token prefix, the program's reward)
    and the calls' metrics summed (calls, replayed and generated tokens, divergences, failed programs)."""
    async def one(spec: EpisodeSpec, http: _SharedHTTP) -> tuple[Episode, dict]:
        env: AgentEnv = make_env()
        prompt = env.reset(spec.problem_seed)
        session = f"{spec.group}-{spec.sample}-{secrets.token_hex(8)}"
        earlier = calls.recorded(spec) if calls else []
        recorder = EpisodeCalls((*counters, spec.group, spec.sample), earlier,
                                calls.writer(spec, len(earlier)) if calls else None)
        endpoint.sessions.open(session, recorder, generate)
        ctx = AgentContext(Problem(spec.problem_seed, split, prompt), env, endpoint.server.base_url_for(session),
                           endpoint.token, MODEL_NAME, tuple(env.stop), tuple(getattr(env, "tools", ())), http)
        failed = 0
        try:
            result = await asyncio.wait_for(program(ctx), timeout_s)
            if not isinstance(result, Result):
                raise TypeError(f"the program returned {type(result).__name__}, not a Result")
        except TimeoutError:
            result, failed = Result(0.0, info={"error": f"the program did not end within {timeout_s:g} s "
                                                        "(agent_timeout_s)"}), 1
        except Exception as err:  # noqa: BLE001 - the user's program failed: this episode scores 0, the rest go on
            result, failed = Result(0.0, info={"error": f"{type(err).__name__}: {err}"}), 1
        finally:
            endpoint.sessions.close(session)
        if (broken := endpoint.sessions.broken.pop(session, None)) is not None:
            raise broken  # the generator or the store failed, not the program: the rollout fails and is retried
        records = recorder.records
        info = {**result.info, "correct": bool(result.correct)}
        if not records:
            info.setdefault("error", "the program never called the model")
        episode = Episode(spec.group, spec.sample, spec.problem_seed, version, [], segments(records),
                          float(result.reward), True, info,
                          [choice.finish_reason for record in records for choice in record.choices])
        return episode, {**asdict(recorder.metrics), "failed_programs": failed}

    async def every() -> list[tuple[Episode, dict]]:
        http = _SharedHTTP(transport=httpx.ASGITransport(endpoint.app, raise_app_exceptions=False),
                           timeout=httpx.Timeout(timeout_s))
        runs = [asyncio.ensure_future(one(spec, http)) for spec in specs]
        try:
            return await asyncio.gather(*runs)
        finally:  # one failed the rollout: the others stop too (their calls so far are recorded)
            for run in runs:
                run.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
            await http.close_shared()

    done = asyncio.run(every())
    totals: Counter = Counter()
    for _, metrics in done:
        totals.update(metrics)
    return [episode for episode, _ in done], dict(totals)
