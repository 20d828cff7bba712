"""X held by rows for the proximal Newton engines' quadratic models, and by columns on demand.

:class:`Design` gives the passes the models read (margins, Xᵀu, Hessian-vector
products), the weighted Gram XᵀDX/n of a set of columns (kept between a path's points for
the squared loss), X's pure blocks and the coarse level of the conjugate gradients'
preconditioner (:mod:`dask_scd.engines.coarse_level`). A pass over many stored entries is
cut into fixed ranges of rows (:func:`row_parts`), summed in order: the same bits on any
number of threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse

from dask_scd.data.memory import pure_blocks
from dask_scd.engines.coarse_level import block_index, memory_coarse
from dask_scd.engines.cost_model import BLAS_SPEEDUP
from dask_scd.kernels import lines, threads
from dask_scd.kernels import newton as kernels
from dask_scd.kernels.layout import MajorMatrix

# Above this many coordinates a Gram matrix (k² float64) is not formed.
GRAM_MAX = 2000
# Rows per chunk of a dense weighted Gram: ~4 MiB float64 temporaries.
_CHUNK_BYTES = 4 << 20
# Scatter passes (Xᵀu, XᵀDXv by rows) over at least threads.MIN_ENTRIES stored entries
# are summed over this many fixed ranges of rows, run on threads where there are: their
# rounding depends on the data's size, never on the number of cores.
_SCATTER_PARTS = 4
_NO_CURVATURE = np.zeros(0)


class RowsByColumns:
    """Dense X stored by columns (Fortran order), read as rows without copying it.

    X v and Xᵀu, the passes of a Newton step, run on the columns' kernels (X v skips the
    zero entries of v: on an L1 model's sparse θ or Δ it reads their columns alone); any
    other use of the rows' layout (a kernel over row ranges, the rows' arrays) makes the
    row-ordered copy once, on first use.
    """

    dense = True

    def __init__(self, X: np.ndarray, columns: MajorMatrix):
        self.X, self.columns = X, columns
        self.n_major, self.n_minor = X.shape
        self._rows = None

    @property
    def stored(self) -> int:
        return self.n_major * self.n_minor

    def dot(self, v, squared: bool = False) -> np.ndarray:
        """X v (X∘X v if squared)."""
        return self.columns.scatter(v, squared)

    def scatter(self, u, squared: bool = False) -> np.ndarray:
        """Xᵀu ((X∘X)ᵀu if squared)."""
        return self.columns.dot(u, squared)

    def sq_norms(self, weights=None) -> np.ndarray:
        if weights is not None:
            return self.copied.sq_norms(weights)
        return self.columns.scatter(np.ones(self.n_minor), squared=True)

    @property
    def copied(self) -> MajorMatrix:
        """The rows' own layout, copied once."""
        if self._rows is None:
            self._rows = MajorMatrix.from_array(self.X, "rows")
        return self._rows

    def __getattr__(self, name):
        return getattr(self.copied, name)


@dataclass
class Design:
    """X by rows (margins, gradients, Hessian products, Gram), by columns on demand."""

    X: object
    rows: MajorMatrix
    column_nnz: np.ndarray  # non-zeros per column
    gram_flops: float  # Σ_i nnz_i²: a weighted Gram of all columns
    blocks: object = None  # a function giving the pure blocks (or None), called once
    _columns: MajorMatrix | None = None
    # The curvature D is the identity (squared loss, no sample weights) and the design is
    # kept between runs: Gram blocks are then kept too (:meth:`gram`).
    unit_curvature: bool = False
    _kept_gram: tuple | None = None
    _kept_shift: object = None  # _KeptShift
    _gram_spent: float = 0.0
    _system: np.ndarray | None = None
    _scratch: np.ndarray | None = None  # the dense Gram's scaled chunk

    @cached_property
    def kernel(self) -> np.ndarray:
        """XXᵀ, dense float64 n × n, formed once (the L2 steps of
        :mod:`dask_scd.engines.newton.kernel_step`)."""
        X = self.by_rows
        if self.rows.dense:
            A = np.asarray(X, dtype=np.float64)
            return A @ A.T
        return np.ascontiguousarray((X @ X.T).toarray(), dtype=np.float64)

    def _chunk_buffer(self, rows: int, columns: int) -> np.ndarray:
        """A float64 rows × columns scratch array, kept for the next Gram of the fit."""
        kept = self._scratch
        if kept is None or kept.shape[0] < rows or kept.shape[1] != columns:
            kept = self._scratch = np.empty((rows, columns))
        return kept

    def system_buffer(self, n: int) -> np.ndarray:
        """An F-ordered float64 n × n scratch array, the same one at every call (each
        kernel step writes its system there and LAPACK factors it in place)."""
        if self._system is None or self._system.shape != (n, n):
            self._system = np.empty((n, n), order="F")
        return self._system

    @property
    def kernel_flops(self) -> float:
        """The multiply-adds of forming :attr:`kernel` (a dense one at BLAS speed)."""
        n = self.rows.n_major
        if self.rows.dense:
            return n * float(n) * self.rows.n_minor / BLAS_SPEEDUP
        counts = self.column_nnz.astype(np.float64)
        return float(counts @ counts)

    @cached_property
    def row_sq_norms(self) -> np.ndarray:
        """‖x_i‖² of every row, computed once."""
        return self.rows.sq_norms()

    @cached_property
    def column_sq_norms(self) -> np.ndarray:
        """‖x_j‖² of every column, computed once."""
        rows = self.rows
        if isinstance(rows, MajorMatrix) and rows.dense:  # one sweep along the rows
            return rows.minor_sq_norms()
        return self.columns.sq_norms()

    @property
    def pure_blocks(self) -> list | None:
        """X's pure blocks (:func:`dask_scd.data.memory.pure_blocks`), found once."""
        if self.blocks is None:
            self.blocks = lambda: pure_blocks(self.by_rows)
        if callable(self.blocks):
            self.blocks = self.blocks() or []
        return self.blocks or None

    @cached_property
    def coarse(self):
        """(block of every column, S) for the CG preconditioner's coarse level, or None
        (:func:`dask_scd.engines.coarse_level.memory_coarse`), built once."""
        return memory_coarse(self.by_rows, self.pure_blocks)

    @property
    def block_of(self) -> np.ndarray | None:
        """The pure block of every column (−1: none), or None without 2 to 256 blocks."""
        coarse = self.__dict__.get("coarse")  # where it was built
        if coarse is not None:
            return coarse[0]
        return block_index(self.X, self.pure_blocks)

    @property
    def by_rows(self):
        """X as a CSR matrix over the arrays of ``rows`` (no copy), or dense X."""
        rows = self.rows
        if rows.dense:
            return self.X
        return scipy.sparse.csr_matrix(
            (rows.data, rows.indices, rows.indptr), shape=(rows.n_major, rows.n_minor), copy=False
        )

    @classmethod
    def from_array(cls, X, blocks=None, by_rows=None, column_nnz=None) -> Design:
        """X by rows; ``blocks``: a function giving its pure blocks when a coarse level
        first asks (default: detected on X); ``by_rows``: X as CSR where the caller has
        it (a CSC X is converted once, not by every reader of its rows); ``column_nnz``:
        the stored values of each column of sparse X, where the caller has counted them."""
        source = X if by_rows is None else by_rows
        n, p = X.shape
        columns = None
        if (
            isinstance(source, np.ndarray)
            and source.dtype == np.float64
            and source.flags["F_CONTIGUOUS"]
            and not source.flags["C_CONTIGUOUS"]
        ):
            columns = MajorMatrix.from_array(source, "columns")  # a view
            rows = RowsByColumns(source, columns)
        else:
            rows = MajorMatrix.from_array(source, "rows")
        if rows.dense:
            column_nnz = np.full(p, n, dtype=np.int64)
            gram_flops = n * float(p) ** 2 / BLAS_SPEEDUP
        else:
            if column_nnz is None:
                column_nnz = lines.index_counts(rows.indices, p)
            gram_flops = float(np.sum(np.diff(rows.indptr).astype(np.float64) ** 2))
        return cls(X, rows, column_nnz, gram_flops, blocks, _columns=columns)

    def signed_scatter(self, u, curv=None, split: bool = True) -> tuple:
        """(Xᵀ(u ∘ [u < 0]), Xᵀ(u ∘ [u > 0])), one pass over the rows; with ``curv`` d,
        also ((X∘X)ᵀd, Xᵀd) from the same pass (the diagonal and the intercept's column of
        XᵀDX, un-normalized). Without ``split`` (the caller reads only their sum), X by
        columns gives (Xᵀu, 0) from one pass instead of two."""
        rows = self.rows
        p = rows.n_minor
        u = np.ascontiguousarray(u, dtype=np.float64)
        if isinstance(rows, RowsByColumns):
            return _signed_by_columns(rows.columns, u, curv, split)
        d = _NO_CURVATURE if curv is None else np.ascontiguousarray(curv, dtype=np.float64)
        ranges = row_parts(rows)
        width = 2 if curv is None else 4
        outs = [tuple(np.empty(p) for _ in range(width)) for _ in ranges]

        def part(k):
            lo, hi = ranges[k]
            sub = rows.lines(lo, hi)
            sums = outs[k] if curv is not None else outs[k] + (_NO_CURVATURE, _NO_CURVATURE)
            kernels.signed_scatter(
                sub.data,
                sub.indices,
                sub.indptr,
                sub.dense,
                hi - lo,
                p,
                u[lo:hi],
                sums[0],
                sums[1],
                d[lo:hi],
                sums[2],
                sums[3],
            )

        return run_parts(rows, part, outs)

    @cached_property
    def nnz(self) -> float:
        """X's stored values (every value of a dense X), counted once."""
        return float(self.column_nnz.sum())

    @property
    def columns(self) -> MajorMatrix:
        if self._columns is None:
            self._columns = MajorMatrix.from_array(self.X, "columns")
        return self._columns

    def gram(self, working, weights, intercept) -> np.ndarray:
        """XᵀDX/n on the columns ``working`` (+ the column of ones), float64."""
        if self.unit_curvature:
            return self._unit_gram(working, weights, intercept)
        return self._normalized(self._sums(working, weights, intercept))

    def _unit_gram(self, working, weights, intercept) -> np.ndarray:
        """XᵀX/n on ``working`` from the kept block when it holds those columns; else
        the block of those and the kept ones together (the working sets of a path's
        points mostly grow), or of all columns once the blocks computed so far cost as
        much as they do (then at most twice the least possible), kept in its place.

        A block that grows from sparse rows adds only the products of its new columns:
        the kept ones' sums are the same bits a new block would compute (the same
        products, added row by row in the same order)."""
        kept = self._kept_gram
        if kept is None or kept[0] != intercept or not np.all(kept[2][working] >= 0):
            same = kept is not None and kept[0] == intercept
            columns = np.union1d(kept[1], working) if same else working
            p = self.rows.n_minor
            share = float(self.column_nnz[columns].sum()) / max(self.nnz, 1.0)
            held = float(self.column_nnz[kept[1]].sum()) / max(self.nnz, 1.0) if same else 0.0
            # the products of the pairs not held, and a pass (growing: the new columns'
            # rows alone)
            read = (share - held) * self.gram_flops / max(self.nnz, 1.0) if same else 1.0
            self._gram_spent += self.nnz * read + self.gram_flops * (share * share - held * held)
            if p <= GRAM_MAX and self.nnz + self.gram_flops <= self._gram_spent:
                columns = np.arange(p)  # as much as the blocks so far cost: ski rental
            elif len(columns) > GRAM_MAX:
                columns = working
            position = np.full(self.rows.n_minor, -1, dtype=np.int64)
            position[columns] = np.arange(len(columns))
            if same and not self.rows.dense and np.all(position[kept[1]] >= 0):
                sums = self._grown_sums(kept, columns, position, intercept)
            else:
                sums = self._sums(columns, weights, intercept)
            kept = (intercept, columns, position, self._normalized(sums), sums)
            self._kept_gram = kept
        index = kept[2][working]
        if intercept:
            index = np.append(index, len(kept[1]))
        return kept[3][np.ix_(index, index)]

    def _grown_sums(self, kept, columns, position, intercept) -> np.ndarray:
        """The un-normalized upper triangle of XᵀX on ``columns`` ⊇ the kept ones: the kept
        sums moved to their new places, the new columns' pairs from one pass."""
        old = position[kept[1]]
        if intercept:
            old = np.append(old, len(columns))
        k = len(columns) + int(intercept)
        out = np.zeros((k, k))
        out[np.ix_(old, old)] = kept[4]
        new = np.ones(k, dtype=np.bool_)
        new[old] = False
        rows, cols = self.rows, self.columns
        added = columns[new[: len(columns)]]
        kernels.gram_of_new_columns(
            rows.data,
            rows.indices,
            rows.indptr,
            cols.data,
            cols.indices,
            cols.indptr,
            added,
            position,
            new,
            intercept,
            out,
        )
        return out

    def _normalized(self, sums) -> np.ndarray:
        """XᵀDX/n from the sums of its upper triangle (sparse rows) or all of it (dense)."""
        if not self.rows.dense:
            sums = np.triu(sums) + np.triu(sums, 1).T
        return sums / self.rows.n_major

    def _sums(self, working, weights, intercept) -> np.ndarray:
        """Σ_i d_i x_i x_iᵀ on ``working`` (+ the ones column): its upper triangle from
        sparse rows, all of it from dense ones."""
        n = self.rows.n_major
        k = len(working) + int(intercept)
        out = np.zeros((k, k))
        if self.rows.dense:
            self._dense_gram(working, weights, intercept, out)
        else:
            position = np.full(self.rows.n_minor, -1, dtype=np.int64)
            position[working] = np.arange(len(working))
            kernels.weighted_gram(
                self.rows.data,
                self.rows.indices,
                self.rows.indptr,
                n,
                position,
                weights,
                intercept,
                out,
            )
        return out

    def _dense_gram(self, working, weights, intercept, out) -> None:
        """Σ d_i x_i x_iᵀ as (√d·X)ᵀ(√d·X) over row chunks (numpy hands a product of a
        matrix with its own transpose to BLAS syrk: half the multiply-adds, no gather of X
        when every column is in); the intercept's row and column by a product with d."""
        A = np.asarray(self.X)
        p = A.shape[1]
        every = len(working) == p  # the whole matrix: no gather of columns
        m = len(working)
        gram = out[:m, :m]  # a view: the chunks' sums land in out
        side = np.zeros(m)
        step = max(256, _CHUNK_BYTES // (8 * max(p, 1)))
        buffer = self._chunk_buffer(min(step, A.shape[0]), m)
        for start in range(0, A.shape[0], step):
            chunk = A[start : start + step] if every else A[start : start + step][:, working]
            w = weights[start : start + step]
            if intercept:
                side += w @ chunk
            # √d·chunk, in float64, written where the last chunk was: a fresh array of
            # 4 MiB a chunk cost its page faults (dense 50k × 100: 26 → 23 ms a Gram)
            scaled = np.multiply(chunk, np.sqrt(w)[:, None], out=buffer[: len(chunk)])
            gram += scaled.T @ scaled
        if intercept:
            out[m, :m] = side
            out[:m, m] = side
            out[m, m] = float(weights.sum())


def _signed_by_columns(columns: MajorMatrix, u, curv, split: bool = True) -> tuple:
    """:meth:`Design.signed_scatter` from X by columns: one pass for the two signed parts
    (two sums along each column, the same bits as two dots; 500 × 2000: 0.38 ms against
    0.73), or one for their sum alone (``split`` False: the second part is 0), the
    curvature sums in two more."""
    if split:
        parts = columns.dot_pair(np.minimum(u, 0.0), np.maximum(u, 0.0))
    else:
        parts = (columns.dot(u), np.zeros(columns.n_major))
    if curv is None:
        return parts
    d = np.ascontiguousarray(curv, dtype=np.float64)
    return (*parts, columns.dot(d, squared=True), columns.dot(d))


def row_parts(rows) -> list[tuple[int, int]]:
    """The fixed ranges of ``rows`` a scatter pass sums in order."""
    parts = _SCATTER_PARTS if rows.stored >= threads.MIN_ENTRIES else 1
    return threads.line_ranges(None if rows.dense else rows.indptr, rows.n_major, parts)


def run_parts(rows, part, outs: list) -> tuple:
    """part(0), …, part(k − 1) (on threads where a pass of ``rows`` may use them), each
    writing its tuple of arrays ``outs[k]``; returns outs[0], the others added in order."""
    count = len(outs)
    if count > 1 and threads.usable(rows.stored) > 1:
        threads.run_all([lambda k=k: part(k) for k in range(count)])
    else:
        for k in range(count):
            part(k)
    total = outs[0]
    for more in outs[1:]:
        for mine, theirs in zip(total, more):
            mine += theirs
    return total
