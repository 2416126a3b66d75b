"""Pinned results: refactors are held to the math the pinned runs gave before them, on every machine.

A tiny in-process run (seed 0, reference kernels, one rank) and the overlapped (decoupled PPO) schedule are pinned
twice (tests/pinned_runs.py):

- exact bits: the policy hash, per machine fingerprint (tests/fingerprint.py). The hashes go back to commit 2455d0d,
  before the algorithm seam existed. Eager float sums change with the CPU's code paths (a hash recorded on an AMD
  EPYC failed on an Intel Xeon), so on a machine with no recorded hash this check is skipped, naming the fingerprint
  and the hash it ended at; record it there in the commit that shows the reference check passing on it.
- reference state, everywhere: the final policy within a tolerance of tests/data/policy_pins.npz, picked from
  measurement (`tests.pinned_runs.TOLERANCES`); the last tests show that a change of rounding passes it and a change
  of the math fails it.

The in-process loop computes the flow's weights bit for bit (tests/flows/test_train_control.py), so this pins the
flow too. A change that means to alter the math updates the hashes and the reference (`python -m tests.pinned_runs`)
in the same commit and says why.
"""
from __future__ import annotations

import pytest

from tests.fingerprint import describe, fingerprint_key
from tests.pinned_runs import PINS, TOLERANCES, PinnedRun, deviations, load_reference, run_pin, violations

PINNED_SHA256 = {
    "tiny": {
        "amd-f26m2-avx512-559f12ac": "47cadb5b294147fd14905eb2bb00366cc71b017519bd7edd8d3464a3a536ae1e",
    },
    "tiny-overlap-3": {
        "amd-f26m2-avx512-559f12ac": "6538db77eb8b19be13250c3bb2b796c248c167ab59ce3ab052e4164173b063ef",
    },
}
"""Each pin's final policy sha256, per fingerprint key of the machine it was recorded on."""

_runs: dict[str, PinnedRun] = {}


def _pinned_run(name: str) -> PinnedRun:
    """The pinned run, trained once per session for both checks."""
    if name not in _runs:
        _runs[name] = run_pin(name)
    return _runs[name]


@pytest.mark.parametrize("name", PINS)
def test_pinned_run_keeps_its_exact_bits_where_they_were_recorded(name: str) -> None:
    run, recorded, key = _pinned_run(name), PINNED_SHA256[name], fingerprint_key()
    if key not in recorded:
        pytest.skip(f"{name}: exact bits recorded on {', '.join(recorded)}; this machine is {key} ({describe()}) and "
                    f"ended at {run.policy_sha256}. The reference-state check covers it; to pin its bits too, add "
                    f"them under {key!r} in the commit that shows that check passing here")
    assert run.policy_sha256 == recorded[key], (
        f"{name}: on {key}, where {recorded[key]} was recorded, the run ended at {run.policy_sha256}")


@pytest.mark.parametrize("name", PINS)
def test_pinned_run_ends_near_its_reference_state(name: str) -> None:
    reference, meta = load_reference()
    outside = violations(_pinned_run(name).tensors, reference[name], TOLERANCES[name])
    assert not outside, (f"{name} on {fingerprint_key()} ({describe()}) left the reference recorded on "
                         f"{meta['fingerprint_key']}: " + "; ".join(outside))


def test_reference_was_recorded_from_the_pinned_bits() -> None:
    """The stored reference and the pinned hashes describe the same runs (re-record both together)."""
    _, meta = load_reference()
    for name in PINS:
        assert PINNED_SHA256[name].get(meta["fingerprint_key"]) == meta["policy_sha256"][name], name


def test_reference_check_tolerates_a_change_of_rounding() -> None:
    """Two torch threads split the sums differently (different bits on the recorded machine); the check holds."""
    reference, meta = load_reference()
    run = run_pin("tiny", torch_threads=2)
    assert not violations(run.tensors, reference["tiny"], TOLERANCES["tiny"])
    if fingerprint_key() == meta["fingerprint_key"]:
        assert run.policy_sha256 != meta["policy_sha256"]["tiny"], "2 threads no longer change the bits here"


def _changed_math(name: str) -> dict:
    """A small change of the math each pin must notice: "tiny" a learning rate 1% higher, the overlapped run
    without its overlap (every collection acting with the fresh policy)."""
    if name == "tiny":
        from rl_core.config.presets import build_control_config

        learning_rate = build_control_config("tiny", run_name="pin").algorithm.learning_rate
        return {"hyperparameters": {"learning_rate": learning_rate * 1.01}}
    return {"overlap": False}


@pytest.mark.parametrize("name", PINS)
def test_reference_check_catches_a_change_of_the_math(name: str) -> None:
    """Both measures leave the tolerance, each by more than twice (measured 6-47x on the recorded machine)."""
    reference, _ = load_reference()
    found = deviations(run_pin(name, **_changed_math(name)).tensors, reference[name])
    tolerance = TOLERANCES[name]
    assert max(v for v, _ in found.values()) > 2 * tolerance.values
    assert max(s for _, s in found.values()) > 2 * tolerance.stats
