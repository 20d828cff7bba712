"""What the outer loops of the Newton-type engines share: the meter of passes and
seconds, the stopping rule with the best certified iterate it returns, and the
certificate of a fit without a penalty (:mod:`dask_scd.engines.newton.newton`,
:mod:`~dask_scd.engines.newton.hinge_newton`, :mod:`~dask_scd.engines.newton.lbfgs`,
:mod:`~dask_scd.engines.newton.multinomial`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from dask_scd import objectives as obj
from dask_scd.engines.certificates import primal_certificate

# Outer steps without a smaller certified gap before the engine stops.
_STALLS = 3


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


@dataclass
class Best:
    """The iterate of the smallest certified gap so far."""

    gap: float = np.inf
    coef: np.ndarray | None = None
    intercept: float = 0.0

    def offer(self, cert, coef, intercept) -> bool:
        """Keep (θ, b) if its gap is the smallest so far; returns whether it was."""
        if not cert.gap < self.gap:
            return False
        self.gap, self.coef, self.intercept = cert.gap, coef.copy(), intercept
        return True


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
    best: Best = field(default_factory=Best)
    stalls: int = 0
    fresh: bool = True

    def check(self, cert, step, coef, intercept) -> str:
        if cert.relative_gap <= self.tol and not self.fresh:
            self.fresh = True
            return REFRESH
        self.stalls = 0 if self.best.offer(cert, coef, intercept) else self.stalls + 1
        if cert.relative_gap <= self.tol or step >= self.max_iter or self.stalls >= self.patience:
            return STOP
        return GO

    def returned(self, cert, coef, intercept):
        """(θ, b) to return: the best certified iterate when the last one is worse (a
        step taken below the rounding of F); it is then certified afresh."""
        if self.best.gap < cert.gap:
            self.fresh = False
            return self.best.coef, self.best.intercept
        return coef, intercept

    def finish(self, cert, coef, intercept, certify):
        """(θ, b, certificate) to return: :meth:`returned`, certified again by
        ``certify(θ, b)`` unless ``cert`` is its certificate on fresh margins."""
        coef, intercept = self.returned(cert, coef, intercept)
        if not self.fresh:
            cert = certify(coef, intercept)
        return coef, intercept, cert


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
