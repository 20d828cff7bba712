"""Kernels of the block-SCD engine's row-chunk tasks: loss derivatives, line-search
trials, and the coarse step on compact block row sums.

The coarse space of a row chunk is S = [X_B 1 for every block B] (+ the intercept's
ones), stored compactly (see :func:`dask_scd.engines.block.block_coarse.block_row_sums`): the
columns that are not all ones, as small integers when they are counts, and a map from
each coarse coordinate to its stored column (−1: the ones vector). These loops read it
without building any O(n·k) array, and sum over the rows strictly in row order (no
BLAS, no fast-math), so the result has the same bits on every worker whatever the
alignment of its arrays — a BLAS ``Sᵀ(S∘w)`` may not.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from dask_scd.kernels.lines import line as _line
from dask_scd.kernels.lines import minor_at
from dask_scd.kernels.scalar import LOGISTIC, SQUARED, SQUARED_HINGE, TRIAL_STEPS
from dask_scd.kernels.scalar import clip as _clip
from dask_scd.kernels.scalar import loss as _loss
from dask_scd.kernels.scalar import prox_newton as _prox_newton
from dask_scd.kernels.scalar import sigmoid as _sigmoid

# The logistic trials use the product form below while |step·d·x| stays under this: there
# 1 + p·expm1(v) ≥ e^{-8} keeps ~13 correct digits even when p rounds to 1.
_PRODUCT_FORM_MAX = 8.0


# ----------------------------------------------------------------- loss derivatives


@njit(inline="always")
def _derivative_pair(loss, yi, z):
    """(ℓ'(z), ℓ''(z)) of one example. Logistic: σ(−yz) and σ(yz)σ(−yz) = e/(1 + e)²
    with e = exp(−|yz|), one exponential and no 1 − σ cancellation."""
    if loss == SQUARED:
        return z - yi, 1.0
    if loss == LOGISTIC:
        u = yi * z
        e = math.exp(-abs(u))
        small = e / (1.0 + e)
        return -yi * (small if u >= 0.0 else 1.0 / (1.0 + e)), small / (1.0 + e)
    t = 1.0 - yi * z
    if t > 0.0:
        if loss == SQUARED_HINGE:
            return -2.0 * yi * t, 2.0
        return -yi, 0.0
    return 0.0, 0.0


@njit(nogil=True, cache=True)
def derivatives(loss, y, margins):
    """ℓ'(ŷ) and ℓ''(ŷ) in one pass (one exponential per example for the logistic loss)."""
    n = margins.shape[0]
    d1 = np.empty(n)
    d2 = np.empty(n)
    for i in range(n):
        d1[i], d2[i] = _derivative_pair(loss, y[i], margins[i])
    return d1, d2


# ----------------------------------------------------------------- line-search trials


@njit(inline="always")
def _add_changes(loss, yi, z, v, steps, quarters, out, j):
    """out[k, j] += ℓ(z + steps[k]·v) − ℓ(z) for every step size k.

    Logistic, with u = −yz and p = σ(u): ℓ(z + a·v) − ℓ(z) = log1p(p·expm1(−y·a·v)), and
    when the steps are 1, 1/4, 1/16, … the expm1 of each comes from the smallest one by
    doubling, expm1(2s) = E(E + 2): one exp, one expm1 and K log1p per non-zero instead
    of 2(K + 1) transcendental calls, and no cancellation between two losses.
    """
    K = steps.shape[0]
    w = -yi * v
    if loss == LOGISTIC and quarters and abs(w) <= _PRODUCT_FORM_MAX:
        p = _sigmoid(-yi * z)
        e = math.expm1(w * steps[K - 1])
        for k in range(K - 1, -1, -1):
            out[k, j] += math.log1p(p * e)
            if k > 0:
                e = e * (e + 2.0)
                e = e * (e + 2.0)
        return
    base = _loss(loss, yi, z)
    for k in range(K):
        out[k, j] += _loss(loss, yi, z + steps[k] * v) - base


@njit(nogil=True, cache=True)
def coordinate_trials(
    data,
    indices,
    indptr,
    dense,
    n_major,
    n_minor,
    by_columns,
    y,
    margins,
    direction,
    steps,
    quarters,
    loss,
    weights=None,
):
    """(K, n_columns): Σ_i v_i (ℓ(ŷ_i + steps[k]·d_j·x_ij) − ℓ(ŷ_i)) over column j's
    non-zeros, with sample weights v (``weights``; None: v = 1).

    The per-coordinate line search of a *pure* block: its columns touch disjoint examples,
    so the objective change of the block step splits over coordinates.
    """
    out = np.zeros((steps.shape[0], n_major if by_columns else n_minor))
    row = np.zeros((steps.shape[0], 1))
    for r in range(n_major):
        start, end = _line(dense, indptr, r, n_minor)
        values = data[start:end]  # slices: see lines.minor_at
        minors = indices[start:end]
        for q in range(values.shape[0]):
            x = np.float64(values[q])
            if x == 0.0:
                continue
            m = minor_at(dense, minors, q)
            i, j = (m, r) if by_columns else (r, m)
            if direction[j] == 0.0:
                continue
            # None is a type of its own: numba compiles the unweighted kernel without this
            # branch, the changes added straight into out.
            if weights is None:
                _add_changes(loss, y[i], margins[i], direction[j] * x, steps, quarters, out, j)
            elif weights[i] != 0.0:
                v = direction[j] * x
                _add_weighted(loss, y[i], margins[i], v, steps, quarters, weights[i], row, out, j)
    return out


@njit(nogil=True, cache=True)
def line_trials(y, margins, u, steps, quarters, loss, weights=None):
    """(K,): Σ_i v_i (ℓ(ŷ_i + steps[k]·u_i) − ℓ(ŷ_i)), the whole-block line search, with
    sample weights v (``weights``; None: v = 1)."""
    out = np.zeros((steps.shape[0], 1))
    row = np.zeros((steps.shape[0], 1))
    for i in range(margins.shape[0]):
        if u[i] == 0.0:
            continue
        if weights is None:  # compiled without the weighted branch, as coordinate_trials
            _add_changes(loss, y[i], margins[i], u[i], steps, quarters, out, 0)
        elif weights[i] != 0.0:
            _add_weighted(loss, y[i], margins[i], u[i], steps, quarters, weights[i], row, out, 0)
    return out[:, 0]


@njit(inline="always")
def _add_weighted(loss, yi, z, v, steps, quarters, weight, row, out, j):
    """out[k, j] += weight·(ℓ(z + steps[k]·v) − ℓ(z)), the example's changes summed in
    ``row`` (K, 1) first."""
    row[:, 0] = 0.0
    _add_changes(loss, yi, z, v, steps, quarters, row, 0)
    for k in range(steps.shape[0]):
        out[k, j] += weight * row[k, 0]


def are_quarters(steps) -> bool:
    """Whether the step sizes are 1, 1/4, 1/16, … (the doubling trick applies)."""
    return bool(np.array_equal(steps, TRIAL_STEPS[: len(steps)]))


# ----------------------------------------------------------------- the coarse step


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


@njit(nogil=True, cache=True)
def major_sums(values, indptr, out):
    """out[j] = Σ values[indptr[j]:indptr[j + 1]], each line summed in storage order (the
    bits of ``np.bincount`` over the line indices, without building them)."""
    for j in range(len(out)):
        s = 0.0
        for k in range(indptr[j], indptr[j + 1]):
            s += values[k]
        out[j] = s


@njit(inline="always")
def _block_sums_of_row(data, indices, indptr, i, block_of, row):
    """row[b] += Σ of row i's values in block b (storage order; −1: no block)."""
    for idx in range(indptr[i], indptr[i + 1]):
        b = block_of[indices[idx]]
        if b >= 0:
            row[b] += data[idx]


@njit(nogil=True, cache=True)
def row_block_sums_range(data, indices, indptr, n_rows, block_of, k):
    """What S = X Z (Z: the indicators of ``block_of``, −1 for no block) holds, without
    forming it: per column of S, its smallest and largest value, whether all its values
    are integers and whether all are 1. One pass over the CSR rows; each row's sums are
    taken in storage order (the bits of ``X @ Z`` by scipy)."""
    lo = np.full(k, np.inf)
    hi = np.full(k, -np.inf)
    integral = np.ones(k, dtype=np.bool_)
    ones = np.ones(k, dtype=np.bool_)
    row = np.zeros(k)
    for i in range(n_rows):
        _block_sums_of_row(data, indices, indptr, i, block_of, row)
        for b in range(k):
            v = row[b]
            lo[b] = min(lo[b], v)
            hi[b] = max(hi[b], v)
            if v != np.floor(v):
                integral[b] = False
            if v != 1.0:
                ones[b] = False
            row[b] = 0.0
    return lo, hi, integral, ones


@njit(nogil=True, cache=True)
def row_block_sums_fill(data, indices, indptr, n_rows, block_of, stored_of, out):
    """out[i, stored_of[b]] = (X Z)[i, b] for every block b with stored_of[b] ≥ 0, the sums
    as in :func:`row_block_sums_range`, cast to out's dtype (exact where the caller chose
    it from that range)."""
    k = stored_of.shape[0]
    row = np.zeros(k)
    for i in range(n_rows):
        _block_sums_of_row(data, indices, indptr, i, block_of, row)
        for b in range(k):
            c = stored_of[b]
            if c >= 0:
                out[i, c] = row[b]
            row[b] = 0.0


# ------------------------------------------------- fused pure-block passes (in memory)


@njit(inline="always")
def _entry(value, i):
    """Row i's entry of a pure cell by rows; an empty ``value``: every entry is 1 (one-hot)."""
    return value[i] if value.shape[0] else 1.0


@njit(nogil=True, cache=True)
def pure_apply(column, value, delta, margins):
    """margins += X_cell Δ in place for a pure cell by rows (:func:`rows_by_blocks`): each
    margin takes one product, the bits of ŷ + X_cell Δ."""
    for i in range(margins.shape[0]):
        j = column[i]
        if j >= 0:
            margins[i] += _entry(value, i) * delta[j]


@njit(nogil=True, cache=True)
def pure_stats(prev_column, prev_value, prev_delta, shift, column, value, y, margins, loss, g, h):
    """One pass over the rows: the last block's step on the margins (a pure cell by rows,
    ``prev_delta`` empty for none; ``shift``: the intercept's), then this pure cell's
    g_j = Σ_i x_ij ℓ'(ŷ_i) and h_j = Σ_i x_ij² ℓ''(ŷ_i), summed in row order (the order
    of a column-major cell's entries: the same sums)."""
    g[:] = 0.0
    h[:] = 0.0
    # The last block's step is applied here, written out in both passes: as a shared
    # inline function (its test inside the loop) the fused pass ran 1.5x slower.
    applying = prev_delta.shape[0] > 0
    for i in range(margins.shape[0]):
        z = margins[i] + shift
        if applying:
            p = prev_column[i]
            if p >= 0:
                z += _entry(prev_value, i) * prev_delta[p]
        margins[i] = z
        j = column[i]
        if j >= 0:
            d1, d2 = _derivative_pair(loss, y[i], z)
            x = _entry(value, i)
            g[j] += x * d1
            h[j] += x * x * d2


@njit(nogil=True, cache=True)
def shift_stats(prev_column, prev_value, prev_delta, y, margins, loss):
    """The last block's step on the margins (as in :func:`pure_stats`), then
    (Σ_i ℓ'(ŷ_i), Σ_i ℓ''(ŷ_i)): the intercept's statistics."""
    s = 0.0
    t = 0.0
    applying = prev_delta.shape[0] > 0
    for i in range(margins.shape[0]):
        z = margins[i]
        if applying:
            p = prev_column[i]
            if p >= 0:
                z += _entry(prev_value, i) * prev_delta[p]
        margins[i] = z
        d1, d2 = _derivative_pair(loss, y[i], z)
        s += d1
        t += d2
    return s, t


@njit(nogil=True, cache=True)
def rows_by_columns(indptr, indices, data, lo, hi, position, n_columns):
    """Rows lo ≤ r < hi of a CSR matrix as a column-major (CSC) matrix of the columns
    whose ``position`` is ≥ 0, renumbered by it: (indptr, row indices from 0, values),
    rows ascending within each column. One counting pass and one filling pass."""
    starts = np.zeros(n_columns + 1, dtype=np.int64)
    for k in range(indptr[lo], indptr[hi]):
        c = position[indices[k]]
        if c >= 0:
            starts[c + 1] += 1
    for c in range(n_columns):
        starts[c + 1] += starts[c]
    rows = np.empty(starts[n_columns], dtype=np.int32)
    values = np.empty(starts[n_columns], dtype=np.float64)
    fill = starts[:n_columns].copy()
    for r in range(lo, hi):
        for k in range(indptr[r], indptr[r + 1]):
            c = position[indices[k]]
            if c >= 0:
                rows[fill[c]] = r - lo
                values[fill[c]] = data[k]
                fill[c] += 1
    return starts, rows, values


@njit(nogil=True, cache=True)
def rows_by_blocks(indptr, indices, data, lo, hi, position, block_of, offsets):
    """Rows lo ≤ r < hi of a CSR matrix by blocks and rows, for the fused passes: for
    block b and row r, the column (within b) of the row's entry in b, −1 for none, and
    its value; with which blocks some row holds two entries of (impure: their by-rows
    form is not used). One pass over the rows, writing each block's arrays in row order."""
    n_blocks = offsets.shape[0] - 1
    n = hi - lo
    column = np.full((n_blocks, n), -1, dtype=np.int32)
    value = np.zeros((n_blocks, n))
    impure = np.zeros(n_blocks, dtype=np.bool_)
    for r in range(lo, hi):
        for k in range(indptr[r], indptr[r + 1]):
            c = position[indices[k]]
            if c < 0:
                continue
            b = block_of[c]
            if column[b, r - lo] >= 0:
                impure[b] = True
            else:
                column[b, r - lo] = c - offsets[b]
                value[b, r - lo] = data[k]
    return column, value, impure


@njit(nogil=True, cache=True)
def pure_rmatvec_pair(column, value, pos, neg, width):
    """(X_cellᵀ pos, X_cellᵀ neg) of a pure cell by rows, the rows read in order: each
    column's sum in row order, as a column-major cell's entries give it."""
    out_pos = np.zeros(width)
    out_neg = np.zeros(width)
    for i in range(column.shape[0]):
        j = column[i]
        if j >= 0:
            x = _entry(value, i)
            out_pos[j] += x * pos[i]
            out_neg[j] += x * neg[i]
    return out_pos, out_neg


@njit(nogil=True, cache=True)
def csc_by_rows(data, indices, indptr, n_rows):
    """A column-major cell by rows: (column, value, pure), column[i] the line of row i's
    entry (−1: none), value[i] that entry, ``value`` empty where every entry is 1 (a
    one-hot cell by rows is its columns alone: no 8 bytes a row made and dropped);
    ``pure`` False (and the arrays incomplete) where a row holds two entries."""
    column = np.full(n_rows, -1, dtype=np.int32)
    ones = True
    for j in range(indptr.shape[0] - 1):
        for k in range(indptr[j], indptr[j + 1]):
            r = indices[k]
            if column[r] >= 0:
                return column, np.zeros(0), False
            column[r] = j
            if data[k] != 1:
                ones = False
    if ones:
        return column, np.zeros(0), True
    value = np.zeros(n_rows)
    for k in range(indices.shape[0]):
        value[indices[k]] = data[k]
    return column, value, True


@njit(nogil=True, cache=True)
def add_at_columns(total, columns, values):
    """total[columns[k]] += values[k] (the columns distinct): a row chunk's statistics at
    its stored columns added into the block's sums."""
    for k in range(columns.shape[0]):
        total[columns[k]] += values[k]


@njit(nogil=True, cache=True)
def pure_trials(column, value, y, margins, direction, steps, quarters, loss, width):
    """:func:`coordinate_trials` of a pure cell by rows (``column``, ``value``): the rows
    read in order, each coordinate's changes summed in the order of a column-major cell's
    entries (the same sums)."""
    out = np.zeros((steps.shape[0], width))
    for i in range(column.shape[0]):
        j = column[i]
        if j < 0:
            continue
        x = _entry(value, i)
        if x == 0.0 or direction[j] == 0.0:
            continue
        _add_changes(loss, y[i], margins[i], direction[j] * x, steps, quarters, out, j)
    return out


# ------------------------------------------------------- a block's exact Newton step


@njit(nogil=True, cache=True)
def block_newton_qp(hessian, gradient, theta, l1, l2, max_sweeps, tol):
    """argmin_t gᵀ(t−θ) + ½(t−θ)ᵀH(t−θ) + Σ_j l1|t_j| + l2/2 t_j², by cyclic CD.

    The exact (prox-)Newton step of a whole block from its Gram matrix H = X_Bᵀ W X_B / n:
    for squared loss it is the exact block minimizer, which a diagonal step on an impure
    block only approaches over many iterations.
    """
    return block_box_qp(hessian, gradient, theta, l1, l2, max_sweeps, tol, _OPEN, _OPEN)


_OPEN = np.zeros(0)  # no box


@njit(nogil=True, cache=True, inline="always")
def block_box_qp(hessian, gradient, theta, l1, l2, max_sweeps, tol, lower, upper):
    """:func:`block_newton_qp` over the box [``lower``, ``upper``] (empty: none): each
    coordinate's step clipped into its interval, exact for a convex function of one
    variable, so the sweeps minimize the block's model over the box."""
    bounded = lower.shape[0] > 0
    k = theta.shape[0]
    t = theta.copy()
    residual = gradient.copy()  # r = g + H(t − θ)
    for _ in range(max_sweeps):
        biggest = 0.0
        scale = 0.0
        for j in range(k):
            new = _prox_newton(t[j], residual[j], hessian[j, j], l1, l2)
            if bounded:
                new = _clip(new, lower[j], upper[j])
            delta = new - t[j]
            if delta != 0.0:
                for i in range(k):
                    residual[i] += hessian[i, j] * delta
                t[j] = new
            biggest = max(biggest, abs(delta))
            scale = max(scale, abs(new))
        if biggest <= tol * max(scale, 1e-300):
            break
    return t
