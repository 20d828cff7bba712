"""The L2 Newton step in the space of the rows, for problems with fewer rows than columns.

With C = diag(ℓ''(z)/n) and α the L2 weight, the Hessian A = XᵀCX + αI is p × p, but the
Woodbury identity writes its inverse through the n × n kernel K = XXᵀ:

    A⁻¹ = (1/α)·[I − XᵀR·S⁻¹·RX],  R = C^½,  S = αI + RKR,

S symmetric positive definite for any α > 0 (its eigenvalues are at least α, also where
C has zeros). K is formed once per fit (one product of X with its transpose); a step
factors S (n³/3) and reads X twice, Xr and Xᵀw, instead of the p × p Gram or a dozen
conjugate-gradient products. The intercept's row and column, Xᵀc and Σc, are eliminated
through the same factor: A⁻¹Xᵀv = Xᵀ(v − R·S⁻¹·RKv)/α, no pass over X.

Before the first step, K also serves SDCA in its own form (:func:`dual_start`): the dual
a ∈ ℝⁿ with the margins m = Ka/(αn) of w = Xᵀa/(αn), a visit reading a row of K. Where
the rows are far from collinear its epochs converge fast and cost n² against the steps'
n³/3, and a fit of a few Newton steps becomes one of a few dozen epochs; where they do
not, the rate each epoch measures stops them within a few.
"""

from __future__ import annotations

import numpy as np

from dask_scd.engines import cholesky
from dask_scd.engines.cost_model import BLAS_SPEEDUP, kernel_dual_ns
from dask_scd.engines.local.sdca import dual_start as sdca_start
from dask_scd.engines.newton.design import GRAM_MAX, Design
from dask_scd.kernels import newton as kernels
from dask_scd.kernels.sdca import kernel_dual_epoch

# Newton steps over which forming K once is spread when the step's costs are compared.
_STEPS = 6.0
# Largest ratio of S's largest diagonal entry to α at which the kernel step is taken.
_CONDITION_MAX = 1e10
# Epochs over which :func:`dual_start` measures the rate of its gaps.
_RATE_WINDOW = 4
# The share of Newton's predicted cost the epochs may be predicted to take. A rate
# measured early is often better than the later ones (nearly collinear rows, ρ = 0.9:
# 0.26, 0.52, 0.56, ... 0.75 an epoch), so a near tie is stopped before it is paid in
# full. Chosen on 42 problems (n < p, dense, sparse and binary rows, ρ = 0 to 0.9 and a
# common factor, α = 1/n to 1e-4/n, logistic and squared hinge; the cost model's units,
# Newton's measured steps): at 0.75 the fits take 0.44x of Newton's time in geometric
# mean, 1.24x at worst (0.49x / 1.19x at 0.5, 0.44x / 1.72x at 1).
_SHARE = 0.75


def kernel_cost(design: Design) -> float:
    """Flops of a kernel step, K's product spread over :data:`_STEPS` steps; inf where K
    (n × n float64) would be too large to form."""
    n = design.rows.n_major
    if n > GRAM_MAX:
        return np.inf
    factor = n**3 / 3.0 / BLAS_SPEEDUP  # LAPACK's blocked Cholesky runs at BLAS speed
    return design.kernel_flops / _STEPS + factor + 2.0 * 2.0 * design.nnz + 2.0 * n * n


def kernel_direction(design: Design, model):
    """The Newton direction (Δ, Δb, XΔ + Δb) of ``model`` (an L2 problem, α > 0) from the
    kernel: two passes over X, one Cholesky factor of n × n. None where α is too small
    beside the curvature (S's condition above :data:`_CONDITION_MAX`) or S does not
    factor: the caller then solves by conjugate gradients."""
    problem = model.problem
    n = design.rows.n_major
    l2 = problem.l2
    K = design.kernel
    c = model.curv / n
    root = np.sqrt(c)
    S = design.system_buffer(n)  # F-ordered: LAPACK factors it in place
    if kernels.scaled_kernel(K, root, l2, S) > _CONDITION_MAX * l2:  # S = RKR + αI
        return None  # Δ = (r − Xᵀw)/α would lose its digits to cancellation
    try:
        factor = cholesky.factor(S, lower=True, check_finite=False, overwrite=True)
    except np.linalg.LinAlgError:
        return None
    r = -(model.grad + l2 * model.coef)
    xr = design.rows.dot(r)  # Xr: one pass
    w = root * cholesky.solve(factor, root * xr)
    image = (xr - K @ w) / l2  # X·A⁻¹r
    delta_b = 0.0
    if problem.fit_intercept:
        kc = K @ c
        u = (c - root * cholesky.solve(factor, root * kc)) / l2
        ku = K @ u  # X·A⁻¹Xᵀc
        schur = float(c.sum()) - float(c @ ku)  # Σc − cᵀXA⁻¹Xᵀc > 0 where Σc > 0
        if schur > 1e-300:
            delta_b = (-model.grad_b - float(u @ xr)) / schur
            w = w + (l2 * delta_b) * u
            image -= delta_b * ku
    delta = (r - design.rows.scatter(w)) / l2  # Xᵀw: the second pass
    return delta, delta_b, image + delta_b


def dual_start(design: Design, problem, y, tol: float):
    """A start for Newton's kernel steps from SDCA's epochs in the kernel's form (no
    intercept, no sample weights, a loss whose Newton step is not exact): (θ, a, Xᵀa/n,
    epochs) with θ = Xᵀa'/(αn), a' the dual point of the lowest P and a the last (the
    pair at a gap of tol/2), or Nones and the epochs where they stopped short: Newton
    then starts from θ = 0.

    Each epoch's P(w) and D(a) are read from the margins alone (they share ½α‖w‖² =
    aᵀm/(2n)); the gap G is that of the lowest P so far and the last D (D rises at every
    epoch, P may not: the primal point of a dual one far from the optimum can be worse
    than the last). The epochs go on while their cost so far plus the epochs
    still needed to reach tol·P at the rate of the last ones (the smallest G so far, its
    geometric mean fall over :data:`_RATE_WINDOW` epochs) stays within :data:`_SHARE` of
    what Newton's steps from θ = 0 are predicted to cost
    (:func:`~dask_scd.engines.cost_model.kernel_dual_ns`).
    Where the rows are nearly collinear (a factor common to all rows) the rate is
    ~0.95 an epoch and the epochs stop after two or three. A point stopped short is not
    Newton's start: measured, its steps from such points were more than from θ = 0.
    At tol/2, Newton's certificate (from X, with a offered) ends the fit without a step;
    a loose tol does not return a point whose P is above P(0), Newton's own start (after
    one epoch P can be 20x P(0), and its margins overflow a float's exp).
    """
    n = design.rows.n_major
    alpha_n = problem.l2 * n
    epoch_ns, budget_ns = kernel_dual_ns(problem, n, design.nnz, design.rows.dense)
    K, code = design.kernel, problem.loss_code
    a = sdca_start(problem, y, 0.0)
    m = K @ a / alpha_n
    scratch = np.empty((3, n))
    at_zero = kernels.derivatives(code, y, np.zeros(n), scratch[0], scratch[1]) / n  # P(0)
    best, lowest = [np.inf], (np.inf, a)  # the gaps; the lowest P and its dual point
    while len(best) * epoch_ns <= _SHARE * budget_ns:
        kernel_dual_epoch(K, y, a, m, code, alpha_n)
        # Σℓ(m_i), then Σ −ℓ*(−a_i) and aᵀm (the certificate's kernels, a = −(−a))
        loss_sum = kernels.derivatives(code, y, m, scratch[0], scratch[1])
        np.negative(a, out=scratch[0])
        dual_sum, dot = kernels.projected_dual(code, y, scratch[0], m, False, scratch[2])[2:4]
        half = dot / (2.0 * n)  # ½α‖w‖²
        if loss_sum / n + half < lowest[0]:
            lowest = (loss_sum / n + half, a.copy())
        gap = lowest[0] - (dual_sum / n - half)  # of w(lowest's a) and a
        epochs = len(best)
        if not np.isfinite(gap):
            break
        if gap <= 0.5 * tol * lowest[0] and lowest[0] <= at_zero:
            start = design.rows.scatter(lowest[1]) / alpha_n
            # Xᵀa/n of the dual point offered: α·θ where θ is a's own primal point
            same = np.array_equal(lowest[1], a)
            return start, a, problem.l2 * start if same else design.rows.scatter(a) / n, epochs
        best.append(min(gap, best[-1]))
        k = min(epochs - 1, _RATE_WINDOW)
        rate = (best[-1] / best[-1 - k]) ** (1.0 / k) if k > 0 else 0.0
        if 0.0 < rate:
            to_go = np.log(best[-1] / (tol * lowest[0])) / -np.log(rate) if rate < 1.0 else np.inf
            if (epochs + to_go) * epoch_ns > _SHARE * budget_ns:
                break
    return None, None, None, len(best) - 1
