"""Numba kernel of the multinomial engine's L1 / elastic-net inner solver
(:mod:`dask_scd.engines.newton.multinomial`): coordinate descent on the local quadratic model.

At the probabilities P of the current iterate the model of a step (Δ, Δb) is::

    q(Δ, Δb) = ⟨G, Δ⟩ + ⟨g_b, Δb⟩ + (1/2n) Σ_i u_iᵀ(diag(p_i) − p_i p_iᵀ)u_i + Σ_jk g(W_jk + Δ_jk)

with u_i = Δᵀx_i + Δb (U = XΔ + Δb, of shape (n_samples, K)), G = Xᵀ(P − Y)/n and
g_b = Σ_i (p_i − y_i)/n. Its partial derivative in Δ_jk is
G_jk + (1/n) Σ_i x_ij p_ik (U_ik − s_i), with s_i = Σ_l p_il U_il, and its curvature
(1/n) Σ_i x_ij² p_ik(1 − p_ik). With sample weights v each example's term of the sum
carries v_i (the model's derivatives read VP in place of P; s_i does not): each
coordinate step is exact (newGLMNET's inner solver
over a K-column block of the Hessian). U and s are kept up to date, so a step costs
O(nnz of column j); the line search then reads U without a pass over X.
"""

from __future__ import annotations

from numba import njit

from dask_scd.kernels.scalar import coordinate_violation, prox_newton


@njit(nogil=True, cache=True)
def model_cd(
    indptr,
    indices,
    data,
    prob,
    weighted_prob,
    U,
    s,
    grad,
    diag,
    coef,
    delta,
    grad_b,
    delta_b,
    diag_b,
    l1,
    l2,
    fit_intercept,
    max_sweeps,
    tol,
    active,
):
    """Sweeps of coordinate descent on the quadratic model, in place on ``delta``,
    ``delta_b``, ``U`` and ``s``; X is CSC (``indptr``, ``indices``, ``data``);
    ``weighted_prob`` is VP (``prob`` itself without sample weights).

    A sweep visits every (feature, class) coordinate of the working set (``active``, of
    shape (n_features, K)), then every intercept. Stops after
    the first sweep in which every coordinate's optimality violation, read before its
    step (the distance of −∂q/∂Δ_jk to the penalty's subdifferential), was ≤ ``tol``,
    or after ``max_sweeps``. Returns the sweeps run.
    """
    n, K = prob.shape
    p = len(indptr) - 1
    inv_n = 1.0 / n
    sweeps = 0
    while sweeps < max_sweeps:
        sweeps += 1
        largest = 0.0
        for j in range(p):
            start, stop = indptr[j], indptr[j + 1]
            if start == stop:
                continue
            for k in range(K):
                h = diag[j, k]
                if not active[j, k] or (h <= 0.0 and l2 <= 0.0):
                    continue
                # ∂q/∂Δ_jk = G_jk + (1/n) Σ_i x_ij v_i p_ik (U_ik − s_i)
                partial = 0.0
                for m in range(start, stop):
                    i = indices[m]
                    partial += data[m] * weighted_prob[i, k] * (U[i, k] - s[i])
                gm = grad[j, k] + partial * inv_n
                z = coef[j, k] + delta[j, k]
                worst = coordinate_violation(z, gm, l1, l2)
                if worst > largest:
                    largest = worst
                step = prox_newton(z, gm, h, l1, l2) - z
                if step == 0.0:
                    continue
                delta[j, k] += step
                for m in range(start, stop):
                    i = indices[m]
                    change = step * data[m]
                    U[i, k] += change  # U[:, k] += step · x_j
                    s[i] += change * prob[i, k]
        if fit_intercept:
            for k in range(K):
                h = diag_b[k]
                if h <= 0.0:
                    continue
                partial = 0.0
                for i in range(n):
                    partial += weighted_prob[i, k] * (U[i, k] - s[i])
                gm = grad_b[k] + partial * inv_n
                if abs(gm) > largest:
                    largest = abs(gm)
                step = -gm / h
                delta_b[k] += step
                for i in range(n):
                    U[i, k] += step
                    s[i] += step * prob[i, k]
        if largest <= tol:
            break
    return sweeps
