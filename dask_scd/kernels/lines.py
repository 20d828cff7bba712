"""One line of a compressed major-axis matrix, and the products over all its lines.

The matrix is the triple ``(data, indices, indptr)`` with a ``dense`` flag described in
:mod:`dask_scd.kernels.cpu`: :func:`line` gives a line's span in ``data``,
:func:`minor_at` the minor index of an entry. The inline helpers (a line's dot product and
axpy) are shared by every CPU kernel; the products (Xv, Xᵀu, their squared forms, row
sums of powers) are the passes the Newton and block engines make over X.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Reassociation (and fused multiply-add) lets LLVM vectorize the reductions; results stay
# deterministic for a given build. No other fast-math flag: infinities are meaningful here.
# A dense line is read through a slice, data[start:end][k]: indexed as data[start + k],
# with a start the compiler cannot prove non-negative, the loop keeps a negative-index
# test and LLVM leaves it scalar (X v by rows of dense 100k × 400: 120 ms, against 11 ms
# through the slice).
FAST = {"reassoc", "contract"}


@njit(inline="always")
def line(dense, indptr, major, n_minor):
    if dense:
        return major * n_minor, (major + 1) * n_minor
    return indptr[major], indptr[major + 1]


@njit(inline="always")
def minor_at(dense, minors, k):
    """The minor index of the k-th entry of a line whose ``indices`` slice is ``minors``.

    Loops over a line run on slices, ``data[start:end]`` and ``indices[start:end]``
    indexed from 0: indexed as ``data[idx]`` from ``start``, the compiler keeps a
    negative-index test in the loop (a sparse X v by rows of Adult ran 2x slower)."""
    if dense:
        return k
    return minors[k]


@njit(inline="always")
def row_dot(data, indices, dense, start, end, w):
    # Each branch takes its own slice, here and in the helpers below: one slice taken
    # above the branch compiled the sparse loop 2.5x slower (a8a X v by rows).
    s = 0.0
    if dense:
        values = data[start:end]
        for k in range(values.shape[0]):
            s += values[k] * w[k]
    else:
        values = data[start:end]
        minors = indices[start:end]
        for k in range(values.shape[0]):
            s += values[k] * w[minors[k]]
    return s


@njit(inline="always")
def weight(weights, i):
    """v_i, or 1 without weights (an empty array)."""
    if weights.shape[0] > 0:
        return weights[i]
    return 1.0


@njit(inline="always")
def weighted_dot(data, indices, dense, start, end, w, weights):
    """Σ over the line of x·v·w: :func:`row_dot` of w with sample weights v."""
    s = 0.0
    values = data[start:end]
    if dense:
        for k in range(values.shape[0]):
            s += values[k] * weights[k] * w[k]
    else:
        minors = indices[start:end]
        for k in range(values.shape[0]):
            i = minors[k]
            s += values[k] * weights[i] * w[i]
    return s


@njit(inline="always")
def row_axpy(data, indices, dense, start, end, scale, w):
    if dense:
        values = data[start:end]
        for k in range(values.shape[0]):
            w[k] += scale * values[k]
    else:
        values = data[start:end]
        minors = indices[start:end]
        for k in range(values.shape[0]):
            w[minors[k]] += scale * values[k]


@njit(inline="always")
def row_square_dot(data, indices, dense, start, end, w):
    """Σ over the line of x²·w (float64 whatever X's dtype)."""
    s = 0.0
    if dense:
        values = data[start:end]
        for k in range(values.shape[0]):
            x = np.float64(values[k])
            s += x * x * w[k]
    else:
        values = data[start:end]
        minors = indices[start:end]
        for k in range(values.shape[0]):
            x = np.float64(values[k])
            s += x * x * w[minors[k]]
    return s


@njit(inline="always")
def row_square_axpy(data, indices, dense, start, end, scale, w):
    """w += scale·x² over the line."""
    if dense:
        values = data[start:end]
        for k in range(values.shape[0]):
            x = np.float64(values[k])
            w[k] += scale * x * x
    else:
        values = data[start:end]
        minors = indices[start:end]
        for k in range(values.shape[0]):
            x = np.float64(values[k])
            w[minors[k]] += scale * x * x


# ------------------------------------------------------------------------ products


@njit(inline="always")
def line_dot(data, indices, indptr, dense, r, n_minor, v, squared):
    """Σ_k A[r, k] v[k] along line r (A[r, k]² with ``squared``)."""
    start, end = line(dense, indptr, r, n_minor)
    if squared:
        return row_square_dot(data, indices, dense, start, end, v)
    return row_dot(data, indices, dense, start, end, v)


@njit(nogil=True, cache=True, fastmath=FAST)
def major_dot_range(data, indices, indptr, dense, lo, hi, n_minor, v, out, squared):
    """out[r] = Σ_k A[r, k] v[k] for the lines lo ≤ r < hi (CSR: X v; CSC: Xᵀ v), out[r]
    only for those; ``squared`` uses A[r, k]² instead (the curvature sums (X∘X)ᵀ ℓ'')."""
    for r in range(lo, hi):
        out[r] = line_dot(data, indices, indptr, dense, r, n_minor, v, squared)


@njit(nogil=True, cache=True, fastmath=FAST)
def major_dot_lines(data, indices, indptr, dense, lines, n_minor, v, out, squared):
    """:func:`major_dot_range` for the lines ``lines`` alone (CSC: the columns of a working
    set), each by the same loop, so to the same bits."""
    for m in range(lines.shape[0]):
        out[lines[m]] = line_dot(data, indices, indptr, dense, lines[m], n_minor, v, squared)


@njit(nogil=True, cache=True, fastmath=FAST)
def major_scatter(data, indices, indptr, dense, n_major, n_minor, u, out, squared):
    """out[k] += Σ_r A[r, k] u[r] (CSR: Xᵀ u; CSC: X u); A² with ``squared``."""
    for r in range(n_major):
        start, end = line(dense, indptr, r, n_minor)
        if squared:
            row_square_axpy(data, indices, dense, start, end, u[r], out)
        elif u[r] != 0.0:  # a sparse u (lasso coefficients) skips its zero lines
            row_axpy(data, indices, dense, start, end, u[r], out)


@njit(nogil=True, cache=True, fastmath=FAST)
def major_dot_pair(data, indices, indptr, n_major, vw, out_v, out_w):
    """out_v = A v and out_w = A w over the major axis of a sparse A in one pass over it
    (CSC: Xᵀv, Xᵀw), with ``vw`` the (n_minor, 2) array [v w]: the certificate's plain
    and extrapolated dual points read X once, and an entry gathers one cache line for
    both."""
    for r in range(n_major):
        start, end = indptr[r], indptr[r + 1]
        s = 0.0
        t = 0.0
        values = data[start:end]
        minors = indices[start:end]
        for k in range(values.shape[0]):
            x = values[k]
            i = minors[k]
            s += x * vw[i, 0]
            t += x * vw[i, 1]
        out_v[r] = s
        out_w[r] = t


@njit(nogil=True, cache=True, fastmath=FAST)
def dense_dot_pair(data, n_major, n_minor, v, w, out_v, out_w):
    """:func:`major_dot_pair` for a dense A stored line after line, from contiguous v and
    w: the loop of :func:`row_dot` with two sums, which vectorizes (an interleaved [v w]
    does not: 3-5x slower on 100 x 10,000 and 10,000 x 100)."""
    for r in range(n_major):
        values = data[r * n_minor : (r + 1) * n_minor]
        s = 0.0
        t = 0.0
        for k in range(values.shape[0]):
            x = values[k]
            s += x * v[k]
            t += x * w[k]
        out_v[r] = s
        out_w[r] = t


@njit(nogil=True, cache=True, fastmath=FAST)
def lines_scatter(data, indices, indptr, dense, n_minor, lines, values, offset, out):
    """out[k] = offset + Σ_m values[m]·A[lines[m], k] (CSC: the margins X_W θ_W + b of the
    columns W = ``lines``), reading only those lines."""
    for k in range(n_minor):
        out[k] = offset
    for m in range(lines.shape[0]):
        if values[m] == 0.0:
            continue
        start, end = line(dense, indptr, lines[m], n_minor)
        row_axpy(data, indices, dense, start, end, values[m], out)


@njit(nogil=True, cache=True)
def major_power_sums(data, indices, indptr, dense, n_major, n_minor, power, weights, out):
    """out[r] = Σ_k |A[r, k]|^power along the major axis, power 2 (‖line‖²) or 3 (the
    third-order bound of the logistic); in float64: float32 products lose digits. With
    ``weights`` v over the minor axis (empty: none), Σ_k v_k |A[r, k]|^power."""
    weighted = weights.shape[0] > 0
    for r in range(n_major):
        start, end = line(dense, indptr, r, n_minor)
        values = data[start:end]
        minors = indices[start:end]
        s = 0.0
        for k in range(values.shape[0]):
            x = abs(np.float64(values[k]))
            term = x * x * x if power == 3 else x * x
            if weighted:
                term *= weights[minor_at(dense, minors, k)]
            s += term
        out[r] = s


@njit(nogil=True, cache=True)
def minor_sq_sums(data, n_major, n_minor, out):
    """out[k] = Σ_r A[r, k]² for a dense A stored line after line: the bits of
    :func:`major_power_sums` (power 2) over the other layout's lines (each sum runs over r
    in order), in one sweep along the stored lines, which vectorizes across k."""
    for k in range(n_minor):
        out[k] = 0.0
    for r in range(n_major):
        values = data[r * n_minor : (r + 1) * n_minor]
        for k in range(n_minor):
            x = abs(np.float64(values[k]))
            out[k] += x * x


# --------------------------------------------------------------------------- layout

# Side of the square tiles of a transposing copy: a tile of each array stays in cache.
_TILE = 64


@njit(nogil=True, cache=True)
def transposed_copy(src, out):
    """out[i, j] = src[j, i] for C-ordered ``src`` (p, n) and ``out`` (n, p), tile by tile:
    X turned from one memory order to the other (numpy's own copy between the orders
    runs up to 3x slower on some shapes, e.g. 100000 × 400 to column order)."""
    n, p = out.shape
    for i0 in range(0, n, _TILE):
        i1 = min(i0 + _TILE, n)
        for j0 in range(0, p, _TILE):
            j1 = min(j0 + _TILE, p)
            for i in range(i0, i1):
                for j in range(j0, j1):
                    out[i, j] = src[j, i]


@njit(nogil=True, cache=True)
def structure_fault(indptr, indices, n_minor):
    """The first line of a compressed sparse matrix (CSR: rows, CSC: columns) whose
    pointers or indices are out of place, and what: (-1, 0) where none is; (r, 1): line
    r's pointers decrease or pass the end of ``indices`` (r = 0: indptr[0] ≠ 0); (r, 2):
    line r holds an index outside 0..n_minor − 1. The pointers in one pass, then the
    indices in one pass of integer minima and maxima that vectorize; the line of a bad
    index is searched only where there is one."""
    if indptr.shape[0] == 0 or indptr[0] != 0:
        return 0, 1
    for r in range(indptr.shape[0] - 1):
        if indptr[r + 1] < indptr[r] or indptr[r + 1] > indices.shape[0]:
            return r, 1
    values = indices[: indptr[indptr.shape[0] - 1]]
    low = high = 0
    for k in range(values.shape[0]):
        low = min(low, values[k])
        high = max(high, values[k])
    if low >= 0 and high < n_minor:
        return -1, 0
    for r in range(indptr.shape[0] - 1):
        for k in range(indptr[r], indptr[r + 1]):
            if values[k] < 0 or values[k] >= n_minor:
                return r, 2
    return -1, 0


# --------------------------------------------------------------------------- values

_SIGN_CLEARED = {
    np.dtype(np.float64): np.uint64(2**63 - 1),
    np.dtype(np.float32): np.uint32(2**31 - 1),
}


def largest_magnitude(values) -> float:
    """max |v|, NaN (or inf) where any value is: from the float bits in one pass where
    ``values`` is contiguous (:func:`largest_magnitude_bits`), else from max and min (two
    passes; no temporary either way)."""
    if values.size == 0:
        return 0.0
    mask = _SIGN_CLEARED.get(values.dtype)
    if mask is not None and (values.flags.c_contiguous or values.flags.f_contiguous):
        bits = values.ravel(order="K").view(mask.dtype)
        top = np.array([largest_magnitude_bits(bits, mask)], dtype=mask.dtype)
        return float(top.view(values.dtype)[0])
    return max(float(values.max()), -float(values.min()))


@njit(nogil=True, cache=True)
def largest_magnitude_bits(bits, mask):
    """max over ``bits`` & ``mask``: the IEEE bits of float values with the sign cleared
    (``mask`` 0x7FF…F of their width), whose unsigned order is that of |x|, with every
    infinity above the finite values and every NaN above the infinities. One pass, in
    integer maxima that vectorize (numpy's max and min of floats are two)."""
    m0 = m1 = m2 = m3 = bits.dtype.type(0)
    n = bits.shape[0] // 4 * 4
    for i in range(0, n, 4):
        m0 = max(m0, bits[i] & mask)
        m1 = max(m1, bits[i + 1] & mask)
        m2 = max(m2, bits[i + 2] & mask)
        m3 = max(m3, bits[i + 3] & mask)
    for i in range(n, bits.shape[0]):
        m0 = max(m0, bits[i] & mask)
    return max(max(m0, m1), max(m2, m3))


@njit(nogil=True, cache=True)
def _index_counts(indices, out):
    for j in indices:
        out[j] += 1


def index_counts(indices, length: int) -> np.ndarray:
    """``np.bincount(indices, minlength=length)`` for a sparse matrix's minor indices (all
    in [0, length)), without the intp copy of int32 indices that bincount makes first
    (225k indices: 0.13 against 0.55 ms)."""
    out = np.zeros(length, dtype=np.int64)
    _index_counts(indices, out)
    return out
