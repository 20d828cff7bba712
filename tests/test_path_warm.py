"""What a path's points share: the design of X and its Gram blocks kept between Newton
runs, the margins of the start, the secant predictor. Every point must still agree with
scikit-learn's lasso_path / enet_path and with a cold fit at its alpha, certified."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn import linear_model
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd.datasets import make_onehot
from dask_scd.engines.newton.design import Design
from dask_scd.engines.newton.l1_model import _shift_model
from dask_scd.kernels import newton_shift
from dask_scd.objectives import Problem

TOL = 1e-8


@pytest.fixture(scope="module")
def onehot():
    X, y, _ = make_onehot(2000, 8, 200, task="regression", random_state=0)
    return sp.csc_matrix(X), y - y.mean()


def primal(loss, alpha, l1_ratio, fit_intercept, X, y, coef, intercept):
    problem = Problem(loss=loss, alpha=float(alpha), l1_ratio=l1_ratio, fit_intercept=fit_intercept)
    return dask_scd.certificate(problem, X, y, np.ravel(coef), float(intercept)).primal


def test_kept_gram_blocks_equal_fresh_ones(onehot):
    """Blocks read from the kept Gram, grown by the products of their new columns alone,
    are the very bits of a Gram computed afresh."""
    X, _ = onehot
    fresh = Design.from_array(X.tocsr())
    ones = np.ones(X.shape[0])
    for intercept in (False, True):
        kept = Design.from_array(X.tocsr())
        kept.unit_curvature = True
        rng = np.random.default_rng(0)
        grown = 0
        for size in (5, 300, 600, 10, 900, 40):  # subsets of the kept block, and growth
            working = np.sort(rng.choice(X.shape[1], size=size, replace=False))
            before = kept._kept_gram
            np.testing.assert_array_equal(
                kept.gram(working, ones, intercept), fresh.gram(working, ones, intercept)
            )
            after = kept._kept_gram
            if before is not None and after is not before and np.all(after[2][before[1]] >= 0):
                grown += 1
        assert grown >= 2  # the kept block grew, not only computed afresh


@pytest.mark.parametrize("fit_intercept", [False, True])
def test_kept_block_shifts_equal_the_kernels(onehot, fit_intercept):
    """SᵀS and Sᵀr of the block shifts, kept and updated as the shifted columns change,
    against the kernel's pass over the rows."""
    X, _ = onehot
    design = Design.from_array(X.tocsr())
    design.unit_curvature = True
    n, p = X.shape
    block_of = design.block_of
    k = int(block_of.max()) + 1
    rng = np.random.default_rng(0)
    for _ in range(40):  # more than one refresh of the kept SᵀS
        chosen = np.sort(rng.choice(p, size=int(rng.integers(1, p)), replace=False))
        chosen = chosen[block_of[chosen] >= 0]
        shifted = np.full(p, -1, dtype=np.int64)
        shifted[chosen] = block_of[chosen]
        residual = rng.standard_normal(n)
        grad, hess, S = _shift_model(
            design, np.ones(n), shifted, chosen, k, fit_intercept, residual
        )
        m = k + int(fit_intercept)
        want_grad, want_hess = np.empty(m), np.empty((m, m))
        rows = design.rows
        newton_shift.shift_stats(
            rows.data,
            rows.indices,
            rows.indptr,
            False,
            n,
            p,
            shifted,
            k,
            residual,
            np.ones(n),
            fit_intercept,
            want_grad,
            want_hess,
        )
        np.testing.assert_allclose(grad, want_grad / n, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(hess, want_hess / n, rtol=1e-12, atol=1e-14)
        shift = rng.standard_normal(m)
        per_column = np.zeros(p)
        per_column[chosen] = shift[shifted[chosen]]
        expected = X @ per_column + (shift[k] if fit_intercept else 0.0)
        np.testing.assert_allclose(S @ shift, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("l1_ratio", [1.0, 0.5])
@pytest.mark.parametrize("fit_intercept", [False, True])
def test_onehot_path_matches_sklearn_and_cold_fits(onehot, l1_ratio, fit_intercept):
    """Pure blocks (Newton's block shifts, kept for the squared loss): every point
    certified, its objective within tol of a cold fit's and (without an intercept, the
    problem scikit-learn solves) at least as good as scikit-learn's."""
    X, y = onehot
    result = dask_scd.path(
        X,
        y,
        penalty="elasticnet",
        l1_ratio=l1_ratio,
        n_alphas=30,
        eps=1e-3,
        fit_intercept=fit_intercept,
        tol=TOL,
        random_state=0,
    )
    assert np.all(result.dual_gaps <= TOL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        _, sk_coefs, _ = linear_model.enet_path(
            X, y, l1_ratio=l1_ratio, alphas=result.alphas, tol=1e-12, max_iter=100_000
        )
    for k in range(2, 30, 3):
        alpha = result.alphas[k]
        ours = primal(
            "squared",
            alpha,
            l1_ratio,
            fit_intercept,
            X,
            y,
            result.coefs[:, k],
            result.intercepts[k],
        )
        if not fit_intercept:
            theirs = primal("squared", alpha, l1_ratio, False, X, y, sk_coefs[:, k], 0.0)
            assert ours <= theirs * (1 + 2 * TOL)
        cold = dask_scd.fit(
            X,
            y,
            penalty="elasticnet",
            alpha=alpha,
            l1_ratio=l1_ratio,
            fit_intercept=fit_intercept,
            tol=TOL,
            solver="newton",
        )
        assert ours == pytest.approx(cold.primal_, rel=2 * TOL)


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_dense_path_with_intercept_is_certified(loss):
    """Dense X with an intercept (the kept Gram's ones column, the secant's intercept):
    each point within tol of a cold fit at its alpha."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((400, 40))
    X[:, 1] = X[:, 0] + 0.01 * rng.standard_normal(400)  # correlated columns
    y = X[:, :5] @ np.array([1.0, -2.0, 0.5, 0.0, 3.0]) + rng.standard_normal(400) + 2.0
    if loss == "logistic":
        y = np.where(y > np.median(y), 1.0, -1.0)
    result = dask_scd.path(
        X, y, loss=loss, penalty="l1", n_alphas=25, eps=1e-3, tol=TOL, random_state=0
    )
    assert np.all(result.dual_gaps <= TOL)
    for k in (5, 15, 24):
        cold = dask_scd.fit(
            X, y, loss=loss, penalty="l1", alpha=result.alphas[k], tol=TOL, solver="newton"
        )
        ours = primal(
            loss,
            result.alphas[k],
            1.0,
            True,
            X,
            np.where(y > 0, 1.0, -1.0) if loss == "logistic" else y,
            result.coefs[:, k],
            result.intercepts[k],
        )
        assert ours == pytest.approx(cold.primal_, rel=2 * TOL)


@pytest.mark.parametrize("fit_intercept", [False, True])
def test_shift_stats_batched_equals_row_by_row(fit_intercept):
    """Rows that touch most blocks take the batched path (dense rows of S, one matrix
    product per batch); it gives the row-by-row products to rounding, across several
    batches and a partial last one."""
    rng = np.random.default_rng(3)
    n, k, width = 3 * newton_shift._SHIFT_BATCH + 17, 6, 5
    p = k * width
    cols = (np.arange(k) * width + rng.integers(0, width, size=(n, k))).ravel()
    X = sp.csr_matrix((rng.normal(size=n * k), cols, np.arange(0, n * k + 1, k)), shape=(n, p))
    shifted = np.full(p, -1, dtype=np.int64)
    chosen = rng.choice(p, p // 2, replace=False)
    shifted[chosen] = chosen // width
    residual, curv = rng.normal(size=n), rng.random(n)
    m = k + int(fit_intercept)
    got = np.empty(m), np.empty((m, m))
    want = np.empty(m), np.empty((m, m))
    newton_shift.shift_stats(
        X.data, X.indices, X.indptr, False, n, p, shifted, k, residual, curv, fit_intercept, *got
    )
    newton_shift._shift_stats_rows(
        X.data, X.indices, X.indptr, False, n, p, shifted, k, residual, curv, fit_intercept, *want
    )
    S = np.zeros((n, m))
    for j in chosen:
        S[:, shifted[j]] += X[:, j].toarray().ravel()
    if fit_intercept:
        S[:, k] = 1.0
    np.testing.assert_allclose(got[0], S.T @ residual, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[1], S.T @ (curv[:, None] * S), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)
