"""Dask DataFrames as input: the same model as from the equivalent numpy array, with and
without a distributed client; feature names from the columns; predictions that stay
lazy; a clear error for non-numeric columns."""

from contextlib import contextmanager

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import make_classification, make_regression

import dask_scd
from dask_scd import LogisticRegression, Ridge

COLUMNS = [f"f{j}" for j in range(6)]
TOL = 1e-10


@contextmanager
def raise_if_dask_computes():
    """Any compute inside the block fails the test (as xarray's helper of that name)."""

    def refuse(dsk, keys, **kwargs):
        raise AssertionError("a dask graph was computed where it should stay lazy")

    with dask.config.set(scheduler=refuse):
        yield


@pytest.fixture(scope="module", params=["threads", "distributed"])
def scheduler(request):
    if request.param == "threads":
        yield None
        return
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def frame(X, **targets) -> dd.DataFrame:
    table = pd.DataFrame(X, columns=COLUMNS[: X.shape[1]])
    for name, values in targets.items():
        table[name] = values
    return dd.from_pandas(table, npartitions=3)


@pytest.fixture(scope="module")
def regression():
    X, y = make_regression(240, 6, noise=1.0, random_state=0)
    return X, y


@pytest.fixture(scope="module")
def classification():
    X, y = make_classification(240, 6, random_state=0)
    return X, np.where(y == 1, "spam", "ham")


def test_fit_on_a_frame_is_the_fit_on_its_array(regression, classification, scheduler):
    X, y = regression
    ddf = frame(X, target=y)
    ours = dask_scd.fit(ddf[COLUMNS], ddf["target"], alpha=0.1, tol=TOL, random_state=0)
    theirs = dask_scd.fit(X, y, alpha=0.1, tol=TOL, random_state=0)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=0, atol=1e-10)
    X, labels = classification
    ddf = frame(X, label=labels)
    ours = dask_scd.fit(
        ddf[COLUMNS], ddf["label"], loss="logistic", alpha=0.01, tol=TOL, random_state=0
    )
    theirs = dask_scd.fit(X, labels, loss="logistic", alpha=0.01, tol=TOL, random_state=0)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(ours.classes_, ["ham", "spam"])


def test_estimators_on_a_frame(regression, classification, scheduler):
    X, y = regression
    ddf = frame(X, target=y)
    model = Ridge(alpha=0.1, tol=TOL, random_state=0).fit(ddf[COLUMNS], ddf["target"])
    reference = Ridge(alpha=0.1, tol=TOL, random_state=0).fit(X, y)
    np.testing.assert_allclose(model.coef_, reference.coef_, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(model.feature_names_in_, COLUMNS)
    assert model.n_features_in_ == 6
    X, labels = classification
    ddf = frame(X, label=labels)
    model = LogisticRegression(alpha=0.01, tol=TOL, random_state=0)
    model.fit(ddf[COLUMNS], ddf[["label"]])  # y as a one-column frame
    reference = LogisticRegression(alpha=0.01, tol=TOL, random_state=0).fit(X, labels)
    np.testing.assert_allclose(model.coef_, reference.coef_, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(model.classes_, ["ham", "spam"])
    np.testing.assert_array_equal(model.feature_names_in_, COLUMNS)


def test_block_engine_on_a_frame(classification, scheduler):
    if scheduler is None:
        pytest.skip("the block engines run on a distributed client")
    X, labels = classification
    ddf = frame(X, label=labels)
    kwargs = dict(loss="logistic", alpha=0.01, tol=TOL, solver="block_newton")
    ours = dask_scd.fit(ddf[COLUMNS], ddf["label"], **kwargs)
    rows = ddf[COLUMNS].to_dask_array(lengths=True).chunks[0]
    theirs = dask_scd.fit(da.from_array(X, chunks=(rows, 6)), labels, **kwargs)
    assert ours.solver_ == "block_newton"
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=0, atol=1e-10)


def test_predictions_on_a_frame_stay_lazy(classification, regression):
    X, labels = classification
    ddf = frame(X, label=labels)
    model = LogisticRegression(alpha=0.01, random_state=0).fit(ddf[COLUMNS], ddf["label"])
    features = frame(X)
    with raise_if_dask_computes():
        outputs = [
            model.predict(features),
            model.decision_function(features),
            model.predict_proba(features),
        ]
    assert all(isinstance(output, da.Array) for output in outputs)
    predicted, decision, proba = outputs
    table = pd.DataFrame(X, columns=COLUMNS)
    np.testing.assert_array_equal(predicted.compute(), model.predict(table))
    np.testing.assert_allclose(decision.compute(), model.decision_function(table))
    np.testing.assert_allclose(proba.compute(), model.predict_proba(table))
    X, y = regression
    regressor = Ridge(alpha=0.1).fit(X, y)
    with raise_if_dask_computes():
        predicted = regressor.predict(frame(X))
    assert isinstance(predicted, da.Array)
    np.testing.assert_allclose(predicted.compute(), regressor.predict(X))


def test_non_numeric_columns_are_named(regression):
    X, y = regression
    ddf = frame(X, city=["Lyon", "Oslo"] * 120, target=y)
    features = ddf[[*COLUMNS, "city"]]
    with pytest.raises(TypeError, match="non-numeric columns 'city'"):
        dask_scd.fit(features, ddf["target"])
    with pytest.raises(TypeError, match="non-numeric columns 'city'"):
        Ridge().fit(features, ddf["target"])


def test_integer_and_boolean_columns_are_features(regression):
    X, y = regression
    ddf = frame(X, count=np.arange(240) % 7, flag=np.arange(240) % 2 == 0, target=y)
    names = [*COLUMNS, "count", "flag"]
    model = Ridge(alpha=0.1, tol=TOL, random_state=0).fit(ddf[names], ddf["target"])
    dense = np.column_stack([X, np.arange(240) % 7, np.arange(240) % 2 == 0]).astype(float)
    reference = Ridge(alpha=0.1, tol=TOL, random_state=0).fit(dense, y)
    np.testing.assert_allclose(model.coef_, reference.coef_, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(model.feature_names_in_, names)


def test_pandas_frames_keep_their_feature_names(classification):
    X, labels = classification
    table = pd.DataFrame(X, columns=COLUMNS)
    model = LogisticRegression(alpha=0.01).fit(table, pd.Series(labels))
    np.testing.assert_array_equal(model.feature_names_in_, COLUMNS)
    decision = table.to_numpy() @ model.coef_[0] + model.intercept_[0]
    np.testing.assert_array_equal(model.predict(table), np.where(decision > 0, "spam", "ham"))
