"""The quadratic model q(Δ) of a proximal Newton step (:mod:`dask_scd.engines.newton.newton`;
the smoothed hinge's in :mod:`~dask_scd.engines.newton.hinge_newton`) on X held by rows
(:class:`~dask_scd.engines.newton.design.Design`), and its L2 inner solvers
(``docs/engines/newton.md`` says which runs when): Cholesky of XᵀDX/n + αI when that
costs less than ~20 conjugate-gradient iterations (sklearn's newton-cholesky), else
preconditioned conjugate gradients on Hessian-vector products, one pass over X each, XᵀDX
never formed (liblinear's TRON); on n ≫ p data the Hessian of a row sample
(:class:`HessianSample`). An L1 term's model is solved by coordinate descent
(:mod:`dask_scd.engines.newton.l1_model`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dask_scd import objectives as obj
from dask_scd.engines import cholesky
from dask_scd.engines.coarse_level import block_sums, two_level
from dask_scd.engines.cost_model import BLAS_SPEEDUP
from dask_scd.engines.newton.design import GRAM_MAX, Design, row_parts, run_parts
from dask_scd.engines.newton.kernel_step import kernel_cost, kernel_direction
from dask_scd.engines.newton.newton_loop import forcing_term, optimality_violation
from dask_scd.engines.pcg import MAX_ITER, conjugate_gradients
from dask_scd.kernels import newton as kernels
from dask_scd.validation import as_generator

# The inner model is solved until its violation is below this fraction of the outer one.
INNER = 0.1
# Conjugate-gradient iterations the L2 cost model expects per Newton step.
_CG_EXPECTED = 20
# Outer steps of inexact (CG) Newton on the squared hinge for each step of an exact solve.
# Its curvature jumps where a row crosses the margin, and an exact step lands on the
# minimizer of the current piece (finitely many steps); a step stopped at the forcing
# term loses that: sparse binary rows, n < p, α = 1/n to 0.01/n, 2.2x-6.3x the steps.
_PIECEWISE_STEPS = 6.0
# Sub-sampled Hessian (:class:`HessianSample`): at least this many rows per coordinate,
# a Gram costing at most this fraction of a pass over X, and only from this many times
# fewer rows than X has.
_SAMPLE_PER_COORDINATE = 200
_SAMPLE_GRAM_PASSES = 0.25
_SAMPLE_MIN_SAVING = 4
# A CG solve preconditioned by the sample taking more products than this ends sampling.
_SAMPLE_MAX_CG = 10
# A sampled step must divide the certified gap by this much, or the full Hessian returns.
_SAMPLE_CONTRACTION = 0.1
# The heavy rows' preconditioner (:class:`HeavyRows`): rows whose Gram costs this many
# passes over X.
_HEAVY_GRAM_PASSES = 2.0
_NO_IMAGE = np.zeros(0)


class HessianSample:
    """The Hessian XᵀDX/n of an L2 Newton step estimated from a fixed row sample.

    On n ≫ p data the weighted Gram of all rows is most of a Newton step (dense 1M × 100:
    0.8 s against 0.15 s for a pass). From m uniformly drawn rows its relative error is
    about √(k/m) for k coordinates, so with m ≥ 200k the step is a Newton step up to a
    few per cent: the gradient then contracts by that factor per step (linear, not
    quadratic, convergence, but each step costs two passes instead of a Gram). The
    gradient, the line search and the certificate stay exact; the intercept's step is
    solved exactly given Δ (Δb = −(Σg + dᵀXΔ)/Σd), so the model's dual point keeps
    Σa' = 0. The step that should end the fit runs CG on the exact Hessian, preconditioned
    by the sample's factor (:func:`l2_direction`). A step the line search shortens, one
    that does not divide the certified gap by 1/:data:`_SAMPLE_CONTRACTION`, or such a
    CG solve taking over :data:`_SAMPLE_MAX_CG` products hands back to the full Hessian
    for good.
    """

    def __init__(self, design: Design, rows: np.ndarray):
        self.rows = rows
        self.design = Design.from_array(design.X[rows])
        self.active = True
        self.last_gap = np.inf

    @classmethod
    def build(cls, design: Design, k: int, rng) -> HessianSample | None:
        """A sample when it saves at least :data:`_SAMPLE_MIN_SAVING` x of the Gram's rows
        (None otherwise): as many rows as a Gram of :data:`_SAMPLE_GRAM_PASSES` of a pass
        allows, at least :data:`_SAMPLE_PER_COORDINATE` per coordinate."""
        n = design.rows.n_major
        if k > GRAM_MAX or design.gram_flops <= 0.0:
            return None
        by_cost = n * _SAMPLE_GRAM_PASSES * design.nnz / design.gram_flops
        m = int(max(_SAMPLE_PER_COORDINATE * k, by_cost))
        if m * _SAMPLE_MIN_SAVING > n:
            return None
        return cls(design, np.sort(as_generator(rng).choice(n, size=m, replace=False)))

    def observe(self, relative_gap: float, t: float) -> None:
        """After a sampled step: keep sampling only while it contracts the gap."""
        if t < 1.0 or relative_gap > _SAMPLE_CONTRACTION * self.last_gap:
            self.active = False
        self.last_gap = relative_gap


class HeavyRows:
    """A preconditioner for CG from the rows that carry most of the curvature.

    XᵀDX = Σ d_i x_i x_iᵀ: on classification data near a fit most rows have a margin far
    from 0 and a tiny d_i, and a few carry most of the Hessian; the diagonal
    preconditioner then misses most of its structure and CG needs more products each
    step. This one is the exact XᵀDX of the m rows of largest d_i‖x_i‖², plus the
    diagonal of the others, factored once a step (Cholesky). m: as many rows as a Gram
    of :data:`_HEAVY_GRAM_PASSES` passes' cost buys. It is used from the step after a
    diagonally preconditioned solve took more products than that Gram costs (ski rental:
    the first steps, which need one or two products, never pay for it).
    """

    def __init__(self, design: Design, k: int):
        n = design.rows.n_major
        per_row = design.gram_flops / max(n, 1)
        rows = _HEAVY_GRAM_PASSES * design.nnz / max(per_row, 1.0)
        self.m = int(min(n, max(rows, 1)))
        # Only where factoring the k × k matrix costs at most a pass (at BLAS speed) and
        # applying it (2k² a product) at most half of one: never on wide data.
        self.usable = k**3 / (3.0 * BLAS_SPEEDUP) <= design.nnz and 4.0 * k * k <= design.nnz
        self.active = False

    def observe(self, products: int) -> None:
        """After a CG solve: the next ones are preconditioned by the heavy rows once a
        solve cost more products than their Gram."""
        self.active = self.active or (self.usable and products > _HEAVY_GRAM_PASSES)

    def preconditioner(self, design: Design, model: Model):
        """r ↦ M⁻¹r for M = Σ_heavy d_i x̃_i x̃_iᵀ/n + diag(Σ_other d_i x̃_i²/n) + l2·I,
        x̃_i = (x_i, 1) with an intercept, its Schur complement as :func:`hessian_cg`
        eliminates it (M is positive definite, so is that)."""
        problem, curv = model.problem, model.curv
        n, p = design.rows.n_major, design.rows.n_minor
        fit_b = problem.fit_intercept
        score = curv * design.row_sq_norms
        heavy = np.arange(n) if self.m >= n else np.argpartition(-score, self.m - 1)[: self.m]
        heavy = np.sort(heavy)
        part = Design.from_array(design.X[heavy])
        m = len(heavy)
        hessian = part.gram(np.arange(p), curv[heavy], fit_b) * (m / n)
        sums = model.curvature_sums
        squares = design.rows.scatter(curv, squared=True) if sums is None else sums[0]
        rest = squares - part.rows.scatter(curv[heavy], squared=True)
        hessian[np.arange(p), np.arange(p)] += np.maximum(rest, 0.0) / n + problem.l2
        if fit_b:  # the other rows' weight on the intercept, as a diagonal entry too
            hessian[p, p] += max(float(curv.sum()) - float(curv[heavy].sum()), 0.0) / n
        return _schur_preconditioner(hessian, fit_b)


@dataclass
class Model:
    """The quadratic model of one outer step at (θ, b)."""

    problem: obj.Problem
    coef: np.ndarray
    intercept: float
    grad: np.ndarray  # Xᵀg/n
    grad_b: float  # Σ g_i / n
    grad_rows: np.ndarray  # g = ℓ'(z)
    curv: np.ndarray  # d = ℓ''(z)
    forcing: float = INNER  # the inner solve stops at this fraction of the violation
    # Xᵀa'/n of the model's dual point when the solve gives it without a pass (Cholesky).
    correlation: np.ndarray | None = None
    # Ridge: (P at Δ = 0, tol): CG stops where its residual certifies tol (not forcing).
    ridge: tuple | None = None
    # The inner accuracy at which the model's dual point certifies tol: for L1 the
    # model's violation, for L2 by CG the residual norm.
    dual_target: float = np.inf
    # L2 by CG: dual_target applies once the model's decrease is below this.
    final_decrease: float = 0.0
    # ((X∘X)ᵀd, Xᵀd), un-normalized, when the gradient's pass gave them (CG reads them).
    curvature_sums: tuple | None = None
    # (Δ, g(θ), g(θ + Δ)) of the last direction asked (:func:`penalty_change`).
    penalties: tuple | None = None
    # :meth:`violation`, once computed (θ and the gradient are fixed for a model).
    violation_at_zero: float | None = None

    def violation(self) -> float:
        """Largest distance to optimality over the coordinates, at Δ = 0 (computed once:
        the outer step and its inner solve both read it)."""
        if self.violation_at_zero is None:
            self.violation_at_zero = optimality_violation(
                self.problem, self.grad, self.coef, self.grad_b
            )
        return self.violation_at_zero


def set_inner_targets(model, cert, tol, first_violation) -> float:
    """The inner solve's stopping targets for the model at the iterate ``cert`` certifies:
    a forcing term η = min(0.1, √(v/v₀)) on the outer violation v (v₀ ``first_violation``,
    :func:`~dask_scd.engines.newton.newton_loop.forcing_term`), and the accuracy at which
    the model's dual point a' certifies ``tol``
    (:meth:`~dask_scd.engines.certificates.DualMemory.offer_linearized`). Returns v₀.
    """
    problem = model.problem
    model.forcing, first_violation = forcing_term(model.violation(), first_violation, INNER)
    primal = max(cert.primal, 0.0)
    if problem.loss == "squared" and problem.l1 == 0.0:
        # Ridge: the model is the objective and its gap is ‖∇P‖²/(2·l2), so one CG solve
        # to ‖r‖ ≤ √(l2·P·tol), P read along the way, ends the fit, with no restart of
        # the Krylov space.
        model.ridge = (cert.primal, tol)
    elif problem.l1 == 0.0:
        # A CG residual r leaves a' off by ‖r‖²/(2·l2) in the gap: ‖r‖ ≤ √(0.2·l2·P·tol)
        # keeps that under tol/10. CG goes on to it once the model predicts a decrease
        # below √tol·P (the step that should end the fit).
        model.dual_target = np.sqrt(0.2 * problem.l2 * primal * tol)
        model.final_decrease = np.sqrt(tol) * primal
    elif problem.l2 == 0.0:
        # Pure L1: a violation v of |x_jᵀa'|/n ≤ α costs the rescaled a' about (v/α)·D,
        # first order, so the model is solved to v ≤ 0.1·tol·α (a Gram CD epoch is
        # cheap, and the exact models also take fewer outer steps).
        model.dual_target = 0.1 * tol * problem.l1
    return first_violation


# ----------------------------------------------------------------------- L2 penalty


def l2_direction(design: Design, model: Model, sample: HessianSample | None = None, heavy=None):
    """The Newton direction of an L2 problem (Δ, Δb, XΔ + Δb, passes over X), with the
    Hessian of ``sample`` when one is given; CG preconditioned by ``heavy``
    (:class:`HeavyRows`) once it is active."""
    p = design.rows.n_minor
    problem = model.problem
    fit_b = problem.fit_intercept
    rhs = -(model.grad + problem.l2 * model.coef)
    if fit_b:
        rhs = np.append(rhs, -model.grad_b)
    if sample is not None:
        hessian = ridge_hessian(sample.design, model.curv[sample.rows], fit_b, problem.l2)
        solution = cholesky_solve(hessian, rhs)
        delta = solution[:p]
        if model_decrease(model, delta, solution[p] if fit_b else 0.0) > model.final_decrease:
            direction = design.rows.dot(delta)
            delta_b = 0.0
            total = float(model.curv.sum())
            if fit_b and total > 0.0:  # the intercept's equation exactly, given Δ
                delta_b = (
                    -(design.rows.n_major * model.grad_b + float(model.curv @ direction)) / total
                )
                direction += delta_b
            return delta, delta_b, direction, 1.0 + _SAMPLE_GRAM_PASSES, "sampled"
        # The step that should end the fit: its model's dual point must be exact to the
        # square of its error, so CG on the true Hessian, preconditioned by the sample's.
        pre = _schur_preconditioner(hessian, fit_b)
        solution, iterations, image = hessian_cg(design, model, rhs, pre)
        if iterations > _SAMPLE_MAX_CG:  # the sample misses part of the curvature
            sample.active = False
        side = fit_b and model.curvature_sums is None  # XᵀD1's pass
        passes, inner = _SAMPLE_GRAM_PASSES + side + iterations, "sampled_cg"
    elif (solver := l2_solver(design, problem)) == "kernel" and (
        found := kernel_direction(design, model)
    ):
        return *found, 2.0, "kernel"
    elif solver == "cholesky":
        hessian = ridge_hessian(design, model.curv, fit_b, problem.l2)
        solution = cholesky_solve(hessian, rhs)
        passes, inner = 1.0, "cholesky"
        # Xᵀa'/n = −(Xᵀg/n + XᵀD(XΔ + Δb)/n) from the Hessian itself: no pass.
        model.correlation = -(model.grad + hessian[:p] @ solution - problem.l2 * solution[:p])
    else:
        fused = model.curvature_sums is not None
        if heavy is not None and heavy.active:
            pre = heavy.preconditioner(design, model)
            solution, iterations, image = hessian_cg(design, model, rhs, pre)
            # the heavy rows' Gram, the rest's diagonal unless the gradient's pass gave it
            passes = _HEAVY_GRAM_PASSES + (0.0 if fused else 1.0 + fit_b) + iterations
            inner = "heavy_cg"
        else:
            solution, iterations, image = hessian_cg(design, model, rhs)
            if heavy is not None:
                heavy.observe(iterations)
            # the preconditioner (and XᵀD1 with an intercept) unless the gradient's pass
            # gave them, then one pass per product
            passes, inner = (0.0 if fused else 1.0 + fit_b) + iterations, "cg"
    delta = solution[:p]
    delta_b = float(solution[p]) if fit_b else 0.0
    if inner == "cholesky":
        return delta, delta_b, design.rows.dot(delta) + delta_b, passes + 1.0, inner
    return delta, delta_b, image + delta_b, passes, inner  # XΔ from CG's own products


def ridge_hessian(design: Design, weights, fit_b: bool, l2: float) -> np.ndarray:
    """XᵀDX/n + l2·I on every column (+ the intercept's row and column, unpenalized)."""
    p = design.rows.n_minor
    hessian = design.gram(np.arange(p), weights, fit_b)
    hessian[np.arange(p), np.arange(p)] += l2
    return hessian


def l2_solver(design: Design, problem: obj.Problem) -> str:
    """How an L2 step is solved, the cheapest of: "cholesky" of XᵀDX/n + αI (p × p),
    "kernel" (the n × n factor of :mod:`~dask_scd.engines.newton.kernel_step`, α > 0),
    or "cg" at ~:data:`_CG_EXPECTED` products a step, :data:`_PIECEWISE_STEPS` times as
    many steps for the squared hinge."""
    k = design.rows.n_minor + int(problem.fit_intercept)
    products = _CG_EXPECTED * (_PIECEWISE_STEPS if problem.loss == "squared_hinge" else 1.0)
    costs = {"cg": products * 2.0 * design.nnz}
    if k <= GRAM_MAX:
        costs["cholesky"] = design.gram_flops + k**3 / 3.0
    if problem.l2 > 0.0:
        costs["kernel"] = kernel_cost(design)
    return min(costs, key=costs.get)


def model_decrease(model, delta, delta_b) -> float:
    """−(∇fᵀΔ + ∂f/∂b·Δb + g(θ + Δ) − g(θ)): the model's first-order decrease."""
    now, after = penalty_change(model, delta)
    return -(float(model.grad @ delta) + model.grad_b * delta_b + after - now)


def penalty_change(model, delta) -> tuple[float, float]:
    """(g(θ), g(θ + Δ)) for the direction ``delta``, computed once per direction (the
    test of the step's end and the line search both read them)."""
    kept = model.penalties
    if kept is not None and kept[0] is delta:
        return kept[1], kept[2]
    problem = model.problem
    now = obj.penalty_value(problem, model.coef)
    after = obj.penalty_value(problem, model.coef + delta)
    model.penalties = (delta, now, after)
    return now, after


def _schur_preconditioner(hessian, intercept: bool):
    """r ↦ S⁻¹r for S the (sampled) Hessian with the intercept eliminated (its Schur
    complement, the system :func:`hessian_cg` runs on)."""
    S = hessian
    if intercept and hessian[-1, -1] > 0.0:
        side = hessian[:-1, -1]
        S = hessian[:-1, :-1] - np.outer(side, side) / hessian[-1, -1]
    elif intercept:
        S = hessian[:-1, :-1]
    try:
        factor = cholesky.factor(S)
    except np.linalg.LinAlgError:
        jitter = 1e-12 * max(float(np.trace(S)), 1e-300) + 1e-300
        factor = cholesky.factor(S + jitter * np.eye(len(S)))
    return lambda r: cholesky.solve(factor, r)


def _diagonal_and_coarse(design: Design, model: Model, diagonal, s, total: float):
    """The diagonal preconditioner of the (Schur-complement) system, with the coarse level
    on whole-block shifts when X has blocks (:mod:`dask_scd.engines.coarse_level`)."""
    coarse = design.coarse
    if coarse is None:
        return lambda r: r / diagonal
    block_of, rows = coarse
    n, k = design.rows.n_major, len(rows.column_of)
    sizes = np.bincount(block_of[block_of >= 0], minlength=k).astype(np.float64)
    small = rows.curvature(model.curv) / n + model.problem.l2 * np.diag(sizes)
    if s is not None:  # the intercept eliminated: A = XᵀDX/n + l2 − s sᵀ/(n Σd)
        z_s = block_sums(s, block_of, k)
        small -= np.outer(z_s, z_s) / (n * total)
    return two_level(1.0 / diagonal, small, block_of, k)


def cholesky_solve(hessian, rhs) -> np.ndarray:
    """(H)⁻¹ rhs; a singular H (no curvature on the intercept) gets a relative jitter."""
    try:
        return cholesky.solve(cholesky.factor(hessian), rhs)
    except np.linalg.LinAlgError:
        jitter = 1e-12 * max(float(np.trace(hessian)), 1e-300) + 1e-300
        return np.linalg.lstsq(hessian + jitter * np.eye(len(rhs)), rhs, rcond=None)[0]


def hessian_cg(design: Design, model: Model, rhs, preconditioner=None):
    """Truncated Newton: preconditioned CG on (XᵀDX/n + αI)Δ = rhs, products by rows.

    With an intercept, CG runs on the Schur complement of its row (the intercept is
    eliminated: Δb = (n·rhs_b − sᵀΔ)/Σd with s = XᵀD1, exact for every Δ), i.e. on the
    columns centered in the weights d, as the squared loss's coordinate descent centers
    them. That is better conditioned than the bordered system, and the CG residual is then
    the whole model residual: the ridge certificate and the model's dual point
    (:meth:`~dask_scd.engines.certificates.DualMemory.offer_linearized`, Σa' = 0) read
    it directly.

    Stops by :func:`_stopping_rule`. ``preconditioner(r)`` replaces the diagonal's (one
    pass fewer): the sampled Hessian's (intercept-eliminated) factor,
    :class:`HessianSample`. Returns the solution (Δ, and Δb with an intercept), the
    number of products, and XΔ (without Δb), summed from the products' own passes.
    """
    rows = design.rows
    n, p = rows.n_major, rows.n_minor
    problem = model.problem
    curv = model.curv
    total = float(curv.sum())
    schur = problem.fit_intercept and total > 0.0
    s, rhs_b = None, 0.0
    sums = model.curvature_sums
    if schur:
        s = rows.scatter(curv) if sums is None else sums[1]  # XᵀD1
        rhs_b = float(rhs[p])
        rhs = rhs[:p] - s * (rhs_b / total)
    elif problem.fit_intercept:
        # No curvature on any row (the squared hinge with every margin past 1): the
        # model is flat in b, which stays (Δb = 0), and CG runs on θ's block alone.
        rhs = rhs[:p]
    if preconditioner is None:  # the diagonal of the (Schur-complement) system
        squares = rows.scatter(curv, squared=True) if sums is None else sums[0]
        diagonal = squares / n + problem.l2
        if schur:
            diagonal -= s * s / (n * total)
        diagonal = np.where(diagonal > 0.0, diagonal, 1.0)
        preconditioner = _diagonal_and_coarse(design, model, diagonal, s, total)
    # The model at (Δ, Δb(Δ)) is q_S(Δ) − ½·rhs_b²/h_bb: the intercept's share of it.
    intercept_gain = -0.5 * n * rhs_b * rhs_b / total if schur else 0.0
    last, image = np.empty(n), np.zeros(n)  # X of the last direction, X of the iterate

    def on_step(step: float) -> None:
        np.add(image, step * last, out=image)

    x, iterations = conjugate_gradients(
        _hessian_product(design, curv, problem.l2, s, total, last),
        rhs,
        preconditioner,
        _stopping_rule(model, rhs, intercept_gain),
        MAX_ITER,
        on_step=on_step,
    )
    if schur:
        x = np.append(x, (n * rhs_b - float(s @ x)) / total)
    elif problem.fit_intercept:
        x = np.append(x, 0.0)  # no curvature anywhere: the model leaves b alone
    return x, iterations, image


def _hessian_product(design: Design, curv, l2: float, s, total: float, xv=None):
    """v ↦ (XᵀDX/n + l2·I)v by one pass over the rows, less s(sᵀv)/(n·Σd) when ``s`` =
    XᵀD1 is given (the intercept eliminated); the rows' fixed ranges summed in order.
    ``xv`` (n,), when given, receives Xv from the same pass."""
    rows = design.rows
    n, p = rows.n_major, rows.n_minor
    ranges = row_parts(rows)
    outs = [(np.empty(p),) for _ in ranges]
    sides = np.zeros(len(ranges))

    def apply_part(k, v):
        lo, hi = ranges[k]
        sub = rows.lines(lo, hi)
        image = _NO_IMAGE if xv is None else xv[lo:hi]
        sides[k] = kernels.hessian_vector(
            sub.data,
            sub.indices,
            sub.indptr,
            sub.dense,
            hi - lo,
            p,
            curv[lo:hi],
            v,
            0.0,
            outs[k][0],
            image,
        )

    def apply(v):
        v = np.ascontiguousarray(v, dtype=np.float64)
        (out,) = run_parts(rows, lambda k: apply_part(k, v), outs)
        side = float(sum(sides))  # out = XᵀDXv, side = 1ᵀDXv, summed over the parts in order
        product = out / n + l2 * v
        if s is not None:
            product -= s * (side / (n * total))
        return product

    return apply


def _stopping_rule(model: Model, rhs, intercept_gain: float):
    """When :func:`hessian_cg` stops: at ‖r‖ ≤ η‖rhs‖, η the model's forcing term (ridge:
    at ‖r‖² ≤ l2·tol·P, P of the current iterate, which the quadratic gives for free:
    q(x) = −½xᵀ(rhs + r)); a step whose model decrease is below ``final_decrease`` goes
    on to ``dual_target``."""
    problem = model.problem
    target = model.forcing * float(np.linalg.norm(rhs))

    def stop(x, r, norm: float) -> bool:
        nonlocal target
        while True:
            if model.ridge is not None:
                primal = model.ridge[0] - 0.5 * float(x @ (rhs + r)) + intercept_gain
                target = np.sqrt(problem.l2 * model.ridge[1] * max(primal, 0.0))
            if not norm <= target:
                return False
            # A step this small is the last one: solve on to where the model's dual point
            # certifies tol.
            if target > model.dual_target and -0.5 * float(x @ (rhs + r)) >= -model.final_decrease:
                target = model.dual_target
                continue
            return True

    return stop
