"""Input readers: turn every supported X into a stream of row chunks.

Every input (numpy, scipy.sparse, pydata ``sparse``, dask array, xarray
DataArray/Dataset, libsvm file; its kind told by :mod:`dask_scd.grid.kinds`)
becomes a :class:`RowReader`, which knows the
shape, dtype and layout (dense or sparse) up front and yields the data one
row chunk at a time, so that :func:`dask_scd.grid.to_grid` never needs the
whole matrix in memory for out-of-core inputs.
"""

from __future__ import annotations

import io
import numbers
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from dask_scd.validation import check_2d, check_known_chunks, is_dask, is_pydata_sparse, to_scipy

from .kinds import DATASET, GRID, GRID_STORE, LIBSVM_FILE, PANDAS_FRAME, XARRAY, guess_kind

__all__ = ["RowReader", "malformed_line", "row_reader", "scan_libsvm"]


@dataclass
class RowReader:
    """A design matrix (and labels) readable one row chunk at a time.

    Attributes
    ----------
    shape : tuple of int
        (n_samples, n_features).
    dtype : numpy.dtype
        float32 or float64: the dtype the cells are stored with.
    is_sparse : bool
        Whether cells are stored sparse (CSC) or dense.
    in_memory : bool
        True when X and y are already in memory (numpy / scipy), so they can
        be validated and partitioned whole before anything is written.
    feature_names : list of str or None
    default_blocks : list of ndarray or None
        Blocks implied by the input (one per xarray Dataset variable).
    label_dtype : numpy.dtype
        The labels' own dtype (int, bool or float), recorded in the grid's metadata:
        the labels are stored as float64, and a classifier's ``classes_`` come back in
        this dtype.
    """

    shape: tuple[int, int]
    dtype: np.dtype
    is_sparse: bool
    in_memory: bool
    chunk_fn: object = field(repr=False)  # (start, stop) -> (X chunk, y chunk)
    feature_names: list[str] | None = None
    default_blocks: list[np.ndarray] | None = None
    stream_fn: object = field(default=None, repr=False)  # row_chunk -> iterator
    label_dtype: np.dtype = field(default_factory=lambda: np.dtype(np.float64))

    def iter_chunks(self, row_chunk: int) -> Iterator[tuple[object, np.ndarray]]:
        """Yield ``(X_chunk, y_chunk)`` for consecutive row chunks.

        ``X_chunk`` is a numpy array (dense sources) or a scipy CSR matrix
        (sparse sources) of shape (rows, n_features) with the source dtype;
        ``y_chunk`` is a float64 array (possibly non-finite: validated by the
        writer).
        """
        if self.stream_fn is not None:
            yield from self.stream_fn(row_chunk)
            return
        n = self.shape[0]
        for start in range(0, n, row_chunk):
            stop = min(start + row_chunk, n)
            yield self.chunk_fn(start, stop)


def _is_float_or_int(dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind in "fiub"


def storage_dtype(dtype) -> np.dtype:
    """float32/float64 are kept; integer and bool data are stored as float64."""
    dtype = np.dtype(dtype)
    if not _is_float_or_int(dtype):
        raise ValueError(f"X must have a real numeric dtype, got {dtype}")
    if dtype in (np.float32, np.float64):
        return dtype
    return np.dtype(np.float64)


def _as_labels(y, n: int):
    """Return y as an object supporting ``y[start:stop]`` (numpy or dask)."""
    if y is None:
        raise ValueError("y is required (only libsvm files carry their own labels)")
    if hasattr(y, "dims") and hasattr(y, "data"):  # xarray DataArray
        y = y.data
    if type(y).__module__.startswith("pandas") and hasattr(y, "dtype"):
        from dask_scd.validation import pandas_labels

        y = pandas_labels(y)
    if not is_dask(y):
        y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D, got shape {y.shape}")
    if is_dask(y):
        check_known_chunks(y, "y")
    if not _is_float_or_int(y.dtype):
        raise ValueError(f"y must have a real numeric dtype, got {y.dtype}")
    if y.shape[0] != n:
        raise ValueError(f"X has {n} rows but y has length {y.shape[0]}")
    return y


def _memory_chunks(X, y) -> tuple:
    """(X, y, dtype, is_sparse, chunk_fn) of an in-memory X."""
    if is_pydata_sparse(X):
        X = to_scipy(X)
    is_sparse = sp.issparse(X)
    if not is_sparse:
        X = np.asarray(X)
    check_2d(X)
    dtype = storage_dtype(X.dtype)
    # CSR so that row slices are cheap; csr_matrix() shares the caller's buffers when
    # already CSR, which is fine: nothing here writes to them.
    rows = sp.csr_matrix(X) if is_sparse else X
    y = _as_labels(y, X.shape[0])

    def chunk_fn(start, stop):
        Xc = rows[start:stop].astype(dtype, copy=False)
        yc = y[start:stop]
        if is_dask(yc):
            yc = yc.compute()
        return Xc, np.asarray(yc, dtype=np.float64)

    return X, y, dtype, is_sparse, chunk_fn


def _dask_chunks(X, y) -> tuple:
    """(X, y, dtype, is_sparse, chunk_fn) of a dask array X."""
    import dask

    check_2d(X)
    check_known_chunks(X)
    dtype = storage_dtype(X.dtype)
    meta = X._meta
    is_sparse = sp.issparse(meta) or is_pydata_sparse(meta)
    y = _as_labels(y, X.shape[0])

    def chunk_fn(start, stop):
        # One compute per row chunk: only the dask chunks overlapping these
        # rows are materialised, never the whole array.
        yc = y[start:stop]
        Xc, yc = dask.compute(X[start:stop], yc)
        if is_sparse:
            Xc = to_scipy(Xc).astype(dtype, copy=False)
        elif sp.issparse(Xc) or is_pydata_sparse(Xc):
            # meta claimed dense but the chunks are sparse: honour the meta.
            Xc = to_scipy(Xc).toarray().astype(dtype, copy=False)
        else:
            Xc = np.asarray(Xc).astype(dtype, copy=False)
        return Xc, np.asarray(yc, dtype=np.float64)

    return X, y, dtype, is_sparse, chunk_fn


def _array_source(X, y, feature_names=None, default_blocks=None) -> RowReader:
    in_memory = not is_dask(X)
    X, y, dtype, is_sparse, chunk_fn = (_memory_chunks if in_memory else _dask_chunks)(X, y)
    return RowReader(
        shape=tuple(int(s) for s in X.shape),
        dtype=dtype,
        is_sparse=is_sparse,
        in_memory=in_memory and not is_dask(y),
        chunk_fn=chunk_fn,
        feature_names=feature_names,
        default_blocks=default_blocks,
        label_dtype=np.dtype(y.dtype),
    )


# --------------------------------------------------------------------- libsvm


def _is_data_line(line: bytes) -> bool:
    stripped = line.split(b"#", 1)[0].strip()
    return bool(stripped)


def _numbered_batches(path, batch_lines: int) -> Iterator[tuple[list, bytes]]:
    """(the line number in the file of each line, a buffer of up to ``batch_lines`` data
    lines) of a libsvm file: blank and comment-only lines are skipped, so that every
    line of a buffer is one example."""
    buf: list[bytes] = []
    numbers: list[int] = []
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            if not _is_data_line(line):
                continue
            buf.append(line if line.endswith(b"\n") else line + b"\n")
            numbers.append(number)
            if len(buf) == batch_lines:
                yield numbers, b"".join(buf)
                buf, numbers = [], []
    if buf:
        yield numbers, b"".join(buf)


def malformed_line(path, buffer: bytes, numbers: list, zero_based=True) -> ValueError:
    """The error for a batch that does not parse, or holds a NaN or infinite value, naming
    its first bad line and number."""
    for number, line in zip(numbers, buffer.splitlines(keepends=True)):
        try:
            X, labels = _parse_libsvm(line, None, np.float64, zero_based)
            why = None if _finite(X, labels) else "a value or label is NaN or infinite"
        except ValueError as exc:
            why = exc.__cause__ or exc
        if why is not None:
            shown = line.decode("utf-8", "replace").strip()
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            return ValueError(
                f"libsvm file {path}, line {number}: {why} (the line reads {shown!r})"
            )
    return ValueError(f"cannot parse libsvm file {path}")


def _finite(X, labels) -> bool:
    return bool(np.isfinite(X.data).all() and np.isfinite(labels).all())


def _is_auto(value) -> bool:
    return isinstance(value, str) and value == "auto"


def _parse_libsvm(buffer: bytes, n_features: int | None, dtype, zero_based: bool = False):
    from sklearn.datasets import load_svmlight_file

    kwargs = {} if n_features is None else {"n_features": n_features}
    try:
        X, y = load_svmlight_file(io.BytesIO(buffer), zero_based=zero_based, dtype=dtype, **kwargs)
    except ValueError as exc:
        raise ValueError(f"cannot parse libsvm data: {exc}") from exc
    return X, y


def scan_libsvm(path, batch_lines: int = 65536, zero_based="auto") -> tuple[int, int, bool]:
    """First pass over a libsvm file: (examples, features, whether indices start at 0).

    With ``zero_based="auto"`` (scikit-learn's rule) the file is zero-based if any feature
    index is 0, else one-based (libsvm's convention); n_features is then the largest
    index (+ 1 when zero-based).
    """
    n_rows, smallest, largest = 0, None, -1
    for line_numbers, buffer in _numbered_batches(path, batch_lines):
        try:
            X, labels = _parse_libsvm(buffer, None, np.float64, zero_based=True)  # as written
        except ValueError:
            raise malformed_line(path, buffer, line_numbers) from None
        if not _finite(X, labels):  # found here, before anything is written
            raise malformed_line(path, buffer, line_numbers)
        n_rows += X.shape[0]
        if X.nnz:
            low, high = int(X.indices.min()), int(X.indices.max())
            smallest = low if smallest is None else min(smallest, low)
            largest = max(largest, high)
    if _is_auto(zero_based):
        zero_based = smallest == 0
    if not zero_based and smallest == 0:
        raise ValueError(f"libsvm file {path} has feature index 0 but zero_based=False was given")
    n_features = largest + 1 if zero_based else max(largest, 0)
    return n_rows, n_features, bool(zero_based)


def _libsvm_source(path, y, zero_based="auto", n_features=None) -> RowReader:
    if y is not None:
        raise ValueError("y must be None for a libsvm file: labels are read from the file")
    path = os.fspath(path)
    n_rows, seen, zero_based = scan_libsvm(path, zero_based=zero_based)
    if n_rows == 0 or seen == 0:
        raise ValueError(f"libsvm file {path} holds no data")
    if n_features is None:
        n_features = seen
    elif n_features < seen:
        raise ValueError(
            f"n_features={n_features} is too small: libsvm file {path} has "
            f"{seen} features (indices up to {seen - int(zero_based)})"
        )

    def stream_fn(row_chunk):
        for _, buffer in _numbered_batches(path, row_chunk):
            X, yc = _parse_libsvm(buffer, n_features, np.float64, zero_based)
            yield sp.csr_matrix(X), np.asarray(yc, dtype=np.float64)

    return RowReader(
        shape=(n_rows, n_features),
        dtype=np.dtype(np.float64),
        is_sparse=True,
        in_memory=False,
        chunk_fn=None,
        stream_fn=stream_fn,
    )


def row_reader(X, y, *, sample_dim=None, zero_based="auto", n_features=None) -> RowReader:
    """Build a :class:`RowReader` for any supported input (see ``to_grid``)."""
    if not (isinstance(zero_based, bool | np.bool_) or _is_auto(zero_based)):
        raise ValueError(f"zero_based={zero_based!r} must be True, False or 'auto'")
    kind = guess_kind(X)
    if n_features is not None:
        if kind is not LIBSVM_FILE:
            raise ValueError(
                "n_features applies to a libsvm file only (the width of an array is its own)"
            )
        if (
            not isinstance(n_features, numbers.Integral)
            or isinstance(n_features, bool)
            or n_features < 1
        ):
            raise ValueError(f"n_features={n_features!r} must be an integer >= 1")
        n_features = int(n_features)
    if sample_dim is not None and kind not in XARRAY:
        raise ValueError(f"sample_dim={sample_dim!r} applies to xarray input only")
    if kind is LIBSVM_FILE:
        return _libsvm_source(Path(X), y, zero_based, n_features)
    if kind in (GRID_STORE, GRID):
        raise ValueError(f"X is a {kind.name}: to_grid reads an array, a file or an xarray object")
    if isinstance(y, str) and kind is not DATASET:
        raise ValueError("y may be a variable name only when X is an xarray Dataset")
    if kind in XARRAY:
        X, y, names, blocks = kind.columns(X, y, sample_dim)
        return _array_source(X, y, feature_names=names, default_blocks=blocks)
    if kind is PANDAS_FRAME:
        from dask_scd.validation import numeric_frame

        values = np.asarray(numeric_frame(X))
        return _array_source(values, y, feature_names=[str(c) for c in X.columns])
    return _array_source(X, y)
