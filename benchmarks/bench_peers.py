"""dask_scd against the fastest single-thread peers, on the same problems, in the same run.

For each row (a loss, a penalty, an alpha and a data set), every method's solutions are
scored by ONE function of ours, :func:`evaluate` (``dask_scd.certificate``'s primal, in
scikit-learn's scaling), against a reference optimum P* (the minimum objective found by a
very tight fit of ours, a tight scikit-learn fit and every run of the row; our tight fit's
dual value certifies how close P* is to the true optimum). Reported per method:

(a) the time to a relative objective error ``(P − P*)/|P*| ≤ 1e-6``: each method is run
    from scratch at tightening tolerances, and the first run that reaches the target
    gives the time (best of 3 for sub-second runs);
(b) for dask_scd, the wall time of ``dask_scd.fit(..., tol=1e-6)``, a *certified*
    relative duality gap of 1e-6, with its epochs (``n_iter_``).

Peers: scikit-learn (every applicable solver), skglm, celer, glum, Snap ML (the ``bench``
extra); a peer that is not installed is skipped and the results say so. Everything runs on
one thread. Results are printed and appended to ``benchmarks/results/peers.md``.

Run ``python benchmarks/bench_peers.py`` (full, ≤ ~30 min) or ``--quick`` (small sizes,
a few rows). See benchmarks/README.md.
"""

from __future__ import annotations

import os

# Single thread everywhere, before numpy (and its BLAS, numba, OpenMP) is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402
import math  # noqa: E402
import multiprocessing  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass, field, replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

import dask_scd  # noqa: E402
from dask_scd.datasets import make_onehot  # noqa: E402
from dask_scd.objectives import loss_derivative, optimal_intercept  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "peers.md"
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TARGET = 1e-6  # relative objective error, and our certified relative gap
DIRECT = None  # the ladder setting of a method without a tolerance (a direct solve)


# ------------------------------------------------------------- problem and yardstick


@dataclass(frozen=True)
class Spec:
    """One problem in our scaling: (1/n) Σ loss + alpha·(ρ‖θ‖₁ + (1−ρ)/2‖θ‖²)."""

    loss: str
    penalty: str
    alpha: float
    l1_ratio: float = 0.0  # used by penalty="elasticnet"
    fit_intercept: bool = True
    # liblinear and Snap ML fit the intercept as the weight of a constant column of this
    # value, penalized with the others: see intercept_scaling_for.
    intercept_scaling: float = 100.0

    @property
    def rho(self) -> float:
        return {"l2": 0.0, "l1": 1.0, "elasticnet": self.l1_ratio}[self.penalty]

    @property
    def classification(self) -> bool:
        return self.loss != "squared"

    def problem(self) -> dask_scd.Problem:
        return dask_scd.Problem(self.loss, self.alpha, self.rho, self.fit_intercept)


def evaluate(spec: Spec, X, y, coef, intercept=0.0) -> dask_scd.Certificate:
    """Our certificate of any solution (coef, intercept): its ``.primal`` is the yardstick.

    ``y`` holds ±1 labels for the classification losses.
    """
    coef = np.asarray(coef, dtype=np.float64).ravel()
    b = float(np.ravel(intercept)[0]) if np.size(intercept) else 0.0
    return dask_scd.certificate(spec.problem(), X, y, coef, b if spec.fit_intercept else 0.0)


def intercept_scaling_for(spec: Spec, intercept: float, primal: float, slack=1e-7) -> float:
    """The smallest power of 10 (≥ 1) that makes a penalized intercept harmless.

    A constant column of value s carries the intercept b as the weight b/s, which the
    L2 term charges α(1−ρ)/2·(b/s)²; s is chosen so that this is ≤ slack·|P| at our
    optimum (b, P). A larger s would condition those solvers' problems worse.
    """
    need = math.sqrt(max(spec.alpha, 1e-300) * intercept * intercept / (2 * slack * abs(primal)))
    return float(10.0 ** math.ceil(math.log10(max(need, 1.0))))


# The peers' parameters for a Spec on n examples. Each is checked by tests/test_bench_peers.py.


def sklearn_C(spec: Spec, n: int) -> float:
    """LogisticRegression / LinearSVC: C Σ loss + pen(θ)  ⇔  ours divided by C·n."""
    return 1.0 / (spec.alpha * n)


def sklearn_ridge_alpha(spec: Spec, n: int) -> float:
    """Ridge: ‖y − Xθ‖² + α_sk‖θ‖²  ⇔  ours (½ mean squares + α/2‖θ‖²) times 2n."""
    return spec.alpha * n


def snapml_regularizer(spec: Spec, n: int) -> float:
    """Snap ML: Σ loss + λ·pen(θ) (same penalty shapes as ours)  ⇔  ours times n."""
    return spec.alpha * n


def glum_params(spec: Spec) -> dict:
    """glum: deviance/(2n) + α(ρ‖θ‖₁ + (1−ρ)/2‖θ‖²); deviance/2 is our summed loss."""
    return {
        "alpha": spec.alpha,
        "l1_ratio": spec.rho,
        "family": "binomial" if spec.loss == "logistic" else "normal",
    }


# ------------------------------------------------------------------------ methods


@dataclass
class Method:
    """One solver of one library on one row, run at a ladder of settings."""

    name: str
    build: Callable  # (setting, max_iter) -> estimator
    ladder: tuple = (DIRECT,)  # tolerances, loosest first
    layout: str = "rows"  # "rows" (C order / CSR) or "columns" (Fortran / CSC)
    labels01: bool = False  # glum's binomial family wants 0/1 labels
    intercept_factor: float = 1.0  # Snap ML reports the intercept's column weight
    max_iter: int | None = None  # high: runs are stopped by time, not by iterations
    reference: bool = False  # scikit-learn's solver for the tight reference fit
    note: str = ""


@dataclass
class Skipped:
    name: str
    reason: str


def _optional(module: str):
    """The module, or the reason it cannot be imported."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken binary wheel
        return f"{module} not installed ({type(exc).__name__}: {exc})"


def _tols(first=-2, last=-12):
    return tuple(10.0**k for k in range(first, last - 1, -1))


def _penalized_note(spec):
    if not spec.fit_intercept:
        return ""
    return f"intercept penalized (intercept_scaling={spec.intercept_scaling:g})"


def sklearn_methods(spec: Spec, n: int, p: int, dense: bool) -> list:
    from sklearn.linear_model import ElasticNet, Lasso, LogisticRegression, Ridge
    from sklearn.svm import LinearSVC

    fi, out = spec.fit_intercept, []
    small_p = p <= 5000  # solvers that form a p x p (or n x n) matrix
    if spec.loss == "logistic":
        C = sklearn_C(spec, n)
        l1 = spec.rho == 1.0
        if spec.penalty == "elasticnet":
            return [Skipped("scikit-learn", "elastic-net logistic rows are not benchmarked")]
        deprecated = inspect.signature(LogisticRegression).parameters["penalty"].default
        pen = (
            {"l1_ratio": float(l1)}
            if deprecated == "deprecated"
            else {"penalty": "l1" if l1 else "l2"}
        )

        def logreg(solver, **kw):
            return lambda tol, it: LogisticRegression(
                C=C, solver=solver, tol=tol, max_iter=it, fit_intercept=fi, **pen, **kw
            )

        solvers = (
            ("liblinear", "saga")
            if l1
            else ("lbfgs", "newton-cholesky", "liblinear", "sag", "saga")
        )
        for solver in solvers:
            if solver == "newton-cholesky" and not small_p:
                out.append(
                    Skipped(
                        f"sklearn LogisticRegression({solver})", f"forms a dense {p} x {p} Hessian"
                    )
                )
                continue
            kw = {"intercept_scaling": spec.intercept_scaling} if solver == "liblinear" else {}
            out.append(
                Method(
                    f"sklearn LogisticRegression({solver})",
                    logreg(solver, **kw),
                    _tols(),
                    "rows",
                    max_iter=100_000 if solver in ("sag", "saga") else 10_000,
                    reference=(
                        solver == ("liblinear" if l1 else "newton-cholesky" if small_p else "lbfgs")
                    ),
                    note=_penalized_note(spec) if kw else "",
                )
            )
    elif spec.loss in ("hinge", "squared_hinge"):
        C = sklearn_C(spec, n)
        duals = (True,) if spec.loss == "hinge" else (True, False)
        for dual in duals:
            out.append(
                Method(
                    f"sklearn LinearSVC(dual={dual})",
                    lambda tol, it, dual=dual: LinearSVC(
                        C=C,
                        loss=spec.loss,
                        dual=dual,
                        tol=tol,
                        max_iter=it,
                        fit_intercept=fi,
                        intercept_scaling=spec.intercept_scaling,
                    ),
                    _tols(),
                    "rows",
                    max_iter=1_000_000,
                    reference=dual is (spec.loss == "hinge"),
                    note=_penalized_note(spec),
                )
            )
    elif spec.penalty in ("l1", "elasticnet"):
        cls = Lasso if spec.penalty == "l1" else ElasticNet
        kw = {} if spec.penalty == "l1" else {"l1_ratio": spec.l1_ratio}
        variants = (False, True) if dense else (False,)
        for pre in variants:
            out.append(
                Method(
                    f"sklearn {cls.__name__}(cd{', precompute' if pre else ''})",
                    lambda tol, it, pre=pre: cls(
                        alpha=spec.alpha,
                        tol=tol,
                        max_iter=it,
                        fit_intercept=fi,
                        precompute=pre,
                        **kw,
                    ),
                    _tols(),
                    "columns",
                    max_iter=100_000,
                    reference=not pre,
                )
            )
    else:
        a_sk = sklearn_ridge_alpha(spec, n)
        for solver in ("cholesky", "sparse_cg", "lsqr", "sag", "saga"):
            name = f"sklearn Ridge({solver})"
            if solver == "cholesky":
                if min(n, p) > 5000:
                    out.append(Skipped(name, f"factors a dense {min(n, p)}² matrix"))
                    continue
                out.append(
                    Method(
                        name,
                        lambda tol, it: Ridge(alpha=a_sk, solver="cholesky", fit_intercept=fi),
                        (DIRECT,),
                        "rows",
                        reference=True,
                    )
                )
                continue
            out.append(
                Method(
                    name,
                    lambda tol, it, solver=solver: Ridge(
                        alpha=a_sk, solver=solver, tol=tol, max_iter=it, fit_intercept=fi
                    ),
                    _tols(),
                    "rows",
                    max_iter=100_000,
                    reference=(solver == "sparse_cg" and min(n, p) > 5000),
                )
            )
    return out


def skglm_methods(spec: Spec, n: int, p: int, dense: bool) -> list:
    skglm = _optional("skglm")
    if isinstance(skglm, str):
        return [Skipped("skglm", skglm)]
    fi = spec.fit_intercept
    if spec.loss == "logistic":
        return [
            Method(
                "skglm SparseLogisticRegression",
                lambda tol, it: skglm.SparseLogisticRegression(
                    alpha=spec.alpha, l1_ratio=spec.rho, tol=tol, max_iter=it, fit_intercept=fi
                ),
                _tols(),
                "columns",
                max_iter=1000,
            )
        ]
    if spec.loss == "hinge" and fi:
        return [Skipped("skglm LinearSVC", "fits no intercept (fit_intercept is ignored)")]
    if spec.loss == "hinge":
        return [
            Method(
                "skglm LinearSVC (dual CD)",
                lambda tol, it: skglm.LinearSVC(
                    C=sklearn_C(spec, n), tol=tol, max_iter=it, fit_intercept=fi
                ),
                _tols(),
                "columns",
                max_iter=1000,
            )
        ]
    if spec.loss == "squared" and spec.penalty == "l1":
        return [
            Method(
                "skglm Lasso",
                lambda tol, it: skglm.Lasso(
                    alpha=spec.alpha, tol=tol, max_iter=it, fit_intercept=fi
                ),
                _tols(),
                "columns",
                max_iter=1000,
            )
        ]
    if spec.loss == "squared" and spec.penalty == "elasticnet":
        return [
            Method(
                "skglm ElasticNet",
                lambda tol, it: skglm.ElasticNet(
                    alpha=spec.alpha, l1_ratio=spec.l1_ratio, tol=tol, max_iter=it, fit_intercept=fi
                ),
                _tols(),
                "columns",
                max_iter=1000,
            )
        ]
    return [Skipped("skglm", f"no estimator for loss={spec.loss}, penalty={spec.penalty}")]


def celer_methods(spec: Spec, n: int, p: int, dense: bool) -> list:
    if not (spec.penalty in ("l1", "elasticnet") and spec.loss in ("squared", "logistic")):
        return [Skipped("celer", "L1 / elastic-net problems only")]
    celer = _optional("celer")
    if isinstance(celer, str):
        return [Skipped("celer", celer)]
    fi = spec.fit_intercept
    if spec.loss == "logistic":
        if fi or spec.penalty != "l1":
            return [Skipped("celer LogisticRegression", "fits no intercept (L1 only)")]
        return [
            Method(
                "celer LogisticRegression",
                lambda tol, it: celer.LogisticRegression(
                    C=sklearn_C(spec, n), tol=tol, max_iter=it
                ),
                _tols(),
                "columns",
                max_iter=1000,
            )
        ]
    if spec.penalty == "l1":
        return [
            Method(
                "celer Lasso",
                lambda tol, it: celer.Lasso(
                    alpha=spec.alpha, tol=tol, max_iter=it, fit_intercept=fi
                ),
                _tols(),
                "columns",
                max_iter=1000,
            )
        ]
    return [
        Method(
            "celer ElasticNet",
            lambda tol, it: celer.ElasticNet(
                alpha=spec.alpha, l1_ratio=spec.l1_ratio, tol=tol, max_iter=it, fit_intercept=fi
            ),
            _tols(),
            "columns",
            max_iter=1000,
        )
    ]


def glum_methods(spec: Spec, n: int, p: int, dense: bool) -> list:
    if spec.loss not in ("squared", "logistic"):
        return [Skipped("glum", f"no {spec.loss} loss (GLM families only)")]
    glum = _optional("glum")
    if isinstance(glum, str):
        return [Skipped("glum", glum)]
    params = glum_params(spec)
    out = []
    for solver in ("irls-cd", "lbfgs"):
        name = f"glum ({solver})"
        if solver == "lbfgs" and spec.rho > 0:
            out.append(Skipped(name, "lbfgs takes no L1 term"))
            continue
        if solver == "irls-cd" and p > 5000:
            out.append(Skipped(name, f"forms a dense {p} x {p} Hessian"))
            continue
        out.append(
            Method(
                name,
                lambda tol, it, solver=solver: glum.GeneralizedLinearRegressor(
                    solver=solver,
                    gradient_tol=tol,
                    max_iter=it,
                    fit_intercept=spec.fit_intercept,
                    **params,
                ),
                _tols(),
                "columns",
                labels01=spec.loss == "logistic",
                max_iter=10_000,
            )
        )
    return out


def snapml_methods(spec: Spec, n: int, p: int, dense: bool) -> list:
    snapml = _optional("snapml")
    if isinstance(snapml, str):
        return [Skipped("snapml", snapml)]
    if spec.penalty == "elasticnet":
        return [Skipped("snapml", "no elastic-net penalty")]
    if spec.rho > 0 and spec.fit_intercept:
        # L1 needs its primal solver, which fits no intercept.
        return [Skipped("snapml", "its L1 (primal) solver fits no intercept")]
    lam = snapml_regularizer(spec, n)
    common = {
        "regularizer": lam,
        "n_jobs": 1,
        "fit_intercept": spec.fit_intercept,
        "intercept_scaling": spec.intercept_scaling,
    }
    classes = {"logistic": snapml.LogisticRegression, "squared": snapml.LinearRegression}
    if spec.loss in classes:
        cls = classes[spec.loss]
        extra = {"dual": True} if spec.rho == 0 else {"dual": False, "penalty": "l1"}
        name = f"snapml {cls.__name__}({'dual' if extra['dual'] else 'primal'})"
    else:
        cls, extra = snapml.SupportVectorMachine, {"loss": spec.loss}
        name = "snapml SupportVectorMachine"

    def build(tol, it):
        return cls(tol=tol, max_iter=it, **common, **extra)

    # Snap ML's intercept_ is the weight of its constant column, not times its scaling.
    return [
        Method(
            name,
            build,
            _tols(),
            "rows",
            max_iter=1_000_000,
            intercept_factor=spec.intercept_scaling if spec.fit_intercept else 1.0,
            note=_penalized_note(spec) if spec.fit_intercept else "",
        )
    ]


PEERS = (sklearn_methods, skglm_methods, celer_methods, glum_methods, snapml_methods)


def solution(method: Method, est):
    """(coef, intercept) of a fitted peer estimator, in our convention."""
    coef = np.asarray(est.coef_, dtype=np.float64).ravel()
    intercept = np.ravel(getattr(est, "intercept_", 0.0))
    b = float(intercept[0]) if intercept.size else 0.0
    return coef, b * method.intercept_factor


def n_iterations(est):
    it = getattr(est, "n_iter_", None)
    if it is None:
        return None
    try:
        return int(np.max(it))
    except (TypeError, ValueError):
        return None


def our_solvers() -> tuple:
    """Every solver name dask_scd accepts, looked up at run time (new engines appear)."""
    names = None
    for module in ("dask_scd.engines.registry", "dask_scd.validation"):
        names = getattr(_optional(module), "SOLVERS", None)
        if names:
            break
    return ("auto",) + tuple(s for s in names or () if s != "auto")


# --------------------------------------------------------------------------- data


@dataclass
class Data:
    """One design in the layouts each method prefers, with regression and ±1 targets."""

    name: str
    rows: object  # C-order ndarray or CSR
    columns: object  # Fortran-order ndarray or CSC
    y_reg: np.ndarray
    y_cls: np.ndarray

    @property
    def shape(self):
        return self.rows.shape

    @property
    def dense(self) -> bool:
        return not sp.issparse(self.rows)

    def X(self, layout):
        return self.columns if layout == "columns" else self.rows


def _both_layouts(name, X, y_reg, y_cls) -> Data:
    if sp.issparse(X):
        rows = sp.csr_matrix(X, dtype=np.float64)
        rows.sort_indices()
        # int32 indices: some scikit-learn solvers refuse int64 ones.
        rows.indices = rows.indices.astype(np.int32)
        rows.indptr = rows.indptr.astype(np.int32)
        cols = rows.tocsc()
        cols.sort_indices()
    else:
        rows = np.ascontiguousarray(X, dtype=np.float64)
        cols = np.asfortranarray(rows)
    return Data(name, rows, cols, np.asarray(y_reg, np.float64), np.asarray(y_cls, np.float64))


def load_adult():
    """a8a ∪ a9a.t (LIBSVM Adult, 123 binary features), or None when absent."""
    files = [SHARED_DATA / "a8a", SHARED_DATA / "a9a.t"]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        return None, f"{', '.join(missing)} not present"
    from sklearn.datasets import load_svmlight_file

    parts = [load_svmlight_file(str(f), n_features=123) for f in files]
    X = sp.vstack([Xi for Xi, _ in parts]).tocsr()
    y = np.concatenate([yi for _, yi in parts])
    y = np.where(y > 0, 1.0, -1.0)
    return _both_layouts(f"Adult (a8a + a9a.t) {X.shape[0]}x{X.shape[1]}", X, y, y), ""


def make_dense(n, p=100, seed=0) -> Data:
    """Gaussian features, AR(1) correlation 0.5 between neighbouring columns; a planted
    model with p/5 non-zero weights gives ``y = Xw + 2·noise`` and logistic ±1 labels."""
    rng = np.random.default_rng(seed)
    X = np.empty((n, p), order="F")
    X[:, 0] = rng.standard_normal(n)
    for j in range(1, p):
        X[:, j] = 0.5 * X[:, j - 1] + math.sqrt(0.75) * rng.standard_normal(n)
    w = np.zeros(p)
    support = rng.choice(p, size=p // 5, replace=False)
    w[support] = rng.choice([-1.0, 1.0], support.size) * rng.uniform(0.5, 2.0, support.size)
    score = X @ w
    y_reg = score + 2.0 * rng.standard_normal(n)
    prob = 1.0 / (1.0 + np.exp(-2.0 * score / score.std()))
    y_cls = np.where(rng.random(n) < prob, 1.0, -1.0)
    rows = np.ascontiguousarray(X)
    return Data(f"dense {_count(n)}x{p}", rows, X, y_reg, y_cls)


def make_sparse(n, cardinality, seed=0) -> Data:
    """``make_onehot(n, 20, cardinality)``: 20 one-hot fields, 20 non-zeros per row; the
    regression target is its planted model plus noise (same X for both tasks)."""
    X, y_cls, _ = make_onehot(n, 20, cardinality, random_state=seed)
    _, y_reg, _ = make_onehot(n, 20, cardinality, task="regression", noise=0.5, random_state=seed)
    return _both_layouts(f"one-hot {_count(n)}x{_count(X.shape[1])}", X, y_reg, y_cls)


# --------------------------------------------------------------------------- rows


@dataclass
class Row:
    name: str
    data: str  # key of the data set
    loss: str
    penalty: str
    alpha: Callable  # Data -> alpha (our scaling)
    l1_ratio: float = 0.0
    fit_intercept: bool = True


def alpha_for_support(data: Data, loss, fraction, rho=1.0):
    """alpha whose L1 term lets about ``fraction`` of the features in.

    At θ = 0 (intercept fitted) feature j enters the model when |x_jᵀa|/n > αρ, with
    a = −ℓ'(y, b₀): the quantile of those correlations is the first guess. With few
    features (Adult) it is refined by bisection on log alpha with loose fits of ours,
    as correlated features make that guess land far off; the table reports the support
    reached at P*.
    """
    y = data.y_reg if loss == "squared" else data.y_cls
    b0 = optimal_intercept(loss, y, np.zeros_like(y))
    a = -loss_derivative(loss, y, np.full_like(y, b0))
    corr = np.abs(np.asarray(data.columns.T @ a).ravel()) / len(y)
    alpha = float(np.quantile(corr, 1.0 - fraction)) / rho
    p = data.shape[1]
    if p > 1000:
        return alpha
    want = fraction * p
    penalty = "l1" if rho == 1.0 else "elasticnet"
    lo, hi = np.log(alpha) - 5.0, np.log(alpha) + 2.0  # more support below, less above
    for _ in range(12):
        r = dask_scd.fit(
            data.columns,
            y,
            loss=loss,
            penalty=penalty,
            alpha=alpha,
            l1_ratio=rho,
            tol=1e-5,
            max_iter=2000,
            random_state=0,
        )
        nnz = np.count_nonzero(r.coef_)
        if abs(nnz - want) <= max(1.0, 0.2 * want):
            break
        lo, hi = (lo, np.log(alpha)) if nnz < want else (np.log(alpha), hi)
        alpha = float(np.exp(0.5 * (lo + hi)))
    return alpha


def inv_n(scale):
    """alpha = scale / n, n the rows of the row's data."""
    return lambda data: scale / data.shape[0]


def support(loss, fraction, rho=1.0):
    """alpha letting in about ``fraction`` of the features (:func:`alpha_for_support`)."""
    return lambda data: alpha_for_support(data, loss, fraction, rho)


def all_rows() -> list:
    rows = []
    for k, s in (("1/n", 1.0), ("0.1/n", 0.1), ("0.01/n", 0.01)):
        rows.append(Row(f"adult logistic L2 alpha={k}", "adult", "logistic", "l2", inv_n(s)))
    for f in (0.1, 0.5):
        rows.append(
            Row(
                f"adult logistic L1 ~{f:.0%} nnz", "adult", "logistic", "l1", support("logistic", f)
            )
        )
    # Without an intercept liblinear's problem is ours (it penalizes its intercept): the
    # weaker L1 (at least half the features in) and L2 at C = 1 and 10 where it is fastest.
    for f in (0.5, 0.8):
        rows.append(
            Row(
                f"adult logistic L1 ~{f:.0%} nnz no intercept",
                "adult",
                "logistic",
                "l1",
                support("logistic", f),
                fit_intercept=False,
            )
        )
    for C in (1, 10):
        rows.append(
            Row(
                f"adult logistic C={C} no intercept",
                "adult",
                "logistic",
                "l2",
                inv_n(1.0 / C),
                fit_intercept=False,
            )
        )
    for loss in ("hinge", "squared_hinge"):
        for C in (1, 10):
            rows.append(Row(f"adult {loss} C={C}", "adult", loss, "l2", inv_n(1.0 / C)))
    # liblinear and Snap ML penalize their intercept, so on the rows above none solves our
    # problem; without an intercept they solve exactly the same one.
    for C in (1, 10):
        rows.append(
            Row(
                f"adult hinge C={C} no intercept",
                "adult",
                "hinge",
                "l2",
                inv_n(1.0 / C),
                fit_intercept=False,
            )
        )
    for f in (0.01, 0.1):
        rows.append(
            Row(f"adult lasso ~{f:.0%} nnz", "adult", "squared", "l1", support("squared", f))
        )
        rows.append(
            Row(
                f"adult elasticnet(0.5) ~{f:.0%} nnz",
                "adult",
                "squared",
                "elasticnet",
                support("squared", f, 0.5),
                0.5,
            )
        )
    for data in ("dense", "onehot"):
        rows.append(Row(f"{data} ridge alpha=1/n", data, "squared", "l2", inv_n(1.0)))
        rows.append(Row(f"{data} lasso ~10% nnz", data, "squared", "l1", support("squared", 0.1)))
        rows.append(Row(f"{data} logistic L2 alpha=1/n", data, "logistic", "l2", inv_n(1.0)))
    rows.append(Row("onehot p>n ridge alpha=1/n", "onehot_wide", "squared", "l2", inv_n(1.0)))
    return rows


QUICK_ROWS = (
    "adult logistic L2 alpha=1/n",
    "adult lasso ~10% nnz",
    "adult hinge C=1",
    "dense lasso ~10% nnz",
    "onehot logistic L2 alpha=1/n",
)


@dataclass(frozen=True)
class Sizes:
    n: int  # rows of the generated data sets
    cardinality: int  # one-hot: 20 fields of this many values
    wide_n: int  # rows of the p > n one-hot data set
    budget_small: float  # seconds of runs per method per row, Adult
    budget_large: float  # seconds of runs per method per row, generated data
    run_cap: float  # a run still going after this many seconds is stopped
    reference_cap: float  # the same for each of the two reference fits


FULL = Sizes(1_000_000, 5000, 20_000, 5.0, 15.0, 15.0, 30.0)
QUICK = Sizes(50_000, 500, 4_000, 3.0, 6.0, 6.0, 10.0)


# ------------------------------------------------------------------------ running


@dataclass
class Run:
    setting: object  # tol, or None for a direct solver
    seconds: float
    primal: float
    dual: float  # a lower bound on P* (our certificate of the run's solution)
    n_iter: int | None
    nnz: int


@dataclass
class Outcome:
    name: str
    runs: list = field(default_factory=list)
    skipped: str = ""
    stopped: str = ""
    note: str = ""
    error: str = ""
    certified: dict | None = None  # ours: the fit at tol=TARGET

    def hit(self, p_star):
        """The first run within TARGET of P* (runs are in ladder order)."""
        return next((r for r in self.runs if rel_error(r.primal, p_star) <= TARGET), None)

    def best_error(self, p_star):
        return min((rel_error(r.primal, p_star) for r in self.runs), default=math.inf)

    @property
    def spent(self):
        return sum(r.seconds for r in self.runs)


def rel_error(primal, p_star):
    if not math.isfinite(p_star):  # no reference: nothing counts as reached
        return math.inf
    return max(primal - p_star, 0.0) / abs(p_star)


def isolated(fit, timeout):
    """``fit()`` in a forked child process, killed after ``timeout`` seconds.

    The child inherits the data (copy-on-write) and everything compiled by the warm-up;
    ``fit`` times its own solve and returns a small picklable dict. Returns
    ``(status, value)``: ("ok", dict), ("timeout", None) or ("error", message).
    """
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child():
        try:
            _limit_memory(CHILD_MEMORY)
            gc.collect()
            send.send(("ok", fit()))
        except BaseException as exc:  # a peer's refusal of the problem, or a crash
            text = str(exc).splitlines()[0][:140] if str(exc) else ""
            send.send(("error", f"{type(exc).__name__}: {text}"))
        finally:
            send.close()

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    send.close()
    try:
        if receive.poll(timeout):
            status, value = receive.recv()
        else:
            status, value = "timeout", None
    except EOFError:
        status, value = "died", None
    finally:
        proc.join(timeout=5.0)  # the child exits once its result is sent
        if proc.is_alive():
            proc.kill()
            proc.join()
        receive.close()
    if status == "died":
        status, value = "error", f"the run died (exit code {proc.exitcode})"
    return status, value


CHILD_MEMORY = 6 * 2**30  # bytes a run may add to what it inherits


def _limit_memory(extra):
    """Cap the address space at its current size + ``extra``: a solver that would form a
    huge dense matrix gets a MemoryError instead of pushing a shared machine into swap."""
    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, resource.RLIM_INFINITY))


def best_of(fit, seconds, timeout, repeats=3):
    """Re-time a sub-second run (best of ``repeats``): the first may pay cold caches."""
    if seconds >= 1.0:
        return seconds
    for _ in range(repeats - 1):
        status, value = isolated(fit, timeout)
        if status == "ok":
            seconds = min(seconds, value["seconds"])
    return seconds


def _peer_fit(method: Method, setting, X, y):
    est = method.build(setting, method.max_iter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        est.fit(X, y)
        seconds = time.perf_counter() - t0
    coef, b = solution(method, est)
    return {"seconds": seconds, "coef": coef, "intercept": b, "n_iter": n_iterations(est)}


def _targets(spec, data, labels01=False):
    y = data.y_reg if spec.loss == "squared" else data.y_cls
    return y, ((y > 0).astype(np.float64) if labels01 else y)


def score(spec, data, value, setting) -> Run:
    """Our certificate of a run's solution, as a Run."""
    y, _ = _targets(spec, data)
    cert = evaluate(spec, data.rows, y, value["coef"], value["intercept"])
    dual = cert.dual
    if value.get("own_gap") is not None:  # ours: the fit's own (possibly tighter) dual
        dual = max(dual, value["own_primal"] - value["own_gap"] * abs(value["own_primal"]))
    return Run(
        setting,
        value["seconds"],
        cert.primal,
        dual,
        value["n_iter"],
        int(np.count_nonzero(value["coef"])),
    )


def run_peer(
    method: Method, spec: Spec, data: Data, p_work: float, budget: float, cap: float
) -> Outcome:
    """The method from scratch at each ladder setting until its objective is within TARGET
    of ``p_work``, its objective stalls, a run is stopped at ``cap`` s or the budget is spent.
    """
    out = Outcome(method.name, note=method.note)
    X = data.X(method.layout)
    _, y_fit = _targets(spec, data, method.labels01)
    stalls = 0
    for setting in method.ladder:
        remaining = budget - out.spent
        if remaining <= 0:
            out.stopped = f"budget {budget:.0f} s spent"
            break
        timeout = max(1.0, min(cap, remaining))

        def fit():
            return _peer_fit(method, setting, X, y_fit)

        status, value = isolated(fit, timeout)
        if status == "timeout":
            out.stopped = f"run at {_setting(setting)} stopped after {timeout:.0f} s"
            break
        if status == "error":
            out.error = value
            break
        run = score(spec, data, value, setting)
        hit = rel_error(run.primal, p_work) <= TARGET
        if hit:
            run.seconds = best_of(fit, run.seconds, timeout)
        out.runs.append(run)
        if hit:
            break
        if len(out.runs) >= 2 and run.primal >= out.runs[-2].primal * (1 - 1e-12):
            stalls += 1  # a tighter tolerance that changes nothing
            if stalls >= 3:
                out.stopped = "objective stalled over 3 tolerances"
                break
        else:
            stalls = 0
    return out


def fit_ours(spec, X, y, solver, tol, max_iter):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dask_scd.fit(
            X,
            y,
            loss=spec.loss,
            penalty=spec.penalty,
            alpha=spec.alpha,
            l1_ratio=spec.l1_ratio or 0.5,
            fit_intercept=spec.fit_intercept,
            tol=tol,
            max_iter=max_iter,
            solver=solver,
            random_state=0,
        )


def passes(result):
    """Passes over the data, when the result records them: the Newton engines count
    theirs; an epoch of SCD/SDCA is one pass; the Gram engine reads X once."""
    extras = getattr(result, "extras_", None) or {}
    if "total_passes" in extras:
        return f"{extras['total_passes']:.0f}"
    solver = getattr(result, "solver_", None)
    if solver in ("scd", "sdca"):
        return f"{result.n_iter_} (epochs)"
    if solver == "gram":
        return "1"
    for attr in ("n_passes_", "passes_", "n_data_passes_"):
        value = getattr(result, attr, None)
        if value is not None:
            return value
    return None


def _our_fit(spec, X, y, solver, tol, max_iter=1_000_000):
    t0 = time.perf_counter()
    r = fit_ours(spec, X, y, solver, tol, max_iter)
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "coef": r.coef_,
        "intercept": r.intercept_,
        "n_iter": r.n_iter_,
        "own_primal": r.primal_,
        "own_gap": r.dual_gap_,
        "converged": r.converged_,
        "solver": r.solver_,
        "passes": passes(r),
        "history": (list(r.history_.primal), list(r.history_.relative_gap)),
    }


def too_big(solver, p):
    """Why a forced engine is not run on p features (a dense p x p matrix over 1 GiB)."""
    if solver == "gram" and 8 * p * p > 2**30:
        return f"solver='gram' would form a dense {p} x {p} Gram matrix"
    return ""


def probe_ours(spec, data, solver, cap):
    """One epoch: does the solver apply, which engine runs, which layout it gets."""
    reason = too_big(solver, data.shape[1])
    if reason:
        return None, reason
    y, _ = _targets(spec, data)
    status, value = isolated(lambda: _our_fit(spec, data.columns, y, solver, TARGET, 1), cap)
    if status != "ok":
        return None, value or f"one epoch took over {cap:.0f} s"
    layout = "columns" if value["solver"] in COLUMN_ENGINES else "rows"
    return (value["solver"], layout), ""


# Our engines that read X by columns (given CSC / Fortran order); the others read rows
# (CSR / C order): SDCA, Newton, L-BFGS and block SCD's row cells (one-hot 1M x 100k,
# one thread: Newton 3.4 s from CSC against 2.5 s from CSR, block SCD 6.4 against 5.1).
COLUMN_ENGINES = ("scd", "gram", "duhl", "cocoa")


def run_ours(spec, data, solver, p_work, budget, cap) -> Outcome:
    """(b) fit(tol=1e-6) first; then (a) the first of tol = 1e-3, 1e-4, 1e-5 (or 1e-7,
    1e-8 when the 1e-6 fit is not yet within TARGET of P*) within TARGET of P*."""
    name = f"dask_scd solver={solver!r}"
    info, reason = probe_ours(spec, data, solver, cap)
    if info is None:
        return Outcome(name, skipped=reason)
    engine, layout = info
    if solver == "auto":
        name += f" (→ {engine})"
    out = Outcome(name)
    X = data.X(layout)
    y, _ = _targets(spec, data)

    def attempt(tol, timeout):
        def fit():
            return _our_fit(spec, X, y, solver, tol)

        status, value = isolated(fit, timeout)
        if status != "ok":
            out.stopped = (
                f"run at tol={tol:.0e} stopped after {timeout:.0f} s" if status == "timeout" else ""
            )
            out.error = value if status == "error" else ""
            return None, None
        run = score(spec, data, value, tol)
        run.seconds = best_of(fit, run.seconds, timeout)
        return run, value

    run, value = attempt(TARGET, cap)
    if run is None:
        return out
    out.certified = {
        "seconds": run.seconds,
        "n_iter": value["n_iter"],
        "passes": value["passes"],
        "gap": value["own_gap"],
        "converged": value["converged"],
        "history": value["history"],
    }
    certified = run
    reached = rel_error(run.primal, p_work) <= TARGET
    ladder = (1e-3, 1e-4, 1e-5) if reached else (1e-7, 1e-8)
    for tol in ladder:
        remaining = budget - out.spent - certified.seconds
        if remaining <= 0:
            break
        run, _ = attempt(tol, max(1.0, min(cap, remaining)))
        if run is None:
            break
        out.runs.append(run)
        if rel_error(run.primal, p_work) <= TARGET:
            break
    # Ladder order (loosest first), so that hit() finds the first run within TARGET.
    out.runs = sorted(out.runs + [certified], key=lambda r: -r.setting)
    return out


REFERENCE_TOL = 1e-9  # certified: P_ref is within 1e-9·|P*| of the optimum, 1000x the target


def our_reference(spec, data, cap):
    """Our tight fit (tol=REFERENCE_TOL) behind P*: its Run, its intercept, and a note."""
    info, reason = probe_ours(spec, data, "auto", cap)
    if info is None:
        return None, 0.0, f"ours: {reason}"
    y, _ = _targets(spec, data)
    status, value = isolated(lambda: _our_fit(spec, data.X(info[1]), y, "auto", REFERENCE_TOL), cap)
    if status != "ok":
        return None, 0.0, f"ours tol={REFERENCE_TOL:.0e}: {status} {value or ''}".strip()
    note = (
        f"ours tol={REFERENCE_TOL:.0e} ({value['solver']}, {value['n_iter']} epochs, "
        f"gap {value['own_gap']:.0e}, {value['seconds']:.1f} s)"
    )
    return score(spec, data, value, REFERENCE_TOL), value["intercept"], note


def sklearn_reference(spec, data, methods, cap):
    """scikit-learn's reference solver at its tightest setting: its Run (or None), a note."""
    ref = next((m for m in methods if isinstance(m, Method) and m.reference), None)
    if ref is None:
        return None, "no scikit-learn reference solver"
    setting = ref.ladder[-1]
    X = data.X(ref.layout)
    _, y_fit = _targets(spec, data, ref.labels01)
    status, value = isolated(lambda: _peer_fit(ref, setting, X, y_fit), cap)
    if status != "ok":
        return None, f"{ref.name} {_setting(setting)}: {status} {value or ''}".strip()
    return score(spec, data, value, setting), (
        f"{ref.name} {_setting(setting)} ({value['seconds']:.1f} s)"
    )


def warm_up(spec, data, methods, ours=True):
    """Compile / first-call costs (numba, lazy imports) on a slice, in this process so
    that every forked run inherits them."""
    n = data.shape[0]
    take = np.unique(np.linspace(0, n - 1, min(n, 400)).astype(int))
    columns = data.columns[take]
    small = Data(
        "slice",
        data.rows[take],
        columns.tocsc() if sp.issparse(columns) else np.asfortranarray(columns),
        data.y_reg[take],
        data.y_cls[take],
    )
    y, _ = _targets(spec, small)
    for solver in our_solvers() if ours else ():
        if too_big(solver, data.shape[1]):
            continue
        for X in (small.rows, small.columns):
            try:
                fit_ours(spec, X, y, solver, 1e-3, 3)
            except Exception:
                pass  # a solver that refuses the problem: the runs say why
    if ours:
        # One step of auto on the whole data: the slice may take other inner paths (a
        # Gram where the whole data takes columns, or the reverse) whose first call would
        # otherwise be paid by every forked run.
        try:
            fit_ours(spec, data.columns, _targets(spec, data)[0], "auto", 1e-3, 1)
        except Exception:
            pass
    for m in methods:
        if isinstance(m, Method):
            try:
                _peer_fit(m, m.ladder[0], small.X(m.layout), _targets(spec, small, m.labels01)[1])
            except Exception:
                pass  # the timed runs report it


@dataclass
class RowResult:
    row: Row
    data_name: str
    spec: Spec
    p_star: float
    dual_bound: float
    reference_notes: list
    nnz: int
    p: int
    ours: list
    peers: list


def run_row(row: Row, data: Data, sizes: Sizes, large: bool) -> RowResult:
    spec = Spec(row.loss, row.penalty, row.alpha(data), row.l1_ratio, row.fit_intercept)
    n, p = data.shape
    budget = sizes.budget_large if large else sizes.budget_small
    warm_up(spec, data, [])
    mine, intercept, note = our_reference(spec, data, sizes.reference_cap)
    if mine is not None:
        spec = replace(spec, intercept_scaling=intercept_scaling_for(spec, intercept, mine.primal))
    methods = [m for make in PEERS for m in make(spec, n, p, data.dense)]
    warm_up(spec, data, methods, ours=False)
    theirs, their_note = sklearn_reference(spec, data, methods, sizes.reference_cap)
    refs = [r for r in (mine, theirs) if r is not None]
    notes = [note, their_note]
    p_work = min((r.primal for r in refs), default=-math.inf)
    log(f"  reference P = {p_work:.12g}: {'; '.join(notes)}")
    ours = [run_ours(spec, data, s, p_work, budget, sizes.run_cap) for s in our_solvers()]
    if not refs:
        # Both tight fits ran out of time: our certified (tol ≤ 1e-6) fits stand in; the
        # errors are recomputed against the final P* at the end.
        p_work = min((r.primal for o in ours for r in o.runs), default=-math.inf)
        log(f"  no reference fit finished: P = {p_work:.12g} from our fits")
    for o in ours:
        log("  " + _summary_line(o, p_work))
    peers = []
    for m in methods:
        if isinstance(m, Skipped):
            peers.append(Outcome(m.name, skipped=m.reason))
        else:
            peers.append(run_peer(m, spec, data, p_work, budget, sizes.run_cap))
        log("  " + _summary_line(peers[-1], p_work))
    every = refs + [r for o in ours + peers for r in o.runs]
    p_star = min(r.primal for r in every) if every else math.nan
    dual = max((r.dual for r in every), default=-math.inf)
    best = min(every, key=lambda r: r.primal) if every else None
    return RowResult(
        row, data.name, spec, p_star, dual, notes, best.nnz if best else 0, p, ours, peers
    )


# ------------------------------------------------------------------------- output


def _count(n):
    for unit, scale in (("M", 1_000_000), ("k", 1_000)):
        if n >= scale and n % (scale // 10) == 0:
            return f"{n / scale:g}{unit}"
    return str(n)


def _sec(s):
    return "—" if s is None else (f"{s:.3g} s" if s < 100 else f"{s:.0f} s")


def _setting(s):
    return "direct" if s is None else f"tol={s:.0e}"


def _time_cell(o: Outcome, p_star):
    if o.skipped:
        return f"n/a ({o.skipped})"
    h = o.hit(p_star)
    if h is not None:
        it = f", {h.n_iter} it" if h.n_iter is not None else ""
        return f"{_sec(h.seconds)} ({_setting(h.setting)}{it})"
    if o.error and not o.runs:
        return f"error: {o.error}"
    if not o.runs:
        return f"not reached ({o.stopped})"
    return f"not reached (best error {o.best_error(p_star):.1e} in {_sec(o.spent)})"


def _summary_line(o: Outcome, p_star):
    return f"{o.name}: {_time_cell(o, p_star)}" + (f" [{o.stopped}]" if o.stopped else "")


def fastest(outcomes, p_star):
    timed_hits = [(o.hit(p_star).seconds, o) for o in outcomes if o.hit(p_star)]
    return min(timed_hits, key=lambda t: t[0]) if timed_hits else (None, None)


def tightness(certified, p_star):
    """How tight our certificate is where it matters: along the iterates of our
    fit(tol=1e-6), the certified gap G over the true error E (floored at TARGET/10) at the
    first iterate within TARGET of P*, and how many iterates the fit ran after it.
    G/E ≤ 10 there means the fit stops at that iterate or about one later."""
    if not certified or not certified.get("history"):
        return "—"
    primal, gaps = certified["history"]
    errors = [rel_error(v, p_star) for v in primal]
    first = next((k for k, e in enumerate(errors) if e <= TARGET), None)
    if first is None:
        return "not reached"
    ratio = gaps[first] / max(errors[first], 0.1 * TARGET)
    return f"{ratio:.2g} (+{len(errors) - 1 - first})"


def summary_table(results):
    header = [
        "row",
        "data",
        "alpha",
        "nnz(θ*)",
        "P* certified to",
        "ours auto to 1e-6 error",
        "ours auto fit(tol=1e-6): wall, epochs, passes",
        "gap/error at 1e-6 (+iterates after)",
        "best ours to 1e-6 error",
        "fastest peer",
        "peer time",
        "ratio (peer / ours auto)",
        "flag",
    ]
    lines = []
    for res in results:
        auto = res.ours[0]
        t_auto = auto.hit(res.p_star).seconds if auto.hit(res.p_star) else None
        cert = auto.certified or {}
        cert_cell = (
            (
                f"{_sec(cert['seconds'])}, {cert['n_iter']} ep, "
                f"{cert['passes'] if cert['passes'] is not None else '—'}"
                f"{'' if cert['converged'] else ' (not converged)'}"
            )
            if cert
            else "—"
        )
        t_best, best = fastest(res.ours, res.p_star)
        t_peer, peer = fastest(res.peers, res.p_star)
        ratio = t_peer / t_auto if t_peer and t_auto else None
        flag = (
            "**ours > 2x slower**"
            if ratio is not None and ratio < 0.5
            else "**ours (auto) not reached**"
            if t_auto is None and t_peer is not None
            else "no peer reached"
            if t_peer is None
            else ""
        )
        lines.append(
            [
                res.row.name,
                res.data_name,
                f"{res.spec.alpha:.3g}",
                f"{res.nnz}/{res.p}",
                f"{max(res.p_star - res.dual_bound, 0) / abs(res.p_star):.0e}",
                _sec(t_auto),
                cert_cell,
                tightness(cert, res.p_star),
                f"{_sec(t_best)} ({best.name})" if best else "—",
                peer.name if peer else "—",
                _sec(t_peer),
                f"{ratio:.2f}" if ratio is not None else "—",
                flag,
            ]
        )
    return md_table(header, lines)


def detail_table(results):
    header = [
        "row",
        "method",
        "time to 1e-6 objective error (setting, iterations)",
        "runs (setting: s, error)",
        "notes",
    ]
    lines = []
    for res in results:
        for o in res.ours + res.peers:
            runs = ", ".join(
                f"{_setting(r.setting)}: {r.seconds:.3g}, {rel_error(r.primal, res.p_star):.0e}"
                for r in o.runs
            )
            notes = [x for x in (o.note, o.stopped, o.error and f"error: {o.error}") if x]
            if o.certified:
                c = o.certified
                notes.append(
                    f"fit(tol=1e-6): {_sec(c['seconds'])}, n_iter_={c['n_iter']}, "
                    f"passes={c['passes'] if c['passes'] is not None else '—'}, "
                    f"certified gap {c['gap']:.1e}"
                )
            lines.append(
                [res.row.name, o.name, _time_cell(o, res.p_star), runs or "—", "; ".join(notes)]
            )
    return md_table(header, lines)


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c).replace("|", "/") for c in r) + " |" for r in rows]
    return "\n".join(out)


def versions():
    out = []
    for name, module in (
        ("numpy", "numpy"),
        ("scipy", "scipy"),
        ("scikit-learn", "sklearn"),
        ("numba", "numba"),
        ("skglm", "skglm"),
        ("celer", "celer"),
        ("glum", "glum"),
        ("snapml", "snapml"),
    ):
        mod = _optional(module)
        if isinstance(mod, str):
            out.append(f"{name} not installed")
            continue
        version = getattr(mod, "__version__", None)
        if version is None:
            from importlib.metadata import PackageNotFoundError
            from importlib.metadata import version as dist_version

            try:
                version = dist_version(name)
            except PackageNotFoundError:
                version = "?"
        out.append(f"{name} {version}")
    return ", ".join(out)


def library_commit():
    """The benchmarked library's commit, and whether dask_scd/ had local edits."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "dask_scd"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return f"commit {head}" + (" + uncommitted changes to dask_scd/" if dirty.strip() else "")


def load_average():
    try:
        return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        return "?"


def log(*a):
    print(*a, flush=True)


# --------------------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK.n} generated rows and only the rows "
        f"{', '.join(QUICK_ROWS).replace('%', '%%')} "
        "(unless --rows), small budgets: a try of the harness",
    )
    p.add_argument(
        "--rows", default=None, help="regular expression: run the rows whose name it matches"
    )
    p.add_argument("--list", action="store_true", help="list the row names and exit")
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every time budget and cap (a busy machine needs more)",
    )
    p.add_argument("--output", type=Path, default=RESULTS, help="markdown file to append to")
    p.add_argument("--no-save", action="store_true", help="print only, append nothing")
    return p.parse_args(argv)


def select_rows(args):
    rows = all_rows()
    if args.rows:
        pattern = re.compile(args.rows, re.IGNORECASE)
        return [r for r in rows if pattern.search(r.name)]
    if args.quick:
        return [r for r in rows if r.name in QUICK_ROWS]
    return rows


def build_data(key, sizes: Sizes):
    if key == "adult":
        return load_adult()
    if key == "dense":
        return make_dense(sizes.n), ""
    if key == "onehot":
        return make_sparse(sizes.n, sizes.cardinality), ""
    if key == "onehot_wide":
        return make_sparse(sizes.wide_n, sizes.cardinality, seed=1), ""
    raise KeyError(key)


def main(argv=None):
    args = parse_args(argv)
    if args.list:
        for r in all_rows():
            log(r.name)
        return
    from threadpoolctl import threadpool_limits

    limits = threadpool_limits(limits=1)  # noqa: F841  (held for the whole run)
    sizes = QUICK if args.quick else FULL
    if args.scale != 1.0:
        sizes = replace(
            sizes,
            **{
                k: getattr(sizes, k) * args.scale
                for k in ("budget_small", "budget_large", "run_cap", "reference_cap")
            },
        )
    rows = select_rows(args)
    command = " ".join([os.path.relpath(sys.executable)] + sys.argv)
    started = time.perf_counter()
    load_start = load_average()
    commit = library_commit()
    log(f"# {command}\n{len(rows)} rows; our solvers: {our_solvers()}; {versions()}")
    results, skipped_rows, cache = [], [], {}
    for row in rows:
        if row.data not in cache:
            cache.clear()  # one generated data set in memory at a time
            gc.collect()
            t0 = time.perf_counter()
            cache[row.data] = build_data(row.data, sizes)
            if cache[row.data][0] is not None:
                log(f"data {cache[row.data][0].name}: {time.perf_counter() - t0:.1f} s")
        data, reason = cache[row.data]
        if data is None:
            log(f"skip {row.name}: {reason}")
            skipped_rows.append((row.name, reason))
            continue
        log(f"== {row.name} [{time.perf_counter() - started:.0f} s elapsed]")
        results.append(run_row(row, data, sizes, large=row.data != "adult"))

    elapsed = time.perf_counter() - started
    header = (
        f"## {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC — "
        f"{_machine_cpu()}, {os.cpu_count()} cores (1 thread used)\n\n"
        f"Command: `{command}` (run took {elapsed / 60:.1f} min); library at {commit}; "
        f"load average {load_start} at the start, {load_average()} at the end.\n"
        f"Versions: {versions()}. Our solvers: {', '.join(our_solvers())}.\n"
        f"Sizes: generated data {_count(sizes.n)} rows (p > n one-hot: "
        f"{_count(sizes.wide_n)} rows); per method and row at most {sizes.budget_small:g} s "
        f"of runs on Adult, {sizes.budget_large:g} s on generated data; one run stopped "
        f"after {sizes.run_cap:g} s, each reference fit after {sizes.reference_cap:g} s.\n"
    )
    parts = [header]
    if skipped_rows:
        parts.append("Rows skipped: " + "; ".join(f"{n} ({r})" for n, r in skipped_rows) + "\n")
    absent = sorted(
        {o.skipped for res in results for o in res.peers if "not installed" in o.skipped}
    )
    if absent:
        parts.append("Peers skipped: " + "; ".join(absent) + "\n")
    parts += [
        "Time to a relative objective error (P − P*)/|P*| ≤ 1e-6, each run from scratch "
        "and timed alone (best of 3 when under 1 s), all objectives by dask_scd.certificate "
        "on the same X, y. P* = min over our tol=1e-9 fit (certified), scikit-learn's "
        "reference solver at tol=1e-12 and every run of the row; 'certified to' = "
        "(P* − D)/|P*| with D the best dual value of the row's runs. Ratio = fastest peer's "
        "time / ours (solver='auto'): > 1 means we are faster. All rows fit an intercept.\n",
        summary_table(results),
        "",
        "### Every method\n",
        detail_table(results),
        "",
    ]
    text = "\n".join(parts)
    from _machine import print_and_append  # benchmarks/ is on sys.path when run as a script

    print_and_append(text, args.output, save=not args.no_save)


def _machine_cpu():
    from _machine import cpu_model  # benchmarks/ is on sys.path when run as a script

    return cpu_model()


if __name__ == "__main__":
    main()
