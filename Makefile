PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench-kernels bench-dask bench-duhl clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip >/dev/null
	$(PY) -m pip install -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -q -ra tests

bench-kernels: $(STAMP)
	$(PY) benchmarks/bench_kernels.py

bench-dask: $(STAMP)
	$(PY) benchmarks/bench_dask.py

bench-duhl: $(STAMP)
	$(PY) benchmarks/bench_duhl.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
