"""Lasso paths and LassoCV: dask_scd against scikit-learn, glum and skglm.

Two tables per data set (Adult, and a generated one-hot regression set):

1. a 100-point lasso path (eps = 1e-3, no intercept, y centred: the problem
   ``sklearn.linear_model.lasso_path`` solves) by ``dask_scd.path`` (tol = 1e-6, a
   certified relative duality gap at every point), scikit-learn's ``lasso_path``,
   glum's ``alpha_search`` and skglm's ``AndersonCD.path`` (tol = 1e-6 each, their own
   stopping rules); the same alphas for all. Every method's objective at every alpha is
   read by ``dask_scd.certificate`` on the same X, y: the table gives the largest
   relative excess over the best of all methods at that alpha. Beside it, our path's
   time against one cold ``dask_scd.fit`` at the smallest alpha (target: within 3x).
2. ``LassoCV(cv=5)`` with an intercept, 100 alphas: ours, scikit-learn's, glum's
   ``GeneralizedLinearRegressorCV`` and skglm's ``GeneralizedLinearEstimatorCV`` (skglm
   takes an int for ``cv``: its own 5 folds), with the alpha each chose.

A peer that is not installed (the ``bench`` extra) is skipped and the table says so.
Everything runs on one thread. Results are printed and appended to
``benchmarks/results/path.md``.

Run ``python benchmarks/bench_path.py`` (one-hot data: ``--rows`` rows, default 50000:
with a peer needing minutes per path, 1M rows would take hours on a shared 2-core
machine) or ``--quick`` (20000 rows). See benchmarks/README.md.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import importlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import (  # noqa: E402
    cpu_model,
    library_commit,
    load_average,
    print_and_append,
)

import dask_scd  # noqa: E402
from dask_scd.datasets import make_onehot  # noqa: E402
from dask_scd.objectives import Problem  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "path.md"
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TOL = 1e-6
N_ALPHAS = 100
EPS = 1e-3
CAP = 300.0  # seconds: a method still running then is stopped (--cap)
CAP_OURS = None  # seconds for dask_scd's rows (--cap-ours); None: CAP
OURS_ONLY = False  # --ours-only: dask_scd's rows alone (a check of a change of ours)


def cap_of(method: str) -> float:
    """The cap of a method's run: --cap-ours for ours where given, else --cap."""
    return CAP_OURS if CAP_OURS is not None and method.startswith("dask_scd") else CAP


def log(message: str) -> None:
    print(message, flush=True)


def optional(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


# --------------------------------------------------------------------------- data


def load_adult():
    """a8a ∪ a9a.t (LIBSVM Adult, 123 binary features; ±1 labels as the target)."""
    files = [SHARED_DATA / "a8a", SHARED_DATA / "a9a.t"]
    if not all(f.exists() for f in files):
        return None
    from sklearn.datasets import load_svmlight_file

    parts = [load_svmlight_file(str(f), n_features=123) for f in files]
    X = sp.vstack([Xi for Xi, _ in parts]).tocsc()
    y = np.where(np.concatenate([yi for _, yi in parts]) > 0, 1.0, -1.0)
    return f"Adult {X.shape[0]}x{X.shape[1]}", X, y


def make_data(rows: int):
    """One-hot regression: 20 fields of 500 values (10,000 features, 20 non-zeros a row)."""
    X, y, _ = make_onehot(rows, 20, 500, task="regression", random_state=0)
    return f"one-hot {rows}x{X.shape[1]}", X.tocsc(), y


# ------------------------------------------------------------------------- timing


def timed(function):
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = function()
    return time.perf_counter() - start, out


def capped(function, cap: float, extract):
    """(seconds, extract(output)) of ``function`` run in a forked process, or None when it
    ran past ``cap`` seconds (then stopped): one slow peer cannot stall the table."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child():
        seconds, out = timed(function)
        send.send((seconds, extract(out)))

    process = context.Process(target=child)
    process.start()
    ready = receive.poll(cap)
    result = receive.recv() if ready else None
    process.join(1.0 if ready else 0.0)
    if process.is_alive():
        process.terminate()
        process.join()
    return result


def objectives(X, y, alphas, coefs, fit_intercept=False, intercepts=None) -> np.ndarray:
    values = []
    for k, alpha in enumerate(alphas):
        problem = Problem("squared", float(alpha), 1.0, fit_intercept)
        b = 0.0 if intercepts is None else float(intercepts[k])
        values.append(dask_scd.certificate(problem, X, y, np.ravel(coefs[:, k]), b).primal)
    return np.array(values)


# ------------------------------------------------------------------------- paths


def path_methods(X, y, alphas):
    """(name, callable returning coefs of shape (p, n_alphas)) or (name, reason)."""
    from sklearn.linear_model import lasso_path

    methods = [
        (
            "dask_scd.path",
            lambda: (
                dask_scd.path(
                    X, y, alphas=alphas, fit_intercept=False, tol=TOL, random_state=0
                ).coefs
            ),
        ),
        ("sklearn lasso_path", lambda: lasso_path(X, y, alphas=alphas, tol=TOL)[1]),
    ]
    glum = optional("glum")
    if glum is None:
        methods.append(("glum", "not installed"))
    else:

        def glum_path():
            model = glum.GeneralizedLinearRegressor(
                alpha_search=True,
                alphas=alphas,
                l1_ratio=1.0,
                fit_intercept=False,
                family="normal",
                gradient_tol=TOL,
            ).fit(X, y)
            return np.asarray(model.coef_path_).T

        methods.append(("glum alpha_search", glum_path))
    skglm = optional("skglm")
    if skglm is None:
        methods.append(("skglm", "not installed"))
    else:
        from skglm.datafits import Quadratic
        from skglm.penalties import L1
        from skglm.solvers import AndersonCD

        def skglm_path():
            solver = AndersonCD(tol=TOL, fit_intercept=False)
            return solver.path(X, y, Quadratic(), L1(1.0), alphas=alphas)[1]

        methods.append(("skglm AndersonCD.path", skglm_path))
    return methods


def run_paths(name, X, y):
    y = y - y.mean()
    alpha_max = float(np.abs(X.T @ y).max()) / X.shape[0]
    alphas = np.geomspace(alpha_max, alpha_max * EPS, N_ALPHAS)
    rows, values = [], {}
    for method, run in path_methods(X, y, alphas):
        if OURS_ONLY and not method.startswith("dask_scd"):
            continue
        if isinstance(run, str):
            rows.append([method, "skipped: " + run, "", ""])
            continue
        log(f"  path: {method}")
        out = capped(
            run, cap_of(method), lambda c: np.asarray(c.toarray() if sp.issparse(c) else c)
        )
        if out is None:
            rows.append([method, f"> {cap_of(method):g} (stopped)", "", ""])
            continue
        seconds, coefs = out
        log(f"    {seconds:.2f} s")
        values[method] = objectives(X, y, alphas, coefs)
        nnz = int(np.count_nonzero(np.abs(coefs[:, -1]) > 0))
        rows.append([method, f"{seconds:.2f}", None, str(nnz)])
    best = np.min(np.array(list(values.values())), axis=0)  # of the methods run
    for row in rows:
        if row[0] in values:
            row[2] = f"{np.max((values[row[0]] - best) / best):.1e}"
    log("  single fits at the smallest alpha")
    singles = []
    for solver in ("auto", "newton"):
        seconds, fitted = timed(
            lambda: dask_scd.fit(
                X,
                y,
                penalty="l1",
                alpha=alphas[-1],
                fit_intercept=False,
                tol=TOL,
                solver=solver,
                random_state=0,
            )
        )
        singles.append(
            f"solver={solver!r}: {seconds:.2f} s ({fitted.solver_}, "
            f"{fitted.n_iter_} iterations, relative gap {fitted.dual_gap_:.1e})"
        )
        if solver == "auto":
            single = seconds
    ours = float(rows[0][1]) if rows[0][1][0].isdigit() else float("nan")
    table = md_table(
        ["method", "100-point path (s)", "max (P − P_best)/P_best", "nnz at the smallest alpha"],
        rows,
    )
    note = (
        f"\nOne cold `dask_scd.fit` at the smallest alpha ({alphas[-1]:.3g}), "
        f"tol={TOL:g}: " + "; ".join(singles) + f". Our path / the first = "
        f"{ours / single:.2f} (target ≤ 3).\n"
    )
    return (
        f"### {name}: lasso path, {N_ALPHAS} alphas, eps={EPS:g}, no intercept\n\n" + table + note
    )


# --------------------------------------------------------------------------- CV


def cv_methods(X, y, folds):
    from sklearn import linear_model

    methods = [
        (
            "dask_scd.LassoCV",
            lambda: dask_scd.LassoCV(
                cv=folds, n_alphas=N_ALPHAS, eps=EPS, tol=TOL, random_state=0
            ).fit(X, y),
        ),
        (
            "sklearn LassoCV",
            lambda: linear_model.LassoCV(cv=folds, alphas=N_ALPHAS, eps=EPS, tol=TOL).fit(X, y),
        ),
    ]
    glum = optional("glum")
    if glum is None:
        methods.append(("glum", "not installed"))
    else:
        methods.append(
            (
                "glum GeneralizedLinearRegressorCV",
                lambda: glum.GeneralizedLinearRegressorCV(
                    l1_ratio=1.0,
                    cv=folds,
                    n_alphas=N_ALPHAS,
                    min_alpha_ratio=EPS,
                    family="normal",
                    gradient_tol=TOL,
                ).fit(X, y),
            )
        )
    skglm = optional("skglm")
    if skglm is None:
        methods.append(("skglm", "not installed"))
    else:
        from skglm.datafits import Quadratic
        from skglm.penalties import L1
        from skglm.solvers import AndersonCD

        methods.append(
            (
                "skglm GeneralizedLinearEstimatorCV (its own 5 folds)",
                lambda: skglm.GeneralizedLinearEstimatorCV(
                    Quadratic(),
                    L1(1.0),
                    AndersonCD(tol=TOL, fit_intercept=True),
                    cv=5,
                    n_alphas=N_ALPHAS,
                    eps=EPS,
                    random_state=0,
                ).fit(X, y),
            )
        )
    return methods


def run_cv(name, X, y):
    from sklearn.model_selection import KFold

    folds = KFold(5, shuffle=True, random_state=0)
    rows = []
    for method, run in cv_methods(X, y, folds):
        if OURS_ONLY and not method.startswith("dask_scd"):
            continue
        if isinstance(run, str):
            rows.append([method, "skipped: " + run, ""])
            continue
        log(f"  cv: {method}")
        out = capped(run, cap_of(method), lambda model: float(np.ravel(model.alpha_)[0]))
        if out is None:
            rows.append([method, f"> {cap_of(method):g} (stopped)", ""])
            continue
        seconds, alpha = out
        log(f"    {seconds:.2f} s")
        rows.append([method, f"{seconds:.2f}", f"{alpha:.4g}"])
    return (
        f"### {name}: LassoCV(cv=5), {N_ALPHAS} alphas, intercept\n\n"
        + md_table(["method", "time (s)", "alpha_"], rows)
        + "\n"
    )


# On a cluster: the folds' paths side by side (dask_scd.estimators.path_cv.FOLDS_AT_ONCE)
# against one after the other, on a grid of the one-hot set, 2 worker processes of one
# thread. Fewer alphas than in memory: every point is a fit on the cluster.
CLUSTER_ALPHAS = 20


def run_cv_cluster(name, X, y, workdir: Path):
    """LassoCV(cv=5) on a grid through a 2-worker LocalCluster, its folds' paths 1 and
    ``FOLDS_AT_ONCE`` at a time: time, alpha_, and whether the fits agree bit for bit."""
    from distributed import Client, LocalCluster
    from sklearn.model_selection import KFold

    from dask_scd.estimators import path_cv

    folds = KFold(5, shuffle=True, random_state=0)
    grid = dask_scd.to_grid(
        X, y, workdir / "cv.zarr", row_chunk=max(1, X.shape[0] // 8), overwrite=True
    )
    at_once = path_cv.FOLDS_AT_ONCE
    rows, models = [], {}
    cells = grid.n_row_chunks * len(grid.blocks)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        for label, count in (("in turn", 1), (f"{at_once} at once", at_once)):
            path_cv.FOLDS_AT_ONCE = count
            log(f"  cv on the cluster, folds {label}")
            before = sum(client.run(store_reads).values())
            try:
                seconds, model = timed(
                    lambda: dask_scd.LassoCV(
                        cv=folds,
                        n_alphas=CLUSTER_ALPHAS,
                        eps=EPS,
                        tol=TOL,
                        solver="block_scd",
                        random_state=0,
                    ).fit(grid)
                )
            finally:
                path_cv.FOLDS_AT_ONCE = at_once
            reads = sum(client.run(store_reads).values()) - before
            log(f"    {seconds:.2f} s, {reads} cell reads from the store")
            models[count] = model
            rows.append(
                [
                    f"dask_scd.LassoCV, grid, folds {label}",
                    f"{seconds:.2f}",
                    f"{float(model.alpha_):.4g}",
                    f"{reads} ({reads / cells:.2f} a cell)",
                ]
            )
    same = np.array_equal(models[1].mse_path_, models[at_once].mse_path_) and np.array_equal(
        models[1].coef_, models[at_once].coef_
    )
    return (
        f"### {name}: LassoCV(cv=5) on a grid, 2 worker processes of 1 thread, "
        f"{CLUSTER_ALPHAS} alphas, solver='block_scd'\n\n"
        + md_table(["method", "time (s)", "alpha_", f"reads from the store ({cells} cells)"], rows)
        + f"\nThe two runs' `mse_path_` and `coef_` are {'the same bits' if same else 'NOT the same bits'}. "
        "The second run finds the cells the first left in the workers' caches.\n"
    )


def store_reads() -> int:
    """Cells this worker has read from the store (its cell cache and spill file served
    the other reads)."""
    from dask_scd.data.cache import CACHE

    return int(CACHE.counts["reads"])


# ------------------------------------------------------------------------- report


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def versions() -> str:
    names = ["numpy", "scipy", "sklearn", "numba", "glum", "skglm"]
    found = []
    for name in names:
        module = optional(name)
        found.append(f"{name} {getattr(module, '__version__', '?') if module else 'absent'}")
    return ", ".join(found)


def main(argv=None):
    global CAP, CAP_OURS, OURS_ONLY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000, help="rows of the one-hot set")
    parser.add_argument("--quick", action="store_true", help="20000 one-hot rows")
    parser.add_argument("--cap", type=float, default=CAP, help="seconds per method")
    parser.add_argument(
        "--cap-ours", type=float, default=None, help="seconds for dask_scd's rows (default: --cap)"
    )
    parser.add_argument("--ours-only", action="store_true", help="skip the peers")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--no-cluster",
        action="store_true",
        help="skip LassoCV on a grid through a 2-worker LocalCluster",
    )
    args = parser.parse_args(argv)
    from threadpoolctl import threadpool_limits

    limits = threadpool_limits(limits=1)  # noqa: F841  (held for the whole run)
    rows = 20_000 if args.quick else args.rows
    CAP, CAP_OURS, OURS_ONLY = args.cap, args.cap_ours, args.ours_only
    command = " ".join([os.path.relpath(sys.executable)] + sys.argv)
    started, load_start = time.perf_counter(), load_average()
    # compile the kernels outside the timings
    X0, y0 = sp.random(200, 30, density=0.2, format="csc", random_state=0), np.arange(200.0)
    timed(lambda: dask_scd.path(X0, y0, n_alphas=5))
    sections = []
    adult = load_adult()
    datasets = ([adult] if adult is not None else []) + [make_data(rows)]
    for name, X, y in datasets:
        log(f"== {name}")
        sections.append(run_paths(name, X, y))
        sections.append(run_cv(name, X, y))
    if not args.no_cluster:
        import tempfile

        name, X, y = datasets[-1]
        log(f"== {name}, on a cluster")
        with tempfile.TemporaryDirectory() as workdir:
            sections.append(run_cv_cluster(name, X, y, Path(workdir)))
    elapsed = time.perf_counter() - started
    header = (
        f"## {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC — "
        f"{cpu_model()}, {os.cpu_count()} cores (1 thread used)\n\n"
        f"Command: `{command}` (run took {elapsed / 60:.1f} min); library at "
        f"{library_commit()}; load average {load_start} at the start, {load_average()} at "
        f"the end.\nVersions: {versions()}. Each method runs alone in a forked process, "
        f"stopped after {CAP:g} s"
        + (f" (dask_scd's after {CAP_OURS:g} s)" if CAP_OURS is not None else "")
        + ".\n"
        + ("Adult: absent (a8a, a9a.t not found), skipped.\n" if adult is None else "")
    )
    print_and_append("\n".join([header] + sections), args.output, save=not args.no_save)


if __name__ == "__main__":
    main()
