"""Multinomial logistic regression: dask_scd's Newton engine against scikit-learn.

For each problem: wall time of ``LogisticRegression`` (multinomial, certified to
``TOL``), its Newton steps and certified relative gap, and scikit-learn's
``LogisticRegression`` on the same objective (lbfgs for L2, saga for L1, both at a tight
tol and a large max_iter): its time, iterations, the relative difference of the two
objectives ((ours − theirs)/theirs, negative when ours is lower) and the relative gap
that our certificate gives scikit-learn's model. One-vs-rest (``multi_class="ovr"``, a
different model) is timed too. The last row fits the dense problem as a dask array over
Dask (``solver="block_newton"``) against the in-memory engine. Both run on one BLAS thread (threadpoolctl): the
products are small and BLAS threads on a shared machine cost more than they bring.
Appends markdown to ``benchmarks/results/multinomial.md``.

Run ``make bench-multinomial`` (a few minutes on 2 cores), ``--rows 5000`` for a
shorter run of the synthetic problems.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from _machine import cpu_model, print_and_append
from sklearn import linear_model
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from dask_scd import LogisticRegression
from dask_scd.objectives import Problem
from dask_scd.objectives.multinomial import certificate

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "multinomial.md"
TOL = 1e-10


def synthetic(n_rows: int, sparse: bool):
    """10 overlapping classes: dense Gaussian rows (100 features), or sparse rows of
    20 non-zeros among 2,000 features."""
    rng = np.random.default_rng(0)
    if sparse:
        p, per_row = 2000, 20
        columns = rng.integers(0, p, size=(n_rows, per_row))
        X = sp.csr_matrix(
            (
                np.ones(n_rows * per_row),
                columns.ravel(),
                np.arange(0, n_rows * per_row + 1, per_row),
            ),
            shape=(n_rows, p),
        )
        X.sum_duplicates()
    else:
        p = 100
        X = rng.normal(size=(n_rows, p))
    W = rng.normal(size=(p, 10)) * (1.0 if sparse else 0.3)
    y = np.argmax(X @ W + rng.gumbel(size=(n_rows, 10)), axis=1)
    return X, y


def problems(n_rows: int) -> list:
    X, y = load_digits(return_X_y=True)
    digits = StandardScaler().fit_transform(X)
    dense, y_dense = synthetic(n_rows, sparse=False)
    sparse, y_sparse = synthetic(n_rows, sparse=True)
    small = min(n_rows, 5000)  # saga at a tight tol: 31 s at 5,000 rows already
    return [
        ("digits 1,797 × 64, standardized", digits, y, "l2", 0.1),
        ("digits 1,797 × 64, standardized", digits, y, "l2", 1.0),
        ("digits 1,797 × 64, /16", X / 16.0, y, "l1", 0.1),
        (f"dense {n_rows:,} × 100", dense, y_dense, "l2", 1.0),
        (f"sparse {n_rows:,} × 2,000 (20 non-zeros a row)", sparse, y_sparse, "l2", 1.0),
        (
            f"sparse {small:,} × 2,000 (20 non-zeros a row)",
            sparse[:small],
            y_sparse[:small],
            "l1",
            0.1,
        ),
    ]


def timed(function):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        start = time.perf_counter()
        value = function()
        return value, time.perf_counter() - start


def row(name, X, y, penalty, C) -> str:
    n = X.shape[0]
    alpha = 1.0 / (C * n)
    rho = 1.0 if penalty == "l1" else 0.0
    ours, seconds = timed(lambda: LogisticRegression(C=C, penalty=penalty, tol=TOL).fit(X, y))
    solver = "saga" if penalty == "l1" else "lbfgs"
    theirs, their_seconds = timed(
        lambda: linear_model.LogisticRegression(
            C=C,
            l1_ratio=rho,
            solver=solver,
            tol=1e-8 if solver == "saga" else 1e-12,
            max_iter=100_000,
        ).fit(X, y)
    )
    _, ovr_seconds = timed(
        lambda: LogisticRegression(C=C, penalty=penalty, tol=TOL, multi_class="ovr").fit(X, y)
    )
    problem = Problem("multinomial", alpha, rho, True)
    codes = np.searchsorted(ours.classes_, y)
    mine = certificate(problem, X, codes, ours.coef_, ours.intercept_)
    other = certificate(problem, X, codes, theirs.coef_, theirs.intercept_)
    return (
        f"| {name} | {penalty}, C = {C:g} | {seconds:.2f} | {ours.n_iter_[0]} | "
        f"{ours.dual_gap_[0]:.1e} | {solver} {their_seconds:.2f} | {theirs.n_iter_[0]} | "
        f"{(mine.primal - other.primal) / other.primal:+.1e} | {other.relative_gap:.1e} | "
        f"{ovr_seconds:.2f} |"
    )


def dask_row(n_rows: int) -> str:
    """The dense problem as a dask array of 8 row chunks, fitted over Dask
    (``in_memory_limit=0``: Newton steps over row-chunk reductions) on an in-process
    cluster of one worker, against the in-memory fit."""
    import dask.array as da
    from distributed import Client, LocalCluster

    import dask_scd

    X, y = synthetic(n_rows, sparse=False)
    alpha = 1.0 / n_rows
    dX = da.from_array(X, chunks=(-(-n_rows // 8), -1))
    dy = da.from_array(y, chunks=dX.chunks[0])
    memory, memory_seconds = timed(
        lambda: dask_scd.fit(X, y, loss="multinomial", alpha=alpha, tol=TOL)
    )
    with (
        LocalCluster(
            processes=False, n_workers=1, threads_per_worker=2, dashboard_address=":0"
        ) as cluster,
        Client(cluster),
    ):
        dX = dX.persist()
        result, seconds = timed(
            lambda: dask_scd.fit(
                dX, dy, loss="multinomial", alpha=alpha, tol=TOL, in_memory_limit=0
            )
        )
    gap = np.abs(result.coef_ - memory.coef_).max()
    return (
        f"| dense {n_rows:,} × 100, dask array of 8 row chunks | l2, C = 1 | "
        f"{result.solver_} {seconds:.2f} | {result.n_iter_} | {result.dual_gap_:.1e} | "
        f"in memory (newton) {memory_seconds:.2f} | {memory.n_iter_} | "
        f"max |Δcoef| {gap:.1e} | | |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=int, default=50_000, help="rows of the synthetic problems (default 50,000)"
    )
    parser.add_argument("--no-save", action="store_true", help="print only")
    args = parser.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        f"## {datetime.date.today()}: {cpu_model()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load average {load:.1f}, one BLAS thread",
        "",
        f"LogisticRegression, more than two classes, certified to tol = {TOL:g} "
        "(`make bench-multinomial`).",
        "",
        "| data | penalty | ours s | Newton steps | our gap | scikit-learn s | its iterations "
        "| objective (ours − theirs)/theirs | its certified gap | ours one-vs-rest s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    # compile the kernels outside the timings
    X, y = synthetic(200, sparse=True)
    LogisticRegression(C=1.0, penalty="l1").fit(X, y)
    with threadpool_limits(limits=1, user_api="blas"):
        for problem in problems(args.rows):
            lines.append(row(*problem))
            print(lines[-1], flush=True)
        lines.append(dask_row(args.rows))
        print(lines[-1], flush=True)
    print_and_append("\n".join(lines) + "\n", RESULTS, save=not args.no_save)


if __name__ == "__main__":
    main()
