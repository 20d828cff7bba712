"""In-memory engine: proximal Newton outer steps, an inner solver for each penalty.

Every outer step reads the loss derivatives g = ℓ'(z) and d = ℓ''(z) at the margins z,
solves the local quadratic model

    q(Δ) = gᵀXΔ/n + ½ΔᵀXᵀDXΔ/n + penalty(θ + Δ)        (Δb: the intercept, unpenalized)

to an inner tolerance that tightens with the outer optimality violation, and takes the
longest step t ∈ {1, ½, ¼, ...} along Δ that passes the Armijo test on the true objective
(Tseng & Yun 2009; Lee, Sun & Saunders 2014). The quadratic model is exact for the
squared loss (t = 1), and the generalized Hessian serves the squared hinge.

X by rows is a :class:`~dask_scd.engines.newton.design.Design`; the model, its L2 solvers
(Cholesky or conjugate gradients) and the sampled Hessian are in
:mod:`dask_scd.engines.newton.quadratic`, coordinate descent over a working set for L1 /
elastic net in :mod:`dask_scd.engines.newton.l1_model`; ``docs/engines/newton.md`` says
which runs when.

Every outer step is certified by the duality gap of the dual point a = −ℓ'(z) from X
itself; for an L1 term the best dual value seen and celer's dual extrapolation (a
combination of the last dual points, kept when its dual value is higher) tighten it.
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.engines.base import Options, Run, Trace
from dask_scd.engines.certificates import DualMemory, with_values
from dask_scd.engines.newton.design import Design
from dask_scd.engines.newton.kernel_step import dual_start
from dask_scd.engines.newton.l1_model import InnerMemory, l1_direction, working_set
from dask_scd.engines.newton.newton_loop import (
    REFRESH,
    STOP,
    TRIALS,
    Meter,
    Stopping,
    armijo,
    certify_afresh,
    forcing_term,
    fresh_margins,
    uncertified,
)
from dask_scd.engines.newton.quadratic import (
    INNER,
    HeavyRows,
    HessianSample,
    Model,
    l2_direction,
    l2_solver,
    model_decrease,
    penalty_change,
    set_inner_targets,
)
from dask_scd.kernels import newton as kernels
from dask_scd.kernels.scalar import DOUBLINGS, best_doubling, extrapolates

# Smallest working set; it grows to twice the last one at each outer step.
_WS_MIN = 10


def fit_newton(data: InMemory, problem: obj.Problem, options: Options) -> Run:
    """Proximal Newton for the smooth losses, any penalty, with or without intercept.

    ``data.X``: ndarray or scipy.sparse matrix of shape (n_samples, n_features);
    ``data.y``: ndarray of shape (n_samples,), ±1 for classification losses.
    ``options.max_iter`` counts Newton steps. The hinge (L2 only) is the other function of
    ``solver="newton"``: Newton on a smoothed hinge with the smoothing driven to zero,
    ``dask_scd.engines.newton.hinge_newton.fit_hinge_newton``, which the registry's entry runs
    for ``loss="hinge"`` (:mod:`dask_scd.engines.registry`).
    """
    if problem.loss == "hinge":  # solver="newton" runs hinge_newton.fit_hinge_newton for it
        raise ValueError("fit_newton solves the smooth losses; loss='hinge' is fit_hinge_newton's")
    if problem.unpenalized:
        return fit_unpenalized(data, problem, options)
    y, weights, n = data.y, data.weights, data.X.shape[0]
    meter = Meter()
    trace = Trace(options.progress, options.callback)
    design = _design(data, problem, options.memo)
    meter.add("setup", 0.0, trace.start)
    coef, intercept, margins = _start(problem, design, y, options.start, weights, options.memo)
    grad_rows, curv = np.empty(n), np.empty(n)
    duals = DualMemory(problem, y, weights)
    if options.start is None and _kernel_dual_applies(design, problem, weights):
        start = _kernel_dual_start(design, problem, y, options.tol, duals, meter)
        coef, margins = start or (coef, margins)
    stopping = Stopping(options.tol, options.max_iter)
    free, size = _working_set_sizes(design, coef)
    inner, step, first_violation = InnerMemory(), 0, None
    sample, heavy = _l2_aids(design, problem, options.random)  # draws only for a sample
    sampled = False  # whether the step about to be taken came from the sample
    t = 1.0  # the step size of the last line search
    while True:
        loss_sum, grad, cert, sums = _gradient_and_certificate(
            problem, design, y, weights, coef, margins, grad_rows, curv, duals, meter, heavy
        )
        if sampled:  # the last step came from the sample
            sample.observe(cert.relative_gap, t)
            sampled = False
        solved = None
        if cert.relative_gap > options.tol and step < options.max_iter:
            # The next step's model first: its dual point a' (a first-order model of
            # −ℓ'(z + u)) is within the square of the step's error of the dual optimum, so
            # it may certify (θ, b) as it is and spare the step.
            model = Model(
                problem, coef, intercept, grad, float(grad_rows.sum()) / n, grad_rows, curv
            )
            model.curvature_sums = sums
            first_violation = set_inner_targets(model, cert, options.tol, first_violation)
            sampled = problem.l1 == 0.0 and sample is not None and sample.active
            sampled_or = sample if sampled else None
            solved, size = _direction(design, model, sampled_or, size, free, meter, heavy, inner)
            if _near_the_end(model, solved, cert, options.tol):
                tick = time.perf_counter()
                offer = duals.offer_linearized(
                    design, grad_rows, curv, solved[2], model.correlation
                )
                meter.add("certificate", offer, tick)
                cert = duals.tighten(cert)
        trace.record(step, cert.relative_gap, cert.primal)
        action = stopping.check(cert, step, coef, intercept)
        if action == REFRESH:
            margins, cert = _refreshed(problem, design, y, weights, coef, intercept, cert, meter)
            if cert.relative_gap > options.tol:
                continue  # the gradient and the certificate on the fresh margins
            trace.record(step, cert.relative_gap, cert.primal)
            action = stopping.check(cert, step, coef, intercept)
        if action == STOP or trace.stopped:
            break
        step += 1
        delta, delta_b, direction = solved[:3]
        tick = time.perf_counter()
        t = _line_search(problem, y, margins, direction, loss_sum, model, delta, delta_b, weights)
        meter.add("line_search", 0.0, tick)
        if t == 0.0:
            if sampled:  # no decrease along the sampled direction: the full Hessian's
                sample.active = sampled = False
                continue
            break
        coef += t * delta
        intercept += t * delta_b
        margins += t * direction
        # One step from fresh margins adds one product XΔ: as exact as recomputing them,
        # which a fit of one step (a strong penalty, a path's points) skips.
        stopping.fresh = step == 1
    afresh = partial(certify_afresh, problem, design, y, weights, duals, meter)
    coef, intercept, cert = stopping.finish(cert, coef, intercept, afresh)
    extras = meter.as_dict() | {"extrapolation_wins": duals.extrapolation_wins}
    return trace.ended(Run(coef, float(intercept), cert, step, trace.history, extras))


def _refreshed(problem, design: Design, y, weights, coef, intercept, cert, meter):
    """(Xθ + b recomputed from X, ``cert`` with P read on them).

    The dual value of ``cert`` is that of a feasible dual point whose Xᵀa came from X
    itself; only its P, read on margins accumulated step by step, carries their rounding.
    P on fresh margins with that dual value certifies (θ, b) on its own, so where it
    holds ``tol`` the fit ends without the gradient's pass and the certificate again.
    """
    margins = fresh_margins(design, coef, intercept, meter)
    tick = time.perf_counter()
    n = len(y)
    loss_sum = kernels.derivatives(problem.loss_code, y, margins, np.empty(n), np.empty(n), weights)
    fresh = with_values(cert, loss_sum / n + obj.penalty_value(problem, coef), cert.dual)
    meter.add("certificate", 0.0, tick)
    return margins, fresh


def _l2_aids(design: Design, problem: obj.Problem, rng):
    """The L2 steps' row sample (:class:`HessianSample`, n ≫ p) and conjugate gradients'
    heavy rows (:class:`HeavyRows`), each None where it does not apply."""
    if problem.l1 > 0.0:
        return None, None
    k = design.rows.n_minor + int(problem.fit_intercept)
    heavy = HeavyRows(design, k) if l2_solver(design, problem) == "cg" else None
    return HessianSample.build(design, k, rng), heavy


def _gradient_and_certificate(
    problem, design: Design, y, weights, coef, margins, grad_rows, curv, duals, meter, heavy=None
):
    """ℓ' and ℓ'' at the margins (into ``grad_rows``, ``curv``), the loss sum, the gradient
    Xᵀℓ'/n and the certificate of the point, from one pass over X (and the dual's); when
    CG solves the steps (``heavy``, its preconditioner, given), the curvature sums it reads,
    ((X∘X)ᵀd, Xᵀd), from that pass too, else None."""
    tick = time.perf_counter()
    loss_sum = kernels.derivatives(problem.loss_code, y, margins, grad_rows, curv, weights)
    by_cg = heavy is not None
    # The certificate reads Xᵀg's two signed parts only to project onto Σa = 0.
    parts = design.signed_scatter(grad_rows, curv if by_cg else None, problem.fit_intercept)
    grad = (parts[0] + parts[1]) / len(y)  # Xᵀg/n
    meter.add("gradient", 1.0, tick)
    tick = time.perf_counter()
    cert, passes = duals.certify(design, coef, margins, grad_rows, parts[:2], loss_sum)
    meter.add("certificate", passes, tick)
    return loss_sum, grad, cert, (parts[2:] if by_cg else None)


def _working_set_sizes(design: Design, coef) -> tuple[int, int]:
    """(free, first) working-set sizes. Working sets of up to √nnz columns are free: a
    model epoch over their Gram costs at most a pass over X; beyond that they grow
    geometrically from the support. A warm start's support is most of the first working
    set: room beyond it for as many violators again (else the first steps cannot move a
    coefficient outside it)."""
    free = max(_WS_MIN, int(np.sqrt(design.nnz)))
    return free, max(free, 2 * int(np.count_nonzero(coef)))


def _direction(
    design: Design, model: Model, sample, size, free, meter: Meter, heavy=None, inner=None
):
    """The step's direction from ``model`` (:func:`l1_direction` on a working set of
    ``size`` columns for an L1 term, with what its solver learned at the last steps in
    ``inner``, else :func:`l2_direction`, from the Hessian ``sample`` when one is
    given, CG preconditioned by ``heavy``), and the next working set's size."""
    tick = time.perf_counter()
    problem = model.problem
    if problem.l1 > 0.0:
        working = working_set(problem, model.coef, model.grad, size)
        size = min(design.rows.n_minor, max(free, 2 * len(working)))
        meter.add("working_set", 0.0, tick)
        tick = time.perf_counter()
        solved = l1_direction(design, model, working, inner)
    else:
        solved = l2_direction(design, model, sample, heavy)
    meter.add(f"solve:{solved[4]}", solved[3], tick)
    return solved, size


def _design(data: InMemory, problem: obj.Problem, memo: dict | None) -> Design:
    """X by rows, kept in ``memo`` for the next run on the same data; with a constant
    curvature (the squared loss, no sample weights) its Gram blocks are kept too."""
    if memo is not None and memo.get("design") is not None:
        return memo["design"]
    design = Design.from_array(data.X, lambda: data.pure_blocks, data.by_rows, data.column_counts)
    if memo is not None:
        design.unit_curvature = problem.loss == "squared" and data.weights is None
        memo["design"] = design
    return design


def _kernel_dual_applies(design: Design, problem: obj.Problem, weights) -> bool:
    """Whether a cold start of ``problem`` goes through SDCA's epochs in the kernel's form
    (:func:`~dask_scd.engines.newton.kernel_step.dual_start`): its L2 steps are kernel
    steps, its loss's Newton step is not exact (not the squared loss), and there is
    neither an intercept (its dual constraint Σa = 0) nor sample weights."""
    return (
        problem.l1 == 0.0
        and problem.loss != "squared"
        and not problem.fit_intercept
        and weights is None
        and l2_solver(design, problem) == "kernel"
    )


def _kernel_dual_start(design: Design, problem: obj.Problem, y, tol, duals, meter):
    """(θ, Xθ) of :func:`~dask_scd.engines.newton.kernel_step.dual_start`, its dual point
    offered to ``duals``, or None where its epochs stopped short (the cold start stays);
    metered as "dual_start", an epoch as the n²/nnz passes over X whose values it reads
    in K."""
    tick = time.perf_counter()
    n = design.rows.n_major
    start, dual, correlation, epochs = dual_start(design, problem, y, tol)
    found = None
    if start is not None:
        found = start, design.rows.dot(start)
        duals.offer(dual, correlation)
    passes = epochs * n * n / max(design.nnz, 1) + 2.0 * (start is not None)
    meter.add("dual_start", passes, tick)
    return found


def _start(problem: obj.Problem, design: Design, y, start, weights=None, memo=None):
    """(θ, b, margins) of a cold start (θ = 0, the best b for it) or of a warm one (its
    margins from ``memo`` when they were computed there for this very start)."""
    n, p = design.rows.n_major, design.rows.n_minor
    if start is not None:
        coef, intercept = np.array(start[0], dtype=np.float64), float(start[1])
        known = (memo or {}).get("margins")
        if known is not None and known[1] == intercept and np.array_equal(known[0], coef):
            return coef, intercept, np.array(known[2], dtype=np.float64)
        return coef, intercept, design.rows.dot(coef) + intercept
    intercept = obj.zero_intercept(problem, y, weights)
    return np.zeros(p), intercept, np.full(n, intercept)


def fit_unpenalized(data: InMemory, problem: obj.Problem, options: Options) -> Run:
    """Newton's method without a penalty (``penalty=None``), stopped on the gradient.

    There is no dual, so no gap: the fit stops at ``‖∇P‖∞ ≤ tol·max(1, |P|)`` (the
    intercept's derivative included), read on margins recomputed from scratch at every
    step; that relative gradient norm is the Run's ``grad_norm`` and what the history
    records in place of the gap.
    """
    y, weights = data.y, data.weights
    n, p = data.X.shape
    meter = Meter()
    trace = Trace(options.progress, options.callback)
    design = _design(data, problem, None)
    meter.add("setup", 0.0, trace.start)
    coef, intercept, _ = _start(problem, design, y, None, weights)
    grad_rows, curv = np.empty(n), np.empty(n)
    step, first_violation = 0, None
    while True:
        tick = time.perf_counter()
        margins = design.rows.dot(coef) + intercept
        loss_sum = kernels.derivatives(problem.loss_code, y, margins, grad_rows, curv, weights)
        parts = design.signed_scatter(grad_rows, split=False)
        grad = (parts[0] + parts[1]) / n
        model = Model(problem, coef, intercept, grad, float(grad_rows.sum()) / n, grad_rows, curv)
        meter.add("gradient", 2.0, tick)
        primal, violation = loss_sum / n, model.violation()
        grad_norm = violation / max(1.0, abs(primal))
        trace.record(step, grad_norm, primal)
        if grad_norm <= options.tol or step >= options.max_iter or trace.stopped:
            break
        model.forcing, first_violation = forcing_term(violation, first_violation, INNER)
        tick = time.perf_counter()
        delta, delta_b, direction, passes, inner = l2_direction(design, model)
        meter.add(f"solve:{inner}", passes, tick)
        t = _line_search(problem, y, margins, direction, loss_sum, model, delta, delta_b, weights)
        if t == 0.0:
            break
        step += 1
        coef = coef + t * delta
        intercept += t * delta_b
    cert, extras = uncertified(primal, p), meter.as_dict()
    run = Run(coef, float(intercept), cert, step, trace.history, extras, grad_norm=grad_norm)
    return trace.ended(run)


def _near_the_end(model, solved, cert, tol) -> bool:
    """Whether the model's first-order decrease −(∇fᵀΔ + penalty change) is below √tol·P:
    from there the step's dual point may certify tol now or at the next iterate (the
    error of a Newton iterate is about its model's decrease); before, it only costs."""
    return model_decrease(model, solved[0], solved[1]) <= np.sqrt(tol) * abs(cert.primal)


# ---------------------------------------------------------------------- line search


def _line_search(
    problem, y, margins, direction, loss_sum, model, delta, delta_b, weights=None
) -> float:
    """The step t of :func:`~dask_scd.engines.newton.newton_loop.armijo` on F(θ + tΔ) −
    F(θ) (O(n) per trial, no pass over X); a unit step of a smooth L2 model that passes
    is extended by :func:`extrapolate`."""
    now, after = penalty_change(model, delta)
    base = loss_sum / len(y) + now
    slope = float(model.grad @ delta) + model.grad_b * delta_b
    trials = trial_values(problem, y, margins, direction, model.coef, delta, weights, at_one=after)
    t, value = armijo(base, slope + after - now, np.any(delta) or delta_b, trials)
    if t == 1.0 and value is not None and extrapolates(problem):
        t = extrapolate(problem, y, margins, direction, model.coef, delta, weights, at_one=value)
    return t


def trial_values(problem, y, margins, direction, coef, delta, weights=None, at_one=None):
    """(t, F(θ + tΔ)) for t = 1, ½, ¼, ..., computed as they are read (O(n) each, no pass
    over X); ``at_one``: the penalty at θ + Δ where known."""
    for t in TRIALS:
        penalty = at_one if t == 1.0 else None
        yield t, _along(problem, y, margins, direction, coef, delta, t, weights, penalty)


def _along(problem, y, margins, direction, coef, delta, t, weights, penalty=None) -> float:
    """F(θ + tΔ): the mean loss along ``margins + t·direction`` and the penalty at θ + tΔ
    (``penalty`` where known)."""
    loss = kernels.loss_along(problem.loss_code, y, margins, direction, t, weights)
    if penalty is None:
        penalty = obj.penalty_value(problem, coef + t * delta)
    return loss / len(y) + penalty


def extrapolate(problem, y, margins, direction, coef, delta, weights=None, at_one=None) -> float:
    """The best step t ∈ {1, 2, 4, ...} (:func:`~dask_scd.kernels.scalar.best_doubling`),
    ``at_one`` F(θ + Δ) where known. Far from the optimum a Newton model's curvature
    overestimates the curvature along its step and t = 1 stops short; near it
    F(θ + 2Δ) ≈ F(θ) and t stays 1 (quadratic convergence kept). O(n) per trial, no
    pass over X."""

    def value(t):
        return _along(problem, y, margins, direction, coef, delta, t, weights)

    return best_doubling(value(1.0) if at_one is None else at_one, map(value, DOUBLINGS))
