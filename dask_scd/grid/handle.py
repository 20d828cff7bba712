"""The Grid handle: a grid store opened for reading (its columns in block order: see
:class:`Grid`), and ``open_grid``, which opens one."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from .layout import _check_header, reading
from .read import _build_arrays, _reader, _store_version, read_cell, read_labels, read_weights

__all__ = ["Grid", "open_grid"]


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

        Parameters
        ----------
        r : int
            The row chunk, ``0 <= r < n_row_chunks``.
        b : int
            The column block, ``0 <= b < n_blocks``.

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
        """Read the labels of one row chunk.

        Parameters
        ----------
        r : int
            The row chunk, ``0 <= r < n_row_chunks``.

        Returns
        -------
        ndarray of shape (row_chunks[r],), float64
        """
        return read_labels(self.path, self.grid_id, int(r))

    @property
    def label_dtype(self) -> np.dtype:
        """The dtype the labels were given in (bool, an integer or a float dtype): they
        are stored as float64 (``y``), and a classifier fitted on the grid reports its
        ``classes_`` in this dtype. float64 for a store written without it."""
        return np.dtype(self.attrs.get("label_dtype", "float64"))

    @property
    def has_weights(self) -> bool:
        """Whether the store holds sample weights (``to_grid(..., sample_weight=...)``)."""
        return bool(self.attrs.get("has_weights", False))

    def read_weights(self, r: int) -> np.ndarray:
        """Read the sample weights of one row chunk.

        Parameters
        ----------
        r : int
            The row chunk, ``0 <= r < n_row_chunks``.

        Returns
        -------
        ndarray of shape (row_chunks[r],), float64
        """
        return read_weights(self.path, self.grid_id, int(r))

    def stored_weights(self) -> np.ndarray | None:
        """The sample weights of every row, as stored.

        Returns
        -------
        ndarray of shape (n_samples,), float64, or None
            None if the store holds no weights.
        """
        if not self.has_weights:
            return None
        return np.concatenate([self.read_weights(r) for r in range(self.n_row_chunks)])

    def __repr__(self) -> str:
        kind = "sparse" if self.is_sparse else "dense"
        return (
            f"<Grid {self.path!r} shape={self.shape} {kind} {self.dtype} "
            f"cells={self.n_row_chunks}x{self.n_blocks} "
            f"pure_blocks={sum(self.purity)}/{self.n_blocks}>"
        )


def open_grid(path) -> Grid:
    """Open a grid store written by :func:`to_grid`.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    Grid
        With lazy dask arrays ``X`` (one chunk per cell, columns in block order) and ``y``.

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
        If the store lacks its labels or one of its tables (``cell_nnz``,
        ``cell_checksum``, ``label_checksum``): the message names the array and
        the path. Later, when a missing or corrupt cell is read (directly or
        inside a dask computation); the message names the cell and the path.
    """
    path = os.path.abspath(os.fspath(path))
    attrs = _check_header(path)
    bounds = np.asarray(attrs["row_bounds"], dtype=np.int64)
    blocks = [np.asarray(b, dtype=np.int64) for b in attrs["blocks"]]
    sizes = tuple(len(b) for b in blocks)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    row_chunks = tuple(int(v) for v in np.diff(bounds))
    X, y = _build_arrays(path, attrs, row_chunks, sizes)
    with reading(f"the tables of grid {path}"):
        reader = _reader(path, attrs["grid_id"])
        cell_nnz = reader.cell_nnz()
        reader.checksums()
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
