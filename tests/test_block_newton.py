"""Proximal Newton over dask (solver="block_newton"): optimum, invariances, resume, auto."""

import dataclasses
import warnings

import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd.datasets import make_onehot
from dask_scd.grid import open_grid, to_grid

ALPHA = 1e-4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """One-hot fields with an impure set-valued field, as a grid of 3 row chunks."""
    X, y, blocks = make_onehot(3000, 3, 8, set_valued=1, set_size=3, random_state=1)
    path = tmp_path_factory.mktemp("newton") / "g.zarr"
    to_grid(X, y, str(path), row_chunk=1000, blocks=blocks)
    return X, y, open_grid(path)


CASES = [
    ("logistic", "l2", True),
    ("logistic", "l1", True),
    ("logistic", "elasticnet", False),
    ("squared_hinge", "l2", True),
    ("squared", "l1", True),
    ("squared", "l2", False),
]


@pytest.mark.parametrize("loss,penalty,intercept", CASES)
def test_reaches_the_in_memory_optimum(data, client, loss, penalty, intercept):
    X, y, grid = data
    kwargs = dict(loss=loss, penalty=penalty, alpha=ALPHA, l1_ratio=0.5, fit_intercept=intercept)
    ours = dask_scd.fit(grid, tol=1e-10, solver="block_newton", client=client, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ref = dask_scd.fit(X, y, tol=1e-12, max_iter=20_000, **kwargs)
    assert ours.solver_ == "block_newton" and ours.dual_gap_ <= 1e-10
    assert ours.n_iter_ <= 30  # second order: a handful of steps at alpha = 1e-4
    assert ours.primal_ == pytest.approx(ref.primal_, rel=1e-9)
    np.testing.assert_allclose(
        ours.decision_function(X),
        ref.decision_function(X),
        atol=1e-4 * np.abs(ref.decision_function(X)).max(),
    )


def test_same_model_for_any_worker_count_and_chunking(data, client):
    X, y, grid = data
    kwargs = dict(loss="logistic", alpha=ALPHA, tol=1e-9, solver="block_newton")
    two = dask_scd.fit(grid, client=client, **kwargs)
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as one_client,
    ):
        one = dask_scd.fit(grid, client=one_client, **kwargs)
    np.testing.assert_array_equal(one.coef_, two.coef_)
    assert one.intercept_ == two.intercept_
    # The same data as a dask array with other row chunks: the same optimum.
    Xd = da.from_array(X.toarray(), chunks=(750, X.shape[1]))
    other = dask_scd.fit(Xd, y, client=client, **kwargs)
    assert other.primal_ == pytest.approx(two.primal_, rel=1e-9)


def test_resume_reaches_the_same_model(data, client, tmp_path):
    _, _, grid = data
    kwargs = dict(
        loss="logistic",
        penalty="l1",
        alpha=ALPHA,
        tol=1e-10,
        solver="block_newton",
        client=client,
        random_state=0,
    )
    full = dask_scd.fit(grid, **kwargs)
    checkpoint = tmp_path / "fit.npz"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        dask_scd.fit(grid, checkpoint=str(checkpoint), callback=lambda s: s["epoch"] >= 2, **kwargs)
    resumed = dask_scd.fit(grid, checkpoint=str(checkpoint), resume=True, **kwargs)
    np.testing.assert_array_equal(resumed.coef_, full.coef_)
    assert resumed.n_iter_ == full.n_iter_


def test_auto_runs_newton_on_few_features(data, client):
    X, y, grid = data
    auto = dask_scd.fit(grid, loss="logistic", alpha=ALPHA, client=client, in_memory_limit=0)
    assert auto.solver_ == "block_newton" and auto.dual_gap_ <= 1e-6


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """One-hot data wider than block_newton's p × p curvature: 3000 features."""
    X, y, blocks = make_onehot(4000, 6, 500, random_state=3)
    path = tmp_path_factory.mktemp("wide") / "wide.zarr"
    return X, y, to_grid(X, y, str(path), row_chunk=1000, blocks=blocks)


@pytest.mark.parametrize("loss", ["logistic", "squared", "squared_hinge"])
def test_wide_newton_matches_scikit_learn(wide, client, loss):
    """p = 3000 > 2048: Newton by conjugate gradients on curvature products (no p × p
    matrix) reaches the in-memory optimum, and scikit-learn's for the logistic loss."""
    from sklearn.linear_model import LogisticRegression

    X, y, grid = wide
    alpha = 1.0 / X.shape[0]
    ours = dask_scd.fit(
        grid, loss=loss, alpha=alpha, client=client, solver="block_newton", tol=1e-10, max_iter=50
    )
    assert ours.dual_gap_ <= 1e-10 and ours.extras_["cg_products"]
    if loss == "squared":  # the model is the objective: one solve to the certifying residual
        assert ours.n_iter_ == 1 and len(ours.extras_["cg_products"]) == 1
    reference = dask_scd.fit(X, y, loss=loss, alpha=alpha, tol=1e-12)
    assert ours.primal_ == pytest.approx(reference.primal_, rel=1e-9)
    if loss == "logistic":
        sk = LogisticRegression(C=1.0 / (alpha * X.shape[0]), tol=1e-12, max_iter=10_000)
        sk.fit(X, y)
        p_sk = float(
            dask_scd.certificate(
                ours_problem(alpha), X, y, sk.coef_.ravel(), float(sk.intercept_[0])
            ).primal
        )
        assert ours.primal_ <= p_sk * (1 + 1e-7)
        assert p_sk == pytest.approx(ours.primal_, rel=1e-7)


def ours_problem(alpha):
    return dask_scd.Problem("logistic", alpha, 0.0, True)


def test_wide_newton_refuses_l1_and_dask_arrays_run_it(wide, client, rng):
    X, y, grid = wide
    with pytest.raises(ValueError, match="p = 3000 features.*block_scd"):
        dask_scd.fit(
            grid, loss="logistic", penalty="l1", alpha=1e-3, client=client, solver="block_newton"
        )
    Xd = da.from_array(X.tocsr(), chunks=(2000, 1000), asarray=False)
    ours = dask_scd.fit(
        Xd, y, loss="logistic", alpha=1e-3, client=client, solver="block_newton", tol=1e-8
    )
    reference = dask_scd.fit(X, y, loss="logistic", alpha=1e-3, tol=1e-12)
    assert ours.dual_gap_ <= 1e-8
    assert ours.primal_ == pytest.approx(reference.primal_, rel=1e-8)


def test_adult_grid_needs_at_most_twice_the_passes_of_memory(client, tmp_path):
    """Adult (a9a.t) logistic at C = 10 as a grid on a 2-worker cluster: gap 1e-6 in at
    most twice the reads of X that the in-memory Newton engine needs."""
    from conftest import shared_dataset

    X, y = shared_dataset("a9a.t")
    alpha = 1.0 / (10.0 * X.shape[0])  # scikit-learn's C = 10
    memory = dask_scd.fit(X, y, loss="logistic", alpha=alpha, tol=1e-6, solver="newton")
    to_grid(X, y, str(tmp_path / "adult.zarr"), row_chunk=4096)
    grid = dask_scd.fit(
        open_grid(tmp_path / "adult.zarr"),
        loss="logistic",
        alpha=alpha,
        tol=1e-6,
        solver="block_newton",
        client=client,
    )
    assert memory.dual_gap_ <= 1e-6 and grid.dual_gap_ <= 1e-6
    assert grid.extras_["total_passes"] <= 2 * memory.extras_["total_passes"], (
        grid.extras_,
        memory.extras_,
    )
    assert abs(grid.primal_ - memory.primal_) <= 2e-6 * memory.primal_


@pytest.mark.parametrize(
    "loss,penalty", [("logistic", "l2"), ("logistic", "l1"), ("squared_hinge", "l2")]
)
def test_certificate_is_of_the_order_of_the_true_error(data, client, loss, penalty):
    """The model's dual point certifies the state the fit returns: its gap at tol is
    within 10x of its true error (floored at tol/10), never below it."""
    X, y, grid = data
    # Weak regularization: the gap of a = −ℓ'(ŷ) is ~‖∇P‖²/(2α), far above the error.
    kwargs = dict(loss=loss, penalty=penalty, alpha=ALPHA / 100)
    ours = dask_scd.fit(grid, tol=1e-6, solver="block_newton", client=client, **kwargs)
    optimum = dask_scd.fit(X, y, tol=1e-13, solver="newton", **kwargs)
    # P* lies in [P_opt·(1 − gap_opt), P_opt]: the error is known to ~1e-13.
    error = (ours.primal_ - optimum.primal_) / ours.primal_
    assert ours.dual_gap_ <= 1e-6
    assert error <= ours.dual_gap_ + 1e-15  # honest
    assert ours.dual_gap_ <= 10 * max(error + optimum.dual_gap_, 1e-7)  # and tight


def test_auto_on_a_wide_grid_of_pure_blocks_runs_block_scd(wide, client):
    """Too wide for the p × p curvature: on a grid of pure blocks whose epochs run
    collectively, auto takes block SCD for L2 too (exact block steps, one task per worker
    and iteration); a grid with an impure block, or a dask array (task graphs), keeps
    block Newton by conjugate gradients; with few features, block Newton either way."""
    from dask_scd.data.sources import make_source
    from dask_scd.engines import registry
    from dask_scd.engines.block.block_scd import collective_on_pure_blocks

    X, y, grid = wide
    problem = dask_scd.Problem("logistic", 1.0 / X.shape[0], 0.0, True)
    source = make_source(grid, None, "logistic", None)
    assert all(source.purity) and collective_on_pure_blocks(source)
    assert registry.dask_auto(source, problem) == "block_scd"
    auto = dask_scd.fit(
        grid, loss="logistic", alpha=1.0 / X.shape[0], client=client, in_memory_limit=0, tol=1e-8
    )
    assert auto.solver_ == "block_scd" and auto.dual_gap_ <= 1e-8
    reference = dask_scd.fit(X, y, loss="logistic", alpha=1.0 / X.shape[0], tol=1e-12)
    assert auto.primal_ == pytest.approx(reference.primal_, rel=1e-8)

    impure = dataclasses.replace(source, purity=[False] + list(source.purity[1:]))
    assert not collective_on_pure_blocks(impure)
    assert registry.dask_auto(impure, problem) == "block_newton"
    Xd = da.from_array(X.tocsr(), chunks=(2000, 1000), asarray=False)
    fit = dask_scd.fit(
        Xd, y, loss="logistic", alpha=1.0 / X.shape[0], client=client, in_memory_limit=0, tol=1e-6
    )
    assert fit.solver_ == "block_newton"


def test_unit_steps_extend_to_the_best_doubling(client, monkeypatch):
    # Separable data and a weak L2 term: the unit step from θ = 0 stops short, and the
    # line search's doublings (read in its pass) take fewer steps to the same optimum.
    from dask_scd.runtime import passes

    rng = np.random.default_rng(42)
    X = rng.normal(size=(200, 60))
    y = np.sign(X @ rng.normal(size=60))
    Xd = da.from_array(X, chunks=(50, 60))
    kwargs = dict(loss="logistic", alpha=0.01 / 200, fit_intercept=False, tol=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the scheduler's overhead on data this small
        fit = dask_scd.fit(Xd, y, solver="block_newton", client=client, **kwargs)
        monkeypatch.setattr(passes, "extrapolates", lambda problem: False)
        unit = dask_scd.fit(Xd, y, solver="block_newton", client=client, **kwargs)
    memory = dask_scd.fit(X, y, solver="newton", **kwargs)
    assert fit.n_iter_ < unit.n_iter_
    assert max(fit.dual_gap_, unit.dual_gap_) <= 1e-10
    assert fit.primal_ == pytest.approx(unit.primal_, rel=1e-10)
    assert fit.primal_ == pytest.approx(memory.primal_, rel=1e-10)
