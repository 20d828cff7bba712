"""What the outer loops of the Newton-type engines share: the meter of passes and
seconds, the stopping rule with the best certified iterate it returns, the Armijo line
search, the optimality violation and the forcing term of inexact Newton, and the
certificate of a fit without a penalty (:mod:`dask_scd.engines.newton.newton`,
:mod:`~dask_scd.engines.newton.hinge_newton`, :mod:`~dask_scd.engines.newton.lbfgs`,
:mod:`~dask_scd.engines.newton.multinomial`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from dask_scd import objectives as obj
from dask_scd.engines.certificates import primal_certificate
from dask_scd.kernels.scalar import ARMIJO, BACKTRACK, MAX_BACKTRACK

# Outer steps without a smaller certified gap before the engine stops.
_STALLS = 3
# Below this relative model decrease the Armijo test reads the rounding of F.
_ROUNDING = 1e-11
# The trial steps of the line searches: 1, ½, ¼, ...
TRIALS = tuple(BACKTRACK**k for k in range(MAX_BACKTRACK))


@dataclass
class Meter:
    """Passes over X and seconds, per kind of work (extras of the Run)."""

    passes: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)

    def add(self, kind: str, passes: float, since: float) -> None:
        self.passes[kind] = self.passes.get(kind, 0.0) + passes
        self.seconds[kind] = self.seconds.get(kind, 0.0) + time.perf_counter() - since

    def as_dict(self) -> dict:
        return {
            "passes": dict(self.passes),
            "seconds": dict(self.seconds),
            "total_passes": float(sum(self.passes.values())),
        }


REFRESH, STOP, GO = "refresh", "stop", "go"


@dataclass
class Stopping:
    """When an outer loop of Newton steps stops, and which iterate it returns.

    A gap at ``tol`` on margins accumulated step by step is checked once more on margins
    recomputed from scratch (:meth:`check` says ``REFRESH``; the caller recomputes them
    and certifies again); the loop stops at ``tol``, at ``max_iter`` steps, or after
    ``patience`` steps without a smaller certified gap (steps below the rounding of
    the objective). The caller sets ``fresh = False`` after each step.
    """

    tol: float
    max_iter: int
    patience: int = _STALLS
    # The iterate (θ, b) of the smallest certified gap so far, and that gap.
    best: tuple = (None, 0.0)
    best_gap: float = np.inf
    stalls: int = 0
    fresh: bool = True

    def check(self, cert, step, coef, intercept) -> str:
        if cert.relative_gap <= self.tol and not self.fresh:
            self.fresh = True
            return REFRESH
        if cert.gap < self.best_gap:
            self.best_gap, self.best, self.stalls = cert.gap, (coef.copy(), intercept), 0
        else:
            self.stalls += 1
        if cert.relative_gap <= self.tol or step >= self.max_iter or self.stalls >= self.patience:
            return STOP
        return GO

    def returned(self, cert, coef, intercept):
        """(θ, b) to return: the best certified iterate when the last one is worse (a
        step taken below the rounding of F); it is then certified afresh."""
        if self.best_gap < cert.gap:
            self.fresh = False
            return self.best
        return coef, intercept

    def finish(self, cert, coef, intercept, certify):
        """(θ, b, certificate) to return: :meth:`returned`, certified again by
        ``certify(θ, b)`` unless ``cert`` is its certificate on fresh margins."""
        coef, intercept = self.returned(cert, coef, intercept)
        if not self.fresh:
            cert = certify(coef, intercept)
        return coef, intercept, cert


def armijo(base: float, decrease: float, moved, values) -> tuple:
    """The line search of a Newton step Δ: :func:`backtrack`, ``decrease`` the model's
    ∇fᵀΔ + penalty change; (0, inf) where there is no step (``moved`` false, or a decrease
    that is not finite), and (1, None) where the decrease is below the rounding of F: F
    cannot tell the step from rounding, but the gap, first order in the gradient, still
    can (the caller keeps the best certified iterate, :class:`Stopping`)."""
    if not moved or not np.isfinite(decrease):
        return 0.0, np.inf
    if decrease > -_ROUNDING * abs(base):
        return 1.0, None
    return backtrack(base, decrease, values)


def backtrack(base: float, decrease: float, values) -> tuple:
    """The first (t, F(θ + tΔ)) of ``values`` (t = 1, ½, ¼, ..., read only as far as
    needed) with F(θ + tΔ) − ``base`` ≤ ARMIJO·t·``decrease`` + the rounding of F; (0, inf)
    if none."""
    noise = 1e-15 * abs(base)
    for t, value in values:
        if value - base <= ARMIJO * t * decrease + noise:
            return t, value
    return 0.0, np.inf


def optimality_violation(problem: obj.Problem, grad, coef, grad_b) -> float:
    """The largest distance of −∇f to the penalty's subdifferential over the coefficients
    (``grad`` ∇f at ``coef``, of any shape), and over the intercepts' |∂f/∂b| with an
    intercept: 0 at the optimum."""
    slope = grad + problem.l2 * coef
    if problem.l1 == 0.0:  # both branches below are |slope|, bit for bit
        v = np.abs(slope)
    else:
        v = np.where(
            coef != 0.0,
            np.abs(slope + problem.l1 * np.sign(coef)),
            np.maximum(np.abs(slope) - problem.l1, 0.0),
        )
    worst = float(v.max(initial=0.0))
    if problem.fit_intercept:
        worst = max(worst, float(np.abs(grad_b).max(initial=0.0)))
    return worst


def forcing_term(measure: float, first: float | None, most: float) -> tuple[float, float]:
    """(min(``most``, √(measure/first)), first): the forcing term of inexact Newton
    (superlinear) on an optimality ``measure``, ``first`` its value at the first step
    (None: this is the first)."""
    first = first or max(measure, np.finfo(float).tiny)
    return min(most, np.sqrt(measure / first)), first


def fresh_margins(design, coef, intercept, meter=None):
    """Xθ + b from X (one pass; ``design`` a :class:`~dask_scd.engines.newton.design.Design`),
    timed as "margins" when a ``meter`` is given."""
    tick = time.perf_counter()
    margins = design.rows.dot(coef) + intercept
    if meter is not None:
        meter.add("margins", 1.0, tick)
    return margins


def certify_afresh(problem, design, y, weights, duals, meter, coef, intercept):
    """The certificate of (θ, b) on margins recomputed from X (two passes), tightened by
    the best dual point of ``duals`` (:class:`~dask_scd.engines.certificates.DualMemory`)."""
    tick = time.perf_counter()
    margins = fresh_margins(design, coef, intercept)
    final = duals.tighten(
        primal_certificate(problem, design.rows.scatter, y, coef, margins, weights)
    )
    meter.add("certificate", 2.0, tick)
    return final


def uncertified(primal: float, shape) -> obj.Certificate:
    """The certificate of a fit without a penalty: P alone, the dual and gaps NaN."""
    nan = float("nan")
    return obj.Certificate(primal, nan, np.full(shape, nan), nan)
