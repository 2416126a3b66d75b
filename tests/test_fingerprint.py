"""The machine fingerprint that exact-bit pins are keyed by: stable on one machine, changed by what changes the bits."""
from __future__ import annotations

import pytest

from tests.fingerprint import fingerprint_key, machine_fingerprint

FIELDS = {"cpu_vendor": "GenuineIntel", "cpu_family": "6", "cpu_model": "143", "cpu_model_name": "Intel Xeon",
          "torch": "2.13.0+cpu", "torch_isa": "AVX512", "blas": "mkl", "onednn": "v3.12.0", "mkl_path": "x",
          "onednn_isa": "y", "numpy": "2.4.6", "numpy_simd": "X86_V3", "mujoco": "4.0.1", "path_settings": "none"}


def test_two_reads_on_one_machine_agree() -> None:
    """Read twice from scratch (each probes MKL and oneDNN in a fresh process): the same fields, the same key."""
    first, second = machine_fingerprint.__wrapped__(), machine_fingerprint.__wrapped__()
    assert first == second and fingerprint_key(first) == fingerprint_key(second)
    assert first["torch_isa"] and first["cpu_vendor"]


def test_the_key_names_the_cpu_and_changes_with_every_field() -> None:
    key = fingerprint_key(FIELDS)
    assert key.startswith("intel-f6m143-avx512-") and key == fingerprint_key(dict(FIELDS))
    assert all(fingerprint_key({**FIELDS, field: "other"}) != key for field in FIELDS)


def test_a_setting_that_changes_the_code_path_changes_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """MKL_CBWR=AVX2 changed the pinned run's bits on the AMD EPYC the pins were recorded on."""
    monkeypatch.delenv("MKL_CBWR", raising=False)
    here = machine_fingerprint.__wrapped__()
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    held = machine_fingerprint.__wrapped__()
    assert "MKL_CBWR=AVX2" in held["path_settings"].split(",") and fingerprint_key(held) != fingerprint_key(here)
