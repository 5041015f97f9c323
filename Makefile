# Two commands on a fresh machine: `make demo` (the main job on built-in data) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: install demo demo-lm demo-seg smoke smoke-lm smoke-seg test test-fast test-slow test-gpu bench lint tensorboard docker clean

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

smoke: $(STAMP)  ## the smallest end-to-end fit of the vision app
	$(PY) -m kpca.vision_cls fit -c configs/trainer/cpu.yaml -c configs/vision_cls/smoke.yaml --trainer.fast_dev_run=2

smoke-lm: $(STAMP)  ## the smallest end-to-end fit of the language-model app
	$(PY) -m kpca.language_model fit -c configs/trainer/cpu.yaml -c configs/language_model/smoke.yaml --trainer.fast_dev_run=2

smoke-seg: $(STAMP)  ## the smallest end-to-end fit of the segmentation app
	$(PY) -m kpca.segmentation fit -c configs/trainer/cpu.yaml -c configs/segmentation/smoke.yaml --trainer.fast_dev_run=2

test: $(STAMP)  ## every test that runs without a GPU (slow and Triton-interpreter tests included)
	$(PY) -m pytest -m "not gpu" -q

test-fast: $(STAMP)  ## the inner loop: skips slow tests
	$(PY) -m pytest -m "not gpu and not slow" -q

test-slow: $(STAMP)
	$(PY) -m pytest -m "slow and not gpu" -q

GPU_PROOF_ARGS ?=
test-gpu: $(STAMP)  ## on a CUDA machine (under 8 min): gpu/triton and compile tests, CUDA benchmarks, short bf16 fits of each app; one report in benchmarks/results/
	$(PY) benchmarks/gpu_proof.py $(GPU_PROOF_ARGS)

bench: $(STAMP)  ## the benchmarks (attention up to N = 4096; vision and LM step time and Lightning throughput)
	$(PY) benchmarks/attention.py
	$(PY) benchmarks/vision_cls.py
	$(PY) benchmarks/language_model.py

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

tensorboard: $(STAMP)  ## serve the runs
	$(VENV)/bin/tensorboard --logdir runs

docker:  ## build the CUDA image (docker/Dockerfile) as kpca; the build fails if Triton cannot compile its launcher
	docker build -f docker/Dockerfile -t kpca .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
