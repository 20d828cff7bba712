"""Numba kernels: one epoch of primal SCD over columns, of dual SDCA over rows.

Pure numerical code: contiguous arrays and scalars in, arrays updated in place, no
validation (the wrappers in :mod:`dask_scd.engines.local.scd` and :mod:`dask_scd.engines.local.sdca`
do that once).

Every kernel takes a matrix as a *compressed major-axis* triple ``(data, indices, indptr)``
plus a ``dense`` flag. For a sparse matrix this is CSC (primal: major axis = columns) or
CSR (dual: major axis = rows). A dense matrix passes its values raveled along the major
axis (Fortran order for columns, C order for rows, a view, no copy) with ``dense=True``;
then ``indices``/``indptr`` are ignored and the minor index is the offset in the line.
X may be float32 or float64; coefficients, margins and sums are always float64.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dask_scd.kernels import scalar
from dask_scd.kernels.lines import FAST, line, minor_at, row_axpy, row_dot, weight, weighted_dot
from dask_scd.kernels.prefetch import AHEAD, prefetch_line

# --------------------------------------------------------------------- primal SCD


def scd_epoch(*args):
    """:func:`scd_epoch_violation` without the violation (the arguments and returns of
    :func:`dask_scd.kernels.cuda.scd_epoch`): max |Δθ_j| and max |θ_j|."""
    return scd_epoch_violation(*args)[:2]


@njit(nogil=True, cache=True, fastmath=FAST)
def scd_epoch_violation(
    data,
    indices,
    indptr,
    dense,
    n_samples,
    y,
    margins,
    coef,
    intercept,
    order,
    loss,
    l1,
    l2,
    col_sq_norms,
    col_cube_sums,
):
    """One epoch of primal coordinate descent in the given coordinate ``order``.

    Coordinate ``j < n_features`` is a column of X; coordinate ``n_features`` is the
    intercept (an unpenalized all-ones column). ``margins`` (= Xθ + b), ``coef`` and
    ``intercept`` (an array of length 1) are updated in place. ``col_cube_sums``
    (Σ_i |x_ij|³ per column, or an empty array) lets the logistic loss skip its line
    search when a third-order bound already proves the full step acceptable. Returns
    max |Δθ_j| and max |θ_j| over the epoch, the cheap first-stage convergence test, and
    the largest optimality violation met.

    The violation of coordinate j is the distance of its gradient to the penalty's
    subdifferential, ``dist(−g_j, ∂g(θ_j))``, taken just before its step (free: the step
    reduces g_j anyway). Over an epoch it is the working-set solver's cheap stopping test.
    """
    # The empty weights and bounds are compile-time constants: their branches fold away.
    return scd_weighted_epoch(
        data,
        indices,
        indptr,
        dense,
        n_samples,
        y,
        margins,
        coef,
        intercept,
        order,
        loss,
        l1,
        l2,
        col_sq_norms,
        col_cube_sums,
        _NO_WEIGHTS,
        _NO_WEIGHTS,
        _NO_WEIGHTS,
    )


_NO_WEIGHTS = np.zeros(0)  # (and no bounds)


# Inlined into scd_epoch_violation with empty weights, compiled on its own when called.
@njit(nogil=True, cache=True, fastmath=FAST, inline="always")
def scd_weighted_epoch(
    data,
    indices,
    indptr,
    dense,
    n_samples,
    y,
    margins,
    coef,
    intercept,
    order,
    loss,
    l1,
    l2,
    col_sq_norms,
    col_cube_sums,
    weights,
    lower,
    upper,
):
    """:func:`scd_epoch_violation` for sample weights v (the loss of example i is v_i·ℓ_i).

    A coordinate's gradient and curvature are the weighted sums x_jᵀ(v∘ℓ'(ŷ))/n and
    (x_j∘x_j)ᵀ(v∘ℓ''(ŷ))/n, its line search compares weighted losses, and so do the
    intercept's. ``col_sq_norms`` and ``col_cube_sums`` are the weighted Σ_i v_i x_ij² and
    Σ_i v_i |x_ij|³ (the squared loss's curvature, the logistic's third-order bound).
    Empty ``weights``: every example weighs 1. ``lower`` and ``upper`` (arrays of shape
    (n_features,); empty: none) keep θ in a box: every step is the clip of the
    prox-Newton step into its interval, the exact minimizer of the coordinate's model
    there, and the violation counts the box's normal cone.
    """
    cubic = loss == scalar.LOGISTIC and col_cube_sums.shape[0] == coef.shape[0]
    n_features = coef.shape[0]
    inv_n = 1.0 / n_samples
    max_delta = 0.0
    max_coef = 0.0
    max_violation = 0.0
    for k in range(order.shape[0]):
        j = order[k]
        if j == n_features:
            delta, violation = _intercept_step(y, margins, intercept, loss, cubic, weights)
        else:
            delta, violation = _column_step(
                data,
                indices,
                indptr,
                dense,
                n_samples,
                y,
                margins,
                coef,
                j,
                loss,
                l1,
                l2,
                col_sq_norms[j] * inv_n,
                inv_n,
                col_cube_sums[j] * inv_n if cubic else -1.0,
                weights,
                lower,
                upper,
            )
            max_coef = max(max_coef, abs(coef[j]))
        max_delta = max(max_delta, abs(delta))
        max_violation = max(max_violation, violation)
    return max_delta, max_coef, max_violation


@njit(nogil=True, cache=True, fastmath=FAST)
def scd_epoch_squared(
    data,
    indices,
    indptr,
    dense,
    n_samples,
    y,
    margins,
    coef,
    intercept,
    order,
    l1,
    l2,
    col_sq_norms,
    col_xty,
    col_means,
    weights,
    lower,
    upper,
):
    """:func:`scd_epoch_violation` for the squared loss; with an intercept, on centered
    columns: the intercept is re-solved exactly after every coordinate step, for free.

    A step reads one vector at the column's rows, the margins: the gradient
    x_jᵀ(ŷ − y) is x_jᵀŷ − ``col_xty[j]`` (Xᵀy computed once), so y is not gathered
    beside ŷ — on long sparse columns each gathered vector is a cache miss per entry.

    With b at its optimum mean(y − Xθ) for θ, the objective is a function of θ alone,
    whose columns are the centered x_j − mean(x_j)·1: a step Δ on θ_j moves b by
    −Δ·mean(x_j). Every margin then moves by the same amount, which is kept as one
    pending ``shift`` and applied once at the end of the epoch, so a step still reads
    only the column's stored entries (implicit centering, as scikit-learn's and glmnet's
    sparse coordinate descent do). With the intercept a coordinate of its own (the plain
    kernel), a column correlated with the all-ones column (any frequent feature; in
    one-hot data every field's columns sum to it) must wait for the intercept's step
    and back again: epochs crawl along that valley. Entries of ``order`` equal to
    ``n_features`` (the intercept) are skipped: it is always at its optimum. The first
    statement sets b to it. Returns max |Δθ_j|, max |θ_j| and the largest violation
    met, as :func:`scd_epoch_violation`. Without an intercept ``col_means`` is empty
    and the columns are taken as they are.

    With sample ``weights`` v (empty: none) the loss is (1/2n) Σ v_i (ŷ_i − y_i)²:
    ``col_xty`` is Xᵀ(v∘y), ``col_sq_norms`` Σ_i v_i x_ij², ``col_means`` the weighted
    means Σ_i v_i x_ij / Σv, the optimal b the weighted mean of y − Xθ, and a column's
    curvature once centered Σ_i v_i (x_ij − mean_j)²/n = Σ_i v_i x_ij²/n − (Σv/n)·mean_j²
    (``mass`` is Σv/n). ``lower`` and ``upper`` (empty: none) keep θ in a box, as
    :func:`scd_weighted_epoch` does.
    """
    n_features = coef.shape[0]
    inv_n = 1.0 / n_samples
    centered = col_means.shape[0] == n_features
    weighted = weights.shape[0] > 0
    bounded = lower.shape[0] > 0
    mass = 1.0  # Σv/n
    shift = 0.0  # pending change of b and of every margin
    if centered and weighted:
        residual_sum = 0.0
        total = 0.0
        for i in range(n_samples):
            residual_sum += weights[i] * (margins[i] - y[i])
            total += weights[i]
        shift = -residual_sum / total
        mass = total * inv_n
    elif centered:
        residual_sum = 0.0
        for i in range(n_samples):
            residual_sum += margins[i] - y[i]
        shift = -residual_sum * inv_n
    max_delta = 0.0
    max_coef = 0.0
    max_violation = 0.0
    for k in range(order.shape[0]):
        j = order[k]
        if j == n_features:
            continue
        start, end = line(dense, indptr, j, n_samples)
        if weighted:
            g = weighted_dot(data, indices, dense, start, end, margins, weights)
        else:
            g = row_dot(data, indices, dense, start, end, margins)
        mean = col_means[j] if centered else 0.0
        g = (g - col_xty[j]) * inv_n + shift * mass * mean  # x_jᵀV(ŷ + shift − y)/n
        h = col_sq_norms[j] * inv_n - mass * mean * mean  # ‖x_j − mean·1‖²_V/n
        old = coef[j]
        if bounded:
            violation = scalar.box_violation(old, g, l1, l2, lower[j], upper[j])
        else:
            violation = scalar.coordinate_violation(old, g, l1, l2)
        max_violation = max(max_violation, violation)
        if h > 1e-12 * col_sq_norms[j] * inv_n:
            delta = scalar.prox_newton(old, g, h, l1, l2) - old
        else:  # a constant column: flat once centered, its penalty alone sets it to 0
            delta = -old
        new = old + delta
        if bounded:  # the clip of the step into the box, landing on it exactly
            new = scalar.clip(new, lower[j], upper[j])
            delta = new - old
        max_coef = max(max_coef, abs(new))
        if delta == 0.0:
            continue
        row_axpy(data, indices, dense, start, end, delta, margins)
        shift -= delta * mean
        coef[j] = new
        max_delta = max(max_delta, abs(delta))
    if centered:
        for i in range(n_samples):
            margins[i] += shift
        intercept[0] += shift
    return max_delta, max_coef, max_violation


@njit(inline="always")
def _column_step(
    data,
    indices,
    indptr,
    dense,
    n_samples,
    y,
    margins,
    coef,
    j,
    loss,
    l1,
    l2,
    sq_norm,
    inv_n,
    cube_mean,
    weights,
    lower,
    upper,
):
    start, end = line(dense, indptr, j, n_samples)
    weighted = weights.shape[0] > 0
    g = 0.0
    h = 0.0
    values = data[start:end]  # slices: see lines.minor_at
    minors = indices[start:end]
    if loss == scalar.SQUARED and weighted:  # h: the weighted Σ v_i x_ij² / n
        for k in range(values.shape[0]):
            i = minor_at(dense, minors, k)
            g += (margins[i] - y[i]) * weights[i] * values[k]
        h = sq_norm
    elif loss == scalar.SQUARED:
        if dense:  # contiguous: a plain loop over a slice, which LLVM vectorizes
            for k in range(values.shape[0]):
                g += (margins[k] - y[k]) * values[k]  # g = X[:, j]ᵀ(ŷ − y)
        else:
            for k in range(values.shape[0]):
                g += (margins[minors[k]] - y[minors[k]]) * values[k]
        h = sq_norm
    else:
        for k in range(values.shape[0]):
            i = minor_at(dense, minors, k)
            d1, d2 = scalar.loss_d1_d2(loss, y[i], margins[i])
            if weighted:
                d1 *= weights[i]
                d2 *= weights[i]
            x = values[k]
            g += d1 * x
            h += d2 * x * x
        h *= inv_n
    g *= inv_n
    old = coef[j]
    bounded = lower.shape[0] > 0
    if bounded:
        violation = scalar.box_violation(old, g, l1, l2, lower[j], upper[j])
        delta = scalar.clip(scalar.prox_newton(old, g, h, l1, l2), lower[j], upper[j]) - old
    else:
        violation = scalar.coordinate_violation(old, g, l1, l2)
        delta = scalar.prox_newton(old, g, h, l1, l2) - old
    if delta == 0.0:
        return 0.0, violation
    if loss != scalar.SQUARED and not scalar.cubic_accepts(g, h, old, delta, l1, l2, cube_mean):
        delta *= _column_line_search(
            data,
            indices,
            dense,
            start,
            end,
            y,
            margins,
            loss,
            old,
            delta,
            g,
            l1,
            l2,
            inv_n,
            weights,
        )
        if delta == 0.0:
            return 0.0, violation
    if bounded:  # old + Δ may round past the bound it reaches: θ_j lands on it exactly
        new = scalar.clip(old + delta, lower[j], upper[j])
        delta = new - old
        if delta == 0.0:
            return 0.0, violation
        row_axpy(data, indices, dense, start, end, delta, margins)
        coef[j] = new
        return delta, violation
    row_axpy(data, indices, dense, start, end, delta, margins)  # ŷ += Δθ_j X[:, j]
    coef[j] = old + delta
    return delta, violation


@njit(inline="always")
def _column_line_search(
    data, indices, dense, start, end, y, margins, loss, old, delta, g, l1, l2, inv_n, weights
):
    """Backtracking step size for a prox-Newton direction on one column (Armijo rule);
    the losses weighted by ``weights`` (empty: none)."""
    model = g * delta + scalar.penalty(l1, l2, old + delta) - scalar.penalty(l1, l2, old)
    values = data[start:end]  # slices: see lines.minor_at
    minors = indices[start:end]
    base = 0.0
    for k in range(values.shape[0]):
        i = minor_at(dense, minors, k)
        base += weight(weights, i) * scalar.loss(loss, y[i], margins[i])
    base *= inv_n
    # Below this, a change of objective is rounding noise: accept rather than stall.
    noise = 1e-13 * (base + scalar.penalty(l1, l2, old))
    t = 1.0
    for _ in range(scalar.MAX_BACKTRACK):
        trial = 0.0
        step = t * delta
        for k in range(values.shape[0]):
            i = minor_at(dense, minors, k)
            trial += weight(weights, i) * scalar.loss(loss, y[i], margins[i] + step * values[k])
        change = (
            trial * inv_n - base + scalar.penalty(l1, l2, old + step) - scalar.penalty(l1, l2, old)
        )
        if change <= scalar.ARMIJO * t * model + noise:
            return t
        t *= scalar.BACKTRACK
    return 0.0


@njit(inline="always")
def _intercept_step(y, margins, intercept, loss, cubic, weights):
    n = margins.shape[0]
    g = 0.0
    h = 0.0
    for i in range(n):
        d1, d2 = scalar.loss_d1_d2(loss, y[i], margins[i])
        if weights.shape[0] > 0:
            d1 *= weights[i]
            d2 *= weights[i]
        g += d1
        h += d2
    inv_n = 1.0 / n
    violation = abs(g) * inv_n
    if h <= 0.0:
        return 0.0, violation
    delta = -g / h
    if loss != scalar.SQUARED and not scalar.cubic_accepts(
        g * inv_n, h * inv_n, 0.0, delta, 0.0, 0.0, 1.0 if cubic else -1.0
    ):
        # A Newton step on b with backtracking on the exact loss (the 1-D problem is convex).
        base = 0.0
        for i in range(n):
            base += weight(weights, i) * scalar.loss(loss, y[i], margins[i])
        noise = 1e-13 * base
        model = g * delta
        t = 1.0
        for _ in range(scalar.MAX_BACKTRACK):
            trial = 0.0
            for i in range(n):
                trial += weight(weights, i) * scalar.loss(loss, y[i], margins[i] + t * delta)
            if trial - base <= scalar.ARMIJO * t * model + noise:
                break
            t *= scalar.BACKTRACK
        else:
            t = 0.0  # no step passed: b stays
        delta = t * delta
    if delta == 0.0:
        return 0.0, violation
    for i in range(n):
        margins[i] += delta
    intercept[0] += delta
    return delta, violation


# ----------------------------------------------------------------------- dual SDCA


# The arguments of cuda.sdca_epoch, its GPU twin (numba cannot compile one body for both).
@njit(nogil=True, cache=True, fastmath=FAST)
def sdca_epoch(
    data,
    indices,
    indptr,
    dense,
    n_features,
    y,
    dual_coef,
    coef,
    order,
    loss,
    alpha_n,
    row_sq_norms,
    intercept,
    rho,
    dual_sum,
):
    """One epoch of SDCA over rows; ``dual_coef`` (a) and ``coef`` (w = Xᵀa/(αn)) in place.

    With ``rho > 0`` the steps are taken on the augmented Lagrangian of the intercept's
    dual constraint Σ a_i = 0, ``D(a) − b Σa/n − ρ(Σa)²/(2n)`` (method of multipliers; the
    caller then sets b ← b + ρ Σa). ``dual_sum`` (length 1) carries Σ a_i through the
    epoch, read and written in memory at every step: threads running epochs on disjoint
    rows may share it, as they share ``coef`` (SA-SDCA). With ``rho = 0`` and
    ``intercept = 0`` this is plain SDCA. Returns max |Δa_i|.
    """
    max_delta = 0.0
    n_visits = order.shape[0]
    for k in range(n_visits):
        if k + AHEAD < n_visits:
            prefetch_line(data, indices, indptr, dense, n_features, order[k + AHEAD])
        i = order[k]
        start, end = line(dense, indptr, i, n_features)
        margin = row_dot(data, indices, dense, start, end, coef)
        q = row_sq_norms[i] / alpha_n + rho
        shifted = margin + intercept + rho * dual_sum[0]
        t = scalar.dual_step(loss, y[i], dual_coef[i], shifted, q)
        if t == 0.0:
            continue
        dual_coef[i] += t
        dual_sum[0] += t
        row_axpy(data, indices, dense, start, end, t / alpha_n, coef)  # w += t x_i/(αn)
        max_delta = max(max_delta, abs(t))
    return max_delta


# sdca_epoch keeps a loop of its own: 3–6% faster than this one with empty weights.
@njit(nogil=True, cache=True, fastmath=FAST)
def sdca_weighted_epoch(
    data,
    indices,
    indptr,
    dense,
    n_features,
    y,
    unit_dual,
    coef,
    order,
    loss,
    alpha_n,
    row_sq_norms,
    weights,
    intercept,
    rho,
    dual_sum,
):
    """:func:`sdca_epoch` for sample weights v (the loss of example i is v_i·ℓ_i).

    The dual of v_i·ℓ_i is a_i = v_i·u_i with u_i in the unweighted domain (β = u·y ∈
    [0, 1] for the logistic and the hinge), so ``unit_dual`` holds u and w = Xᵀ(v∘u)/(αn).
    Moving u_i by t changes the dual by v_i·[d(u_i + t) − t·m − t²·v_i(‖x_i‖²/(αn) + ρ)/2]
    (m the shifted margin): the unweighted step with its curvature scaled by v_i, then
    w += v_i·t·x_i/(αn) and Σa += v_i·t. An example of weight 0 is never moved (u_i = 0).
    Returns max |Δa_i|.
    """
    max_delta = 0.0
    n_visits = order.shape[0]
    for k in range(n_visits):
        if k + AHEAD < n_visits:
            prefetch_line(data, indices, indptr, dense, n_features, order[k + AHEAD])
        scaled, start, end = dual_row_step(
            data,
            indices,
            indptr,
            dense,
            n_features,
            y,
            unit_dual,
            coef,
            order[k],
            loss,
            alpha_n,
            row_sq_norms,
            weights,
            intercept,
            rho,
            dual_sum[0],
        )
        if scaled == 0.0:
            continue
        dual_sum[0] += scaled
        row_axpy(data, indices, dense, start, end, scaled / alpha_n, coef)  # w += v t x_i/(αn)
        max_delta = max(max_delta, abs(scaled))
    return max_delta


@njit(inline="always")
def dual_row_step(
    data,
    indices,
    indptr,
    dense,
    n_features,
    y,
    unit_dual,
    w,
    i,
    loss,
    alpha_n,
    row_sq_norms,
    weights,
    intercept,
    rho,
    dual_sum,
):
    """SDCA's step on row i against w (read only), ``unit_dual[i]`` moved in place; the
    scalar ``dual_sum`` is Σa. Returns (v_i·t, the row's line start and end); v_i·t = 0
    when u_i does not move."""
    v = weight(weights, i)
    if v == 0.0:
        return 0.0, 0, 0
    start, end = line(dense, indptr, i, n_features)
    margin = row_dot(data, indices, dense, start, end, w)
    q = v * (row_sq_norms[i] / alpha_n + rho)
    t = scalar.dual_step(loss, y[i], unit_dual[i], margin + intercept + rho * dual_sum, q)
    if t == 0.0:
        return 0.0, start, end
    unit_dual[i] += t
    return v * t, start, end
