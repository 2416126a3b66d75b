# Two commands: `make train` (install, then the main job) and `make test` (install, then the tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: install train train-agent test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first and pinned: a CPU wheel; letting pip resolve torch through the project can pull a CUDA build.
$(VENV)/.installed: $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

train: install
	$(PY) -m flows.cli train --preset quick $(ARGS)

train-agent: install
	$(PY) -m flows.cli train-agent --preset quick $(ARGS)

test: install
	$(PY) -m pytest -q $(ARGS)

bench: install
	$(PY) bench/checkpoint.py
	$(PY) bench/kernels.py
	$(PY) bench/simulate.py

clean:
	rm -rf runs .pytest_cache
