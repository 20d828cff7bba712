"""The exact intercept of the hinge loss for fixed margins: the root of a piecewise-constant
derivative, found by sorting the breakpoints (:func:`dask_scd.objectives.optimal_intercept`)."""

from __future__ import annotations

import numpy as np


def hinge_intercept(y, margins) -> float:
    """Exact minimizer of the piecewise-linear (1/n) Σ max(0, 1 − y_i(m_i + b))."""
    pos = np.sort(1.0 - margins[y > 0])  # a positive example is active for b < 1 − m_i
    neg = np.sort(-1.0 - margins[y < 0])  # a negative example is active for b > −1 − m_i
    candidates = np.concatenate([pos, neg])
    if candidates.size == 0:
        return 0.0
    candidates.sort()
    # Right derivative at c: (#neg with −1−m ≤ c) − (#pos with 1−m > c); nondecreasing.
    slope = np.searchsorted(neg, candidates, side="right") - (
        len(pos) - np.searchsorted(pos, candidates, side="right")
    )
    first = int(np.searchsorted(slope, 0, side="left"))
    return float(candidates[min(first, len(candidates) - 1)])


def weighted_hinge_intercept(y, margins, weights) -> float:
    """Exact minimizer of Σ v_i max(0, 1 − y_i(m_i + b)) (:func:`hinge_intercept` with
    each example counted v_i times)."""
    pos_order = np.argsort(1.0 - margins[y > 0], kind="stable")
    neg_order = np.argsort(-1.0 - margins[y < 0], kind="stable")
    pos = (1.0 - margins[y > 0])[pos_order]
    neg = (-1.0 - margins[y < 0])[neg_order]
    pos_w = np.concatenate([[0.0], np.cumsum(weights[y > 0][pos_order])])
    neg_w = np.concatenate([[0.0], np.cumsum(weights[y < 0][neg_order])])
    candidates = np.sort(np.concatenate([pos, neg]))
    if candidates.size == 0:
        return 0.0
    # Right derivative at c: (weight of neg with −1−m ≤ c) − (weight of pos with 1−m > c).
    slope = neg_w[np.searchsorted(neg, candidates, side="right")] - (
        pos_w[-1] - pos_w[np.searchsorted(pos, candidates, side="right")]
    )
    first = int(np.searchsorted(slope, 0.0, side="left"))
    return float(candidates[min(first, len(candidates) - 1)])
