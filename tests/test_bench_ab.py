"""benchmarks/bench_ab.py: the rows' alphas are computed once and read back, each run is a
certified fit, and the table compares two checkouts' runs row by row."""

import json

import pytest
from conftest import import_benchmark


def test_specs_run_and_table(tmp_path, capsys):
    bench = import_benchmark("bench_ab")
    specs, run = tmp_path / "specs.json", tmp_path / "run.json"
    bench.main(["specs", str(specs), "--rows", "onehot logistic"])
    table = json.loads(specs.read_text())
    assert list(table) == ["onehot logistic L2 alpha=1/n"]
    loss, penalty, alpha, _, fit_intercept, key = table["onehot logistic L2 alpha=1/n"]
    assert (loss, penalty, fit_intercept, key) == ("logistic", "l2", True, "onehot")
    assert alpha * bench.peers.QUICK.n == pytest.approx(1.0)

    bench.main(["run", str(specs), str(run), "--solvers", "newton,lasso_of_nothing"])
    results = json.loads(run.read_text())
    fit = results["onehot logistic L2 alpha=1/n | newton"]
    assert fit["solver"] == "newton" and fit["gap"] <= bench.TOL and fit["min"] > 0.0
    assert "error" in results["onehot logistic L2 alpha=1/n | lasso_of_nothing"]

    capsys.readouterr()
    bench.main(["table", f"{run},{run}", str(run)])
    out = capsys.readouterr().out
    assert "| onehot logistic L2 alpha=1/n | newton | newton |" in out
    assert "| 1.00 |" in out and "Largest ratio: 1.00" in out
