"""benchopt's benchmarks mapped onto ``dask_scd.fit``, and the table of their results,
checked without benchopt.

``benchmarks/benchopt_dask_scd/mapping.py`` turns the objectives of benchmark_logreg_l2,
benchmark_logreg_l1 and benchmark_lasso (sums over the n samples, regularization λ) into
our arguments (alpha = λ/n). Here the benchmarks' formulas are written out: at our
coefficients, mapped to the benchmark's ``beta``, each must equal n times our objective,
and our certified optimum must be a minimum of the benchmark's objective. Then the table
of ``benchmarks/bench_benchopt.py`` is computed on hand-made records.
"""

import importlib.util

import numpy as np
import pytest
from conftest import BENCHMARKS, import_benchmark

import dask_scd


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mapping = _load("dask_scd_mapping", BENCHMARKS / "benchopt_dask_scd" / "mapping.py")


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_benchopt")


# --------------------------------------------------------------- the benchmarks' formulas


def benchopt_objective(benchmark, X, y, lmbd, beta, fit_intercept=False):
    """The value each benchmark's Objective.evaluate_result computes."""
    if benchmark == "lasso":
        p = X.shape[1]
        coef, intercept = beta[:p], (beta[p] if fit_intercept else 0.0)
        residual = y - X @ coef - intercept
        return 0.5 * residual @ residual + lmbd * np.abs(coef).sum()
    margins = y * (X @ beta)
    loss = np.logaddexp(0.0, -margins).sum()
    if benchmark == "logreg_l2":
        return loss + lmbd * 0.5 * beta @ beta
    return loss + lmbd * np.abs(beta).sum()


def benchopt_lambda(benchmark, X, y, fit_intercept):
    """λ as the benchmarks set it: logreg_l2's lmbd = 1, the others 0.1·λ_max."""
    if benchmark == "logreg_l2":
        return 1.0
    if benchmark == "logreg_l1":
        return 0.1 * np.abs(X.T @ y).max() / 2
    centred = y - y.mean() if fit_intercept else y
    return 0.1 * np.abs(X.T @ centred).max()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    n, p = 150, 8
    X = rng.standard_normal((n, p))
    X[:, 0] += 1.0  # a column with a mean, so that the intercept matters
    y = np.sign(X @ rng.standard_normal(p) + 0.5 * rng.standard_normal(n) + 0.3)
    return X, y


CASES = [("logreg_l2", False), ("logreg_l1", False), ("lasso", False), ("lasso", True)]


@pytest.mark.filterwarnings("ignore:Did not converge")
@pytest.mark.parametrize(("benchmark", "fit_intercept"), CASES)
def test_benchopt_objective_is_n_times_ours(data, benchmark, fit_intercept):
    X, y = data
    n, p = X.shape
    lmbd = benchopt_lambda(benchmark, X, y, fit_intercept)
    arguments = mapping.fit_arguments(benchmark, n, lmbd, fit_intercept)
    assert arguments["alpha"] == pytest.approx(lmbd / n, rel=1e-15)
    # a point far from the optimum (two iterations) and the certified optimum
    for max_iter in (2, 10_000):
        result = dask_scd.fit(X, y, tol=1e-12, max_iter=max_iter, **arguments)
        beta = mapping.benchopt_beta(result, fit_intercept)
        assert beta.shape == (p + fit_intercept,)
        expected = mapping.benchopt_value(result.primal_, n)
        value = benchopt_objective(benchmark, X, y, lmbd, beta, fit_intercept)
        assert value == pytest.approx(expected, rel=1e-12)
    assert result.dual_gap_ <= 1e-12


@pytest.mark.parametrize(("benchmark", "fit_intercept"), CASES)
def test_our_optimum_minimizes_the_benchopt_objective(data, benchmark, fit_intercept):
    """No step along a coordinate (the intercept too) lowers the benchmark's objective at
    our optimum: it is smooth plus a separable penalty, so this is its optimality."""
    X, y = data
    n, p = X.shape
    lmbd = benchopt_lambda(benchmark, X, y, fit_intercept)
    arguments = mapping.fit_arguments(benchmark, n, lmbd, fit_intercept)
    result = dask_scd.fit(X, y, tol=1e-12, max_iter=10_000, **arguments)
    beta = mapping.benchopt_beta(result, fit_intercept)
    best = benchopt_objective(benchmark, X, y, lmbd, beta, fit_intercept)
    assert np.count_nonzero(beta[:p]) > 0
    for j in range(beta.size):
        for step in (1e-4, -1e-4):
            moved = beta.copy()
            moved[j] += step
            assert benchopt_objective(benchmark, X, y, lmbd, moved, fit_intercept) >= best * (
                1 - 1e-13
            )


@pytest.mark.filterwarnings("ignore:Did not converge")
def test_labels_other_than_pm1_are_refused(data):
    X, y = data
    result = dask_scd.fit(X, (y > 0).astype(float), loss="logistic", alpha=0.01, max_iter=2)
    with pytest.raises(ValueError, match="-1 and \\+1"):
        mapping.benchopt_beta(result)


def test_objective_names_map_to_the_benchmarks():
    assert set(mapping.OBJECTIVES.values()) == set(mapping.PROBLEMS)


# --------------------------------------------------------------- the results table


def _records(bench, dataset, runs):
    return [
        {
            "benchmark": "lasso",
            "dataset_name": dataset,
            "objective_name": "Lasso Regression[fit_intercept=False,reg=0.1]",
            "solver_name": solver,
            "time": t,
            "objective_value": f,
        }
        for solver, t, f in runs
    ]


def test_time_to_target_is_the_fastest_run_within_it(bench):
    ours = bench.OURS
    runs = [
        # f* = 100 (skglm's last run)
        ("sklearn", 0.1, 100.1),  # 1e-3
        ("sklearn", 0.2, 100.00005),  # 5e-7: sklearn's 1e-6
        ("sklearn", 0.5, 100.0000000005),  # 5e-12: sklearn's 1e-9
        ("skglm", 0.05, 100.01),
        ("skglm", 0.3, 100.0),  # skglm's 1e-6 and 1e-9
        (ours, 0.01, 101.0),  # fast, but 1e-2 away: never counts
        (ours, 0.25, 100.00000005),  # 5e-10: our 1e-9
        (ours, 0.15, 100.00009),  # 9e-7: our 1e-6, listed after a slower run
        (ours, 0.02, float("nan")),  # a failed evaluation is ignored
    ]
    (row,) = bench.table_rows(_records(bench, "Simulated", runs))
    assert row.best == 100.0
    assert row.times["sklearn"] == {1e-6: 0.2, 1e-9: 0.5}
    assert row.fastest_peer(1e-6) == ("sklearn", 0.2)
    assert row.fastest_peer(1e-9) == ("skglm", 0.3)
    assert row.ours(1e-6) == 0.15
    assert row.ours(1e-9) == 0.25


def test_tally_counts_rows_ours_wins_and_is_within_1_5x(bench):
    ours = bench.OURS
    records = _records(bench, "A", [("sklearn", 1.0, 1.0), (ours, 0.5, 1.0)])  # fastest
    records += _records(bench, "B", [("sklearn", 1.0, 1.0), (ours, 1.4, 1.0)])  # within
    records += _records(bench, "C", [("sklearn", 1.0, 1.0), (ours, 2.0, 1.0)])  # slower
    records += _records(bench, "D", [("sklearn", 1.0, 1.0), (ours, 1.0, 2.0)])  # not reached
    records += _records(bench, "E", [("sklearn", 1.0, 2.0), (ours, 3.0, 1.0)])  # no peer
    rows = bench.table_rows(records)
    assert [row.dataset for row in rows] == ["A", "B", "C", "D", "E"]
    assert bench.tally(rows, 1e-6) == (2, 3, 5)
    table = bench.render_table(rows)
    assert "| lasso | D |" in table and "not reached" in table and "no peer" in table
    assert "ours fastest on 2 of 5 rows, within 1.5x of the fastest peer on 3" in (
        bench.render_counts(rows)
    )


def test_solver_statuses_read_from_a_benchopt_log(bench):
    log = (
        "Simulated[n_features=10,n_samples=1000]\n"
        "  |--L2 Logistic Regression[lmbd=1.0]\n"
        "    |--dask_scd:   5.0% (1 / 1 reps)\r    |--dask_scd: \x1b[1;32mdone\x1b[0m   \n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in run\n'
        "ValueError: Only sparse matrices with 32-bit integer indices are accepted.\n"
        "    |--sklearn: error\n"
        "    |--snapml[gpu=False]: done (timeout)\n"
    )
    statuses = bench.solver_statuses(log)
    dataset, objective = (
        "Simulated[n_features=10,n_samples=1000]",
        "L2 Logistic Regression[lmbd=1.0]",
    )
    assert statuses == [
        (dataset, objective, "dask_scd", "done", None),
        (dataset, objective, "sklearn", "error", statuses[1][4]),
        (dataset, objective, "snapml[gpu=False]", "done (timeout)", None),
    ]
    assert statuses[1][4].startswith("ValueError: Only sparse")
    failures = bench.render_failures(statuses)
    assert "sklearn" in failures and "snapml" not in failures


def test_rows_named_on_the_command_line_replace_the_default_selection(bench, tmp_path):
    """--dataset and --objective run the rows named (one row to measure again), in place
    of every simulated dataset and LIBSVM file; without them the full selection runs."""
    benchmark = bench.BENCHMARKS["lasso"]
    row = "Simulated[n_samples=500,n_features=600,rho=0]"
    objective = "Lasso Regression[fit_intercept=True,reg=0.05]"
    args = bench.parse_args(["--dataset", row, "--objective", objective])
    command = bench.benchopt_command(benchmark, tmp_path, args, ["sklearn"], ["a8a"], tmp_path)
    pairs = list(zip(command, command[1:]))
    assert [v for k, v in pairs if k == "-d"] == [row]
    assert [v for k, v in pairs if k == "-o"] == [objective]
    full = bench.benchopt_command(
        benchmark, tmp_path, bench.parse_args([]), ["sklearn"], ["a8a"], tmp_path
    )
    pairs = list(zip(full, full[1:]))
    assert [v for k, v in pairs if k == "-d"] == ["Simulated", "LIBSVM-files[file=a8a]"]
    assert [v for k, v in pairs if k == "-o"] == []


def test_repetitions_are_passed_to_benchopt(bench, tmp_path):
    """--repetitions N runs benchopt with -r N (a time to a target is then the fastest of
    the N runs that reach it); one repetition by default."""
    benchmark = bench.BENCHMARKS["lasso"]
    for argv, expected in (([], "1"), (["--repetitions", "3"], "3")):
        args = bench.parse_args(argv)
        command = bench.benchopt_command(benchmark, tmp_path, args, [], [], tmp_path)
        assert command[command.index("-r") + 1] == expected
