# Two commands on a fresh machine (Python 3.10+, a C++ compiler; nvcc for the CUDA kernels):
#   make bench   # the main job: build, then python -m torch_reduce.bench (CPU models only without a GPU)
#   make test    # build, then the whole test suite (CUDA tests skip without a GPU)
PYTHON ?= python3
TORCH ?= torch==2.14.1
# Compile jobs: one a core, but at most one per 2 GiB of available memory (nvcc on the templated kernels is
# large; too many at once would swap or be killed).
MAX_JOBS ?= $(shell cores=$$(nproc); jobs=$$(awk '/^MemAvailable:/ {print int($$2 / 2097152)}' /proc/meminfo); \
	[ "$$jobs" -gt "$$cores" ] && jobs=$$cores; [ "$$jobs" -ge 1 ] && echo $$jobs || echo 1)

WHEEL_DIR ?= dist

.PHONY: deps build test bench wheel

# pyproject.toml's build requirements, installed here because the build runs without isolation: _C must be
# compiled against the torch that will run it, $(TORCH).
deps:
	$(PYTHON) -m pip install -q "$(TORCH)" "setuptools>=77" wheel ninja "tomli; python_version < '3.11'"

# In place and incremental (build/ keeps the objects, so a `make wheel` afterwards only relinks), with the test
# and bench extras of pyproject.toml; the tests and benchmarks run from this folder.
build: deps
	$(PYTHON) -m pip install -q $$($(PYTHON) scripts/extras.py test bench)
	MAX_JOBS=$(MAX_JOBS) $(PYTHON) setup.py -q build_ext --inplace

test: build
	$(PYTHON) -m pytest -q -p no:cacheprovider tests

bench: build
	$(PYTHON) -m torch_reduce.bench

# A wheel of this tree in $(WHEEL_DIR), for pip install elsewhere: it requires the torch it was built against.
wheel: deps
	MAX_JOBS=$(MAX_JOBS) $(PYTHON) -m pip wheel -q --no-build-isolation --no-deps -w "$(WHEEL_DIR)" .
