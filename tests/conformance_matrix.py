"""The conformance matrix (tests/test_conformance*.py): every combination the registry
declares solves the problem asked.

The rows are generated from :mod:`dask_scd.engines.registry`, never written by hand: for
every engine, every loss × penalty the problem check accepts × data kind ("memory",
"dask", "grid") × weighted or not × with coefficient bounds or not, the engine's own
:meth:`~registry.Engine.refusal` says whether it is declared (a bounded row is made where
the engine solves the row without bounds: declared, or refused for the bounds alone). A declared combination is fitted on a small problem, with
the form of its input (numpy dense, CSR, CSC; X's dtype; fit_intercept; weights given
to ``fit``, stored in the grid, or both) taken in turn over the engine's rows, and
checked against an independent reference:

- the objective of the returned model, recomputed here in numpy from the problem asked
  (the weights that apply, X as the engines read it), is within 1e-7 of the reference
  optimum (in-memory Newton at tol 1e-12; SDCA where Newton does not take the
  problem; with bounds, scipy's L-BFGS-B on the box, tests/box_reference.py), and a
  bounded model lies in its box;
- the reported primal is that recomputed objective (the certificate is of the problem
  asked, not of another one), and the reported gap bounds the true suboptimality.

A combination that is not declared raises a ValueError naming the engines that do solve
it. An engine that declares a ``callback`` option is fitted once per function that runs
it with a callback that stops the fit at its first certified epoch: the fit stops there,
without a ConvergenceWarning, says so, and its certificate is of the point it returns. Adding an engine, a data kind or a capability to the registry adds its rows here.
The rows on in-memory X and the refusals run in tests/test_conformance.py, those on dask
arrays and grids (a shared cluster) in tests/test_conformance_cluster.py: two files, which
``make test`` runs side by side.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from dataclasses import dataclass

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from box_reference import bounded_optimum
from scipy.special import logsumexp
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd.engines import registry
from dask_scd.objectives import LOSSES, MULTINOMIAL, Bounds
from dask_scd.validation import check_problem

ALPHA = 0.05
PENALTIES = ("l2", "l1", "elasticnet", None)
KINDS = ("memory", "dask", "grid")
CONTAINERS = {"memory": ("dense", "csr", "csc"), "dask": ("dask",), "grid": ("grid",)}
DTYPES = (np.float64, np.float32, np.int8, np.int64, np.bool_)
# Where the weights come from, for a weighted row on a grid (else given to fit).
WEIGHT_SOURCES = ("given", "stored", "both")
FIT_TOL = 1e-8
AGREE = 1e-7  # relative distance of the objective to the reference optimum
# The box of the bounded rows: sign-constrained, two-sided around 0, away from 0 on
# either side.
BOX_LOWER = np.array([0.0, -np.inf, -0.3, 0.05, -1.0])
BOX_UPPER = np.array([np.inf, 0.0, 0.3, np.inf, -0.02])
# On a GPU, under numba's CUDA simulator: a few rows, a few epochs.
DEVICE_ROWS = 12
DEVICE_EPOCHS = 2


@dataclass(frozen=True)
class Row:
    engine: str
    loss: str
    penalty: str | None
    kind: str
    weighted: bool
    container: str = ""
    dtype: type = np.float64
    fit_intercept: bool = True
    weights_from: str = ""
    device: str = "cpu"
    bounded: bool = False

    @property
    def id(self) -> str:
        weights = f"w-{self.weights_from}" if self.weighted else "unweighted"
        return ("box-" if self.bounded else "") + "-".join(
            map(
                str,
                (
                    self.engine,
                    self.loss,
                    self.penalty,
                    self.container or self.kind,
                    weights,
                    np.dtype(self.dtype).name,
                    "b" if self.fit_intercept else "nob",
                    self.device,
                ),
            )
        )

    @property
    def rows(self) -> slice:
        """The examples it is fitted on: all of them, or the first DEVICE_ROWS on a GPU
        (numba's simulator runs a kernel's threads in Python)."""
        return slice(0, DEVICE_ROWS) if self.device == "gpu" else slice(None)


def _problem(loss, penalty, bounded=False):
    problem = check_problem(loss, penalty, ALPHA, 0.5, True)
    if not bounded:
        return problem
    return dataclasses.replace(problem, bounds=Bounds(BOX_LOWER, BOX_UPPER))


def _problems():
    """Every loss × penalty that the problem check accepts (the others are refused for
    every engine alike, before any engine is chosen)."""
    for loss, penalty in itertools.product((*LOSSES, MULTINOMIAL), PENALTIES):
        try:
            _problem(loss, penalty)
        except ValueError:
            continue
        yield loss, penalty


def _matrix():
    """(declared rows, refused rows), from the registry's declarations. The form of the
    input is taken in turn over each engine's declared rows, so every container, dtype,
    intercept and weight source meets every engine."""
    declared, refused = [], []
    for name, engine in registry.ENGINES.items():
        k = 0
        axes = itertools.product(_problems(), KINDS, (False, True), (False, True))
        for (loss, penalty), kind, weighted, bounded in axes:
            row = Row(name, loss, penalty, kind, weighted, bounded=bounded)
            if engine.refusal(_problem(loss, penalty, bounded), weighted, kind) is not None:
                if not bounded:
                    refused.append(row)
                elif not weighted and engine.refusal(_problem(loss, penalty), False, kind) is None:
                    refused.append(row)  # refused for the bounds alone
                continue
            containers = CONTAINERS[kind]
            sources = WEIGHT_SOURCES if kind == "grid" else ("given",)
            declared.append(
                Row(
                    name,
                    loss,
                    penalty,
                    kind,
                    weighted,
                    containers[k % len(containers)],
                    DTYPES[k % len(DTYPES)],
                    (k // len(DTYPES)) % 2 == 0,
                    sources[k % len(sources)] if weighted else "",
                    bounded=bounded,
                )
            )
            k += 1
    return declared, refused


def _device_matrix():
    """(declared rows, refused rows) on a GPU: in-memory X, every problem an engine solves
    on the CPU, declared where its ``gpu`` losses take it (without weights), refused with
    the engines that do otherwise. Dense and CSR X in turn."""
    declared, refused = [], []
    for name, engine in registry.ENGINES.items():
        k = 0
        for (loss, penalty), weighted in itertools.product(_problems(), (False, True)):
            problem = _problem(loss, penalty)
            if engine.refusal(problem, weighted, "memory") is not None:
                continue  # refused on the CPU already: a row of the matrix above
            row = Row(
                name,
                loss,
                penalty,
                "memory",
                weighted,
                ("dense", "csr")[k % 2],
                weights_from="given" if weighted else "",
                device="gpu",
            )
            if engine.refusal(problem, weighted, "memory", device="gpu") is None:
                declared.append(row)
                k += 1
            else:
                refused.append(row)
    return declared, refused


def _callback_rows(declared):
    """The rows that check an engine's ``callback``: for every engine whose options
    declare one, its first declared row per function that runs it (the routes: the
    hinge's, the softmax's and the unpenalized Newton, SDCA and DuHL out of core on a
    grid, block SCD in memory and on the cluster, CoCoA in memory and over Dask)."""
    rows, seen = [], set()
    for row in declared:
        engine = registry.get(row.engine)
        if "callback" not in engine.options.names() or row.bounded:
            continue
        where = (engine.entry_for(row.kind, row.loss), row.kind == "memory", row.penalty is None)
        if (row.engine, where) not in seen:
            seen.add((row.engine, where))
            rows.append(row)
    return rows


DECLARED, REFUSED = _matrix()
DEVICE_DECLARED, DEVICE_REFUSED = _device_matrix()
CALLBACK_ROWS = _callback_rows(DECLARED)


def _data():
    """Small integer-valued X (about 40 % zeros: sparse containers hold real zeros), and
    binary, three-class and real targets, with integer weights (some 0)."""
    rng = np.random.default_rng(0)
    n, p = 90, 5
    X = rng.integers(-2, 3, size=(n, p)).astype(np.float64)
    X[rng.random((n, p)) < 0.25] = 0.0
    score = X @ rng.normal(size=p)
    binary = np.where(score + rng.logistic(size=n) > 0, 7, 3)  # labels other than ±1
    three = np.digitize(score + rng.logistic(size=n), [-1.0, 1.0])
    real = score + 0.5 * rng.normal(size=n)
    given = rng.integers(0, 4, size=n).astype(np.float64)
    stored = rng.integers(1, 3, size=n).astype(np.float64)
    return X, {"binary": binary, "three": three, "real": real}, given, stored


X_BASE, TARGETS, GIVEN_WEIGHTS, STORED_WEIGHTS = _data()


def _target(row: Row):
    return _target_of(row.loss)[row.rows]


def _target_of(loss):
    if loss == MULTINOMIAL:
        return TARGETS["three"]
    return TARGETS["real"] if loss == "squared" else TARGETS["binary"]


def weights_of(row: Row):
    """(weights given to fit, weights stored in the grid, the weights that apply)."""
    if not row.weighted:
        return None, None, None
    given = GIVEN_WEIGHTS[row.rows] if row.weights_from in ("given", "both") else None
    stored = STORED_WEIGHTS[row.rows] if row.weights_from in ("stored", "both") else None
    return given, stored, given if given is not None else stored


def _engine_values(row: Row):
    """X as the engines read it: the values of X in the row's dtype, as float64 (a float32
    X is read as it is; its values are small integers, exact in float32)."""
    return X_BASE[row.rows].astype(row.dtype).astype(np.float64)


def _primal(row: Row, coef, intercept, classes, weights):
    """The objective of the problem asked at (coef, intercept), in numpy."""
    X = _engine_values(row)
    y = _target(row)
    margins = X @ np.asarray(coef).T + intercept
    if row.loss == MULTINOMIAL:
        index = np.searchsorted(classes, y)
        losses = logsumexp(margins, axis=1) - margins[np.arange(len(y)), index]
    elif row.loss == "squared":
        losses = 0.5 * (y - margins) ** 2
    else:
        signs = np.where(y == classes[1], 1.0, -1.0)
        slack = np.maximum(0.0, 1.0 - signs * margins)
        losses = {
            "logistic": np.logaddexp(0.0, -signs * margins),
            "hinge": slack,
            "squared_hinge": slack**2,
        }[row.loss]
    w = np.ones(len(y)) if weights is None else weights
    value = float(np.dot(w, losses) / w.sum())
    ratio = {"l2": 0.0, "l1": 1.0, "elasticnet": 0.5, None: None}[row.penalty]
    if ratio is None:
        return value
    theta = np.ravel(coef)
    return value + ALPHA * (ratio * np.abs(theta).sum() + (1 - ratio) / 2 * theta @ theta)


_REFERENCES: dict = {}


def _reference(row: Row, weights) -> float:
    """The optimum of the problem asked, by in-memory Newton at tol 1e-12 (SDCA where
    Newton does not take it: the weighted hinge; L-BFGS-B on the box with bounds)."""
    key = (
        row.loss,
        row.penalty,
        row.fit_intercept,
        np.dtype(row.dtype).name,
        row.weighted and row.weights_from,
        row.device,
        row.bounded,
    )
    if key in _REFERENCES:
        return _REFERENCES[key]
    if row.bounded:
        classes = np.unique(_target(row))
        y = _target(row) if row.loss == "squared" else np.where(_target(row) == classes[1], 1, -1)
        ratio = {"l2": 0.0, "l1": 1.0, "elasticnet": 0.5}[row.penalty]
        args = (row.loss, ALPHA, ratio, row.fit_intercept, BOX_LOWER, BOX_UPPER, weights)
        coef, intercept, _ = bounded_optimum(_engine_values(row), y, *args)
        _REFERENCES[key] = _primal(row, coef, intercept, classes, weights)
    else:
        problem = _problem(row.loss, row.penalty)
        solver = (
            "newton"
            if registry.get("newton").refusal(problem, weights is not None) is None
            else "sdca"
        )
        result = dask_scd.fit(
            _engine_values(row),
            _target(row),
            loss=row.loss,
            penalty=row.penalty,
            alpha=ALPHA,
            l1_ratio=0.5,
            fit_intercept=row.fit_intercept,
            tol=1e-12,
            max_iter=100_000,
            solver=solver,
            sample_weight=weights,
        )
        _REFERENCES[key] = _primal(row, result.coef_, result.intercept_, result.classes_, weights)
    return _REFERENCES[key]


@pytest.fixture(scope="module")
def client():
    """One in-process cluster of 2 workers for a test module's rows."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        yield c


def grid_stores(root):
    """``grid(loss, dtype, stored)``: the grid store of the matrix's X for that target,
    dtype and stored weights, written under ``root`` on first use and opened."""
    written = {}

    def grid(loss, dtype, stored):
        key = (
            loss if loss in ("squared", MULTINOMIAL) else "binary",
            np.dtype(dtype).name,
            stored is not None,
        )
        if key not in written:
            path = root / "-".join(map(str, key))
            dask_scd.to_grid(
                X_BASE.astype(dtype),
                _target_of(loss),
                path,
                row_chunk=30,
                blocks=[[0, 1, 2], [3, 4]],
                sample_weight=stored,
            )
            written[key] = path
        return dask_scd.open_grid(written[key])

    return grid


@pytest.fixture(scope="module")
def grids(tmp_path_factory):
    """Grid stores, one per (target, dtype, stored weights), written on first use."""
    return grid_stores(tmp_path_factory.mktemp("grids"))


def _input(row: Row, grids, stored):
    """(X, y) in the row's container and dtype."""
    X = X_BASE[row.rows].astype(row.dtype)
    y = _target(row)
    if row.container == "csr":
        return sp.csr_matrix(X), y
    if row.container == "csc":
        return sp.csc_matrix(X), y
    if row.container == "dask":
        return da.from_array(X, chunks=(30, 3)), y
    if row.container == "grid":
        return grids(row.loss, row.dtype, stored), None
    return X, y


def fit_row(row: Row, grids, client, **extra):
    given, stored, _ = weights_of(row)
    X, y = _input(row, grids, stored)
    options = dict(extra)
    engine = registry.get(row.engine)
    if row.kind != "memory" and "client" in engine.options.names():
        options["client"] = client
    return dask_scd.fit(
        X,
        y,
        loss=row.loss,
        penalty=row.penalty,
        alpha=ALPHA,
        l1_ratio=0.5,
        fit_intercept=row.fit_intercept,
        solver=row.engine,
        sample_weight=given,
        random_state=0,
        device=row.device,
        **({"lower_bounds": BOX_LOWER, "upper_bounds": BOX_UPPER} if row.bounded else {}),
        **options,
    )


def check_declared(row: Row, grids, client) -> None:
    """Fit a declared row and check it against the reference (the module docstring). On
    a GPU (numba's simulator runs an epoch of 12 rows in seconds) the fit stops after
    DEVICE_EPOCHS: its certificate must still be of the problem asked, and honest."""
    _, _, weights = weights_of(row)
    on_gpu = row.device == "gpu"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if on_gpu else "error", ConvergenceWarning)
        result = fit_row(
            row, grids, client, tol=FIT_TOL, max_iter=DEVICE_EPOCHS if on_gpu else 20_000
        )
    assert result.extras_["device"] == row.device
    assert result.extras_["plan"]["engine"] == row.engine
    assert result.extras_["plan"]["rule"] == "named"
    primal = _primal(row, result.coef_, result.intercept_, result.classes_, weights)
    best = _reference(row, weights)
    scale = max(abs(best), 1e-12)
    # The certificate is of the problem asked: its primal is this objective at this model.
    assert result.primal_ == pytest.approx(primal, rel=1e-9, abs=1e-12)
    if not on_gpu:
        assert (primal - best) / scale <= AGREE
    if row.penalty is not None:  # the gap bounds the true suboptimality (D ≤ P*)
        assert primal - best <= result.dual_gap_ * abs(primal) + 1e-12 * scale
    if row.bounded:
        assert np.all((BOX_LOWER <= result.coef_) & (result.coef_ <= BOX_UPPER))


def check_callback_stops(row: Row, grids, client) -> None:
    """Fit a declared row with a callback that asks to stop at once: it is called once,
    with the epoch's figures; the fit returns after that epoch (``n_iter_``, the history's
    last entry), says it was stopped, and certifies the point it returns (its primal is
    the objective there, its gap bounds the true suboptimality)."""
    _, _, weights = weights_of(row)
    seen = []

    def stop(info):
        seen.append(info)
        return True

    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        result = fit_row(row, grids, client, tol=1e-14, max_iter=50, callback=stop)
    assert len(seen) == 1
    assert {"epoch", "relative_gap", "primal", "seconds"} <= set(seen[0])
    assert result.extras_["stopped_by_callback"] is True
    assert result.n_iter_ == seen[0]["epoch"] == result.history_.iteration[-1]
    primal = _primal(row, result.coef_, result.intercept_, result.classes_, weights)
    assert result.primal_ == pytest.approx(primal, rel=1e-9, abs=1e-12)
    if row.penalty is not None:
        best = _reference(row, weights)
        assert primal - best <= result.dual_gap_ * abs(primal) + 1e-12 * max(abs(best), 1e-12)
