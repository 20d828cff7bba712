"""Sources: a grid or a dask array seen by the dask engines as cells, labels and row bounds.

A :class:`Source` is what a dask engine receives: the design matrix cut into cells (row
chunks × column blocks, the blocks in grid column order), the labels of each row chunk
(mapped to ±1 for a classification loss), what the cost model needs (stored bytes,
non-zeros), and a way to bring everything into memory when ``auto`` decides the fit runs
there. :func:`make_source` validates dask or grid input and builds one; engines never
build a source, they :meth:`Source.connect` it to their client and read the cells that
returns.

Two implementations: :class:`GridSource` (cells are :class:`~dask_scd.data.cells.CellRef`
references that each worker reads from the store through its cell cache) and
:class:`DaskSource` (cells are the chunks of the array, persisted on the cluster). The
in-memory counterpart is :class:`dask_scd.data.memory.InMemory`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from dask_scd import objectives as obj
from dask_scd.data.cells import CellRef, LabelRef, WeightedLabels, labels, weighted_labels
from dask_scd.grid import Grid, validate_blocks
from dask_scd.validation import (
    as_engine_dtype,
    check_2d,
    check_known_chunks,
    check_labels,
    check_sample_weight,
    is_dask,
    to_scipy,
    warn,
)


@dataclass
class Source:
    """A design matrix as cells, with its labels and what is known of them.

    Attributes
    ----------
    n_samples, n_features : int
    row_bounds : ndarray of int64, shape (n_row_chunks + 1,)
        Row chunk r holds rows ``row_bounds[r]:row_bounds[r + 1]``.
    blocks : list of ndarray
        The original feature indices of each column block, in grid column order.
    nbytes : int
        Bytes of X as stored (values, and indices for a sparse grid): the cost model's
        measure of a pass.
    nnz : int or None
        Stored values (for a dask array of sparse chunks, extrapolated from its first
        row chunk).
    classes : ndarray of shape (2,) or None
        The labels mapped to −1 and +1 for a classification loss.
    purity : list of bool
        Per block, at most one non-zero per example; filled by the engine's preflight.
    sample_weight : ndarray of shape (n_samples,) or None
        The examples' weights as given (a grid's stored weights, or the fit's
        ``sample_weight``), checked; None: every example weighs 1.
    """

    n_samples: int
    n_features: int
    row_bounds: np.ndarray
    blocks: list
    nbytes: int
    nnz: int | None = None
    classes: np.ndarray | None = None
    purity: list = field(default_factory=list)
    sample_weight: np.ndarray | None = None

    #: Whether the cells are read from disk by the workers (a grid): the runtime then
    #: places each row chunk on a home worker; a dask array's chunks live where dask
    #: persisted them.
    on_disk = False

    @property
    def n_row_chunks(self) -> int:
        return len(self.row_bounds) - 1

    @property
    def slices(self) -> list:
        offsets = np.concatenate([[0], np.cumsum([len(b) for b in self.blocks])]).astype(int)
        return [slice(offsets[b], offsets[b + 1]) for b in range(len(self.blocks))]

    @property
    def feature_order(self) -> np.ndarray:
        return np.concatenate(self.blocks)

    @property
    def weighted(self) -> bool:
        """Whether the examples carry sample weights (block Newton solves them; block SCD
        does not)."""
        return self.sample_weight is not None

    def unit_weights(self):
        """The sample weights scaled to mean 1 (what the engines read), or None."""
        return check_sample_weight(self.sample_weight, self.n_samples)

    def _unit_weights_by_row_chunk(self) -> list:
        """Each row chunk's share of :meth:`unit_weights` (None each without weights)."""
        unit = self.unit_weights()
        bounds = zip(self.row_bounds[:-1], self.row_bounds[1:])
        return [None if unit is None else unit[lo:hi] for lo, hi in bounds]

    def connect(self, client) -> tuple[list, list]:
        """(cells[r][b], labels[r]) as the tasks of a fit on ``client`` take them; with
        sample weights each labels[r] is a :class:`~dask_scd.data.cells.WeightedLabels`."""
        raise NotImplementedError

    def materialize(self) -> tuple:
        """(X in the original feature order, y in its own dtype) in memory."""
        raise NotImplementedError


@dataclass
class GridSource(Source):
    """A :class:`~dask_scd.grid.Grid`: cells and labels are references that each worker
    reads from the store (and keeps in its cell cache)."""

    grid: Grid | None = None
    on_disk = True

    def cell(self, r: int, b: int) -> CellRef:
        grid = self.grid
        return CellRef(grid.path, grid.grid_id, r, b, grid.store_version)

    def label(self, r: int) -> LabelRef:
        grid = self.grid
        classes = tuple(self.classes.tolist()) if self.classes is not None else None
        return LabelRef(grid.path, grid.grid_id, r, classes, grid.store_version)

    def connect(self, client) -> tuple[list, list]:
        cells = [
            [self.cell(r, b) for b in range(len(self.blocks))] for r in range(self.n_row_chunks)
        ]
        return cells, [
            self.label(r) if v is None else WeightedLabels(self.label(r), v)
            for r, v in enumerate(self._unit_weights_by_row_chunk())
        ]

    def materialize(self) -> tuple:
        """Read here, from the store, by two threads (not through the cluster: a
        Criteo-like 500k-row grid took 3.6 s through two workers, most of it moving the
        cells to the client); sparse X comes back CSR, the layout the in-memory engines
        read first (one conversion here, none in each of their steps)."""
        from concurrent.futures import ThreadPoolExecutor

        from dask_scd.grid.read import read_cell, read_labels

        grid = self.grid
        n_rc, n_blocks = self.n_row_chunks, len(self.blocks)

        def column(b):
            cells = [read_cell(grid.path, grid.grid_id, r, b) for r in range(n_rc)]
            return sp.vstack(cells, format="csc") if grid.is_sparse else np.vstack(cells)

        with ThreadPoolExecutor(2) as pool:
            columns = list(pool.map(column, range(n_blocks)))
        y = np.concatenate([read_labels(grid.path, grid.grid_id, r) for r in range(n_rc)])
        X = sp.hstack(columns, format="csc") if grid.is_sparse else np.hstack(columns)
        X = _in_feature_order(X, grid.feature_order)
        return (X.tocsr() if grid.is_sparse else X), y.astype(grid.label_dtype, copy=False)


@dataclass
class DaskSource(Source):
    """A dask array with its columns in block order: cells are its chunks, persisted on
    the cluster when the fit connects; labels are checked on the client."""

    X: object = None  # dask array, columns in grid column order
    y_chunks: list = field(default_factory=list)  # checked labels of each row chunk
    y_given: object = None  # the labels as given (materialize returns them)

    def label(self, r: int) -> np.ndarray:
        return self.y_chunks[r]

    def connect(self, client) -> tuple[list, list]:
        """Persist the chunks on the cluster; the labels go there as tasks (not scattered:
        a lost copy is recomputed from its task), each under a key of its own (pure=False):
        a key hashed from the labels would be shared by every fit on them, the next fit's
        task meeting the previous fit's release of it."""
        from distributed import futures_of

        persisted = client.persist(self.X)
        by_key = {f.key: f for f in futures_of(persisted)}
        keys = persisted.__dask_keys__()
        cells = [
            [by_key[keys[r][b]] for b in range(len(self.blocks))] for r in range(self.n_row_chunks)
        ]
        return cells, [
            client.submit(labels, self.label(r), pure=False)
            if v is None
            else client.submit(weighted_labels, self.label(r), v, pure=False)
            for r, v in enumerate(self._unit_weights_by_row_chunk())
        ]

    def materialize(self) -> tuple:
        computed = self.X.compute()
        if not isinstance(computed, np.ndarray):
            computed = to_scipy(computed)
        return _in_feature_order(computed, self.feature_order), self.y_given


def _in_feature_order(X, order):
    """X, its columns in grid order (column k is feature ``order[k]``), in the original
    feature order."""
    if np.array_equal(order, np.arange(len(order))):
        return X
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return X[:, inverse]


def make_source(X, y, loss: str, blocks, sample_weight=None) -> Source:
    """Validate dask or grid input and describe its cells.

    Parameters
    ----------
    X : dask array of shape (n_samples, n_features), or Grid
    y : array-like or dask array of shape (n_samples,), or None for a Grid
    loss : str
        Classification losses map the labels to ±1 (two classes, checked here).
    blocks : list of array-like or None
        Column blocks of a dask array (a grid carries its own).
    sample_weight : array-like or dask array of shape (n_samples,), or None
        Weights of the examples; for a grid, in place of the weights it stores.
    """
    if isinstance(X, Grid):
        source = _grid_source(X, y, loss, blocks)
        if sample_weight is None:
            sample_weight = X.stored_weights()
    else:
        source = _dask_source(X, y, loss, blocks)
    source.sample_weight = _source_weights(sample_weight, source)
    return source


def _source_weights(sample_weight, source: Source):
    """The checked weights as given, in memory (n numbers); a dask vector is rechunked
    like the labels first, so that its row chunks line up with X's."""
    if sample_weight is None:
        return None
    n = source.n_samples
    if is_dask(sample_weight):
        sample_weight = _computed(sample_weight, "sample_weight", source.row_bounds)
    if check_sample_weight(sample_weight, n) is None:  # raises on bad weights
        return None  # equal weights: the unweighted problem
    return np.asarray(sample_weight, dtype=np.float64).reshape(n).copy()


def _computed(vector, name: str, row_bounds):
    """A dask vector of one value per row (or a column of them, as check_labels takes
    from numpy), rechunked like X's row chunks and computed."""
    n = int(row_bounds[-1])
    if vector.ndim == 2 and vector.shape[1] == 1:
        vector = vector[:, 0]
    if vector.ndim != 1 or vector.shape[0] != n:
        raise ValueError(
            f"{name} has shape {vector.shape} but X has {n} rows: {name} must be (n_samples,)"
        )
    return vector.rechunk((tuple(np.diff(row_bounds).tolist()),)).compute()


def _grid_source(grid, y, loss, blocks) -> GridSource:
    if y is not None:
        raise ValueError("a Grid carries its own labels: call fit(grid) without y")
    if blocks is not None:
        raise ValueError("a Grid carries its own blocks; write it again with to_grid(blocks=...)")
    classes = None
    if loss in obj.CLASSIFICATION_LOSSES:
        # checked as numpy labels are; stored as float64: the labels' own dtype back (int, bool)
        seen = _grid_classes(grid)
        classes = check_labels(seen, len(seen), loss)[1].astype(grid.label_dtype)
    itemsize = np.dtype(grid.dtype).itemsize
    nbytes = (
        grid.nnz * (itemsize + 4) if grid.is_sparse else grid.shape[0] * grid.shape[1] * itemsize
    )
    return GridSource(
        n_samples=grid.shape[0],
        n_features=grid.shape[1],
        row_bounds=np.asarray(grid.row_bounds),
        blocks=list(grid.blocks),
        nbytes=int(nbytes),
        nnz=int(grid.nnz),
        classes=classes,
        grid=grid,
    )


def _grid_classes(grid) -> np.ndarray:
    """The distinct labels of a grid, read one row chunk at a time (never all of y)."""
    seen = np.zeros(0)
    for r in range(grid.n_row_chunks):
        seen = np.union1d(seen, np.unique(grid.read_labels(r)))
        if len(seen) > 2:
            break  # already too many classes for a binary loss
    return seen


# A row chunk costs a task per stage of every block step (~2 ms of the scheduler's time):
# below a few MiB that outweighs its arithmetic (500 row chunks of 4,000 rows took 240 s
# where 8 chunks took 8 s). Row chunks smaller than this are merged, to at most
# MERGED_ROW_CHUNKS chunks (or this size each, when larger).
MIN_ROW_CHUNK_BYTES = 16 * 2**20
MERGED_ROW_CHUNKS = 16


def _stored_size(X) -> tuple[int, int | None]:
    """(bytes, non-zeros) of a dask array as stored: dense n·p values; for sparse chunks
    (scipy.sparse, pydata sparse) the non-zeros of the first row chunk, extrapolated."""
    n, p = X.shape
    itemsize = X.dtype.itemsize
    if not hasattr(getattr(X, "_meta", None), "nnz"):
        return int(n * p * itemsize), int(n * p)
    first = X[: X.chunks[0][0]].compute()
    nnz = int(math.ceil(int(first.nnz) * n / max(first.shape[0], 1)))
    return int(nnz * (itemsize + 4)), nnz  # values and their column indices


def _merged_row_chunks(X, nbytes: int):
    """X with its row chunks merged when they are many and small (and a warning that says
    how to do it once, before every fit)."""
    R = len(X.chunks[0])
    if R <= MERGED_ROW_CHUNKS or nbytes / R >= MIN_ROW_CHUNK_BYTES:
        return X
    target = min(R, max(MERGED_ROW_CHUNKS, math.ceil(nbytes / MIN_ROW_CHUNK_BYTES)))
    rows = math.ceil(X.shape[0] / target)
    warn(
        f"X has {R} row chunks of {nbytes / R / 2**20:.2g} MiB on average: each costs a task "
        f"per stage of every block step, so the fit merges them into row chunks of {rows} "
        f"rows; X = X.rechunk({{0: {rows}}}) (then X.persist()) does it once for every fit"
    )
    return X.rechunk({0: rows})


def _dask_source(X, y, loss, blocks) -> DaskSource:

    check_2d(X)
    check_known_chunks(X)
    if y is None:
        raise ValueError("y is required for a dask array X (only a Grid carries its labels)")
    n, p = X.shape
    if n == 0 or p == 0:
        raise ValueError(f"X is empty: shape {X.shape}")
    X = as_engine_dtype(X)  # before its stored size is taken: what the engines will read
    if blocks is None:
        bounds = np.concatenate([[0], np.cumsum(X.chunks[1])])
        blocks = [np.arange(bounds[b], bounds[b + 1]) for b in range(len(X.chunks[1]))]
    else:
        blocks = validate_blocks(blocks, p)
        order = np.concatenate(blocks)
        X = X[:, order].rechunk({1: tuple(len(b) for b in blocks)})
    nbytes, nnz = _stored_size(X)
    X = _merged_row_chunks(X, nbytes)
    row_bounds = np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(np.int64)
    if is_dask(y):
        values = _computed(y, "y", row_bounds)
    else:
        values = y  # check_labels reads lists, pandas and numpy alike
    y_checked, classes = check_labels(values, n, loss)
    y_chunks = [y_checked[row_bounds[r] : row_bounds[r + 1]] for r in range(len(row_bounds) - 1)]
    return DaskSource(
        n_samples=n,
        n_features=p,
        row_bounds=row_bounds,
        blocks=blocks,
        nbytes=nbytes,
        nnz=nnz,
        classes=classes,
        X=X,
        y_chunks=y_chunks,
        y_given=values,
    )
