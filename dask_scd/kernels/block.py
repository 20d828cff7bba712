"""Kernels of the block-SCD engine's coarse step, on compact block row sums.

The coarse space of a row chunk is S = [X_B 1 for every block B] (+ the intercept's
ones), stored compactly (see :func:`dask_scd.solvers.block_ops.block_row_sums`): the
columns that are not all ones, as small integers when they are counts, and a map from
each coarse coordinate to its stored column (−1: the ones vector). These loops read it
without building any O(n·k) array, and sum over the rows strictly in row order (no
BLAS, no fast-math), so the result has the same bits on every worker whatever the
alignment of its arrays — a BLAS ``Sᵀ(S∘w)`` may not.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def _compact_stats(counts, d1, d2):
    """g = [Cᵀd1, Σd1], H = [C 1]ᵀ diag(d2) [C 1] for the stored columns C, in row order."""
    n, m = counts.shape
    g = np.zeros(m + 1)
    h = np.zeros((m + 1, m + 1))
    for i in range(n):
        a = d1[i]
        w = d2[i]
        g[m] += a
        h[m, m] += w
        for j in range(m):
            c = np.float64(counts[i, j])
            g[j] += a * c
            wc = w * c
            h[j, m] += wc
            for k in range(j, m):
                h[j, k] += wc * np.float64(counts[i, k])
    for j in range(m + 1):
        for k in range(j):
            h[j, k] = h[k, j]
    return g, h


@njit(nogil=True, cache=True)
def _compact_matvec(counts, weights, ones_weight):
    """u_i = ones_weight + Σ_j C_ij weights_j, the columns in order."""
    n, m = counts.shape
    u = np.empty(n)
    for i in range(n):
        s = ones_weight
        for j in range(m):
            s += np.float64(counts[i, j]) * weights[j]
        u[i] = s
    return u


def coarse_stats(counts, column_of, d1, d2):
    """Sᵀd1 and Sᵀdiag(d2)S, shapes (k,) and (k, k), for S given compactly.

    ``counts`` (n_rows, m) holds the stored columns, ``column_of`` (k,) the stored column
    of each coarse coordinate or −1 for the ones vector.
    """
    g_c, h_c = _compact_stats(counts, d1, d2)
    where = np.where(column_of < 0, counts.shape[1], column_of)  # the ones are last in g_c
    return g_c[where], h_c[np.ix_(where, where)]


def coarse_matvec(counts, column_of, shift):
    """S·shift, shape (n_rows,), for S given compactly."""
    m = counts.shape[1]
    weights = np.zeros(m)
    ones_weight = 0.0
    for k, c in enumerate(column_of):  # coordinates sharing a column are summed in order
        if c < 0:
            ones_weight += shift[k]
        else:
            weights[c] += shift[k]
    return _compact_matvec(counts, weights, float(ones_weight))
