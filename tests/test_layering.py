"""The layering, as import-linter contracts (`[tool.importlinter]` in pyproject.toml): rl_core and kernels never
import prefect, directly or through another module; kernels never imports rl_core, tasks or flows; tasks never
import flows; and every import points down the layers (flows, tasks, rl_core's sub-packages in order, kernels).

The first test checks today's code. The others prove the check can fail: they copy the four packages' sources and
the contracts into tmp_path, add one forbidden import, and expect exactly the contract it breaks to be reported.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info < (3, 11):  # import-linter 2.x needs 3.11 (pyproject's dev extra installs it from 3.11 on)
    pytest.skip("import-linter needs Python 3.11+", allow_module_level=True)

import tomllib  # noqa: E402 - after the version check

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"rl_core": "rl_core", "gymflow_kernels": "kernels/gymflow_kernels", "tasks": "tasks", "flows": "flows"}
"""Each package's folder in the repository (the kernels package sits in kernels/, which is not itself a package)."""
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def contract_names(root: Path) -> dict[str, str]:
    """Contract id -> name, as configured in `root`/pyproject.toml."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {contract["id"]: contract["name"] for contract in config["contracts"]}


def lint(root: Path) -> tuple[dict[str, str], str]:
    """Run lint-imports in `root`; each contract id -> "KEPT" or "BROKEN", and the whole output."""
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: pip install -e '.[dev]' installs import-linter"
    done = subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=root, capture_output=True, text=True,
                          timeout=120)
    output = done.stdout + done.stderr
    status = {}
    for contract_id, name in contract_names(root).items():
        match = re.search(rf"^{re.escape(name)} (KEPT|BROKEN)$", output, re.MULTILINE)
        assert match, f"no verdict for contract {name!r} (a configuration error?):\n{output}"
        status[contract_id] = match.group(1)
    assert (done.returncode == 0) == all(s == "KEPT" for s in status.values()), output
    return status, output


def test_todays_code_keeps_every_contract() -> None:
    status, output = lint(ROOT)
    assert set(status) == {"libraries-without-prefect", "kernels-stand-alone", "layers", "tasks-below-flows"}
    assert all(verdict == "KEPT" for verdict in status.values()), output


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The four packages' Python files and pyproject.toml, copied once; each package at the copy's top level, so that
    lint-imports, run there, reads the copy and not the installed (editable) kernels package."""
    root = tmp_path_factory.mktemp("layering-sources")
    keep_python = shutil.ignore_patterns("__pycache__", "*.pyc", "*.xml", "*.yaml", "*.json", "*.txt", "LICENSE*")
    for package, folder in PACKAGES.items():
        shutil.copytree(ROOT / folder, root / package, ignore=keep_python)
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_copy_alone_keeps_every_contract(sources: Path) -> None:
    """So that in the tests below the injected import, not the copying, is what breaks a contract."""
    status, output = lint(sources)
    assert all(verdict == "KEPT" for verdict in status.values()), output


VIOLATIONS = {
    "kernels imports prefect": ({"gymflow_kernels/registry.py": "import prefect"}, "libraries-without-prefect",
                                "gymflow_kernels.registry -> prefect"),
    "rl_core imports prefect": ({"rl_core/__init__.py": "from prefect import flow"}, "libraries-without-prefect",
                                "rl_core -> prefect"),
    "rl_core imports prefect through tasks": (
        {"tasks/_layering_probe.py": "import prefect", "rl_core/__init__.py": "import tasks._layering_probe"},
        "libraries-without-prefect", "tasks._layering_probe -> prefect"),
    "kernels imports rl_core": ({"gymflow_kernels/cache.py": "import rl_core"}, "kernels-stand-alone",
                                "gymflow_kernels.cache -> rl_core"),
    "tasks imports flows": ({"tasks/__init__.py": "import flows"}, ("tasks-below-flows", "layers"),
                            "tasks -> flows"),
    "config imports the runtime": ({"rl_core/config/common.py": "import rl_core.runtime.faults"}, "layers",
                                   "rl_core.config.common -> rl_core.runtime.faults"),
}


@pytest.mark.parametrize("violation", list(VIOLATIONS))
def test_an_injected_import_breaks_its_contract(violation: str, sources: Path, tmp_path: Path) -> None:
    added, broken, chain = VIOLATIONS[violation]
    root = tmp_path / "tree"
    shutil.copytree(sources, root)
    for relative, line in added.items():
        path = root / relative
        text = path.read_text() if path.exists() else ""
        path.write_text(f"{text}\n{line}  # injected by tests/test_layering.py\n")
    status, output = lint(root)
    broken = (broken,) if isinstance(broken, str) else broken
    assert all(status[contract] == "BROKEN" for contract in broken), output
    assert all(verdict == "KEPT" for contract, verdict in status.items() if contract not in broken), output
    assert chain in output, output
