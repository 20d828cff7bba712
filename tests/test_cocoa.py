"""The CoCoA engine (solver="cocoa"): its aggregation step, its optimum, its invariances."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize_scalar

import dask_scd
from dask_scd import objectives as obj
from dask_scd.data.cells import WeightedLabels
from dask_scd.engines.cocoa import cocoa_ops as ops
from dask_scd.engines.cocoa import cocoa_parts


def _regression(n=200, p=16, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    y = X @ rng.standard_normal(p) + 0.3 * rng.standard_normal(n) + 1.5
    return X, y


def _classification(n=200, p=16, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    y = (X @ rng.standard_normal(p) + 0.5 * rng.standard_normal(n) > 0.3).astype(float)
    return X, np.where(y > 0, 1.0, -1.0)


def _column_parts(X, K, logistic=False, weights=None):
    bounds = np.linspace(0, X.shape[1], K + 1).astype(int)
    return [
        cocoa_parts.make_part(X[:, lo:hi], "columns", logistic=logistic, weights=weights)
        for lo, hi in zip(bounds[:-1], bounds[1:])
    ], bounds


def _row_parts(X, y, K, weights=None):
    bounds = np.linspace(0, X.shape[0], K + 1).astype(int)
    return [
        cocoa_parts.make_part(
            X[lo:hi], "rows", y[lo:hi], weights=None if weights is None else weights[lo:hi]
        )
        for lo, hi in zip(bounds[:-1], bounds[1:])
    ], bounds


def _weights(n, weighted):
    """Sample weights of mean 1 with zeros, or None."""
    if not weighted:
        return None
    v = np.random.default_rng(11).integers(0, 4, n).astype(float)
    return v * n / v.sum()


# ------------------------------------------------------------- the adaptive step


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(
    "loss, l1_ratio",
    [("squared", 0.0), ("squared", 1.0), ("squared", 0.5), ("logistic", 0.0), ("logistic", 1.0)],
)
def test_primal_gamma_minimizes_the_objective_along_the_direction(loss, l1_ratio, weighted):
    X, y = _regression() if loss == "squared" else _classification()
    problem = obj.Problem(loss, 0.05, l1_ratio, True)
    n, K = len(y), 4
    v = _weights(n, weighted)
    parts, bounds = _column_parts(X, K, loss == "logistic", v)
    targets = y if v is None else WeightedLabels(y, v)  # what the tasks read
    rng = np.random.default_rng(3)
    coef = 0.3 * rng.standard_normal(X.shape[1])  # not the optimum: a real step to take
    intercept = 0.2
    margins = X @ coef + intercept
    updates = [
        ops.primal_solve(part, targets, margins, coef[lo:hi], intercept, problem, 1, seed, k == 0)
        for k, (part, lo, hi, seed) in enumerate(zip(parts, bounds[:-1], bounds[1:], range(K)))
    ]
    direction = ops.primal_direction(*updates)
    assert np.allclose(
        direction["margins"], X @ direction["coef"] + direction["intercept"], atol=1e-12
    )

    def objective(gamma):
        z = margins + gamma * direction["margins"]
        return obj.weighted_sum(obj.loss_value(loss, y, z), v) / n + obj.penalty_value(
            problem, coef + gamma * direction["coef"]
        )

    gamma = ops.primal_gamma(
        problem, targets, margins, coef, direction["coef"], direction["margins"]
    )
    best = minimize_scalar(
        objective, bounds=(0.0, 20.0), method="bounded", options={"xatol": 1e-12}
    )
    assert gamma > 0.0
    assert objective(gamma) <= best.fun + 1e-13 * abs(best.fun)
    assert abs(gamma - best.x) <= 1e-5 * max(1.0, abs(best.x))
    if loss == "squared" and l1_ratio == 0.0 and not weighted:  # the closed form
        u, d = direction["margins"], direction["coef"]
        nalpha = n * problem.alpha
        closed = -((margins - y) @ u + nalpha * coef @ d) / (u @ u + nalpha * d @ d)
        assert gamma == pytest.approx(closed, rel=1e-12)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("loss", ["squared", "logistic", "hinge", "squared_hinge"])
@pytest.mark.parametrize("rho", [0.0, 0.3])
def test_dual_gamma_maximizes_the_dual_along_the_direction(loss, rho, weighted):
    """With weights v the dual values are u = a/v (0 where v = 0), the dual reads a = v∘u."""
    X, y = _regression() if loss == "squared" else _classification()
    problem = obj.Problem(loss, 0.05, 0.0, True)
    n, K = len(y), 4
    alpha_n = problem.alpha * n
    v = _weights(n, weighted)
    parts, bounds = _row_parts(X, y, K, v)
    scale = np.ones(n) if v is None else v
    intercept = 0.1
    rng = np.random.default_rng(5)
    if loss == "squared":
        a = y - 0.5 + 0.1 * rng.standard_normal(n)
    else:
        a = np.clip(rng.uniform(0.05, 0.6, n), 1e-3, 1 - 1e-3) * y
    a = np.where(scale > 0, a, 0.0)
    coef = X.T @ (scale * a) / alpha_n
    total = float((scale * a).sum())
    updates = [
        ops.dual_solve(part, a[lo:hi], coef, intercept, rho, total, problem, alpha_n, 1, k)
        for k, (part, lo, hi) in enumerate(zip(parts, bounds[:-1], bounds[1:]))
    ]
    direction = ops.dual_direction(*[ops.dual_summary(u) for u in updates])
    delta = np.concatenate([u["delta"] for u in updates])
    assert np.allclose(direction["coef"], X.T @ (scale * delta) / alpha_n, atol=1e-12)

    def dual(gamma):
        moved = scale * (a + gamma * delta)
        s = moved.sum()
        return (
            obj.dual_loss(loss, y, moved, v).sum() - intercept * s - 0.5 * rho * s * s
        ) / n - 0.5 * problem.alpha * np.sum((coef + gamma * direction["coef"]) ** 2)

    gamma = ops.dual_gamma(problem, n, coef, intercept, rho, direction["coef"], direction["lines"])
    limit = min(t["limit"] for t in direction["lines"])
    best = minimize_scalar(
        lambda g: -dual(g),
        bounds=(0.0, min(limit, 20.0)),
        method="bounded",
        options={"xatol": 1e-12},
    )
    assert np.isfinite(dual(gamma))
    assert dual(gamma) >= -best.fun - 1e-13 * abs(best.fun)
    if loss == "squared" and rho == 0.0 and not weighted:  # the dual's closed form, with b
        u, dw = delta, direction["coef"]
        closed = (u @ y - a @ u - intercept * u.sum() - n * problem.alpha * coef @ dw) / (
            u @ u + n * problem.alpha * dw @ dw
        )
        assert gamma == pytest.approx(closed, rel=1e-10)


# ------------------------------------------------------------------ the optimum


def _reference(X, y, **problem):
    return dask_scd.fit(X, y, solver="newton", tol=1e-13, max_iter=200, **problem)


CASES = [  # (loss, penalty, split)
    ("squared", "l2", "features"),
    ("squared", "l2", "examples"),
    ("squared", "l1", "features"),
    ("squared", "elasticnet", "features"),
    ("logistic", "l2", "features"),
    ("logistic", "l2", "examples"),
    ("logistic", "l1", "features"),
    ("squared_hinge", "l2", "examples"),
]


@pytest.mark.parametrize("aggregation", ["adaptive", "average", "add"])
@pytest.mark.parametrize("loss, penalty, split", CASES)
def test_every_aggregation_reaches_the_optimum(loss, penalty, split, aggregation):
    X, y = _regression() if loss == "squared" else _classification()
    problem = {"loss": loss, "penalty": penalty, "alpha": 0.05}
    ref = _reference(X, y, **problem)
    tol = 1e-9
    result = dask_scd.fit(
        X,
        y,
        solver="cocoa",
        tol=tol,
        max_iter=3000,
        random_state=0,
        aggregation=aggregation,
        split=split,
        **problem,
    )
    assert result.converged_ and result.dual_gap_ <= tol
    assert abs(result.primal_ - ref.primal_) <= 1e-8 * abs(ref.primal_)
    assert result.extras_["split"] == split
    steps = result.extras_["rounds"]["step"]
    assert len(steps) == result.n_iter_ == len(result.history_)
    if aggregation == "average":
        assert steps == [1.0 / 4] * result.n_iter_
    if aggregation == "add":
        assert steps == [1.0] * result.n_iter_
    if aggregation == "adaptive":
        assert all(step >= 0.0 for step in steps) and max(steps) > 1.0 / 4


def test_the_hinge_by_example_reaches_sdca_optimum():
    X, y = _classification()
    ref = dask_scd.fit(X, y, loss="hinge", alpha=0.05, solver="sdca", tol=1e-10)
    result = dask_scd.fit(
        X, y, loss="hinge", alpha=0.05, solver="cocoa", tol=1e-6, max_iter=3000, random_state=0
    )
    assert result.extras_["split"] == "examples"
    assert result.converged_ and result.dual_gap_ <= 1e-6
    assert abs(result.primal_ - ref.primal_) <= 1e-6 * abs(ref.primal_)


def test_adaptive_takes_fewer_rounds_than_averaging_on_ridge_with_eight_parts():
    X, y = _regression(n=400, p=32, seed=1)
    rounds = {}
    for aggregation in ("adaptive", "average"):
        result = dask_scd.fit(
            X,
            y,
            alpha=0.05,
            solver="cocoa",
            tol=1e-5,
            n_partitions=8,
            aggregation=aggregation,
            random_state=0,
            max_iter=2000,
        )
        assert result.converged_
        rounds[aggregation] = result.n_iter_
    assert rounds["average"] >= 1.3 * rounds["adaptive"], rounds


def test_local_epochs_and_sparse_input():
    X, y = _regression()
    Xs = sp.csr_matrix(np.where(np.abs(X) > 0.7, X, 0.0))
    ref = _reference(Xs, y, alpha=0.05)
    one = dask_scd.fit(Xs, y, alpha=0.05, solver="cocoa", tol=1e-9, random_state=0)
    three = dask_scd.fit(
        Xs, y, alpha=0.05, solver="cocoa", tol=1e-9, random_state=0, local_epochs=3
    )
    for result in (one, three):
        assert abs(result.primal_ - ref.primal_) <= 1e-8 * abs(ref.primal_)
    assert three.n_iter_ < one.n_iter_


def test_deterministic_given_random_state_and_data_not_modified():
    X, y = _regression()
    X0, y0 = X.copy(), y.copy()
    a = dask_scd.fit(X, y, alpha=0.05, solver="cocoa", tol=1e-8, random_state=7)
    b = dask_scd.fit(X, y, alpha=0.05, solver="cocoa", tol=1e-8, random_state=7)
    assert np.array_equal(a.coef_, b.coef_) and a.intercept_ == b.intercept_
    assert np.array_equal(X, X0) and np.array_equal(y, y0)


# -------------------------------------------------------------------- over dask


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_the_same_model_on_1_2_and_4_workers_as_in_memory(tmp_path):
    """Two rounds each (no convergence needed: the iterates must be the same bits)."""
    da = pytest.importorskip("dask.array")
    from distributed import Client, LocalCluster

    X, y = _regression(n=240, p=12)
    Xc, yc = _classification(n=240, p=12)
    grid = dask_scd.to_grid(
        sp.csr_matrix(X),
        y,
        tmp_path / "g",
        row_chunk=60,
        blocks=[np.arange(i, i + 3) for i in range(0, 12, 3)],
    )
    fits = {
        "ridge by feature": (da.from_array(X, chunks=(60, 3)), y, {"split": "features"}),
        "logistic by example": (
            da.from_array(Xc, chunks=(60, 4)),
            yc,
            {"loss": "logistic", "split": "examples"},
        ),
        "grid": (grid, None, {}),
    }
    common = {
        "solver": "cocoa",
        "alpha": 0.05,
        "tol": 1e-14,
        "max_iter": 2,
        "n_partitions": 4,
        "random_state": 0,
    }
    memory = {
        "ridge by feature": dask_scd.fit(X, y, **fits["ridge by feature"][2], **common),
        "logistic by example": dask_scd.fit(Xc, yc, **fits["logistic by example"][2], **common),
        "grid": dask_scd.fit(sp.csr_matrix(X), y, **common),
    }
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        for n_workers in (1, 2, 4):
            cluster.scale(n_workers)
            client.wait_for_workers(n_workers)
            assert len(client.scheduler_info()["workers"]) == n_workers
            for name, (data, labels, options) in fits.items():
                result = dask_scd.fit(data, labels, **common, **options)
                assert result.n_iter_ == 2
                assert result.history_.relative_gap == memory[name].history_.relative_gap
                assert result.history_.relative_gap[-1] < result.history_.relative_gap[0]
                assert np.array_equal(result.coef_, memory[name].coef_), (name, n_workers)
                assert result.intercept_ == memory[name].intercept_
                assert result.n_iter_ == memory[name].n_iter_


def test_a_grid_whose_columns_are_reordered_comes_back_in_feature_order(tmp_path):
    from distributed import Client, LocalCluster

    X, y = _regression(n=120, p=8)
    blocks = [np.array([5, 1, 3]), np.array([0, 7]), np.array([2, 4, 6])]
    grid = dask_scd.to_grid(X, y, tmp_path / "g", row_chunk=60, blocks=blocks)
    ref = _reference(X, y, alpha=0.05)
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster),
    ):
        result = dask_scd.fit(grid, solver="cocoa", alpha=0.05, tol=1e-10, random_state=0)
        with pytest.raises(ValueError, match="n_partitions=4 is more than the 3 column blocks"):
            dask_scd.fit(grid, solver="cocoa", n_partitions=4)
    assert result.extras_["n_partitions"] == 1  # one worker: one part
    assert np.allclose(result.coef_, ref.coef_, atol=1e-6)


# ------------------------------------------------------------------ bad options


def test_bad_options_give_clear_errors():
    X, y = _regression(n=40, p=6)
    with pytest.raises(ValueError, match="aggregation='sum' is not one of"):
        dask_scd.fit(X, y, solver="cocoa", aggregation="sum")
    for value in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="n_partitions must be a positive integer"):
            dask_scd.fit(X, y, solver="cocoa", n_partitions=value)
    with pytest.raises(ValueError, match="n_partitions=7 is more than the 6 features"):
        dask_scd.fit(X, y, solver="cocoa", n_partitions=7)
    with pytest.raises(ValueError, match="local_epochs must be a positive integer"):
        dask_scd.fit(X, y, solver="cocoa", local_epochs=0)
    with pytest.raises(ValueError, match="split='rows' is not one of"):
        dask_scd.fit(X, y, solver="cocoa", split="rows")
    with pytest.raises(ValueError, match="needs an L2 penalty"):
        dask_scd.fit(X, y, solver="cocoa", penalty="l1", split="examples")
    with pytest.raises(TypeError, match="unknown keyword arguments"):
        dask_scd.fit(X, y, solver="cocoa", residency="duhl")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dask_scd.fit(X, y, solver="cocoa", tol=1e-6)  # converges: no warning
