"""DuHL: the optimum of the in-memory engines, fewer bytes than sequential blocks, a
budget never exceeded, the zarr tier, and bad options."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd import objectives as obj
from dask_scd.data import make_source
from dask_scd.data.memory import InMemory
from dask_scd.engines.base import Options
from dask_scd.engines.local.duhl import fit_duhl, fit_grid
from dask_scd.engines.options import BlockSCDOptions, DuHLOptions
from dask_scd.grid import open_grid, to_grid

TOL = 1e-4


def _sparse_truth(n=1000, p=400, k=20, seed=0):
    """Dense X, a response from k of its p columns."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    beta = np.zeros(p)
    beta[rng.choice(p, k, replace=False)] = 2.0 * rng.normal(size=k)
    return X, X @ beta + 0.5 * rng.normal(size=n)


def _svm(n=3000, p=60, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    return X, np.sign(X @ rng.normal(size=p) + 0.5 * rng.normal(size=n))


def _run(X, y, problem, max_iter=2000, seed=0, tol=TOL, **engine):
    options = Options(tol, max_iter, np.random.default_rng(seed), engine=DuHLOptions(**engine))
    return fit_duhl(InMemory(X, y), problem, options)


def _reference(X, y, problem, solver):
    penalty = "l2" if problem.l1_ratio == 0 else "elasticnet"
    return dask_scd.fit(
        X,
        y,
        loss=problem.loss,
        penalty=penalty,
        alpha=problem.alpha,
        l1_ratio=problem.l1_ratio,
        solver=solver,
        tol=1e-10,
        max_iter=100_000,
        random_state=0,
    )


@pytest.mark.parametrize("l1_ratio", [1.0, 0.5])
def test_lasso_and_enet_reach_the_optimum_moving_fewer_bytes(l1_ratio):
    X, y = _sparse_truth()
    problem = obj.Problem("squared", 0.1, l1_ratio, True)
    budget = X.nbytes // 4
    duhl = _run(X, y, problem, memory_budget=budget, chunk_size=4)
    sequential = _run(X, y, problem, memory_budget=budget, chunk_size=4, residency="sequential")
    assert duhl.converged(TOL) and sequential.converged(TOL)
    assert 3 * duhl.extras["bytes_moved"] <= sequential.extras["bytes_moved"]
    assert duhl.extras["peak_bytes"] <= budget
    reference = _reference(X, y, problem, "scd")
    assert abs(duhl.certificate.primal - reference.primal_) <= TOL * reference.primal_
    if l1_ratio < 1:  # strong convexity: ½α(1−ρ)‖θ − θ*‖² ≤ P(θ) − P(θ*) ≤ gap
        gap = duhl.certificate.gap + reference.dual_gap_ * reference.primal_
        distance = np.linalg.norm(duhl.coef - reference.coef_)
        assert distance <= np.sqrt(2 * gap / (problem.alpha * (1 - l1_ratio))) * 1.01
    else:  # the support is found
        assert set(np.flatnonzero(np.abs(reference.coef_) > 1e-2)) <= set(np.flatnonzero(duhl.coef))


def test_hinge_svm_in_the_dual():
    X, y = _svm()
    problem = obj.Problem("hinge", 1e-2, 0.0, True)
    budget = X.nbytes // 4
    duhl = _run(X, y, problem, memory_budget=budget, chunk_size=8)
    random = _run(X, y, problem, memory_budget=budget, chunk_size=8, residency="random")
    assert duhl.converged(TOL)
    assert len(duhl.certificate.coordinate_gaps) in (X.shape[0], X.shape[1])
    assert duhl.extras["bytes_moved"] < random.extras["bytes_moved"]
    reference = _reference(X, y, problem, "sdca")
    assert abs(duhl.certificate.primal - reference.primal_) <= 2 * TOL * reference.primal_
    gap = duhl.certificate.gap + reference.dual_gap_ * reference.primal_
    assert np.linalg.norm(duhl.coef - reference.coef_) <= np.sqrt(2 * gap / problem.alpha) * 1.01


@pytest.mark.parametrize("residency", ["duhl", "sequential", "random", "importance"])
def test_the_budget_is_never_exceeded(residency):
    X, y = _sparse_truth(400, 99, 10)  # 33 chunks of 3 columns
    problem = obj.Problem("squared", 0.05, 0.5, True)
    budget = int(X.nbytes * 0.3)
    run = _run(X, y, problem, max_iter=30, memory_budget=budget, chunk_size=3, residency=residency)
    chunk_bytes = X.shape[0] * 3 * 8
    rounds = run.extras["rounds"]
    assert run.extras["peak_bytes"] <= budget
    assert max(rounds["resident_lines"]) * X.shape[0] * 8 <= budget
    assert run.extras["bytes_moved"] == run.extras["swaps"] * chunk_bytes  # whole chunks
    assert sum(rounds["swaps"]) == run.extras["swaps"]


def test_budget_below_one_chunk_is_an_error():
    X, y = _sparse_truth(100, 20, 2)
    problem = obj.Problem("squared", 0.1, 1.0, True)
    with pytest.raises(ValueError, match="smaller than one chunk"):
        _run(X, y, problem, memory_budget=100 * 8 * 4 - 1, chunk_size=4)


def test_deterministic_and_stale_gaps_reach_the_same_optimum():
    X, y = _sparse_truth(600, 200, 10)
    problem = obj.Problem("squared", 0.1, 0.9, True)
    kwargs = {
        "memory_budget": X.nbytes // 4,
        "chunk_size": 4,
        "certify_every": 3,
        "gap_refresh": 0.2,
    }
    a = _run(X, y, problem, tol=1e-8, **kwargs)  # the slow side samples in a thread
    b = _run(X, y, problem, tol=1e-8, **kwargs)
    np.testing.assert_array_equal(a.coef, b.coef)
    assert a.extras == b.extras or a.extras["bytes_moved"] == b.extras["bytes_moved"]
    fresh = _run(X, y, problem, tol=1e-8, memory_budget=X.nbytes // 4, chunk_size=4)
    assert a.converged(1e-8) and fresh.converged(1e-8)
    assert abs(a.certificate.primal - fresh.certificate.primal) <= 2e-8 * fresh.certificate.primal


def test_sparse_input_and_the_registry(rng):
    X, y = _sparse_truth(500, 120, 8)
    X[np.abs(X) < 1.0] = 0.0
    result = dask_scd.fit(
        sp.csr_matrix(X),
        y,
        penalty="l1",
        alpha=0.05,
        solver="duhl",
        tol=1e-6,
        memory_budget=sp.csc_matrix(X).data.nbytes // 2,
        random_state=0,
    )
    dense = dask_scd.fit(X, y, penalty="l1", alpha=0.05, solver="scd", tol=1e-10)
    assert result.solver_ == "duhl" and result.converged_
    assert abs(result.primal_ - dense.primal_) <= 1e-6 * dense.primal_


def test_logistic_in_the_primal(rng):
    X, y = _svm(800, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        result = dask_scd.fit(
            X,
            y,
            loss="logistic",
            penalty="l1",
            alpha=0.01,
            solver="duhl",
            tol=1e-6,
            chunk_size=2,
            memory_budget=X.nbytes // 3,
        )
    reference = dask_scd.fit(
        X, y, loss="logistic", penalty="l1", alpha=0.01, solver="scd", tol=1e-10
    )
    assert abs(result.primal_ - reference.primal_) <= 1e-6 * reference.primal_


def test_bad_options():
    X, y = _sparse_truth(100, 20, 2)
    with pytest.raises(ValueError, match="residency='nope' is not one of"):
        dask_scd.fit(X, y, solver="duhl", residency="nope")
    with pytest.raises(ValueError, match="local_epochs must be a positive integer"):
        dask_scd.fit(X, y, solver="duhl", local_epochs=0)
    with pytest.raises(
        TypeError,
        match=r"unknown keyword arguments.*solver='duhl' takes "
        r"memory_budget, local_epochs",
    ):
        dask_scd.fit(X, y, solver="duhl", selection="cyclic")
    with pytest.raises(ValueError, match="needs penalty='l2'"):
        dask_scd.fit(X, np.sign(y), loss="hinge", penalty="l1", solver="duhl")


def test_ram_over_zarr_tier(tmp_path):
    X, y = _sparse_truth(900, 240, 12)
    grid = to_grid(X, y, str(tmp_path / "g.zarr"), row_chunk=300, blocks=30)
    grid = open_grid(tmp_path / "g.zarr")
    problem = obj.Problem("squared", 0.1, 1.0, True)
    budget = X.nbytes // 4
    options = Options(
        TOL,
        500,
        np.random.default_rng(0),
        engine=DuHLOptions(memory_budget=budget, certify_every=2),
    )
    run = fit_grid(make_source(grid, None, problem.loss, None), problem, options)
    assert run.converged(TOL) and run.extras["peak_bytes"] <= budget
    # Every load reads whole blocks of the grid; the slow side's reads are counted apart.
    block_bytes = X.shape[0] * 30 * 8
    assert run.extras["bytes_moved"] == run.extras["swaps"] * block_bytes
    assert run.extras["slow_bytes_read"] >= X.nbytes  # at least the first certificate
    reference = _reference(X, y, problem, "scd")
    assert abs(run.certificate.primal - reference.primal_) <= TOL * reference.primal_
    np.testing.assert_allclose(run.coef, reference.coef_, atol=0.05)


def test_grid_engine_residency(tmp_path):
    """block_scd with residency: only the resident blocks move each epoch; DuHL's choice
    pins fewer cells than sequential blocks and ends at the same optimum."""
    X, y = _sparse_truth(600, 48, 4)
    to_grid(X, y, str(tmp_path / "g.zarr"), row_chunk=300, blocks=4)
    grid = open_grid(tmp_path / "g.zarr")
    from dask_scd.data import make_source
    from dask_scd.engines.block.block_scd import fit_block_scd

    problem = obj.Problem("squared", 0.1, 1.0, True)
    fits = {}
    for residency in ("duhl", "sequential"):
        options = Options(
            1e-6,
            300,
            np.random.default_rng(0),
            engine=BlockSCDOptions(residency=residency, memory_budget=X.nbytes // 4),
        )
        fits[residency] = fit_block_scd(make_source(grid, None, "squared", None), problem, options)
    reference = _reference(X, y, problem, "scd")
    for fit in fits.values():
        assert fit.converged(1e-6)
        assert abs(fit.certificate.primal - reference.primal_) <= 1e-6 * reference.primal_
        assert all(
            len(blocks) * 600 * 4 * 8 <= X.nbytes // 4 for blocks in fit.extras["rounds"]["blocks"]
        )
    assert fits["duhl"].extras["bytes_moved"] < fits["sequential"].extras["bytes_moved"]
    with pytest.raises(ValueError, match="smaller than one block"):
        dask_scd.fit(
            grid, penalty="l1", alpha=0.1, solver="block_scd", residency="duhl", memory_budget=100
        )


def test_dual_over_zarr_row_chunks(tmp_path):
    X, y = _svm(1200, 20)
    labels = np.where(y > 0, 7.0, 3.0)  # any two labels: mapped to ±1 in sorted order
    to_grid(X, labels, str(tmp_path / "s.zarr"), row_chunk=100, blocks=10)
    grid = open_grid(tmp_path / "s.zarr")
    problem = obj.Problem("hinge", 1e-2, 0.0, True)
    options = Options(
        TOL,
        2000,
        np.random.default_rng(0),
        engine=DuHLOptions(memory_budget=X.nbytes // 4, residency="duhl"),
    )
    run = fit_grid(make_source(grid, None, problem.loss, None), problem, options)
    assert run.converged(TOL) and run.extras["peak_bytes"] <= X.nbytes // 4
    reference = _reference(X, y, problem, "sdca")
    assert abs(run.certificate.primal - reference.primal_) <= 2 * TOL * reference.primal_


@pytest.mark.parametrize("loss, alpha, top", [("squared", 0.1, 10), ("hinge", 0.05, 4)])
def test_grid_tier_weighs_the_losses_with_the_grid_s_weights(tmp_path, loss, alpha, top):
    """DuHL over a grid that stores sample weights reaches the weighted optimum, the one
    the in-memory DuHL reaches with those weights (it read the grid without them)."""
    rng = np.random.default_rng(3)
    if loss == "squared":
        X, y = _sparse_truth(600, 60, 6)
    else:
        X, y = _svm(600, 12)
    w = rng.integers(1, top, size=X.shape[0]).astype(np.float64)
    to_grid(X, y, str(tmp_path / "w.zarr"), row_chunk=200, blocks=6, sample_weight=w)
    problem = obj.Problem(loss, alpha, 1.0 if loss == "squared" else 0.0, True)
    options = Options(
        TOL, 3000, np.random.default_rng(0), engine=DuHLOptions(memory_budget=X.nbytes // 3)
    )
    source = make_source(open_grid(tmp_path / "w.zarr"), None, loss, None)
    run = fit_grid(source, problem, options)
    assert run.converged(TOL)
    penalty = "l1" if loss == "squared" else "l2"
    weighted = dask_scd.fit(
        X,
        y,
        loss=loss,
        alpha=alpha,
        penalty=penalty,
        sample_weight=w,
        solver="duhl",
        tol=TOL,
        max_iter=3000,
    )
    unweighted = dask_scd.fit(
        X, y, loss=loss, alpha=alpha, penalty=penalty, solver="duhl", tol=TOL, max_iter=3000
    )
    assert abs(run.certificate.primal - weighted.primal_) <= 4 * TOL * weighted.primal_
    assert abs(unweighted.primal_ - weighted.primal_) > 10 * TOL * weighted.primal_
