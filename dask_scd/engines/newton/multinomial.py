"""In-memory engine of the multinomial (softmax) logistic loss: Newton steps, certified.

Every outer step reads, at Z = XW + b, the probabilities P = softmax(Z), the gradient
G = Xᵀ(P − Y)/n (one pass over X) and the certificate of (W, b) from the same sums
(:func:`dask_scd.objectives.multinomial.certify`, no further pass); then:

- L2 penalty: a Newton direction by conjugate gradients on Hessian-vector products
  (two passes each: U = XV + v_b, then XᵀR/n with R_ik = p_ik(U_ik − Σ_l p_il U_il)),
  preconditioned by the Hessian's diagonal, to a relative residual that tightens with
  the gradient (the forcing term of inexact Newton: superlinear);
- an L1 term: proximal Newton, coordinate descent on the local quadratic model
  (:func:`dask_scd.kernels.softmax.model_cd`), to a tolerance that tightens with the
  gap (newGLMNET, Yuan, Ho & Lin 2012);

and the longest step t ∈ {1, ½, ¼, ...} that passes the Armijo test on the true
objective (O(n·K) per trial: the direction's XΔ is kept). Without a penalty
(``penalty=None``) the same Newton steps stop on the gradient's norm.

The margins are recomputed from (W, b) at every step, so each certificate is of the
iterate as returned.

With sample weights v (scaled to mean 1) every sum over examples is weighted: the loss
Σ v_i ℓ_i, the gradient Xᵀ(V(P − Y))/n, the class counts, the Hessian's rows
(R ← VR, the diagonal's P(1 − P) ← V·P(1 − P)), the coordinate-descent model's
derivatives and the line search; the certificate is that of the weighted dual
(:mod:`dask_scd.objectives.multinomial`).
"""

from __future__ import annotations

import time
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.engines.base import Options, Run, Trace
from dask_scd.engines.newton.newton_loop import (
    STOP,
    TRIALS,
    Meter,
    Stopping,
    armijo,
    forcing_term,
    optimality_violation,
    uncertified,
)
from dask_scd.engines.pcg import MAX_ITER, conjugate_gradients
from dask_scd.kernels.softmax import model_cd
from dask_scd.objectives import multinomial as mn

# Steps without a smaller certified gap before the engine stops: the gap of an L1 problem
# may rise for a step or two while its support settles (seen on iris), so more than the
# binary engine's three.
_PATIENCE = 8
# Coordinate-descent sweeps of the quadratic model per outer step, at most.
_MAX_SWEEPS = 500
# A zero coefficient joins the working set when |∂f| exceeds this share of αρ.
_WORKING_SHARE = 0.5
# The model's derivatives are read to about this relative precision.
_ROUNDING_VIOLATION = 1e-13


class Softmax:
    """X with what every step of the engine reads: one-hot labels, XᵀVY, Xᵀv, the
    (weighted) class counts, and X² for the Hessian's diagonal (computed once); ``weights``
    v scaled to mean 1, or None (every example weighs 1)."""

    def __init__(self, X, codes, n_classes: int, weights=None):
        self.X = X
        self.codes = codes
        self.n_classes = n_classes
        self.weights = weights
        self.Y = mn.one_hot(codes, n_classes)
        self.counts = mn.class_counts(codes, n_classes, weights)
        self.xt_onehot = self.transpose_dot(self.weighted(self.Y))
        self.column_sums = column_sums(X, weights)
        self.squares = X.multiply(X).tocsr() if sp.issparse(X) else np.square(X)

    @property
    def n(self) -> int:
        return self.X.shape[0]

    def dot(self, W, b):
        """XW + b, of shape (n_samples, K)."""
        return np.asarray(self.X @ W, dtype=np.float64) + b

    def transpose_dot(self, M):
        """XᵀM, of shape (n_features, K) (or (n_features,) for M of shape (n_samples,))."""
        return np.asarray(self.X.T @ M, dtype=np.float64)

    def weighted(self, M):
        """VM: the rows of M of shape (n_samples, K) times their weights."""
        return mn.weighted_rows(M, self.weights)

    def diagonal(self, P):
        """The Hessian's diagonal of the loss: (X²)ᵀ(V·P(1 − P))/n and Σ_i v p(1 − p)/n."""
        curvature = self.weighted(P * (1.0 - P))
        return (
            np.asarray(self.squares.T @ curvature, dtype=np.float64) / self.n,
            curvature.sum(axis=0) / self.n,
        )

    @cached_property
    def csc(self):
        """X as CSC triples for the coordinate-descent kernel (built once)."""
        csc = sp.csc_matrix(self.X, dtype=np.float64)
        csc.sort_indices()
        return csc.indptr, csc.indices, csc.data


def column_sums(X, weights):
    """Xᵀv (Xᵀ1 without weights), float64 of shape (n_features,)."""
    if weights is None:
        return np.asarray(X.sum(axis=0), dtype=np.float64).ravel()
    return np.asarray(X.T @ weights, dtype=np.float64).ravel()


def curvature_rows(P, U, weights):
    """R = V·(P ∘ (U − (P ∘ U)1)): the rows whose Xᵀ R is the loss's Hessian times (V, v_b),
    U = XV + v_b."""
    return mn.weighted_rows(P * (U - (P * U).sum(axis=1, keepdims=True)), weights)


class Point:
    """The iterate (W, b) with its margins' probabilities, loss and gradient."""

    def __init__(self, softmax: Softmax, problem: obj.Problem, W, b):
        self.W, self.b = W, b
        margins = softmax.dot(W, b)
        self.P, lse = mn.softmax_rows(margins)
        self.loss_total = obj.weighted_sum(
            lse - margins[np.arange(softmax.n), softmax.codes], softmax.weights
        )
        weighted = softmax.weighted(self.P)  # VP
        self.xt_prob = softmax.transpose_dot(weighted)
        self.margins = margins
        n = softmax.n
        self.grad_loss = (self.xt_prob - softmax.xt_onehot) / n  # Xᵀ(V(P − Y))/n
        self.grad_b = (
            (weighted.sum(axis=0) - softmax.counts) / n
            if problem.fit_intercept
            else np.zeros(softmax.n_classes)
        )
        self.objective = self.loss_total / n + mn.penalty_value(problem, W)


def fit_multinomial(data: InMemory, problem: obj.Problem, options: Options) -> Run:
    """Newton steps for the multinomial loss, any penalty, with or without intercept.

    ``data.X``: ndarray or scipy.sparse matrix of shape (n_samples, n_features);
    ``data.y``: class indices of shape (n_samples,), ``data.classes`` their labels;
    ``data.weights``: the sample weights scaled to mean 1, or None.
    ``options.max_iter`` counts Newton steps. The Run's ``coef`` has shape
    (n_classes, n_features) and its ``intercept`` shape (n_classes,).
    """
    softmax = Softmax(data.X, data.y, int(data.y.max()) + 1, data.weights)
    mn.check_class_weights(softmax.counts, problem.fit_intercept)
    b = np.zeros(softmax.n_classes)
    if problem.fit_intercept:  # the best b for W = 0: softmax(b) = the class frequencies
        b = np.log(softmax.counts) - np.log(softmax.counts).mean()
    W = np.zeros((data.X.shape[1], softmax.n_classes))
    return newton_steps(_Steps(softmax, problem), problem, options, W, b)


def newton_steps(steps, problem: obj.Problem, options: Options, W, b) -> Run:
    """The outer loop of both multinomial engines (in memory, and over dask in
    :mod:`dask_scd.engines.newton.multinomial_dask`): at (W, b) the gradient pass
    (``steps.point``, which may move b: the dask engine's first pass finds the best b for
    W = 0), its certificate (``steps.certify``; the relative gradient norm without a
    penalty), the stopping rule, then a Newton step (``steps.move``: (t, Δ, Δb)).
    ``steps.recertify(W, b)`` certifies the returned iterate when it is an earlier one."""
    trace = Trace(options.progress, options.callback)
    gaps = []  # P − D of every certified step, unclamped
    stopping = Stopping(options.tol, options.max_iter, patience=_PATIENCE)
    step, cert, grad_norm = 0, None, None
    while True:
        point = steps.point(W, b)
        W, b = point.W, point.b
        if problem.unpenalized:  # the largest gradient entry relative to max(1, |P|)
            violation = optimality_violation(problem, point.grad_loss, W, point.grad_b)
            measure = grad_norm = violation / max(1.0, abs(point.objective))
        else:
            cert = steps.certify(point)
            gaps.append(cert.gap)
            measure = cert.relative_gap
        trace.record(step, measure, point.objective)
        if cert is None:
            if grad_norm <= options.tol or step >= options.max_iter or trace.stopped:
                break
        elif stopping.check(cert, step, W, b) == STOP or trace.stopped:
            break
        t, delta, delta_b = steps.move(point)
        if t == 0.0:
            break
        step += 1
        W, b = W + t * delta, b + t * delta_b
    extras = steps.meter.as_dict()
    if cert is None:
        # Without a penalty W + c1ᵀ is as good as W: the one with rows summing to zero.
        W = W - W.mean(axis=1, keepdims=True)
        final = uncertified(point.objective, W.T.shape)
        run = Run(W.T.copy(), _centred(b), final, step, trace.history, extras, grad_norm=grad_norm)
        return trace.ended(run)
    W, b, cert = stopping.finish(cert, W, b, steps.recertify)
    extras["primal_minus_dual"] = gaps
    run = Run(W.T.copy(), _centred(b), mn.transposed(cert), step, trace.history, extras)
    return trace.ended(run)


class _Steps:
    """:func:`newton_steps` on X in memory (:class:`Softmax`)."""

    def __init__(self, softmax: Softmax, problem: obj.Problem):
        self.softmax, self.problem = softmax, problem
        self.meter, self.first_norm = Meter(), None

    def point(self, W, b) -> Point:
        tick = time.perf_counter()
        point = Point(self.softmax, self.problem, W, b)
        self.meter.add("gradient", 2.0, tick)
        return point

    def certify(self, point: Point) -> obj.Certificate:
        """The certificate of (W, b) at ``point`` (:func:`dask_scd.objectives.multinomial.certify`)."""
        softmax = self.softmax
        fixed = (softmax.xt_onehot, softmax.column_sums, softmax.counts, softmax.weights)
        cert, _ = mn.certify(
            self.problem, point.W, softmax.codes, point.P, point.loss_total, point.xt_prob, *fixed
        )
        return cert

    def recertify(self, W, b) -> obj.Certificate:
        return self.certify(Point(self.softmax, self.problem, W, b))

    def move(self, point: Point):
        softmax, problem = self.softmax, self.problem
        delta, delta_b, U, self.first_norm = _direction(
            softmax, problem, point, self.first_norm, self.meter
        )
        tick = time.perf_counter()
        n, codes, weights = softmax.n, softmax.codes, softmax.weights

        def losses():  # O(n·K) per trial: the margins move by tU
            return (mn.loss_sum(point.margins + t * U, codes, weights) / n for t in TRIALS)

        t = armijo_step(problem, point, delta, delta_b, TRIALS, losses)
        self.meter.add("line_search", 0.0, tick)
        return t, delta, delta_b


def _direction(softmax: Softmax, problem: obj.Problem, point: Point, first_norm, meter):
    """(Δ, δb, U, first_norm): the Newton direction at ``point``, by coordinate descent on
    the model for an L1 term, else by conjugate gradients, to a forcing term that falls
    with the square root of the optimality measure relative to its first value."""
    tick = time.perf_counter()
    if problem.l1 > 0.0:
        violation = optimality_violation(problem, point.grad_loss, point.W, point.grad_b)
        forcing, first_norm = forcing_term(violation, first_norm, 0.1)
        delta, delta_b, U, passes = _l1_direction(softmax, problem, point, violation, forcing)
        meter.add("solve:cd", passes, tick)
    else:
        grad, forcing, first_norm = l2_forcing(problem, point, first_norm)
        delta, delta_b, U, passes = _l2_direction(softmax, problem, point, grad, forcing)
        meter.add("solve:cg", passes, tick)
    return delta, delta_b, U, first_norm


def l2_forcing(problem, point, first_norm):
    """(∇P = ∇f + αW, the forcing term of Newton-CG, ``first_norm``): the term falls with
    the square root of ‖∇P‖ relative to its first value (inexact Newton: superlinear), at
    most ½; ``first_norm`` is that first value (None before the first step)."""
    grad = point.grad_loss + problem.l2 * point.W
    norm = float(np.sqrt(np.sum(grad * grad) + np.sum(point.grad_b**2)))
    return grad, *forcing_term(norm, first_norm, 0.5)


def _centred(b):
    """b − mean(b): the same probabilities (softmax is blind to a common shift; the
    preconditioned steps drift along it), the intercepts scikit-learn reports."""
    return b - b.mean()


# ------------------------------------------------------------------------ L2: Newton-CG


def newton_cg(product, rhs: tuple, diag, diag_b, forcing: float, fit_intercept: bool):
    """Preconditioned conjugate gradients (:func:`dask_scd.engines.pcg.conjugate_gradients`)
    on H (d, d_b) = ``rhs`` from zero, the preconditioner diag(diag, diag_b) (H's
    diagonal; an entry that is not positive reads as 1), to ‖residual‖ ≤ forcing·‖rhs‖, at
    most :data:`dask_scd.engines.pcg.MAX_ITER` steps and no more than the system's size.
    ``product((v, v_b))`` returns H (v, v_b). Returns (d, d_b, number of products), d_b
    zero without an intercept."""
    diag = np.where(diag > 0.0, diag, 1.0)
    diag_b = np.where(diag_b > 0.0, diag_b, 1.0)
    (d, d_b), products = conjugate_gradients(
        product,
        rhs,
        lambda r: (r[0] / diag, r[1] / diag_b),
        forcing,
        min(MAX_ITER, rhs[0].size + rhs[1].size),
        dot=lambda a, b: np.sum(a * b),
    )
    if not fit_intercept:
        d_b[:] = 0.0
    return d, d_b, products


def _hessian_product(softmax: Softmax, problem, P, V, v_b):
    """(H V, H v_b) of the objective, through U = XV + v_b."""
    U = softmax.dot(V, v_b)
    R = curvature_rows(P, U, softmax.weights)
    HV = softmax.transpose_dot(R) / softmax.n + problem.l2 * V
    Hb = R.sum(axis=0) / softmax.n if problem.fit_intercept else np.zeros_like(v_b)
    return HV, Hb


def _l2_direction(softmax: Softmax, problem, point: Point, grad, forcing):
    """Preconditioned conjugate gradients on H d = −∇P to ‖r‖ ≤ forcing·‖∇P‖; returns
    (Δ, Δb, XΔ + Δb, passes over X)."""
    diag, diag_b = softmax.diagonal(point.P)
    d, d_b, products = newton_cg(
        lambda v: _hessian_product(softmax, problem, point.P, *v),
        (-grad, -point.grad_b),
        diag + problem.l2,
        diag_b,
        forcing,
        problem.fit_intercept,
    )
    return d, d_b, softmax.dot(d, d_b), 2.0 + 2.0 * products


# ------------------------------------------------------- L1 / elastic net: proximal Newton


def _l1_direction(softmax: Softmax, problem, point: Point, violation: float, forcing: float):
    """Coordinate descent on the quadratic model to a violation of ``forcing·violation``
    (inexact proximal Newton: Lee, Sun & Saunders 2014); returns (Δ, Δb, XΔ + Δb,
    passes)."""
    n, K = point.P.shape
    p = point.W.shape[0]
    diag, diag_b = softmax.diagonal(point.P)
    U = np.zeros((n, K))
    s = np.zeros(n)
    delta = np.zeros((p, K))
    delta_b = np.zeros(K)
    # Not below the rounding of the model's derivatives (sums of terms of this size).
    floor = _ROUNDING_VIOLATION * (problem.l1 + float(np.abs(point.grad_loss).max(initial=0.0)))
    tol = max(forcing * violation, floor)
    # The working set: the non-zero coefficients and the zeros whose derivative comes
    # near the threshold (the others stay at zero in the model unless their neighbours
    # move far; the next outer step's gradient, and the gap, would tell).
    active = (point.W != 0.0) | (np.abs(point.grad_loss) > _WORKING_SHARE * problem.l1)
    indptr, indices, values = softmax.csc
    sweeps = model_cd(
        indptr,
        indices,
        values,
        point.P,
        softmax.weighted(point.P),
        U,
        s,
        point.grad_loss,
        diag,
        point.W,
        delta,
        point.grad_b,
        delta_b,
        diag_b,
        problem.l1,
        problem.l2,
        problem.fit_intercept,
        _MAX_SWEEPS,
        tol,
        active,
    )
    return delta, delta_b, U, 1.0 + float(sweeps) * float(active.mean())


# ----------------------------------------------------------------------- line search


def armijo_step(problem, point, delta, delta_b, trials, losses) -> float:
    """The step t of :func:`~dask_scd.engines.newton.newton_loop.armijo` among ``trials``
    (1, ½, ¼, ...); ``losses()`` gives the mean loss at each trial step (read only as far
    as needed, and only when the test runs)."""
    W = point.W
    slope = float(np.sum(point.grad_loss * delta) + np.sum(point.grad_b * delta_b))
    decrease = slope + mn.penalty_value(problem, W + delta) - mn.penalty_value(problem, W)

    def values():
        for t, loss in zip(trials, losses()):
            yield t, loss + mn.penalty_value(problem, W + t * delta)

    moved = np.any(delta) or np.any(delta_b)
    return armijo(point.objective, decrease, moved, values())[0]
