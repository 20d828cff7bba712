"""Fast memory over slow memory: a resident set of chunks of X under a byte budget.

A *tier* pairs a slow store, which holds all of X cut into chunks of lines (columns for
a primal solver, rows for a dual one), with a fast memory that holds a few of them. The
solver asks the tier to make a set of chunks resident; the tier evicts what is no longer
wanted, loads what is missing and counts exactly what that cost: bytes moved into fast
memory, loads ("swaps") and evictions. It never holds more than its budget, and says so
in its own accounting (``peak_bytes``).

Slow stores:

- :class:`MatrixStore`: the in-memory matrix itself; a load is a copy of the chunk's
  lines (counted), and the slow side computes on the matrix in place;
- :class:`GridStore`: a zarr grid on disk (:mod:`dask_scd.grid`); a load reads the
  chunk's cells, and every read the slow side makes for itself (gap refreshes,
  certificates) is counted in ``bytes_read``.

Fast memories: :class:`HostMemory` (RAM) and :class:`DeviceMemory` (a GPU). Each has
``put`` (what it holds of a chunk's :class:`~dask_scd.kernels.layout.MajorMatrix`, freed
with the last reference to it) and an ``assemble`` that gives one matrix over the resident lines on the host (for the fast
side's per-line sums) and the one the epoch kernels read (the same on the host, a device
copy on the GPU).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dask_scd.kernels import device
from dask_scd.kernels.layout import MajorMatrix


def concatenate(pieces: list, n_minor: int) -> MajorMatrix:
    """One MajorMatrix of the lines of ``pieces``, in order (a copy)."""
    dense = pieces[0].dense if pieces else True
    n_major = sum(p.n_major for p in pieces)
    if not pieces:
        return MajorMatrix(
            np.zeros(0), np.zeros(0, np.int32), np.zeros(1, np.int64), True, 0, n_minor
        )
    data = np.concatenate([p.data for p in pieces])
    if dense:
        return MajorMatrix(data, pieces[0].indices, pieces[0].indptr, True, n_major, n_minor)
    indices = np.concatenate([p.indices for p in pieces])
    counts = np.concatenate([np.diff(p.indptr) for p in pieces])
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return MajorMatrix(data, indices, indptr, False, n_major, n_minor)


def nbytes(m: MajorMatrix) -> int:
    """Bytes a chunk takes in fast memory: its values, and its indices if sparse."""
    if m.dense:
        return int(m.data.nbytes)
    return int(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes)


def _lines(m: MajorMatrix, start: int, stop: int) -> MajorMatrix:
    """Lines start:stop of m, copied."""
    if m.dense:
        data = m.data[start * m.n_minor : stop * m.n_minor].copy()
        return MajorMatrix(data, m.indices, m.indptr, True, stop - start, m.n_minor)
    lo, hi = int(m.indptr[start]), int(m.indptr[stop])
    return MajorMatrix(
        m.data[lo:hi].copy(),
        m.indices[lo:hi].copy(),
        (m.indptr[start : stop + 1] - lo).astype(np.int64),
        False,
        stop - start,
        m.n_minor,
    )


def _as_scipy(m: MajorMatrix):
    """m as a (n_major, n_minor) array or CSR matrix, without copying."""
    if m.dense:
        return m.data.reshape(m.n_major, m.n_minor)
    return sp.csr_matrix((m.data, m.indices, m.indptr), shape=(m.n_major, m.n_minor))


# ----------------------------------------------------------------------- slow stores


class SlowStore:
    """All of X in chunks of lines; what the slow side computes on.

    Attributes
    ----------
    axis : "columns" or "rows", the lines.
    bounds : array of shape (n_chunks + 1,): chunk c holds lines bounds[c]:bounds[c + 1].
    sizes : array of shape (n_chunks,), each chunk's bytes in fast memory.
    bytes_read : bytes the slow side read from its storage for its own work.
    """

    axis: str
    bounds: np.ndarray
    sizes: np.ndarray
    n_minor: int
    bytes_read: int = 0
    concurrent = True  # the slow side may work in a thread while the fast side solves

    @property
    def n_chunks(self) -> int:
        return len(self.bounds) - 1

    @property
    def n_lines(self) -> int:
        return int(self.bounds[-1])

    @property
    def chunk_of_line(self) -> np.ndarray:
        return np.repeat(np.arange(self.n_chunks), np.diff(self.bounds))

    def read(self, c: int) -> MajorMatrix:
        """Chunk c's lines as a fresh MajorMatrix."""
        raise NotImplementedError

    def line_dots(self, lines, v) -> np.ndarray:
        """Σ_k X_line[k] v[k] for the given lines (Xᵀv on columns, X v on rows)."""
        raise NotImplementedError

    def dot(self, v) -> np.ndarray:
        """The line dots of every line."""
        raise NotImplementedError

    def scatter(self, u) -> np.ndarray:
        """Σ_lines u[line] X_line (X u on columns, Xᵀ u on rows)."""
        raise NotImplementedError

    def sq_norms(self) -> np.ndarray:
        raise NotImplementedError

    def sample_lines(self, rng, n_lines: int) -> np.ndarray:
        """Lines for the slow side to refresh: ``n_lines`` uniformly at random."""
        n_lines = min(n_lines, self.n_lines)
        return np.sort(rng.choice(self.n_lines, size=n_lines, replace=False))


class MatrixStore(SlowStore):
    """The in-memory X as the slow side, cut into chunks of ``chunk_size`` lines."""

    def __init__(self, X, axis: str, chunk_size: int):
        self.axis = axis
        self.matrix = MajorMatrix.from_array(X, axis)
        self.n_minor = self.matrix.n_minor
        n = self.matrix.n_major
        self.bounds = np.unique(np.append(np.arange(0, n, chunk_size), n)).astype(np.int64)
        if self.matrix.dense:
            self.sizes = np.diff(self.bounds) * self.n_minor * self.matrix.data.itemsize
        else:
            counts = np.diff(self.matrix.indptr[self.bounds])
            self.sizes = (
                counts * (self.matrix.data.itemsize + self.matrix.indices.itemsize)
                + (np.diff(self.bounds) + 1) * 8
            )
        self.sizes = self.sizes.astype(np.int64)
        self._view = _as_scipy(self.matrix)

    def read(self, c):
        return _lines(self.matrix, int(self.bounds[c]), int(self.bounds[c + 1]))

    def line_dots(self, lines, v):
        return np.asarray(self._view[lines] @ v, dtype=np.float64).ravel()

    def dot(self, v):
        return self.matrix.dot(v)

    def scatter(self, u):
        return self.matrix.scatter(u)

    def sq_norms(self):
        return self.matrix.sq_norms()


class GridStore(SlowStore):
    """A zarr grid on disk as the slow side: chunks are its column blocks (``axis=
    "columns"``) or its row chunks (``"rows"``), read with the grid's cell reader.

    Labels are read once (n floats). ``classes`` maps them to ±1 for a classifier.
    """

    concurrent = False  # zarr reads from two threads would share the reader's cache

    def __init__(self, grid, axis: str):
        self.grid, self.axis = grid, axis
        n, p = grid.shape
        itemsize = np.dtype(grid.dtype).itemsize
        if axis == "columns":
            self.bounds = np.concatenate([[0], np.cumsum([len(b) for b in grid.blocks])])
            self.n_minor = n
            nnz = grid.cell_nnz.sum(axis=0)
        else:
            self.bounds = np.asarray(grid.row_bounds)
            self.n_minor = p
            nnz = grid.cell_nnz.sum(axis=1)
        self.bounds = self.bounds.astype(np.int64)
        lines = np.diff(self.bounds)
        if grid.is_sparse:
            self.sizes = nnz * (8 + 4) + (lines + 1) * 8  # float64 values once loaded
        else:
            self.sizes = lines * self.n_minor * max(itemsize, 8)
        self.sizes = np.asarray(self.sizes, dtype=np.int64)
        self.bytes_read = 0

    def _cells(self, c) -> list:
        g = self.grid
        if self.axis == "columns":
            return [g.read_cell(r, c) for r in range(g.n_row_chunks)]
        return [g.read_cell(c, b) for b in range(g.n_blocks)]

    def read(self, c):
        cells = self._cells(c)
        if self.grid.is_sparse:
            block = sp.vstack(cells) if self.axis == "columns" else sp.hstack(cells)
            block = block.astype(np.float64)
        else:
            block = np.vstack(cells) if self.axis == "columns" else np.hstack(cells)
            block = block.astype(np.float64, copy=False)
        return MajorMatrix.from_array(block, self.axis)

    def _read_counted(self, c) -> MajorMatrix:
        m = self.read(c)
        self.bytes_read += nbytes(m)
        return m

    def sample_lines(self, rng, n_lines):
        """Whole chunks at random (a cell is read whole), about ``n_lines`` lines."""
        per_chunk = max(1.0, self.n_lines / self.n_chunks)
        k = int(min(self.n_chunks, max(1, round(n_lines / per_chunk))))
        chunks = np.sort(rng.choice(self.n_chunks, size=k, replace=False))
        return np.concatenate([np.arange(self.bounds[c], self.bounds[c + 1]) for c in chunks])

    def line_dots(self, lines, v):
        out = np.empty(len(lines))
        chunk = self.chunk_of_line[lines]
        for c in np.unique(chunk):
            m = self._read_counted(c)
            local = np.asarray(_as_scipy(m) @ v).ravel()
            where = chunk == c
            out[where] = local[lines[where] - self.bounds[c]]
        return out

    def dot(self, v):
        return np.concatenate([self._read_counted(c).dot(v) for c in range(self.n_chunks)])

    def scatter(self, u):
        out = np.zeros(self.n_minor)
        for c in range(self.n_chunks):
            out += self._read_counted(c).scatter(u[self.bounds[c] : self.bounds[c + 1]])
        return out

    def sq_norms(self):
        return np.concatenate([self._read_counted(c).sq_norms() for c in range(self.n_chunks)])

    def labels(self) -> np.ndarray:
        return np.concatenate([self.grid.read_labels(r) for r in range(self.grid.n_row_chunks)])


# ---------------------------------------------------------------------- fast memories


class HostMemory:
    """Fast memory in RAM: a chunk is kept as the MajorMatrix read from the slow side."""

    name = "host"

    def put(self, piece: MajorMatrix):
        return piece

    def assemble(self, residents: list, n_minor: int) -> tuple[MajorMatrix, MajorMatrix]:
        matrix = concatenate(residents, n_minor)
        return matrix, matrix


class DeviceMemory:
    """Fast memory on a GPU: a load copies the chunk's triple to device memory, where the
    epoch kernels (:mod:`dask_scd.kernels.cuda`) read it. The host keeps the chunk as read
    from the slow side: between epochs the fast side's sums over its lines (squared norms,
    Xᵀa for their gaps) run on the host, as in the in-memory GPU engines. Joining the
    resident chunks into one matrix copies on the device; device memory is released with
    the last reference to a chunk."""

    name = "gpu"

    def put(self, piece: MajorMatrix):
        return piece, device.place(piece, "gpu")

    def assemble(self, residents: list, n_minor: int) -> tuple[MajorMatrix, MajorMatrix]:
        matrix = concatenate([host for host, _ in residents], n_minor)
        return matrix, device.join(matrix, [on_device for _, on_device in residents])


# ------------------------------------------------------------------------------ tier


class Tier:
    """A resident set of chunks of ``slow`` in ``fast`` memory, under ``budget`` bytes.

    Raises ValueError if the budget cannot hold the largest chunk.
    """

    def __init__(self, slow: SlowStore, fast, budget: int):
        largest = int(slow.sizes.max())
        if budget < largest:
            raise ValueError(
                f"memory_budget={int(budget)} bytes is smaller than one chunk ({largest} bytes):"
                " raise memory_budget or use smaller chunks (chunk_size)"
            )
        self.slow, self.fast, self.budget = slow, fast, int(budget)
        self.resident: dict = {}  # chunk -> what fast memory holds for it
        self.used = self.peak_bytes = 0
        self.bytes_moved = self.swaps = self.evictions = 0
        self._assembled = None  # (chunks, matrix, epoch matrix, lines) of the last assemble

    def make_resident(self, chunks) -> int:
        """Hold exactly ``chunks``: evict the others first, then load the missing ones.

        Returns the loads this took.
        """
        wanted = {int(c) for c in chunks}
        need = int(self.slow.sizes[list(wanted)].sum()) if wanted else 0
        if need > self.budget:
            raise ValueError(f"chunks of {need} bytes do not fit the budget {self.budget}")
        for c in [c for c in self.resident if c not in wanted]:
            del self.resident[c]
            self.used -= int(self.slow.sizes[c])
            self.evictions += 1
        loads = 0
        for c in sorted(wanted - set(self.resident)):
            self.resident[c] = self.fast.put(self.slow.read(c))
            size = int(self.slow.sizes[c])
            self.used += size
            self.bytes_moved += size
            loads += 1
            self.peak_bytes = max(self.peak_bytes, self.used)
        self.swaps += loads
        assert self.used <= self.budget, (self.used, self.budget)
        return loads

    def matrix(self):
        """(one host matrix of the resident lines in chunk order, their line indices)."""
        _, matrix, _, lines = self._assemble()
        return matrix, lines

    def epoch_matrix(self):
        """The resident lines as the epoch kernels read them: :meth:`matrix` itself in
        RAM, its device copy on a GPU."""
        return self._assemble()[2]

    def _assemble(self):
        chunks = tuple(sorted(self.resident))
        if self._assembled is None or self._assembled[0] != chunks:
            b = self.slow.bounds
            lines = (
                np.concatenate([np.arange(b[c], b[c + 1]) for c in chunks])
                if chunks
                else np.zeros(0, np.int64)
            )
            matrix, epoch_matrix = self.fast.assemble(
                [self.resident[c] for c in chunks], self.slow.n_minor
            )
            self._assembled = (chunks, matrix, epoch_matrix, lines)
        return self._assembled

    def counts(self) -> dict:
        return {
            "bytes_moved": int(self.bytes_moved),
            "swaps": int(self.swaps),
            "evictions": int(self.evictions),
            "peak_bytes": int(self.peak_bytes),
            "memory_budget": int(self.budget),
            "slow_bytes_read": int(self.slow.bytes_read),
        }
