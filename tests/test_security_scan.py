"""Nothing read from a store or a config is ever unpickled or executed: an AST scan of the code for pickle and its
kin, torch.load without weights_only=True, eval/exec and unsafe YAML. The one exec, the kernel sandbox, runs
proposals in a confined subprocess (kernels/gymflow_kernels/proposers.py) and is listed here with that reason."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ["rl_core", "kernels/gymflow_kernels", "flows", "tasks", "bench", "examples", "docs"]
UNSAFE_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
ALLOWED = {("kernels/gymflow_kernels/sandbox.py", "exec"): "runs a kernel proposal in a confined subprocess"}


def _findings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNSAFE_MODULES:
            found.append((node.lineno, f"from {node.module} import"))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            keywords = {k.arg: k.value for k in node.keywords}
            if isinstance(func, ast.Name) and name in ("eval", "exec"):
                found.append((node.lineno, name))
            elif owner == "torch" and name == "load":
                safe = keywords.get("weights_only")
                if not (isinstance(safe, ast.Constant) and safe.value is True):
                    found.append((node.lineno, "torch.load without weights_only=True"))
            elif owner == "yaml" and name in ("load", "unsafe_load", "full_load", "load_all"):
                loader = keywords.get("Loader")
                if name != "load" or not (isinstance(loader, ast.Attribute) and loader.attr in ("SafeLoader",
                                                                                                  "CSafeLoader")):
                    found.append((node.lineno, f"yaml.{name} without SafeLoader"))
            elif owner in UNSAFE_MODULES and name in ("load", "loads"):
                found.append((node.lineno, f"{owner}.{name}"))
    return found


def test_no_pickle_unsafe_load_or_exec_in_the_code() -> None:
    bad = []
    for folder in SCANNED:
        assert (ROOT / folder).is_dir(), f"{folder} is gone: a scan of nothing would pass"  # a moved package
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            bad += [f"{rel}:{line}: {what}" for line, what in _findings(path) if (rel, what) not in ALLOWED]
    assert not bad, "unsafe deserialization or execution:\n" + "\n".join(bad)


@pytest.mark.parametrize("source, what", [
    ("import pickle\npickle.loads(b'')", "import pickle"),
    ("import torch\ntorch.load('x')", "torch.load without weights_only=True"),
    ("import yaml\nyaml.load(s)", "yaml.load without SafeLoader"),
    ("eval('1')", "eval"),
])
def test_the_scan_finds_what_it_looks_for(tmp_path, source: str, what: str) -> None:
    path = tmp_path / "m.py"
    path.write_text(source)
    assert what in [w for _, w in _findings(path)]
    path.write_text("import torch, yaml\ntorch.load('x', weights_only=True)\nyaml.safe_load(s)\n")
    assert _findings(path) == []
