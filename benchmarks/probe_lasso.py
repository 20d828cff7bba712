"""Time and passes over X to a certified gap of our SCD on L1 problems, against
scikit-learn's coordinate descent and skglm (if installed).

A quick probe, not the benchmark. For every problem the alpha is set once (a short
bisection on alpha/alpha_max with loose fits) to give the wanted fraction of non-zeros;
then each solver is timed to a relative duality gap of 1e-6 and 1e-9, certified by
``dask_scd.certificate`` for all of them, best of ``--repeat`` runs. Passes over X count
the stored entries our kernels read (epochs on a working set count their columns'
share, a certificate counts 1); for scikit-learn they are its epochs (``n_iter_``).
scikit-learn and skglm stop on their own criteria: their tolerance is tightened along a
ladder until the certified gap reaches the target, and the first that does is timed.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 NUMBA_NUM_THREADS=1 \
        .venv/bin/python benchmarks/probe_lasso.py --problems onehot,a9a,dense

``PYTHONPATH=<another checkout>`` runs another version of dask_scd under the same probe.
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402

import dask_scd  # noqa: E402
from dask_scd import objectives as obj  # noqa: E402
from dask_scd.datasets import make_onehot  # noqa: E402
from dask_scd.kernels import cpu  # noqa: E402

A9A = Path(__file__).resolve().parents[2] / "shared" / "data" / "a9a.t"
TARGETS = (1e-6, 1e-9)
LADDER = [10.0 ** -k for k in range(2, 15)]


# ------------------------------------------------------------------- passes over X


class PassCounter:
    """Counts the stored entries of X that the column kernels read, in passes over X."""

    def __init__(self):
        self.col_nnz = None
        self.entries = 0.0
        self._wrapped = {}

    def install(self, X):
        csc = sp.csc_matrix(X) if sp.issparse(X) else None
        self.col_nnz = (np.diff(csc.indptr) if csc is not None
                        else np.full(X.shape[1], X.shape[0])).astype(np.float64)
        self.total = float(self.col_nnz.sum())
        p = X.shape[1]
        counter = self

        def columns(order):
            order = np.asarray(order)
            return float(counter.col_nnz[order[order < p]].sum())

        def wrap(name, count):
            original = getattr(cpu, name, None)
            if original is None or name in self._wrapped:
                return
            self._wrapped[name] = original

            def wrapper(*args):
                counter.entries += count(args)
                return original(*args)
            setattr(cpu, name, wrapper)

        wrap("scd_epoch", lambda a: columns(a[9]))
        wrap("scd_epoch_violation", lambda a: columns(a[9]))
        full = lambda a: counter.total if a[4] == p else 0.0  # noqa: E731 (by columns only)
        wrap("major_dot", full)
        wrap("major_dot_pair", full)
        wrap("major_scatter", lambda a: columns(np.flatnonzero(a[6])) if a[4] == p else 0.0)
        wrap("lines_scatter", lambda a: columns(a[5][a[6] != 0]))

    def uninstall(self):
        for name, original in self._wrapped.items():
            setattr(cpu, name, original)
        self._wrapped = {}

    def passes(self) -> float:
        return self.entries / self.total


# ------------------------------------------------------------------------- problems


def onehot(n):
    X, _, _ = make_onehot(n, 20, 1000, random_state=0)
    rng = np.random.default_rng(1)
    w = np.where(rng.random(X.shape[1]) < 0.1, rng.standard_normal(X.shape[1]), 0.0)
    y = X @ w / math.sqrt(20) + 0.5 * rng.standard_normal(n)
    X = X.tocsc()
    X.sort_indices()
    return X, y


def dense(n, p=100):
    rng = np.random.default_rng(0)
    X = np.empty((n, p), order="F")
    X[:, 0] = rng.standard_normal(n)
    for j in range(1, p):  # AR(1) correlation 0.5 between neighbours
        X[:, j] = 0.5 * X[:, j - 1] + math.sqrt(0.75) * rng.standard_normal(n)
    w = np.where(rng.random(p) < 0.2, rng.standard_normal(p), 0.0)
    return X, X @ w + 2.0 * rng.standard_normal(n)


def a9a():
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(str(A9A), n_features=123)
    X = sp.csc_matrix(X, dtype=np.float64)
    X.sort_indices()
    return X, y.astype(np.float64)


def alpha_for(X, y, l1_ratio, fraction):
    """alpha giving about ``fraction`` non-zero coefficients (bisection in log alpha)."""
    n = X.shape[0]
    top = float(np.abs(X.T @ (y - y.mean())).max()) / n / l1_ratio
    lo, hi = math.log(top * 1e-5), math.log(top)
    for _ in range(10):
        mid = 0.5 * (lo + hi)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            r = dask_scd.fit(X, y, penalty="elasticnet", l1_ratio=l1_ratio, alpha=math.exp(mid),
                             tol=1e-4, solver="scd", random_state=0, max_iter=200)
        if np.mean(r.coef_ != 0) > fraction:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


# -------------------------------------------------------------------------- solvers


def relative_gap(problem, X, y, coef, intercept):
    return obj.certificate(problem, X, y, np.asarray(coef, dtype=np.float64),
                           float(intercept)).relative_gap


def ours(X, y, alpha, l1_ratio, target, repeat, counter):
    best = None
    for _ in range(repeat):
        counter.entries = 0.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            t0 = time.perf_counter()
            r = dask_scd.fit(X, y, penalty="elasticnet", l1_ratio=l1_ratio, alpha=alpha,
                             tol=target, solver="scd", random_state=0, max_iter=100_000)
            seconds = time.perf_counter() - t0
        row = (seconds, counter.passes(), r.dual_gap_, int(np.sum(r.coef_ != 0)))
        best = row if best is None or row[0] < best[0] else best
    return best


def laddered(make, problem, X, y, target, repeat):
    """(seconds, passes or nan, certified gap, tol) of the first rung reaching target."""
    for tol in LADDER:
        est = make(tol)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            est.fit(X, y)
        gap = relative_gap(problem, X, y, est.coef_, est.intercept_)
        if gap <= target:
            break
    else:
        return None
    times = []
    for _ in range(repeat):
        est = make(tol)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            t0 = time.perf_counter()
            est.fit(X, y)
            times.append(time.perf_counter() - t0)
    passes = float(getattr(est, "n_iter_", np.nan) or np.nan)
    return min(times), passes, gap, tol


def sklearn_maker(alpha, l1_ratio):
    from sklearn.linear_model import ElasticNet, Lasso

    if l1_ratio == 1.0:
        return lambda tol: Lasso(alpha=alpha, tol=tol, max_iter=1_000_000, selection="cyclic")
    return lambda tol: ElasticNet(alpha=alpha, l1_ratio=l1_ratio, tol=tol, max_iter=1_000_000)


def skglm_maker(alpha, l1_ratio):
    try:
        from skglm import ElasticNet, Lasso
    except ImportError:
        return None
    if l1_ratio == 1.0:
        return lambda tol: Lasso(alpha=alpha, tol=tol, max_iter=1000, fit_intercept=True)
    return lambda tol: ElasticNet(alpha=alpha, l1_ratio=l1_ratio, tol=tol, max_iter=1000,
                                  fit_intercept=True)


# ----------------------------------------------------------------------------- main


def problems(names, rows):
    if "onehot" in names:
        X, y = onehot(rows)
        yield "one-hot lasso", X, y, 1.0, 0.01
        yield "one-hot lasso", X, y, 1.0, 0.10
    if "a9a" in names and A9A.exists():
        X, y = a9a()
        for l1_ratio in (1.0, 0.5):
            for fraction in (0.01, 0.10):
                yield "a9a " + ("lasso" if l1_ratio == 1 else "enet 0.5"), X, y, l1_ratio, fraction
    if "dense" in names:
        X, y = dense(rows)
        yield "dense lasso", X, y, 1.0, 0.10


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="onehot,a9a,dense")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--others", default="sklearn,skglm")
    args = parser.parse_args()
    names = args.problems.split(",")
    others = args.others.split(",") if args.others else []
    Xc, yc = dense(300, 10)  # compile our kernels outside the timings
    dask_scd.fit(Xc, yc, penalty="l1", alpha=0.01, solver="scd", max_iter=20)
    dask_scd.fit(sp.csc_matrix(Xc), yc, penalty="l1", alpha=0.01, solver="scd", max_iter=20)
    if "skglm" in others and skglm_maker(0.1, 1.0) is not None:
        skglm_maker(0.01, 1.0)(1e-6).fit(Xc, yc)
        skglm_maker(0.01, 1.0)(1e-6).fit(sp.csc_matrix(Xc), yc)
    print(f"dask_scd from {Path(dask_scd.__file__).parent}")
    print("| problem | shape | alpha | nnz | target | ours s (passes) | sklearn s (epochs) "
          "| skglm s |")
    print("|---|---|---|---|---|---|---|---|")
    counter = PassCounter()
    for name, X, y, l1_ratio, fraction in problems(names, args.rows):
        alpha = alpha_for(X, y, l1_ratio, fraction)
        problem = obj.Problem("squared", alpha, l1_ratio, True)
        for target in TARGETS:
            counter.install(X)
            mine = ours(X, y, alpha, l1_ratio, target, args.repeat, counter)
            counter.uninstall()
            cells = [f"{mine[0]:.3f} ({mine[1]:.1f})"]
            for other, maker in (("sklearn", sklearn_maker), ("skglm", skglm_maker)):
                make = maker(alpha, l1_ratio) if other in others else None
                got = None if make is None else laddered(make, problem, X, y, target,
                                                         args.repeat)
                if got is None:
                    cells.append("—")
                elif other == "sklearn":
                    cells.append(f"{got[0]:.3f} ({got[1]:.0f})")
                else:
                    cells.append(f"{got[0]:.3f}")
            print(f"| {name} | {X.shape[0]}x{X.shape[1]} | {alpha:.3g} | {mine[3]} "
                  f"| {target:.0e} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
