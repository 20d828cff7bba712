"""The passes over dense rows, four rows at a time.

A pass over a dense X by rows (Xv, Xᵀu, the Hessian-vector product XᵀD(Xv), the signed
gradient parts) is bound by reading X. One row at a time, each row's dot product ends in
a horizontal sum and each axpy loads and stores the whole output vector again; four rows
read side by side keep four streams of X in flight and touch the output once per four
rows (dense 100k × 400, one thread: Xv 27 → 20 ms, XᵀD(Xv) 37 → 27 ms, the speed of
BLAS's gemv).

Every row's result is the same bits whatever range of rows it falls in, so on any
number of threads (``tests/test_dense_rows.py``, widths 1 to 400, float64 and float32):
the rows left over (fewer than four) run through the same four-row loop body, the row
repeated (:func:`_block`), never through a loop of their own, which LLVM would compile
and vectorize apart (a separate one-row loop gave other bits on an AVX2 Zen 3). Each of
the four sums runs over k in order, and an axpy adds the four rows' terms to an entry one
after the other, in row order, as a row-at-a-time loop does; whether LLVM rounds four
sums side by side as it rounds one sum alone depends on the CPU, so the bits of a
row-at-a-time loop are not promised. A zero scale adds ±0·x to an entry, which leaves it
as it is (X is finite), so rows of zero weight or of the other sign need no branch.

The four-row axpy pays only on wide rows: its four additions to an entry are a chain,
where one row at a time streams independent additions (one thread: Xᵀu on 200k × 13,
1.4 ms one row at a time against 4.2 ms four at a time; 100k × 400, 29 against 25 ms).
Rows narrower than :data:`WIDE` go one at a time through every product that adds rows
(Xᵀu, the Hessian-vector product, the signed parts); Xv goes four at a time on any width.

Dense rows have loops of their own, apart from the compressed lines' kernels of
:mod:`dask_scd.kernels.lines`: with the layout flag and the indices in the loop, LLVM
left those scalar (dense 1M × 100: the scatter 5.6x and the Hessian-vector product 6.6x
slower than loops over plain slices, which it vectorizes).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dask_scd.kernels.lines import FAST, major_scatter

# Rows at least this long add four at a time (:func:`_add4`). Measured, one thread: at 160
# entries one row at a time is as fast or faster (the signed parts by 20 %); at 250 four
# at a time is faster (Xᵀu by 8 %, XᵀD(Xv) by 25 %) but for the signed parts alone (4 %
# slower); at 400 and 800 faster on all of them.
WIDE = 256
_NO_INDEX = np.zeros(0, dtype=np.int32)  # a dense matrix's indices and indptr


@njit(inline="always")
def _rows(data, r, m):
    """Rows r, r + 1, r + 2, r + 3 of the row-major ``data`` with ``m`` columns."""
    return (
        data[r * m : (r + 1) * m],
        data[(r + 1) * m : (r + 2) * m],
        data[(r + 2) * m : (r + 3) * m],
        data[(r + 3) * m : (r + 4) * m],
    )


@njit(inline="always")
def _block(data, r, n, m, values):
    """(a, b, c, d, their entries of ``values``, count): rows r to r + 3 and 4 where all
    four are below ``n``; else row r four times, its entry and three zeros, and 1."""
    if r + 4 <= n:
        a, b, c, d = _rows(data, r, m)
        return a, b, c, d, values[r], values[r + 1], values[r + 2], values[r + 3], 4
    a = data[r * m : (r + 1) * m]
    return a, a, a, a, values[r], 0.0, 0.0, 0.0, 1


@njit(inline="always")
def _dot4(a, b, c, d, m, v, start):
    """(start + a·v, start + b·v, start + c·v, start + d·v), each summed over k in order."""
    s0 = start
    s1 = start
    s2 = start
    s3 = start
    for k in range(m):
        x = v[k]
        s0 += a[k] * x
        s1 += b[k] * x
        s2 += c[k] * x
        s3 += d[k] * x
    return s0, s1, s2, s3


@njit(inline="always")
def _add4(a, b, c, d, s0, s1, s2, s3, m, out):
    """out += s0·a, then s1·b, s2·c, s3·d: each entry's four terms in row order."""
    for k in range(m):
        out[k] += s0 * a[k]
        out[k] += s1 * b[k]
        out[k] += s2 * c[k]
        out[k] += s3 * d[k]


@njit(inline="always")
def _squares4(a, b, c, d, s0, s1, s2, s3, m, out_side, out_sq):
    """out_side += s·x and out_sq += s·x² for the four rows, each entry's terms in row
    order."""
    for k in range(m):
        x0 = np.float64(a[k])
        x1 = np.float64(b[k])
        x2 = np.float64(c[k])
        x3 = np.float64(d[k])
        out_side[k] += s0 * x0
        out_sq[k] += s0 * x0 * x0
        out_side[k] += s1 * x1
        out_sq[k] += s1 * x1 * x1
        out_side[k] += s2 * x2
        out_sq[k] += s2 * x2 * x2
        out_side[k] += s3 * x3
        out_sq[k] += s3 * x3 * x3


@njit(nogil=True, cache=True, fastmath=FAST)
def dot(data, lo, hi, m, v, out):
    """out[r] = x_r·v for the rows lo ≤ r < hi."""
    r = lo
    while r < hi:
        a, b, c, d, _, _, _, _, count = _block(data, r, hi, m, out)  # (no values here)
        t0, t1, t2, t3 = _dot4(a, b, c, d, m, v, 0.0)
        out[r] = t0
        if count == 4:
            out[r + 1] = t1
            out[r + 2] = t2
            out[r + 3] = t3
        r += count


@njit(nogil=True, cache=True, fastmath=FAST)
def scatter(data, n, m, u, out):
    """out += Σ_r u[r]·x_r (Xᵀu), rows in order."""
    if m < WIDE:
        major_scatter(data, _NO_INDEX, _NO_INDEX, True, n, m, u, out, False)
        return
    r = 0
    while r < n:
        a, b, c, d, u0, u1, u2, u3, count = _block(data, r, n, m, u)
        if u0 != 0.0 or u1 != 0.0 or u2 != 0.0 or u3 != 0.0:
            _add4(a, b, c, d, u0, u1, u2, u3, m, out)
        r += count


@njit(nogil=True, cache=True, fastmath=FAST)
def hessian_vector(data, n, m, weights, v, v0, out, xv):
    """out += Σ_r w_r·(x_r·v + v0)·x_r; xv[r] = x_r·v + v0 (when ``xv`` is not empty);
    returns Σ_r w_r·(x_r·v + v0). Rows of zero weight are skipped four at a time when
    ``xv`` is not wanted."""
    if m < WIDE:
        return _narrow_hessian_vector(data, n, m, weights, v, v0, out, xv)
    keep = xv.shape[0] > 0
    total = 0.0
    r = 0
    while r < n:
        a, b, c, d, w0, w1, w2, w3, count = _block(data, r, n, m, weights)
        if keep or w0 != 0.0 or w1 != 0.0 or w2 != 0.0 or w3 != 0.0:
            t0, t1, t2, t3 = _dot4(a, b, c, d, m, v, v0)
            if keep:
                xv[r] = t0
                if count == 4:
                    xv[r + 1] = t1
                    xv[r + 2] = t2
                    xv[r + 3] = t3
            t0 *= w0
            t1 *= w1
            t2 *= w2
            t3 *= w3
            total += t0
            if count == 4:
                total += t1
                total += t2
                total += t3
            _add4(a, b, c, d, t0, t1, t2, t3, m, out)
        r += count
    return total


@njit(nogil=True, cache=True, fastmath=FAST)
def signed_scatter(data, n, m, u, out_neg, out_pos, curv, out_sq, out_side):
    """out_neg += Xᵀ(u ∘ [u < 0]), out_pos += Xᵀ(u ∘ [u > 0]); with a ``curv`` d (an empty
    array: none), out_sq += (X∘X)ᵀd and out_side += Xᵀd."""
    if m < WIDE:
        _narrow_signed_scatter(data, n, m, u, out_neg, out_pos, curv, out_sq, out_side)
        return
    curved = curv.shape[0] > 0
    r = 0
    while r < n:
        a, b, c, d, u0, u1, u2, u3, count = _block(data, r, n, m, u)
        n0, n1, n2, n3 = min(u0, 0.0), min(u1, 0.0), min(u2, 0.0), min(u3, 0.0)
        p0, p1, p2, p3 = max(u0, 0.0), max(u1, 0.0), max(u2, 0.0), max(u3, 0.0)
        negative = n0 != 0.0 or n1 != 0.0 or n2 != 0.0 or n3 != 0.0
        positive = p0 != 0.0 or p1 != 0.0 or p2 != 0.0 or p3 != 0.0
        if negative and positive:  # one sweep for both: the rows read once
            for k in range(m):
                x0, x1, x2, x3 = a[k], b[k], c[k], d[k]
                out_neg[k] += n0 * x0
                out_neg[k] += n1 * x1
                out_neg[k] += n2 * x2
                out_neg[k] += n3 * x3
                out_pos[k] += p0 * x0
                out_pos[k] += p1 * x1
                out_pos[k] += p2 * x2
                out_pos[k] += p3 * x3
        elif negative:
            _add4(a, b, c, d, n0, n1, n2, n3, m, out_neg)
        elif positive:
            _add4(a, b, c, d, p0, p1, p2, p3, m, out_pos)
        if curved:
            c0, c1, c2, c3 = _block(data, r, n, m, curv)[4:8]
            if c0 != 0.0 or c1 != 0.0 or c2 != 0.0 or c3 != 0.0:
                _squares4(a, b, c, d, c0, c1, c2, c3, m, out_side, out_sq)
        r += count


# Rows narrower than WIDE, one at a time.


@njit(nogil=True, cache=True, fastmath=FAST)
def _narrow_hessian_vector(data, n, m, weights, v, v0, out, xv):
    keep = xv.shape[0] > 0
    total = 0.0
    for r in range(n):
        w = weights[r]
        if w == 0.0 and not keep:
            continue
        row = data[r * m : (r + 1) * m]
        s = v0
        for k in range(m):
            s += row[k] * v[k]
        if keep:
            xv[r] = s
        if w == 0.0:
            continue
        s *= w
        total += s
        for k in range(m):
            out[k] += s * row[k]
    return total


@njit(nogil=True, cache=True, fastmath=FAST)
def _narrow_signed_scatter(data, n, m, u, out_neg, out_pos, curv, out_sq, out_side):
    curved = curv.shape[0] > 0
    for r in range(n):
        value = u[r]
        row = data[r * m : (r + 1) * m]
        if value < 0.0:
            for k in range(m):
                out_neg[k] += value * row[k]
        elif value > 0.0:
            for k in range(m):
                out_pos[k] += value * row[k]
        if curved and curv[r] != 0.0:
            c = curv[r]
            for k in range(m):
                x = np.float64(row[k])
                out_side[k] += c * x
                out_sq[k] += c * x * x
