"""The scalar update math: one copy, compiled for every device.

Losses and their derivatives, the penalty and its prox-Newton coordinate step, the
logistic's third-order Taylor bound, the dual coordinate step of SDCA, and the constants
of every line search. Each function is a numba ``njit(inline="always")`` function of
scalars: the CPU kernels (:mod:`dask_scd.kernels.cpu`, :mod:`~dask_scd.kernels.block`,
:mod:`~dask_scd.kernels.sdca`, :mod:`~dask_scd.kernels.gram`) inline them, the CUDA
kernels (:mod:`dask_scd.kernels.cuda`) call them as device functions, and the numpy
reference (``tests/kernel_reference.py``) calls them on scalars or through
``.py_func`` on arrays. The vectorized formulas of :mod:`dask_scd.objectives` stay
independent of this module: they are the oracle the tests hold it to.

Loss codes are :data:`dask_scd.objectives.LOSS_CODES` (numba cannot take strings cheaply).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from dask_scd.objectives import LOSS_CODES

SQUARED = LOSS_CODES["squared"]
LOGISTIC = LOSS_CODES["logistic"]
HINGE = LOSS_CODES["hinge"]
SQUARED_HINGE = LOSS_CODES["squared_hinge"]

# Armijo constant of every line search (Tseng & Yun 2009): accept a step t of a
# prox-Newton direction Δ when F(θ + tΔ) − F(θ) ≤ ARMIJO · t · (gᵀΔ + penalty change).
ARMIJO = 0.01
# Two schedules of trial steps, for two costs of a trial. A sequential search (one
# coordinate in memory, where a trial is a pass over one column) halves t up to
# MAX_BACKTRACK times. A batched search (the block engine and the coarse step, where every
# trial costs a round trip over row chunks) evaluates TRIAL_STEPS in one pass.
BACKTRACK = 0.5
MAX_BACKTRACK = 40
TRIAL_STEPS = 0.25 ** np.arange(4)
# A smooth L2 Newton step whose unit step passes Armijo is doubled while F keeps falling,
# at most MAX_EXTRAPOLATION times. F is convex along the direction, so its first rise
# brackets the best of the doublings. Far from the optimum a logistic model's curvature
# at the iterate overestimates the curvature along the step (the margins saturate) and
# the unit step stops short: benchopt's logistic L2 200 × 500 at λ = 0.01, F from 0.69
# to 0.127 at t = 1, to within 1.3e-4 of F* at t = 4.
MAX_EXTRAPOLATION = 6
DOUBLINGS = 2.0 ** np.arange(1, MAX_EXTRAPOLATION + 1)


def extrapolates(problem) -> bool:
    """Whether a Newton step of ``problem`` that passes Armijo at t = 1 is extended to
    the best of :data:`DOUBLINGS`: a smooth L2 problem whose model is not exact (not the
    squared loss, where t = 1 is the minimum along the step; not an L1 term, whose
    prox-Newton point set coefficients to zero)."""
    return problem.l1 == 0.0 and problem.loss != "squared"


def best_doubling(at_one, doubled) -> float:
    """The step t ∈ {1, 2, 4, ...} after which F stops falling: ``at_one`` is F(θ + Δ),
    ``doubled`` F at θ + tΔ for t in :data:`DOUBLINGS` in turn (read only as far as
    needed). F is convex along Δ, so the first rise brackets the best doubling."""
    t, best = 1.0, at_one
    for value in doubled:
        if not value < best:
            break
        t, best = 2.0 * t, value
    return t


# ------------------------------------------------------------------------- primal


@njit(inline="always")
def loss(loss, y, z):
    if loss == SQUARED:
        return 0.5 * (y - z) * (y - z)
    t = 1.0 - y * z
    if loss == HINGE:
        return t if t > 0.0 else 0.0
    if loss == SQUARED_HINGE:
        return t * t if t > 0.0 else 0.0
    u = -y * z
    return _logistic(u, math.exp(-abs(u)))


@njit(inline="always")
def _logistic(u, e):
    """log(1 + exp(u)) without overflow, from e = exp(−|u|)."""
    return u + math.log1p(e) if u > 0.0 else math.log1p(e)


@njit(inline="always")
def _sigmoid(u, e):
    """σ(u) = 1/(1 + e^{-u}) without overflow, from e = exp(−|u|)."""
    return 1.0 / (1.0 + e) if u >= 0.0 else e / (1.0 + e)


@njit(inline="always")
def loss_d1_d2(loss, y, z):
    """First and second derivative of the loss in the margin z."""
    if loss == SQUARED:
        return z - y, 1.0
    if loss == LOGISTIC:
        s = sigmoid(-y * z)
        return -y * s, s * (1.0 - s)
    t = 1.0 - y * z
    if loss == SQUARED_HINGE:
        if t > 0.0:
            return -2.0 * y * t, 2.0
        return 0.0, 0.0
    if t > 0.0:  # hinge: a subgradient
        return -y, 0.0
    return 0.0, 0.0


@njit(inline="always")
def loss_and_d1_d2(code, y, z):
    """(:func:`loss`, :func:`loss_d1_d2`) of the loss ``code`` at once, the same bits:
    for the logistic both read e^{−|u|}, u = −yz, computed here once (Newton's
    derivatives over Adult's rows: 0.55 against 0.72 ms)."""
    if code != LOGISTIC:
        d1, d2 = loss_d1_d2(code, y, z)
        return loss(code, y, z), d1, d2
    u = -y * z
    e = math.exp(-abs(u))
    s = _sigmoid(u, e)
    return _logistic(u, e), -y * s, s * (1.0 - s)


@njit(inline="always")
def logistic_conjugate(b):
    """ℓ*(−a) of the logistic loss at β = a·y = ``b`` in [0, 1]: b·log b + (1 − b)·log(1 − b)
    (0 at the ends); its negative is the dual's term, the binary entropy."""
    if 0.0 < b < 1.0:
        return b * np.log(b) + (1.0 - b) * np.log(1.0 - b)
    return 0.0


@njit(inline="always")
def penalty(l1, l2, t):
    return l1 * abs(t) + 0.5 * l2 * t * t


@njit(inline="always")
def prox_newton(old, g, h, l1, l2):
    """argmin_t g(t−old) + h/2 (t−old)² + l1|t| + l2/2 t²  (soft-thresholded Newton step)."""
    z = h * old - g
    denom = h + l2
    if denom <= 0.0:
        return old
    if z > l1:
        return (z - l1) / denom
    if z < -l1:
        return (z + l1) / denom
    return 0.0


@njit(inline="always")
def coordinate_violation(old, g, l1, l2):
    """dist(−g, ∂(l1|t| + l2 t²/2) at t = old): zero exactly at a coordinate's optimum."""
    if old > 0.0:
        return abs(g + l2 * old + l1)
    if old < 0.0:
        return abs(g + l2 * old - l1)
    return max(abs(g) - l1, 0.0)


@njit(inline="always")
def clip(t, lo, hi):
    """t clipped into [lo, hi]: the minimizer over an interval of a convex function of one
    variable whose minimizer is t (the bounded coordinate step). By comparisons:
    numba.cuda does not compile min/max of floats."""
    if t < lo:
        return lo
    if t > hi:
        return hi
    return t


@njit(inline="always")
def box_violation(old, g, l1, l2, lo, hi):
    """dist(0, g + ∂(l1|t| + l2 t²/2)(old) + N_[lo, hi](old)): a coordinate's optimality
    violation with the box's normal cone, which opens the side of a bound it sits on."""
    if old > 0.0:
        low = g + l2 * old + l1
        high = low
    elif old < 0.0:
        low = g + l2 * old - l1
        high = low
    else:
        low = g - l1
        high = g + l1
    if old <= lo:
        low = -np.inf
    if old >= hi:
        high = np.inf
    worst = 0.0
    if low > worst:
        worst = low
    if -high > worst:
        worst = -high
    return worst


@njit(inline="always")
def sigmoid(u):
    """σ(u) = 1/(1 + e^{-u}) without overflow."""
    return _sigmoid(u, math.exp(-abs(u)))


# sup |ℓ‴(z)| of the logistic loss: σ(1−σ)(1−2σ) peaks at 1/(6√3).
_LOGISTIC_D3 = 1.0 / (6.0 * math.sqrt(3.0))


@njit(inline="always")
def logistic_taylor_bound(model, h, delta, cube_mean):
    """Upper bound of f(θ + Δ) − f(θ) + penalty change, per coordinate (scalars or arrays):
    ``model + hΔ²/2 + sup|ℓ‴|·(Σ|x_ij|³/n)·|Δ|³/6`` (Taylor with remainder, logistic loss),
    with ``model = gΔ`` + the penalty change."""
    # |Δ| as np.maximum(Δ, −Δ): exact, elementwise on arrays, and (unlike np.abs) a ufunc
    # that numba.cuda lowers on scalars.
    magnitude = np.maximum(delta, -delta)
    return model + 0.5 * h * delta * delta + _LOGISTIC_D3 / 6.0 * cube_mean * magnitude**3


@njit(inline="always")
def cubic_accepts(g, h, old, delta, l1, l2, cube_mean):
    """Does the Armijo test surely pass at t = 1, without evaluating the loss?

    Taylor with remainder: f(θ + Δ) − f(θ) ≤ gΔ + hΔ²/2 + sup|ℓ‴|·(Σ|x_ij|³/n)·|Δ|³/6,
    exact in g and h, so a bound below the Armijo line proves what the line search would
    find (the two passes of loss evaluations it costs are skipped). ``cube_mean < 0``:
    no bound for this loss.
    """
    if cube_mean < 0.0:
        return False
    model = g * delta + penalty(l1, l2, old + delta) - penalty(l1, l2, old)
    return logistic_taylor_bound(model, h, delta, cube_mean) <= ARMIJO * model


# --------------------------------------------------------------------------- dual


@njit(inline="always")
def dual_interval(loss, y, a):
    """Range of t such that a + t stays in the domain of −ℓ*(−·) (β = a·y)."""
    if loss == SQUARED:
        return -np.inf, np.inf
    if loss == SQUARED_HINGE:  # β ≥ 0
        if y > 0:
            return -a, np.inf
        return -np.inf, -a
    if y > 0:  # logistic and hinge: β ∈ [0, 1]
        return -a, 1.0 - a
    return -1.0 - a, -a


@njit(inline="always")
def dual_d1_d2(loss, y, a):
    """First and second derivative of −ℓ*(−a) in a, for the quadratic duals (squared,
    hinge, squared hinge; the logistic's step is :func:`_logistic_dual_step`)."""
    if loss == SQUARED:
        return y - a, -1.0
    if loss == HINGE:
        return y, 0.0
    beta = a * y  # squared hinge
    return y * (1.0 - 0.5 * beta), -0.5


@njit(inline="always")
def dual_step(loss, y, a, m, q):
    """Maximize φ(t) = d(a + t) − t m − q t²/2 over the domain of d = −ℓ*(−·).

    ``q = ‖x_i‖²/(αn)`` (+ρ). Quadratic duals (squared, hinge, squared hinge) are solved
    by one clipped Newton step; the logistic dual by :func:`_logistic_dual_step`.
    """
    if loss == LOGISTIC:
        return _logistic_dual_step(y, a, m, q)
    lo, hi = dual_interval(loss, y, a)
    d1, d2 = dual_d1_d2(loss, y, a)
    slope = d1 - m
    curvature = d2 - q
    if curvature < 0.0:
        t = -slope / curvature
    elif slope > 0.0:
        t = hi
    elif slope < 0.0:
        t = lo
    else:
        t = 0.0
    t = clip(t, lo, hi)
    if not math.isfinite(t):
        return 0.0
    return t


@njit(inline="always")
def _logistic_dual_step(y, a, m, q):
    """The logistic dual's step t, solved in the logit u of the new β = (a + t)·y.

    With β_a = a·y ∈ [0, 1] the optimality condition y·log((1 − β)/β) = m + q·t reads,
    for β = σ(u), g(u) = u + y·m + q·(σ(u) − β_a) = 0: g is increasing (g' = 1 +
    qσ(1 − σ) ≥ 1) and its root lies in [−ym − q(1 − β_a), −ym + qβ_a], where Newton's
    iteration is safeguarded by bisection. In β the root may lie within 1e-10 of a bound,
    where Newton's steps on β leave the bracket and bisection on β needed ~30–50 halvings
    a row in the first epochs; in u such a root is an ordinary number (|u| ≈ 23), reached
    in a few Newton steps. Returns t = y·σ(u) − a.
    """
    beta_a = a * y
    ym = y * m
    lo = -ym - q * (1.0 - beta_a)
    hi = -ym + q * beta_a
    if 0.0 < beta_a < 1.0:  # start from the current point, inside the bracket
        u = math.log(beta_a / (1.0 - beta_a))
        if not (lo <= u <= hi):
            u = 0.5 * (lo + hi)
    else:
        u = 0.5 * (lo + hi)
    last = math.inf  # |g| at the last point
    for _ in range(200):
        s = sigmoid(u)
        g = u + ym + q * (s - beta_a)
        if abs(g) <= 4e-16 * (abs(u) + abs(ym) + q * (s + beta_a)):
            break  # g is 0 to the rounding of its terms: no step can do better
        if g > 0.0:
            hi = u
        else:
            lo = u
        step = u - g / (1.0 + q * s * (1.0 - s))
        # Bisection where Newton's point leaves the bracket, or where |g| did not halve:
        # with q ≫ 1 and a root near β = 0, Newton's points can alternate between the
        # two flanks of g's steep part (g ≈ −36 at u = −32, +2.9e5 at u = 3.6) without
        # the bracket closing in, until the iterations run out at a point far from the
        # root (β = 0.97 for a root at 4.5e-5, the dual falling by 140 in one visit).
        if not (lo <= step <= hi) or abs(g) > 0.5 * last:
            step = 0.5 * (lo + hi)
        last = abs(g)
        if abs(step - u) <= 1e-15 * (1.0 + abs(u)):
            u = step
            break
        u = step
    return y * sigmoid(u) - a
