"""The pinned tiny runs, the small reference of their final policy that every machine is compared with, and the
comparison of two runs whose bits agree only on some machines.

A run's exact bits hold only on the machine fingerprint they were recorded on (tests/fingerprint.py): eager float
sums change with the CPU's code paths. Its final policy's values hold everywhere within a tolerance, so the
reference keeps, per `model.` tensor, the values (all of a small tensor, 256 evenly spaced ones of a larger one)
and two statistics of the whole tensor (mean, root mean square); `deviations` measures both against the tensor's
largest stored magnitude. Stored as .npz of plain arrays (read with allow_pickle=False), 28 KB.

``python -m tests.pinned_runs`` re-records tests/data/policy_pins.npz on this machine: only for a change that
means to alter the math, in the commit that says why.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fingerprint import fingerprint_key, machine_fingerprint

REFERENCE_FILE = Path(__file__).parent / "data" / "policy_pins.npz"

PINS: dict[str, dict[str, Any]] = {
    "tiny": {},
    "tiny-overlap-3": {"overlap": True, "iterations": 3},
}
"""Each pinned run: launch options over the "tiny" preset (seed 0, one rank, reference kernels)."""

FULL_UP_TO = 512  # a tensor of at most this many elements is kept whole
SAMPLES = 256  # evenly spaced values kept of a larger one


@dataclass(frozen=True)
class Tolerance:
    """Largest allowed |found - reference| / (the tensor's largest stored |reference|), for values and for stats."""

    values: float
    stats: float


TOLERANCES = {
    "tiny": Tolerance(values=1e-3, stats=2e-4),
    "tiny-overlap-3": Tolerance(values=0.1, stats=1.5e-2),
}
"""Per pin (and for other runs of its length: 2 and 3 iterations of the tiny preset), measured on
amd-f26m2-avx512-559f12ac as the largest deviation over the `model.` tensors, values / stats.

Changes of rounding only, 14 runs (each weight moved one ulp at the start, 8 seeds; MKL_CBWR=AVX2 and =COMPATIBLE;
torch's AVX2 kernels with MKL and numpy held to AVX2; tuned kernels on 1 and 2 threads; 2 torch threads): within
1.1e-4 / 2.0e-5 for "tiny"; within 2.1e-2 / 2.7e-3 for "tiny-overlap-3", whose third collection amplifies them
(chaotic contacts). Changes of the math went past: "tiny" learning rate x1.001 1.1e-3 / 1.0e-3, x1.01
1.4e-2 / 9.4e-3, gamma 0.991 1.1e-2 / 1.1e-3, ent_coef 1e-3 4.0e-3 / 3.1e-3; "tiny-overlap-3" without the overlap
0.62 / 9.0e-2, gae_lambda 0.96 0.12 / 2.2e-2 (its rounding hides a learning rate x1.01: 1.1e-2 / 1.0e-2). Torch's
scalar kernels (ATEN_CPU_CAPABILITY=default, as on a CPU without AVX2) moved "tiny" 4.6e-3 / 4.7e-4: outside, as
another elementary-function library; no x86 machine CI runs on lacks AVX2."""

SPLIT_BITS_RECORDED_ON = frozenset({"amd-f26m2-avx512-559f12ac"})
"""Machines (fingerprint keys) where a run was seen to compute the same bits however its envs' batches are split
(2 workers of 4 envs or 1 of 8; rollouts of 4 rows, minibatches of 32): tests/core/test_env_split.py,
tests/core/test_overlap.py and tests/flows/test_train_control.py hold bit for bit there. MKL's AVX2 and COMPATIBLE
code paths (MKL_CBWR) break it on the same CPU: 3 iterations split apart by 6.9e-3 / 4.4e-4 (values / stats), where
another noise stream moves them 1.9 / 0.34."""


@dataclass
class PinnedRun:
    """What a run ended at: the policy hash and the final `model.` tensors (and the run's own result)."""

    policy_sha256: str
    tensors: dict[str, np.ndarray]
    result: Any = None


def train_keeping_state(cfg: Any, torch_threads: int = 1) -> PinnedRun:
    """`train_in_process(cfg)`, with the final `model.` tensors the run's policy hash is taken of."""
    from rl_core.algos.ppo.in_process import train_in_process

    result = train_in_process(cfg, torch_threads=torch_threads)
    return PinnedRun(result.policy_sha256, {k: np.array(v) for k, v in result.policy.items()}, result)


def run_pin(name: str, *, torch_threads: int = 1, hyperparameters: dict[str, Any] | None = None,
            **options: Any) -> PinnedRun:
    """Train the pinned run `name` (with `options`/`hyperparameters` over its own: a changed run) in this process."""
    from rl_core.config.presets import build_control_config

    cfg = build_control_config("tiny", run_name="pin", seed=0, num_ranks=1, hyperparameters=hyperparameters,
                               **{**PINS[name], **options})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GYMFLOW_KERNELS", "reference")
        return train_keeping_state(cfg, torch_threads)


def reduce(tensor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values kept, [mean, root mean square] of the whole tensor)."""
    flat = np.asarray(tensor, dtype=np.float32).ravel()
    kept = flat if flat.size <= FULL_UP_TO else flat[np.linspace(0, flat.size - 1, SAMPLES).round().astype(int)]
    whole = flat.astype(np.float64)
    return kept.copy(), np.array([whole.mean(), np.sqrt(np.mean(whole * whole))])


def deviations(tensors: dict[str, np.ndarray], reference: dict[str, tuple[np.ndarray, np.ndarray]]
               ) -> dict[str, tuple[float, float]]:
    """Per reference tensor: (values', stats') largest |found - reference| over its largest stored |reference|."""
    missing = sorted(set(reference) - set(tensors))
    assert not missing, f"the run has no tensors {missing}: re-record the reference (python -m tests.pinned_runs)"
    out = {}
    for name, (ref_values, ref_stats) in reference.items():
        values, stats = reduce(tensors[name])
        assert values.shape == ref_values.shape, f"{name}: {values.shape} values, the reference has {ref_values.shape}"
        scale = float(np.abs(ref_values).max()) or 1.0
        out[name] = (float(np.abs(values - ref_values).max()) / scale, float(np.abs(stats - ref_stats).max()) / scale)
    return out


def violations(tensors: dict[str, np.ndarray], reference: dict[str, tuple[np.ndarray, np.ndarray]],
               tolerance: Tolerance) -> list[str]:
    """The tensors outside `tolerance`, each with its deviations (empty: within)."""
    return [f"{name}: values {v:.2e} (tolerance {tolerance.values:g}), stats {s:.2e} (tolerance {tolerance.stats:g})"
            for name, (v, s) in deviations(tensors, reference).items()
            if v > tolerance.values or s > tolerance.stats]


def as_reference(tensors: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A run's tensors in the reference's form (`reduce`d), to compare another run with."""
    return {name: reduce(value) for name, value in tensors.items()}


def split_differences(whole: PinnedRun, split: PinnedRun, tolerance: Tolerance) -> list[str]:
    """How a run whose batches were split otherwise differs from `whole`: in its bits on a machine where split runs
    were seen to keep them (`SPLIT_BITS_RECORDED_ON`), else outside `tolerance` (empty: no difference)."""
    key = fingerprint_key()
    if key in SPLIT_BITS_RECORDED_ON:
        return [] if split.policy_sha256 == whole.policy_sha256 else [
            f"policy {split.policy_sha256} != {whole.policy_sha256} on {key}, where split runs kept their bits"]
    return violations(split.tensors, as_reference(whole.tensors), tolerance)


def load_reference(path: Path = REFERENCE_FILE) -> tuple[dict[str, dict[str, tuple[np.ndarray, np.ndarray]]], dict]:
    """({pin: {tensor: (values, stats)}}, meta: where and at what hashes it was recorded)."""
    with np.load(path, allow_pickle=False) as stored:
        meta = json.loads(str(stored["meta"]))
        pins: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        for key in stored.files:
            if key != "meta":
                pin, tensor, part = key.split("/")
                entry = pins.setdefault(pin, {}).setdefault(tensor, [None, None])
                entry[0 if part == "values" else 1] = stored[key]
    return {pin: {t: (v, s) for t, (v, s) in tensors.items()} for pin, tensors in pins.items()}, meta


def record(path: Path = REFERENCE_FILE) -> dict:
    """Run every pin here and write its reference; returns the meta written (fingerprint, hashes)."""
    arrays: dict[str, np.ndarray] = {}
    hashes = {}
    for pin in PINS:
        run = run_pin(pin)
        hashes[pin] = run.policy_sha256
        for tensor, value in sorted(run.tensors.items()):
            arrays[f"{pin}/{tensor}/values"], arrays[f"{pin}/{tensor}/stats"] = reduce(value)
    meta = {"fingerprint_key": fingerprint_key(), "fingerprint": machine_fingerprint(), "policy_sha256": hashes}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, meta=np.array(json.dumps(meta, sort_keys=True)), **arrays)
    return meta


if __name__ == "__main__":
    import os
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gymflow-pins-") as cache:  # the tuner's winners stay out of the user's
        os.environ["GYMFLOW_CACHE_DIR"] = cache
        print(json.dumps(record(), indent=1))
