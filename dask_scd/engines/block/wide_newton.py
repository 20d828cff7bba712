"""Newton over dask for any number of features: the curvature as products, never a matrix.

Above :data:`~dask_scd.engines.block.block_newton.MAX_FEATURES` the Newton step is found
by conjugate gradients on the products H v = Xᵀ diag(ℓ''(ŷ)) X v / n + l2·v (one
reduction, one read of each row chunk's cells), the intercept eliminated by its Schur
complement as in the dense solve, preconditioned by the diagonal and an exact solve on
whole-block shifts (:mod:`dask_scd.engines.coarse_level`); the line search and the
certificate are the dense engine's. An iteration reads the grid 2 + (CG iterations)
times, one wait each, whatever p. L2 penalties only (an L1 term needs columns of the
curvature: block SCD solves those). See "Any width" in ``docs/engines/block_newton.md``.
"""

from __future__ import annotations

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.cells import cell_view, labels, row_weights
from dask_scd.engines.coarse_level import block_sums, two_level
from dask_scd.engines.pcg import conjugate_gradients
from dask_scd.kernels import block as block_kernels
from dask_scd.runtime import passes

# Conjugate-gradient iterations of one Newton step, at most; and the forcing term: the
# residual is solved to min(_FORCING, √(relative gap)) of the gradient, so the steps
# become exact Newton steps (superlinear convergence) as the gap closes.
MAX_CG = 200
_FORCING = 0.1


# ---------------------------------------------------------------- row-chunk tasks


def _views(cells: list) -> list:
    return [cell_view(cell) for cell in cells]


def wide_row(cells: list, y, row_sums, state: dict, offsets, problem: obj.Problem) -> tuple:
    """One read of the row chunk for a Newton iteration: fresh margins ŷ = Xθ + b, the
    gradient and certificate statistics (:func:`dask_scd.runtime.passes.certificate_stats`'s
    keys), the curvature's h_x = Xᵀℓ'', h₀ = Σℓ'', diagonal (X∘X)ᵀℓ'' and its coarse
    part SᵀDS on the block-sum directions S = [X_B 1] (``row_sums``, see
    :func:`dask_scd.engines.block.block_coarse.block_row_sums`).

    Returns (statistics, margins, curvature ℓ''(ŷ)).
    """
    views = _views(cells)
    margins = passes.refresh_margins(views, views[0].n_rows, state, offsets)
    stats = passes.certificate_stats(views, y, margins, problem)
    d1, d2 = passes.weighted_derivatives(problem.loss_code, labels(y), margins, row_weights(y))
    stats["hx"] = np.concatenate([view.rmatvec(d2) for view in views])
    stats["hdiag"] = np.concatenate([view.rmatvec(d2, squared=True) for view in views])
    stats["h0"] = np.array([d2.sum()])
    stats["coarse"] = block_kernels.coarse_stats(row_sums.counts, row_sums.column_of, d1, d2)[1]
    return stats, margins, d2


def curvature_product(cells: list, curvature, offsets, v) -> dict:
    """The row chunk's share of Xᵀ diag(ℓ'') X v."""
    views = _views(cells)
    w = curvature * passes.cells_matvec(views, v, offsets, np.zeros(views[0].n_rows))
    return {"hv": np.concatenate([view.rmatvec(w) for view in views])}


def line_trials(cells: list, y, margins, direction: dict, offsets, problem) -> dict:
    """Σ ℓ(ŷ + t·u) − ℓ(ŷ) over the row chunk for each trial step, u = XΔ + δ
    (:func:`~dask_scd.runtime.passes.newton_line_trials`), without the doublings of a
    unit step: a direction from conjugate gradients cut at the forcing term is not the
    model's minimizer, and extending it cost steps (one-hot 200k × 611k logistic at
    α = 0.1/n: 11 steps to 1e-6 against 9 with unit steps)."""
    views = _views(cells)
    u = passes.cells_matvec(
        views, direction["d_coef"], offsets, np.full(views[0].n_rows, float(direction["d_b"]))
    )
    return passes.newton_line_trials(
        problem, labels(y), margins, u, row_weights(y), doublings=False
    )


# ---------------------------------------------------------------- the client's solve


def newton_cg_direction(
    problem: obj.Problem,
    n_samples: int,
    state: dict,
    total: dict,
    product,
    relative_gap: float,
    offsets,
    tol_primal: float | None = None,
) -> tuple[dict, int]:
    """The Newton direction (Δθ, δb) by preconditioned conjugate gradients.

    ``product(v)`` returns Xᵀ diag(ℓ'') X v summed over the row chunks (one reduction).
    For the squared loss the model is the objective: the residual r of the solve is the
    gradient of P at the step, whose gap is at most ‖r‖²/(2·l2), so CG stops at
    ‖r‖ ≤ √(l2·tol·P) (``tol_primal`` = tol·P) and one step certifies tol.
    Returns the direction (the keys of :func:`dask_scd.engines.block.block_newton.newton_direction`)
    and the number of products taken.
    """
    n = n_samples
    theta = np.asarray(state["coef"], dtype=np.float64)
    terms = model_terms(problem, n, total)
    gradient, g0, h0, hx, eliminate = terms
    l2 = problem.l2
    # min over δ of the model: δ = −(g0 + hxᵀΔ)/h0 leaves the Schur complement in Δ.
    rhs = -(gradient + l2 * theta - (hx * (g0 / h0) if eliminate else 0.0))

    def schur(v):
        hv = product(v) / n + l2 * v
        return hv - hx * (float(hx @ v) / h0) if eliminate else hv

    diagonal = total["hdiag"] / n + l2 - (hx * hx / h0 if eliminate else 0.0)
    inverse = 1.0 / np.maximum(diagonal, max(l2, np.finfo(float).tiny))
    # The coarse level (dask_scd.engines.coarse_level): exact on whole-block shifts.
    sizes = np.diff(offsets)
    k = len(sizes)
    block_of = np.repeat(np.arange(k), sizes)
    small = total["coarse"][:k, :k] / n + l2 * np.diag(sizes.astype(np.float64))
    if eliminate:
        z_hx = block_sums(hx, block_of, k)
        small = small - np.outer(z_hx, z_hx) / h0
    precondition = two_level(inverse, small, block_of, k)
    forcing = min(_FORCING, np.sqrt(max(relative_gap, 0.0)))
    if problem.loss == "squared" and tol_primal is not None and l2 > 0.0:
        norm = float(np.linalg.norm(rhs))
        forcing = min(1.0, np.sqrt(l2 * tol_primal) / norm) if norm > 0.0 else 0.0
    d_coef, products = conjugate_gradients(schur, rhs, precondition, forcing, MAX_CG)
    target = theta + d_coef
    pen = 0.5 * l2 * float(target @ target - theta @ theta)
    return newton_step(problem, state, theta, d_coef, terms, pen), products


def model_terms(problem: obj.Problem, n_samples: int, total: dict) -> tuple:
    """Of the model summed over the row chunks (``total``): (∇f = Xᵀℓ'(ŷ)/n, g₀, h₀, h_x,
    whether the intercept is eliminated: fitted, with curvature h₀ > 0)."""
    n = n_samples
    h0 = total["h0"][0] / n
    return (
        -(total["xt_pos"] + total["xt_neg"]) / n,
        -(total["pos"][0] + total["neg"][0]) / n,
        h0,
        total["hx"] / n,
        problem.fit_intercept and h0 > 0.0,
    )


def newton_step(problem: obj.Problem, state: dict, theta, d_coef, terms: tuple, pen: float):
    """The direction (Δθ = ``d_coef``, δb) from ``state``: δb minimizes the model
    (:func:`model_terms`) given Δθ, a gradient step where the intercept is flat; and the
    model's change, ``pen`` that of the penalty."""
    gradient, g0, h0, hx, eliminate = terms
    if eliminate:
        d_b = -(g0 + float(hx @ d_coef)) / h0
    else:
        d_b = -g0 if problem.fit_intercept else 0.0
    return {
        "coef": theta,
        "intercept": float(state["intercept"]),
        "d_coef": d_coef,
        "d_b": float(d_b),
        "model": float(gradient @ d_coef) + g0 * d_b + pen,
    }
