"""Time to a certified gap of our dual SDCA against liblinear, on the kernel benchmark data.

A quick probe, not the benchmark: one fit of ours at tol=1e-9 (history: epoch, gap,
seconds) and LinearSVC / LogisticRegression(liblinear) at a few tolerances, each
certified. For the hinge, liblinear's gap is (P(coef) − D_ours)/P with D_ours our dual
value (the margin-built dual point is loose for the hinge), as in bench_kernels.py.

    NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/probe_sdca.py --rows 300000 \
        --data sparse,dense --loss hinge
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
from bench_kernels import make_dense, make_sparse  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.svm import LinearSVC  # noqa: E402

import dask_scd  # noqa: E402

ALPHA = {"hinge": 1e-3, "squared_hinge": 1e-3, "logistic": 1e-4}


def data(name, n):
    if name == "sparse":
        X, _, y = make_sparse(n, 5000 if n >= 1_000_000 else max(500, n // 200))
        X.sort_indices()
        return X, y
    X, _, y = make_dense(n)
    return np.ascontiguousarray(X), y


def ours(X, y, loss, tol=1e-9, max_iter=300):
    dask_scd.fit(X[:200], y[:200], loss=loss, alpha=ALPHA[loss], fit_intercept=False,
                 max_iter=2, solver="sdca", random_state=0)  # compile
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        t0 = time.perf_counter()
        r = dask_scd.fit(X, y, loss=loss, alpha=ALPHA[loss], fit_intercept=False, tol=tol,
                         max_iter=max_iter, solver="sdca", random_state=0)
        wall = time.perf_counter() - t0
    h = r.history_
    hits = {}
    for target in (1e-6, 1e-9):
        k = next((k for k, g in enumerate(h.relative_gap) if g <= target), None)
        hits[target] = None if k is None else (h.iteration[k], h.seconds[k])
    dual = r.primal_ - r.dual_gap_ * abs(r.primal_)
    return hits, wall, r, dual


def liblinear(X, y, loss, dual_ref, tols):
    n = X.shape[0]
    out = []
    problem = dask_scd.Problem(loss, ALPHA[loss], 0.0, False)
    for tol in tols:
        if loss == "logistic":
            est = LogisticRegression(solver="liblinear", C=1 / (n * ALPHA[loss]),
                                     fit_intercept=False, tol=tol, max_iter=1000)
        else:
            est = LinearSVC(loss=loss, C=1 / (n * ALPHA[loss]), fit_intercept=False, dual=True,
                            tol=tol, max_iter=100_000)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            t0 = time.perf_counter()
            est.fit(X, y)
            seconds = time.perf_counter() - t0
        coef = np.ravel(est.coef_).astype(np.float64)
        cert = dask_scd.certificate(problem, X, y, coef, 0.0)
        gap = max(cert.primal - dual_ref, 0.0) / abs(cert.primal)
        out.append((tol, seconds, gap, int(np.max(est.n_iter_))))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--data", default="sparse,dense")
    p.add_argument("--loss", default="hinge")
    p.add_argument("--no-sklearn", action="store_true")
    p.add_argument("--tols", default="1e-2,1e-3,1e-4,1e-5")
    args = p.parse_args()
    for name in args.data.split(","):
        X, y = data(name, args.rows)
        for loss in args.loss.split(","):
            hits, wall, r, dual = ours(X, y, loss)
            cells = ", ".join(
                f"{t:.0e}: " + ("—" if v is None else f"{v[1]:.2f} s ({v[0]} ep)")
                for t, v in hits.items())
            print(f"{name} {X.shape} {loss}: ours {cells}; epochs {r.n_iter_}, wall {wall:.2f}"
                  f" s, final gap {r.dual_gap_:.1e}", flush=True)
            print("   history:", " ".join(f"{i}:{g:.1e}@{s:.2f}" for i, g, s in
                                          zip(r.history_.iteration, r.history_.relative_gap,
                                              r.history_.seconds)), flush=True)
            if args.no_sklearn:
                continue
            tols = [float(t) for t in args.tols.split(",")]
            for tol, s, gap, it in liblinear(X, y, loss, dual, tols):
                print(f"   liblinear tol={tol:.0e}: {s:.2f} s, gap {gap:.1e}, {it} iter",
                      flush=True)


if __name__ == "__main__":
    main()
