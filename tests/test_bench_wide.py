"""benchmarks/bench_wide.py: both of its fits are certified to its tol, and on the rows far
from collinear the cold fit is ended by the kernel's epochs, with Newton's steps alone
taking several."""

from conftest import import_benchmark


def test_rows_are_certified_and_the_epochs_end_the_independent_rows():
    bench = import_benchmark("bench_wide")
    rows = bench.measure(repeats=1, quick=True)
    assert len(rows) == 4 * len(bench.problems(quick=True))
    for r in rows:
        assert 0.0 <= r["gap"] <= bench.TOL and 0.0 <= r["newton_gap"] <= bench.TOL
        assert r["auto"] > 0.0 and r["newton"] > 0.0
    independent = [r for r in rows if r["name"].startswith("independent")]
    assert independent and all(r["steps"] == 0 < r["newton_steps"] for r in independent)
    assert "| independent 200 × 500 | 1/n | logistic | 0 |" in bench.table(rows)
