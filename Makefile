PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test docs bench-kernels bench-dask bench-duhl bench-gpu bench-sdca bench-peers bench-scale bench-cocoa bench-multinomial bench-sdca-ooc test-slurm bench-weights bench-path bench-benchopt bench-scaleout bench-call-cost bench-wide clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip >/dev/null
	$(PY) -m pip install -e ".[test,docs]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# The suite includes the documentation build (tests/test_docs_examples.py) and the
# examples at small size. Its files run on up to 4 processes (one per core): a file's
# tests share one process, and with it their module's cluster.
TEST_PROCESSES ?= $(shell $(PYTHON) -c "import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))")
test: $(STAMP)
	$(PY) -m pytest -q -ra -n $(TEST_PROCESSES) --dist loadfile tests

# A one-node SLURM cluster from Debian's packages (root and apt-get, else a one-line skip),
# the tests of tests/slurm/ on it (skipped by `make test` where no partition answers), and
# its daemons stopped again.
test-slurm: $(STAMP)
	.ci/slurm.sh $(PY) $(ARGS)

# Sphinx, warnings as errors.
docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

# Benchmarks: every script in benchmarks/ has a target here (one-off probes are not
# kept; see benchmarks/README.md).
bench-kernels: $(STAMP)
	$(PY) benchmarks/bench_kernels.py

bench-dask: $(STAMP)
	$(PY) benchmarks/bench_dask.py

bench-duhl: $(STAMP)
	$(PY) benchmarks/bench_duhl.py

# Needs an NVIDIA GPU and the `gpu` extra; on a machine without one it says so and exits.
bench-gpu: $(STAMP)
	$(PY) benchmarks/bench_gpu.py $(ARGS)

bench-sdca: $(STAMP)
	$(PY) benchmarks/bench_sdca_threads.py $(ARGS)

bench-cocoa: $(STAMP)
	$(PY) benchmarks/bench_cocoa.py $(ARGS)

bench-multinomial: $(STAMP)
	$(PY) benchmarks/bench_multinomial.py $(ARGS)

bench-sdca-ooc: $(STAMP)
	$(PY) benchmarks/bench_sdca_ooc.py $(ARGS)

bench-weights: $(STAMP)
	$(PY) benchmarks/bench_weights.py $(ARGS)

# The peers (skglm, celer, glum, Snap ML, pyspark, dask-ml) come from the `bench` extra, never
# from `make test`.
$(VENV)/.bench: $(STAMP) pyproject.toml
	$(PY) -m pip install -e ".[test,bench]"
	touch $(VENV)/.bench

bench-peers: $(VENV)/.bench
	$(PY) benchmarks/bench_peers.py $(ARGS)

# Lasso paths and LassoCV against scikit-learn, glum and skglm (the `bench` extra).
bench-path: $(VENV)/.bench
	$(PY) benchmarks/bench_path.py $(ARGS)

# Spark MLlib (pyspark, needs Java 17+) and dask-ml come from the `bench` extra too.
bench-scale: $(VENV)/.bench
	$(PY) benchmarks/bench_scale.py $(ARGS)

# What a small fit costs beyond its arithmetic: fit against a bare Newton loop, one thread.
bench-call-cost: $(STAMP)
	$(PY) benchmarks/bench_call_cost.py $(ARGS)

# Fewer rows than columns: SDCA's epochs on the n × n kernel against Newton's steps alone.
bench-wide: $(STAMP)
	$(PY) benchmarks/bench_wide.py $(ARGS)

# What a block-SCD epoch moves, waits for and computes on LocalClusters of 1 to 16
# workers, the cost model fitted to it and its projection (docs/scale_out.md).
bench-scaleout: $(STAMP)
	$(PY) benchmarks/bench_scaleout.py $(ARGS)

# benchopt's public benchmarks (clones of benchmark_logreg_l2, benchmark_logreg_l1 and
# benchmark_lasso in $(BENCHMARKS)) with our solver added, against their peers (the
# `bench` extra); see benchmarks/README.md.
BENCHMARKS ?= ../benchopt-benchmarks
bench-benchopt: $(VENV)/.bench
	$(PY) benchmarks/bench_benchopt.py --checkouts $(BENCHMARKS) $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache docs/_build docs/generated
