"""The documentation: the site builds with `mkdocs build --strict` (a broken link, a missing page or an API
reference that no longer resolves fails), the generated CLI page lists every launch option, and README.md and the
docs pages name no repository file, module or test that does not exist.

What counts as a repository path (`stale_references`): in inline code, fenced code and link targets, a token whose
first folder is one of the repository's top-level entries, or that ends in a source or document extension, or a
bare root file name (`prefect.yaml`, `NOTES.md`); a dotted module of the project (`rl_core.config.control`,
`gymflow_kernels.dispatch`); a pytest node (`tests/test_cli.py::test_name`). Not counted: URLs, absolute and home
paths (`/usr/bin/chromium`, `~/.cache/...`), placeholders (`runs/<run>/...`) and what running gymflow creates
(`runs/`, `.venv/`, `.gymflow-ui/`, `site/`). CHANGELOG.md is left out: history names files that no longer exist.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
GENERATED = {ROOT / "docs" / "reference" / "cli.md"}  # written at build time by docs/hooks/cli_reference.py
MADE_BY_RUNNING = {"runs", ".venv", ".venv-vllm", ".gymflow-ui", "site", "build", ".pytest_cache", ".hypothesis"}
PATH_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".png", ".json", ".c", ".cpp", ".h", ".xml", ".txt", ".cfg",
                 ".sh", ".html"}
ROOT_FILE_SUFFIXES = {".md", ".yaml", ".yml", ".toml"}  # a bare name with these is a file at the root
MODULE_ROOTS = {"rl_core": "rl_core", "flows": "flows", "tasks": "tasks", "bench": "bench",
                "gymflow_kernels": "kernels/gymflow_kernels"}
MODULE = re.compile(rf"^({'|'.join(MODULE_ROOTS)})(\.[A-Za-z_][A-Za-z0-9_]*)+$")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _top_level(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()} - MADE_BY_RUNNING - {".git"}


def _source_files(root: Path) -> dict[str, list[Path]]:
    by_name: dict[str, list[Path]] = {}
    for folder in ("rl_core", "flows", "tasks", "kernels", "bench", "tests", "examples", "docs"):
        for path in (root / folder).rglob("*.py") if (root / folder).is_dir() else []:
            by_name.setdefault(path.name, []).append(path)
    return by_name


def _module_problem(dotted: str, root: Path) -> str | None:
    """None when `dotted` is a module of the project, or a name a module defines or imports; else what is missing."""
    parts = dotted.split(".")
    base = root / MODULE_ROOTS[parts[0]]
    found, depth = base, 1
    for i in range(1, len(parts)):
        package, module = found / parts[i], found / f"{parts[i]}.py"
        if module.is_file():
            found, depth = module, i + 1
            break
        if not (package / "__init__.py").is_file():
            break
        found, depth = package, i + 1
    rest = parts[depth:]
    if not rest:
        return None
    source_file = found if found.is_file() else found / "__init__.py"
    source = source_file.read_text() if source_file.is_file() else ""
    if re.search(rf"\b{re.escape(rest[0])}\b", source):
        return None
    return f"no module or name {'.'.join(parts[:depth + 1])}"


def _token_problem(token: str, root: Path, top: set[str], sources: dict[str, list[Path]]) -> str | None:
    """None when `token` names nothing in the repository or names something that exists; else what is missing."""
    token = token.lstrip("\"'(`").rstrip("\"'),;.:`").split("(")[0]
    if not token or token.startswith(("-", "/", "~", "#")) or "://" in token or re.search(r"[<>*{}$…]|\.\.\.", token):
        return None
    if MODULE.match(token):
        return _module_problem(token, root)
    path, _, node = token.removeprefix("./").partition("::")
    path = re.sub(r"\.py:[A-Za-z_]\w*$", ".py", path).rstrip(":")  # flows/train_control.py:train_control
    first, suffix = path.split("/")[0], Path(path).suffix
    if first in MADE_BY_RUNNING:
        return None
    if "/" in path:
        if first not in top and suffix not in PATH_SUFFIXES:
            return None  # gymflow/HalfCheetah-v5, train-control/train: names with a slash, not paths
        if not (root / path).exists():
            return f"{path} does not exist"
    elif suffix in ROOT_FILE_SUFFIXES or path == "Makefile":
        if not (root / path).exists():
            return f"{path} does not exist at the repository root"
    elif suffix == ".py":
        if path not in sources:
            return f"no file named {path} in the repository"
    else:
        return None
    for name in filter(None, (n.split("[")[0] for n in node.split("::"))):
        definition = rf"^\s*(async\s+)?(def|class)\s+{re.escape(name)}\b"
        if not re.search(definition, (root / path).read_text(), re.MULTILINE):
            return f"{path} has no test or class {name}"
    return None


def _link_problem(target: str, folder: Path, root: Path) -> str | None:
    target = target.split("#")[0]
    if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
        return None  # an anchor on the same page, a URL, mailto:, an absolute path
    resolved = (folder / target).resolve()
    if root not in resolved.parents and resolved != root:
        return None
    return None if resolved.exists() or resolved in GENERATED else f"link target {target} does not exist"


def stale_references(document: Path, root: Path = ROOT, links_from: Path | None = None) -> list[str]:
    """Every repository path, module or test that `document` names and that does not exist, as 'file:line: why'.
    Relative links resolve from `links_from` (default: the document's folder)."""
    top, sources = _top_level(root), _source_files(root)
    problems, fenced = [], False
    for number, line in enumerate(document.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            tokens = line.split()
        else:
            tokens = [t for code in INLINE_CODE.findall(line) for t in code.split()]
            prose = INLINE_CODE.sub("", line)
            problems += [f"{document.name}:{number}: {p}" for target in LINK.findall(prose)
                         if (p := _link_problem(target, links_from or document.parent, root))]
        for token in tokens:
            for part in token.split("="):
                if problem := _token_problem(part, root, top, sources):
                    problems.append(f"{document.name}:{number}: {problem}")
    return problems


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_readme_and_docs_name_only_files_that_exist(document: Path) -> None:
    assert stale_references(document) == []


@pytest.mark.parametrize("text, stale", [
    ("See `rl_core/made_up_module.py`.", "rl_core/made_up_module.py does not exist"),
    ("See [the guide](docs/guides/no-such-page.md).", "link target docs/guides/no-such-page.md does not exist"),
    ("Run `python bench/no_such_bench.py --quick`.", "bench/no_such_bench.py does not exist"),
    ("```bash\npython bench/missing.py\n```", "bench/missing.py does not exist"),
    ("Figures in `NOTES.md`.", "NOTES.md does not exist at the repository root"),
    ("Presets (`rl_core/presets.py`).", "rl_core/presets.py does not exist"),
    ("Import `rl_core.config.no_such_module`.", "no module or name rl_core.config.no_such_module"),
    ("Proven by `tests/test_cli.py::test_that_does_not_exist`.", "tests/test_cli.py has no test or class"),
])
def test_a_made_up_reference_is_reported(tmp_path: Path, text: str, stale: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\n{text}\n")
    problems = stale_references(page, links_from=ROOT)  # as if it were README.md
    assert len(problems) == 1 and stale in problems[0], problems


@pytest.mark.parametrize("text", [
    "Metrics land in `runs/<run>/metrics/<iteration>.json`; tuned kernels in `~/.cache/gymflow`.",
    "A store `s3://bucket/prefix`, a [URL](https://example.com/docs/page.md), `/usr/bin/chromium`.",
    "`gymnasium.make_vec(\"gymflow/HalfCheetah-v5\")`, the deployment `train-control/train`, `make train`.",
    "`flows/train_control.py`, `rl_core/config/`, `bench/ppo.py --budget 1000000`, `prefect.yaml`, `Makefile`.",
    "`rl_core.config.control`, `gymflow_kernels.dispatch`, `tests/test_cli.py`, [README](README.md).",
])
def test_what_is_no_stale_reference_passes(tmp_path: Path, text: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\n{text}\n")
    assert stale_references(page, links_from=ROOT) == []


def _mkdocs_build(site: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("docs") / "site"
    done = _mkdocs_build(site)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return site


def test_the_docs_site_builds_with_strict_checks(built_site: Path) -> None:
    assert (built_site / "index.html").is_file()
    assert (built_site / "benchmarks" / "index.html").is_file()


def test_the_cli_reference_lists_every_launch_option(built_site: Path) -> None:
    from rl_core.config.launch_options import agent_launch_options, launch_options

    page = (built_site / "reference" / "cli" / "index.html").read_text()
    flags = {"--" + name.replace("_", "-") for name in [*launch_options(), *agent_launch_options()]}
    assert sorted(flag for flag in flags if f"<code>{flag}</code>" not in page) == []


@pytest.mark.parametrize("text, named", [
    ("See [a page](no-such-page.md).", "no-such-page.md"),
    ("::: rl_core.no_such_module", "rl_core.no_such_module"),
], ids=["broken-link", "unresolved-api-reference"])
def test_the_strict_build_fails_on_a_broken_link_or_reference(tmp_path: Path, text: str, named: str) -> None:
    """The site's own configuration (INHERIT) on one page holding the fault: the build must fail, naming it."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(f"# A page\n\n{text}\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: docs\nnav:\n  - index.md\nhooks: []\nextra_css: []\n")
    done = _mkdocs_build(tmp_path / "site", config)
    assert done.returncode != 0 and named in done.stdout + done.stderr, done.stdout + done.stderr
