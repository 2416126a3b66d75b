"""This machine's numeric fingerprint: what decides the bits of an eager float computation here.

Exact-bit pins (a policy hash) hold only where the fingerprint equals the one they were recorded on: the CPU (vendor,
family, model) picks MKL's code path, torch's vector ISA picks its kernels, and the library versions pick the
kernels themselves. The fingerprint is read, never timed, so it is the same on every run on one machine.

``python -m tests.fingerprint`` prints the key and the fields, to record a pin on a new machine.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import subprocess
import sys

# Settings that change which code path MKL, oneDNN, torch or numpy takes (MKL_CBWR=AVX2 changed the pinned run's
# bits here).
_PATH_SETTINGS = ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                  "ATEN_CPU_CAPABILITY", "NPY_DISABLE_CPU_FEATURES", "NPY_ENABLE_CPU_FEATURES")

# One MKL sgemm and one oneDNN linear, run with both libraries' verbose logs on: their first lines name the code path
# each chose on this CPU (MKL: "... for Intel(R) 64 architecture <path>, Lnx <clock> ...").
_PROBE = """
import torch
a = torch.ones(16, 16)
torch.mm(a, a)
try:
    torch.ops.mkldnn._linear_pointwise(a, a, None, "none", [], "")
except (AttributeError, RuntimeError):
    pass
"""


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            block = f.read().split("\n\n")[0]
    except OSError:
        return {}
    fields = (line.split(":", 1) for line in block.splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in fields}


def _library_paths() -> dict[str, str]:
    """The code paths MKL and oneDNN report choosing on this CPU, from a short subprocess with their verbose logs on
    (the clock speed and thread counts in those lines are dropped: they change between runs)."""
    env = {**os.environ, "MKL_VERBOSE": "1", "ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": "1"}
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    mkl = re.search(r"^MKL_VERBOSE (.+?) for (.+?), Lnx", out, re.MULTILINE)
    onednn = re.search(r"^onednn_verbose,.*?info,cpu,isa:(.+)$", out, re.MULTILINE)
    return {"mkl_path": f"{mkl.group(1)}: {mkl.group(2)}" if mkl else "none",
            "onednn_isa": onednn.group(1).strip() if onednn else "none"}


@functools.cache
def machine_fingerprint() -> dict[str, str]:
    """What the bits of this machine's eager float sums depend on, as plain strings."""
    import mujoco
    import numpy
    import torch

    cpu = _cpuinfo()
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    onednn = re.search(r"MKL-DNN (v[\d.]+)", config)
    umath = getattr(getattr(numpy, "_core", None), "_multiarray_umath", None)  # numpy's SIMD dispatch (2.x)
    features = getattr(umath, "__cpu_features__", {})
    numpy_simd = [name for name in getattr(umath, "__cpu_dispatch__", ()) if features.get(name)]
    return {
        "cpu_vendor": cpu.get("vendor_id", platform.machine()),
        "cpu_family": cpu.get("cpu family", ""),
        "cpu_model": cpu.get("model", ""),
        "cpu_model_name": cpu.get("model name", platform.processor()),
        "torch": torch.__version__,
        "torch_isa": torch.backends.cpu.get_cpu_capability(),
        "blas": blas.group(1) if blas else "unknown",
        "onednn": onednn.group(1) if onednn and torch.backends.mkldnn.is_available() else "none",
        **_library_paths(),
        "numpy": numpy.__version__,
        "numpy_simd": ",".join(numpy_simd) or "none",
        "mujoco": mujoco.__version__,
        "path_settings": ",".join(f"{k}={os.environ[k]}" for k in _PATH_SETTINGS if os.environ.get(k)) or "none",
    }


def fingerprint_key(fingerprint: dict[str, str] | None = None) -> str:
    """A short, readable key of a fingerprint: vendor, family/model and torch's ISA, then a digest of every field
    (e.g. ``amd-f26m2-avx512-1a2b3c4d``)."""
    fp = machine_fingerprint() if fingerprint is None else fingerprint
    vendor = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}.get(fp["cpu_vendor"], fp["cpu_vendor"].lower())
    digest = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:8]
    return f"{vendor}-f{fp['cpu_family']}m{fp['cpu_model']}-{fp['torch_isa'].lower()}-{digest}"


def describe(fingerprint: dict[str, str] | None = None) -> str:
    """One line naming the fingerprint's fields, for skip and failure messages."""
    fp = machine_fingerprint() if fingerprint is None else fingerprint
    return ", ".join(f"{k}={v}" for k, v in fp.items())


if __name__ == "__main__":
    print(fingerprint_key())
    print(json.dumps(machine_fingerprint(), indent=1))
