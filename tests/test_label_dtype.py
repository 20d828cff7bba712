"""classes_ in the labels' own dtype: ints, bools and strings in memory, and ints and
bools on a grid (which stores its labels as float64 and records their dtype), predict's
labels of that dtype; a pandas nullable boolean as scikit-learn reads it; a grid written
without the record keeps float classes."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LogisticRegression as SkLogisticRegression

import dask_scd
from dask_scd.grid import GridCorruptionError


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(90, 4))
    y3 = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.3)
    return X, y3


def _fit(estimator, X, y=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return estimator.fit(X, y)


ESTIMATORS = {
    "logistic": lambda: dask_scd.LogisticRegression(alpha=1e-2),
    "logistic_ovr": lambda: dask_scd.LogisticRegression(alpha=1e-2, multi_class="ovr"),
    "svc": lambda: dask_scd.LinearSVC(alpha=1e-2),
    "logistic_cv": lambda: dask_scd.LogisticRegressionCV(Cs=2, cv=3),
}


def _labels(kind: str, y3):
    binary = y3 == 1
    return {
        "int": y3,
        "int32_binary": binary.astype(np.int32),
        "bool": binary,
        "str": np.array(["low", "mid", "high"])[y3],
    }[kind]


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
@pytest.mark.parametrize("kind", ["int", "int32_binary", "bool", "str"])
def test_in_memory_classes_keep_the_labels_dtype(name, kind, data):
    X, y3 = data
    y = _labels(kind, y3)
    model = _fit(ESTIMATORS[name](), X, y)
    assert model.classes_.dtype == y.dtype
    np.testing.assert_array_equal(model.classes_, np.unique(y))
    assert model.predict(X).dtype == y.dtype


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
@pytest.mark.parametrize("kind", ["int", "int32_binary", "bool"])
def test_grid_classes_keep_the_labels_dtype(name, kind, data, tmp_path):
    X, y3 = data
    y = _labels(kind, y3)
    grid = dask_scd.to_grid(X, y, tmp_path / "g.zarr", row_chunk=30)
    assert grid.label_dtype == y.dtype and grid.attrs["label_dtype"] == y.dtype.name
    assert grid.y.dtype == np.float64  # stored as float64, as before
    model = _fit(ESTIMATORS[name](), grid)
    assert model.classes_.dtype == y.dtype
    np.testing.assert_array_equal(model.classes_, np.unique(y))
    assert model.predict(grid).dtype == y.dtype
    assert model.predict(X).dtype == y.dtype
    expected = _fit(ESTIMATORS[name](), X, y)
    assert model.score(grid) == pytest.approx(expected.score(X, y), abs=0.05)


def test_fit_and_path_on_a_grid_give_the_labels_dtype(data, tmp_path):
    X, y3 = data
    y = (y3 == 1).astype(np.int64)
    grid = dask_scd.to_grid(X, y, tmp_path / "g.zarr", row_chunk=30)
    result = dask_scd.fit(grid, loss="logistic", alpha=1e-2)
    assert result.classes_.dtype == np.int64 and result.classes_.tolist() == [0, 1]
    assert result.predict(X).dtype == np.int64
    path = dask_scd.path(grid, loss="logistic", alphas=[0.1, 0.01])
    assert path.classes.dtype == np.int64
    multinomial = dask_scd.fit(
        dask_scd.to_grid(X, y3, tmp_path / "g3.zarr", row_chunk=30),
        loss="multinomial",
        alpha=1e-2,
    )
    assert multinomial.classes_.dtype == np.int64 and multinomial.classes_.tolist() == [0, 1, 2]


def test_pandas_nullable_boolean_as_scikit_learn_reads_it(data, tmp_path):
    """scikit-learn's estimators read a pandas "boolean" Series as float64 (its
    check_array converts pandas extension dtypes): classes_ [0., 1.] there and here; the
    functional API and a grid read its numpy values, booleans."""
    X, y3 = data
    y = pd.Series(y3 == 1, dtype="boolean")
    reference = SkLogisticRegression().fit(X, y)
    model = _fit(dask_scd.LogisticRegression(alpha=1e-2), X, y)
    assert model.classes_.dtype == reference.classes_.dtype
    np.testing.assert_array_equal(model.classes_, reference.classes_)
    assert model.predict(X).dtype == reference.predict(X).dtype
    result = dask_scd.fit(X, y, loss="logistic", alpha=1e-2)
    assert result.classes_.dtype == np.bool_ and result.classes_.tolist() == [False, True]
    grid = dask_scd.to_grid(X, y, tmp_path / "g.zarr", row_chunk=30)
    assert grid.label_dtype == np.bool_
    on_grid = _fit(dask_scd.LogisticRegression(alpha=1e-2), grid)
    assert on_grid.classes_.tolist() == [False, True] and on_grid.classes_.dtype == np.bool_


def _set_label_dtype(path, value) -> None:
    """Rewrite (or, for None, remove) ``label_dtype`` in a store's zarr.json."""
    header = path / "zarr.json"
    document = json.loads(header.read_text())
    document["attributes"].pop("label_dtype")
    if value is not None:
        document["attributes"]["label_dtype"] = value
    header.write_text(json.dumps(document))


def test_a_grid_written_without_the_record_keeps_float_classes(data, tmp_path):
    X, y3 = data
    path = tmp_path / "old.zarr"
    dask_scd.to_grid(X, y3, path, row_chunk=30)
    _set_label_dtype(path, None)
    grid = dask_scd.open_grid(path)
    assert grid.label_dtype == np.float64
    model = _fit(dask_scd.LogisticRegression(alpha=1e-2), grid)
    assert model.classes_.dtype == np.float64 and model.classes_.tolist() == [0.0, 1.0, 2.0]
    assert dask_scd.fit(grid, loss="multinomial", alpha=1e-2).classes_.dtype == np.float64


@pytest.mark.parametrize("value", ["object", "<U3", "not a dtype", 3])
def test_a_bad_label_dtype_record_is_named(value, data, tmp_path):
    X, y3 = data
    path = tmp_path / "bad.zarr"
    dask_scd.to_grid(X, y3, path, row_chunk=30)
    _set_label_dtype(path, value)
    with pytest.raises(GridCorruptionError, match="label_dtype"):
        dask_scd.open_grid(path)


def test_labels_dtype_survives_save_and_load(data, tmp_path):
    X, y3 = data
    for y in (y3, y3 == 1, np.array(["a", "b", "c"])[y3], np.array(["a", "b", "c"], object)[y3]):
        model = _fit(dask_scd.LogisticRegression(alpha=1e-2), X, y)
        dask_scd.save(model, tmp_path / "m")
        loaded = dask_scd.load(tmp_path / "m")
        assert loaded.classes_.dtype == y.dtype and loaded.predict(X).dtype == y.dtype
        assert loaded.predict(X).tolist() == model.predict(X).tolist()
