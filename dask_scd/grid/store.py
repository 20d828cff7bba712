"""The zarr v3 "grid" store: a design matrix cut into cells.

Rows are cut into row chunks of ``row_chunk`` examples (the last one may be
smaller); columns are cut into blocks (a partition of the features).  One
cell = (row chunk r, block b) = one dask chunk of :attr:`Grid.X`.

Column order
------------
:attr:`Grid.X` has its columns **reordered** so that each block is
contiguous: ``Grid.X[:, k]`` is original feature ``Grid.feature_order[k]``,
where ``feature_order = np.concatenate(blocks)`` and ``blocks[b]`` holds the
original indices of block ``b``.  ``Grid.block_slices[b]`` is the slice of
``Grid.X``'s columns holding block ``b``.

On-disk layout (zarr v3 group at ``path``)::

    zarr.json                     root attributes (metadata, see docs/grid.md)
    y                             float64 (n_samples,), chunks (row_chunk,)
    cell_nnz                      int64 (n_row_chunks, n_blocks), one chunk
    cell_checksum                 int64 (n_row_chunks, n_blocks): CRC-32 of each cell
    label_checksum                int64 (n_row_chunks,): CRC-32 of each row chunk's labels
    X/block_{b}                   dense:  (n_samples, size_b), chunks (row_chunk, size_b)
    X/block_{b}/cell_{r}          sparse: uint8 (n_bytes,), one chunk: the packed
                                  CSC triplet of cell (r, b) (see pack_csc)
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import uuid
import zlib
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import zarr
from zarr.codecs import ZstdCodec

from .partition import (
    blocks_from_names,
    contiguous_blocks,
    detect_pure_blocks,
    validate_blocks,
)
from .readers import Source, make_source

__all__ = ["Grid", "GridCorruptionError", "to_grid", "open_grid", "FORMAT", "FORMAT_VERSION"]

FORMAT = "dask_scd.grid"
FORMAT_VERSION = 2
#: Versions open_grid reads: version 1 stores have no checksums (nothing to verify).
READABLE_VERSIONS = (1, 2)

#: Rows used to detect pure blocks for streamed inputs (dask arrays, libsvm
#: files).  Purity is still measured on *all* rows while writing.
DETECT_ROWS = 100_000

_ZSTD_LEVEL = 3


class GridCorruptionError(ValueError):
    """A cell of a grid store is missing, unreadable or inconsistent."""


def _compressors():
    # checksum=True: a garbled chunk fails loudly instead of decoding to junk.
    return ZstdCodec(level=_ZSTD_LEVEL, checksum=True)


# ======================================================================= Grid


@dataclass(repr=False, eq=False)
class Grid:
    """A grid store opened for reading (see :func:`open_grid`).

    Attributes
    ----------
    path : str
        Absolute path of the store.
    X : dask.array.Array, shape (n_samples, n_features)
        Lazily read design matrix with **reordered columns**: column ``k`` is
        original feature ``feature_order[k]``.  Chunks are the cells:
        ``(row_chunks, block_sizes)``.  Chunks are numpy arrays (dense
        grids) or ``scipy.sparse.csc_matrix`` (sparse grids).
    y : dask.array.Array, shape (n_samples,)
        float64 labels, chunks ``(row_chunks,)``.
    blocks : list of ndarray of int64
        Original feature indices of each block, in ``X`` column order.
    block_slices : list of slice
        ``X[:, block_slices[b]]`` is block ``b``.
    feature_order : ndarray of int64, shape (n_features,)
        ``np.concatenate(blocks)``; ``coef_original[feature_order] = coef_grid``.
    purity : list of bool
        Whether each block has at most one non-zero per example.
    max_nnz_per_row : list of int
        Maximum number of non-zeros of one example within each block.
    shape : tuple of int
        (n_samples, n_features).
    row_chunk : int
        Nominal number of examples per row chunk.
    row_chunks : tuple of int
        Sizes of the row chunks.
    row_bounds : ndarray of int64, shape (n_row_chunks + 1,)
        Row chunk ``r`` holds examples ``row_bounds[r]:row_bounds[r + 1]``.
    is_sparse : bool
        Whether cells are stored (and served) as CSC sparse matrices.
    dtype : numpy.dtype
        float32 or float64.
    feature_names : list of str or None
        Names in *original* feature order.
    nnz : int
        Number of non-zero entries of X.
    block_nnz : list of int
        Non-zeros per block.
    cell_nnz : ndarray of int64, shape (n_row_chunks, n_blocks)
        Non-zeros per cell.
    grid_id : str
        Random id of this write (changes on every overwrite; a copy of the store keeps
        it).
    store_version : str
        The store's identity on disk (device and inode of its directory) and its
        ``grid_id``: what the workers' cell cache is keyed by, with the path, so that a
        copy or a replacement of a store is never served another store's cells.
    """

    path: str
    X: object
    y: object
    blocks: list
    block_slices: list
    feature_order: np.ndarray
    purity: list
    max_nnz_per_row: list
    shape: tuple
    row_chunk: int
    row_chunks: tuple
    row_bounds: np.ndarray
    is_sparse: bool
    dtype: np.dtype
    feature_names: list | None
    nnz: int
    block_nnz: list
    cell_nnz: np.ndarray
    grid_id: str
    attrs: dict = field(default_factory=dict)
    store_version: str = ""

    @property
    def n_row_chunks(self) -> int:
        """Number of row chunks."""
        return len(self.row_chunks)

    @property
    def n_blocks(self) -> int:
        """Number of column blocks."""
        return len(self.blocks)

    def read_cell(self, r: int, b: int):
        """Read cell (row chunk ``r``, block ``b``) into memory.

        Returns
        -------
        ndarray or scipy.sparse.csc_matrix, shape (row_chunks[r], len(blocks[b]))
            Columns in block order (original features ``blocks[b]``).

        Raises
        ------
        GridCorruptionError
            If the cell's bytes are missing or corrupt.
        """
        return read_cell(self.path, self.grid_id, int(r), int(b))

    def to_original_order(self, values) -> np.ndarray:
        """Map per-column values from grid order back to original feature order.

        Parameters
        ----------
        values : array-like, shape (n_features,) or (n_features, k)
            Indexed like the columns of ``X`` (e.g. coefficients fitted on
            the grid).

        Returns
        -------
        ndarray, same shape
            ``out[feature_order[k]] = values[k]``.
        """
        values = np.asarray(values)
        if values.shape[0] != self.shape[1]:
            raise ValueError(f"expected {self.shape[1]} values, got {values.shape[0]}")
        out = np.empty_like(values)
        out[self.feature_order] = values
        return out

    def read_labels(self, r: int) -> np.ndarray:
        """Read the float64 labels of row chunk ``r``, shape (row_chunks[r],)."""
        return read_labels(self.path, self.grid_id, int(r))

    def __repr__(self) -> str:
        kind = "sparse" if self.is_sparse else "dense"
        return (
            f"<Grid {self.path!r} shape={self.shape} {kind} {self.dtype} "
            f"cells={self.n_row_chunks}x{self.n_blocks} "
            f"pure_blocks={sum(self.purity)}/{self.n_blocks}>"
        )


# ==================================================================== writing


def _check_row_chunk(row_chunk) -> int:
    if isinstance(row_chunk, bool) or not isinstance(row_chunk, int | np.integer):
        raise ValueError(f"row_chunk must be a positive int, got {row_chunk!r}")
    if row_chunk < 1 or row_chunk >= 2**31:
        raise ValueError(f"row_chunk must be a positive int below 2**31, got {row_chunk}")
    return int(row_chunk)


def _row_bounds(n: int, row_chunk: int) -> np.ndarray:
    return np.append(np.arange(0, n, row_chunk, dtype=np.int64), np.int64(n))


def _check_finite(values, name: str, r: int, start: int, stop: int) -> None:
    data = values.data if sp.issparse(values) else np.asarray(values)
    if not np.isfinite(data).all():
        raise ValueError(
            f"{name} contains NaN or infinite values in row chunk {r} "
            f"(rows {start}:{stop})"
        )


def _detection_sample(source: Source, row_chunk: int):
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


def _resolve_blocks(blocks, source: Source, names, row_chunk: int) -> list[np.ndarray]:
    p = source.shape[1]
    if blocks is None and source.default_blocks is not None:
        return [np.asarray(b, dtype=np.int64) for b in source.default_blocks]
    if blocks is None or (isinstance(blocks, str) and blocks == "detect"):
        return detect_pure_blocks(_detection_sample(source, row_chunk))
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


def _resolve_names(feature_names, source: Source):
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

    def __init__(self, root: str, source: Source, blocks, row_chunk: int):
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

    def write_labels(self, r: int, y_chunk: np.ndarray) -> None:
        values = np.ascontiguousarray(y_chunk, dtype=np.float64)
        self.y[self.bounds[r] : self.bounds[r + 1]] = values
        self.label_checksum[r] = checksum(values)

    def write_attrs(self, attrs: dict, cell_nnz: np.ndarray) -> None:
        for name, values in (("cell_nnz", cell_nnz), ("cell_checksum", self.cell_checksum),
                             ("label_checksum", self.label_checksum)):
            arr = self._create(name, values.shape, values.shape, np.int64)
            arr[:] = values
        self.group.attrs.update(attrs)
        # Written last: open_grid refuses any store without it.
        self.group.attrs["complete"] = True


# A sparse cell is one uint8 zarr array (one chunk): MAGIC, then the bytes of
# data (grid dtype, nnz), indptr (int32, or int64 from 2**31 non-zeros;
# size_b + 1) and indices (int32 row within the row chunk, nnz).  One array
# per cell keeps the number of files low and a cell read to one chunk.
_MAGIC = b"CSCcell1"


def checksum(values: np.ndarray) -> int:
    """CRC-32 of a C-contiguous array's bytes.

    zarr's own checksum (in the zstd frame) proves a chunk file is intact, not that it is
    the file of this cell: two cells or label chunks swapped on disk decode fine. The
    CRC of each cell's contents, kept apart from the cells, tells them apart.
    """
    return zlib.crc32(np.ascontiguousarray(values))


def _indptr_dtype(nnz: int) -> np.dtype:
    return np.dtype(np.int32 if nnz < 2**31 else np.int64)


def packed_size(nnz: int, size: int, dtype) -> int:
    """Bytes of a packed sparse cell with ``nnz`` non-zeros and ``size`` columns."""
    dtype = np.dtype(dtype)
    return (
        len(_MAGIC)
        + nnz * dtype.itemsize
        + (size + 1) * _indptr_dtype(nnz).itemsize
        + nnz * 4
    )


def pack_csc(cell: sp.csc_matrix, dtype) -> np.ndarray:
    """Serialise a CSC cell into one uint8 array (see ``_MAGIC``)."""
    parts = (
        np.frombuffer(_MAGIC, dtype=np.uint8),
        cell.data.astype(dtype, copy=False),
        cell.indptr.astype(_indptr_dtype(cell.nnz), copy=False),
        cell.indices.astype(np.int32, copy=False),
    )
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8) for p in parts])


def unpack_csc(buf: np.ndarray, nnz: int, size: int, dtype, where: str = "cell"):
    """Inverse of :func:`pack_csc`: (data, indices, indptr) as fresh arrays."""
    dtype = np.dtype(dtype)
    if buf.size != packed_size(nnz, size, dtype) or buf[: len(_MAGIC)].tobytes() != _MAGIC:
        raise GridCorruptionError(f"{where}: packed sparse cell has a bad header or length")
    raw = buf.tobytes()
    offset = len(_MAGIC)
    out = []
    for part_dtype, count in ((dtype, nnz), (_indptr_dtype(nnz), size + 1), (np.int32, nnz)):
        out.append(np.frombuffer(raw, dtype=part_dtype, count=count, offset=offset).copy())
        offset += count * np.dtype(part_dtype).itemsize
    data, indptr, indices = out
    return data, indices, indptr


def _extract_cell(Xc, cols: np.ndarray, dtype, is_sparse: bool):
    """Cell columns ``cols`` of a row chunk, as a fresh array we may modify."""
    if is_sparse:
        cell = sp.csc_matrix(Xc[:, cols], dtype=dtype, copy=True)
        cell.eliminate_zeros()  # explicit zeros would distort purity and nnz
        cell.sort_indices()
        return cell
    return np.take(Xc, cols, axis=1).astype(dtype, copy=False)


def _cell_stats(cell, is_sparse: bool) -> tuple[int, int]:
    """(nnz, max non-zeros in one row) of a cell."""
    if cell.shape[0] == 0 or cell.shape[1] == 0:
        return 0, 0
    if is_sparse:
        per_row = np.bincount(cell.indices, minlength=cell.shape[0])
    else:
        per_row = np.count_nonzero(cell, axis=1)
    return int(per_row.sum()), int(per_row.max())


def _write_grid(root: str, source: Source, blocks, row_chunk: int, names) -> None:
    n, p = source.shape
    writer = _GridWriter(root, source, blocks, row_chunk)
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
        _check_finite(Xc, "X", r, start, stop)
        _check_finite(yc, "y", r, start, stop)
        if source.is_sparse:
            Xc = sp.csc_matrix(Xc)  # column slicing per block is cheap on CSC
        for b, cols in enumerate(blocks):
            cell = _extract_cell(Xc, cols, source.dtype, source.is_sparse)
            cell_nnz[r, b], row_max = _cell_stats(cell, source.is_sparse)
            max_nnz[b] = max(max_nnz[b], row_max)
            writer.write_cell(r, b, cell)
        writer.write_labels(r, yc)
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
    }
    writer.write_attrs(attrs, cell_nnz)


def _validate_in_memory(source: Source, row_chunk: int) -> None:
    """Check finiteness before anything is written (in-memory inputs only)."""
    bounds = _row_bounds(source.shape[0], row_chunk)
    for r, (Xc, yc) in enumerate(source.iter_chunks(row_chunk)):
        _check_finite(Xc, "X", r, int(bounds[r]), int(bounds[r + 1]))
        _check_finite(yc, "y", r, int(bounds[r]), int(bounds[r + 1]))


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
        ones (dask arrays, libsvm files).  "names": group ``"var=value"`` feature names by ``var``
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
    source = make_source(X, y, sample_dim=sample_dim, zero_based=zero_based)
    n, p = source.shape
    if n == 0 or p == 0:
        raise ValueError(f"X must have at least one row and one column, got shape {(n, p)}")
    # zarr allocates whole chunks: a row chunk beyond n would cost row_chunk rows of memory.
    row_chunk = min(row_chunk, n)
    names = _resolve_names(feature_names, source)
    block_list = _resolve_blocks(blocks, source, names, row_chunk)
    if source.in_memory:
        _validate_in_memory(source, row_chunk)
    _make_parent(path)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        _write_grid(tmp, source, block_list, row_chunk, names)
        _commit(tmp, path, overwrite)
    except BaseException:
        _remove(tmp)
        raise
    return open_grid(path)


# ==================================================================== reading


class _Reader:
    """Per-process handle on one store version, shared by all cell reads."""

    def __init__(self, path: str, grid_id: str):
        self.path = path
        self.group = zarr.open_group(path, mode="r")
        attrs = dict(self.group.attrs)
        if attrs.get("grid_id") != grid_id:
            raise GridCorruptionError(
                f"grid store {path} changed since it was opened (overwritten?)"
            )
        _check_attrs(path, attrs)
        self.attrs = attrs
        self.bounds = np.asarray(attrs["row_bounds"], dtype=np.int64)
        self.sizes = [len(b) for b in attrs["blocks"]]
        self.is_sparse = attrs["layout"] == "sparse"
        self.dtype = np.dtype(attrs["dtype"])
        self._arrays: dict[str, object] = {}
        self._cell_nnz = None
        self._checksums = None

    def _array(self, name: str, cache: bool = True):
        arr = self._arrays.get(name)
        if arr is None:
            arr = self.group[name]
            if cache:
                self._arrays[name] = arr
        return arr

    def _require_chunk_file(self, name: str, key: str, where: str) -> None:
        # Zarr silently serves the fill value for a missing chunk: check.
        chunk = os.path.join(self.path, *name.split("/"), *key.split("/"))
        if not os.path.isfile(chunk):
            raise GridCorruptionError(f"{where}: chunk file {chunk} is missing")

    def _table(self, name: str, shape: tuple) -> np.ndarray:
        """A small int64 table of the store (cell_nnz, checksums), its shape checked."""
        values = np.asarray(self._array(name)[:])
        if values.shape != shape or values.dtype != np.int64:
            raise GridCorruptionError(
                f"grid store {self.path}: {name} has shape {values.shape} and dtype "
                f"{values.dtype}, expected {shape} and int64"
            )
        return values

    def cell_nnz(self) -> np.ndarray:
        if self._cell_nnz is None:
            shape = (len(self.bounds) - 1, len(self.sizes))
            self._cell_nnz = self._table("cell_nnz", shape)
            if (self._cell_nnz < 0).any():
                raise GridCorruptionError(f"grid store {self.path}: cell_nnz holds negatives")
        return self._cell_nnz

    def checksums(self):
        """(cell_checksum, label_checksum) arrays, or None for a version-1 store."""
        if self._checksums is None:
            if self.attrs.get("format_version", 1) < 2:
                self._checksums = ()
            else:
                n_rc = len(self.bounds) - 1
                self._checksums = (self._table("cell_checksum", (n_rc, len(self.sizes))),
                                   self._table("label_checksum", (n_rc,)))
        return self._checksums or None

    def _verify(self, values, expected_at, where: str) -> None:
        sums = self.checksums()
        if sums is not None and checksum(values) != int(sums[expected_at[0]][expected_at[1:]]):
            raise GridCorruptionError(
                f"{where}: checksum mismatch (the bytes on disk are not the ones written "
                "there: a chunk file moved, swapped or modified)"
            )

    def where(self, r: int, b: int) -> str:
        return f"cell (row chunk {r}, block {b}) of grid {self.path}"

    def read_cell(self, r: int, b: int):
        n_rc = len(self.bounds) - 1
        if not (0 <= r < n_rc and 0 <= b < len(self.sizes)):
            raise IndexError(f"no cell ({r}, {b}) in a {n_rc} x {len(self.sizes)} grid")
        where = self.where(r, b)
        try:
            if self.is_sparse:
                return self._read_sparse(r, b, where)
            return self._read_dense(r, b, where)
        except GridCorruptionError:
            raise
        except Exception as exc:  # decompression, missing node, bad metadata...
            raise GridCorruptionError(f"cannot read {where}: {exc}") from exc

    def _read_dense(self, r: int, b: int, where: str) -> np.ndarray:
        name = f"X/block_{b}"
        arr = self._array(name)
        n, size = int(self.bounds[-1]), self.sizes[b]
        row_chunk = int(self.attrs["row_chunk"])
        if arr.shape != (n, size) or arr.chunks != (row_chunk, size):
            raise GridCorruptionError(
                f"{where}: array {name} has shape {arr.shape} / chunks {arr.chunks}, "
                f"expected {(n, size)} / {(row_chunk, size)}"
            )
        self._require_chunk_file(name, f"c/{r}/0", where)
        cell = np.asarray(arr[self.bounds[r] : self.bounds[r + 1]])
        if not np.isfinite(cell).all():
            raise GridCorruptionError(f"{where}: cell holds missing or non-finite values")
        self._verify(cell, (0, r, b), where)
        return cell

    def _read_sparse(self, r: int, b: int, where: str) -> sp.csc_matrix:
        rows, size = int(self.bounds[r + 1] - self.bounds[r]), self.sizes[b]
        nnz = int(self.cell_nnz()[r, b])
        name = f"X/block_{b}/cell_{r}"
        arr = self._array(name, cache=False)
        expected = packed_size(nnz, size, self.dtype)
        if arr.shape != (expected,):
            raise GridCorruptionError(
                f"{where}: {name} has shape {arr.shape}, expected {(expected,)}"
            )
        self._require_chunk_file(name, "c/0", where)
        packed = np.asarray(arr[:])
        self._verify(packed, (0, r, b), where)
        data, indices, indptr = unpack_csc(packed, nnz, size, self.dtype, where)
        if (
            indptr[0] != 0
            or indptr[-1] != nnz
            or (np.diff(indptr) < 0).any()
            or (nnz and (indices.min() < 0 or indices.max() >= rows))
            or not np.isfinite(data).all()
        ):
            raise GridCorruptionError(f"{where}: inconsistent sparse cell contents")
        return sp.csc_matrix((data, indices, indptr), shape=(rows, size))

    def read_labels(self, r: int) -> np.ndarray:
        where = f"labels of row chunk {r} of grid {self.path}"
        try:
            self._require_chunk_file("y", f"c/{r}", where)
            y = np.asarray(self._array("y")[self.bounds[r] : self.bounds[r + 1]])
        except GridCorruptionError:
            raise
        except Exception as exc:
            raise GridCorruptionError(f"cannot read {where}: {exc}") from exc
        if not np.isfinite(y).all():
            raise GridCorruptionError(f"{where}: missing or non-finite values")
        self._verify(y, (1, r), where)
        return y


@functools.lru_cache(maxsize=64)
def _reader(path: str, grid_id: str) -> _Reader:
    return _Reader(path, grid_id)


def read_cell(path: str, grid_id: str, r: int, b: int):
    """Cell (row chunk r, block b) of the store at ``path``, checked against its checksum:
    a task function of Grid.X's graph and of the data layer (top-level so it pickles)."""
    return _reader(path, grid_id).read_cell(r, b)


def read_labels(path: str, grid_id: str, r: int) -> np.ndarray:
    """Labels of row chunk r: a task function of Grid.y's graph and of the data layer."""
    return _reader(path, grid_id).read_labels(r)


def _check_header(path: str):
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(f"{path} is a file, not a grid store (a directory)")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no grid store at {path}")
    try:
        group = zarr.open_group(path, mode="r")
        attrs = dict(group.attrs)
    except Exception as exc:
        raise ValueError(f"{path} is not a readable zarr grid store: {exc}") from exc
    if attrs.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} store (format={attrs.get('format')!r})")
    if attrs.get("format_version") not in READABLE_VERSIONS:
        raise ValueError(
            f"unsupported grid format version {attrs.get('format_version')!r} at {path} "
            f"(this library reads versions {', '.join(map(str, READABLE_VERSIONS))})"
        )
    if attrs.get("complete") is not True:
        raise ValueError(f"grid store {path} is incomplete (interrupted write?)")
    _check_attrs(path, attrs)
    if attrs.get("layout") == "sparse" and attrs.get("sparse_cell_encoding") != "packed-csc-1":
        raise GridCorruptionError(
            f"grid store {path}: unsupported sparse cell encoding "
            f"{attrs.get('sparse_cell_encoding')!r}"
        )
    return attrs


def _is_int(value, low=0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _check_attrs(path: str, attrs: dict) -> None:
    """Check the metadata every reader relies on, once: a damaged zarr.json is reported
    as such (naming the key), never as a KeyError or TypeError deep in a read."""

    def bad(key, why):
        shown = repr(attrs.get(key))
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return GridCorruptionError(f"grid store {path} has invalid metadata: {key}={shown} {why}")

    def int_list(key, length=None, low=0):
        value = attrs.get(key)
        if (not isinstance(value, list) or not all(_is_int(v, low) for v in value)
                or (length is not None and len(value) != length)):
            count = "" if length is None else f"{length} "
            raise bad(key, f"is not a list of {count}integers >= {low}")
        return value

    n, p = int_list("shape", 2, low=1)
    if not _is_int(attrs.get("row_chunk"), 1):
        raise bad("row_chunk", "is not a positive integer")
    if int_list("row_bounds") != _row_bounds(n, attrs["row_chunk"]).tolist():
        raise bad("row_bounds", f"do not cut {n} rows in row chunks of {attrs['row_chunk']}")
    blocks = attrs.get("blocks")
    try:
        if not isinstance(blocks, list) or not all(isinstance(b, list) for b in blocks):
            raise ValueError("blocks must be a list of lists")
        validate_blocks(blocks, p)
    except ValueError as exc:
        raise bad("blocks", f"is not a partition of the {p} features ({exc})") from None
    if attrs.get("dtype") not in ("float32", "float64"):
        raise bad("dtype", "is not 'float32' or 'float64'")
    if attrs.get("layout") not in ("dense", "sparse"):
        raise bad("layout", "is not 'dense' or 'sparse'")
    purity = attrs.get("purity")
    if not isinstance(purity, list) or len(purity) != len(blocks) or not all(
            isinstance(v, bool) for v in purity):
        raise bad("purity", f"is not a list of {len(blocks)} booleans")
    int_list("max_nnz_per_row", len(blocks))
    int_list("block_nnz", len(blocks))
    if not _is_int(attrs.get("nnz")):
        raise bad("nnz", "is not an integer >= 0")
    if not isinstance(attrs.get("grid_id"), str) or not attrs["grid_id"]:
        raise bad("grid_id", "is not a non-empty string")
    names = attrs.get("feature_names")
    if names is not None and (not isinstance(names, list) or len(names) != p
                              or not all(isinstance(v, str) for v in names)):
        raise bad("feature_names", f"is neither null nor a list of {p} strings")


def _build_arrays(path: str, attrs: dict, row_chunks: tuple, sizes: tuple):
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    grid_id = attrs["grid_id"]
    dtype = np.dtype(attrs["dtype"])
    token = tokenize(path, grid_id)
    x_name, y_name = f"grid-X-{token}", f"grid-y-{token}"
    x_dsk = {
        (x_name, r, b): (read_cell, path, grid_id, r, b)
        for r in range(len(row_chunks))
        for b in range(len(sizes))
    }
    y_dsk = {(y_name, r): (read_labels, path, grid_id, r) for r in range(len(row_chunks))}
    if attrs["layout"] == "sparse":
        meta = sp.csc_matrix((0, 0), dtype=dtype)
    else:
        meta = np.empty((0, 0), dtype=dtype)
    X = da.Array(
        HighLevelGraph.from_collections(x_name, x_dsk, dependencies=()),
        x_name,
        (row_chunks, sizes),
        meta=meta,
    )
    y = da.Array(
        HighLevelGraph.from_collections(y_name, y_dsk, dependencies=()),
        y_name,
        (row_chunks,),
        meta=np.empty((0,), dtype=np.float64),
    )
    return X, y


def open_grid(path) -> Grid:
    """Open a grid store written by :func:`to_grid`.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    Grid
        With lazy dask arrays ``X`` (one chunk per cell, columns reordered by
        block: ``X[:, k]`` is original feature ``feature_order[k]``) and
        ``y``.

    Raises
    ------
    FileNotFoundError
        If nothing exists at ``path``.
    NotADirectoryError
        If ``path`` is a file.
    ValueError
        If the store is not a grid, is incomplete (no ``complete`` marker) or
        has an unsupported format version.
    GridCorruptionError
        Later, when a missing or corrupt cell is read (directly or inside a
        dask computation); the message names the cell and the path.
    """
    path = os.path.abspath(os.fspath(path))
    attrs = _check_header(path)
    bounds = np.asarray(attrs["row_bounds"], dtype=np.int64)
    blocks = [np.asarray(b, dtype=np.int64) for b in attrs["blocks"]]
    sizes = tuple(len(b) for b in blocks)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    row_chunks = tuple(int(v) for v in np.diff(bounds))
    X, y = _build_arrays(path, attrs, row_chunks, sizes)
    try:
        cell_nnz = _reader(path, attrs["grid_id"]).cell_nnz()
    except Exception as exc:
        raise GridCorruptionError(f"cannot read cell_nnz of grid {path}: {exc}") from exc
    return Grid(
        path=path,
        X=X,
        y=y,
        blocks=blocks,
        block_slices=[slice(int(offsets[b]), int(offsets[b + 1])) for b in range(len(blocks))],
        feature_order=np.concatenate(blocks),
        purity=[bool(v) for v in attrs["purity"]],
        max_nnz_per_row=[int(v) for v in attrs["max_nnz_per_row"]],
        shape=tuple(int(v) for v in attrs["shape"]),
        row_chunk=int(attrs["row_chunk"]),
        row_chunks=row_chunks,
        row_bounds=bounds,
        is_sparse=attrs["layout"] == "sparse",
        dtype=np.dtype(attrs["dtype"]),
        feature_names=attrs.get("feature_names"),
        nnz=int(attrs["nnz"]),
        block_nnz=[int(v) for v in attrs["block_nnz"]],
        cell_nnz=cell_nnz,
        grid_id=attrs["grid_id"],
        attrs=attrs,
        store_version=_store_version(path, attrs["grid_id"]),
    )


def _store_version(path: str, grid_id: str) -> str:
    """The store's directory (device, inode) and its write's id, as one string."""
    stat = os.stat(path)
    return f"{stat.st_dev}:{stat.st_ino}:{grid_id}"
