"""In-memory engine: L-BFGS on the smooth L2 problems, certified at every iterate.

Each iteration reads X twice: Xᵀg for the gradient (g = ℓ'(z) at the margins z) and
X d for the margins' direction, after which the line search is O(n) per trial (the
loss along z + t·Xd, no pass over X) and θ, b, z move together. The gradient pass gives
the certificate for free: the dual point a = −ℓ'(z) and Xᵀa are what it read, so every
iterate's duality gap is known (:class:`~dask_scd.engines.certificates.DualMemory`,
which keeps the best dual value seen), and the fit stops at a certified relative gap.

The direction is the two-loop recursion of L-BFGS (Nocedal 1980; Liu & Nocedal 1989)
over the last ``_MEMORY`` pairs (s, y) of iterate and gradient changes, the intercept
one more (unpenalized) coordinate, scaled by sᵀy / yᵀy; the step is Armijo backtracking
from t = 1 (a strictly convex objective: sᵀy > 0 for every step, no Wolfe test needed).
The gap of a = −ℓ'(z) is about ‖∇P‖²/(2α): the iterates reach an objective error long
before their certificate shows it, which is why this engine pays where a pass is cheap
next to Newton's curvature and conjugate-gradient products (dense X of a few hundred
columns; one-hot fields of frequent values).

The margins are recomputed from X every ``_REFRESH`` iterations and before the final
certificate, so rounding in the running z never reaches the returned gap.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.engines.base import Options, Run, Trace
from dask_scd.engines.certificates import DualMemory
from dask_scd.engines.newton.newton import _design, _gradient_and_certificate, _start, trial_values
from dask_scd.engines.newton.newton_loop import Meter, backtrack, certify_afresh, fresh_margins

_MEMORY = 10  # (s, y) pairs kept: scipy's and glum's default
_REFRESH = 50  # iterations between margins recomputed from X


def fit_lbfgs(data: InMemory, problem: obj.Problem, options: Options) -> Run:
    """L-BFGS for the smooth losses with an L2 penalty, with or without intercept and
    sample weights. ``options.max_iter`` counts iterations (two passes each)."""
    if problem.l1 > 0.0 or problem.unpenalized:
        raise ValueError(
            "solver='lbfgs' solves L2-penalized problems (use 'newton' for "
            "L1 / elastic net and penalty=None)"
        )
    y, weights = data.y, data.weights
    n, p = data.X.shape
    meter = Meter()
    trace = Trace(options.progress, options.callback)
    design = _design(data, problem, options.memo)
    meter.add("setup", 0.0, trace.start)
    coef, intercept, margins = _start(problem, design, y, options.start, weights, options.memo)
    fit_b = problem.fit_intercept
    grad_rows, curv = np.empty(n), np.empty(n)
    duals = DualMemory(problem, y, weights)
    pairs: deque = deque(maxlen=_MEMORY)
    step, since_refresh = 0, 0
    best = None  # (gap, coef, intercept, certificate) of the best certified iterate
    previous = None  # (x, gradient) of the last iterate, for the next (s, y) pair
    while True:
        loss_sum, grad, cert, _ = _gradient_and_certificate(
            problem, design, y, weights, coef, margins, grad_rows, curv, duals, meter
        )
        grad = grad + problem.l2 * coef
        trace.record(step, cert.relative_gap, cert.primal)
        if best is None or cert.relative_gap < best[0]:
            best = (cert.relative_gap, coef.copy(), intercept, cert)
        if cert.relative_gap <= options.tol or step >= options.max_iter or trace.stopped:
            break
        x = np.append(coef, intercept) if fit_b else coef
        g = np.append(grad, float(grad_rows.sum()) / n) if fit_b else grad
        if previous is not None:
            s, r = x - previous[0], g - previous[1]
            sr = float(s @ r)
            if sr > 1e-12 * float(r @ r):  # rounding can leave a tiny step without curvature
                pairs.append((s, r, 1.0 / sr))
        previous = (x, g)
        d = -_two_loop(g, pairs)
        if not pairs:  # the first step: unit length in the gradient's scale
            d /= max(1.0, float(np.abs(g).sum()))
        slope = float(g @ d)
        if not slope < 0.0:  # not a descent direction (rounding at the optimum): restart
            pairs.clear()
            d, slope = -g, -float(g @ g)
            if not slope < 0.0:
                break
        tick = time.perf_counter()
        delta, delta_b = (d[:-1], float(d[-1])) if fit_b else (d, 0.0)
        direction = design.rows.dot(delta) + delta_b
        meter.add("direction", 1.0, tick)
        # Armijo on F(θ + tΔ) − F(θ) ≤ ARMIJO·t·∇Fᵀd: O(n + p) per trial.
        base = loss_sum / n + obj.penalty_value(problem, coef)
        trials = trial_values(problem, y, margins, direction, coef, delta, weights)
        t, _ = backtrack(base, slope, trials)
        if t == 0.0:
            if pairs:  # the quasi-Newton model misled: forget it, try the gradient
                pairs.clear()
                continue
            break
        step += 1
        coef = coef + t * delta
        intercept += t * delta_b
        since_refresh += 1
        if since_refresh >= _REFRESH:
            margins = fresh_margins(design, coef, intercept, meter)
            since_refresh = 0
        else:
            margins += t * direction
    gap, coef, intercept, cert = best
    # The returned certificate is on margins recomputed from X.
    final = certify_afresh(problem, design, y, weights, duals, meter, coef, intercept)
    run = Run(coef, float(intercept), final, step, trace.history, meter.as_dict())
    return trace.ended(run)


def _two_loop(g, pairs) -> np.ndarray:
    """H·g for the L-BFGS inverse-Hessian model of ``pairs`` (s, y, 1/sᵀy), oldest first."""
    q = g.copy()
    alphas = []
    for s, r, rho in reversed(pairs):
        a = rho * float(s @ q)
        q -= a * r
        alphas.append(a)
    if pairs:
        s, r, rho = pairs[-1]
        q *= 1.0 / (rho * float(r @ r))  # γ = sᵀy / yᵀy
    for (s, r, rho), a in zip(pairs, reversed(alphas)):
        b = rho * float(r @ q)
        q += (a - b) * s
    return q
