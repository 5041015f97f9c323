# Two commands on a fresh machine: `make demo` (the main job on built-in data) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: install demo test test-fast test-slow test-gpu bench lint clean

$(STAMP): requirements/constraints.txt requirements/dev.txt $(wildcard packages/*/pyproject.toml apps/*/pyproject.toml)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/dev.txt
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install every distribution editable with the pinned stack

demo: $(STAMP)  ## the main job on built-in data (until the vision app lands: the quick attention benchmark)
	$(PY) benchmarks/attention.py --quick

test: $(STAMP)  ## every test that runs without a GPU (slow and Triton-interpreter tests included)
	$(PY) -m pytest -m "not gpu" -q

test-fast: $(STAMP)  ## the inner loop: skips slow tests
	$(PY) -m pytest -m "not gpu and not slow" -q

test-slow: $(STAMP)
	$(PY) -m pytest -m "slow and not gpu" -q

test-gpu: $(STAMP)  ## on a CUDA machine: GPU tests and the CUDA benchmark
	$(PY) -m pytest -m "gpu or triton" -q
	$(PY) benchmarks/attention.py --device cuda

bench: $(STAMP)  ## the full attention benchmark (N up to 4096, each case in its own process)
	$(PY) benchmarks/attention.py

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
