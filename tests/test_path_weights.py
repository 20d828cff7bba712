"""Sample weights on a regularization path: integer weights give the path of repeated
rows and zero weights that of the rows left, at every point (alpha_max and the gap-safe
screening are the weighted objective's), in memory, on a dask array and on a grid."""

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp

import dask_scd
from dask_scd.objectives import Problem

TIGHT = 1e-12


def _data(n=60, p=80, seed=0, loss="squared"):
    """More features than rows and a sparse truth: the gap-safe rule screens most
    features at the first points."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    y = X[:, :4] @ rng.standard_normal(4) + 0.3 * rng.standard_normal(n)
    if loss != "squared":
        y = np.where(y > np.median(y), 1.0, -1.0)
    weights = rng.integers(0, 4, n)
    weights[:2] = (0, 3)  # a row that counts for nothing, a row counted three times
    return X, y, weights


def _objectives(result, X, y) -> np.ndarray:
    return np.array(
        [
            dask_scd.certificate(
                Problem(result.loss, alpha, result.l1_ratio, True),
                X,
                y,
                result.coefs[:, k],
                result.intercepts[k],
            ).primal
            for k, alpha in enumerate(result.alphas)
        ]
    )


def _assert_same_path(weighted, plain, X, y):
    assert weighted.alpha_max == pytest.approx(plain.alpha_max, rel=1e-12)
    np.testing.assert_allclose(weighted.alphas, plain.alphas, rtol=1e-12)
    assert np.all(weighted.dual_gaps <= TIGHT)
    np.testing.assert_allclose(_objectives(weighted, X, y), _objectives(plain, X, y), rtol=1e-8)


@pytest.mark.parametrize(
    "loss, penalty, solver",
    [
        ("squared", "l1", "auto"),
        ("squared", "elasticnet", "auto"),
        ("logistic", "l1", "auto"),
        ("logistic", "l2", "auto"),
        ("squared", "l1", "gram"),  # points solved on the screened features only
    ],
)
@pytest.mark.parametrize("sparse", [False, True])
def test_integer_weights_are_repeated_rows(loss, penalty, solver, sparse):
    X, y, weights = _data(loss=loss)
    given = weights.copy()
    rows = np.repeat(np.arange(len(y)), weights)
    X_in = sp.csr_matrix(X) if sparse else X
    options = dict(loss=loss, penalty=penalty, n_alphas=20, eps=1e-2, tol=TIGHT, solver=solver)
    weighted = dask_scd.path(X_in, y, sample_weight=weights, **options)
    repeated = dask_scd.path(X_in[rows], y[rows], **options)
    _assert_same_path(weighted, repeated, X[rows], y[rows])
    # The weighted gap-safe rule is the rule on the repeated rows.
    np.testing.assert_array_equal(weighted.n_screened, repeated.n_screened)
    if penalty == "l1":
        assert weighted.n_screened.max() > 0
    np.testing.assert_array_equal(weights, given)


def test_zero_weights_are_removed_rows():
    X, y, weights = _data()
    kept = weights > 0
    options = dict(penalty="elasticnet", l1_ratio=0.7, n_alphas=10, eps=1e-2, tol=TIGHT)
    weighted = dask_scd.path(X, y, sample_weight=kept.astype(float), **options)
    removed = dask_scd.path(X[kept], y[kept], **options)
    _assert_same_path(weighted, removed, X[kept], y[kept])


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_dask_and_grid_paths_with_weights_are_repeated_rows(client, tmp_path, loss):
    """The points of a dask array's and a grid's path are block-engine fits on the
    cluster with the weights; alpha_max is reduced over the cells with them."""
    X, y, weights = _data(n=60, p=8, loss=loss)
    rows = np.repeat(np.arange(len(y)), weights)
    options = dict(loss=loss, penalty="l1", n_alphas=5, eps=0.05, tol=TIGHT, solver="block_newton")
    repeated = dask_scd.path(X[rows], y[rows], **{**options, "solver": "auto"})
    on_dask = dask_scd.path(
        da.from_array(X, chunks=(20, 4)),
        da.from_array(y, chunks=20),
        sample_weight=da.from_array(weights, chunks=30),
        **options,
    )
    grid = dask_scd.to_grid(X, y, tmp_path / "g", row_chunk=20, sample_weight=weights)
    on_grid = dask_scd.path(grid, **options)  # the grid's stored weights
    for result in (on_dask, on_grid):
        assert result.solvers[1:] == ["block_newton"] * 4
        _assert_same_path(result, repeated, X[rows], y[rows])
    # Below in_memory_limit "auto" runs the whole weighted path in memory.
    in_memory = dask_scd.path(grid, **{**options, "solver": "auto"})
    _assert_same_path(in_memory, repeated, X[rows], y[rows])
