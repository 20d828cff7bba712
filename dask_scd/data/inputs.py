"""Every kind of input a model accepts, reduced to one of four: native, memory, dask, grid.

``native``: what scikit-learn validates itself (numpy, scipy.sparse, pandas, lists, and a
libsvm file once read); ``memory``: a numpy or scipy.sparse matrix taken out of an xarray
object, with its feature names; ``dask``: a dask array (numpy or scipy.sparse chunks, any
chunking), or a dask DataFrame's numeric columns as one, with their names; ``grid``: a
:class:`dask_scd.grid.Grid` (or the path of one). What an input is, :mod:`dask_scd.grid.kinds`
says (the grid writer asks it too).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from dask_scd.grid.kinds import (
    DASK_ARRAY,
    DASK_FRAME,
    DATASET,
    GRID,
    GRID_STORE,
    LIBSVM_FILE,
    XARRAY,
    guess_kind,
    is_dask_frame,
)
from dask_scd.validation import check_numeric_columns, is_dask, non_numeric_columns


@dataclass
class ModelInput:
    """X (and y) ready for a model, with where they came from."""

    X: object
    y: object
    kind: str  # "native", "memory", "dask" or "grid"
    feature_names: np.ndarray | None = None


def read_input(X, y=None, *, n_features: int | None = None, lengths: bool = True) -> ModelInput:
    """Reduce X (and y) to a :class:`ModelInput`.

    Parameters
    ----------
    X : array-like, sparse matrix, DataFrame, dask array, xarray DataArray or Dataset, Grid,
        or path
        A path names a grid store (a directory) or a libsvm text file.
    y : array-like, dask array, xarray DataArray, str or None
        Targets; a str names a data variable of a Dataset X. Must be None for a grid or
        a libsvm file, which carry their labels.
    n_features : int, optional
        The number of features a libsvm file is read with (at prediction time).
    lengths : bool
        Compute the partition lengths of a dask DataFrame or Series (one pass over its
        partitions, X's and y's together): a fit needs its row chunks; a prediction does
        not, and stays lazy with ``lengths=False``.

    Returns
    -------
    ModelInput
    """
    kind = guess_kind(X)
    if kind is GRID_STORE:
        from dask_scd.grid import open_grid

        kind, X = GRID, open_grid(X)
    if kind is GRID:
        if y is not None:
            raise ValueError("a Grid carries its own labels: pass y=None with a grid")
        names = X.feature_names
        return ModelInput(X, None, "grid", _names(names) if names is not None else None)
    if kind is LIBSVM_FILE:
        return _read_libsvm(os.fspath(X), y, n_features)
    if isinstance(y, str) and kind is not DATASET:
        raise ValueError("y may be a variable name only when X is an xarray Dataset")
    if kind in XARRAY:
        X, y, names, _ = kind.columns(X, y)
        kind = "dask" if is_dask(X) else "memory"
        return ModelInput(X, _unwrap(y), kind, None if names is None else _names(names))
    if kind is DASK_FRAME or is_dask_frame(y):
        return _read_frames(X, y, lengths)
    if type(X).__module__.startswith("pandas") and getattr(X, "ndim", 0) == 2:
        check_numeric_columns(X)  # names the columns scikit-learn's checks would not
    return ModelInput(X, _unwrap(y), "dask" if kind is DASK_ARRAY else "native")


def _read_libsvm(path: str, y, n_features) -> ModelInput:
    if y is not None:
        raise ValueError(f"y must be None for a libsvm file ({path}): its labels are used")
    from sklearn.datasets import load_svmlight_file

    try:
        X, labels = load_svmlight_file(path, n_features=n_features, dtype=np.float64)
    except ValueError:
        from dask_scd.grid.readers import scan_libsvm

        scan_libsvm(path)  # raises the error that names the malformed line
        raise
    return ModelInput(X, labels, "native")


def _read_frames(X, y, lengths: bool) -> ModelInput:
    """A dask DataFrame X (its numeric columns, their names as feature names) and a dask
    Series or DataFrame y, as dask arrays with known row chunks when ``lengths``."""
    names = None
    if is_dask_frame(X):
        if X.ndim != 2:
            raise ValueError(
                "X must be a dask DataFrame of shape (n_samples, n_features), "
                "got a dask Series (X.to_frame() makes it one column)"
            )
        X, names = _numeric_frame(X), _names(X.columns)
    if is_dask_frame(y):
        y = _label_frame(y)
    frames = [f for f in (X, y) if is_dask_frame(f)]
    known = iter(_partition_lengths(frames) if lengths else [None] * len(frames))
    if is_dask_frame(X):
        X = X.to_dask_array(lengths=next(known))
    y = y.to_dask_array(lengths=next(known)) if is_dask_frame(y) else _unwrap(y)
    return ModelInput(X, y, "dask" if is_dask(X) else "native", names)


def _partition_lengths(frames: list) -> list:
    """The rows of each partition of each frame, in one compute: when y is a column of
    X's frame, their shared partitions are read once."""
    import dask

    counts = dask.compute(*[frame.map_partitions(len) for frame in frames])
    return [tuple(int(c) for c in count) for count in counts]


def _numeric_frame(frame):
    """A dask DataFrame of numeric columns, as float64 unless every column is already one
    float dtype (mixed columns would come out as an object array)."""
    import pandas as pd

    dtypes = frame.dtypes
    bad = [(c, d) for c, d in dtypes.items() if not pd.api.types.is_numeric_dtype(d)]
    if bad:
        raise non_numeric_columns(bad, "dask_ml.preprocessing.Categorizer then DummyEncoder")
    kinds = set(dtypes)
    if len(kinds) == 1 and next(iter(kinds)) in (np.float64, np.float32):
        return frame
    return frame.astype(np.float64)


def _label_frame(y):
    """A dask Series (or a one-column frame) of labels with numpy dtypes: numeric
    extension dtypes as float64, strings and categories as objects."""
    import pandas as pd

    if y.ndim == 2 and len(y.columns) == 1:
        y = y[y.columns[0]]
    if y.ndim == 2:
        return _numeric_frame(y)  # several targets (multi-output regression)
    if isinstance(y.dtype, np.dtype):
        return y
    return y.astype(np.float64 if pd.api.types.is_numeric_dtype(y.dtype) else object)


def _unwrap(y):
    """The array inside an xarray DataArray or a pandas Series."""
    if y is None or is_dask(y):
        return y
    if type(y).__module__.startswith("xarray"):
        return y.data
    return y


def _names(values) -> np.ndarray:
    return np.asarray([str(value) for value in values], dtype=object)
