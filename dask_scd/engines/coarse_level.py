"""The coarse level of the Newton engines' conjugate gradients: whole-block shifts.

On one-hot data H is nearly flat along the shift of a whole field against the intercept
or another field, and conjugate gradients with a diagonal preconditioner find those k
directions one at a time (a Criteo-like problem took 113 products for one Newton step).
The additive two-level preconditioner M⁻¹ r = D⁻¹ r + Z (Zᵀ A Z)⁻¹ Zᵀ r (Z: the block
indicators, A: the curvature with the intercept eliminated) adds an exact solve on them;
ZᵀAZ = SᵀDS comes from S = X Z, the block sums of every row, stored compactly
(:class:`RowSums`). Used by the in-memory engine (:mod:`dask_scd.engines.newton.design`,
:mod:`dask_scd.engines.newton.quadratic`) and the dask engine's curvature products
(:mod:`dask_scd.engines.block.wide_newton`); see ``docs/engines/newton.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dask_scd.data.memory import MAX_BLOCKS  # noqa: F401  (the engines' bound, named here)
from dask_scd.engines import cholesky
from dask_scd.kernels import block as block_kernels


def compact_dtype(lo, hi, integral) -> np.dtype:
    """The smallest of uint8, int16 holding every value of columns whose least values are
    ``lo``, greatest ``hi`` and ``integral`` whether they hold integers only, exactly;
    else float64 (uint8 for no column)."""
    if np.all(integral):
        for dtype in (np.uint8, np.int16):
            info = np.iinfo(dtype)
            if info.min <= np.min(lo, initial=0) and np.max(hi, initial=0) <= info.max:
                return np.dtype(dtype)
    return np.dtype(np.float64)


@dataclass(frozen=True)
class RowSums:
    """S = X Z of one set of rows (Z: block indicators), stored compactly: shape
    (n_rows, k) in full.

    ``counts`` (n_rows, m) holds the columns that are not all ones, as uint8 or int16 when
    they are small non-negative or signed integers (the counts of a one-hot or set-valued
    block), else float64; ``column_of`` (k,) gives the stored column of each coarse
    coordinate, −1 for the ones vector (a complete one-hot block and the intercept).
    """

    counts: np.ndarray
    column_of: np.ndarray

    @classmethod
    def from_columns(cls, columns, with_intercept: bool = False) -> RowSums:
        """From the block sums of the rows, one column at a time (``columns`` may be a
        generator: a ones column is dropped as soon as it is seen), and the intercept's
        ones column last when ``with_intercept``."""
        stored, column_of, n_rows = [], [], 0
        for column in columns:
            n_rows = len(column)
            if np.all(column == 1.0):
                column_of.append(-1)
            else:
                column_of.append(len(stored))
                stored.append(column)
        if with_intercept:
            column_of.append(-1)
        dtype = compact_dtype(
            [c.min() for c in stored],
            [c.max() for c in stored],
            [np.array_equal(c, np.round(c)) for c in stored],
        )
        counts = np.empty((n_rows, len(stored)), dtype=dtype)
        for j, column in enumerate(stored):
            counts[:, j] = column
        return cls(counts, np.array(column_of, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.counts.nbytes + self.column_of.nbytes

    def toarray(self) -> np.ndarray:
        """The (n_rows, k) float64 array (for tests)."""
        full = np.ones((self.counts.shape[0], len(self.column_of)))
        for k, c in enumerate(self.column_of):
            if c >= 0:
                full[:, k] = self.counts[:, c]
        return full

    def curvature(self, weights) -> np.ndarray:
        """Sᵀ diag(weights) S, (k, k)."""
        return block_kernels.coarse_stats(self.counts, self.column_of, weights, weights)[1]


def block_index(X, blocks) -> np.ndarray | None:
    """The block of every column of X (−1: none) for ``blocks`` (lists of columns), or None
    for fewer than 2 or more than :data:`MAX_BLOCKS` blocks."""
    if blocks is None or not 2 <= len(blocks) <= MAX_BLOCKS:
        return None
    block_of = np.full(X.shape[1], -1, dtype=np.int64)
    for k, block in enumerate(blocks):
        block_of[block] = k
    return block_of


def memory_coarse(X, blocks) -> tuple[np.ndarray, RowSums] | None:
    """(block of every column, −1 for none; S) of an in-memory sparse X with its pure
    ``blocks`` (:attr:`dask_scd.data.memory.InMemory.pure_blocks`), or None.

    None for dense X, for fewer than 2 or more than :data:`MAX_BLOCKS` blocks, and when
    SᵀDS over the stored (incomplete) columns of S, n·m²/2 small multiply-adds per
    Newton step, would cost more than about ten products with X.
    """
    block_of = block_index(X, blocks)
    if not sp.issparse(X) or block_of is None:
        return None
    n, p = X.shape
    X = sp.csr_matrix(X)  # not a copy when X is CSR
    row_sums = row_sums_of_blocks(X, block_of, len(blocks))
    m = row_sums.counts.shape[1]
    if n * m * (m + 1) / 2 > 10 * X.nnz:
        return None
    return block_of, row_sums


def row_sums_of_blocks(X, block_of, k: int) -> RowSums:
    """S = X Z of a CSR X (Z: the indicators of ``block_of``, k blocks) as :class:`RowSums`
    (the ones columns dropped, the others in the smallest exact dtype of
    :func:`compact_dtype`), in two passes over X's rows and no n × k float matrix: the
    first learns what S's columns hold, the second writes the stored ones. (Forming S as
    a sparse product took 0.3 s on 1M × 100k with 20M non-zeros, three times that from
    CSC; these passes take ~0.05 s.)"""
    n = X.shape[0]
    head = (X.data, X.indices, X.indptr, n, block_of)
    lo, hi, integral, ones = block_kernels.row_block_sums_range(*head, k)
    stored = np.flatnonzero(~ones)
    stored_of = np.full(k, -1, dtype=np.int64)  # −1: the ones vector, not stored
    stored_of[stored] = np.arange(len(stored))
    dtype = compact_dtype(lo[stored], hi[stored], integral[stored])
    counts = np.empty((n, len(stored)), dtype=dtype)
    if len(stored):
        block_kernels.row_block_sums_fill(*head, stored_of, counts)
    return RowSums(counts, stored_of)


def two_level(inverse_diagonal, small, block_of, k: int):
    """r ↦ D⁻¹r + Z small⁻¹ Zᵀr, with Z the indicators of ``block_of`` (−1: no block)
    and ``small`` = ZᵀAZ (k × k); the diagonal alone if ``small`` is not positive
    definite."""
    inside = block_of >= 0
    where = block_of[inside]
    try:
        factor = cholesky.factor(small)
    except np.linalg.LinAlgError:
        return lambda r: inverse_diagonal * r

    def apply(r):
        c = cholesky.solve(factor, np.bincount(where, weights=r[inside], minlength=k))
        out = inverse_diagonal * r
        out[inside] += c[where]
        return out

    return apply


def block_sums(values, block_of, k: int) -> np.ndarray:
    """Zᵀ values: the sum of ``values`` over each block."""
    inside = block_of >= 0
    return np.bincount(block_of[inside], weights=values[inside], minlength=k)
