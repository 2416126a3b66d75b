"""Tuner, cache and dispatch behaviour, on throw-away GAE variants with tiny shapes and timing budgets."""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path

import pytest
import torch

import gymflow_kernels as kernels
from gymflow_kernels.autotune import tune_bucket
from gymflow_kernels.cli import main
from gymflow_kernels.gae import gae_doubling, gae_numpy, gae_reference, make_inputs

FAST = {"min_run_time": 0.005}
SHAPE = {"T": 16, "N": 4}


def slow_reference(rewards, values, dones, next_value, gamma, lam):
    """The reference, plus a fixed delay: makes "a candidate is faster" deterministic on a busy machine."""
    time.sleep(0.003)
    return gae_reference(rewards, values, dones, next_value, gamma, lam)


def plain_reference(*args):
    return gae_reference(*args)


def slower_copy(*args):
    time.sleep(0.003)
    return gae_reference(*args)


def fast_but_zero(rewards, values, dones, next_value, gamma, lam):
    return torch.zeros_like(rewards), values.clone()


def ignores_lambda(rewards, values, dones, next_value, gamma, lam):
    return gae_reference(rewards, values, dones, next_value, gamma, 1.0)


def raises(*args):
    raise RuntimeError("boom")


def makes_nan(*args):
    advantages, returns = gae_reference(*args)
    advantages[0, 0] = float("nan")
    return advantages, returns


def mutates_inputs(rewards, values, dones, next_value, gamma, lam):
    out = gae_reference(rewards, values, dones, next_value, gamma, lam)
    rewards.zero_()
    return out


def test_wrong_candidates_are_rejected_and_never_chosen(make_op) -> None:
    wrong = {"zeros": fast_but_zero, "no_lambda": ignores_lambda, "raises": raises, "nan": makes_nan,
             "mutates": mutates_inputs}
    op = make_op({**wrong, "numpy": gae_numpy})
    bucket = kernels.autotune(op.name, [SHAPE], **FAST).buckets[0]
    results = {c.name: c for c in bucket.candidates}
    expected_reasons = {"zeros": "differs", "no_lambda": "differs", "raises": "raised RuntimeError: boom",
                        "nan": "NaN/inf", "mutates": "modified its input"}
    for name, reason in expected_reasons.items():
        assert not results[name].verified
        assert reason in results[name].reason
        assert results[name].median_s is None  # rejected candidates are not even timed
    assert bucket.winner in {"reference", "numpy"}
    assert results["numpy"].verified


def test_slower_candidate_never_wins(make_op) -> None:
    op = make_op({"slower": slower_copy})
    bucket = kernels.autotune(op.name, [SHAPE], **FAST).buckets[0]
    results = {c.name: c for c in bucket.candidates}
    assert results["slower"].verified and results["slower"].speedup < 1
    assert bucket.winner == "reference"


def test_winner_is_not_slower_than_reference_in_the_tuners_measurement(make_op) -> None:
    op = make_op({"numpy": gae_numpy, "doubling": gae_doubling})
    for bucket in kernels.autotune(op.name, [SHAPE, {"T": 100, "N": 8}], **FAST).buckets:
        results = {c.name: c for c in bucket.candidates}
        assert results[bucket.winner].median_s <= results["reference"].median_s


def test_cache_round_trip(make_op, tmp_cache_dir: Path) -> None:
    op = make_op({"numpy": gae_numpy, "doubling": gae_doubling})
    first = kernels.autotune(op.name, [SHAPE], **FAST)
    second = kernels.autotune(op.name, [SHAPE], **FAST)
    assert (tmp_cache_dir / "kernels" / "winners.json").is_file()
    assert [b.cache_hit for b in first.buckets] == [False]
    assert [b.cache_hit for b in second.buckets] == [True]
    assert second.buckets[0].winner == first.buckets[0].winner
    assert second.buckets[0].candidates == first.buckets[0].candidates
    assert not kernels.autotune(op.name, [SHAPE], force=True, **FAST).buckets[0].cache_hit
    assert [p.name for p in (tmp_cache_dir / "kernels").iterdir()] == ["winners.json"]  # no temp files left


def test_shapes_in_one_bucket_are_tuned_once(make_op) -> None:
    op = make_op({"numpy": gae_numpy})
    report = kernels.autotune(op.name, [{"T": 12, "N": 3}, SHAPE], **FAST)
    assert [b.bucket for b in report.buckets] == [{"T": 16, "N": 4}]


def test_corrupt_cache_is_ignored_with_a_warning(make_op, tmp_cache_dir: Path) -> None:
    op = make_op({"fast": plain_reference}, reference=slow_reference)
    path = tmp_cache_dir / "kernels" / "winners.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    inputs = make_inputs(SHAPE, 0)
    with pytest.warns(RuntimeWarning, match="ignoring kernel winner cache"):
        assert kernels.dispatch(op.name).choose(*inputs) == "reference"
    with pytest.warns(RuntimeWarning, match="ignoring kernel winner cache"):
        report = kernels.autotune(op.name, [SHAPE], **FAST)
    assert not report.buckets[0].cache_hit
    assert json.loads(path.read_text())["entries"]  # rewritten as a valid file


def test_dispatch_falls_back_to_reference_when_nothing_is_tuned(make_op) -> None:
    op = make_op({"fast": plain_reference}, reference=slow_reference)
    inputs = make_inputs(SHAPE, 0)
    gae = kernels.dispatch(op.name)
    assert gae.choose(*inputs) == "reference"
    for want, got in zip(gae_reference(*inputs), gae(*inputs)):
        torch.testing.assert_close(got, want)


def test_dispatch_uses_the_winner_per_bucket_and_picks_up_new_tunings(make_op) -> None:
    op = make_op({"fast": plain_reference}, reference=slow_reference)
    gae = kernels.dispatch(op.name)  # created before anything is tuned, like a long-running trainer
    inputs = make_inputs(SHAPE, 0)
    assert gae.choose(*inputs) == "reference"
    assert gae.resolve(*inputs) is op.reference
    assert kernels.autotune(op.name, [SHAPE], **FAST).buckets[0].winner == "fast"
    assert gae.choose(*inputs) == "fast"
    assert gae.resolve(*inputs) is op.candidates["fast"]
    rewards, values, dones, next_value, gamma, lam = make_inputs({"T": 13, "N": 3}, 1)  # same bucket
    assert gae.choose(rewards, values, dones, next_value, gamma=gamma, lam=lam) == "fast"
    for want, got in zip(gae_reference(*inputs), gae(*inputs)):
        torch.testing.assert_close(got, want)
    assert gae.choose(*make_inputs({"T": 40, "N": 4}, 0)) == "reference"  # another bucket, not tuned
    assert gae.choose(*(x.double() if isinstance(x, torch.Tensor) else x for x in inputs)) == "reference"


def test_report_is_json_serialisable_and_cli_prints_it(make_op) -> None:
    op = make_op({"numpy": gae_numpy})
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["--ops", op.name, "--shapes", "16x4", "--report", "--min-run-time", "0.005"]) == 0
    text = stdout.getvalue()
    table, _, payload = text.partition("\n{")
    assert "numpy" in table and "winner" in table
    summary = json.loads("{" + payload)
    (report,) = summary["ops"]
    assert report["op"] == op.name and report["buckets"][0]["bucket"] == {"T": 16, "N": 4}
    assert set(summary) >= {"geomean_speedup", "fast_1.0", "fast_1.5", "winners"}
    assert json.loads(json.dumps(kernels.autotune(op.name, [SHAPE], **FAST).to_dict()))["buckets"][0]["cache_hit"]


def test_unknown_op_error_names_the_registered_ones() -> None:
    with pytest.raises(KeyError, match="registered ops: .*gae"):
        kernels.dispatch("no_such_op")


def test_changed_candidate_source_changes_the_cache_key(make_op) -> None:
    """A winner measured for other code must not be reused: the key hashes the implementations' sources."""
    assert make_op({"x": gae_numpy}).source_hash != make_op({"x": gae_doubling}).source_hash


class MemorisedCheat:
    """Right on the inputs verification uses (seeds 0-2, the edge cases), zeros elsewhere, and instant: the kind of
    "speedup" that re-verification on fresh inputs exists to catch."""

    def __init__(self, op: kernels.Op, shape: dict) -> None:
        shapes = [shape] * 3 + [{**edge} for edge in op.edge_cases]
        self.answers = {self._key(op.make_inputs(s, seed)): gae_reference(*op.make_inputs(s, seed))
                        for s, seed in zip(shapes, [0, 1, 2] + [0] * len(op.edge_cases))}

    @staticmethod
    def _key(inputs: tuple) -> tuple:
        return tuple(float(x.sum()) if isinstance(x, torch.Tensor) else x for x in inputs)

    def __call__(self, *inputs):
        known = self.answers.get(self._key(inputs))
        return tuple(x.clone() for x in known) if known else (torch.zeros_like(inputs[0]), inputs[1].clone())


def test_huge_speedup_failing_on_fresh_inputs_is_rejected(make_op) -> None:
    op = make_op({"cheat": MemorisedCheat(kernels.get_op("gae"), SHAPE)}, reference=slow_reference)
    bucket = kernels.autotune(op.name, [SHAPE], **FAST).buckets[0]
    cheat = bucket.result("cheat")
    assert not cheat.verified and "not confirmed on fresh inputs" in cheat.reason
    assert bucket.winner == "reference"


def very_slow_reference(*args):
    time.sleep(0.03)
    return gae_reference(*args)


def test_huge_speedup_that_holds_is_marked_reverified(make_op) -> None:
    op = make_op({"fast": gae_numpy}, reference=very_slow_reference)
    fast = kernels.autotune(op.name, [SHAPE], **FAST).buckets[0].result("fast")
    assert fast.verified and fast.reverified and fast.speedup > 10


def test_forced_reference_overrides_a_tuned_winner(make_op, monkeypatch: pytest.MonkeyPatch) -> None:
    op = make_op({"fast": plain_reference}, reference=slow_reference)
    assert kernels.autotune(op.name, [SHAPE], **FAST).buckets[0].winner == "fast"
    monkeypatch.setenv("GYMFLOW_KERNELS", "reference")
    assert kernels.dispatch(op.name).choose(*make_inputs(SHAPE, 0)) == "reference"


@kernels.candidate(opt_in=kernels.COMPILE)
def opt_in_copy(*args):
    return gae_reference(*args)


def test_opted_in_candidates_make_an_older_cache_entry_a_miss(make_op) -> None:
    op = make_op({"numpy": gae_numpy, "jit": opt_in_copy})
    first = kernels.autotune(op.name, [SHAPE], opt_in=frozenset(), **FAST).buckets[0]
    assert "jit" not in {c.name for c in first.candidates}
    assert kernels.autotune(op.name, [SHAPE], opt_in=frozenset(), **FAST).buckets[0].cache_hit
    second = kernels.autotune(op.name, [SHAPE], opt_in=frozenset({kernels.COMPILE}), **FAST).buckets[0]
    assert not second.cache_hit and second.result("jit").verified


class SlowFirstCall:
    """Fast after a one-off per-process setup of 0.3 s, like a JIT compile."""

    __kernel_per_process_setup__ = True

    def __init__(self) -> None:
        self.ready = False

    def __call__(self, *args):
        if not self.ready:
            time.sleep(0.3)
            self.ready = True
        return gae_reference(*args)


def test_per_process_setup_is_weighed_against_expected_calls(make_op) -> None:
    op = make_op({"jit": SlowFirstCall()}, reference=slow_reference)
    few = tune_bucket(op, SHAPE, calls_per_run=1, opt_in=frozenset(), **FAST)
    assert few.result("jit").build_s >= 0.25 and few.winner == "reference"
    op = make_op({"jit": SlowFirstCall()}, reference=slow_reference)
    assert tune_bucket(op, SHAPE, calls_per_run=10**6, opt_in=frozenset(), **FAST).winner == "jit"
