"""Writing a grid store: ``to_grid`` reads any input one row chunk at a time, cuts it
into cells, and commits the store atomically (a temporary sibling renamed into place)."""

from __future__ import annotations

import json
import os
import shutil
import uuid

import numpy as np
import scipy.sparse as sp
import zarr

from .codec import _compressors, _extract_cell, checksum, pack_csc
from .handle import Grid, open_grid
from .layout import FORMAT, FORMAT_VERSION, _row_bounds
from .partition import (
    blocks_from_names,
    cell_stats,
    contiguous_blocks,
    detect_pure_blocks,
    validate_blocks,
)
from .readers import RowReader, row_reader

__all__ = ["to_grid"]

#: Rows used to detect pure blocks for streamed inputs (dask arrays, libsvm
#: files).  Purity is still measured on *all* rows while writing.
DETECT_ROWS = 100_000


def _check_row_chunk(row_chunk) -> int:
    if isinstance(row_chunk, bool) or not isinstance(row_chunk, int | np.integer):
        raise ValueError(f"row_chunk must be a positive int, got {row_chunk!r}")
    if row_chunk < 1 or row_chunk >= 2**31:
        raise ValueError(f"row_chunk must be a positive int below 2**31, got {row_chunk}")
    return int(row_chunk)


def _check_finite(Xc, yc, r: int, start: int, stop: int) -> None:
    """Row chunk r's X and labels hold no NaN or infinity (the error names which)."""
    for name, values in (("X", Xc), ("y", yc)):
        data = values.data if sp.issparse(values) else np.asarray(values)
        if not np.isfinite(data).all():
            raise ValueError(
                f"{name} contains NaN or infinite values in row chunk {r} (rows {start}:{stop})"
            )


def _detection_sample(source: RowReader, row_chunk: int):
    """All rows for in-memory inputs, else the first DETECT_ROWS rows."""
    n = source.shape[0]
    if source.in_memory and source.chunk_fn is not None:
        return source.chunk_fn(0, n)[0]
    parts, rows = [], 0
    for Xc, _ in source.iter_chunks(row_chunk):
        parts.append(sp.csr_matrix(Xc) if source.is_sparse else Xc)
        rows += Xc.shape[0]
        if rows >= DETECT_ROWS:
            break
    sample = sp.vstack(parts, format="csr") if source.is_sparse else np.vstack(parts)
    return sample[:DETECT_ROWS]


def _unseen_apart(blocks: list, sample) -> list[np.ndarray]:
    """The columns without a value in a streamed input's detection rows, taken out of
    the blocks the colouring gave them (its first: they conflict with nothing there) and
    put last, in a block of their own. In the first block, the most frequent field, the
    first of them to occur in a later row made that block impure for the whole grid."""
    if sp.issparse(sample):
        seen = np.asarray(sample.getnnz(axis=0)) > 0
    else:
        seen = np.count_nonzero(np.asarray(sample), axis=0) > 0
    if seen.all():
        return blocks
    kept = [b[seen[b]] for b in blocks]
    return [b for b in kept if len(b)] + [np.flatnonzero(~seen).astype(np.int64)]


def _resolve_blocks(blocks, source: RowReader, names, row_chunk: int) -> list[np.ndarray]:
    p = source.shape[1]
    if blocks is None and source.default_blocks is not None:
        return [np.asarray(b, dtype=np.int64) for b in source.default_blocks]
    if blocks is None or (isinstance(blocks, str) and blocks == "detect"):
        sample = _detection_sample(source, row_chunk)
        found = detect_pure_blocks(sample)
        if sample.shape[0] < source.shape[0]:
            found = _unseen_apart(found, sample)
        return found
    if isinstance(blocks, str):
        if blocks != "names":
            raise ValueError(
                f"unknown blocks={blocks!r}; use None, 'detect', 'names', an int or a list"
            )
        if names is None:
            raise ValueError("blocks='names' needs feature_names")
        return blocks_from_names(names)
    if isinstance(blocks, int | np.integer) and not isinstance(blocks, bool):
        return contiguous_blocks(p, int(blocks))
    return validate_blocks(list(blocks), p)


def _resolve_names(feature_names, source: RowReader):
    if feature_names is None:
        return source.feature_names
    names = [str(v) for v in feature_names]
    if len(names) != source.shape[1]:
        raise ValueError(
            f"feature_names has {len(names)} entries but X has {source.shape[1]} features"
        )
    return names


class _GridWriter:
    """Writes the arrays of one grid into a (temporary) directory."""

    def __init__(
        self, root: str, source: RowReader, blocks, row_chunk: int, weighted: bool = False
    ):
        self.group = zarr.open_group(root, mode="w-")
        self.group.attrs.update(
            {"format": FORMAT, "format_version": FORMAT_VERSION, "complete": False}
        )
        self.source = source
        self.blocks = blocks
        self.row_chunk = row_chunk
        self.bounds = _row_bounds(source.shape[0], row_chunk)
        self.cell_checksum = np.zeros((len(self.bounds) - 1, len(blocks)), dtype=np.int64)
        self.label_checksum = np.zeros(len(self.bounds) - 1, dtype=np.int64)
        n = source.shape[0]
        self.y = self._create("y", (n,), (row_chunk,), np.float64)
        # Sample weights, beside the labels and checked like them (optional).
        self.weight = self._create("weight", (n,), (row_chunk,), np.float64) if weighted else None
        self.weight_checksum = np.zeros(len(self.bounds) - 1, dtype=np.int64)
        self.dense = {}
        if not source.is_sparse:
            for b, block in enumerate(blocks):
                self.dense[b] = self._create(
                    f"X/block_{b}", (n, len(block)), (row_chunk, len(block)), source.dtype
                )

    def _create(self, name, shape, chunks, dtype):
        dtype = np.dtype(dtype)
        # A NaN / -1 fill value makes a missing chunk decode to values that
        # can never be valid (finiteness is enforced on write).
        fill = {"f": np.nan, "i": -1}.get(dtype.kind, 0)
        return self.group.create_array(
            name,
            shape=shape,
            chunks=tuple(max(int(c), 1) for c in chunks),
            dtype=dtype,
            compressors=_compressors(),
            fill_value=fill,
            config={"write_empty_chunks": True},
        )

    def write_cell(self, r: int, b: int, cell) -> None:
        """Store cell (r, b): an ndarray or a csc_matrix with block-ordered columns,
        and the CRC-32 of the bytes a reader gets back (see :func:`checksum`)."""
        if not self.source.is_sparse:
            values = np.ascontiguousarray(cell, dtype=self.source.dtype)
            self.dense[b][self.bounds[r] : self.bounds[r + 1]] = values
        else:
            values = pack_csc(cell, self.source.dtype)
            arr = self._create(f"X/block_{b}/cell_{r}", values.shape, values.shape, np.uint8)
            arr[:] = values
        self.cell_checksum[r, b] = checksum(values)

    def write_rows(self, r: int, array, sums: np.ndarray, chunk: np.ndarray) -> None:
        """Row chunk r of a per-row float64 ``array`` (labels or weights), its CRC-32 in
        ``sums``."""
        values = np.ascontiguousarray(chunk, dtype=np.float64)
        array[self.bounds[r] : self.bounds[r + 1]] = values
        sums[r] = checksum(values)

    def write_attrs(self, attrs: dict, cell_nnz: np.ndarray) -> None:
        tables = [
            ("cell_nnz", cell_nnz),
            ("cell_checksum", self.cell_checksum),
            ("label_checksum", self.label_checksum),
        ]
        if self.weight is not None:
            tables.append(("weight_checksum", self.weight_checksum))
        for name, values in tables:
            arr = self._create(name, values.shape, values.shape, np.int64)
            arr[:] = values
        self.group.attrs.update(attrs)
        # Written last: open_grid refuses any store without it.
        self.group.attrs["complete"] = True


def _write_grid(root: str, source: RowReader, blocks, row_chunk: int, names, weights=None) -> None:
    n, p = source.shape
    writer = _GridWriter(root, source, blocks, row_chunk, weights is not None)
    bounds = writer.bounds
    n_rc = len(bounds) - 1
    cell_nnz = np.zeros((n_rc, len(blocks)), dtype=np.int64)
    max_nnz = np.zeros(len(blocks), dtype=np.int64)
    r = -1
    for r, (Xc, yc) in enumerate(source.iter_chunks(row_chunk)):
        if r >= n_rc:
            raise ValueError(f"input changed while writing: more than {n_rc} row chunks")
        start, stop = int(bounds[r]), int(bounds[r + 1])
        if Xc.shape != (stop - start, p) or yc.shape != (stop - start,):
            raise ValueError(f"input changed while writing: row chunk {r} has the wrong shape")
        _check_finite(Xc, yc, r, start, stop)
        if source.is_sparse:
            Xc = sp.csc_matrix(Xc)  # column slicing per block is cheap on CSC
        for b, cols in enumerate(blocks):
            cell = _extract_cell(Xc, cols, source.dtype, source.is_sparse)
            cell_nnz[r, b], row_max = cell_stats(cell)
            max_nnz[b] = max(max_nnz[b], row_max)
            writer.write_cell(r, b, cell)
        writer.write_rows(r, writer.y, writer.label_checksum, yc)
        if weights is not None:
            writer.write_rows(r, writer.weight, writer.weight_checksum, weights[start:stop])
    if r != n_rc - 1:
        raise ValueError(f"input changed while writing: got {r + 1} of {n_rc} row chunks")
    attrs = {
        "shape": [n, p],
        "dtype": source.dtype.name,
        "layout": "sparse" if source.is_sparse else "dense",
        "sparse_cell_encoding": "packed-csc-1" if source.is_sparse else None,
        "row_chunk": row_chunk,
        "row_bounds": [int(v) for v in bounds],
        "blocks": [[int(j) for j in block] for block in blocks],
        "purity": [bool(m <= 1) for m in max_nnz],
        "max_nnz_per_row": [int(m) for m in max_nnz],
        "block_nnz": [int(v) for v in cell_nnz.sum(axis=0)],
        "nnz": int(cell_nnz.sum()),
        "feature_names": names,
        "grid_id": uuid.uuid4().hex,
        "has_weights": weights is not None,
        # the labels are stored as float64; classifiers give back classes_ in this dtype
        "label_dtype": source.label_dtype.name,
    }
    writer.write_attrs(attrs, cell_nnz)


def _validate_in_memory(source: RowReader, row_chunk: int) -> None:
    """Check finiteness before anything is written (in-memory inputs only)."""
    bounds = _row_bounds(source.shape[0], row_chunk)
    for r, (Xc, yc) in enumerate(source.iter_chunks(row_chunk)):
        _check_finite(Xc, yc, r, int(bounds[r]), int(bounds[r + 1]))


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def _is_replaceable(path: str) -> bool:
    """Whether overwrite=True may delete ``path``: a grid store (even an incomplete one)
    or an empty directory, never a file or anything else."""
    if not os.path.isdir(path):
        return False
    entries = os.listdir(path)
    if not entries:
        return True
    try:
        with open(os.path.join(path, "zarr.json"), encoding="utf-8") as f:
            header = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(header, dict) and header.get("attributes", {}).get("format") == FORMAT


def _check_target(path: str, overwrite: bool) -> None:
    if not os.path.lexists(path):
        return
    if not overwrite:
        raise FileExistsError(f"{path} exists (pass overwrite=True to replace it)")
    if not _is_replaceable(path):
        kind = "directory" if os.path.isdir(path) else "file"
        raise FileExistsError(
            f"{path} exists and is not a dask_scd grid store but a {kind}: overwrite=True "
            "replaces only a grid written by to_grid (or an empty directory); remove it "
            "yourself or choose another path"
        )


def _make_parent(path: str) -> None:
    parent = os.path.dirname(path)
    existing = parent
    while existing and not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if existing and not os.path.isdir(existing):
        raise NotADirectoryError(
            f"cannot write a grid at {path}: {existing} is a file, not a directory"
        )
    os.makedirs(parent, exist_ok=True)


def _commit(tmp: str, path: str, overwrite: bool) -> None:
    """Move the finished temporary store into place."""
    if os.path.lexists(path):
        _check_target(path, overwrite)  # again: it may have changed while writing
        # A directory cannot be os.replace'd onto a non-empty one: move the old
        # store aside first, then delete it once the new one is in place.
        old = f"{path}.old-{uuid.uuid4().hex[:12]}"
        os.replace(path, old)
        os.replace(tmp, path)
        _remove(old)
    else:
        os.replace(tmp, path)


def to_grid(
    X,
    y,
    path,
    *,
    row_chunk: int,
    blocks=None,
    feature_names=None,
    overwrite: bool = False,
    sample_dim=None,
    zero_based="auto",
    n_features=None,
    sample_weight=None,
) -> Grid:
    """Write a design matrix and labels as a zarr v3 grid store.

    Parameters
    ----------
    X : array-like, shape (n_samples, n_features), or path
        One of: numpy array; scipy.sparse matrix/array (any format); pydata
        ``sparse`` array; dask array with numpy, scipy.sparse or pydata
        ``sparse`` chunks (processed one row chunk at a time, never computed
        whole); xarray DataArray with dims (sample, feature) (the feature
        coordinate gives ``feature_names``); xarray Dataset (each data
        variable, 1-D or 2-D with the sample dim first, is one block; 2-D
        variables give names ``"var=value"``); or a path (str / Path) to a
        libsvm / svmlight text file (streamed in row chunks after a first
        pass counting rows and features; see ``zero_based``).
    y : array-like, shape (n_samples,), or None
        Labels (numpy, dask or xarray).  Must be None for a libsvm file.
        For a Dataset, may be the name of a data variable (excluded from X).
    path : str or Path
        Directory of the store to create.
    row_chunk : int
        Examples per row chunk (the last one may be smaller); capped to the
        number of examples.
    blocks : None, "detect", "names", int or list of array-like of int, optional
        Column partition.  None: the Dataset's variables for an xarray
        Dataset, else as "detect".  "detect": pure blocks found by greedy
        colouring (:func:`detect_pure_blocks`) on all rows of in-memory
        inputs or on the first ``DETECT_ROWS`` (100 000) rows of streamed
        ones (dask arrays, libsvm files), whose columns without a value in
        those rows then form a last block of their own.  "names": group ``"var=value"`` feature names by ``var``
        (:func:`blocks_from_names`).  int k: consecutive blocks of k
        features (sensible for dense data).  A list must partition
        ``range(n_features)``.
    feature_names : sequence of str, optional
        Names of the features in original order (overrides xarray names).
    overwrite : bool, default False
        Replace an existing grid store (or empty directory) at ``path``.
        Anything else at ``path`` is never deleted: FileExistsError.
    sample_dim : str, optional
        For xarray input, the dim that runs over the examples. By default
        the dim of a 1-D labels DataArray, else the dim named like one
        ("sample", "obs", "example", ... or the other one of "feature",
        "variable", ...), else the first dim.
    zero_based : bool or "auto", default "auto"
        For a libsvm file: whether feature indices start at 0. "auto"
        (scikit-learn's rule): zero-based if any index is 0, else one-based.
    n_features : int, optional
        For a libsvm file: the number of features of the grid, when the file's
        last features never occur (a test split written with its training
        set's width). By default the largest index in the file.
    sample_weight : float or array-like of shape (n_samples,), optional
        Non-negative weights of the examples (numpy or dask; a number: every row's), stored beside the
        labels as the array ``weight`` with a checksum per row chunk;
        :func:`dask_scd.fit` of the grid then minimizes the weighted objective.

    Returns
    -------
    Grid
        The written store, opened with :func:`open_grid`.

    Raises
    ------
    FileExistsError
        If ``path`` exists and ``overwrite`` is False, or it is not a grid
        store (nor an empty directory).
    NotADirectoryError
        If a parent of ``path`` is a file.
    ValueError
        On invalid input: wrong dimensions or dtype, mismatched lengths,
        NaN/inf values (naming the array and row chunk), bad blocks, unknown
        dask chunk sizes.  Nothing is left at ``path`` in any error case.

    Notes
    -----
    The store is written to a temporary sibling ``path + ".tmp-<random>"``
    whose root attribute ``complete`` is set to true last, then renamed to
    ``path``; the temporary directory is removed on failure.  Purity and
    maximum non-zeros per row of every block are measured on all rows while
    writing.  The caller's arrays are never modified.
    """
    row_chunk = _check_row_chunk(row_chunk)
    path = os.path.abspath(os.fspath(path))
    _check_target(path, overwrite)
    source = row_reader(X, y, sample_dim=sample_dim, zero_based=zero_based, n_features=n_features)
    n, p = source.shape
    if n == 0 or p == 0:
        raise ValueError(f"X must have at least one row and one column, got shape {(n, p)}")
    # zarr allocates whole chunks: a row chunk beyond n would cost row_chunk rows of memory.
    row_chunk = min(row_chunk, n)
    names = _resolve_names(feature_names, source)
    block_list = _resolve_blocks(blocks, source, names, row_chunk)
    if source.in_memory:
        _validate_in_memory(source, row_chunk)
    weights = _stored_weights(sample_weight, n)
    _make_parent(path)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        _write_grid(tmp, source, block_list, row_chunk, names, weights)
        _commit(tmp, path, overwrite)
    except BaseException:
        _remove(tmp)
        raise
    return open_grid(path)


def _stored_weights(sample_weight, n: int):
    """The weights as stored: float64 as given (not rescaled), after the checks of
    :func:`dask_scd.validation.check_sample_weight`; None without weights."""
    if sample_weight is None:
        return None
    from dask_scd.validation import check_sample_weight, per_row_weights

    if type(sample_weight).__module__.startswith(("dask.", "xarray")):
        sample_weight = np.asarray(
            sample_weight.compute() if hasattr(sample_weight, "compute") else sample_weight
        )
    sample_weight = per_row_weights(sample_weight, n)  # a number: every row's weight
    check_sample_weight(sample_weight, n)  # raises on bad weights (the result is a copy)
    return np.asarray(sample_weight, dtype=np.float64).reshape(n)
