"""The kernels package sits in the folder the brief names, kernels/, as `gymflow_kernels`, with no kernels/__init__.py:
from the repository root `import kernels` still finds Hugging Face's package (transformers imports it), and
`import gymflow_kernels` finds ours in a script, the CLI, pytest, a Ray worker and the installed wheel."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, cwd: Path, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_kernels_is_hugging_faces_and_transformers_uses_it_from_the_repository_root() -> None:
    assert not (ROOT / "kernels" / "__init__.py").exists()
    out = _python("import kernels, gymflow_kernels\n"
                  "from transformers.integrations.hub_kernels import kernelize\n"  # defined only where kernels imports
                  "print(kernels.__file__); print(gymflow_kernels.__file__); print(kernelize.__module__)", ROOT)
    hf, ours, user = out.splitlines()
    assert "site-packages" in hf and Path(ours) == ROOT / "kernels" / "gymflow_kernels" / "__init__.py"
    assert user.startswith("transformers.")


def test_gymflow_kernels_imports_in_pytest_and_its_command_line_runs_anywhere(tmp_path: Path) -> None:
    import gymflow_kernels

    assert Path(gymflow_kernels.__file__).parent == ROOT / "kernels" / "gymflow_kernels"
    done = subprocess.run([sys.executable, "-m", "gymflow_kernels", "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "--ops" in done.stdout, done.stderr


@pytest.mark.slow
def test_gymflow_kernels_imports_in_a_ray_worker() -> None:
    import ray

    from rl_core.runtime.local_ray import ensure_ray

    ensure_ray()

    @ray.remote(num_cpus=0)
    def where() -> str:
        import gymflow_kernels

        return gymflow_kernels.__file__

    assert Path(ray.get(where.remote(), timeout=120)) == ROOT / "kernels" / "gymflow_kernels" / "__init__.py"


@pytest.mark.slow
def test_the_wheel_holds_gymflow_kernels_and_its_sources_and_no_kernels_package(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: setuptools writes build/ and egg-info beside the sources it builds
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    for name in tracked:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("gymflow-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "gymflow_kernels/__init__.py" in names and "gymflow_kernels/csrc/ppo_grad.cpp" in names
    assert not any(n.startswith("kernels/") for n in names)
    target = tmp_path / "installed"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    code = ("import gymflow_kernels, kernels; from gymflow_kernels.native import cpp_source\n"
            "print(gymflow_kernels.__file__); print(kernels.__file__); print(len(cpp_source('ppo_grad.cpp')))")
    ours, hf, source = _python(code, tmp_path, PYTHONPATH=str(target)).splitlines()
    assert Path(ours).is_relative_to(target) and "site-packages" in hf and int(source) > 1000
