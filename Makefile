# slimserve: `make demo` (the whole chain) and `make test` (the suite) on a fresh machine.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo flywheel-demo test unit bench bench-input bench-train bench-serve bench-bulk \
	bench-warmup bench-pauses bench-runtime bench-openvino bench-flywheel soak clean tfserving-suite

$(STAMP): setup.py
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 9) <= v <= (3, 11) else "slimserve needs Python 3.9-3.11 (TensorFlow 2.15); $(PYTHON) is %d.%d. Run: make PYTHON=python3.11 ..." % v)'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv
	$(PY) -m uv pip install --quiet --compile-bytecode --python $(PY) -e ".[test,beam]" \
	  || $(PY) -m pip install --quiet -e ".[test,beam]"
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py --fresh

# The data flywheel on digits: shifted traffic, drift, labelling, retraining, promotion.
flywheel-demo: $(STAMP)
	$(PY) scripts/flywheel_demo.py --fresh

# The suite (tests/unit, tests/integration, tests/system) over pytest-xdist workers,
# costliest tests first (each test's cost marker, tests/scheduling.py); three
# on 2 cores, so a core never waits while a worker's test waits (docs/development.md).
TEST_WORKERS ?= 3
# Bytecode of our sources first: with PYTHONDONTWRITEBYTECODE set (as on CI machines)
# each of the suite's ~170 processes would compile the modules it imports again.
# One intra-op thread per TensorFlow process: the workers and their children already keep
# both cores busy, and each process's own pool of two only adds contention (5-7% fewer CPU
# seconds for the same suite, docs/development.md). `make test TEST_INTRAOP_THREADS=0`:
# TensorFlow's choice.
TEST_INTRAOP_THREADS ?= 1
test: $(STAMP)
	@bash scripts/test_tools.sh
	$(PY) -m compileall -q slimserve estimator export serving flywheel tests > /dev/null
	TF_NUM_INTRAOP_THREADS=$(TEST_INTRAOP_THREADS) $(PY) -m pytest -n $(TEST_WORKERS)

# The unit layer alone (tests/unit: no child process, no socket, no training), in one
# process: under a minute on 2 cores, where two xdist workers would each import TensorFlow.
unit: $(STAMP)
	$(PY) -m pytest -p no:xdist tests/unit

bench: bench-input bench-train bench-serve bench-bulk bench-warmup bench-pauses

# bench-NAME runs benchmarks/bench_NAME.py. bench-openvino: OpenVINO against TensorFlow at
# 224 and 32x32, in process, served, agreement (docs/performance.md); not in `make bench`:
# it trains the digits export first.
bench-input bench-train bench-serve bench-bulk bench-warmup bench-openvino: bench-%: $(STAMP)
	$(PY) benchmarks/bench_$*.py

# TensorFlow's runtime switches (oneDNN, threads, XLA, layout, remapper) side by side,
# one process per variant (docs/performance.md).
bench-runtime: $(STAMP)
	$(PY) benchmarks/bench_runtime_switches.py

# Python's full-collection pauses under load, with and without --freeze_loaded_objects.
bench-pauses: $(STAMP)
	$(PY) benchmarks/bench_collection_pauses.py

# Drift's false alarm rate and detection delay (the flywheel demo's model when it exists).
bench-flywheel: $(STAMP)
	$(PY) benchmarks/bench_flywheel.py $(if $(wildcard demo_out/flywheel/models),--demo_dir demo_out/flywheel)

# The 10-minute hostile soak of docs/reliability.md (not part of `make test`): a server
# under prlimit, hostile and valid traffic, config edits, version churn, a full log disk.
soak: $(STAMP)
	nice -n 10 $(PY) benchmarks/soak.py

# TF Serving's own model-server suite, unmodified, against slimserve-server:
#   make tfserving-suite TFSERVING=/path/to/tensorflow/serving [TFSERVING_TAG=2.15.1]
TFSERVING_TAG ?= 2.15.1
tfserving-suite: $(STAMP)
	@test -n "$(TFSERVING)" || { echo "usage: make tfserving-suite TFSERVING=<checkout or bare clone of tensorflow/serving>"; exit 2; }
	$(PY) scripts/run_tfserving_suite.py "$(TFSERVING)" --tag=$(TFSERVING_TAG)

clean:
	rm -rf demo_out bench_out .pytest_cache
