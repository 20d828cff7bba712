"""The defects the conformance matrix (tests/test_conformance.py) was built after, each
as a new user met it: a certificate of another problem, a dtype that changed the model,
a message that named the wrong reason."""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

import dask_scd


@pytest.fixture(scope="module")
def cancer():
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    weights = np.random.default_rng(0).integers(0, 4, size=len(y)).astype(np.float64)
    return X, y, weights


@pytest.mark.parametrize("where", ["stored", "given"])
def test_sdca_out_of_core_refuses_weights_instead_of_certifying_another_problem(
    cancer, tmp_path, where
):
    """A weighted grid fitted by out-of-core SDCA returned the unweighted optimum with a
    gap of 8.7e-11 (stored weights), or stopped at max_iter (weights given to fit)."""
    X, y, weights = cancer
    stored = weights if where == "stored" else None
    grid = dask_scd.to_grid(X, y, tmp_path / "g", row_chunk=200, sample_weight=stored)
    given = weights if where == "given" else None
    with pytest.raises(
        ValueError,
        match=r"solver='sdca' does not take sample weights .* "
        r"out of core on a grid; the engines that solve it "
        r"on a grid: \[.*'block_newton'",
    ):
        dask_scd.fit(grid, loss="logistic", alpha=1e-3, solver="sdca", sample_weight=given)
    # Read into memory, SDCA solves the weighted problem: the same optimum as Newton's.
    ours = dask_scd.fit(
        X, y, loss="logistic", alpha=1e-3, solver="sdca", tol=1e-10, sample_weight=weights
    )
    newton = dask_scd.fit(
        X, y, loss="logistic", alpha=1e-3, solver="newton", tol=1e-12, sample_weight=weights
    )
    assert ours.primal_ == pytest.approx(newton.primal_, rel=1e-8)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int64, np.bool_])
def test_the_dtype_of_x_does_not_change_the_model(dtype):
    """An int8 X went to SDCA under auto and stopped at gap 2e-3 after 1000 epochs (the
    float64 values: Newton, 11 steps); uint8 ended at objective 0.92 against 0.47; row
    norms taken in int8 wrapped. X is converted to float64 once, before auto decides."""
    rng = np.random.default_rng(0)
    values = (
        rng.integers(0, 100, size=(300, 6)) if dtype != np.bool_ else rng.random((300, 6)) < 0.4
    )
    X = values.astype(dtype)
    score = values @ rng.normal(size=6) + 10 * rng.logistic(size=300)
    y = (score > np.median(score)).astype(int)
    same = X.astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        got = dask_scd.fit(X, y, loss="logistic", alpha=1e-2, tol=1e-9, random_state=0)
        want = dask_scd.fit(same, y, loss="logistic", alpha=1e-2, tol=1e-9, random_state=0)
    assert got.solver_ == want.solver_
    assert got.n_iter_ == want.n_iter_
    np.testing.assert_array_equal(got.coef_, want.coef_)
    assert X.dtype == dtype  # the caller's array is not converted in place
    for chunks in [(100, 6), (150, 3)]:  # a dask X, too (read into memory under auto)
        lazy = dask_scd.fit(
            da.from_array(X, chunks=chunks),
            y,
            loss="logistic",
            alpha=1e-2,
            tol=1e-9,
            random_state=0,
        )
        np.testing.assert_allclose(lazy.coef_, want.coef_, rtol=1e-12)


def test_multinomial_l1_on_dask_names_the_conflict_not_the_memory_limit():
    """It said "X is above in_memory_limit" for a 150 × 4 X: the conflict is the named
    solver with an L1 term."""
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    with pytest.raises(ValueError) as raised:
        dask_scd.fit(
            da.from_array(X, chunks=50), y, loss="multinomial", penalty="l1", solver="block_newton"
        )
    message = str(raised.value)
    assert "in_memory_limit" not in message
    assert "solver='block_newton' solves loss='multinomial' with an L2 penalty only" in message
    assert "['newton']" in message
    # Under auto above the limit, the limit is the reason, and said so.
    with pytest.raises(ValueError, match="above in_memory_limit.*pass a larger in_memory"):
        dask_scd.fit(
            da.from_array(X, chunks=50), y, loss="multinomial", penalty="l1", in_memory_limit=100
        )
