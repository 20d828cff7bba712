"""Sample weights: what a weighted fit costs against the unweighted fit of the same rows,
and against the fit of the rows repeated as the integer weights say (the same problem).

For each engine that takes weights, on dense Gaussian rows (n × 50, ±1 labels from a
planted logistic model) with integer weights drawn from {0, 1, 2, 3}: wall time,
iterations and certified relative gap of the unweighted fit, the weighted fit and the
fit of the repeated rows (about 1.5·n of them), and the relative difference of the
weighted and repeated objectives (the same problem, each certified to ``tol``). The Dask
engine runs on a 2-worker ``LocalCluster`` (processes=False) with the weights as a dask
vector. Appends markdown to ``benchmarks/results/weights.md``.

Run ``make bench-weights`` (a few minutes on 2 cores) or ``--rows 20000`` for a smoke run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import dask.array as da
import numpy as np
from _machine import cpu_model, print_and_append
from sklearn.exceptions import ConvergenceWarning

import dask_scd

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "weights.md"
TOL = 1e-8
# (engine, loss, penalty, alpha · n): the problems each engine is picked for by "auto",
# and L1 problems for the coordinate engines named by hand (scd, duhl).
CASES = (
    ("newton", "logistic", "l2", 1.0),
    ("newton", "logistic", "l1", 10.0),
    ("sdca", "logistic", "l2", 100.0),
    ("sdca", "hinge", "l2", 100.0),
    ("gram", "squared", "l2", 1.0),
    ("block_newton", "logistic", "l2", 1.0),
    ("scd", "logistic", "l1", 10.0),
    ("scd", "squared", "l1", 10.0),
    ("duhl", "logistic", "l1", 10.0),
)


def data(n_rows: int):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n_rows, 50))
    margins = X @ rng.normal(size=50)
    y_class = np.where(margins + rng.logistic(size=n_rows) > 0, 1.0, -1.0)
    y_real = margins + rng.normal(size=n_rows)
    weights = rng.integers(0, 4, n_rows).astype(np.float64)
    return X, y_class, y_real, weights


def timed(X, y, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        start = time.perf_counter()
        result = dask_scd.fit(X, y, tol=TOL, max_iter=500, random_state=0, **options)
        return result, time.perf_counter() - start


def case_rows(solver, loss, penalty, alpha_n, X, y, weights) -> list[str]:
    n = X.shape[0]
    options = dict(solver=solver, loss=loss, penalty=penalty, alpha=alpha_n / n)
    rows = np.repeat(np.arange(n), weights.astype(np.intp))
    if solver == "block_newton":
        chunks = n // 4
        Xd, yd = da.from_array(X, chunks=(chunks, 50)), da.from_array(y, chunks=chunks)
        plain, t_plain = timed(Xd, yd, **options)
        weighted, t_weighted = timed(
            Xd, yd, sample_weight=da.from_array(weights, chunks=chunks), **options
        )
        m = len(rows) // 4 + 1
        repeated, t_repeated = timed(
            da.from_array(X[rows], chunks=(m, 50)), da.from_array(y[rows], chunks=m), **options
        )
    else:
        plain, t_plain = timed(X, y, **options)
        weighted, t_weighted = timed(X, y, sample_weight=weights, **options)
        repeated, t_repeated = timed(X[rows], y[rows], **options)
    agreement = abs(weighted.primal_ - repeated.primal_) / abs(repeated.primal_)

    def cell(result, seconds):
        return f"{seconds:.2f} s, {result.n_iter_} it., {result.dual_gap_:.1e}"

    return [
        f"| {solver} | {loss}, {penalty}, α = {alpha_n:g}/n | {cell(plain, t_plain)} | "
        f"{cell(weighted, t_weighted)} | {cell(repeated, t_repeated)} | {agreement:.1e} |"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    from distributed import Client, LocalCluster

    X, y_class, y_real, weights = data(args.rows)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster),
    ):
        Xw, yw, yr, ww = data(2000)  # compile the kernels before timing
        for solver, loss, penalty, alpha_n in CASES:
            case_rows(solver, loss, penalty, alpha_n, Xw, yr if loss == "squared" else yw, ww)
        load_before = os.getloadavg()
        body = [
            f"**dense {args.rows:,} × 50, integer weights in {{0, 1, 2, 3}} "
            f"({int(weights.sum()):,} repeated rows), tol = {TOL:g}**",
            "",
            "| engine | problem | unweighted | weighted | repeated rows | "
            "\\|P_weighted − P_repeated\\| / P |",
            "|---|---|---|---|---|---|",
        ]
        for solver, loss, penalty, alpha_n in CASES:
            y = y_real if loss == "squared" else y_class
            body += case_rows(solver, loss, penalty, alpha_n, X, y, weights)
            print(body[-1], flush=True)
        load_after = os.getloadavg()
    header = [
        f"## {datetime.date.today()}: {os.cpu_count()} cores, {cpu_model()}, "
        f"{platform.python_version()}",
        "",
        f"`{' '.join([os.path.basename(sys.executable), *sys.argv])}`; load average "
        f"(1, 5, 15 min) before {tuple(round(v, 2) for v in load_before)}, after "
        f"{tuple(round(v, 2) for v in load_after)}. Each cell: wall time, iterations, "
        "certified relative gap.",
        "",
    ]
    print_and_append("\n".join(header + body), RESULTS, save=not args.no_save)


if __name__ == "__main__":
    main()
