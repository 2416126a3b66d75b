"""An env step of every simulation of a persistent `mujoco.batch.Batch` in one native pass.

`Batch.step` runs the substeps; a task's contact forces (`cfrc_ext`, with `cacc`, `cfrc_int`) need
`mj_rnePostConstraint` after them, which `mujoco.batch` never runs; and the fields a task reads are copied out of
every MjData (by the batch into its outputs, then by the env into its arrays). Done as separate calls, each is a pass
over the batch's thread pool; in one pass the fields are copied once, straight into the env's arrays. The saving
is small, since a second pass is cheap while the pool's worker still spins: a light task's step (HalfCheetah) gains
a little, heavier ones (Ant, Humanoid) neither gain nor lose measurably. Its C API can do all three in one:
`mjb_apply` runs a C function on each simulation's own MjData on the batch's thread pool, loading and saving its
state row as `mjb_step` does, but the Python API does not expose it. `native_step.c` is that function (the same
`mj_step` calls, then `mj_rnePostConstraint` where asked, then the copies) plus a driver; it is compiled once with the
system C compiler into `$GYMFLOW_CACHE_DIR/native` (default: the user cache dir), keyed by the source and MuJoCo
version, and loaded with ctypes, so env workers need neither torch nor a build step. The same MuJoCo functions run
on the same MjData as `Batch.step` and a per-env `get_data` copy would give them, so the results are bit-identical.

The `mjBatch*` is not exposed to Python either: it is read from the pybind11 wrapper (the wrapper's first
member) and used only after the batch itself confirms it (`mjb_nsim`, `mjb_persistent`, `mjb_state` match).
Anything missing (no compiler, no source, another wrapper layout) returns None from `NativeStep.for_batch`,
with one warning, and the caller keeps `Batch.step` and a per-env loop for the contact forces.

What this module assumes of the Python objects it touches (MuJoCo 4.0's `mujoco.batch`, pinned `<4.1`):
- `batch._b` (private) is the pybind11 instance of the C++ batch class; a pybind11 instance is `PyObject_HEAD`
  (`object.__basicsize__` bytes) then the pointer to its C++ object, and that object's first member is the
  `mjBatch*`. Each pointer is checked readable (through /proc/self/mem) before it is followed, and the address is
  used only once `gymflow_batch_matches` confirms it against the public side below: a wrapper of another layout
  reads as unavailable instead of crashing the process.
- `batch.nsim`, `batch.persistent` and `batch.state` are the batch's own: `state` is a view of the mjBatch's state
  rows (its data pointer is `mjb_state`'s), not a copy. `batch.model` is the model every simulation was built from,
  `batch.status` / `batch.error(i)` report a failed simulation after a step.
- The batch outlives the stepper (it holds a reference) and keeps its simulations: nothing changes `nsim` or
  replaces the mjBatch after `for_batch`, and no other thread steps the batch during a call (ctypes releases the
  GIL; `mujoco.batch.Batch` is not thread-safe either).
- Each output array is an MjData field's rows, `(nsim, *field.shape)`, C-contiguous and writable (checked); the
  stepper holds a reference, so the addresses it gave the C code stay valid. The C code writes every row on every
  call, from the batch's threads.
`native_step_available()` checks all of it once (a build, a one-body batch found and stepped); on the reference
machine tests/test_fast_paths.py fails when it does not hold, instead of the warning and the slower fallback.
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

SOURCE = Path(__file__).with_name("native_step.c")
_MUJOCO_DIR = Path(mujoco.__file__).parent
# a pybind11 instance is PyObject_HEAD, then the pointer to the C++ object
_PYBIND11_VALUE_OFFSET = object.__basicsize__


class _Copy(ctypes.Structure):
    _fields_ = [("offset", ctypes.c_size_t), ("bytes", ctypes.c_size_t), ("out", ctypes.c_void_p)]


class _Step(ctypes.Structure):
    _fields_ = [("nstep", ctypes.c_int), ("post_constraint", ctypes.c_int), ("ncopy", ctypes.c_int),
                ("copies", ctypes.POINTER(_Copy))]


class NativeStep:
    """Steps all of a batch's simulations `nstep` substeps, runs mj_rnePostConstraint if asked, and writes the
    requested MjData fields' rows."""

    def __init__(self, library: ctypes.CDLL, batch: mujoco.batch.Batch, address: int, step: _Step,
                 copies: ctypes.Array, outputs: dict[str, np.ndarray]) -> None:
        self._batch = batch  # keeps the mjBatch alive while `address` is used
        self._outputs = outputs  # keeps the arrays alive while their addresses are used
        self._copies = copies  # keeps the copy table alive while `step` points at it
        self._step = step
        self._run = library.gymflow_step
        self._args = (address, ctypes.byref(step))

    @classmethod
    def for_batch(cls, batch: mujoco.batch.Batch, nstep: int, post_constraint: bool,
                  outputs: dict[str, np.ndarray]) -> NativeStep | None:
        """A stepper writing `outputs` (MjData field -> (nsim, *the field's shape), its dtype, C-contiguous) after
        each step, or None (warned once) when the native path is unavailable here; ValueError for an output that
        is not such an array (the native copies would write out of bounds)."""
        scratch = mujoco.MjData(batch.model)
        for name, out in outputs.items():
            field = getattr(scratch, name, None)
            shape = None if field is None else (batch.nsim, *field.shape)
            if shape is None or out.shape != shape or out.dtype != field.dtype or not out.flags.c_contiguous \
                    or not out.flags.writeable:
                raise ValueError(f"step output {name!r}: expected an MjData field as a writable C-contiguous "
                                 f"{getattr(field, 'dtype', 'float64')} array of shape {shape}, "
                                 f"found {out.dtype} {out.shape}")
        library = _load_library(os.environ.get("CC"), os.environ.get("GYMFLOW_CACHE_DIR"))
        if isinstance(library, str):
            _warn_once(library)
            return None
        address = _batch_address(library, batch)
        if address is None:
            _warn_once(_NO_MJBATCH)
            return None
        copies = (_Copy * max(len(outputs), 1))()
        for copy, (name, out) in zip(copies, outputs.items()):
            offset = library.gymflow_data_offset(name.encode())
            if offset < 0:
                raise ValueError(f"step output {name!r}: not an array field of this MuJoCo's mjData")
            copy.offset, copy.bytes, copy.out = offset, out.nbytes // batch.nsim, out.ctypes.data
        step = _Step(nstep, int(post_constraint), len(outputs), copies)
        return cls(library, batch, address, step, copies, outputs)

    def __call__(self) -> None:
        """One env step of every simulation; the outputs then hold the fields as the step left them."""
        failed = self._run(*self._args)
        if failed:
            ids = np.flatnonzero(self._batch.status)
            raise mujoco.batch.SimulationError(ids, self._batch.error(int(ids[0])), self._batch.nsim)


_NO_MJBATCH = f"mujoco.batch.Batch's wrapper does not hold its mjBatch where expected (MuJoCo {mujoco.__version__})"
# One free body: a step runs the whole pipeline (contacts aside) and moves it.
_PROBE_MODEL = "<mujoco><worldbody><body><freejoint/><geom size='.1'/></body></worldbody></mujoco>"


def native_step_available() -> bool:
    """Whether envs here step natively (else `Batch.step` and a per-env loop): see `native_step_problem`."""
    return native_step_problem() is None


def native_step_problem() -> str | None:
    """Why the native step is unavailable here, or None: native_step.c builds (or is in the cache) and loads, and on a
    one-body persistent batch the mjBatch is found where the module's docstring says and one native step moves it.
    Checked once per process (for this CC and GYMFLOW_CACHE_DIR)."""
    return _probe(os.environ.get("CC"), os.environ.get("GYMFLOW_CACHE_DIR"))


@functools.cache
def _probe(compiler: str | None, cache_dir: str | None) -> str | None:
    library = _load_library(compiler, cache_dir)
    if isinstance(library, str):
        return library
    model = mujoco.MjModel.from_xml_string(_PROBE_MODEL)
    batch = mujoco.batch.Batch(model, nsim=1, nthread=1, persistent=True)
    address = _batch_address(library, batch)
    if address is None:
        return _NO_MJBATCH
    step = _Step(1, 1, 0, None)  # one substep, mj_rnePostConstraint, nothing copied out
    if library.gymflow_step(address, ctypes.byref(step)) or batch.bind("time")[0] != model.opt.timestep:
        return f"a native step of a one-body batch failed or did not move it (MuJoCo {mujoco.__version__})"
    return None


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
def _load_library(compiler: str | None, cache_dir: str | None) -> ctypes.CDLL | str:
    """native_step.c built for this MuJoCo (from the cache when built before), or why it cannot be had."""
    libmujoco = sorted(_MUJOCO_DIR.glob("libmujoco.so*"))
    compiler = compiler or shutil.which("cc") or shutil.which("gcc")
    if not SOURCE.is_file() or not libmujoco or not compiler:
        missing = "a C compiler (install gcc or set CC)" if not compiler else f"{SOURCE.name} or libmujoco"
        return f"no {missing} found"
    built_for = f"{mujoco.__version__}\0{_MUJOCO_DIR}\0{compiler}\0{platform.machine()}"
    key = hashlib.sha256(SOURCE.read_bytes() + built_for.encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir else Path(platformdirs.user_cache_dir("gymflow"))
    target = root / "native" / f"native_step-{key}.so"
    if not target.exists():
        try:
            _compile(compiler, libmujoco[0], target)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"building {SOURCE.name} with {compiler} failed: {exc}"
    try:
        library = ctypes.CDLL(str(target))
    except OSError as exc:  # e.g. a cache dir shared with a machine of another architecture
        return f"loading {target} failed: {exc}"
    library.gymflow_step.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Step)]
    library.gymflow_step.restype = ctypes.c_int
    library.gymflow_data_offset.argtypes = [ctypes.c_char_p]
    library.gymflow_data_offset.restype = ctypes.c_long
    library.gymflow_batch_matches.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    library.gymflow_batch_matches.restype = ctypes.c_int
    return library


def _compile(compiler: str, libmujoco: Path, target: Path) -> None:
    """Build into a temporary name, then rename: workers starting together never load half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".native_step.", suffix=".so")
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
    warnings.warn(f"native env stepping unavailable: {problem}; envs step with Batch.step and contact forces "
                  "(Ant, Humanoid) come from a per-env Python loop: the same numbers, but slower",
                  RuntimeWarning, stacklevel=4)
