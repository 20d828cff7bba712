"""Bad input gets a clear ValueError naming the argument; the caller's data is untouched."""

import numpy as np
import pytest
import scipy.sparse as sp

import dask_scd


@pytest.fixture
def data(rng):
    X = rng.normal(size=(50, 4))
    y = np.sign(rng.normal(size=50))
    return X, y


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_X(data, bad):
    X, y = data
    X = X.copy()
    X[7, 2] = bad
    with pytest.raises(
        ValueError, match=r"X contains NaN or infinity \(first at row 7, column 2\)"
    ):
        dask_scd.fit(X, y)
    with pytest.raises(ValueError, match="X contains NaN or infinity"):
        dask_scd.fit(sp.csr_matrix(X), y)


def test_non_finite_y(data):
    X, y = data
    y = y.copy()
    y[3] = np.nan
    with pytest.raises(ValueError, match=r"y contains NaN or infinity \(first at index 3\)"):
        dask_scd.fit(X, y)
    with pytest.raises(ValueError, match="y contains NaN"):
        dask_scd.fit(X, y, loss="logistic")


def _raw_csr(indices, indptr, shape=(2, 3), fmt="csr"):
    """A sparse matrix built from raw arrays, which scipy takes without checking them."""
    make = sp.csr_matrix if fmt == "csr" else sp.csc_matrix
    indices = np.asarray(indices, dtype=np.int32)
    return make((np.ones(len(indices)), indices, np.asarray(indptr)), shape=shape)


@pytest.mark.filterwarnings("ignore::dask_scd.TaskOverheadWarning")
@pytest.mark.parametrize(
    "X, match",
    [
        (_raw_csr([0, 5_000_000, 1, 2], [0, 2, 4]), "row 0 holds the column index 5000000"),
        (_raw_csr([0, 1, 2, -1], [0, 2, 4]), "row 1 holds the column index -1, outside 0..2"),
        (_raw_csr([0, 1, 1, 2], [0, 3, 2]), "malformed CSR .* index pointers .*row 0"),
        (_raw_csr([0, 7, 1, 0], [0, 2, 3, 4], fmt="csc"), "column 0 holds the row index 7"),
    ],
)
def test_malformed_sparse_X_is_refused_before_a_kernel_reads_it(X, match):
    """Indices or pointers outside a CSR/CSC matrix's shape (which crashed the process in
    the kernels, or in scipy's own format change) get a ValueError naming the line and
    the index, in memory, at prediction time and in a chunk of a dask array; the caller's
    arrays are untouched."""
    import dask
    import dask.array as da

    y = np.array([1.0, -1.0])
    before = (X.data.copy(), X.indices.copy(), X.indptr.copy())
    with pytest.raises(ValueError, match=match):
        dask_scd.fit(X, y, loss="logistic", alpha=0.1)
    fitted = dask_scd.fit(np.eye(2, 3), y, loss="logistic", alpha=0.1)
    with pytest.raises(ValueError, match=match):
        fitted.predict(X)
    for old, new in zip(before, (X.data, X.indices, X.indptr)):
        np.testing.assert_array_equal(old, new)
    if X.format != "csr":
        return
    # A chunk that dask's own slicing did not filter (a delayed chunk, as a reader makes).
    chunk = da.from_delayed(dask.delayed(lambda: X)(), X.shape, float, meta=sp.csr_matrix((0, 0)))
    # Returned by the inspecting task as a finding, raised by the client (no worker logs a
    # failed task), naming the cell.
    with pytest.raises(
        ValueError, match=r"a chunk of X, cell \(row chunk 0, block 0\), is a malformed CSR"
    ):
        dask_scd.fit(chunk, da.from_array(y, chunks=2), loss="logistic", solver="block_scd")


def test_shapes(data):
    X, y = data
    with pytest.raises(ValueError, match="y has 49 labels but X has 50 rows"):
        dask_scd.fit(X, y[:-1])
    with pytest.raises(ValueError, match="X must be 2-D"):
        dask_scd.fit(X[:, 0], y)
    with pytest.raises(ValueError, match="y must be 1-D"):
        dask_scd.fit(X, np.stack([y, y], axis=1))
    with pytest.raises(ValueError, match="X is empty"):
        dask_scd.fit(np.zeros((0, 3)), np.zeros(0))
    with pytest.raises(ValueError, match="X must be numeric"):
        dask_scd.fit(X.astype(str), y)


def test_labels(data):
    X, y = data
    with pytest.raises(ValueError, match="3 classes.*one-vs-rest"):
        dask_scd.fit(X, np.arange(50) % 3, loss="logistic")
    with pytest.raises(ValueError, match="single class"):
        dask_scd.fit(X, np.ones(50), loss="hinge")
    # {0, 1}, {-1, 1} and any two labels give the same model.
    pm = dask_scd.fit(X, y, loss="logistic", alpha=0.1, tol=1e-10, random_state=0)
    zero_one = dask_scd.fit(
        X, (y > 0).astype(int), loss="logistic", alpha=0.1, tol=1e-10, random_state=0
    )
    named = dask_scd.fit(
        X, np.where(y > 0, "spam", "ham"), loss="logistic", alpha=0.1, tol=1e-10, random_state=0
    )
    np.testing.assert_array_equal(pm.coef_, zero_one.coef_)
    np.testing.assert_array_equal(pm.coef_, named.coef_)
    assert list(named.classes_) == ["ham", "spam"]
    assert set(named.predict(X)) <= {"ham", "spam"}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"alpha": 0.0}, "alpha=0.0 must be a finite number > 0"),
        ({"alpha": -1.0}, "alpha=-1.0"),
        ({"alpha": np.nan}, "alpha=nan"),
        ({"penalty": "elasticnet", "l1_ratio": 1.5}, "l1_ratio=1.5 must be in"),
        ({"penalty": "elasticnet", "l1_ratio": -0.1}, "l1_ratio=-0.1"),
        ({"loss": "huber"}, "loss='huber' is not one of"),
        ({"penalty": "l0"}, "penalty='l0' is not one of"),
        ({"loss": "hinge", "penalty": "l1"}, "loss='hinge' needs penalty='l2'"),
        ({"solver": "sdca", "penalty": "l1"}, "solver='sdca' solves loss='squared' with an L2"),
        ({"solver": "quasi_newton"}, "solver='quasi_newton' is not one of"),
        ({"tol": 0.0}, "tol=0.0 must be a number > 0"),
        ({"max_iter": 0}, "max_iter=0 must be an integer"),
    ],
)
def test_bad_arguments(data, kwargs, match):
    X, y = data
    with pytest.raises(ValueError, match=match):
        dask_scd.fit(X, y, **kwargs)


@pytest.mark.parametrize("fmt", ["dense", "dense_f32", "csr", "csc", "csc_unsorted"])
@pytest.mark.parametrize("loss,penalty", [("squared", "l1"), ("logistic", "l2"), ("hinge", "l2")])
def test_caller_data_never_modified(rng, fmt, loss, penalty):
    X = rng.normal(size=(40, 5))
    X[rng.random(X.shape) < 0.4] = 0
    y = np.sign(rng.normal(size=40))
    if fmt == "dense_f32":
        X = X.astype(np.float32)
    elif fmt in ("csr", "csc"):
        X = sp.csr_matrix(X).asformat(fmt)
    elif fmt == "csc_unsorted":
        C = sp.csc_matrix(X)
        order = np.concatenate([np.arange(s, e)[::-1] for s, e in zip(C.indptr[:-1], C.indptr[1:])])
        X = sp.csc_matrix((C.data[order], C.indices[order], C.indptr), shape=C.shape)
        assert not X.has_sorted_indices
    before = X.copy()
    parts = [X.data.copy(), X.indices.copy(), X.indptr.copy()] if sp.issparse(X) else None
    y_before = y.copy()
    dask_scd.fit(X, y, loss=loss, penalty=penalty, alpha=0.1, tol=1e-6, random_state=0)
    np.testing.assert_array_equal(y, y_before)
    if sp.issparse(X):
        for old, new in zip(parts, (X.data, X.indices, X.indptr)):
            np.testing.assert_array_equal(old, new)
    else:
        np.testing.assert_array_equal(X, before)
        assert X.dtype == before.dtype


def test_object_arrays_of_numbers_are_converted(data):
    """An object X that holds numbers is fitted as its float64 copy (scikit-learn's
    conversion; the caller's array is untouched); one that holds something else is
    refused, naming the first entry that is not a number."""
    X, y = data
    as_objects = X.astype(object)
    kept = as_objects.copy()
    result = dask_scd.fit(as_objects, y, loss="logistic", alpha=0.1, random_state=0)
    reference = dask_scd.fit(X, y, loss="logistic", alpha=0.1, random_state=0)
    np.testing.assert_array_equal(result.coef_, reference.coef_)
    assert as_objects.dtype == object and (as_objects == kept).all()
    np.testing.assert_array_equal(result.predict(as_objects), reference.predict(X))
    as_objects[3, 1] = "n/a"
    with pytest.raises(ValueError, match=r"X must be numeric: X\[3, 1\] = 'n/a' \(str\)"):
        dask_scd.fit(as_objects, y, loss="logistic", alpha=0.1)


def test_frame_columns_that_are_not_numbers_are_named(data):
    """A pandas DataFrame with string or categorical columns: fit and the estimators name
    them (as for a dask DataFrame); a column of numbers stored as objects is a feature."""
    pd = pytest.importorskip("pandas")
    X, y = data
    frame = pd.DataFrame(X, columns=["a", "b", "c", "d"])
    frame["city"] = ["Lyon", "Oslo"] * 25
    frame["size"] = pd.Categorical(["S", "M"] * 25)
    match = r"X has non-numeric columns 'city' \(\w+\), 'size' \(category\)"
    with pytest.raises(TypeError, match=match):
        dask_scd.fit(frame, y, loss="logistic", alpha=0.1)
    for model in (dask_scd.LogisticRegression(), dask_scd.Ridge()):
        with pytest.raises(TypeError, match=match):
            model.fit(frame, y)
    numbers = pd.DataFrame(X, columns=["a", "b", "c", "d"]).astype({"b": object})
    result = dask_scd.fit(numbers, y, loss="logistic", alpha=0.1, random_state=0)
    reference = dask_scd.fit(X, y, loss="logistic", alpha=0.1, random_state=0)
    # the same problem; the frame's values come in column order, which Newton reads as
    # they are (its sums in another order: rounding apart)
    np.testing.assert_allclose(result.coef_, reference.coef_, rtol=1e-12, atol=1e-15)
    fitted = dask_scd.LogisticRegression(random_state=0).fit(numbers, y)
    assert list(fitted.feature_names_in_) == ["a", "b", "c", "d"]


def test_random_state_is_checked_at_once_and_made_on_first_use(monkeypatch):
    """A seed (or None) becomes a LazyGenerator: checked when fit is called, its Generator
    made at the first draw with the draws of ``default_rng(seed)``, shared by the copies of
    the engine's options; a Newton fit that samples nothing never makes it."""
    import dataclasses

    from dask_scd.engines.base import Options
    from dask_scd.validation import LazyGenerator, check_random_state

    lazy = check_random_state(7)
    assert isinstance(lazy, LazyGenerator) and lazy._generator is None
    assert check_random_state(lazy) is lazy
    generator = np.random.default_rng(1)
    assert check_random_state(generator) is generator
    options = Options(1e-6, 10, lazy)
    copy = dataclasses.replace(options, tol=1e-3)
    first = options.rng.random(3)
    np.testing.assert_array_equal(first, np.random.default_rng(7).random(3))
    assert copy.rng is options.rng  # one stream: the copy's draws go on from there
    for bad in (-1, 1.5, "a"):
        with pytest.raises(ValueError, match="random_state"):
            dask_scd.fit(np.eye(3), np.array([1.0, -1.0, 1.0]), random_state=bad)
    X = np.random.RandomState(0).randn(60, 5)
    kwargs = dict(loss="logistic", solver="newton", random_state=3)
    dask_scd.fit(X, np.sign(X[:, 0]), **kwargs)  # the lazy imports of a first fit
    made = []
    monkeypatch.setattr(np.random, "default_rng", lambda *a: made.append(a))
    result = dask_scd.fit(X, np.sign(X[:, 0]), **kwargs)
    assert result.converged_ and result.n_iter_ >= 2 and made == []


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("order", ["C", "F", "strided"])
def test_largest_magnitude_reads_the_float_bits(rng, dtype, order):
    """max |x| in one pass over the sign-cleared IEEE bits, where X is contiguous: the
    value numpy's max and min give, NaN (of either sign) and ±inf found wherever they
    are, -0.0 read as 0, and the same through the two-pass path of a strided view."""
    from dask_scd.validation import largest_magnitude

    base = rng.normal(size=(37, 11)).astype(dtype) * 1e3
    X = np.asfortranarray(base) if order == "F" else base
    X = X[:, ::2] if order == "strided" else X
    assert largest_magnitude(X) == np.abs(X).max()
    assert largest_magnitude(np.zeros((3, 2), dtype=dtype) * -1.0) == 0.0
    for bad in (np.nan, -np.nan, np.inf, -np.inf):
        spoiled = X.copy(order="K")
        spoiled[36, 4] = bad
        found = largest_magnitude(spoiled)
        assert np.isnan(found) if np.isnan(bad) else found == np.inf
    assert largest_magnitude(np.array([1, -7, 3], dtype=np.int8)) == 7.0
