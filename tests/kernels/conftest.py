"""Every kernel test gets its own cache dir: tests write, corrupt and re-read winners.json, and must not see
each other's winners (nor the user's)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Callable, Iterator

import pytest

from gymflow_kernels import Op, get_op, register, unregister

_op_ids = itertools.count()


@pytest.fixture(autouse=True)
def tmp_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point GYMFLOW_CACHE_DIR at a fresh directory for every test."""
    path = tmp_path / "gymflow-cache"
    monkeypatch.setenv("GYMFLOW_CACHE_DIR", str(path))
    return path


@pytest.fixture
def make_op() -> Iterator[Callable[..., Op]]:
    """Register a throw-away variant of the GAE op (own name, chosen reference and candidates, other fields as
    given); removed afterwards."""
    names = []

    def make(candidates: dict, reference: Callable | None = None, **changes: object) -> Op:
        gae = get_op("gae")
        op = dataclasses.replace(gae, name=f"gae_test_{next(_op_ids)}", candidates=candidates,
                                 reference=reference or gae.reference, **changes)
        names.append(op.name)
        return register(op)

    yield make
    for name in names:
        unregister(name)
