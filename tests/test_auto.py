"""solver="auto" in memory: the engine with the fewest predicted passes over X."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.engines import cost_model, registry


def _onehot(n, fields, levels, rng):
    rows = np.repeat(np.arange(n), fields)
    cols = (rng.integers(0, levels, size=(n, fields)) + levels * np.arange(fields)).ravel()
    return sp.csr_matrix((np.ones(n * fields), (rows, cols)), shape=(n, fields * levels))


def _choice(loss, penalty, alpha, X):
    rho = {"l2": 0.0, "l1": 1.0, "elasticnet": 0.5}[penalty]
    problem = obj.Problem(loss, alpha, rho, True)
    return registry.resolve("auto", problem, InMemory(X, np.ones(X.shape[0]))).name


@pytest.mark.parametrize(
    "loss,penalty,alpha,expected",
    [
        ("squared", "l2", 1e-3, "newton"),  # a small ridge: one exact Cholesky step
        ("squared", "l1", 1e-3, "gram"),
        ("hinge", "l2", 1e-3, "newton"),  # smoothed Newton: p small, band Cholesky
        ("hinge", "l2", 1.0, "sdca"),  # strongly regularized: a few SDCA epochs
        # well-conditioned dual, but rows of 20 values: SDCA's logistic dual steps cost
        # more than Newton's few steps (1.7 against 3.1 ms at this shape)
        ("logistic", "l2", 1.0, "newton"),
        ("logistic", "l2", 1e-6, "newton"),  # ill-conditioned: Newton steps
        ("logistic", "l1", 1e-4, "newton"),  # working-set Gram fits
        ("squared_hinge", "l2", 1e-6, "newton"),
    ],
)
def test_dense_choices(rng, loss, penalty, alpha, expected):
    assert _choice(loss, penalty, alpha, rng.normal(size=(2000, 20))) == expected


def test_a_larger_ridge_takes_the_gram_engine_and_a_small_one_is_exact(rng):
    """n ≥ 4p, p ≤ 512, XᵀX above _EXACT_FLOPS: the Gram engine (one pass, then O(p));
    below, Newton's exact step, whose fit equals sklearn's direct solve to rounding."""
    from sklearn.linear_model import Ridge

    assert _choice("squared", "l2", 1e-3, rng.normal(size=(20_000, 20))) == "gram"
    X = rng.normal(size=(300, 20))
    y = X @ rng.normal(size=20) + rng.normal(size=300)
    result = dask_scd.fit(X, y, alpha=1e-2)  # tol 1e-6, but exact
    assert result.solver_ == "newton"
    reference = Ridge(alpha=1e-2 * 300, solver="cholesky").fit(X, y)
    np.testing.assert_allclose(result.coef_, reference.coef_, rtol=1e-10, atol=1e-12)


def test_sparse_one_hot_choices(rng):
    X = _onehot(4000, 20, 500, rng)  # p = 10000 > 2000: no Gram, no Cholesky
    assert _choice("squared", "l2", 1.0 / 4000, X) == "newton"  # κ = 20/(αn) = 20: one CG solve
    assert _choice("squared", "l2", 1.0, X) == "sdca"  # κ tiny: a few epochs
    assert _choice("logistic", "l2", 1.0 / 4000, X) == "newton"
    assert _choice("hinge", "l2", 1.0 / 4000, X) == "sdca"  # p + 1 > 2000: no band Cholesky
    # Pure blocks: proximal Newton, whose inner solver moves whole blocks
    assert _choice("squared", "l1", 1e-4, X) == "newton"
    assert _choice("logistic", "l1", 1e-4, X) == "newton"


def test_wide_sparse_l1_without_blocks():
    X = sp.random(4000, 5000, density=0.01, random_state=0, format="csr")
    assert _choice("squared", "l1", 1e-4, X) == "scd"  # working sets, extrapolation
    # proximal Newton's working sets hold the support, not p (cost_model._WIDE_L1_NEWTON)
    assert _choice("logistic", "l1", 1e-4, X) == "newton"


def test_auto_fit_reports_the_engine_and_converges(rng):
    X = _onehot(3000, 20, 200, rng)  # p = 4000: no Gram
    y = np.asarray(X @ rng.normal(size=X.shape[1])).ravel() + rng.normal(size=3000)
    result = dask_scd.fit(X, y, alpha=1.0 / 3000, tol=1e-9)
    assert result.solver_ == "newton" and result.dual_gap_ <= 1e-9
    reference = dask_scd.fit(X, y, alpha=1.0 / 3000, tol=1e-11, solver="sdca", max_iter=100_000)
    assert abs(result.primal_ - reference.primal_) <= 1e-8 * reference.primal_


def test_auto_on_sparse_dask_chunks_counts_the_stored_values(rng):
    """A dask array of scipy.sparse chunks is measured by its non-zeros, not its dense
    size: a few MB of one-hot data (n·p·8 = 3.2 GB dense) is fitted in memory."""
    import dask.array as da

    from dask_scd.data import make_source

    X = _onehot(8000, 10, 5000, rng)  # 80k non-zeros, p = 50000
    y = np.where(rng.random(8000) < 0.4, 1.0, -1.0)
    Xd = da.from_array(X, chunks=(2000, 50000), asarray=False)
    source = make_source(Xd, y, "logistic", None)
    assert source.nnz == X.nnz  # every row chunk holds the same number: exact here
    assert source.nbytes == X.nnz * 12 < X.shape[0] * X.shape[1] * 8 / 1000
    result = dask_scd.fit(Xd, y, loss="logistic", alpha=1e-3, tol=1e-8)
    assert result.solver_ in ("newton", "sdca", "scd")  # in memory, not a block engine
    reference = dask_scd.fit(X, y, loss="logistic", alpha=1e-3, tol=1e-8)
    assert result.solver_ == reference.solver_  # the same choice as for the matrix itself
    assert result.primal_ == pytest.approx(reference.primal_, rel=2e-8)


def test_many_small_row_chunks_are_merged_with_a_hint(rng):
    """500 row chunks of 40 rows: the source merges them (one task per row chunk and stage
    would cost ~2 ms each) and says how to do it once; the model is the same."""
    import dask.array as da

    from dask_scd.data import make_source

    X = rng.normal(size=(20_000, 6))
    y = X @ rng.normal(size=6) + rng.normal(size=20_000)
    Xd = da.from_array(X, chunks=(40, 6))
    with pytest.warns(UserWarning, match=r"500 row chunks .* X.rechunk\(\{0: 1250\}\)"):
        source = make_source(Xd, y, "squared", None)
    assert source.n_row_chunks == 16 and source.row_bounds[-1] == 20_000
    few = da.from_array(X, chunks=(5000, 6))
    with pytest.warns(UserWarning, match="500 row chunks"):
        merged = dask_scd.fit(Xd, y, alpha=0.01, solver="block_scd", tol=1e-10, max_iter=50)
    plain = dask_scd.fit(few, y, alpha=0.01, solver="block_scd", tol=1e-10, max_iter=50)
    assert merged.dual_gap_ <= 1e-10 and plain.dual_gap_ <= 1e-10
    assert merged.primal_ == pytest.approx(plain.primal_, rel=1e-10)


def test_a_dask_column_of_labels_is_taken_as_numpy_is(rng):
    """y as a dask array of shape (n, 1) is accepted, like a numpy column."""
    import dask.array as da

    from dask_scd.data import make_source

    X = rng.normal(size=(400, 5))
    y = np.where(X[:, 0] + rng.normal(size=400) > 0, 1.0, -1.0)
    source = make_source(
        da.from_array(X, chunks=(200, 5)),
        da.from_array(y[:, None], chunks=(100, 1)),
        "logistic",
        None,
    )
    np.testing.assert_array_equal(np.concatenate(source.y_chunks), y)
    with pytest.raises(ValueError, match="y has shape"):
        make_source(
            da.from_array(X, chunks=(200, 5)),
            da.from_array(np.c_[y, y], chunks=(100, 2)),
            "logistic",
            None,
        )


def test_squared_l1_on_one_hot_fields_takes_newton_over_gram(rng):
    """Lasso on a few one-hot fields (n ≥ 4p, p ≤ 512): the Gram engine's coordinate
    descent creeps along whole-field shifts (on Adult it did not converge in its 1000
    default epochs); Newton's inner solver moves whole blocks."""
    X = _onehot(2000, 8, 20, rng)  # p = 160, 8 pure blocks
    assert _choice("squared", "l1", 1e-3, X) == "newton"
    assert _choice("squared", "l2", 1e-3, X) == "gram"
    assert _choice("squared", "l1", 1e-3, rng.normal(size=(2000, 20))) == "gram"


def test_fields_in_ranges_of_columns_are_found_without_the_colouring(rng, monkeypatch):
    """One-hot fields laid out as ranges of consecutive columns (as encoders write them,
    a value missing here and there) are found in one pass: the colouring (a transpose of
    X) is not run, and the lasso takes Newton (the logistic's L1 takes it without
    asking). The same fields with their columns shuffled are found by the colouring, with
    the same choice; unrelated sparse columns are no fields either way (the Gram
    engine)."""
    from dask_scd.grid import partition

    X = _onehot(2000, 8, 20, rng).tolil()
    X[rng.integers(0, 2000, 50), rng.integers(0, 20, 50)] = 0.0  # missing values
    X = sp.csr_matrix(X)
    X.eliminate_zeros()
    coloured = []
    real = partition.detect_pure_blocks
    monkeypatch.setattr(partition, "detect_pure_blocks", lambda *a: coloured.append(1) or real(*a))
    assert _choice("squared", "l1", 1e-3, X) == "newton" and not coloured
    assert _choice("logistic", "l1", 1e-3, X) == "newton" and not coloured  # no question
    shuffled = X[:, rng.permutation(X.shape[1])]
    assert _choice("squared", "l1", 1e-3, shuffled) == "newton" and coloured
    unrelated = sp.random(2000, 160, density=0.05, random_state=1, format="csr")
    assert _choice("squared", "l1", 1e-3, unrelated) == "gram"


def test_auto_lasso_on_adult_converges_in_default_epochs():
    from conftest import shared_dataset

    X, y = shared_dataset("a8a")
    alpha = 1e-3 * np.abs(X.T @ y).max() / X.shape[0]
    result = dask_scd.fit(
        X, y, loss="squared", penalty="l1", alpha=alpha, fit_intercept=False, tol=1e-8
    )
    assert result.solver_ == "newton" and result.dual_gap_ <= 1e-8


def test_l2_on_large_one_hot_fields_of_rare_values_takes_block_scd(rng, monkeypatch):
    """One-hot fields wider than Newton's Gram, of ≥ _BLOCK_MIN_ENTRIES stored entries
    (lowered here so the test stays small), whose median column holds at most
    _BLOCK_MAX_MEDIAN_COUNT values: block SCD in memory, from CSR or CSC. Columns of many
    values each (Newton's conjugate gradients need few products), a smaller X, a narrow
    one, an L1 term or sample weights: Newton."""
    monkeypatch.setattr(cost_model, "_BLOCK_MIN_ENTRIES", 1_000_000)
    X = _onehot(60_000, 20, 5000, rng)  # 1.2M stored, p = 100k, ~12 values per column
    assert InMemory(X, np.ones(60_000)).median_column_count <= 20
    assert _choice("logistic", "l2", 1.0 / 60_000, X) == "block_scd"
    assert _choice("logistic", "l2", 1.0 / 60_000, X.tocsc()) == "block_scd"
    assert _choice("squared", "l2", 1.0 / 60_000, X) == "block_scd"
    assert _choice("logistic", "l1", 1e-4, X) == "newton"
    frequent = _onehot(60_000, 20, 1000, rng)  # p = 20k, ~60 values per column
    assert InMemory(frequent, np.ones(60_000)).median_column_count > 20
    assert _choice("logistic", "l2", 1.0 / 60_000, frequent) == "newton"
    assert _choice("logistic", "l2", 1.0 / 60_000, frequent.tocsc()) == "newton"
    narrow = _onehot(60_000, 20, 90, rng)  # p = 1800: Newton forms XᵀDX
    assert _choice("logistic", "l2", 1.0 / 60_000, narrow) == "newton"
    assert _choice("logistic", "l2", 1.0 / 4000, _onehot(4000, 20, 500, rng)) == "newton"
    weighted = InMemory(X, np.ones(X.shape[0]), np.ones(X.shape[0]))
    problem = obj.Problem("logistic", 1.0 / 60_000, 0.0, True)
    assert registry.resolve("auto", problem, weighted).name == "newton"
    monkeypatch.undo()  # the real bound: 1.2M stored entries are too few to pay
    assert _choice("logistic", "l2", 1.0 / 60_000, X) == "newton"


def test_rows_of_more_values_than_blocks_skip_the_detection(rng):
    """A row of 300 stored values needs 300 pure blocks, more than any engine uses: X is
    not coloured (text-like rows make the colouring slow) and auto stays with Newton."""
    X = sp.random(4000, 20000, density=0.016, random_state=0, format="lil")
    X[0, :300] = 1.0
    data = InMemory(X.tocsr(), np.ones(4000))
    assert data.pure_blocks is None
    problem = obj.Problem("logistic", 1.0 / 4000, 0.0, True)
    assert registry.resolve("auto", problem, data).name == "newton"


def _rank_deficient():
    """sklearn's sample-weight check's data, its rows repeated: 57 rows of rank 15, p = 30."""
    base = np.random.RandomState(42)
    X = base.rand(15, 30)
    y = base.randint(0, 3, size=15).astype(float)
    counts = base.randint(0, 5, size=15)
    return np.vstack([X.repeat(counts, axis=0), X, X]), np.hstack([y.repeat(counts), y, y])


def test_the_lasso_with_p_at_least_n_takes_newton(rng):
    """The squared loss's lasso with p ≥ n: proximal Newton (coordinate descent crawls
    near the interpolating end); the elastic net, and n > p: SCD."""
    X = rng.normal(size=(100, 300))
    assert _choice("squared", "l1", 1e-3, X) == "newton"
    assert _choice("squared", "elasticnet", 1e-3, X) == "scd"
    assert _choice("squared", "l1", 1e-3, rng.normal(size=(400, 300))) == "scd"


def test_auto_hands_a_stalled_coordinate_fit_over_to_newton():
    """n > p but X of rank 15 < p: "auto" runs SCD, which stops at max_iter short of tol
    near the interpolating end; Newton then finishes from its iterate, to the optimum."""
    from sklearn.linear_model import Lasso

    X, y = _rank_deficient()
    alpha = 1e-3 * np.abs((X - X.mean(0)).T @ (y - y.mean())).max() / len(y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # no warning: it converged
        result = dask_scd.fit(X, y, penalty="l1", alpha=alpha, tol=1e-8, max_iter=200)
    handed = result.extras_["handed_over_from"]
    assert handed["solver"] == "scd" and handed["iterations"] == 200
    assert handed["relative_gap"] > 1e-4  # SCD had stalled
    assert result.solver_ == "newton" and result.converged_ and result.dual_gap_ <= 1e-8
    assert result.n_iter_ > 200 and result.history_.iteration[-1] == result.n_iter_
    assert result.history_.relative_gap[-1] == result.dual_gap_
    with pytest.warns(ConvergenceWarning, match="solver='scd'"):  # a named engine stays
        named = dask_scd.fit(X, y, penalty="l1", alpha=alpha, tol=1e-8, max_iter=200, solver="scd")
    assert named.solver_ == "scd" and not named.converged_
    reference = Lasso(alpha=alpha, tol=1e-14, max_iter=10**6).fit(X, y)
    mine = obj.Problem("squared", alpha, 1.0, True)
    ours = obj.certificate(mine, X, y, result.coef_, result.intercept_).primal
    theirs = obj.certificate(mine, X, y, reference.coef_, reference.intercept_).primal
    assert ours <= theirs * (1 + 1e-8)
