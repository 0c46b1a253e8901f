# Two commands on a fresh machine (Python 3.10+, a C++ compiler; nvcc for the CUDA kernels):
#   make bench   # the main job: build, then python -m torch_reduce.bench (CPU models only without a GPU)
#   make test    # build, then the whole test suite (CUDA tests skip without a GPU)
PYTHON ?= python3
TORCH ?= torch==2.14.1

.PHONY: deps build test bench

deps:
	$(PYTHON) -m pip install -q "$(TORCH)" numpy pytest hypothesis expecttest matplotlib tqdm ninja setuptools wheel

build: deps
	MAX_JOBS=$${MAX_JOBS:-2} $(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .

test: build
	$(PYTHON) -m pytest -q -p no:cacheprovider tests

bench: build
	$(PYTHON) -m torch_reduce.bench
