"""Numba kernels of the proximal Newton engine (:mod:`dask_scd.engines.newton.newton`, its
quadratic models in :mod:`dask_scd.engines.newton.quadratic` and
:mod:`dask_scd.engines.newton.l1_model`; the L1 model's block shifts in
:mod:`dask_scd.kernels.newton_shift`).

The outer step needs, at the margins z: the loss derivatives g = ℓ'(z) and d = ℓ''(z)
(:func:`derivatives`), the loss along a direction for the line search
(:func:`loss_along`, no pass over X), and one of three inner solvers of the quadratic
model q(Δ) = gᵀXΔ/n + ½ΔᵀXᵀDXΔ/n + penalty(θ + Δ):

- :func:`hessian_vector`: (XᵀDX/n)v in one pass over the rows of X (conjugate gradients);
- :func:`weighted_gram`: XᵀDX/n on a set of columns, in one pass over the rows of sparse X
  (Cholesky, or coordinate descent on it by :func:`gram_cd_epoch`);
- :func:`column_cd_epoch_packed`: coordinate descent over columns keeping XΔ as a vector.

The intercept, where fitted, is one more coordinate: a column of ones, never penalized.
Matrices are the compressed major-axis triples of :mod:`dask_scd.kernels.cpu` (rows for
the first two, columns for the last); X may be float32, every sum is float64.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dask_scd.kernels import dense_rows
from dask_scd.kernels.lines import FAST as _FAST
from dask_scd.kernels.lines import line as _line
from dask_scd.kernels.lines import minor_at
from dask_scd.kernels.scalar import coordinate_violation as _violation
from dask_scd.kernels.scalar import logistic_conjugate as _logistic_conjugate
from dask_scd.kernels.scalar import loss as _loss
from dask_scd.kernels.scalar import loss_and_d1_d2 as _loss_and_d1_d2
from dask_scd.kernels.scalar import prox_newton as _prox_newton

# Sample weights are None or an array, two types: numba compiles each kernel below that
# takes them once without its weighted branch, once with it.


@njit(nogil=True, cache=True)
def derivatives(loss, y, margins, grad, curv, weights=None):
    """grad[i] = v_i ℓ'(y_i, z_i), curv[i] = v_i ℓ''(y_i, z_i) (generalized for the squared
    hinge), v the sample ``weights`` (None: v = 1); returns Σ v_i ℓ(y_i, z_i)."""
    total = 0.0
    for i in range(len(y)):
        value, g, d = _loss_and_d1_d2(loss, y[i], margins[i])
        if weights is None:
            grad[i], curv[i] = g, d
            total += value
        else:
            v = weights[i]
            grad[i], curv[i] = v * g, v * d
            if v != 0.0:
                total += v * value
    return total


@njit(nogil=True, cache=True, fastmath=_FAST)
def signed_scatter(
    data, indices, indptr, dense, n_rows, n_cols, u, out_neg, out_pos, curv, out_sq, out_side
):
    """out_neg = Xᵀ(u ∘ [u < 0]), out_pos = Xᵀ(u ∘ [u > 0]) in one pass over the rows.

    Their sum is the gradient Xᵀg; their combination with the two scales of the dual
    projection is Xᵀa, so the certificate costs no pass of its own. With a ``curv`` d
    (an empty array: none) the same pass also gives out_sq = (X∘X)ᵀd and out_side = Xᵀd,
    the diagonal and the intercept's column of XᵀDX that conjugate gradients read.
    """
    out_neg[:] = 0.0
    out_pos[:] = 0.0
    curved = curv.shape[0] > 0
    if curved:
        out_sq[:] = 0.0
        out_side[:] = 0.0
    if dense:
        dense_rows.signed_scatter(data, n_rows, n_cols, u, out_neg, out_pos, curv, out_sq, out_side)
        return
    for r in range(n_rows):
        value = u[r]
        start, end = indptr[r], indptr[r + 1]
        values = data[start:end]
        minors = indices[start:end]
        # One loop per sign: an output array chosen per row, in the loop, ran 1.6x slower.
        if value < 0.0:
            for k in range(values.shape[0]):
                out_neg[minors[k]] += value * values[k]
        elif value > 0.0:
            for k in range(values.shape[0]):
                out_pos[minors[k]] += value * values[k]
        if curved and curv[r] != 0.0:
            c = curv[r]
            for k in range(values.shape[0]):
                x = np.float64(values[k])
                out_side[minors[k]] += c * x
                out_sq[minors[k]] += c * x * x


@njit(nogil=True, cache=True)
def loss_along(loss, y, margins, direction, step, weights=None):
    """Σ v_i ℓ(y_i, z_i + t·u_i): the loss at θ + tΔ given u = XΔ (+ Δb), v the sample
    ``weights`` (None: v = 1)."""
    total = 0.0
    for i in range(len(y)):
        if weights is None:
            total += _loss(loss, y[i], margins[i] + step * direction[i])
        elif weights[i] != 0.0:
            total += weights[i] * _loss(loss, y[i], margins[i] + step * direction[i])
    return total


@njit(nogil=True, cache=True, fastmath=_FAST)
def hessian_vector(data, indices, indptr, dense, n_rows, n_cols, weights, v, v0, out, xv):
    """out = Xᵀ(w ∘ (Xv + v0)) by rows, one pass over X; returns Σ w ∘ (Xv + v0).

    ``out`` (n_cols,) is overwritten. With the intercept, v0 is its entry of the vector
    and the returned sum its entry of the product (unscaled: divide both by n). ``xv``
    (n_rows,; an empty array: not wanted) receives Xv + v0, which the pass computes
    anyway (conjugate gradients keep X of their iterate from it).
    """
    out[:] = 0.0
    if dense:
        return dense_rows.hessian_vector(data, n_rows, n_cols, weights, v, v0, out, xv)
    keep = xv.shape[0] > 0
    total = 0.0
    for r in range(n_rows):
        if weights[r] == 0.0 and not keep:  # the squared hinge: no curvature beyond the margin
            continue
        values = data[indptr[r] : indptr[r + 1]]
        minors = indices[indptr[r] : indptr[r + 1]]
        s = v0
        for k in range(values.shape[0]):
            s += values[k] * v[minors[k]]
        if keep:
            xv[r] = s
        if weights[r] == 0.0:
            continue
        s *= weights[r]
        total += s
        for k in range(values.shape[0]):
            out[minors[k]] += s * values[k]
    return total


@njit(nogil=True, cache=True)
def weighted_gram(data, indices, indptr, n_rows, position, weights, intercept, out):
    """out[a, b] += Σ_i w_i x_ia x_ib over sparse rows (CSR), upper triangle a ≤ b.

    ``position[j]`` is column j's index in the working set (−1: not in it), increasing
    in j, so that the sorted indices of a row give increasing slots; with ``intercept`` the
    column of ones is the last index of ``out`` (k, k).
    """
    k = out.shape[0] - 1 if intercept else out.shape[0]
    slots = np.empty(out.shape[0], dtype=np.int64)
    values = np.empty(out.shape[0], dtype=np.float64)
    for r in range(n_rows):
        w = weights[r]
        if w == 0.0:
            continue
        m = 0
        row = data[indptr[r] : indptr[r + 1]]
        minors = indices[indptr[r] : indptr[r + 1]]
        for q in range(row.shape[0]):
            a = position[minors[q]]
            if a >= 0:
                slots[m] = a
                values[m] = row[q]
                m += 1
        if intercept:
            slots[m] = k
            values[m] = 1.0
            m += 1
        for s in range(m):
            a = slots[s]
            va = w * values[s]
            for t in range(s, m):
                out[a, slots[t]] += va * values[t]


@njit(nogil=True, cache=True)
def scaled_kernel(K, root, l2, out):
    """out = RKR + l2·I, R = diag(``root``), each entry rounded as numpy's
    ``K * root[:, None] * root[None, :]`` rounds it, in one sweep (the kernel Newton step's
    system, :mod:`dask_scd.engines.newton.kernel_step`); returns the largest diagonal
    entry of RKR (NaN if one is)."""
    n = K.shape[0]
    top = 0.0
    nan = False
    for i in range(n):
        ri = root[i]
        for j in range(n):
            out[i, j] = K[i, j] * ri * root[j]
        d = out[i, i]
        if d > top:
            top = d
        nan = nan or d != d
    for i in range(n):
        out[i, i] += l2
    return np.nan if nan else top


@njit(nogil=True, cache=True)
def gram_of_new_columns(
    data, indices, indptr, col_data, col_indices, col_indptr, columns, position, new, intercept, out
):
    """out[a, b] += Σ_i x_ia x_ib, a ≤ b, for the pairs of which at least one column is
    new; the other pairs, kept from before, are not touched.

    ``columns`` are the new columns, read by columns (``col_*``, CSC) to find their rows,
    which are read by rows (``data``, ``indices``, ``indptr``, CSR); ``position[j]`` is
    column j's slot (−1: none), ``new[a]`` whether slot a is new; with ``intercept`` the
    ones column is the last slot. Only the rows of new columns are read, and each pair's
    sum adds its products in the order of the rows, as :func:`weighted_gram` does (the
    same bits).
    """
    k = out.shape[0] - 1 if intercept else out.shape[0]
    for j in columns:
        a = position[j]
        for c in range(col_indptr[j], col_indptr[j + 1]):
            r = col_indices[c]
            xa = np.float64(col_data[c])
            for idx in range(indptr[r], indptr[r + 1]):
                b = position[indices[idx]]
                if b < 0 or (new[b] and b < a):  # a new pair: once, from its first slot
                    continue
                xb = np.float64(data[idx])
                if a <= b:
                    out[a, b] += xa * xb
                else:
                    out[b, a] += xb * xa
            if intercept:
                out[a, k] += xa * 1.0


@njit(inline="always")
def _intercept_step(s, h, n, delta_b):
    """(violation, step) of the intercept given the model's slope sum s = Σ_i r_i and its
    curvature h = Σ_i d_i; Δb moved by the step (none where h ≤ 0)."""
    if h <= 0.0:
        return 0.0, 0.0
    step = -s / h
    delta_b[0] += step
    return abs(s) / n, step


@njit(inline="always")
def _column_step(q, j, coef, delta, h, l1, l2):
    """(violation, step) of coordinate j of the model at θ_j + Δ_j, given its slope q and
    curvature h; Δ_j moved by the step."""
    old = coef[j] + delta[j]
    violation = _violation(old, q, l1, l2)
    if h + l2 <= 0.0:
        return violation, 0.0
    step = _prox_newton(old, q, h, l1, l2) - old
    delta[j] += step
    return violation, step


@njit(nogil=True, cache=True)
def gram_cd(hessian, q, coef, delta, l1, l2, intercept, target, max_epochs):
    """Cyclic :func:`gram_cd_epoch` until the violation of an epoch is ≤ ``target``, or
    ``max_epochs``; returns (the epochs run, the last epoch's violation)."""
    order = np.arange(len(q))
    worst = np.inf
    for epoch in range(1, max_epochs + 1):
        worst = gram_cd_epoch(hessian, q, coef, delta, order, l1, l2, intercept)
        if worst <= target:
            return epoch, worst
    return max_epochs, worst


@njit(nogil=True, cache=True)
def gram_cd_epoch(hessian, q, coef, delta, order, l1, l2, intercept):
    """One coordinate-descent epoch on q(Δ) = cᵀΔ + ½ΔᵀHΔ + Σ penalty(θ_j + Δ_j).

    ``q = c + HΔ`` is kept up to date; ``coef`` is θ on the working set and ``delta`` Δ.
    With ``intercept`` the last coordinate is the unpenalized intercept. Returns the
    largest violation met before each step (the model's optimality measure).
    """
    k = len(q) - 1 if intercept else len(q)
    worst = 0.0
    for j in order:
        h = hessian[j, j]
        old = coef[j] + delta[j]
        if j == k:
            if h <= 0.0:
                continue
            worst = max(worst, abs(q[j]))
            step = -q[j] / h
        else:
            worst = max(worst, _violation(old, q[j], l1, l2))
            step = _prox_newton(old, q[j], h, l1, l2) - old
        if step == 0.0:
            continue
        delta[j] += step
        for i in range(len(q)):
            q[i] += hessian[j, i] * step  # row j: H is symmetric, rows are contiguous
    return worst


@njit(nogil=True, cache=True, fastmath=_FAST)
def column_cd_epoch_packed(data, indices, indptr, dense, n_rows, order, packed, *model):
    """One coordinate-descent epoch of the quadratic model over columns (CSC or Fortran X).

    The row vectors are the columns of ``packed`` (n × 3): the loss derivatives g, the
    curvatures D, and the direction XΔ + Δb, kept up to date. Side by side, a column's
    rows, scattered over X, cost one cache line each instead of three. ``model`` is
    (col_curv, coef, delta, l1, l2, intercept, delta_b): ``col_curv[j] = Σ_i d_i x_ij² / n``,
    θ and Δ on the columns, the penalty, and Δb in ``delta_b[0]``; ``order`` holds column
    indices, and ``-1`` for the intercept. Returns the largest violation met before each
    step.
    """
    return _column_cd_epoch(data, indices, indptr, dense, n_rows, order, packed, model, _PACKED)


@njit(nogil=True, cache=True, fastmath=_FAST)
def column_cd_epoch_unit(data, indices, indptr, dense, n_rows, order, residual, *model):
    """:func:`column_cd_epoch_packed` for a curvature of 1 on every row (the squared loss
    without sample weights), on the model's residual r = g + XΔ + Δb alone.

    One float a row instead of three: the columns' rows, scattered over r, fall on a
    vector a third the size, which stays in the processor's caches longer (one-hot 1M ×
    10k, an epoch over every column: 0.13 s against 0.35 s). Returns the largest
    violation met before each step.
    """
    if dense:
        return _dense_epoch(data, n_rows, order, residual, residual, model, True)
    state = residual.reshape((n_rows, 1))
    return _column_cd_epoch(data, indices, indptr, dense, n_rows, order, state, model, _UNIT)


@njit(inline="always")
def _dense_epoch(data, n_rows, order, residual, curv, model, unit):
    """The column epoch over dense columns, on the model's residual r (and, unless
    ``unit``, a compile-time constant, the curvature D; with ``unit`` D = 1 and is not
    read): each column a contiguous slice, r and D plain vectors, loops the compiler
    vectorizes (5x faster than the general epoch's per-entry index, 500 × 600, 300
    columns an epoch: 0.04 ms against 0.23 ms)."""
    col_curv, coef, delta, l1, l2, _, delta_b = model
    n = float(n_rows)
    worst = 0.0
    for j in order:
        if j < 0:
            h = n if unit else curv.sum()
            violation, step = _intercept_step(residual.sum(), h, n, delta_b)
            worst = max(worst, violation)
            if step != 0.0:
                if unit:
                    residual += step  # r += Δb·1
                else:
                    for i in range(n_rows):
                        residual[i] += step * curv[i]
            continue
        column = data[j * n_rows : (j + 1) * n_rows]
        s = 0.0
        for i in range(n_rows):
            s += column[i] * residual[i]  # s = x_jᵀr
        violation, step = _column_step(s / n, j, coef, delta, col_curv[j], l1, l2)
        worst = max(worst, violation)
        if step != 0.0:
            if unit:
                for i in range(n_rows):
                    residual[i] += step * column[i]  # r += step·x_j
            else:
                for i in range(n_rows):
                    residual[i] += step * curv[i] * column[i]  # r += step·D x_j
    return worst


@njit(nogil=True, cache=True, fastmath=_FAST)
def column_cd_epoch_pair(data, indices, indptr, dense, n_rows, order, pair, *model):
    """:func:`column_cd_epoch_packed` on two floats a row: ``pair`` (n × 2) holds the
    model's residual r = g + D(XΔ + Δb) and the curvature D side by side, and XΔ + Δb is
    left to the caller (one product X·Δ after the epochs). Two thirds of the packed
    rows' bytes, for a long X whose rows outgrow the caches (one-hot 1M × 10k, an epoch
    over every column: 0.23 s against 0.35 s). Returns the largest violation met before
    each step.
    """
    return _column_cd_epoch(data, indices, indptr, dense, n_rows, order, pair, model, _PAIR)


@njit(nogil=True, cache=True, fastmath=_FAST)
def column_cd_epoch_dense(data, indices, indptr, dense, n_rows, order, rows, *model):
    """:func:`column_cd_epoch_pair` over dense (Fortran) columns, with ``rows`` (2 × n):
    the model's residual r = g + D(XΔ + Δb) and the curvature D, each contiguous. A column
    is a slice, and its loops over r and D run in order: the compiler vectorizes them
    (the packed rows' interleaved reads it cannot). XΔ + Δb is left to the caller.
    Returns the largest violation met before each step.
    """
    return _dense_epoch(data, n_rows, order, rows[0], rows[1], model, False)


# The row states of a column epoch, a compile-time constant of each kernel above: their
# branches below fold away.
_PACKED, _UNIT, _PAIR = 0, 1, 2


@njit(inline="always")
def _row_slope(state, i, kind):
    """The model's slope at row i: g + D·u from the packed rows, else the residual r."""
    if kind == _PACKED:
        return state[i, 0] + state[i, 1] * state[i, 2]
    return state[i, 0]


@njit(inline="always")
def _move_row(state, i, amount, kind):
    """The row's state after its direction u_i moves by ``amount``."""
    if kind == _PACKED:
        state[i, 2] += amount
    elif kind == _UNIT:
        state[i, 0] += amount
    else:
        state[i, 0] += amount * state[i, 1]


@njit(inline="always")
def _column_cd_epoch(data, indices, indptr, dense, n_rows, order, state, model, kind):
    """The epoch of the three kernels above over their row ``state`` (n × 3, 1 or 2)."""
    col_curv, coef, delta, l1, l2, _, delta_b = model
    n = float(n_rows)
    worst = 0.0
    for j in order:
        if j < 0:
            s = 0.0
            h = 0.0
            for i in range(n_rows):
                s += _row_slope(state, i, kind)
                if kind != _UNIT:
                    h += state[i, 1]
            violation, step = _intercept_step(s, n if kind == _UNIT else h, n, delta_b)
            worst = max(worst, violation)
            if step != 0.0:
                for i in range(n_rows):
                    _move_row(state, i, step, kind)
            continue
        h = col_curv[j]
        start, end = _line(dense, indptr, j, n_rows)
        values = data[start:end]  # slices: see lines.minor_at
        minors = indices[start:end]
        s = 0.0
        for k in range(values.shape[0]):
            s += values[k] * _row_slope(state, minor_at(dense, minors, k), kind)
        violation, step = _column_step(s / n, j, coef, delta, h, l1, l2)
        worst = max(worst, violation)
        if step == 0.0:
            continue
        for k in range(values.shape[0]):
            _move_row(state, minor_at(dense, minors, k), step * values[k], kind)
    return worst


@njit(nogil=True, cache=True)
def projected_dual(loss, y, grad, margins, project, a):
    """The dual point a = −g of unweighted losses into ``a``, with ``project`` made to sum
    to 0 (its positive or its negative entries shrunk, as
    :func:`dask_scd.objectives.dual_scales` does), in two sweeps instead of some twenty
    numpy calls. Returns (the positive entries' scale, the negative ones', Σ −ℓ*(−a_i)
    (−inf where some β = a_i·y_i leaves the domain by more than 1e-12), Σ a_i z_i, and
    the sums that give Σ −ℓ*(−κa_i) for κ in [0, 1] without another sweep: L and Q with
    κL − κ²Q/2 (squared), κL (hinge), κL − κ²Q/4 (squared hinge); none for the logistic)."""
    pos = 0.0
    neg = 0.0
    if project:
        for i in range(len(y)):
            if grad[i] < 0.0:
                pos -= grad[i]
            elif grad[i] > 0.0:
                neg -= grad[i]
    total = pos + neg
    scale_pos = 1.0 - total / pos if total > 0.0 else 1.0
    scale_neg = 1.0 - total / neg if total < 0.0 else 1.0
    dual = 0.0
    dot = 0.0
    lin = 0.0
    quad = 0.0
    eps = 1e-12
    for i in range(len(y)):
        v = -grad[i]
        v = v * scale_pos if v > 0.0 else v * scale_neg
        a[i] = v
        dot += v * margins[i]
        beta = v * y[i]
        if loss == 0:  # squared: a·y − a²/2
            lin += beta
            quad += v * v
        elif loss == 3:  # squared hinge: b − b²/4, b = max(β, 0)
            if beta < -eps:
                dual = -np.inf
            b = max(beta, 0.0)
            lin += b
            quad += b * b
        else:  # logistic and hinge: β in [0, 1]
            if beta < -eps or beta > 1.0 + eps:
                dual = -np.inf
            b = min(max(beta, 0.0), 1.0)
            if loss == 2:
                lin += b
            else:
                dual -= _logistic_conjugate(b)
    if loss == 0:
        dual = lin - 0.5 * quad
    elif loss == 3:
        dual = dual + lin - 0.25 * quad
    elif loss == 2:
        dual = dual + lin
    return scale_pos, scale_neg, dual, dot, lin, quad


@njit(nogil=True, cache=True)
def logistic_dual_sum(y, a, kappa):
    """Σ_i −ℓ*(−κa_i) of the logistic loss, Σ H(β_i) with β = κa_i·y_i and H the binary
    entropy, in one sweep (the rescaled dual point of :func:`projected_dual`'s caller);
    −inf where some β leaves [0, 1] by more than 1e-12."""
    total = 0.0
    eps = 1e-12
    for i in range(len(y)):
        beta = kappa * a[i] * y[i]
        if beta < -eps or beta > 1.0 + eps:
            return -np.inf
        total -= _logistic_conjugate(min(max(beta, 0.0), 1.0))
    return total
