# Two commands on a fresh machine: `make demo` (the main job on built-in data) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: install demo demo-lm demo-seg demo-family smoke smoke-lm smoke-seg test test-fast test-slow test-compat test-gpu bench lint tensorboard docker local-slurm clean

$(STAMP): requirements/constraints.txt requirements/dev.txt $(wildcard packages/*/pyproject.toml apps/*/pyproject.toml)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/dev.txt
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install every distribution editable with the pinned stack

# The demos are experiment plans (configs/experiments/demo_*.yaml): rerunning one skips the steps already done.
demo: $(STAMP)  ## the main job: SymViT vs RPC-SymViT on the built-in digits over 3 seeds, clean / corrupted / attacked
	$(VENV)/bin/kpca-experiment run configs/experiments/demo_vision.yaml
	cat runs/demo/report.md

demo-lm: $(STAMP)  ## symmetric vs RPC language models on the built-in corpus, clean and word-swapped perplexity
	$(VENV)/bin/kpca-experiment run configs/experiments/demo_lm.yaml
	cat runs/demo-lm/report.md

demo-seg: $(STAMP)  ## symmetric vs RPC Segmenter on the built-in synthetic ADE20K, clean and corrupted mIoU
	$(VENV)/bin/kpca-experiment run configs/experiments/demo_seg.yaml
	cat runs/demo-seg/report.md

demo-family: $(STAMP)  ## the robust family (softmax, SymViT, RPC, Elliptical, Twicing, NeuTRENO) on the built-in digits, seed 0
	$(VENV)/bin/kpca-experiment run configs/experiments/demo_family.yaml
	cat runs/demo-family/report.md

smoke: $(STAMP)  ## the smallest end-to-end fit of the vision app
	$(PY) -m kpca.vision_cls fit -c configs/trainer/cpu.yaml -c configs/vision_cls/smoke.yaml --trainer.fast_dev_run=2

smoke-lm: $(STAMP)  ## the smallest end-to-end fit of the language-model app
	$(PY) -m kpca.language_model fit -c configs/trainer/cpu.yaml -c configs/language_model/smoke.yaml --trainer.fast_dev_run=2

smoke-seg: $(STAMP)  ## the smallest end-to-end fit of the segmentation app
	$(PY) -m kpca.segmentation fit -c configs/trainer/cpu.yaml -c configs/segmentation/smoke.yaml --trainer.fast_dev_run=2

# The tests run in TEST_WORKERS pytest-xdist processes (2: the CI machine's cores; TEST_WORKERS=0 runs them in this
# process). --dist loadgroup keeps the tests of one xdist_group on one worker (the `slurm` tests share one local
# Slurm); tests/conftest.py hands the slow tests out first, so that the short ones fill in at the end.
TEST_WORKERS ?= 2
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadgroup

test: $(STAMP)  ## every test that runs without a GPU (slow and Triton-interpreter tests included)
	$(PY) -m pytest -m "not gpu" -q $(PYTEST_PARALLEL)

test-fast: $(STAMP)  ## the inner loop: skips slow tests
	$(PY) -m pytest -m "not gpu and not slow" -q $(PYTEST_PARALLEL)

test-slow: $(STAMP)
	$(PY) -m pytest -m "slow and not gpu" -q $(PYTEST_PARALLEL)

# The oldest torch the project supports (the floor in packages/attention/pyproject.toml), in an environment of its
# own: the attention tests, compile tests included, on torch $(COMPAT_TORCH) with its Triton; the rest of the stack at
# the project's pins, but numpy below 2.4 (Triton 3.6's CPU interpreter, which the Triton tests run under, turns
# one-element arrays into Python ints, an error from numpy 2.4 on). Another torch:
#   make test-compat COMPAT_TORCH=2.12.0 COMPAT_PINS="torchvision==0.27.0 triton==3.6.0 numpy==2.3.5"
COMPAT_TORCH ?= 2.11.0
COMPAT_PINS ?= torchvision==0.26.0 triton==3.6.0 numpy==2.3.5
COMPAT_VENV := .venv-torch$(COMPAT_TORCH)
COMPAT_STAMP := $(COMPAT_VENV)/.installed
COMPAT_OVERRIDDEN := torch $(foreach pin,$(COMPAT_PINS),$(firstword $(subst ==, ,$(pin))))

$(COMPAT_STAMP): requirements/constraints.txt packages/attention/pyproject.toml
	test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install --quiet --upgrade pip
	grep -Ev '^($(subst $(eval) ,|,$(strip $(COMPAT_OVERRIDDEN))))==' requirements/constraints.txt \
		> $(COMPAT_VENV)/constraints.txt
	printf '%s\n' torch==$(COMPAT_TORCH) $(COMPAT_PINS) >> $(COMPAT_VENV)/constraints.txt
	$(COMPAT_VENV)/bin/python -m pip install --quiet -c $(COMPAT_VENV)/constraints.txt \
		torch $(foreach pin,$(COMPAT_PINS),$(firstword $(subst ==, ,$(pin)))) -e './packages/attention[test]'
	touch $(COMPAT_STAMP)

test-compat: $(COMPAT_STAMP)  ## the attention and compile tests on the oldest supported torch ($(COMPAT_TORCH)), in its own venv
	KPCA_REQUIRE_TRITON=1 $(COMPAT_VENV)/bin/python -m pytest -m "not gpu" -q -p no:cacheprovider tests/attention

GPU_PROOF_ARGS ?=
# On a node whose own Python has the stack (docs/cluster.md), `make test-gpu PY=python3` runs with that Python:
# a PY given on the command line skips creating .venv.
TEST_GPU_NEEDS := $(if $(filter command line,$(origin PY)),,$(STAMP))
test-gpu: $(TEST_GPU_NEEDS)  ## on a CUDA machine (under 8 min): gpu/triton and compile tests, CUDA benchmarks, short bf16 fits of each app; one report in benchmarks/results/
	$(PY) tools/gpu_proof.py $(GPU_PROOF_ARGS)

# Wheels for a GPU node with its own torch and no internet (docs/cluster.md). Default target: this Python and platform.
# make wheelhouse WHEELHOUSE_PYTHON=3.12 WHEELHOUSE_PLATFORM=manylinux_2_28_x86_64 WHEELHOUSE_ARGS=--dali
WHEELHOUSE_PYTHON ?=
WHEELHOUSE_PLATFORM ?=
WHEELHOUSE_ARGS ?=
WHEELHOUSE_TARGET = $(if $(WHEELHOUSE_PYTHON),--python $(WHEELHOUSE_PYTHON)) $(if $(WHEELHOUSE_PLATFORM),--platform $(WHEELHOUSE_PLATFORM))
.PHONY: wheelhouse
wheelhouse: $(STAMP)  ## wheels of the project and of every dependency but torch, torchvision, triton and CUDA, in dist/
	$(PY) requirements/wheelhouse.py $(WHEELHOUSE_TARGET) $(WHEELHOUSE_ARGS)

bench: $(STAMP)  ## the benchmarks (attention up to N = 4096; vision and LM step time and Lightning throughput)
	$(PY) benchmarks/attention.py
	$(PY) benchmarks/vision_cls.py
	$(PY) benchmarks/language_model.py

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

tensorboard: $(STAMP)  ## serve the runs
	$(VENV)/bin/tensorboard --logdir runs

# A one-node Slurm on localhost (docker/local_slurm.sh; docs/cluster.md, "A local Slurm"): installs Debian's
# slurm-wlm and munge if missing, then starts it. Stop it with `sudo docker/local_slurm.sh stop`.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
local-slurm:  ## a one-node Slurm on this machine (root, Debian's slurm-wlm and munge) to try a plan with --executor slurm
	command -v slurmctld >/dev/null || test -x /usr/sbin/slurmctld || { $(SUDO) apt-get update && \
		$(SUDO) apt-get install -y --no-install-recommends slurm-wlm munge; }
	$(SUDO) docker/local_slurm.sh start

docker:  ## build the CUDA image (docker/Dockerfile) as kpca; the build fails if Triton cannot compile its launcher
	docker build -f docker/Dockerfile -t kpca .

clean:
	rm -rf $(VENV) .venv-torch* .pytest_cache .ruff_cache
