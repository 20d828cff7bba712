"""Time and passes over X to a certified gap of 1e-6 and 1e-9: solver="newton" against our
coordinate engines and scikit-learn's best solver for each problem.

A probe, not the benchmark suite: single thread, best of ``--repeat`` runs (the machine is
shared), and always the passes over X (free of contention). Our engines run once per
target with tol = target; scikit-learn runs over a ladder of tolerances and each model is
certified by our duality gap, the time reported being that of the cheapest run whose
certified gap meets the target. Problems with an intercept compare with the solvers whose
intercept is unpenalized (lbfgs, newton-cholesky); liblinear penalizes its own, so the
rows where it competes are fitted without intercept.

    .venv/bin/python benchmarks/probe_newton.py --repeat 3 > benchmarks/results/newton.md
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_file
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.svm import LinearSVC

import dask_scd
from dask_scd import objectives as obj
from dask_scd.datasets import make_onehot
from dask_scd.solvers import newton
from dask_scd.solvers.base import InMemory, Options

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TARGETS = (1e-6, 1e-9)
SK_TOLS = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-10, 1e-12)
COORDINATE_EPOCHS = 300


def load(name):
    if name.startswith("onehot"):
        rows = int(name.split(":")[1]) if ":" in name else 200_000
        X, y, _ = make_onehot(rows, random_state=0)
        return X, y
    X, y = load_svmlight_file(str(DATA / name), n_features=123)
    return sp.csr_matrix((X.data, X.indices.astype(np.int32), X.indptr.astype(np.int32)),
                         shape=X.shape), y


def problems(n):
    """(data, loss, l1_ratio, alpha, fit_intercept, label) of every row."""
    rows = []
    for data in ("a9a.t", "a8a"):
        for scale in (1.0, 0.1, 0.01):
            rows.append((data, "logistic", 0.0, scale / n[data], True, f"α = {scale:g}/n"))
        for alpha in (1e-4, 1e-5):
            rows.append((data, "logistic", 1.0, alpha, False, f"L1, α = {alpha:g}"))
        for C in (1.0, 10.0):
            rows.append((data, "squared_hinge", 0.0, 1.0 / (C * n[data]), False, f"C = {C:g}"))
    rows.append(("onehot", "logistic", 0.0, 1.0 / n["onehot"], False, "α = 1/n"))
    return rows


def best_time(run, repeat):
    best, out = np.inf, None
    for _ in range(repeat):
        start = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - start)
    return best, out


def ours_newton(X, y, problem, target, repeat):
    def run():
        return newton.fit_newton(InMemory(X, y), problem,
                                 Options(target, 1000, np.random.default_rng(0)))
    seconds, result = best_time(run, repeat)
    ok = result.certificate.relative_gap <= target
    return seconds if ok else None, result.extras["total_passes"], result.n_iter


def ours_coordinate(X, y, problem, solver, target, repeat):
    penalty = "l2" if problem.l1_ratio == 0 else "l1"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        seconds, fit = best_time(lambda: dask_scd.fit(
            X, y, loss=problem.loss, penalty=penalty, alpha=problem.alpha,
            fit_intercept=problem.fit_intercept, tol=target, solver=solver,
            max_iter=COORDINATE_EPOCHS, random_state=0), repeat)
    # an epoch is one pass; each certificate one or two more
    passes = fit.n_iter_ + 2 * len(fit.history_)
    return (seconds if fit.converged_ else None), passes, fit.n_iter_


def scikit_learn(X, y, problem, solver, repeat):
    """[(seconds, certified gap, iterations)] over the tolerance ladder."""
    n = X.shape[0]
    C = 1.0 / (problem.alpha * n)
    out = []
    for tol in SK_TOLS:
        if problem.loss == "squared_hinge":
            est = LinearSVC(C=C, loss="squared_hinge", dual=solver == "liblinear-dual",
                            tol=tol, max_iter=100_000, fit_intercept=False)
        else:
            est = LogisticRegression(C=C, l1_ratio=problem.l1_ratio, solver=solver, tol=tol,
                                     max_iter=100_000, fit_intercept=problem.fit_intercept)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            seconds, est = best_time(lambda est=est: est.fit(X, y), repeat)
        intercept = float(np.ravel(est.intercept_)[0]) if problem.fit_intercept else 0.0
        cert = obj.certificate(problem, X, y, np.ravel(est.coef_), intercept)
        out.append((seconds, cert.relative_gap, int(np.max(est.n_iter_))))
    return out


def sk_solvers(problem, p):
    if problem.loss == "squared_hinge":
        return ("liblinear-primal", "liblinear-dual")
    if problem.l1_ratio > 0:
        return ("liblinear",)
    solvers = ["lbfgs"]
    if p <= 2000:
        solvers.append("newton-cholesky")
    if not problem.fit_intercept:
        solvers.append("liblinear")
    return tuple(solvers)


def fmt(seconds, passes=None, iterations=None):
    if seconds is None:
        return "—"
    text = f"{seconds:.3f}"
    if passes is not None:
        text += f" ({passes:.0f}p"
        text += f", {iterations} it)" if iterations is not None else ")"
    return text


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--onehot-rows", type=int, default=200_000)
    parser.add_argument("--only", default="", help="comma-separated data names")
    parser.add_argument("--costs", action="store_true",
                        help="print the passes and seconds of each kind of work instead")
    args = parser.parse_args()
    data = {"a9a.t": load("a9a.t"), "a8a": load("a8a"),
            "onehot": load(f"onehot:{args.onehot_rows}")}
    n = {name: X.shape[0] for name, (X, _) in data.items()}
    # compile every kernel once
    X0, y0 = data["a8a"][0][:500], data["a8a"][1][:500]
    for rho in (0.0, 1.0):
        for loss in ("logistic", "squared_hinge"):
            ours_newton(X0, y0, obj.Problem(loss, 1e-3, rho, True), 1e-6, 1)
    only = set(filter(None, args.only.split(",")))
    if args.costs:
        return costs(data, n, only, args.repeat)
    print("| data | problem | newton 1e-6 | newton 1e-9 | coordinate 1e-6 | coordinate 1e-9 "
          "| scikit-learn 1e-6 | scikit-learn 1e-9 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, loss, rho, alpha, fit_intercept, label in problems(n):
        if only and name not in only:
            continue
        X, y = data[name]
        problem = obj.Problem(loss, alpha, rho, fit_intercept)
        cells = [name, f"{loss} {label}" + ("" if fit_intercept else ", no intercept")]
        for target in TARGETS:
            cells.append(fmt(*ours_newton(X, y, problem, target, args.repeat)))
        coordinate = "scd" if rho > 0 else "sdca"
        for target in TARGETS:
            seconds, passes, epochs = ours_coordinate(X, y, problem, coordinate, target, 1)
            cells.append(f"{coordinate} " + fmt(seconds, passes, epochs))
        ladders = {s: scikit_learn(X, y, problem, s, args.repeat)
                   for s in sk_solvers(problem, X.shape[1])}
        for target in TARGETS:
            hits = [(seconds, s, it) for s, ladder in ladders.items()
                    for seconds, gap, it in ladder if gap <= target]
            if hits:
                seconds, s, it = min(hits)
                cells.append(f"{s} {seconds:.3f} ({it} it)")
            else:
                cells.append("—")
        print("| " + " | ".join(cells) + " |", flush=True)


def costs(data, n, only, repeat):
    """Passes and seconds of each kind of work of a fit to 1e-9: the cost guard."""
    print("| data | problem | steps | passes: solve / gradient+certificate / other "
          "| seconds: solve / certificate / line search / working set / gradient |")
    print("|---|---|---|---|---|")
    for name, loss, rho, alpha, fit_intercept, label in problems(n):
        if only and name not in only:
            continue
        X, y = data[name]
        problem = obj.Problem(loss, alpha, rho, fit_intercept)
        _, run = best_time(lambda X=X, y=y, problem=problem: newton.fit_newton(
            InMemory(X, y), problem, Options(1e-9, 1000, np.random.default_rng(0))), repeat)
        passes, seconds = run.extras["passes"], run.extras["seconds"]
        solve = sum(v for k, v in passes.items() if k.startswith("solve"))
        solve_s = sum(v for k, v in seconds.items() if k.startswith("solve"))
        kinds = "/".join(sorted(k.split(":")[1] for k in passes if k.startswith("solve")))
        other = run.extras["total_passes"] - solve - passes["gradient"] - passes["certificate"]
        share = [seconds.get(k, 0.0) for k in ("certificate", "line_search", "working_set",
                                                 "gradient")]
        print(f"| {name} | {loss} {label} | {run.n_iter} ({kinds}) | {solve:.0f} / "
              f"{passes['gradient'] + passes['certificate']:.0f} / {other:.0f} | "
              + f"{solve_s * 1e3:.0f} / " + " / ".join(f"{v * 1e3:.0f}" for v in share)
              + " ms |", flush=True)


if __name__ == "__main__":
    main()
