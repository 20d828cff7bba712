"""Every kind of input a model accepts, reduced to one of four: native, memory, dask, grid.

``native``: what scikit-learn validates itself (numpy, scipy.sparse, pandas, lists, and a
libsvm file once read); ``memory``: a numpy or scipy.sparse matrix taken out of an xarray
object, with its feature names; ``dask``: a dask array (numpy or scipy.sparse chunks, any
chunking), or a dask DataFrame's numeric columns as one, with their names; ``grid``: a
:class:`dask_scd.grid.Grid` (or the path of one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dask_scd.validation import is_dask


@dataclass
class ModelInput:
    """X (and y) ready for a model, with where they came from."""

    X: object
    y: object
    kind: str  # "native", "memory", "dask" or "grid"
    feature_names: np.ndarray | None = None


def is_dask_frame(obj) -> bool:
    """A dask DataFrame or Series (by module name, as :func:`is_dask`)."""
    return (
        type(obj).__module__.startswith("dask.")
        and hasattr(obj, "to_dask_array")
        and hasattr(obj, "npartitions")
    )


def is_grid(obj) -> bool:
    return type(obj).__name__ == "Grid" and type(obj).__module__.startswith("dask_scd.grid")


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
    if isinstance(X, (str, os.PathLike)):
        return _read_path(os.fspath(X), y, n_features)
    if is_grid(X):
        if y is not None:
            raise ValueError("a Grid carries its own labels: pass y=None with a grid")
        names = X.feature_names
        return ModelInput(X, None, "grid", _names(names) if names is not None else None)
    module = type(X).__module__
    if module.startswith("xarray"):
        return _read_xarray(X, y)
    if isinstance(y, str):
        raise ValueError("y may be a variable name only when X is an xarray Dataset")
    if is_dask_frame(X) or is_dask_frame(y):
        return _read_frames(X, y, lengths)
    y = _unwrap(y)
    if is_dask(X):
        return ModelInput(X, y, "dask")
    return ModelInput(X, y, "native")


def _read_path(path: str, y, n_features):
    if os.path.isdir(path):
        from dask_scd.grid import open_grid

        return read_input(open_grid(path), y)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no grid store or libsvm file at {path}")
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


def _read_xarray(X, y) -> ModelInput:
    if type(X).__name__ == "Dataset":
        if isinstance(y, str):
            if y not in X.data_vars:
                raise ValueError(f"y={y!r} is not a data variable of the Dataset")
            X, y = X.drop_vars(y), X[y]
        matrix, names = _dataset_matrix(X, y)
    elif type(X).__name__ == "DataArray":
        if X.ndim != 2:
            raise ValueError(f"X DataArray must be 2-D (sample, feature), got dims {X.dims}")
        from dask_scd.grid.readers import sample_axis

        if sample_axis(X.dims, getattr(y, "dims", None), None) == 1:  # (feature, sample)
            X = X.transpose(X.dims[1], X.dims[0])
        matrix, names = X.data, None
        if X.dims[1] in X.coords:
            names = _names(X.coords[X.dims[1]].values)
    else:
        raise TypeError(f"unsupported xarray object {type(X).__name__}")
    if isinstance(y, str):
        raise ValueError("y may be a variable name only when X is an xarray Dataset")
    y = _unwrap(y)
    return ModelInput(matrix, y, "dask" if is_dask(matrix) else "memory", names)


def _dataset_matrix(ds, y):
    """Columns of every data variable, side by side: 1-D variables are single columns, 2-D
    ones are read with their sample dim first (the dim found as ``to_grid`` finds it)."""
    from dask_scd.grid.readers import dataset_sample_dim

    if not ds.data_vars:
        raise ValueError("the Dataset has no data variables to use as features")
    sample_dim = dataset_sample_dim(ds, y, None)
    columns, names = [], []
    for name, var in ds.data_vars.items():
        if var.ndim == 2 and sample_dim in var.dims:
            var = var.transpose(sample_dim, ...)
        if var.ndim == 1:
            columns.append(var.data.reshape(-1, 1))
            names.append(str(name))
        elif var.ndim == 2:
            columns.append(var.data)
            dim = var.dims[1]
            values = var.coords[dim].values if dim in var.coords else range(var.shape[1])
            names.extend(f"{name}={value}" for value in values)
        else:
            raise ValueError(f"data variable {name!r} must be 1-D or 2-D, got dims {var.dims}")
    if any(is_dask(column) for column in columns):
        import dask.array as da

        matrix = da.concatenate([da.asarray(column) for column in columns], axis=1)
    elif any(sp.issparse(column) for column in columns):
        matrix = sp.hstack([sp.csr_matrix(column) for column in columns], format="csr")
    else:
        matrix = np.hstack([np.asarray(column) for column in columns])
    return matrix, _names(names)


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
    bad = [str(c) for c, d in dtypes.items() if not pd.api.types.is_numeric_dtype(d)]
    if bad:
        described = ", ".join(f"{c!r} ({dtypes[c]})" for c in bad[:10])
        raise TypeError(
            f"X has non-numeric columns {described}{', ...' if len(bad) > 10 else ''}"
            ": the features must be numbers; encode these columns (e.g. "
            "dask_ml.preprocessing.Categorizer then DummyEncoder) or drop them"
        )
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
