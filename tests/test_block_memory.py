"""Block SCD in memory (solver="block_scd" on numpy / scipy.sparse X): the optimum,
the same bits on any number of threads, pure blocks on every row, weights, options."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import Lasso, LogisticRegression, Ridge

import dask_scd
from dask_scd import objectives as obj
from dask_scd.datasets import make_onehot
from dask_scd.engines.block import block_memory
from dask_scd.grid.partition import block_purity, detect_pure_blocks, pure_on_all_rows
from dask_scd.kernels import threads


@pytest.fixture(scope="module")
def onehot():
    X, y, _ = make_onehot(4000, 5, [4, 12, 40, 150, 600], random_state=3)
    return X, y


def _primal(loss, X, y, alpha, l1_ratio, coef, intercept):
    problem = obj.Problem(loss=loss, alpha=alpha, l1_ratio=l1_ratio, fit_intercept=True)
    return dask_scd.certificate(problem, X, y, np.ravel(coef), float(intercept)).primal


def _reference(kind, X, y, alpha):
    n = X.shape[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        if kind == "logistic-l2":
            m = LogisticRegression(C=1.0 / (n * alpha), tol=1e-12, max_iter=10_000).fit(X, y)
            return m.coef_.ravel(), float(m.intercept_[0])
        if kind == "squared-l1":
            m = Lasso(alpha=alpha, tol=1e-14, max_iter=100_000).fit(X, y)
            return m.coef_, float(m.intercept_)
        m = Ridge(alpha=alpha * n, tol=1e-14, solver="cholesky").fit(X.toarray(), y)
        return m.coef_, float(m.intercept_)


@pytest.mark.parametrize(
    "kind,alpha", [("logistic-l2", 1e-3), ("squared-l1", 2e-3), ("squared-l2", 1e-3)]
)
def test_reaches_the_optimum_of_scikit_learn(onehot, kind, alpha):
    X, y = onehot
    loss, penalty = kind.split("-")
    if loss == "squared":
        y = y + 0.3 * np.random.default_rng(0).standard_normal(len(y))
    ours = dask_scd.fit(
        X, y, loss=loss, penalty=penalty, alpha=alpha, tol=1e-10, solver="block_scd", random_state=0
    )
    assert ours.dual_gap_ <= 1e-10
    coef, intercept = _reference(kind, X, y, alpha)
    l1_ratio = 1.0 if penalty == "l1" else 0.0
    labels = np.where(y > 0, 1.0, -1.0) if loss == "logistic" else y
    mine = _primal(loss, X, labels, alpha, l1_ratio, ours.coef_, ours.intercept_)
    theirs = _primal(loss, X, labels, alpha, l1_ratio, coef, intercept)
    assert mine <= theirs * (1 + 1e-7)
    assert abs(mine - theirs) <= 1e-7 * abs(theirs)
    # The pure blocks make few passes: exact block steps, as on a grid.
    assert ours.n_iter_ <= 40


def test_same_bits_on_one_or_two_threads(onehot, monkeypatch):
    X, y = onehot
    monkeypatch.setattr(threads, "MIN_ENTRIES", 1000)  # row chunks and threads at this size
    monkeypatch.setattr(block_memory, "CHUNK_ROWS", 800)
    fits = []
    for n_threads in (1, 2):
        monkeypatch.setattr(threads, "THREADS", n_threads)
        r = dask_scd.fit(
            X, y, loss="logistic", alpha=1e-3, tol=1e-9, solver="block_scd", random_state=5
        )
        fits.append(r)
    assert fits[0].extras_["row_chunks"] == 5
    assert fits[0].n_iter_ == fits[1].n_iter_
    assert np.array_equal(fits[0].coef_, fits[1].coef_)
    assert fits[0].intercept_ == fits[1].intercept_


def test_fused_passes_take_the_steps_of_the_block_functions(onehot, monkeypatch):
    """The fused by-rows passes against the block engine's own statistics (by_rows off)."""
    X, y = onehot
    kwargs = dict(loss="logistic", alpha=1e-3, tol=1e-9, solver="block_scd", random_state=2)
    fused = dask_scd.fit(X, y, **kwargs)
    original = block_memory._Engine._fused
    monkeypatch.setattr(block_memory._Engine, "_fused", lambda self, p: False)
    plain = dask_scd.fit(X, y, **kwargs)
    monkeypatch.setattr(block_memory._Engine, "_fused", original)
    assert fused.n_iter_ == plain.n_iter_
    np.testing.assert_allclose(fused.coef_, plain.coef_, rtol=0, atol=1e-9)


def test_blocks_found_on_the_first_rows_are_made_pure_on_all():
    rng = np.random.default_rng(0)
    # Columns 2 and 3 never meet in the first 50 rows, then share every later row.
    rows = np.arange(100)
    X = sp.lil_matrix((100, 4))
    X[rows, rows % 2] = 1.0
    X[rows[:25], 2] = 1.0
    X[rows[25:50], 3] = 1.0
    X[rows[50:], 2] = rng.random(50) + 1
    X[rows[50:], 3] = rng.random(50) + 1
    X = X.tocsr()
    first = detect_pure_blocks(X[:50])
    assert not all(block_purity(X, first)[0])
    blocks = pure_on_all_rows(X, first)
    assert all(block_purity(X, blocks)[0])
    assert sorted(np.concatenate(blocks).tolist()) == [0, 1, 2, 3]


def test_integer_weights_are_repeated_rows(onehot):
    X, y = onehot
    w = np.random.default_rng(1).integers(0, 3, X.shape[0])
    kwargs = dict(loss="logistic", alpha=1e-3, tol=1e-11, solver="block_scd", random_state=0)
    weighted = dask_scd.fit(X, y, sample_weight=w, **kwargs)
    keep = np.repeat(np.arange(X.shape[0]), w)
    repeated = dask_scd.fit(X[keep], y[keep], **kwargs)
    labels = np.where(y[keep] > 0, 1.0, -1.0)
    a = _primal("logistic", X[keep], labels, 1e-3, 0.0, weighted.coef_, weighted.intercept_)
    b = _primal("logistic", X[keep], labels, 1e-3, 0.0, repeated.coef_, repeated.intercept_)
    assert abs(a - b) <= 1e-8 * abs(b)


def test_dense_x_takes_gram_steps_to_the_newton_optimum():
    """Dense X: runs of 256 columns, impure blocks taking their Gram matrix's steps."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((600, 30))
    y = np.sign(X @ rng.standard_normal(30) + rng.standard_normal(600))
    ours = dask_scd.fit(X, y, loss="logistic", alpha=1e-2, tol=1e-10, solver="block_scd")
    newton = dask_scd.fit(X, y, loss="logistic", alpha=1e-2, tol=1e-12, solver="newton")
    assert ours.dual_gap_ <= 1e-10
    a = _primal("logistic", X, y, 1e-2, 0.0, ours.coef_, ours.intercept_)
    b = _primal("logistic", X, y, 1e-2, 0.0, newton.coef_, newton.intercept_)
    assert abs(a - b) <= 1e-9 * abs(b)


def test_dask_only_options_are_refused_and_the_callback_stops(onehot):
    X, y = onehot
    with pytest.raises(
        ValueError,
        match=r"\['checkpoint'\] apply to solver='block_scd' on a "
        r"dask array or a Grid",
    ):
        dask_scd.fit(X, y, loss="logistic", solver="block_scd", checkpoint="x.npz")
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        r = dask_scd.fit(
            X,
            y,
            loss="logistic",
            alpha=1e-3,
            tol=1e-12,
            solver="block_scd",
            callback=lambda info: seen.append(info["epoch"]) or len(seen) == 2,
        )
    assert seen == [1, 2] and r.n_iter_ == 2
    assert r.coef_.shape == (X.shape[1],)


def test_an_x_without_values_and_unrelated_sparse_columns():
    rng = np.random.default_rng(0)
    y = np.sign(rng.standard_normal(300))
    empty = dask_scd.fit(
        sp.csr_matrix((300, 20)), y, loss="logistic", alpha=1e-2, solver="block_scd"
    )
    assert not empty.coef_.any() and empty.dual_gap_ <= 1e-12
    assert np.isclose(empty.intercept_, np.log(np.mean(y > 0) / np.mean(y < 0)))
    # Unrelated sparse columns: the colouring's pure blocks (23 here).
    X = sp.random(300, 500, density=0.02, random_state=0, format="csr")
    ours = dask_scd.fit(
        X, y, loss="squared_hinge", alpha=1e-2, tol=1e-9, solver="block_scd", fit_intercept=False
    )
    newton = dask_scd.fit(
        X, y, loss="squared_hinge", alpha=1e-2, tol=1e-11, solver="newton", fit_intercept=False
    )
    assert ours.dual_gap_ <= 1e-9
    assert abs(ours.primal_ - newton.primal_) <= 1e-8 * newton.primal_
