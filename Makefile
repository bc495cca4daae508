# The two set-up commands of the README: `make demo` and `make test`.
# Both create .venv when missing, install the pinned CPU torch first (an unpinned torch
# would pull a multi-GB CUDA build), then the project with the extras they need (torch is
# an extra: the launcher side installs without it); both are idempotent.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION := 2.13.0
DEMO_ARGS ?= --model tiny --epochs 3 --batch-size 32

.PHONY: demo test test-quick lint extras bench cluster-up cluster-down clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.torch-$(TORCH_VERSION): | $(PY)
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	touch $@

# The demo: torch (already the pinned one) and the example's h5py.
$(VENV)/.demo: pyproject.toml $(VENV)/.torch-$(TORCH_VERSION)
	$(PY) -m pip install -q -e '.[torch,example]'
	touch $@

# The tests: the test extra holds torch and h5py too, and the test tools.
$(VENV)/.installed: pyproject.toml $(VENV)/.torch-$(TORCH_VERSION)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# Optional strategies, tested for real by `make test`: DeepSpeed from PyPI, and Horovod
# 0.28.1 built once against this torch (C++17 patch) and cached under ~/.cache/scalerun.
$(VENV)/.extras: $(VENV)/.installed scripts/install_horovod.sh
	$(PY) -m pip install -q -e '.[test,deepspeed,frameworks]'
	# DeepSpeed JIT-compiles its CPU comm op on first use (~1 min): do it here, not in a test
	$(PY) -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" > /dev/null
	scripts/install_horovod.sh $(PY)
	touch $@

extras: $(VENV)/.extras

demo: $(VENV)/.demo
	$(VENV)/bin/scalerun launch --nproc-per-node 2 examples/vit/train.py $(DEMO_ARGS)

# The tests run in parallel (pytest-xdist), one worker more than the CPUs (TEST_WORKERS=0
# runs them one after the other in this process): the worker of the SLURM group waits for
# its jobs, and a group runs on one worker to its end, so with one worker per CPU a fifth
# of two cores stayed idle (docs/results.md, "The test suite's time"). A group of tests
# that share the SLURM test cluster or a module's fixture runs on one worker
# (tests/conftest.py); the SLURM group is the longest.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print((os.cpu_count() or 1) + 1)")

test: $(VENV)/.installed $(VENV)/.extras
	$(PY) -m ruff check src tests examples benchmarks scripts
	# Bytecode of our own code, once (0.3 s): where PYTHONDONTWRITEBYTECODE is set, as on
	# these machines, every process of the suite would otherwise compile what it imports
	$(PY) -m compileall -q src tests examples benchmarks > /dev/null
	SCALERUN_REQUIRE_EXTRAS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The edit loop: only the tests that start no process (not marked `processes`, see
# tests/process_guard.py), in one process, under 3 minutes; any process a test tries to
# start is refused there, so a test that needs one and is not listed in tests/processes.txt
# fails with a line saying so. `make test` runs everything.
test-quick: $(VENV)/.installed
	$(PY) -m ruff check src tests examples benchmarks scripts
	SCALERUN_TEST_NO_PROCESSES=1 $(PY) -m pytest -q -p no:xdist -m "not processes"

lint: $(VENV)/.installed
	$(PY) -m ruff check src tests examples benchmarks scripts

# Every benchmark (benchmarks/README.md), each printing a table and writing
# benchmarks/results/<name>.json; the GPU ones print 'skipped: no GPU' without one.
# Not part of `make test`: tests/benchmarks runs each issue-12 benchmark at its smallest
# size instead. memory.py needs DeepSpeed, hence the extras.
bench: $(VENV)/.installed $(VENV)/.extras
	$(PY) benchmarks/loader.py
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/gpu_bound.py
	$(PY) benchmarks/example_gpu.py
	$(PY) benchmarks/launch.py
	$(PY) benchmarks/steplog.py
	$(PY) benchmarks/memory.py
	$(PY) benchmarks/tune.py
	$(PY) benchmarks/output_memory.py
	$(PY) benchmarks/false_verdicts.py

# A real SLURM cluster on this machine (root; installs slurm-wlm when missing). Its
# clients need: export SLURM_CONF=/tmp/scalerun-slurm/etc/slurm.conf
# The test suite runs half of its SLURM tests on a second one (/tmp/scalerun-slurm-b):
# both are started here and kept up between test sessions until cluster-down.
cluster-up:
	$(PYTHON) tests/cluster/cluster.py up
	$(PYTHON) tests/cluster/cluster.py up --second

cluster-down:
	$(PYTHON) tests/cluster/cluster.py down --second
	$(PYTHON) tests/cluster/cluster.py down

clean:
	rm -rf $(VENV) runs .pytest_cache
