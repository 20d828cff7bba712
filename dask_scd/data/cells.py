"""Cells: the part of X in one row chunk and one column block, as the kernels read it.

A task receives a cell either as data (a chunk of a persisted dask array: numpy,
scipy.sparse, pydata ``sparse``, or a device array) or as a :class:`CellRef` to a grid
store, read here through the worker cell cache (:mod:`dask_scd.data.cache`);
:func:`cell_view` wraps any of them for the CPU kernels (:class:`CellView`) or the CUDA
kernels (:class:`DeviceCellView`). Labels arrive the same way (:class:`LabelRef`,
:func:`labels`). :func:`inspect_cell` is the one check a cell gets before a fit.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dask_scd.data.cache import CACHE
from dask_scd.data.findings import cell_values, value_finding
from dask_scd.kernels import block as block_kernels
from dask_scd.kernels.device import on_device
from dask_scd.kernels.layout import MajorMatrix, check_structure, structure_error
from dask_scd.validation import check_label_values, is_pydata_sparse, largest_magnitude, to_scipy


@dataclass(frozen=True)
class CellRef:
    """Cell (row chunk ``r``, block ``b``) of the grid store at ``path``.

    ``version`` is the store's :attr:`~dask_scd.grid.Grid.store_version`: with the path it
    keys the cache, so a copy of a store (same ``grid_id``) is never served the cells of
    the original, nor a store replaced at the same path those of the one it replaced.
    """

    path: str
    grid_id: str
    r: int
    b: int
    version: str = ""

    @property
    def key(self) -> tuple:
        return ("cell", self.path, self.grid_id, self.version, self.r, self.b)


@dataclass(frozen=True)
class LabelRef:
    """Labels of row chunk ``r`` of a grid store, mapped to ±1 if ``classes`` is given."""

    path: str
    grid_id: str
    r: int
    classes: tuple | None = None
    version: str = ""

    @property
    def key(self) -> tuple:
        return ("labels", self.path, self.grid_id, self.version, self.r, self.classes)


class CellView:
    """A cell wrapped for the kernels: X_cell d, X_cellᵀ v and friends."""

    def __init__(self, cell):
        if is_pydata_sparse(cell):
            cell = to_scipy(cell)
        check_structure(cell, "a chunk of X")  # before the kernels or scipy read it
        by_columns = sp.issparse(cell)
        matrix = MajorMatrix.from_array(cell, "columns" if by_columns else "rows")
        self._wrap(cell.shape, by_columns, matrix)

    def _wrap(self, shape, by_columns: bool, matrix: MajorMatrix) -> CellView:
        self.n_rows, self.n_columns = shape
        self.by_columns, self.matrix = by_columns, matrix
        self._squared_sums = self._cube_sums = self._stored = None  # (_stored: see stored_columns)
        return self

    @classmethod
    def of_parts(cls, parts) -> CellView:
        """A sparse grid cell's :class:`~dask_scd.grid.read.SparseParts` wrapped as they
        are: column-major, nothing copied or checked again (its read checked it)."""
        n_rows, n_columns = parts.shape
        matrix = MajorMatrix(parts.data, parts.indices, parts.indptr, False, n_columns, n_rows)
        return cls.__new__(cls)._wrap(parts.shape, True, matrix)

    def to_spill(self) -> tuple:
        """(arrays, meta) for the cell cache's spill file (:mod:`dask_scd.data.spill`)."""
        m = self.matrix
        return (
            (m.data, m.indices, m.indptr),
            (self.n_rows, self.n_columns, self.by_columns, m.dense, m.n_major, m.n_minor),
        )

    @classmethod
    def from_spill(cls, meta, arrays) -> CellView:
        n_rows, n_columns, by_columns, dense, n_major, n_minor = meta
        matrix = MajorMatrix(*arrays, dense, n_major, n_minor)
        return cls.__new__(cls)._wrap((n_rows, n_columns), by_columns, matrix)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored values and indices (what the cell cache counts)."""
        m = self.matrix
        return m.data.nbytes + m.indices.nbytes + m.indptr.nbytes

    @property
    def stored_columns(self) -> np.ndarray | None:
        """The columns holding an entry, when a sparse cell stores at most half of its
        columns (a row chunk of one-hot data meets a fraction of a large vocabulary), else
        None. The block-SCD tasks then send their per-column sums over these columns
        alone: what travels and is summed scales with the cell, not with the block."""
        if self._stored is None:
            self._stored = (None, None)
            m = self.matrix
            if self.by_columns and not m.dense:
                counts = np.diff(m.indptr)
                present = np.flatnonzero(counts)
                if 2 * len(present) <= self.n_columns:
                    # The empty columns hold no entries: data and indices are unchanged.
                    indptr = np.zeros(len(present) + 1, dtype=m.indptr.dtype)
                    np.cumsum(counts[present], out=indptr[1:])
                    self._stored = (
                        present,
                        MajorMatrix(m.data, m.indices, indptr, False, len(present), m.n_minor),
                    )
        return self._stored[0]

    def stored_sums(self, v, squared=False) -> np.ndarray:
        """X_cellᵀ v (or (X_cell∘X_cell)ᵀ v) at :attr:`stored_columns` only."""
        self.stored_columns  # noqa: B018 (builds the compact matrix)
        return self._stored[1].dot(v, squared)

    def stored_sums_pair(self, v, w) -> tuple[np.ndarray, np.ndarray]:
        """(X_cellᵀ v, X_cellᵀ w) at :attr:`stored_columns` only, in one read of the cell."""
        self.stored_columns  # noqa: B018 (builds the compact matrix)
        return self._stored[1].dot_pair(v, w)

    def stored_trials(self, loss_code, y, margins, direction, steps, weights=None) -> np.ndarray:
        """:meth:`trials` at :attr:`stored_columns` only; ``direction`` given there."""
        return _coordinate_trials(
            self._stored[1], True, loss_code, y, margins, direction, steps, weights
        )

    def cube_sums(self) -> np.ndarray:
        """Σ_i |x_ij|³ per column (the cubic term of the logistic bound), once per cell."""
        if self._cube_sums is None:
            m = self.matrix
            cubes = np.abs(m.data.astype(np.float64)) ** 3
            if m.dense:
                self._cube_sums = cubes.reshape(self.n_rows, self.n_columns).sum(axis=0)
            else:  # CSC: the columns are the major lines
                self._cube_sums = np.empty(self.n_columns)
                block_kernels.major_sums(cubes, m.indptr, self._cube_sums)
        return self._cube_sums

    def squared_sums(self) -> np.ndarray:
        """(X_cell∘X_cell)ᵀ 1, the squared loss's curvature: computed once per cached cell."""
        if self._squared_sums is None:
            self._squared_sums = self.rmatvec(np.ones(self.n_rows), squared=True)
        return self._squared_sums

    def rmatvec(self, v, squared=False) -> np.ndarray:
        """X_cellᵀ v (or (X_cell∘X_cell)ᵀ v)."""
        m = self.matrix
        return m.dot(v, squared) if self.by_columns else m.scatter(v, squared)

    def matvec(self, d) -> np.ndarray:
        """X_cell d (over the stored columns alone where the cell has few: the same sums)."""
        if self.by_columns:
            stored = self.stored_columns
            if stored is not None:
                return self._stored[1].scatter(np.ascontiguousarray(d[stored]))
            return self.matrix.scatter(d)
        return self.matrix.dot(d)

    def gram(self, weights) -> np.ndarray:
        """X_cellᵀ diag(weights) X_cell as a dense (n_columns, n_columns) array."""
        m = self.matrix
        if self.by_columns:
            C = sp.csc_matrix((m.data, m.indices, m.indptr), shape=(self.n_rows, self.n_columns))
            return np.asarray((C.T @ C.multiply(weights[:, None])).todense(), dtype=np.float64)
        A = m.data.reshape(self.n_rows, self.n_columns).astype(np.float64)
        return A.T @ (A * weights[:, None])

    def trials(self, loss_code, y, margins, direction, steps, weights=None) -> np.ndarray:
        """(K, n_columns) loss changes per step size and coordinate (a pure cell), each
        example's weighted by ``weights`` where given."""
        return _coordinate_trials(
            self.matrix, self.by_columns, loss_code, y, margins, direction, steps, weights
        )


def _coordinate_trials(
    m: MajorMatrix, by_columns, loss_code, y, margins, direction, steps, weights
) -> np.ndarray:
    return block_kernels.coordinate_trials(
        *(m.data, m.indices, m.indptr, m.dense, m.n_major, m.n_minor, by_columns),
        *(y, margins, np.ascontiguousarray(direction, dtype=np.float64), steps),
        *(block_kernels.are_quarters(steps), loss_code, weights),
    )


class DeviceCellView:
    """A cell in device memory wrapped for the CUDA kernels: :class:`CellView`'s methods.

    The cell is a cupy array, a ``cupyx.scipy.sparse`` matrix, a numba device array or a
    :class:`~dask_scd.kernels.device.DeviceCSC`; it stays on the device. Each method
    copies its vectors there (O(n_rows) numbers: labels, margins, derivatives) and
    returns host numpy arrays: per-column sums, or X_cell d. The kernels are those of
    :mod:`dask_scd.kernels.cuda_cells`, imported with the first device cell.
    """

    by_columns = True

    def __init__(self, cell):
        from dask_scd.kernels import cuda_cells

        self._kernels = cuda_cells
        self.columns = cuda_cells.columns(cell)
        self.n_rows, self.n_columns = self.columns.n_rows, self.columns.n_columns
        self._squared_sums = None
        self._cube_sums = None

    @property
    def nbytes(self) -> int:
        return self.columns.nbytes

    def cube_sums(self) -> np.ndarray:
        """Σ_i |x_ij|³ per column, once per cell."""
        if self._cube_sums is None:
            self._cube_sums = self._sums(np.ones(self.n_rows), 3)
        return self._cube_sums

    def squared_sums(self) -> np.ndarray:
        """(X_cell∘X_cell)ᵀ 1, once per cell."""
        if self._squared_sums is None:
            self._squared_sums = self._sums(np.ones(self.n_rows), 2)
        return self._squared_sums

    def rmatvec(self, v, squared=False) -> np.ndarray:
        """X_cellᵀ v (or (X_cell∘X_cell)ᵀ v)."""
        return self._sums(v, 2 if squared else 1)

    def _sums(self, v, power) -> np.ndarray:
        return self._kernels.column_sums(self.columns, v, power)[0]

    def matvec(self, d) -> np.ndarray:
        """X_cell d."""
        return self._kernels.matvec(self.columns, d)

    def gram(self, weights, other: DeviceCellView | None = None) -> np.ndarray:
        """X_cellᵀ diag(weights) X_cell (or X_other) as a dense host array."""
        return self._kernels.gram(self.columns, weights, None if other is None else other.columns)

    def trials(self, loss_code, y, margins, direction, steps, weights=None) -> np.ndarray:
        """(K, n_columns) loss changes per step size and coordinate (a pure cell)."""
        if weights is not None:
            raise ValueError(
                "block SCD with sample weights runs on the CPU: the CUDA cell "
                "kernels take no weights (use device='cpu')"
            )
        return self._kernels.trials(self.columns, loss_code, y, margins, direction, steps)

    def inspect(self) -> tuple[float, np.ndarray]:
        """(max |x|, NaN if any entry is not finite; entries per row)."""
        return self._kernels.inspect(self.columns)


class PureRows:
    """A pure cell (no row holds two of its entries) by rows, the layout the block
    engine's fused passes read in row order (:func:`~dask_scd.kernels.block.pure_stats`):
    ``column[i]`` the cell column of row i's entry (−1: none), or its position among
    ``stored`` (the cell's :attr:`CellView.stored_columns`) where there are such;
    ``value[i]`` the entry (``value`` empty where every entry is 1: a one-hot cell by rows
    is 4 bytes a row). ``width``: the length of what the passes sum into;
    ``n_columns``: the cell's; ``cube``: Σ_i |x_ij|³ at those ``width`` columns. So the
    passes that read a cell by rows never need its column-major form (out of core, only
    one of the two may be held)."""

    __slots__ = ("column", "value", "stored", "width", "n_columns", "cube")

    def __init__(self, column, value, stored, width, n_columns, cube):
        self.column, self.value, self.stored, self.width = column, value, stored, width
        self.n_columns, self.cube = n_columns, cube

    @property
    def nbytes(self) -> int:
        return self.column.nbytes + self.value.nbytes + self.cube.nbytes

    def to_spill(self) -> tuple:
        """(arrays, meta) for the cell cache's spill file (:mod:`dask_scd.data.spill`)."""
        stored = () if self.stored is None else (self.stored,)
        return ((self.column, self.value, self.cube) + stored, (self.width, self.n_columns))

    @classmethod
    def from_spill(cls, meta, arrays) -> PureRows:
        column, value, cube = arrays[:3]
        return cls(column, value, arrays[3] if len(arrays) > 3 else None, *meta, cube)

    def compact(self, theta) -> np.ndarray:
        """θ of the cell's columns as the passes index it (at the stored columns)."""
        theta = theta if self.stored is None else theta[self.stored]
        return np.ascontiguousarray(theta, dtype=np.float64)

    def matvec(self, theta) -> np.ndarray:
        """X_cell θ (θ of the cell's columns): the bits of :meth:`CellView.matvec`, a row
        holding one entry at most."""
        out = np.zeros(len(self.column))
        block_kernels.pure_apply(self.column, self.value, self.compact(theta), out)
        return out


class _NotPure:
    """What :func:`pure_rows` keeps for a cell that has no by-rows form."""

    nbytes = 0


_NOT_PURE = _NotPure()


def pure_rows(cell) -> PureRows | None:
    """The by-rows form of a pure sparse cell held on the host, or None (an impure,
    dense or device cell, the intercept, or a chunk of a dask array, which a task wraps
    anew each time). Made once per cell: a grid cell's in the cell cache next to the
    cell (counted in its bytes, evicted with the others), a :class:`CellView`'s on it."""
    if isinstance(cell, PureRows):  # kept by a first pass for a second
        return cell
    if isinstance(cell, CellRef):
        found = CACHE.get(cell.key + ("rows",), lambda: _ref_by_rows(cell), spill=True)
    elif isinstance(cell, CellView):
        found = cell.__dict__.get("_by_rows")
        if found is None:
            found = cell.__dict__["_by_rows"] = _by_rows(cell)
    else:
        return None
    return None if found is _NOT_PURE else found


def _ref_by_rows(cell) -> PureRows | _NotPure:
    """A grid cell's by-rows form, made from its column-major form: the cached one if
    there is one (then dropped from the cache), else read for this alone and not cached
    (the passes read a pure cell by rows only, so out of core the two forms would share
    the cache and both be read again each pass). An impure cell's column-major form is
    cached: it is what its passes read.

    A cell read for this alone is decoded into this thread's reused memory
    (:func:`_read_buffers`): the by-rows form is made from it and copies nothing of it,
    and under a memory limit a fresh few-MB array is a fresh mmap whose page faults cost
    as much as its decoding (a 3 MB one-hot cell: ~1 ms decoded into reused memory,
    2-4 ms into new). The column-major form of an impure cell, kept, is copied out."""
    view, cached = CACHE.lookup(cell.key)
    if not cached:
        stored = _read(cell, _read_buffers(), parts=True)
        view = CellView(stored) if isinstance(stored, np.ndarray) else CellView.of_parts(stored)
    found = _by_rows(view)
    if found is _NOT_PURE and not cached:
        CACHE.keep(
            cell.key,
            CellView(
                stored.copy()
                if isinstance(stored, np.ndarray)
                else sp.csc_matrix(tuple(a.copy() for a in stored[:3]), shape=stored.shape)
            ),
            spill=True,
        )
    elif found is not _NOT_PURE and cached:
        # Read for something else first (the preflight's check): the by-rows form
        # replaces it, else a pure cell took its bytes twice in the cache (in core, a
        # grid that fits was read again every pass).
        CACHE.drop(cell.key)
    return found


def _read_view(cell) -> CellView:
    return CellView(_read(cell))


def _read(cell, buffers=None, parts=False):
    from dask_scd.grid import read_cell

    return read_cell(cell.path, cell.grid_id, cell.r, cell.b, buffers, parts)


_local = threading.local()


def _read_buffers():
    """This thread's :class:`~dask_scd.grid.read.CellBuffers` for cells read only to be
    made into something else (a cell decoded into them is valid until the thread's next
    such read)."""
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        from dask_scd.grid.read import CellBuffers

        buffers = _local.buffers = CellBuffers()
    return buffers


def _by_rows(view) -> PureRows | _NotPure:
    if not isinstance(view, CellView) or not view.by_columns or view.matrix.dense:
        return _NOT_PURE
    stored = view.stored_columns
    m = view.matrix if stored is None else view._stored[1]
    column, value, pure = block_kernels.csc_by_rows(m.data, m.indices, m.indptr, view.n_rows)
    if not pure:
        return _NOT_PURE
    if not value.size:  # one-hot: Σ|x|³ of a column is its count (the same bits)
        return PureRows(
            column, value, stored, m.n_major, view.n_columns, np.diff(m.indptr).astype(np.float64)
        )
    cube = view.cube_sums()
    return PureRows(
        column, value, stored, m.n_major, view.n_columns, cube if stored is None else cube[stored]
    )


def cell_view(cell) -> CellView | DeviceCellView | None:
    """Resolve a cell argument of a task (None stays None: the intercept's ones).

    A cell in device memory gets a :class:`DeviceCellView` (the CUDA kernels), any other
    a :class:`CellView` (the CPU kernels).
    """
    if cell is None or isinstance(cell, (CellView, DeviceCellView)):
        return cell
    if isinstance(cell, CellRef):
        # An impure cell's column-major form is what its passes read: out of core it goes
        # to the spill file. (A pure cell's is read once, for its check and by-rows form.)
        impure = CACHE.lookup(cell.key + ("rows",))[0] is _NOT_PURE
        return CACHE.get(cell.key, lambda: _read_view(cell), spill=impure)
    if on_device(cell):
        return DeviceCellView(cell)
    return CellView(cell)


@dataclass(frozen=True)
class WeightedLabels:
    """A row chunk's labels (a LabelRef or an array) with its sample weights v (scaled to
    mean 1 over all rows): what a weighted fit's tasks receive in place of the labels."""

    labels: object
    weights: np.ndarray


def weighted_labels(y, weights) -> WeightedLabels:
    """A task that makes :class:`WeightedLabels` on a worker (dask array labels)."""
    return WeightedLabels(labels(y), np.asarray(weights, dtype=np.float64))


def row_weights(y):
    """The sample weights of a labels argument, or None (every example weighs 1)."""
    return y.weights if isinstance(y, WeightedLabels) else None


def labels(y) -> np.ndarray:
    """Resolve a labels argument (a LabelRef or an array) to float64 (±1 when classified)."""
    if isinstance(y, WeightedLabels):
        return labels(y.labels)
    if isinstance(y, LabelRef):
        from dask_scd.grid import read_labels

        def load():
            values = read_labels(y.path, y.grid_id, y.r)
            if y.classes is not None:
                return np.where(values == y.classes[1], 1, -1).astype(np.int8)
            values = np.asarray(values, dtype=np.float64)
            check_label_values(values)  # the client never reads a grid's real labels
            return values

        # Cached after the ±1 mapping, as one byte a row: every task of the row chunk
        # reads them, and out of core the row chunks' labels at 8 bytes a row took most
        # of what the cache may keep beyond its bound (see CellCache._keep_recent).
        values = CACHE.get(y.key, load, spill=True)
        return values.astype(np.float64) if values.dtype == np.int8 else values
    return np.asarray(y, dtype=np.float64)


def hold_cells(group, cells: list) -> dict:
    """Make exactly ``cells`` resident for ``group`` in this process (a residency policy's
    choice for one row chunk); returns {"loads", "bytes"} it took."""
    return CACHE.hold(group, lambda: [cell_view(cell) for cell in cells])


def inspect_cell(cell, where: str, raises: bool = True) -> dict:
    """Check a cell once before fitting: finite values and purity.

    Returns ``{"max_per_row"}``: the most non-zeros one example has in the block,
    ``"nbytes"``, and ``"columns"``: which of its columns hold a value (``np.packbits``
    of the mask; None for a device cell). A NaN, an infinity or a value too large
    (``where`` names the cell in the message) is a ValueError, or with ``raises=False``
    the report ``{"finding": ...}`` of :func:`value_finding`: a task returns it for the
    client to raise, so that no worker logs a failed task.
    """
    finding, counts = _structure_finding(cell, where), None
    if finding is None:  # a malformed chunk has no view
        view = cell_view(cell)
        finding, counts = _finding(view, where)
    if finding is not None:
        if raises:
            raise ValueError(finding["message"])
        return {"finding": finding}
    if counts is None:
        counts = _nonzeros_per_row(view)
    columns = None
    if not isinstance(view, DeviceCellView):
        m = view.matrix
        if m.dense:
            held = np.any(m.data.reshape(view.n_rows, view.n_columns) != 0, axis=0)
        else:  # a sparse cell is held by columns
            held = np.diff(m.indptr) > 0
        columns = np.packbits(held)
    return {
        "max_per_row": int(counts.max()) if counts.size else 0,
        "nbytes": view.nbytes,
        "columns": columns,
    }


def row_chunk_finding(cells: list, where: str) -> dict | None:
    """(task) The first bad value of a row chunk's cells (``where`` names the row chunk):
    ``{"block", "finding"}`` (:func:`value_finding`), or None where every value is
    finite and not too large. Returned, not raised: the worker logs no failed task, and
    the client raises :func:`finding_error`."""
    for b, cell in enumerate(cells):
        place = f"cell ({where}, block {b})"
        finding = _structure_finding(cell, place) or _finding(cell_view(cell), place)[0]
        if finding is not None:
            return {"block": b, "finding": finding}
    return None


def _structure_finding(cell, where: str) -> dict | None:
    """A malformed CSR or CSC chunk (:func:`~dask_scd.kernels.layout.structure_error`) as
    a finding, before its view is made (which would raise in the task)."""
    if not sp.issparse(cell):
        return None
    message = structure_error(cell, f"a chunk of X, {where},")
    if message is None:
        return None
    return {"message": message, "row": None, "column": None, "value": None}


def _finding(view, where: str) -> tuple:
    """(:func:`~dask_scd.data.findings.value_finding` of the cell's values or None, the
    non-zeros per row where a device cell's inspection gave them, else None); the values
    are read back (:func:`~dask_scd.data.findings.cell_values`) only where one is bad,
    and never from a device cell."""
    if isinstance(view, DeviceCellView):
        largest, counts = view.inspect()
        return value_finding(largest, where), counts
    largest = largest_magnitude(view.matrix.data)
    return value_finding(largest, where, lambda: cell_values(view)), None


def _nonzeros_per_row(view: CellView) -> np.ndarray:
    m = view.matrix
    if m.dense:
        return np.count_nonzero(m.data.reshape(view.n_rows, view.n_columns), axis=1)
    return np.bincount(m.indices, minlength=view.n_rows)
