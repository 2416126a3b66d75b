"""`mj_rnePostConstraint` for every simulation of a persistent `mujoco.batch.Batch`, in native code.

Contact forces (`cfrc_ext`, with `cacc`, `cfrc_int`) come from `mj_rnePostConstraint`, which `mujoco.batch`
never runs. Its C API can: `mjb_apply` runs a C function on each simulation's own MjData on the batch's thread
pool, but the Python API does not expose it. `post_constraint.c` is that C function plus a loop driver; it is
compiled once with the system C compiler into `$GYMFLOW_CACHE_DIR/native` (default: the user cache dir),
keyed by the source and MuJoCo version, and loaded with ctypes, so env workers need neither torch nor a build
step. The same MuJoCo function runs on the same MjData as a per-env `get_data` copy would give it, so the
results are bit-identical to that loop.

The `mjBatch*` is not exposed to Python either: it is read from the pybind11 wrapper (the wrapper's first
member) and used only after the batch itself confirms it (`mjb_nsim`, `mjb_persistent`, `mjb_state` match).
Anything missing (no compiler, no source, another wrapper layout) returns None from `NativePostConstraint.for_batch`,
with one warning, and the caller keeps its per-env loop.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import mujoco
import mujoco.batch
import numpy as np
import platformdirs

SOURCE = Path(__file__).with_name("post_constraint.c")
FIELDS = ("cacc", "cfrc_int", "cfrc_ext")  # the argument order of gymflow_post_constraint
_MUJOCO_DIR = Path(mujoco.__file__).parent
# a pybind11 instance is PyObject_HEAD, then the pointer to the C++ object
_PYBIND11_VALUE_OFFSET = object.__basicsize__


class NativePostConstraint:
    """Runs mj_rnePostConstraint on all of a batch's simulations and writes the requested fields' rows."""

    def __init__(self, library: ctypes.CDLL, batch: mujoco.batch.Batch, address: int,
                 outputs: dict[str, np.ndarray]) -> None:
        self._batch = batch  # keeps the mjBatch alive while `address` is used
        self._outputs = outputs  # keeps the arrays alive while their addresses are used
        self._run = library.gymflow_post_constraint
        self._args = (address, *(outputs[name].ctypes.data if name in outputs else None for name in FIELDS))

    @classmethod
    def for_batch(cls, batch: mujoco.batch.Batch, outputs: dict[str, np.ndarray]) -> NativePostConstraint | None:
        """A runner writing `outputs` (field -> (nsim, nbody, 6) float64, C-contiguous), or None (warned once)
        when the native path is unavailable here."""
        shape = (batch.nsim, batch.model.nbody, 6)
        for name, out in outputs.items():
            if name not in FIELDS or out.shape != shape or out.dtype != np.float64 or not out.flags.c_contiguous \
                    or not out.flags.writeable:
                raise ValueError(f"post-constraint output {name!r}: expected one of {FIELDS} as a writable "
                                 f"C-contiguous float64 array of shape {shape}, found {out.dtype} {out.shape}")
        library = _load_library(os.environ.get("CC"), os.environ.get("GYMFLOW_CACHE_DIR"))
        if library is None:
            return None
        address = _batch_address(library, batch)
        if address is None:
            _warn_once("mujoco.batch.Batch's wrapper does not hold its mjBatch where expected "
                       f"(MuJoCo {mujoco.__version__})")
            return None
        return cls(library, batch, address, outputs)

    def __call__(self) -> None:
        """Refresh the outputs from every simulation's MjData as the last call left it."""
        failed = self._run(*self._args)
        if failed:
            ids = np.flatnonzero(self._batch.status)
            raise mujoco.batch.SimulationError(ids, self._batch.error(int(ids[0])), self._batch.nsim)


def _batch_address(library: ctypes.CDLL, batch: mujoco.batch.Batch) -> int | None:
    """The `mjBatch*` behind `batch`, or None; each pointer is checked readable before it is followed, so a
    wrapper of another layout is reported rather than crashing the process."""
    wrapper = getattr(batch, "_b", None)
    if wrapper is None or not batch.persistent:
        return None
    value = _read_pointer(id(wrapper) + _PYBIND11_VALUE_OFFSET)
    address = _read_pointer(value) if value else None
    if not address or _read_pointer(address, 256) is None:  # mjb_* read the first bytes of the struct
        return None
    matches = library.gymflow_batch_matches(address, batch.nsim, batch.state.ctypes.data)
    return address if matches else None


def _read_pointer(address: int, readable: int = 8) -> int | None:
    """The pointer stored at `address`, or None if `readable` bytes there cannot be read (no segfault:
    /proc/self/mem reports unmapped memory as an error)."""
    try:
        with open("/proc/self/mem", "rb", buffering=0) as mem:
            mem.seek(address)
            raw = mem.read(readable)
    except (OSError, ValueError, OverflowError):
        return None
    return int.from_bytes(raw[:8], "little") if len(raw) == readable else None


@functools.cache
def _load_library(compiler: str | None, cache_dir: str | None) -> ctypes.CDLL | None:
    """post_constraint.c built for this MuJoCo (from the cache when built before); None, warned, if impossible."""
    libmujoco = sorted(_MUJOCO_DIR.glob("libmujoco.so*"))
    compiler = compiler or shutil.which("cc") or shutil.which("gcc")
    if not SOURCE.is_file() or not libmujoco or not compiler:
        missing = "a C compiler (install gcc or set CC)" if not compiler else f"{SOURCE.name} or libmujoco"
        _warn_once(f"no {missing} found")
        return None
    built_for = f"{mujoco.__version__}\0{_MUJOCO_DIR}\0{compiler}\0{platform.machine()}"
    key = hashlib.sha256(SOURCE.read_bytes() + built_for.encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir else Path(platformdirs.user_cache_dir("gymflow"))
    target = root / "native" / f"post_constraint-{key}.so"
    if not target.exists():
        try:
            _compile(compiler, libmujoco[0], target)
        except (OSError, subprocess.SubprocessError) as exc:
            _warn_once(f"building {SOURCE.name} with {compiler} failed: {exc}")
            return None
    try:
        library = ctypes.CDLL(str(target))
    except OSError as exc:  # e.g. a cache dir shared with a machine of another architecture
        _warn_once(f"loading {target} failed: {exc}")
        return None
    library.gymflow_post_constraint.argtypes = [ctypes.c_void_p] * 4
    library.gymflow_post_constraint.restype = ctypes.c_int
    library.gymflow_batch_matches.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    library.gymflow_batch_matches.restype = ctypes.c_int
    return library


def _compile(compiler: str, libmujoco: Path, target: Path) -> None:
    """Build into a temporary name, then rename: workers starting together never load half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".post_constraint.", suffix=".so")
    os.close(fd)
    command = [compiler, "-O2", "-shared", "-fPIC", f"-I{_MUJOCO_DIR / 'include'}", str(SOURCE), "-o", tmp,
               f"-L{libmujoco.parent}", f"-l:{libmujoco.name}", f"-Wl,-rpath,{libmujoco.parent}"]
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise subprocess.SubprocessError(done.stderr.strip()[-2000:] or f"exit status {done.returncode}")
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)


@functools.cache
def _warn_once(problem: str) -> None:
    warnings.warn(f"native mj_rnePostConstraint unavailable: {problem}; contact forces (Ant, Humanoid) fall back "
                  "to a per-env Python loop: the same numbers, but Ant and Humanoid simulate slower",
                  RuntimeWarning, stacklevel=4)
