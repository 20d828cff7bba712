"""The minimizer of a convex φ in one dimension (an intercept, a step along a line): the
root of φ', nondecreasing, by Newton steps kept in a bracket."""

from __future__ import annotations

import numpy as np


def newton_root(
    slope_curvature, x: float, lo: float, hi: float, max_iter: int, scale: float = 1e-300
) -> float:
    """The root of a nondecreasing φ' from ``x`` in the bracket ``[lo, hi]`` of its sign
    change (an end may be infinite); ``slope_curvature(x)`` returns (φ'(x), φ''(x)), a
    slope of exactly 0 stopping there. Newton steps, with bisection where one would leave
    the bracket and a step of max(1, |x|) where it is open on that side; it stops when a
    step moves x by at most 1e-15·max(|x|, ``scale``), when the bracket closes to 1e-15 of
    its end, or after ``max_iter`` steps, and returns the last point."""
    for _ in range(max_iter):
        slope, curvature = slope_curvature(x)
        if slope == 0.0:
            return x
        if slope < 0.0:
            lo = x
        else:
            hi = x
        step = x - slope / curvature if curvature > 0.0 else np.nan
        if not lo < step < hi:
            if np.isfinite(lo) and np.isfinite(hi):
                step = 0.5 * (lo + hi)
            else:
                step = x - np.sign(slope) * max(1.0, abs(x))
        closed = np.isfinite(hi) and hi - lo <= 1e-15 * abs(hi)
        if closed or abs(step - x) <= 1e-15 * max(abs(x), scale):
            return step
        x = step
    return x
