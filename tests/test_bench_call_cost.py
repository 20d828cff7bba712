"""benchmarks/bench_call_cost.py: its fits reach the gap it reports, and its bare step is
the Newton step of the engine (the same decrease of the objective)."""

import numpy as np
import pytest
from conftest import import_benchmark

import dask_scd


def test_rows_are_certified_fits():
    bench = import_benchmark("bench_call_cost")
    rows = bench.measure(repeats=2)
    assert [r["name"] for r in rows] == [name for name, *_ in bench.problems()]
    for r in rows:
        assert r["engine"] == "newton"
        assert 1 <= r["steps"] <= 10
        assert r["gap"] <= bench.TOL
        assert 0.0 < r["call"] < r["fit"]
        assert r["bare"] > 0.0
    assert "| 200 × 500 | newton |" in bench.table(rows)


def test_bare_step_is_the_engines_first_step(monkeypatch):
    """The bare step's objective after its unit step from θ = 0 is that of one Newton step
    of ``fit`` taking unit steps (no doubling), to rounding, on both of its paths (the
    n × n kernel and the p × p Hessian)."""
    from dask_scd.engines.newton import newton

    monkeypatch.setattr(newton, "DOUBLINGS", ())
    bench = import_benchmark("bench_call_cost")
    for _, X, y, kwargs in bench.problems():
        if kwargs["fit_intercept"]:
            continue  # the engine starts from the best intercept, the bare step from 0
        step = bench.bare_step(X, y, kwargs["alpha"], False)
        zero = np.zeros(X.shape[1])  # θ = 0 given: Newton's step, not the kernel's epochs
        first = dask_scd.fit(X, y, tol=1e-14, max_iter=1, solver="newton", coef_init=zero, **kwargs)
        assert first.n_iter_ == 1
        assert step() == pytest.approx(first.primal_, rel=1e-12)
