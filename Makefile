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

.PHONY: setup demo test ui clean

setup: $(STAMP) .dagster/dagster.yaml

# torch first, chosen per machine, so the project's own `torch>=2.4` is already met and pip
# never swaps in the registry's default build (several GB of CUDA wheels) on a CPU-only box.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
ifeq ($(UNAME_S),Darwin)
	$(PIP) install -q torch
else ifeq ($(HAS_CUDA),1)
	$(PIP) install -q torch
else
	$(PIP) install -q torch==2.13.0 || $(PIP) install -q torch --index-url https://download.pytorch.org/whl/cpu
endif
	$(PIP) install -q -e ".[test,mlx]"
	touch $(STAMP)

.dagster/dagster.yaml: scripts/dagster.yaml | $(STAMP)
	mkdir -p .dagster
	cp scripts/dagster.yaml .dagster/dagster.yaml
	$(VENV)/bin/dagster instance concurrency set duckdb 1
	$(VENV)/bin/dagster instance concurrency set accelerator 1

demo: setup
	$(PY) -m scripts.demo

test: setup
	$(PY) -m pytest

ui: setup
	$(VENV)/bin/dagster dev -w workspace.yaml

clean:
	rm -rf data .dagster .cache
