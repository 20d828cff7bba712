"""Duality-gap certificates of the in-memory engines.

:func:`primal_certificate` certifies (θ, b) from the dual point of its margins,
:func:`best_certificate` the best of several dual points (primal SCD),
:func:`dual_certificate` a dual point a and w = Xᵀa/(αn) (SDCA), and :class:`DualMemory`
the outer steps of the Newton engines with the best dual value seen so far.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from dask_scd import objectives as obj
from dask_scd.kernels import newton as kernels

# Dual points kept for extrapolation (celer's K).
_EXTRAPOLATE = 5


def primal_certificate(problem, transpose_dot, y, coef, margins, weights=None) -> obj.Certificate:
    """Gap of (θ, b) with the dual point built from the margins; ``transpose_dot(a) = Xᵀa``;
    ``weights``: the sample weights v (mean 1) or None."""
    if weights is None:  # two sweeps of numba kernels instead of some twenty numpy calls
        n = len(y)
        grad = np.empty(n)
        loss_sum = kernels.derivatives(problem.loss_code, y, margins, grad, np.empty(n))
        return fused_certificate(
            problem, y, coef, margins, grad, loss_sum, lambda scales, a: transpose_dot(a) / n
        )
    sums, a = margins_dual_point(problem, y, margins, weights)
    correlation = transpose_dot(a) / len(y)
    return certificate_at(problem, y, coef, sums["loss"], a, correlation, margins, weights)


def fused_certificate(problem, y, coef, margins, grad, loss_sum, correlation_of):
    """The certificate of (θ, b) at unweighted ``margins`` z, given ``grad`` g = ℓ'(z) (as
    :func:`dask_scd.kernels.newton.derivatives` gives it) and ``loss_sum`` Σ ℓ(y_i, z_i);
    ``correlation_of(scales, a)`` is Xᵀa/n of the dual point a = −g made feasible, its
    positive entries scaled by ``scales[0]``, its negative ones by ``scales[1]``. Rescaled
    for a pure L1 penalty."""
    n = len(y)
    a = np.empty(n)
    # The projection, the dual loss and Σ a_i z_i in one kernel.
    fused = kernels.projected_dual(problem.loss_code, y, grad, margins, problem.fit_intercept, a)
    correlation = correlation_of(fused[:2], a)
    cert = obj.primal_certificate(problem, n, coef, loss_sum, fused[2], correlation, fused[3])
    rescaled = _rescaled_dual_mean(problem.loss, y, a, n, fused[4], fused[5])
    return obj.rescaled_lasso_from_dual(problem, cert, coef, rescaled)


def margins_dual_point(problem, y, margins, weights=None) -> tuple[dict, np.ndarray]:
    """The margins' sums (:func:`dask_scd.objectives.margin_sums`) and their dual point
    a = −v∘ℓ'(ŷ), made feasible."""
    sums = obj.margin_sums(problem, y, margins, weights)
    return sums, obj.dual_point(problem, y, margins, obj.dual_scales(problem, sums), weights)


def certificate_at(problem, y, coef, loss_sum, a, correlation, margins, weights=None):
    """The gap of (θ, b) at the margins ``margins`` and the feasible dual point a, given
    Σ v_i ℓ_i and Xᵀa/n (``correlation``); rescaled for a pure L1 penalty."""
    dual_loss_sum = _dual_loss_sum(problem.loss, y, a, weights)
    n, margin_dot = len(y), obj.vdot(a, margins)
    cert = obj.primal_certificate(
        problem, n, coef, loss_sum, dual_loss_sum, correlation, margin_dot
    )
    return obj.rescaled_lasso_certificate(problem, cert, y, a, coef, weights)


def best_certificate(problem, matrix, y, coef, margins, extrapolated, kept, weights=None):
    """The best certificate of (θ, b) over three dual points, and the dual point to keep.

    The candidates are the dual point of the margins, that of the ``extrapolated``
    margins (celer's dual extrapolation; both from one pass over X) and ``kept``, the
    best of earlier certificates: a dual point's objective does not depend on θ, so an
    earlier one stays valid and is rescored in O(n + p). Any feasible dual point gives
    a valid gap; the highest dual objective is kept. The returned correlations are those
    of the plain dual point (its violations rank the working sets). ``weights``: the
    sample weights v (mean 1) or None.
    """
    n = len(y)
    sums, a = margins_dual_point(problem, y, margins, weights)
    if extrapolated is None:
        candidates = [(a, matrix.dot(a) / n)]
    else:
        ext = margins_dual_point(problem, y, extrapolated, weights)[1]
        xta, xt_ext = matrix.dot_pair(a, ext)
        candidates = [(a, xta / n), (ext, xt_ext / n)]
    if kept is not None:
        candidates.append(kept)
    best, best_point = None, None
    for dual, correlation in candidates:
        cert = certificate_at(problem, y, coef, sums["loss"], dual, correlation, margins, weights)
        if best is None or cert.dual > best.dual:
            best, best_point = cert, (dual, correlation)
    cert = obj.Certificate(
        best.primal, best.dual, best.coordinate_gaps, best.intercept_gap, candidates[0][1]
    )
    return cert, best_point


def dual_certificate(problem, matrix, y, dual_coef, coef, intercept_start, weights=None):
    """SDCA certificate of (a, w); returns it, the best intercept for w, and w.

    An ``a`` off the constraint Σ a_i = 0 (method of multipliers) is first projected onto
    it and w recomputed from the projection, so that the certificate stays valid.
    ``coef=None`` recomputes w = Xᵀa/(αn) exactly. With sample ``weights`` v, ``a`` is
    the dual of the weighted losses (β = a·y in [0, v_i] for the box duals).
    """
    alpha_n = problem.alpha * len(y)
    if problem.fit_intercept and dual_coef.sum() != 0.0:
        dual_coef = obj.project_sum_zero(dual_coef)
        coef = None
    if coef is None:
        coef = matrix.scatter(dual_coef) / alpha_n
    margins = matrix.dot(coef)
    intercept = 0.0
    if problem.fit_intercept:
        intercept = obj.optimal_intercept(
            problem.loss, y, margins, start=intercept_start, weights=weights
        )
    cert = obj.sdca_certificate(problem, y, dual_coef, coef, margins + intercept, weights)
    return cert, intercept, coef


def exact_dual_certificate(problem, matrix, y, dual_coef, intercept_start, weights=None):
    """The final certificate of a dual method: w = Xᵀa/(αn) recomputed exactly (the running
    w drifts from it by rounding over many axpys), certified as :func:`dual_certificate`
    does and by the dual point of its own margins (:func:`primal_certificate`), the better
    of the two. Returns (w, its intercept, the certificate)."""
    cert, intercept, coef = dual_certificate(
        problem, matrix, y, dual_coef, None, intercept_start, weights
    )
    margins = matrix.dot(coef) + intercept
    primal = primal_certificate(problem, matrix.scatter, y, coef, margins, weights)
    return coef, float(intercept), primal if primal.gap < cert.gap else cert


def _rescaled_dual_mean(loss, y, a, n, lin, quad):
    """κ ↦ Σ −ℓ*(−κa_i)/n from the sums of :func:`kernels.projected_dual`, in O(1) but for
    the logistic (a sweep over a: :func:`kernels.logistic_dual_sum`)."""
    if loss == "squared":
        return lambda kappa: (kappa * lin - 0.5 * kappa * kappa * quad) / n
    if loss == "hinge":
        return lambda kappa: kappa * lin / n
    if loss == "squared_hinge":
        return lambda kappa: (kappa * lin - 0.25 * kappa * kappa * quad) / n
    return lambda kappa: _dual_loss_sum(loss, y, a, None, kappa) / n


def _dual_loss_sum(loss, y, a, weights=None, kappa=1.0) -> float:
    """Σ_i −ℓ*(−κa_i) (−inf where κa leaves the dual's domain): one numba sweep for the
    unweighted logistic (two logarithms a row), numpy otherwise."""
    if loss == "logistic" and weights is None:
        return kernels.logistic_dual_sum(y, a, kappa)
    return float(obj.dual_loss(loss, y, kappa * a if kappa != 1.0 else a, weights).sum())


def with_values(cert: obj.Certificate, primal: float, dual: float) -> obj.Certificate:
    """``cert`` with another ``primal`` P(θ, b) and ``dual`` value D, a lower bound of P* (a
    fresher P, a higher D): the same coordinate gaps and correlation, the intercept's share
    the rest of P − D."""
    rest = primal - dual - float(cert.coordinate_gaps.sum())
    return obj.Certificate(primal, dual, cert.coordinate_gaps, rest, cert.correlation)


class DualMemory:
    """The certificate of each outer step, with the best dual value seen so far.

    Any feasible dual point bounds P* from below, so the gap of θ_t may use the highest
    dual value of every step. With an L1 term, celer's dual extrapolation (Massias,
    Gramfort & Salmon 2018) also tries Σ c_k a_k over the last K dual points a_k = −ℓ'(z_k),
    with c the Anderson weights of their differences, made feasible (clipped into the
    loss's dual domain, projected onto Σ a_i = 0, rescaled for the pure L1 penalty).
    """

    def __init__(self, problem, y, weights=None):
        self.problem, self.y, self.weights = problem, y, weights
        self.best = -np.inf
        self.points = deque(maxlen=_EXTRAPOLATE + 1)
        self.extrapolation_wins = 0

    def certify(self, design, coef, margins, grad_rows, parts, loss_sum):
        """The certificate at (θ, z) given g = ℓ'(z) and ``parts`` = Xᵀ of its negative
        and positive entries; returns it and the passes over X it took."""
        problem, y = self.problem, self.y
        n = len(y)

        def correlation_of(scales=(1.0, 1.0), a=None):
            # Xᵀa/n of a = −g with its positive entries (g < 0) scaled by scales[0], the
            # others by scales[1]: −(scales[0]·Xᵀg₋ + scales[1]·Xᵀg₊)/n, no pass over X.
            return -(scales[0] * parts[0] + scales[1] * parts[1]) / n

        if obj.gradient_certifies(problem):  # a = −g as it is
            cert = obj.gradient_certificate(problem, n, coef, loss_sum, correlation_of())
            return self.tighten(cert), 0.0
        passes = 0.0
        if self.weights is None:
            cert = fused_certificate(problem, y, coef, margins, grad_rows, loss_sum, correlation_of)
        else:
            a, scales = -grad_rows, (1.0, 1.0)  # no constraint on Σa: a = −g as it is
            if problem.fit_intercept:  # a = −g projected
                sums = {"pos": float(a[a > 0].sum()), "neg": float(a[a < 0].sum())}
                scales = obj.dual_scales(problem, sums)
                a = np.where(a > 0, a * scales[0], a * scales[1])
            cert = certificate_at(
                problem, y, coef, loss_sum, a, correlation_of(scales), margins, self.weights
            )
        if problem.l1 > 0.0:
            self.points.append(-grad_rows)
            if len(self.points) == self.points.maxlen:
                # Once per K + 1 steps: a pass each time would cost half a Gram step.
                extrapolated = self._extrapolate()
                self.points.clear()
                if extrapolated is not None:
                    value = self._dual_value(design, extrapolated)
                    self.extrapolation_wins += int(value > max(self.best, cert.dual))
                    self.best = max(self.best, value)
                    passes += 1.0
        return self.tighten(cert), passes

    def offer_linearized(self, design, grad_rows, curv, step, correlation=None) -> float:
        """Offer the dual point of the model solved at z: a' = −(g + d∘u), u = XΔ + Δb the
        model's step, the first-order model of −ℓ'(z + u). At a Newton step of an L2
        problem Xᵀa'/(n·α) is θ + Δ itself and Σa' = 0 with an intercept, so D* − D(a')
        is of the order of the square of the step's error, and P(θ) − D(a') of the
        order of P(θ) − P*; the gap of a = −ℓ'(z) is ‖∇P‖²/(2α), looser by up to the
        condition number. One pass over X, none when ``correlation`` = Xᵀa'/n is given and
        a' is feasible as it is; returns the passes. (For the squared loss a' is the next
        residual: the next certificate's own point.)"""
        if self.problem.loss == "squared":
            return 0.0
        a = -(grad_rows + curv * step)
        if correlation is not None and self.offer(a, correlation):
            return 0.0
        self._keep(self._dual_value(design, a))
        return 1.0

    def offer(self, a, correlation) -> bool:
        """Offer the dual point ``a`` given Xᵀa/n (``correlation``), no pass over X;
        returns whether it was feasible as it is (else nothing is kept)."""
        value = self._feasible_value(a, correlation)
        if value is None:
            return False
        self._keep(value)
        return True

    def _keep(self, value: float) -> None:
        # A point offered is tight enough for the gap to reach the rounding of P: a margin
        # for the rounding of D keeps the bound below it.
        self.best = max(self.best, value - obj.DUAL_ROUNDING * abs(value))

    def _feasible_value(self, a, correlation) -> float | None:
        """D(a) given Xᵀa/n, or None when a is outside the dual domain (it would be clipped
        and projected, which changes Xᵀa)."""
        problem, y = self.problem, self.y
        n = len(y)
        total = _dual_loss_sum(problem.loss, y, a, self.weights)
        if not np.isfinite(total):
            return None
        if problem.fit_intercept and abs(float(a.sum())) > 1e-12 * float(np.abs(a).sum()):
            return None
        conjugate = obj.penalty_conjugate(problem, correlation, np.inf)
        return total / n - float(conjugate.sum())

    def tighten(self, cert: obj.Certificate) -> obj.Certificate:
        """``cert`` with the best dual value seen (its own included)."""
        self.best = max(self.best, cert.dual)
        if not self.best > cert.dual:
            return cert
        return with_values(cert, cert.primal, self.best)

    def _extrapolate(self):
        points = np.array(self.points)
        differences = np.diff(points, axis=0)
        gram = differences @ differences.T
        try:
            weights = np.linalg.solve(
                gram + 1e-14 * np.trace(gram) * np.eye(len(gram)), np.ones(len(gram))
            )
        except np.linalg.LinAlgError:
            return None
        if not np.all(np.isfinite(weights)) or weights.sum() == 0.0:
            return None
        weights /= weights.sum()
        return weights @ points[1:]

    def _dual_value(self, design, a) -> float:
        """D(a) of a candidate made feasible (−inf if it cannot be)."""
        problem, y = self.problem, self.y
        n = len(y)
        beta = a * y
        upper = 1.0 if self.weights is None else self.weights  # the box scales with v_i
        if problem.loss in ("logistic", "hinge"):
            beta = np.minimum(np.maximum(beta, 0.0), upper)
        elif problem.loss == "squared_hinge":
            beta = np.maximum(beta, 0.0)
        a = beta * y if problem.loss != "squared" else a
        if self.weights is not None:
            a = np.where(self.weights > 0.0, a, 0.0)  # a weightless example's dual is 0
        if problem.fit_intercept:
            a = obj.project_sum_zero(a)
        correlation = design.rows.scatter(a) / n
        if problem.l2 == 0.0:
            top = float(np.abs(correlation).max(initial=0.0))
            kappa = min(1.0, problem.l1 / top) if top > 0 else 1.0
            return _dual_loss_sum(problem.loss, y, a, self.weights, kappa) / n
        conjugate = obj.penalty_conjugate(problem, correlation, np.inf)
        return _dual_loss_sum(problem.loss, y, a, self.weights) / n - float(conjugate.sum())
