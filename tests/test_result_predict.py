"""FitResult.predict and decision_function check X as the estimators do: the fitted width
(named in the message) and finite values (NaN or infinity named, with its place), for
numpy, scipy.sparse and dask X, binary, regression and multinomial models."""

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer, load_iris

import dask_scd


def _standardized(X):
    return (X - X.mean(axis=0)) / X.std(axis=0)


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return _standardized(X), y


@pytest.fixture(scope="module")
def binary(cancer):
    X, y = cancer
    return dask_scd.fit(X, y, loss="logistic", alpha=0.01, tol=1e-8, random_state=0)


@pytest.fixture(scope="module")
def regression(cancer):
    X, _ = cancer
    return dask_scd.fit(
        X, X[:, 0] + 0.5 * X[:, 1], loss="squared", alpha=0.01, tol=1e-8, random_state=0
    )


@pytest.fixture(scope="module")
def iris():
    X, y = load_iris(return_X_y=True)
    X = _standardized(X)
    result = dask_scd.fit(X, y, loss="multinomial", alpha=0.01, tol=1e-8, random_state=0)
    return X, y, result


KINDS = {
    "dense": lambda X: X,
    "csr": sp.csr_matrix,
    "coo": sp.coo_matrix,
    "dask": lambda X: da.from_array(X, chunks=(100, 7)),
}


def _computed(values):
    return values.compute() if hasattr(values, "compute") else values


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_correct_width_predicts_the_labels_of_the_model(binary, regression, iris, cancer, kind):
    X, _ = cancer
    scores = X @ binary.coef_ + binary.intercept_
    labels = np.where(scores > 0, binary.classes_[1], binary.classes_[0])
    np.testing.assert_array_equal(_computed(binary.predict(KINDS[kind](X))), labels)
    np.testing.assert_allclose(
        _computed(binary.decision_function(KINDS[kind](X))), scores, rtol=1e-12, atol=1e-12
    )
    np.testing.assert_allclose(
        _computed(regression.predict(KINDS[kind](X))),
        X @ regression.coef_ + regression.intercept_,
        rtol=1e-12,
        atol=1e-12,
    )
    X, y, multinomial = iris
    expected = multinomial.classes_[
        np.argmax(X @ multinomial.coef_.T + multinomial.intercept_, axis=1)
    ]
    np.testing.assert_array_equal(_computed(multinomial.predict(KINDS[kind](X))), expected)
    assert np.mean(expected == y) > 0.9


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("columns", [29, 31])
def test_another_width_is_refused_by_name(binary, regression, cancer, kind, columns):
    X, _ = cancer
    X = np.hstack([X, X[:, :1]])[:, :columns]
    message = rf"X has {columns} features, but this model was fitted on 30$"
    for result in (binary, regression):
        for method in (result.predict, result.decision_function):
            with pytest.raises(ValueError, match=message):
                method(KINDS[kind](X))  # a dask X too: refused before anything is computed


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_multinomial_model_refuses_another_width(iris, kind):
    X, _, result = iris
    with pytest.raises(ValueError, match=r"X has 5 features, but this model was fitted on 4"):
        result.predict(KINDS[kind](np.hstack([X, X[:, :1]])))
    with pytest.raises(ValueError, match=r"X has 3 features, but this model was fitted on 4"):
        result.decision_function(KINDS[kind](X[:, :3]))


def test_a_one_dimensional_x_is_refused(binary, cancer):
    X, _ = cancer
    with pytest.raises(ValueError, match=r"X must be 2-D .* got shape \(30,\)"):
        binary.predict(X[0])
    with pytest.raises(ValueError, match=r"X must be 2-D .* got shape \(30,\)"):
        binary.predict(da.from_array(X[0]))


@pytest.mark.parametrize("kind", ["dense", "csr", "coo"])
@pytest.mark.parametrize("value, which", [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_non_finite_values_are_refused_with_their_place(binary, cancer, kind, value, which):
    X, _ = cancer
    X = X.copy()
    X[7, 3] = value
    X[9, 0] = np.nan  # a later row: the first one is reported
    message = (
        rf"X contains NaN or infinity \(first at row 7, column 3\): the value there is "
        rf"{which}$"
    )
    with pytest.raises(ValueError, match=message):
        binary.predict(KINDS[kind](X))
    with pytest.raises(ValueError, match=message):
        binary.decision_function(KINDS[kind](X))


def test_a_multinomial_model_refuses_nan(iris):
    X, _, result = iris
    X = X.copy()
    X[120, 2] = np.nan
    with pytest.raises(ValueError, match=r"row 120, column 2\): the value there is NaN"):
        result.predict(X)


@pytest.mark.parametrize("multinomial", [False, True])
def test_a_dask_x_is_checked_chunk_by_chunk_when_computed(binary, iris, cancer, multinomial):
    X, result = (iris[0], iris[2]) if multinomial else (cancer[0], binary)
    X = X.copy()
    X[130, 3] = np.inf
    labels = result.predict(da.from_array(X, chunks=(50, 2)))  # lazy: nothing raised yet
    with pytest.raises(
        ValueError,
        match=r"first at row 130, column 3\): the value there is "
        r"inf$",
    ):
        labels.compute()
    scores = result.decision_function(da.from_array(X, chunks=(50, 2)))
    with pytest.raises(ValueError, match=r"row 130, column 3"):
        scores.compute()


def test_a_dask_x_of_unknown_chunk_sizes_names_the_row_chunk(binary, cancer):
    X, _ = cancer
    X = X.copy()
    X[130, 3] = np.nan
    dask_X = da.from_array(X, chunks=(100, 30))
    kept = dask_X[dask_X[:, 0] > -np.inf]  # every row, in chunks of unknown sizes
    assert np.isnan(kept.shape[0])
    with pytest.raises(
        ValueError,
        match=r"row 30, column 3 of row chunk 1\): the value "
        r"there is NaN",
    ):
        binary.predict(kept).compute()


def test_huge_finite_values_still_predict(binary, cancer):
    """The fit's bound on |X| (its sums overflow) is not a prediction's."""
    X, _ = cancer
    X = X[:3].copy()
    X[0, 0] = 1e150
    assert binary.predict(X).shape == (3,)
