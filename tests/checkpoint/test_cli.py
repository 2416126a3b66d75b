"""python -m rl_core.checkpoint: ls, show, verify, gc, export (run in-process through main(argv))."""

from __future__ import annotations

import io
import json

import fsspec
import numpy as np
import pytest

from rl_core.checkpoint import CheckpointStore
from rl_core.checkpoint.cli import main


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out=out), out.getvalue()


@pytest.fixture
def run_url(url: str) -> str:
    rng = np.random.default_rng(0)
    store = CheckpointStore(url, full_every=3)
    x = rng.standard_normal(3000).astype(np.float32)
    emb = rng.standard_normal((500, 8)).astype(np.float32)
    for i in range(5):
        x = x.copy()
        x[:10] += 1
        emb = emb.copy()
        emb[i] += 1
        store.commit({"x": x, "emb": emb}, {"i": i, "lr": 3e-4})
    return url


def test_ls_lists_versions_with_sizes_and_codecs(run_url: str) -> None:
    code, text = _run(["ls", run_url])
    lines = text.strip().splitlines()
    assert code == 0 and len(lines) == 6 and "codecs" in lines[0]
    assert lines[1].split()[:2] == ["0", "full"] and lines[2].split()[:2] == ["1", "0"]
    assert "full=2" in lines[1] and ("xor=" in lines[2] or "rows=" in lines[2])


def test_show_prints_the_manifest_summary(run_url: str) -> None:
    code, text = _run(["show", run_url, "4"])
    assert code == 0 and "version 4" in text and "base 3" in text and "emb: <f4 (500, 8)" in text
    assert '"lr": 0.0003' in text


def test_verify_passes_then_fails_with_exit_1_on_corruption(run_url: str, capsys) -> None:
    assert _run(["verify", run_url]) == (0, "".join(f"version {v}: ok\n" for v in range(5)))
    store = CheckpointStore(run_url)
    sha = store.manifest(3)["tensors"]["x"]["chunks"][0]["chunk"]
    fs, root = fsspec.core.url_to_fs(run_url)
    fs.pipe_file(f"{root.rstrip('/')}/chunks/{sha[:2]}/{sha}", b"bitrot")
    code, text = _run(["verify", run_url])
    assert code == 1 and "version 2: ok" in text and "version 3: FAILED" in text and "version 4: FAILED" in text
    assert sha in capsys.readouterr().err
    assert _run(["verify", run_url, "1"])[0] == 0
    assert _run(["verify", run_url, "3"])[0] == 1


def test_gc_applies_the_policy(run_url: str) -> None:
    code, text = _run(["gc", run_url, "--keep-last", "1", "--grace-s", "0"])
    report = json.loads(text)
    assert code == 0 and report["kept_versions"] == [3, 4] and report["deleted_versions"] == [0, 1, 2]
    assert CheckpointStore(run_url).versions() == [3, 4]


def test_export_writes_safetensors_and_meta_json(run_url: str, tmp_path) -> None:
    from safetensors.numpy import load_file

    out = tmp_path / "v2.safetensors"
    code, _ = _run(["export", run_url, "2", str(out)])
    assert code == 0
    snap = CheckpointStore(run_url).load(2)
    loaded = load_file(str(out))
    assert loaded.keys() == snap.tensors.keys()
    assert all(np.array_equal(loaded[k], v) for k, v in snap.tensors.items())
    assert json.loads(out.with_suffix(".json").read_text()) == {"version": 2, "meta": {"i": 2, "lr": 3e-4}}


def test_export_bf16_goes_through_torch(url: str, tmp_path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    w = torch.randn(4, 4).to(torch.bfloat16)
    CheckpointStore(url).commit({"w": w}, {})
    out = tmp_path / "bf.safetensors"
    assert _run(["export", url, "0", str(out)])[0] == 0
    assert torch.equal(load_file(str(out))["w"], w)


def test_errors_exit_1_and_bad_usage_exits_2(url: str, capsys) -> None:
    assert _run(["show", url, "7"])[0] == 1
    assert "no committed versions" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["frobnicate", url])
    assert info.value.code == 2
