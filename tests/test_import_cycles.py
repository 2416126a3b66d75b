"""Zero import cycles among the project's modules, counting every import: deferred ones inside functions,
`TYPE_CHECKING` ones, and the package `__init__` that importing a submodule runs first.

import-linter's contracts (tests/test_layering.py) say which way imports point between layers; this test says that
no chain of imports, inside a layer or across, comes back to where it started. It reads the sources with `ast`, so
nothing is imported and a cycle hidden behind a deferred import is found too. The last test shows it can fail.
"""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"rl_core": "rl_core", "gymflow_kernels": "kernels/gymflow_kernels", "tasks": "tasks", "flows": "flows"}


def project_modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the project's packages under `root`."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in (root / folder).rglob("*.py"):
            parts = [package, *path.relative_to(root / folder).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `module` imports anywhere in its source, with the packages whose `__init__` each import
    runs first (but not `module`'s own packages, already being imported when it runs)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".")
            else:
                base = node.module
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            parts = name.split(".") if name else []
            targets.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
    return {t for t in targets if t in modules and t != module and not module.startswith(t + ".")}


def cycles(root: Path) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    modules = project_modules(root)
    graph = {m: sorted(imported(m, p, modules)) for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(ROOT) == []


def test_a_deferred_import_that_closes_a_loop_is_found(tmp_path: Path) -> None:
    for folder in PACKAGES.values():
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    seeding = tmp_path / "rl_core" / "seeding.py"
    seeding.write_text(seeding.read_text() + "\n\ndef _probe():\n    from rl_core.algos.base import Spaces  # noqa\n")
    (found,) = cycles(tmp_path)
    assert "rl_core.seeding" in found and "rl_core.algos" in found  # through the package's __init__
