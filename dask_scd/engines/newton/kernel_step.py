"""The L2 Newton step in the space of the rows, for problems with fewer rows than columns.

With C = diag(ℓ''(z)/n) and α the L2 weight, the Hessian A = XᵀCX + αI is p × p, but the
Woodbury identity writes its inverse through the n × n kernel K = XXᵀ:

    A⁻¹ = (1/α)·[I − XᵀR·S⁻¹·RX],  R = C^½,  S = αI + RKR,

S symmetric positive definite for any α > 0 (its eigenvalues are at least α, also where
C has zeros). K is formed once per fit (one product of X with its transpose); a step
factors S (n³/3) and reads X twice, Xr and Xᵀw, instead of the p × p Gram or a dozen
conjugate-gradient products. The intercept's row and column, Xᵀc and Σc, are eliminated
through the same factor: A⁻¹Xᵀv = Xᵀ(v − R·S⁻¹·RKv)/α, no pass over X.
"""

from __future__ import annotations

import numpy as np

from dask_scd.engines import cholesky
from dask_scd.engines.cost_model import BLAS_SPEEDUP
from dask_scd.engines.newton.design import GRAM_MAX, Design
from dask_scd.kernels import newton as kernels

# Newton steps over which forming K once is spread when the step's costs are compared.
_STEPS = 6.0
# Largest ratio of S's largest diagonal entry to α at which the kernel step is taken.
_CONDITION_MAX = 1e10


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
