"""Numba kernels of the block shifts of an L1 Newton model
(:func:`dask_scd.engines.newton.l1_model.block_shift`).

Every non-zero coefficient of a pure block moves by the same c_B (and the intercept by
c_b): the model along those k directions is a k × k quadratic plus l1·Σ_j |θ_j + Δ_j + c_B|.
:func:`shift_stats` reads its quadratic part from one pass over the rows,
:func:`shift_solve` minimizes it by exact coordinate steps over the sorted kinks.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dask_scd.kernels.lines import line as _line
from dask_scd.kernels.lines import minor_at

# Rows of S gathered densely before one matrix product adds their SᵀDS (shift_stats).
_SHIFT_BATCH = 128


@njit(nogil=True, cache=True)
def shift_stats(
    data, indices, indptr, dense, n_rows, n_cols, shifted, k, residual, curv, intercept, grad, hess
):
    """The quadratic model along the block shifts: ``grad = Sᵀr``, ``hess = SᵀDS`` (both
    un-normalized), one pass over the rows.

    S (n × k, + a ones column when ``intercept``) holds for every row the sum of its
    values in the shifted columns of each block: ``shifted[j]`` is column j's block, −1
    for a column that does not move. ``residual`` is r = g + D·XΔ, ``curv`` is D.

    When rows touch many of the k blocks (one-hot fields: every row one value in every
    field), S's rows are gathered densely, :data:`_SHIFT_BATCH` at a time, and each batch
    adds S_bᵀ(D_b S_b) by one BLAS product; otherwise each row adds the products of the
    blocks it touches (:func:`_shift_stats_rows`). The two differ by rounding.
    """
    m = k + 1 if intercept else k
    stored = data.shape[0] if not dense else n_rows * n_cols
    if m > 256 or 3.0 * stored < m * n_rows:
        _shift_stats_rows(
            data,
            indices,
            indptr,
            dense,
            n_rows,
            n_cols,
            shifted,
            k,
            residual,
            curv,
            intercept,
            grad,
            hess,
        )
        return
    grad[:] = 0.0
    hess[:, :] = 0.0
    batch = _SHIFT_BATCH
    Z = np.zeros((batch, m))
    DZ = np.zeros((batch, m))
    r = np.zeros(batch)
    for lo in range(0, n_rows, batch):
        rows = min(batch, n_rows - lo)
        for t in range(rows):
            i = lo + t
            start, end = _line(dense, indptr, i, n_cols)
            values = data[start:end]  # slices: see lines.minor_at
            minors = indices[start:end]
            for q in range(values.shape[0]):
                b = shifted[minor_at(dense, minors, q)]
                if b >= 0:
                    Z[t, b] += values[q]
            if intercept:
                Z[t, k] = 1.0
            d = curv[i]
            for b in range(m):
                DZ[t, b] = d * Z[t, b]
            r[t] = residual[i]
        if rows < batch:  # the last batch: the rows past ``rows`` add nothing
            Z[rows:, :] = 0.0
            DZ[rows:, :] = 0.0
            r[rows:] = 0.0
        hess += np.dot(Z.T, DZ)
        grad += np.dot(Z.T, r)
        Z[:rows, :] = 0.0


@njit(nogil=True, cache=True)
def _shift_stats_rows(
    data, indices, indptr, dense, n_rows, n_cols, shifted, k, residual, curv, intercept, grad, hess
):
    """:func:`shift_stats` row by row: each row's k_i² products of the blocks it touches."""
    m = k + 1 if intercept else k
    grad[:] = 0.0
    hess[:, :] = 0.0
    sums = np.zeros(m)
    seen = np.zeros(m, dtype=np.bool_)
    touched = np.empty(m, dtype=np.int64)
    for i in range(n_rows):
        count = 0
        start, end = _line(dense, indptr, i, n_cols)
        values = data[start:end]
        minors = indices[start:end]
        for q in range(values.shape[0]):
            b = shifted[minor_at(dense, minors, q)]
            if b < 0:
                continue
            if not seen[b]:
                seen[b] = True
                touched[count] = b
                count += 1
            sums[b] += values[q]
        if intercept:
            touched[count] = k
            sums[k] = 1.0
            seen[k] = True
            count += 1
        r, d = residual[i], curv[i]
        for a in range(count):
            ba = touched[a]
            va = sums[ba]
            grad[ba] += va * r
            dva = d * va
            for c in range(count):
                hess[ba, touched[c]] += dva * sums[touched[c]]
        for a in range(count):
            sums[touched[a]] = 0.0
            seen[touched[a]] = False


@njit(nogil=True, cache=True)
def shift_solve(grad, hess, starts, breakpoints, l1, sweeps, tol, shift):
    """Coordinate descent on min_c gᵀc + ½cᵀHc + l1·Σ_B Σ_{j∈B} |c_B − t_j|, exact in each
    coordinate; returns the sweeps made.

    Block B's kinks t_j = −(θ_j + Δ_j) are ``breakpoints[starts[B]:starts[B+1]]``, sorted;
    a coordinate past the last block (the intercept) has none. ``shift`` (in/out) holds c.
    """
    m = len(grad)
    n_blocks = len(starts) - 1
    for sweep in range(1, sweeps + 1):
        moved = 0.0
        for b in range(m):
            h = hess[b, b]
            if h <= 0.0:
                continue
            q = grad[b]
            for c in range(m):
                if c != b:
                    q += hess[b, c] * shift[c]
            if b >= n_blocks:
                new = -q / h
            else:
                lo, hi = starts[b], starts[b + 1]
                size = hi - lo
                # The smallest k with c_k = −(q + l1(2k − size))/h ≤ t_(k) (t_(size) = +∞):
                # c_k falls and t_(k) rises with k.
                left, right = 0, size
                while left < right:
                    mid = (left + right) // 2
                    if -(q + l1 * (2 * mid - size)) / h <= breakpoints[lo + mid]:
                        right = mid
                    else:
                        left = mid + 1
                new = -(q + l1 * (2 * left - size)) / h
                if left > 0 and new < breakpoints[lo + left - 1]:
                    new = breakpoints[lo + left - 1]  # at the kink
            moved = max(moved, abs(new - shift[b]) * np.sqrt(h))
            shift[b] = new
        if moved <= tol:
            return sweep
    return sweeps
