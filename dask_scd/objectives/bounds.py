"""Box constraints on the coefficients: l_j ≤ θ_j ≤ u_j.

The penalty of a bounded problem is ``g_j(t) = α(ρ|t| + (1−ρ)/2 t²) + ι_[l_j, u_j](t)``.
Each coordinate step stays exact: a convex function of one variable is minimized over an
interval at the clip of its unconstrained minimizer, so the prox step becomes
``clip(prox(…), l_j, u_j)``. The conjugate is

    g*_j(s) = sup_{t ∈ [l_j, u_j]} s t − α(ρ|t| + (1−ρ)/2 t²),

attained at the clip of the unconstrained maximizer S(s, αρ)/(α(1−ρ)) into the interval
(a concave function of one variable); for ρ = 1 the maximum of the piecewise-linear
``s t − α|t|`` is at an end of the interval or at the clip of 0, and an infinite side is
cut at the Lipschitzing bound B ≥ ‖θ*‖₁ (:func:`dask_scd.objectives.lipschitz_bound`), as
without bounds. Where a side is finite the dual is unrestricted on that side, so the gap
of a bounded problem still goes to 0 at its optimum.
"""

from __future__ import annotations

import hashlib

import numpy as np


class Bounds:
    """The box [lower, upper] of the coefficients, one interval per feature.

    Parameters
    ----------
    lower, upper : array of shape (n_features,)
        float64, ``-inf`` / ``+inf`` for an open side, ``lower <= upper``
        (checked once by :func:`dask_scd.validation.check_bounds`).
    """

    __slots__ = ("lower", "upper", "_digest")

    def __init__(self, lower, upper):
        self.lower = np.asarray(lower, dtype=np.float64)
        self.upper = np.asarray(upper, dtype=np.float64)
        both = np.concatenate([self.lower, self.upper]).tobytes()
        self._digest = hashlib.sha1(both).hexdigest()[:12]

    def __eq__(self, other) -> bool:
        return isinstance(other, Bounds) and self._digest == other._digest

    def __hash__(self) -> int:
        return hash(self._digest)

    def __repr__(self) -> str:
        return f"Bounds(n_features={len(self.lower)}, digest={self._digest!r})"

    def __reduce__(self):
        return Bounds, (self.lower, self.upper)

    def take(self, columns) -> Bounds:
        """The bounds of ``columns`` (indices or a slice), in their order."""
        return Bounds(self.lower[columns], self.upper[columns])

    def clip(self, coef, columns=slice(None)) -> np.ndarray:
        """``coef`` (the coefficients of ``columns``) clipped into the box: a new array."""
        return np.clip(coef, self.lower[columns], self.upper[columns])

    def start(self) -> np.ndarray:
        """The point of the box nearest 0: where a fit starts cold."""
        return self.clip(np.zeros(len(self.lower)))

    def contains(self, coef) -> bool:
        return bool(np.all((coef >= self.lower) & (coef <= self.upper)))


def penalty_terms(l1: float, l2: float, bounds: Bounds, coef):
    """g_j(θ_j) elementwise, +inf outside the box."""
    inside = (coef >= bounds.lower) & (coef <= bounds.upper)
    return np.where(inside, l1 * np.abs(coef) + 0.5 * l2 * coef * coef, np.inf)


def conjugate(l1: float, l2: float, bounds: Bounds, s, bound: float):
    """g*_j(s_j) elementwise for the box; ``bound`` is B (used where ρ = 1)."""
    s = np.asarray(s, dtype=np.float64)
    lower, upper = bounds.lower, bounds.upper
    if l2 > 0.0:
        t = np.clip(np.sign(s) * np.maximum(np.abs(s) - l1, 0.0) / l2, lower, upper)
        return s * t - l1 * np.abs(t) - 0.5 * l2 * t * t
    lo, hi = np.maximum(lower, -bound), np.minimum(upper, bound)
    best = _linear_value(s, l1, np.clip(0.0, lo, hi))
    with np.errstate(invalid="ignore"):
        best = np.maximum(best, np.where(np.isfinite(lo), _linear_value(s, l1, lo), -np.inf))
        best = np.maximum(best, np.where(np.isfinite(hi), _linear_value(s, l1, hi), -np.inf))
    best = np.where(np.isinf(hi) & (s - l1 > 0.0), np.inf, best)
    return np.where(np.isinf(lo) & (s + l1 < 0.0), np.inf, best)


def _linear_value(s, l1, t):
    """s·t − l1|t|, 0 where t = 0 (also for an infinite s)."""
    with np.errstate(invalid="ignore"):
        return np.where(t == 0.0, 0.0, s * t - l1 * np.abs(t))


def reachable(bounds: Bounds, correlation):
    """How far Xᵀa/n pulls each coefficient at 0 in a direction its box allows: s where
    only increases are allowed, −s where only decreases are, |s| where both, −inf where
    neither (the working sets rank the coefficients at 0 by it)."""
    up = np.where(bounds.upper > 0.0, correlation, -np.inf)
    down = np.where(bounds.lower < 0.0, -correlation, -np.inf)
    return np.maximum(up, down)


def violations(l1: float, l2: float, bounds: Bounds, coef, correlation):
    """dist(0, −s_j + ∂g_j(θ_j)) for every feature, the box's normal cone included:
    zero exactly at a coordinate's optimum (the kernels' ``box_violation``)."""
    g = -correlation
    sign = np.sign(coef)
    low = np.where(coef == 0.0, g - l1, g + l2 * coef + l1 * sign)
    high = np.where(coef == 0.0, g + l1, low)
    low = np.where(coef <= bounds.lower, -np.inf, low)
    high = np.where(coef >= bounds.upper, np.inf, high)
    return np.maximum(np.maximum(low, -high), 0.0)


def rescale_top(bounds: Bounds, correlation) -> float:
    """The largest pull of Xᵀa/n towards an open side: the κ of the rescaled lasso dual
    point makes it at most αρ (on a finite side the dual is unrestricted)."""
    up = np.where(np.isinf(bounds.upper), correlation, -np.inf)
    down = np.where(np.isinf(bounds.lower), -correlation, -np.inf)
    return float(np.maximum(up, down).max(initial=0.0))


def rescaled(problem, correlation, coef, bound: float) -> tuple:
    """(κ, Σ_j g*_j(κs_j), the coordinate gaps) of the rescaled lasso dual point κa in the
    box (:func:`dask_scd.objectives.rescaled_lasso_from_dual`): κ brings the pull towards
    an open side down to αρ (:func:`rescale_top`), where g* is finite; B cuts rounding."""
    top = rescale_top(problem.bounds, correlation)
    kappa = min(1.0, problem.l1 / top) if top > 0 else 1.0
    scaled = kappa * correlation
    g_star = conjugate(problem.l1, problem.l2, problem.bounds, scaled, bound)
    gaps = penalty_terms(problem.l1, problem.l2, problem.bounds, coef) + g_star - scaled * coef
    return kappa, float(g_star.sum()), gaps
