"""Plain-numpy reference of every kernel update: the test oracle, slow and obvious.

Written from the formulas in :mod:`dask_scd.objectives` (losses and their conjugates),
column by column and row by row on a dense ``X``. It shares with the numba kernels only
the scalar update rules of :mod:`dask_scd.kernels.scalar` that define the method (the
penalty, its prox-Newton step, the Armijo schedule); losses, derivatives and the dual
steps are computed here independently (vectorized formulas, root finding), so the tests
check the kernels' arithmetic against them.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq

from dask_scd import objectives as obj
from dask_scd.kernels.scalar import ARMIJO, BACKTRACK, MAX_BACKTRACK, penalty, prox_newton


def scd_epoch(problem: obj.Problem, X, y, margins, coef, intercept, order):
    """One primal SCD epoch on dense X; updates ``margins``, ``coef``, ``intercept[0]``."""
    n, p = X.shape
    for j in order:
        column = np.ones(n) if j == p else X[:, j].astype(np.float64)
        d1 = obj.loss_derivative(problem.loss, y, margins)
        d2 = obj.loss_second_derivative(problem.loss, y, margins)
        g = d1 @ column / n
        h = d2 @ (column * column) / n
        if j == p:
            if h <= 0:
                continue
            old, l1, l2 = intercept[0], 0.0, 0.0
            new = old - g / h
        else:
            old, l1, l2 = coef[j], problem.l1, problem.l2
            if h + l2 <= 0:
                continue
            new = prox_newton(old, g, h, l1, l2)
        delta = new - old
        if delta == 0.0:
            continue
        if problem.loss != "squared":
            delta *= _line_search(problem, y, margins, column, old, delta, g, l1, l2)
        if j == p:
            intercept[0] += delta
        else:
            coef[j] += delta
        margins += delta * column


def _line_search(problem, y, margins, column, old, delta, g, l1, l2):
    rows = column != 0
    yc, mc, cc = y[rows], margins[rows], column[rows]
    n = len(y)
    base = obj.loss_value(problem.loss, yc, mc).sum() / n
    change = lambda step: penalty(l1, l2, old + step) - penalty(l1, l2, old)  # noqa: E731
    model = g * delta + change(delta)
    noise = 1e-13 * (base + penalty(l1, l2, old))
    t = 1.0
    for _ in range(MAX_BACKTRACK):
        trial = obj.loss_value(problem.loss, yc, mc + t * delta * cc).sum() / n
        if trial - base + change(t * delta) <= ARMIJO * t * model + noise:
            return t
        t *= BACKTRACK
    return 0.0


def _dual_interval(loss, y, a):
    if loss == "squared":
        return -np.inf, np.inf
    if loss == "squared_hinge":
        return (-a, np.inf) if y > 0 else (-np.inf, -a)
    return (-a, 1.0 - a) if y > 0 else (-1.0 - a, -a)


def _dual_slope(loss, y, a):
    """d/da of −ℓ*(−a)."""
    beta = a * y
    if loss == "squared":
        return y - a
    if loss == "hinge":
        return y
    if loss == "squared_hinge":
        return y * (1.0 - beta / 2.0)
    return y * (np.log1p(-beta) - np.log(beta))


def dual_step(loss, y, a, m, q):
    """argmax_t d(a + t) − t m − q t²/2 over the domain of d = −ℓ*(−·)."""
    lo, hi = _dual_interval(loss, y, a)
    slope = lambda t: _dual_slope(loss, y, a + t) - m - q * t  # noqa: E731
    if loss == "logistic":
        span = hi - lo
        return brentq(slope, lo + 1e-15 * span, hi - 1e-15 * span, xtol=1e-16)
    # A concave quadratic (or linear) in t: its maximizer over [lo, hi].
    curvature = slope(1.0) - slope(0.0)
    if curvature < 0:
        t = -slope(0.0) / curvature
    else:
        t = hi if slope(0.0) > 0 else lo
    return float(np.clip(t, lo, hi))


def sdca_epoch(problem: obj.Problem, X, y, dual_coef, coef, order, intercept=0.0, rho=0.0):
    """One SDCA epoch on dense X; updates ``dual_coef`` and ``coef`` = Xᵀa/(αn) in place.

    ``rho > 0``: steps on the augmented Lagrangian D(a) − bΣa/n − ρ(Σa)²/(2n).
    """
    alpha_n = problem.alpha * X.shape[0]
    for i in order:
        x = X[i].astype(np.float64)
        t = dual_step(
            problem.loss,
            y[i],
            dual_coef[i],
            x @ coef + intercept + rho * dual_coef.sum(),
            x @ x / alpha_n + rho,
        )
        dual_coef[i] += t
        coef += t * x / alpha_n


def gram_epoch(gram, gradient, coef, order, l1, l2):
    """Coordinate minimization on ½θᵀHθ − cᵀθ + l1‖θ‖₁ + l2/2‖θ‖², with q = Hθ − c kept
    up to date; updates ``gradient`` (q) and ``coef`` in place: :func:`newton_gram_cd_epoch`
    from θ = 0, its Δ ``coef``."""
    newton_gram_cd_epoch(gram, gradient, np.zeros(len(coef)), coef, order, l1, l2, False)


def block_order(rows, block, rng):
    """``rows`` block by block: blocks in ``rng.permutation`` order, rows shuffled within
    each block by Fisher–Yates on ``rng.random(len(rows))`` (the kernel's draws)."""
    block_perm = rng.permutation(-(-len(rows) // block))
    uniforms = rng.random(len(rows))
    out = []
    for b in block_perm:
        chunk = list(rows[b * block : (b + 1) * block])
        pos = len(out)
        for r in range(len(chunk) - 1, 0, -1):
            s = int(uniforms[pos + r] * (r + 1))
            chunk[r], chunk[s] = chunk[s], chunk[r]
        out += chunk
    return np.array(out, dtype=np.int64)


def sdca_shrinking_pass(
    problem: obj.Problem, X, y, dual_coef, coef, order, bounds, intercept=0.0, rho=0.0
):
    """One pass of dual CD with shrinking (Hsieh et al. 2008, Algorithm 3) on dense X.

    In β = a·y the row minimizes ½Q(β − β_i)² + G(β − β_i) over [0, 1] (hinge) or
    [0, ∞) (squared hinge), G = y·(x_iᵀw + b + ρΣa) − 1 (+ β_i/2), Q = ‖x_i‖²/(αn) + ρ
    (+ ½). A row at a bound whose G points outward past ``bounds`` = (M̄, m̄) is shrunk.
    Returns the set of shrunk rows and the largest and smallest projected gradient.
    """
    alpha_n = problem.alpha * X.shape[0]
    upper = 1.0 if problem.loss == "hinge" else np.inf
    half = 0.5 if problem.loss == "squared_hinge" else 0.0
    shrunk, pgs = set(), []
    for i in order:
        x = X[i].astype(np.float64)
        beta = dual_coef[i] * y[i]
        g = y[i] * (x @ coef + intercept + rho * dual_coef.sum()) - 1.0 + half * beta
        if (beta == 0.0 and g > bounds[0]) or (beta == upper and g < bounds[1]):
            shrunk.add(i)
            continue
        pg = min(g, 0.0) if beta == 0.0 else max(g, 0.0) if beta == upper else g
        pgs.append(pg)
        if abs(pg) <= 1e-12:
            continue
        curvature = x @ x / alpha_n + rho + half
        new = min(max(beta - g / curvature, 0.0), upper) if curvature > 0 else float(g < 0)
        dual_coef[i] = new * y[i]
        coef += (new - beta) * y[i] * x / alpha_n
    return shrunk, max(pgs, default=-np.inf), min(pgs, default=np.inf)


def sdca_shrinking_epoch(
    problem: obj.Problem,
    X,
    y,
    dual_coef,
    coef,
    state,
    rng,
    block,
    relative_eps,
    shrunk_work,
    intercept=0.0,
    rho=0.0,
):
    """Passes over the active rows until n row visits, or until all rows are solved to ε.

    ``state``: dict with ``active`` (sorted array) and ``bounds`` = [M̄, m̄, ε, visits of
    shrunk passes], updated. After a pass with M − m ≤ ε every row comes back, or, if
    none was shrunk, the epoch ends settled; a pass over all rows sets
    ε = min(ε, max(relative_eps·(M − m), 1e-11)). Every row also comes back once the
    shrunk passes since the last full one made ``shrunk_work·n`` visits.
    Returns whether the epoch ended settled.
    """
    n = X.shape[0]
    visits = 0
    while visits < n:
        active = state["active"]
        order = block_order(active, block, rng)
        bounds = state["bounds"]
        shrunk, pg_max, pg_min = sdca_shrinking_pass(
            problem, X, y, dual_coef, coef, order, bounds, intercept, rho
        )
        visits += len(active)
        kept = np.array([i for i in active if i not in shrunk], dtype=np.int64)
        state["active"] = kept
        solved = pg_max - pg_min <= bounds[2]
        if len(active) == n:
            bounds[3] = 0.0
            if len(kept) > 0:
                bounds[2] = min(bounds[2], max(relative_eps * (pg_max - pg_min), 1e-11))
        else:
            bounds[3] += len(active)
        if solved or bounds[3] >= shrunk_work * n:
            if len(kept) < n:
                state["active"] = np.arange(n)
                bounds[0], bounds[1] = np.inf, -np.inf
                continue
            if solved:
                return True
        bounds[0] = pg_max if pg_max > 0 else np.inf
        bounds[1] = pg_min if pg_min < 0 else -np.inf
    return False


# ----------------------------------------------------------------- proximal Newton


def newton_derivatives(problem: obj.Problem, y, margins):
    """(ℓ'(z), ℓ''(z), Σ ℓ(z)) from the formulas of :mod:`dask_scd.objectives`."""
    return (
        obj.loss_derivative(problem.loss, y, margins),
        obj.loss_second_derivative(problem.loss, y, margins),
        float(obj.loss_value(problem.loss, y, margins).sum()),
    )


def newton_hessian_vector(X, weights, v, v0=0.0):
    """(Xᵀ(w ∘ (Xv + v0)), Σ w ∘ (Xv + v0)), unscaled."""
    s = weights * (X.astype(np.float64) @ v + v0)
    return X.T.astype(np.float64) @ s, float(s.sum())


def newton_weighted_gram(X, weights, working, intercept):
    """A_Wᵀ diag(w) A_W with A_W = [X[:, W], 1] (the column of ones with an intercept)."""
    A = X[:, working].astype(np.float64)
    if intercept:
        A = np.hstack([A, np.ones((len(A), 1))])
    return A.T @ (weights[:, None] * A)


def _model_violation(q, w, l1, l2):
    """Distance from 0 to q + l2·w + l1·∂|w|."""
    if w != 0.0:
        return abs(q + l2 * w + l1 * np.sign(w))
    return max(abs(q) - l1, 0.0)


def newton_gram_cd_epoch(hessian, q, coef, delta, order, l1, l2, intercept):
    """Coordinate minimization of cᵀΔ + ½ΔᵀHΔ + Σ_j penalty(θ_j + Δ_j) (the last coordinate
    unpenalized with ``intercept``), q = c + HΔ kept; returns the largest violation.
    The oracle of :func:`dask_scd.kernels.newton.gram_cd_epoch`, so written apart from it."""
    last = len(q) - 1 if intercept else len(q)
    worst = 0.0
    for j in order:
        h = hessian[j, j]
        old = coef[j] + delta[j]
        if j == last:
            if h <= 0:
                continue
            worst = max(worst, abs(q[j]))
            step = -q[j] / h
        else:
            worst = max(worst, _model_violation(q[j], old, l1, l2))
            step = prox_newton(old, q[j], h, l1, l2) - old
        delta[j] += step
        q += hessian[:, j] * step
    return worst


def newton_column_cd_epoch(X, order, grad, curv, coef, delta, direction, l1, l2, delta_b):
    """Coordinate minimization of the model gᵀu/n + ½uᵀDu/n + penalty(θ + Δ), u = XΔ + Δb
    kept in ``direction``; column −1 in ``order`` is the intercept. Returns the largest
    violation."""
    n = X.shape[0]
    worst = 0.0
    for j in order:
        column = np.ones(n) if j < 0 else X[:, j].astype(np.float64)
        q = column @ (grad + curv * direction) / n
        h = column * column @ curv / n
        if j < 0:
            if h <= 0:
                continue
            worst = max(worst, abs(q))
            step = -q / h
            delta_b[0] += step
        else:
            old = coef[j] + delta[j]
            worst = max(worst, _model_violation(q, old, l1, l2))
            step = prox_newton(old, q, h, l1, l2) - old
            delta[j] += step
        direction += step * column
    return worst


def newton_signed_scatter(X, u):
    """(Xᵀ min(u, 0), Xᵀ max(u, 0))."""
    X = X.astype(np.float64)
    return X.T @ np.minimum(u, 0.0), X.T @ np.maximum(u, 0.0)
