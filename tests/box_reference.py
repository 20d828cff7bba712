"""An independent reference for problems with coefficient bounds (tests/test_bounds.py and
the bounded rows of tests/conformance_matrix.py): scipy's L-BFGS-B on the same objective.

θ = p − m with p ∈ [max(l, 0), max(u, 0)] and m ∈ [max(−u, 0), max(−l, 0)] turns
ρα‖θ‖₁ into the linear ρα·Σ(p + m) (at the optimum one of p_j, m_j is 0), so the whole
objective is smooth for the squared, logistic and squared hinge losses, and the box is
L-BFGS-B's own bounds; the intercept is free.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit


def bounded_optimum(X, y, loss, alpha, l1_ratio, fit_intercept, lower, upper, weights=None):
    """(θ, b, P) minimizing ``(1/Σw) Σ w_i ℓ(y_i, x_iᵀθ + b) + α(ρ‖θ‖₁ + (1−ρ)/2‖θ‖²)``
    over ``lower ≤ θ ≤ upper``; y in ±1 for the classification losses."""
    X = np.asarray(X, dtype=np.float64)
    n, p = X.shape
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    lower = np.broadcast_to(np.asarray(lower, dtype=np.float64), (p,))
    upper = np.broadcast_to(np.asarray(upper, dtype=np.float64), (p,))
    l1, l2 = alpha * l1_ratio, alpha * (1.0 - l1_ratio)

    def split(v):
        return v[:p], v[p : 2 * p], v[2 * p] if fit_intercept else 0.0

    def value_and_grad(v):
        pos, neg, b = split(v)
        theta = pos - neg
        z = X @ theta + b
        value, d1 = _loss(loss, y, z)
        g = X.T @ (w * d1)
        f = w @ value + l1 * (pos.sum() + neg.sum()) + 0.5 * l2 * theta @ theta
        grad = np.concatenate([g + l1 + l2 * theta, -g + l1 - l2 * theta])
        if fit_intercept:
            grad = np.append(grad, w @ d1)
        return f, grad

    box = [(max(lo, 0.0), max(hi, 0.0)) for lo, hi in zip(lower, upper)]
    box += [(max(-hi, 0.0), max(-lo, 0.0)) for lo, hi in zip(lower, upper)]
    box = [(a, None if np.isinf(b) else b) for a, b in box]
    if fit_intercept:
        box.append((None, None))
    start = np.array([np.clip(0.0, a, b if b is not None else np.inf) for a, b in box[: 2 * p]])
    start = np.append(start, [0.0] * int(fit_intercept))
    result = minimize(
        value_and_grad,
        start,
        jac=True,
        method="L-BFGS-B",
        bounds=box,
        options={"maxiter": 100_000, "maxfun": 200_000, "ftol": 1e-16, "gtol": 1e-13},
    )
    pos, neg, b = split(result.x)
    return pos - neg, float(b), float(result.fun)


def _loss(loss, y, z):
    """(ℓ(y, z), ∂ℓ/∂z) elementwise."""
    if loss == "squared":
        return 0.5 * (y - z) ** 2, z - y
    if loss == "logistic":
        return np.logaddexp(0.0, -y * z), -y * expit(-y * z)
    if loss == "squared_hinge":
        slack = np.maximum(0.0, 1.0 - y * z)
        return slack**2, -2.0 * y * slack
    raise ValueError(f"no smooth reference for loss={loss!r}")
