"""The one-dimensional problem behind a flat direction (the coarse steps)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dask_scd.objectives import Problem


def best_shift(
    problem: Problem, values, linear: float = 0.0, curvature: float = 0.0, presorted: bool = False
) -> float:
    """argmin_c linear·c + curvature/2·c² + Σ_k g(c − values_k), g(t) = αρ|t| + α(1−ρ)/2 t².

    The one-dimensional problem behind a *flat direction*: on a complete one-hot group
    (every example has exactly one 1 among the group's columns), moving θ_G by −c and the
    intercept by +c leaves every margin unchanged, so only the penalty decides c
    (``linear = curvature = 0``). With a loss model along the direction it is one
    coordinate of the coarse Newton step of the block engine. The derivative
    ``linear + curvature·c + l1·Σ sign(c − v_k) + l2·Σ (c − v_k)`` is monotone and
    piecewise linear between the sorted values; the root is found exactly, by bisection
    over the breakpoints (O(log k) once the values are sorted: ``presorted`` says they
    are, for a caller that solves many such problems on the same values).
    """
    v = (
        np.asarray(values, dtype=np.float64)
        if presorted
        else np.sort(np.asarray(values, dtype=np.float64))
    )
    k = len(v)
    l1, l2 = problem.l1, problem.l2
    total = float(v.sum())
    slope = l2 * k + curvature  # of the derivative between breakpoints
    if l1 == 0.0 or k == 0:
        return float((l2 * total - linear) / slope) if slope > 0 else 0.0

    def right(i):  # f'(v_i + 0), with i + 1 values at or below v_i (distinct values)
        return linear + curvature * v[i] + l1 * (2 * (i + 1) - k) + l2 * (k * v[i] - total)

    lo, hi = 0, k  # the first breakpoint where f'(v_m + 0) ≥ 0 (k if none)
    while lo < hi:
        mid = (lo + hi) // 2
        if right(mid) < 0.0:
            lo = mid + 1
        else:
            hi = mid
    m = lo
    if m < k:
        left = linear + curvature * v[m] + l1 * (2 * m - k) + l2 * (k * v[m] - total)
        if left <= 0.0 or slope <= 0.0:
            return float(v[m])  # 0 lies in the subdifferential at the kink v_m
    elif slope <= 0.0:
        return float(v[-1])
    # The root is inside the open interval just below v_m (or above all values).
    return float((l2 * total - l1 * (2 * m - k) - linear) / slope)
