"""A store written by an older commit (tests/checkpoint/data/, made by make_legacy_store.py) still loads exactly,
verifies clean, and today's code, with embedding off, writes the very same chunk objects and manifests: the on-disk
format has moved only in the commit markers, which now record their manifest's sha256 where the legacy store's are
empty, and in schema 4's additions (embedded objects, chained chunks; test_embedded.py, test_chains.py)."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest
import zstandard

from rl_core.checkpoint import CheckpointStore
from rl_core.checkpoint.cli import main
from tests.checkpoint.data.make_legacy_store import write_store

DATA = Path(__file__).parent / "data"
STORE = DATA / "store-2455d0d"
EXPECTED = json.loads((DATA / "store-2455d0d.json").read_text())
#: the codecs the legacy store was built to contain; losing one from it would silently stop covering it
LEGACY_CODECS = {"full", "diff", "xor", "rows", "same"}


@pytest.fixture
def legacy_url(tmp_path: Path) -> str:
    """A private copy of the shipped store, so no test can change the committed data."""
    shutil.copytree(STORE, tmp_path / "store")
    return f"file://{tmp_path}/store"


def _manifests(root: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in sorted((root / "versions").glob("*.json"))}


def test_every_version_loads_with_the_recorded_bytes_dtype_shape_and_meta(legacy_url: str) -> None:
    store = CheckpointStore(legacy_url)
    assert store.versions() == sorted(int(v) for v in EXPECTED["versions"])
    for v, expected in EXPECTED["versions"].items():
        snap = CheckpointStore(legacy_url).load(int(v))  # a fresh store each time: nothing cached from a commit
        assert snap.tensors.keys() == expected["tensors"].keys(), v
        for name, exp in expected["tensors"].items():
            arr = snap.tensors[name]
            assert (arr.dtype.str, list(arr.shape)) == (exp["dtype"], exp["shape"]), (v, name)
            assert hashlib.sha256(arr.tobytes()).hexdigest() == exp["sha256"], (v, name)
            assert snap.logical_dtypes.get(name) == exp["logical_dtype"], (v, name)
        assert json.dumps(snap.meta, sort_keys=True) == json.dumps(expected["meta"], sort_keys=True), v  # NaN too


def test_the_shipped_manifests_use_every_codec_and_two_bases() -> None:
    manifests = _manifests(STORE)
    codecs = {c["codec"] for m in manifests.values() for e in m["tensors"].values() for c in e["chunks"]}
    assert codecs == LEGACY_CODECS
    assert {m["schema_version"] for m in manifests.values()} == {3}
    assert [v for v, m in manifests.items() if m["base"] is None] == [0, 3]
    rows = [c for m in manifests.values() for e in m["tensors"].values() for c in e["chunks"] if c["codec"] == "rows"]
    assert {c["row_bytes"] for c in rows} == {64}


def test_verify_reports_the_legacy_store_clean(legacy_url: str) -> None:
    report = CheckpointStore(legacy_url).verify()
    assert report == {"checked": [0, 1, 2, 3, 4], "errors": {}}
    out = io.StringIO()
    assert main(["verify", legacy_url], out=out) == 0
    assert out.getvalue().count(": ok") == 5


def test_a_delta_committed_on_top_of_the_legacy_store_restores(legacy_url: str) -> None:
    store = CheckpointStore(legacy_url)
    snap = store.load()
    new = {k: a.copy() for k, a in snap.tensors.items()}
    new["emb"][5] += 1
    v = store.commit(new, {"on": "legacy"}, logical_dtypes=snap.logical_dtypes)
    assert store.manifest(v)["base"] == 3
    got = CheckpointStore(legacy_url).load(v).tensors
    assert all(got[k].tobytes() == a.tobytes() for k, a in new.items())


def test_todays_code_writes_the_same_manifests_and_objects(tmp_path: Path) -> None:
    """Same states, same settings (no embedding) -> the same chunk objects and manifests (but for the creation
    time). Compressed bytes depend on zstd's own version, so this holds only under the zstandard that wrote the
    store."""
    if zstandard.__version__ != EXPECTED["zstandard"]:
        pytest.skip(f"the store was compressed by zstandard {EXPECTED['zstandard']}, this is {zstandard.__version__}")
    expected = write_store(f"file://{tmp_path}/again", embed_bytes=0)
    assert json.dumps(expected["versions"], sort_keys=True) == json.dumps(EXPECTED["versions"], sort_keys=True)
    today, legacy = _files(tmp_path / "again"), _files(STORE)
    markers = sorted(name for name in legacy if name.endswith(".commit"))
    assert markers and all(legacy[name] == b"" for name in markers)
    for name in markers:
        manifest = (tmp_path / "again" / name).with_suffix(".json").read_bytes()
        assert json.loads(today.pop(name)) == {"manifest_sha256": hashlib.sha256(manifest).hexdigest()}
        del legacy[name]
    assert today == legacy


def _files(root: Path) -> dict[str, bytes]:
    """Every file of a store by relative path, with the manifests' creation times blanked."""
    return {
        str(p.relative_to(root)): re.sub(rb'"created":"[^"]*"', b'"created":""', p.read_bytes())
        for p in root.rglob("*") if p.is_file()
    }
