"""What an input is: one :class:`Kind` per kind of container, asked in turn.

Each kind says whether it can open an object (``guess_can_open``, by type or module name:
nothing is imported to say no) and, where it has any, reads the metadata both readers of
an input need: an xarray object's matrix with its samples first, its feature names and
its blocks. :func:`guess_kind` asks the kinds in order and, where none can open the
input, raises one error that lists the kinds known. The models' reader
(:func:`dask_scd.data.read_input`) and the grid writer's
(:func:`dask_scd.grid.readers.row_reader`) both ask here, then read each kind their way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dask_scd.validation import is_dask, is_pydata_sparse, to_scipy

from .handle import Grid


def _is_path(X) -> bool:
    return isinstance(X, (str, os.PathLike))


def _is_xarray(X, name: str) -> bool:
    return type(X).__module__.startswith("xarray") and type(X).__name__ == name


def is_dask_frame(obj) -> bool:
    """A dask DataFrame or Series (by module name, as :func:`~dask_scd.validation.is_dask`)."""
    return (
        type(obj).__module__.startswith("dask.")
        and hasattr(obj, "to_dask_array")
        and hasattr(obj, "npartitions")
    )


def is_grid(obj) -> bool:
    return isinstance(obj, Grid)


@dataclass(frozen=True)
class Kind:
    """A kind of input: its name in errors, whether it can open an object, and, for an
    xarray object, ``columns(X, y, sample_dim) -> (X, y, feature names, blocks)``."""

    name: str
    guess_can_open: Callable[[object], bool]
    columns: Callable | None = None


def dataset_columns(ds, y, sample_dim=None) -> tuple:
    """(X, y, feature names, blocks) of a Dataset: every data variable's columns side by
    side, one block each. A 1-D variable is one column; a 2-D one is read with the sample
    dim first, its columns named ``variable=coordinate``. ``y`` may name a variable, which
    is then the labels and not a feature."""
    if isinstance(y, str):
        if y not in ds.data_vars:
            raise ValueError(f"y={y!r} is not a data variable of the Dataset")
        ds, y = ds.drop_vars(y), ds[y]
    if not ds.data_vars:
        raise ValueError("the Dataset has no data variables to use as features")
    sample_dim = dataset_sample_dim(ds, y, sample_dim)
    columns, names, blocks = [], [], []
    for name, var in ds.data_vars.items():
        if var.ndim not in (1, 2):
            raise ValueError(f"data variable {name!r} must be 1-D or 2-D, got dims {var.dims}")
        if sample_dim not in var.dims:
            raise ValueError(
                f"data variable {name!r} has dims {var.dims}, without the sample dim "
                f"{sample_dim!r} (pass sample_dim= to name it)"
            )
        var = var.transpose(sample_dim, ...)
        if var.ndim == 1:
            columns.append(var.data.reshape(-1, 1))
            var_names = [str(name)]
        else:
            columns.append(var.data)
            dim = var.dims[1]
            values = var.coords[dim].values if dim in var.coords else range(var.shape[1])
            var_names = [f"{name}={value}" for value in values]
        blocks.append(np.arange(len(names), len(names) + len(var_names), dtype=np.int64))
        names.extend(var_names)
    if any(is_dask(c) for c in columns):
        import dask.array as da

        X = da.concatenate([da.asarray(c) for c in columns], axis=1)
    elif any(sp.issparse(c) or is_pydata_sparse(c) for c in columns):
        X = sp.hstack([to_scipy(c) for c in columns], format="csr")
    else:
        X = np.hstack([np.asarray(c) for c in columns])
    return X, y, names, blocks


def dataarray_columns(X, y, sample_dim=None) -> tuple:
    """(X, y, feature names or None, None) of a DataArray: the array with its sample dim
    first, its features named by the coordinate of the other dim, where there is one."""
    if X.ndim != 2:
        raise ValueError(f"X DataArray must be 2-D (sample, feature), got dims {X.dims}")
    if sample_axis(X.dims, getattr(y, "dims", None), sample_dim) == 1:
        X = X.transpose(X.dims[1], X.dims[0])  # a lazy view: nothing is copied here
    dim, names = X.dims[1], None
    if dim in X.coords:
        names = [str(value) for value in np.asarray(X.coords[dim].values)]
    return X.data, y, names, None


GRID_STORE = Kind("grid store (a directory)", lambda X: _is_path(X) and os.path.isdir(X))
LIBSVM_FILE = Kind("libsvm file", lambda X: _is_path(X) and os.path.isfile(X))
GRID = Kind("Grid", is_grid)
DATASET = Kind("xarray Dataset", lambda X: _is_xarray(X, "Dataset"), dataset_columns)
DATAARRAY = Kind("xarray DataArray", lambda X: _is_xarray(X, "DataArray"), dataarray_columns)
DASK_FRAME = Kind("dask DataFrame", is_dask_frame)
DASK_ARRAY = Kind("dask array", is_dask)
PANDAS_FRAME = Kind(
    "pandas DataFrame",
    lambda X: type(X).__module__.startswith("pandas") and hasattr(X, "columns"),
)
ARRAY = Kind(
    "array (numpy, scipy.sparse, pydata sparse, or anything numpy reads)",
    lambda X: not _is_path(X) and not type(X).__module__.startswith("xarray"),
)
KINDS = (
    GRID_STORE,
    LIBSVM_FILE,
    GRID,
    DATASET,
    DATAARRAY,
    DASK_FRAME,
    DASK_ARRAY,
    PANDAS_FRAME,
    ARRAY,
)
XARRAY = (DATASET, DATAARRAY)
PATHS = (GRID_STORE, LIBSVM_FILE)


def guess_kind(X) -> Kind:
    """The first of :data:`KINDS` that can open ``X``; where none can, one error that
    lists those known (for a path, a FileNotFoundError that lists the kinds of file)."""
    for kind in KINDS:
        if kind.guess_can_open(X):
            return kind
    if _is_path(X):
        known = " or ".join(kind.name for kind in PATHS)
        raise FileNotFoundError(f"no {known} at {os.fspath(X)}")
    known = "; ".join(kind.name for kind in KINDS)
    raise TypeError(f"cannot read X of type {type(X).__name__}: the inputs known are {known}")


# Dim names that say "one example per index" or "one feature per index".
SAMPLE_DIM_NAMES = frozenset(
    "sample samples n_samples example examples obs observation observations instance "
    "instances record records row rows".split()
)
FEATURE_DIM_NAMES = frozenset(
    "feature features n_features variable variables predictor predictors column columns".split()
)


def sample_axis(dims, y_dims, sample_dim) -> int:
    """The axis of a 2-D xarray X that runs over the examples.

    ``sample_dim`` if given; else the dim of a 1-D labels DataArray if X has it; else the
    dim whose name says so ("sample", "obs", ... or the other one of "feature",
    "variable", ...); the first dim only when the names say nothing.
    """
    dims = tuple(dims)
    if sample_dim is not None:
        if sample_dim not in dims:
            raise ValueError(f"sample_dim={sample_dim!r} is not a dim of X (dims {dims})")
        return dims.index(sample_dim)
    if y_dims is not None and len(y_dims) == 1 and y_dims[0] in dims:
        return dims.index(y_dims[0])
    said = [
        d in SAMPLE_DIM_NAMES or (d not in FEATURE_DIM_NAMES and other in FEATURE_DIM_NAMES)
        for d, other in ((dims[0], dims[1]), (dims[1], dims[0]))
    ]
    return 1 if said == [False, True] else 0


def dataset_sample_dim(ds, y, sample_dim):
    """The Dataset's sample dim: given, else the labels', else a 1-D variable's, else by name."""
    if sample_dim is not None:
        if sample_dim not in ds.dims:
            raise ValueError(
                f"sample_dim={sample_dim!r} is not a dim of the Dataset (dims {tuple(ds.dims)})"
            )
        return sample_dim
    y_dims = getattr(y, "dims", None)
    if y_dims is not None and len(y_dims) == 1:
        return y_dims[0]
    for var in ds.data_vars.values():
        if var.ndim == 1:
            return var.dims[0]
    first = next(iter(ds.data_vars.values()))
    if first.ndim != 2:
        raise ValueError(f"data variables must be 1-D or 2-D, got dims {first.dims}")
    return first.dims[sample_axis(first.dims, None, None)]
