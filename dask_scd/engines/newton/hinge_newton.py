"""The hinge SVM in the primal: Newton on a smoothed hinge, the smoothing driven to zero.

The hinge max(0, 1 − m) (m = y·(xᵀθ + b)) is replaced by its Huber smoothing of width μ
(Chapelle 2007, "Training a support vector machine in the primal")::

    ℓ_μ(m) = 0 for m ≥ 1,   (1 − m)²/(2μ) for 1 − μ < m < 1,   1 − m − μ/2 for m ≤ 1 − μ,

with ℓ_μ'(m) = −β, β = clip((1 − m)/μ, 0, 1). P_μ = mean ℓ_μ + α/2‖θ‖² is piecewise
quadratic: its Hessian XᵀDX/n + αI has D = 1/μ on the *band* rows (0 < β < 1) only, so a
Newton step costs a Gram of the band rows (few), and the exact minimizer along the step
(a piecewise-linear root, found by safeguarded Newton in O(n) per trial) makes the method
finite on each level (Keerthi & DeCoste 2005): once the band is right, one step is exact.

The dual point a = β·y (projected onto Σ a_i = 0 with the intercept, which keeps the box
0 ≤ β ≤ 1) is feasible for the hinge's dual, so every step carries a hinge certificate
from the pass that computes the gradient. At the smoothed optimum its gap is the smoothing
error S = (μ/n) Σ β_i(1 − β_i) (the hinge and smoothed gaps differ by exactly that): a
level ends when the gap is within 1% of S, and μ shrinks tenfold. The first step of a new
level keeps every row on its piece (:meth:`_Model.narrow`): while the pieces hold, the
smoothed optimum is affine in μ and that step lands on it, so once the band is identified
each level costs one step, and the gap falls tenfold per step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.engines.base import Options, Run, Trace
from dask_scd.engines.certificates import DualMemory, dual_certificate
from dask_scd.engines.newton.design import GRAM_MAX, Design
from dask_scd.engines.newton.newton import _start
from dask_scd.engines.newton.newton_loop import REFRESH, STOP, Meter, Stopping, fresh_margins
from dask_scd.engines.newton.quadratic import Model, cholesky_solve, hessian_cg, ridge_hessian
from dask_scd.engines.pcg import MAX_ITER

# The first smoothing width: the whole margin range [0, 1] is quadratic.
_MU_START = 1.0
# μ shrinks tenfold per level (Chapelle's schedule). Larger jumps cost more steps than the
# levels they save on Adult (C = 0.1, 1, 10: 45–90 steps at 10x, 80–130 at 30x–100x): a
# warm start far from the new optimum rebuilds the band a few rows per step.
_SHRINK = 0.1
# A level is solved when the certified hinge gap is within this factor of its smoothing
# error S (the smoothed problem's own gap is then at most 1% of S).
_LEVEL = 1.01
# Newton steps without a smaller certified gap before the engine stops (a level change
# rebuilds the band over several steps whose gaps need not shrink).
_STALLS = 20
# Conjugate gradients (large p) stop at this fraction of the right-hand side; their
# Python overhead per iteration, in flops, against a Cholesky of the band's system.
_CG_FORCING = 1e-10
_CG_OVERHEAD = 1e5
# Trials of the exact line search (each O(n), no pass over X).
_LINE_MAX = 60


def fit_hinge_newton(data: InMemory, problem: obj.Problem, options: Options) -> Run:
    """Hinge SVM (L2 penalty, with or without intercept) by smoothed Newton continuation.

    ``data.X``: ndarray or scipy.sparse matrix of shape (n_samples, n_features);
    ``data.y``: ndarray of shape (n_samples,), ±1. ``options.max_iter`` counts Newton
    steps over all smoothing levels.
    """
    y = data.y
    meter = Meter()
    trace = Trace(options.progress, options.callback)
    design = Design.from_array(data.X)
    meter.add("setup", 0.0, trace.start)
    coef, intercept, margins = _start(problem, design, y, None)
    duals = DualMemory(problem, y)
    stopping = Stopping(options.tol, options.max_iter, _STALLS)
    mu, step, levels = _MU_START, 0, 1
    while True:
        tick = time.perf_counter()
        cert, beta, grad_rows, parts = _certify(design, duals, y, coef, margins, mu)
        meter.add("gradient", 1.0, tick)
        trace.record(step, cert.relative_gap, cert.primal)
        action = stopping.check(cert, step, coef, intercept)
        if action == REFRESH:
            margins = fresh_margins(design, coef, intercept, meter)
            continue
        if action == STOP or trace.stopped:
            break
        step += 1
        tick = time.perf_counter()
        model = _Model.at(design, problem, coef, beta, grad_rows, parts, mu)
        if cert.gap <= _LEVEL * model.smoothing:
            # The smoothed problem is solved: only a smaller μ can shrink the gap.
            mu *= _SHRINK
            model.narrow(y, beta, mu)
            levels += 1
            stopping.stalls = 0
        delta, delta_b, passes, inner = model.direction()
        direction = design.rows.dot(delta) + delta_b
        meter.add(f"solve:{inner}", passes + 1.0, tick)
        tick = time.perf_counter()
        t = _exact_step(problem, y, margins, direction, mu, coef, delta)
        meter.add("line_search", 0.0, tick)
        if t == 0.0:
            break
        coef += t * delta
        intercept += t * delta_b
        margins += t * direction
        stopping.fresh = False
    coef, intercept = stopping.returned(cert, coef, intercept)
    tick = time.perf_counter()
    final, coef, intercept, passes = _finish(design, problem, y, coef, intercept, mu, duals)
    meter.add("certificate", passes, tick)
    extras = meter.as_dict()
    extras["smoothing_levels"] = levels
    extras["final_smoothing"] = mu
    return trace.ended(Run(coef, float(intercept), final, step, trace.history, extras))


def _certify(design, duals, y, coef, margins, mu):
    """The hinge certificate of (θ, b) at the margins z, from the pass that computes the
    gradient (:meth:`DualMemory.certify`); returns it with β = −ℓ_μ'(m) =
    clip((1 − m)/μ, 0, 1) (m = y·z), g = ℓ_μ'(z) and Xᵀ of g's two signs."""
    beta = np.clip((1.0 - y * margins) / mu, 0.0, 1.0)
    grad_rows = -beta * y
    parts = design.signed_scatter(grad_rows, split=duals.problem.fit_intercept)
    hinge_sum = float(np.maximum(0.0, 1.0 - y * margins).sum())
    cert, _ = duals.certify(design, coef, margins, grad_rows, parts, hinge_sum)
    return cert, beta, grad_rows, parts


@dataclass
class _Model:
    """The quadratic model of P_μ for one Newton step: the pieces of the rows fixed.

    ``band`` holds the rows on the quadratic piece (curvature 1/(nμ) each); the others are
    on a linear piece. ``grad`` and ``grad_b`` are the model's gradient at (θ, b).
    """

    design: Design
    problem: obj.Problem
    coef: np.ndarray
    grad: np.ndarray  # Xᵀg/n + αθ
    grad_b: float  # Σ g_i / n
    band: np.ndarray  # row indices
    band_rows: object  # X restricted to ``band``
    mu: float
    smoothing: float  # S = (μ/n) Σ β_i(1 − β_i) at the model's width

    @classmethod
    def at(cls, design, problem, coef, beta, grad_rows, parts, mu) -> _Model:
        """The model of P_μ at (θ, b), β = −ℓ_μ'(m); ``parts`` from ``signed_scatter``."""
        n = design.rows.n_major
        band = np.flatnonzero((beta > 0.0) & (beta < 1.0))
        grad = (parts[0] + parts[1]) / n + problem.l2 * coef
        smoothing = mu * float(np.sum(beta[band] * (1.0 - beta[band]))) / n
        grad_b, rows = float(grad_rows.sum()) / n, _band_rows(design, band)
        return cls(design, problem, coef, grad, grad_b, band, rows, mu, smoothing)

    def narrow(self, y, beta, mu) -> None:
        """The model of P_μ' at the same point, μ' < μ, with every row kept on its piece.

        While the pieces hold, the smoothed optimum is affine in μ (the band rows sit at
        m_i = 1 − μβ_i with β solving one linear system), so from the optimum of P_μ one
        step of this model lands on the optimum of P_μ'. The model of P_μ' from the rows'
        new pieces would instead put most band rows, now at 1 − m_i = μβ_i > μ', on the
        linear piece: its step is short, and the band is rebuilt a few rows per step.
        """
        n = self.design.rows.n_major
        band = self.band
        # The band rows' slopes at width μ': −(1 − m_i)/μ' = −β_i·μ/μ' (not clipped).
        change = -y[band] * beta[band] * (self.mu / mu - 1.0)
        self.grad = self.grad + np.asarray(self.band_rows.T @ change).ravel() / n
        self.grad_b += float(change.sum()) / n
        self.mu = mu

    def direction(self):
        """The Newton step (Δ, Δb), the passes over X it read besides XΔ, its solver.

        The Hessian is X_BᵀX_B/(nμ) + αI over the band rows B (+ the intercept's row and
        column). With no band row the intercept has no curvature: the step is then that
        of the model with curvature α on b too (the exact line search sizes it).
        """
        design, problem = self.design, self.problem
        n, p = design.rows.n_major, design.rows.n_minor
        fit_b = problem.fit_intercept
        rhs = np.append(-self.grad, -self.grad_b) if fit_b else -self.grad
        if len(self.band) == 0:
            solution = rhs / problem.l2
            return solution[:p], float(solution[p]) if fit_b else 0.0, 0.0, "gradient"
        banded = Design.from_array(self.band_rows)
        share = banded.nnz / max(design.nnz, 1.0)  # of a pass over X, per read of the band
        # The band's Design averages over its own rows: weights n_B/(nμ) give 1/(nμ).
        weights = np.full(len(self.band), len(self.band) / (n * self.mu))
        k = p + int(fit_b)
        # CG ends in at most |B| + 2 iterations in exact arithmetic (H is αI plus a
        # matrix of rank ≤ |B| + 1); each reads the band twice.
        cg_flops = min(len(self.band) + 2, MAX_ITER) * (2.0 * banded.nnz + k + _CG_OVERHEAD)
        if k <= GRAM_MAX and banded.gram_flops + k**3 / 3.0 <= cg_flops:
            hessian = ridge_hessian(banded, weights, fit_b, problem.l2)
            solution, passes, inner = cholesky_solve(hessian, rhs), share, "cholesky"
        else:
            # Solved tightly: a step with the right band is then exact.
            model = Model(
                problem, self.coef, 0.0, self.grad, 0.0, weights, weights, forcing=_CG_FORCING
            )
            solution, iterations, _ = hessian_cg(banded, model, rhs)
            passes, inner = share * (1 + iterations), "cg"
        return solution[:p], float(solution[p]) if fit_b else 0.0, passes, inner


def _band_rows(design, band):
    """The rows ``band`` of X (numpy or CSR), read from the row layout."""
    rows = design.rows
    if rows.dense:
        return rows.data.reshape(rows.n_major, rows.n_minor)[band]
    return design.by_rows[band]


def _exact_step(problem, y, margins, direction, mu, coef, delta) -> float:
    """argmin_t≥0 P_μ(θ + tΔ, b + tΔb), given u = XΔ + Δb (0 if there is no descent).

    Not CoCoA's :func:`~dask_scd.engines.cocoa.cocoa_ops.line_minimum`: Newton from t = 1,
    the step of a right band, lands in one trial where a bracket first costs several.

    φ'(t) = −Σ β_i(t) s_i / n + α(θᵀΔ + t‖Δ‖²), s = y·u, is piecewise linear and
    increasing; Newton on it lands on the root as soon as it is on the root's piece,
    with bisection of the bracket when it would leave it. O(n) per trial.
    """
    n = len(y)
    s = y * direction
    m = y * margins
    linear = problem.l2 * obj.vdot(coef, delta)
    quadratic = problem.l2 * obj.vdot(delta, delta)
    lo, hi, t = 0.0, np.inf, 1.0
    for _ in range(_LINE_MAX):
        beta = np.clip((1.0 - m - t * s) / mu, 0.0, 1.0)
        slope = -obj.vdot(beta, s) / n + linear + t * quadratic
        band = (beta > 0.0) & (beta < 1.0)
        curvature = float(np.sum(s[band] ** 2)) / (n * mu) + quadratic
        if slope == 0.0:
            return t
        if slope < 0.0:
            lo = t
        else:
            hi = t
        nxt = t - slope / curvature if curvature > 0.0 else np.inf
        if not lo < nxt < hi:
            nxt = 0.5 * (lo + hi) if np.isfinite(hi) else 2.0 * t
        if abs(nxt - t) <= 1e-15 * t:
            return nxt
        t = nxt
    return lo


def _finish(design, problem, y, coef, intercept, mu, duals):
    """The final certificate, as SDCA's: the better of (θ, b) on margins recomputed from
    scratch and (w, b*) with w = Xᵀa/(αn) the primal point of the dual a = β·y and b* the
    hinge's exact intercept for w. Returns it with its (θ, b) and the passes it read."""
    margins = fresh_margins(design, coef, intercept)
    cert, beta = _certify(design, duals, y, coef, margins, mu)[:2]
    dual_cert, dual_intercept, dual_coef = dual_certificate(
        problem, design.rows, y, beta * y, None, intercept
    )
    dual_cert = duals.tighten(dual_cert)
    if dual_cert.gap < cert.gap:
        cert, coef, intercept = dual_cert, dual_coef, dual_intercept
    return cert, coef, intercept, 4.0
