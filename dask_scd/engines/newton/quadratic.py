"""The quadratic model of a proximal Newton step, and its inner solvers.

Both Newton engines, :mod:`dask_scd.engines.newton.newton` (the smooth losses) and
:mod:`dask_scd.engines.newton.hinge_newton` (the smoothed hinge), solve models

    q(Δ) = gᵀXΔ/n + ½ΔᵀXᵀDXΔ/n + penalty(θ + Δ)        (Δb: the intercept, unpenalized)

on X held by rows (:class:`Design`). Inner solvers (``docs/engines/newton.md`` says which
runs when):

- L2: Cholesky of XᵀDX/n + αI when that costs less than ~20 conjugate-gradient
  iterations (sklearn's newton-cholesky), else preconditioned conjugate gradients on
  Hessian-vector products, one pass over X each, XᵀDX never formed (liblinear's TRON);
  on n ≫ p data the Hessian of a row sample (:class:`HessianSample`);
- L1 / elastic net: coordinate descent on the model over a working set (the non-zero
  coefficients and the worst violators, at most as many again: glmnet's IRLS-CD with
  celer's and skglm's growing working sets), on the weighted Gram of the working set
  when it is small, else over its columns with XΔ kept as a vector (newGLMNET).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse

from dask_scd import objectives as obj
from dask_scd.data.memory import pure_blocks
from dask_scd.engines.coarse_level import block_index, block_sums, memory_coarse, two_level
from dask_scd.kernels import newton as kernels
from dask_scd.kernels import threads
from dask_scd.kernels.layout import MajorMatrix

# The inner model is solved until its violation is below this fraction of the outer one.
_INNER = 0.1
# Conjugate-gradient iterations the L2 cost model expects per Newton step.
_CG_EXPECTED = 20
CG_MAX = 500
# Above this many coordinates a Gram matrix (k² float64) is not formed.
GRAM_MAX = 2000
# A BLAS Gram of dense rows runs this many times faster per flop than a pass of the kernels.
_BLAS_SPEEDUP = 8.0
# Inner coordinate-descent epochs: expected (cost model) and at most.
_CD_EXPECTED = 20
_CD_MAX_GRAM = 5000
_CD_MAX_COLUMNS = 50
# From this many rows the L1 column epochs over sparse columns keep (r, D) and compute XΔ
# after them, rather than keeping (g, D, XΔ): the rows' triples (24 bytes each, 3 MiB
# here) outgrow a core's own cache, and the epochs are bound by its misses.
PAIR_ROWS = 1 << 17
# Coordinate-descent sweeps over the block shifts of an L1 model, at most.
_SHIFT_SWEEPS = 2000
# Incremental updates of a kept SᵀS of the block shifts before it is recomputed from S.
_SHIFT_REFRESH = 32
# Column curvatures of an L1 model stay above this fraction of the loss's largest.
_CURVATURE_FLOOR = 1e-6
# Rows per chunk of a dense weighted Gram: ~4 MiB float64 temporaries.
_CHUNK_BYTES = 4 << 20
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


@dataclass
class Design:
    """X by rows (margins, gradients, Hessian products, Gram), by columns on demand."""

    X: object
    rows: MajorMatrix
    column_nnz: np.ndarray  # non-zeros per column
    gram_flops: float  # Σ_i nnz_i²: a weighted Gram of all columns
    blocks: object = None  # a function giving the pure blocks (or None), called once
    _columns: MajorMatrix | None = None
    _coarse: tuple | None = None
    _coarse_built: bool = False
    # The curvature D is the identity (squared loss, no sample weights) and the design is
    # kept between runs: Gram blocks are then kept too (:meth:`gram`).
    unit_curvature: bool = False
    _kept_gram: tuple | None = None
    _kept_shift: object = None  # _KeptShift
    _gram_spent: float = 0.0
    _sq_norms: np.ndarray | None = None

    @property
    def column_sq_norms(self) -> np.ndarray:
        """‖x_j‖² of every column, computed once."""
        if self._sq_norms is None:
            self._sq_norms = self.columns.sq_norms()
        return self._sq_norms

    @property
    def pure_blocks(self) -> list | None:
        """X's pure blocks (:func:`dask_scd.data.memory.pure_blocks`), found once."""
        if self.blocks is None:
            self.blocks = lambda: pure_blocks(self.by_rows)
        if callable(self.blocks):
            self.blocks = self.blocks() or []
        return self.blocks or None

    @property
    def coarse(self):
        """(block of every column, S) for the CG preconditioner's coarse level, or None
        (:func:`dask_scd.engines.coarse_level.memory_coarse`), built once."""
        if not self._coarse_built:
            self._coarse = memory_coarse(self.by_rows, self.pure_blocks)
            self._coarse_built = True
        return self._coarse

    @property
    def block_of(self) -> np.ndarray | None:
        """The pure block of every column (−1: none), or None without 2 to 256 blocks."""
        if self._coarse_built and self._coarse is not None:
            return self._coarse[0]
        return block_index(self.X, self.pure_blocks)

    @property
    def by_rows(self):
        """X as a CSR matrix over the arrays of ``rows`` (no copy), or dense X."""
        rows = self.rows
        if rows.dense:
            return self.X
        return scipy.sparse.csr_matrix(
            (rows.data, rows.indices, rows.indptr), shape=(rows.n_major, rows.n_minor), copy=False
        )

    @classmethod
    def from_array(cls, X, blocks=None, by_rows=None) -> Design:
        """X by rows; ``blocks``: a function giving its pure blocks when a coarse level
        first asks (default: detected on X); ``by_rows``: X as CSR where the caller has
        it (a CSC X is converted once, not by every reader of its rows)."""
        rows = MajorMatrix.from_array(X if by_rows is None else by_rows, "rows")
        n, p = X.shape
        if rows.dense:
            column_nnz = np.full(p, n, dtype=np.int64)
            gram_flops = n * float(p) ** 2 / _BLAS_SPEEDUP
        else:
            column_nnz = np.bincount(rows.indices, minlength=p)
            gram_flops = float(np.sum(np.diff(rows.indptr).astype(np.float64) ** 2))
        return cls(X, rows, column_nnz, gram_flops, blocks)

    def signed_scatter(self, u) -> tuple[np.ndarray, np.ndarray]:
        """(Xᵀ(u ∘ [u < 0]), Xᵀ(u ∘ [u > 0])), one pass over the rows."""
        rows = self.rows
        u = np.ascontiguousarray(u, dtype=np.float64)
        ranges = _row_parts(rows)
        outs = [(np.empty(rows.n_minor), np.empty(rows.n_minor)) for _ in ranges]

        def part(k):
            lo, hi = ranges[k]
            sub = rows.lines(lo, hi)
            kernels.signed_scatter(
                sub.data,
                sub.indices,
                sub.indptr,
                sub.dense,
                hi - lo,
                rows.n_minor,
                u[lo:hi],
                *outs[k],
            )

        _run_parts(rows, part, len(ranges))
        neg, pos = outs[0]
        for more_neg, more_pos in outs[1:]:
            neg += more_neg
            pos += more_pos
        return neg, pos

    @property
    def nnz(self) -> float:
        return float(self.column_nnz.sum())

    @property
    def columns(self) -> MajorMatrix:
        if self._columns is None:
            self._columns = MajorMatrix.from_array(self.X, "columns")
        return self._columns

    def gram(self, working, weights, intercept) -> np.ndarray:
        """XᵀDX/n on the columns ``working`` (+ the column of ones), float64."""
        if self.unit_curvature:
            return self._unit_gram(working, weights, intercept)
        return self._gram(working, weights, intercept)

    def _unit_gram(self, working, weights, intercept) -> np.ndarray:
        """XᵀX/n on ``working`` from the kept block when it holds those columns; else
        the block of those and the kept ones together (the working sets of a path's
        points mostly grow), or of all columns once the blocks computed so far cost as
        much as they do (then at most twice the least possible), kept in its place.

        A block that grows from sparse rows adds only the products of its new columns:
        the kept ones' sums are the same bits a new block would compute (the same
        products, added row by row in the same order)."""
        kept = self._kept_gram
        if kept is None or kept[0] != intercept or not np.all(kept[2][working] >= 0):
            same = kept is not None and kept[0] == intercept
            columns = np.union1d(kept[1], working) if same else working
            p = self.rows.n_minor
            share = float(self.column_nnz[columns].sum()) / max(self.nnz, 1.0)
            held = float(self.column_nnz[kept[1]].sum()) / max(self.nnz, 1.0) if same else 0.0
            # the products of the pairs not held, and a pass (growing: the new columns'
            # rows alone)
            read = (share - held) * self.gram_flops / max(self.nnz, 1.0) if same else 1.0
            self._gram_spent += self.nnz * read + self.gram_flops * (share * share - held * held)
            if p <= GRAM_MAX and self.nnz + self.gram_flops <= self._gram_spent:
                columns = np.arange(p)  # as much as the blocks so far cost: ski rental
            elif len(columns) > GRAM_MAX:
                columns = working
            position = np.full(self.rows.n_minor, -1, dtype=np.int64)
            position[columns] = np.arange(len(columns))
            if same and not self.rows.dense and np.all(position[kept[1]] >= 0):
                sums = self._grown_sums(kept, columns, position, intercept)
            else:
                sums = self._sums(columns, weights, intercept)
            kept = (intercept, columns, position, self._normalized(sums), sums)
            self._kept_gram = kept
        index = kept[2][working]
        if intercept:
            index = np.append(index, len(kept[1]))
        return kept[3][np.ix_(index, index)]

    def _grown_sums(self, kept, columns, position, intercept) -> np.ndarray:
        """The un-normalized upper triangle of XᵀX on ``columns`` ⊇ the kept ones: the kept
        sums moved to their new places, the new columns' pairs from one pass."""
        old = position[kept[1]]
        if intercept:
            old = np.append(old, len(columns))
        k = len(columns) + int(intercept)
        out = np.zeros((k, k))
        out[np.ix_(old, old)] = kept[4]
        new = np.ones(k, dtype=np.bool_)
        new[old] = False
        rows, cols = self.rows, self.columns
        added = columns[new[: len(columns)]]
        kernels.gram_of_new_columns(
            rows.data,
            rows.indices,
            rows.indptr,
            cols.data,
            cols.indices,
            cols.indptr,
            added,
            position,
            new,
            intercept,
            out,
        )
        return out

    def _normalized(self, sums) -> np.ndarray:
        """XᵀDX/n from the sums of its upper triangle (sparse rows) or all of it (dense)."""
        if not self.rows.dense:
            sums = np.triu(sums) + np.triu(sums, 1).T
        return sums / self.rows.n_major

    def _gram(self, working, weights, intercept) -> np.ndarray:
        return self._normalized(self._sums(working, weights, intercept))

    def _sums(self, working, weights, intercept) -> np.ndarray:
        """Σ_i d_i x_i x_iᵀ on ``working`` (+ the ones column): its upper triangle from
        sparse rows, all of it from dense ones."""
        n = self.rows.n_major
        k = len(working) + int(intercept)
        out = np.zeros((k, k))
        if self.rows.dense:
            self._dense_gram(working, weights, intercept, out)
        else:
            position = np.full(self.rows.n_minor, -1, dtype=np.int64)
            position[working] = np.arange(len(working))
            kernels.weighted_gram(
                self.rows.data,
                self.rows.indices,
                self.rows.indptr,
                n,
                position,
                weights,
                intercept,
                out,
            )
        return out

    def _dense_gram(self, working, weights, intercept, out) -> None:
        """Σ d_i x_i x_iᵀ as (√d·X)ᵀ(√d·X) over row chunks (numpy hands a product of a
        matrix with its own transpose to BLAS syrk: half the multiply-adds, no gather of X
        when every column is in); the intercept's row and column by a product with d."""
        A = np.asarray(self.X)
        p = A.shape[1]
        every = len(working) == p  # the whole matrix: no gather of columns
        m = len(working)
        gram = out[:m, :m]  # a view: the chunks' sums land in out
        side = np.zeros(m)
        step = max(256, _CHUNK_BYTES // (8 * max(p, 1)))
        for start in range(0, A.shape[0], step):
            chunk = A[start : start + step] if every else A[start : start + step][:, working]
            w = weights[start : start + step]
            if intercept:
                side += w @ chunk
            scaled = chunk * np.sqrt(w)[:, None]  # a float64 copy of one chunk
            gram += scaled.T @ scaled
        if intercept:
            out[m, :m] = side
            out[:m, m] = side
            out[m, m] = float(weights.sum())


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
        return cls(design, np.sort(rng.choice(n, size=m, replace=False)))

    def gram(self, weights, intercept) -> np.ndarray:
        return self.design.gram(np.arange(self.design.rows.n_minor), weights[self.rows], intercept)

    def observe(self, relative_gap: float, t: float) -> None:
        """After a sampled step: keep sampling only while it contracts the gap."""
        if t < 1.0 or relative_gap > _SAMPLE_CONTRACTION * self.last_gap:
            self.active = False
        self.last_gap = relative_gap


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
    forcing: float = _INNER  # the inner solve stops at this fraction of the violation
    # Xᵀa'/n of the model's dual point when the solve gives it without a pass (Cholesky).
    correlation: np.ndarray | None = None
    # Ridge: (P at Δ = 0, tol): CG stops where its residual certifies tol (not forcing).
    ridge: tuple | None = None
    # The inner accuracy at which the model's dual point certifies tol: for L1 the
    # model's violation, for L2 by CG the residual norm.
    dual_target: float = np.inf
    # L2 by CG: dual_target applies once the model's decrease is below this.
    final_decrease: float = 0.0

    def violation(self) -> float:
        """Largest distance to optimality over the coordinates, at Δ = 0."""
        problem, coef = self.problem, self.coef
        slope = self.grad + problem.l2 * coef
        v = np.where(
            coef != 0.0,
            np.abs(slope + problem.l1 * np.sign(coef)),
            np.maximum(np.abs(slope) - problem.l1, 0.0),
        )
        worst = float(v.max(initial=0.0))
        if problem.fit_intercept:
            worst = max(worst, abs(self.grad_b))
        return worst


def set_inner_targets(model, cert, tol, violation, first_violation) -> None:
    """The inner solve's stopping targets for the model at the iterate ``cert`` certifies.

    A forcing term η = min(0.1, √(v/v₀)) on the outer violation v (superlinear inexact
    Newton), and the accuracy at which the model's dual point a' certifies ``tol``
    (:meth:`~dask_scd.engines.certificates.DualMemory.offer_linearized`).
    """
    problem = model.problem
    model.forcing = min(_INNER, np.sqrt(violation / first_violation))
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


# ----------------------------------------------------------------------- L2 penalty


def l2_direction(design: Design, model: Model, sample: HessianSample | None = None):
    """The Newton direction of an L2 problem (Δ, Δb, XΔ + Δb, passes over X), with the
    Hessian of ``sample`` when one is given."""
    p = design.rows.n_minor
    problem = model.problem
    fit_b = problem.fit_intercept
    rhs = -(model.grad + problem.l2 * model.coef)
    if fit_b:
        rhs = np.append(rhs, -model.grad_b)
    k = p + int(fit_b)
    gram_cost = design.gram_flops + k**3 / 3.0
    if sample is not None:
        hessian = sample.gram(model.curv, fit_b)
        hessian[np.arange(p), np.arange(p)] += problem.l2
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
        solution, iterations = conjugate_gradients(
            design, model, rhs, _schur_preconditioner(hessian, fit_b)
        )
        if iterations > _SAMPLE_MAX_CG:  # the sample misses part of the curvature
            sample.active = False
        passes, inner = _SAMPLE_GRAM_PASSES + fit_b + iterations, "sampled_cg"
    elif k <= GRAM_MAX and gram_cost <= _CG_EXPECTED * 2.0 * design.nnz:
        hessian = design.gram(np.arange(p), model.curv, fit_b)
        hessian[np.arange(p), np.arange(p)] += problem.l2
        solution = cholesky_solve(hessian, rhs)
        passes, inner = 1.0, "cholesky"
        # Xᵀa'/n = −(Xᵀg/n + XᵀD(XΔ + Δb)/n) from the Hessian itself: no pass.
        model.correlation = -(model.grad + hessian[:p] @ solution - problem.l2 * solution[:p])
    else:
        solution, iterations = conjugate_gradients(design, model, rhs)
        # the preconditioner (and XᵀD1 with an intercept), one pass per product
        passes, inner = 1.0 + fit_b + iterations, "cg"
    delta = solution[:p]
    delta_b = float(solution[p]) if fit_b else 0.0
    direction = design.rows.dot(delta) + delta_b
    return delta, delta_b, direction, passes + 1.0, inner


def model_decrease(model, delta, delta_b) -> float:
    """−(∇fᵀΔ + ∂f/∂b·Δb + g(θ + Δ) − g(θ)): the model's first-order decrease."""
    problem = model.problem
    return -(
        float(model.grad @ delta)
        + model.grad_b * delta_b
        + obj.penalty_value(problem, model.coef + delta)
        - obj.penalty_value(problem, model.coef)
    )


def _schur_preconditioner(hessian, intercept: bool):
    """r ↦ S⁻¹r for S the (sampled) Hessian with the intercept eliminated (its Schur
    complement, the system :func:`conjugate_gradients` runs on)."""
    S = hessian
    if intercept and hessian[-1, -1] > 0.0:
        side = hessian[:-1, -1]
        S = hessian[:-1, :-1] - np.outer(side, side) / hessian[-1, -1]
    elif intercept:
        S = hessian[:-1, :-1]
    try:
        factor = scipy.linalg.cho_factor(S)
    except np.linalg.LinAlgError:
        jitter = 1e-12 * max(float(np.trace(S)), 1e-300) + 1e-300
        factor = scipy.linalg.cho_factor(S + jitter * np.eye(len(S)))
    return lambda r: scipy.linalg.cho_solve(factor, r)


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
        return scipy.linalg.cho_solve(scipy.linalg.cho_factor(hessian), rhs)
    except np.linalg.LinAlgError:
        jitter = 1e-12 * max(float(np.trace(hessian)), 1e-300) + 1e-300
        return np.linalg.lstsq(hessian + jitter * np.eye(len(rhs)), rhs, rcond=None)[0]


def conjugate_gradients(design: Design, model: Model, rhs, preconditioner=None):
    """Truncated Newton: preconditioned CG on (XᵀDX/n + αI)Δ = rhs, products by rows.

    With an intercept, CG runs on the Schur complement of its row (the intercept is
    eliminated: Δb = (n·rhs_b − sᵀΔ)/Σd with s = XᵀD1, exact for every Δ), i.e. on the
    columns centered in the weights d, as the squared loss's coordinate descent centers
    them. That is better conditioned than the bordered system, and the CG residual is then
    the whole model residual: the ridge certificate and the model's dual point
    (:meth:`~dask_scd.engines.certificates.DualMemory.offer_linearized`, Σa' = 0) read
    it directly.

    Stops at ‖residual‖ ≤ η‖rhs‖ with η the model's forcing term (ridge: at ‖r‖² ≤
    l2·tol·P, P of the current iterate, which the quadratic gives for free); a step whose model decrease is below ``final_decrease`` goes on
    to ``dual_target``. ``preconditioner(r)`` replaces the diagonal's (one pass fewer):
    the sampled Hessian's (intercept-eliminated) factor, :class:`HessianSample`. Returns
    the solution (Δ, and Δb with an intercept) and the number of products.
    """
    rows = design.rows
    n, p = rows.n_major, rows.n_minor
    problem = model.problem
    curv = model.curv
    total = float(curv.sum())
    schur = problem.fit_intercept and total > 0.0
    out = np.empty(p)
    if schur:
        s = rows.scatter(curv)  # XᵀD1
        rhs_b = float(rhs[p])
        rhs = rhs[:p] - s * (rhs_b / total)
    if preconditioner is None:  # the diagonal of the (Schur-complement) system
        diagonal = rows.scatter(curv, squared=True) / n + problem.l2
        if schur:
            diagonal -= s * s / (n * total)
        diagonal = np.where(diagonal > 0.0, diagonal, 1.0)
        preconditioner = _diagonal_and_coarse(design, model, diagonal, s if schur else None, total)

    ranges = _row_parts(rows)
    outs = [out] + [np.empty(p) for _ in ranges[1:]]
    sides = np.zeros(len(ranges))

    def apply_part(k, v):
        lo, hi = ranges[k]
        sub = rows.lines(lo, hi)
        sides[k] = kernels.hessian_vector(
            sub.data, sub.indices, sub.indptr, sub.dense, hi - lo, p, curv[lo:hi], v, 0.0, outs[k]
        )

    def apply(v):
        v = np.ascontiguousarray(v, dtype=np.float64)
        _run_parts(rows, lambda k: apply_part(k, v), len(ranges))
        for more in outs[1:]:
            np.add(outs[0], more, out=outs[0])  # outs[0] is ``out``
        side = float(sum(sides))  # out = XᵀDXv, side = 1ᵀDXv, summed over the parts in order
        product = out / n + problem.l2 * v
        if schur:
            product -= s * (side / (n * total))
        return product

    norm = float(np.linalg.norm(rhs))
    target = model.forcing * norm
    # The model at (Δ, Δb(Δ)) is q_S(Δ) − ½·rhs_b²/h_bb: the intercept's share of it.
    intercept_gain = -0.5 * n * rhs_b * rhs_b / total if schur else 0.0
    x = np.zeros_like(rhs)
    r = rhs.copy()
    z = preconditioner(r)
    direction = z.copy()
    rz = float(r @ z)
    iterations = 0
    while iterations < CG_MAX:
        if model.ridge is not None:
            primal = model.ridge[0] - 0.5 * float(x @ (rhs + r)) + intercept_gain
            target = np.sqrt(problem.l2 * model.ridge[1] * max(primal, 0.0))
        if float(np.linalg.norm(r)) <= target:
            # q(x) = −½xᵀ(rhs + r): a step this small is the last one, so solve on to
            # where the model's dual point certifies tol.
            if target > model.dual_target and -0.5 * float(x @ (rhs + r)) >= -model.final_decrease:
                target = model.dual_target
                continue
            break
        product = apply(direction)
        iterations += 1
        curvature = float(direction @ product)
        if curvature <= 0.0:
            break
        step = rz / curvature
        x += step * direction
        r -= step * product
        z = preconditioner(r)
        rz, previous = float(r @ z), rz
        direction = z + (rz / previous) * direction
    if schur:
        x = np.append(x, (n * rhs_b - float(s @ x)) / total)
    elif problem.fit_intercept:
        x = np.append(x, 0.0)  # no curvature anywhere: the model leaves b alone
    return x, iterations


# ------------------------------------------------------------------ L1 / elastic net


def working_set(problem, coef, grad, size) -> np.ndarray:
    """The non-zero coefficients and the worst violators (|Xᵀg/n| above α·l1_ratio), at
    most ``size`` in all, sorted."""
    support = np.flatnonzero(coef)
    excess = np.abs(grad) - problem.l1
    excess[support] = -np.inf
    room = max(size - len(support), 0)
    violators = np.flatnonzero(excess > 0.0)
    if len(violators) > room:
        violators = (
            violators[np.argpartition(-excess[violators], room - 1)[:room]]
            if room > 0
            else violators[:0]
        )
    return np.union1d(support, violators)


def l1_direction(design: Design, model: Model, working):
    """Coordinate descent on the model restricted to W (Δ = 0 outside W)."""
    n, p = design.rows.n_major, design.rows.n_minor
    problem = model.problem
    fit_b = problem.fit_intercept
    k = len(working) + int(fit_b)
    nnz_w = float(design.column_nnz[working].sum())
    # Σ_i nnz_i(W)², scaled from the whole matrix by the share of W's non-zeros.
    form = design.gram_flops * (nnz_w / max(design.nnz, 1.0)) ** 2
    target = min(model.forcing * model.violation(), model.dual_target)
    delta = np.zeros(p)
    if k <= GRAM_MAX and form + _CD_EXPECTED * k * k <= _CD_EXPECTED * (nnz_w + n):
        hessian = design.gram(working, model.curv, fit_b)
        q = model.grad[working]
        coef_w = model.coef[working]
        if fit_b:
            q = np.append(q, model.grad_b)
            coef_w = np.append(coef_w, 0.0)
        delta_w = np.zeros(k)
        kernels.gram_cd(
            hessian, q, coef_w, delta_w, problem.l1, problem.l2, fit_b, target, _CD_MAX_GRAM
        )
        delta[working] = delta_w[: len(working)]
        delta_b = float(delta_w[-1]) if fit_b else 0.0
        direction = design.rows.dot(delta) + delta_b
        return delta, delta_b, direction, 2.0, "gram_cd"
    # A column epoch costs a pass over X_W: solved as far as the forcing term asks (the
    # superlinear rate), and no further than the model's dual point needs to certify.
    target = model.forcing * model.violation()
    if np.isfinite(model.dual_target):
        target = max(target, model.dual_target)
    columns = design.columns
    unit = _unit_curvature(design, model)
    if unit:
        col_curv = design.column_sq_norms / n  # Σ_i x_ij² / n, the same at every step
    else:
        col_curv = columns.dot(model.curv, squared=True) / n  # Σ_i d_i x_ij² / n
        # A column whose rows all sit far out on the logistic's tail has ~no curvature,
        # and its model step ~(q ± l1)/0 (a 2e18 step stalled a weak-L1 fit at gap 0.86):
        # the curvature is kept above a millionth of its largest value, d = 1/4 (2 for the
        # squared hinge), which only such columns meet.
        floor = _CURVATURE_FLOOR * (2.0 if problem.loss == "squared_hinge" else 0.25) / n
        np.maximum(col_curv, floor * design.column_sq_norms, out=col_curv)
    order = np.append(working, -1) if fit_b else working.copy()
    delta_b = np.zeros(1)
    if unit:
        # The squared loss without weights: the model's residual r = g + XΔ + Δb is all
        # the epochs read and write (XΔ + Δb = r − g at the end).
        residual = model.grad_rows.copy()
        direction, kernel, state = None, kernels.column_cd_epoch_unit, residual
    elif n >= PAIR_ROWS and not columns.dense:
        # r = g + D(XΔ + Δb) and D side by side; XΔ + Δb by one product at the end (a
        # dense column reads its rows in order: no misses for the pair to save).
        state = np.empty((n, 2))
        state[:, 0] = model.grad_rows
        state[:, 1] = model.curv
        residual = state[:, 0]  # a view: the epochs and the block shifts move it in place
        direction, kernel = None, kernels.column_cd_epoch_pair
    else:
        # The epochs read g, D and XΔ + Δb row by row in the order of each column's rows:
        # packed side by side, one cache line per row visited instead of three.
        state = np.empty((n, 3))
        state[:, 0] = model.grad_rows
        state[:, 1] = model.curv
        state[:, 2] = 0.0
        residual = None
        direction = state[:, 2]  # a view: the epochs and the block shifts move it in place
        kernel = kernels.column_cd_epoch_packed
    share = nnz_w / max(design.nnz, 1.0)
    block_of = design.block_of
    epochs, passes = 0, 1.0
    epoch = _ColumnEpoch(design, order, block_of, kernel)
    args = (state, col_curv, model.coef, delta, problem.l1, problem.l2, fit_b, delta_b)
    for epochs in range(1, _CD_MAX_COLUMNS + 1):
        passes += share
        worst = epoch.run(*args)
        if block_of is None:
            if worst <= target:
                break
        elif epochs & (epochs - 1) == 0:  # epochs 1, 2, 4, 8, ...: the block shifts, and an
            # epoch after them to measure (a coordinate's violation cannot see a shift)
            passes += block_shift(
                design, model, block_of, working, delta, direction, delta_b, residual
            )
        elif worst <= target:
            break
    if unit:
        return delta, float(delta_b[0]), residual - model.grad_rows, passes, "column_cd"
    if direction is None:
        direction = design.rows.dot(delta) + delta_b[0]
        passes += 1.0
    else:
        direction = direction.copy()
    return delta, float(delta_b[0]), direction, passes, "column_cd"


def _unit_curvature(design: Design, model: Model) -> bool:
    """Whether the model's curvature is 1 on every row (the squared loss without sample
    weights)."""
    if model.problem.loss != "squared":
        return False
    return design.unit_curvature or bool(np.all(model.curv == 1.0))


# Scatter passes (Xᵀu, XᵀDXv by rows) over at least threads.MIN_ENTRIES stored entries
# are summed over this many fixed ranges of rows, run on threads where there are: their
# rounding depends on the data's size, never on the number of cores.
_SCATTER_PARTS = 4


def _row_parts(rows) -> list[tuple[int, int]]:
    parts = _SCATTER_PARTS if rows.stored >= threads.MIN_ENTRIES else 1
    return threads.line_ranges(None if rows.dense else rows.indptr, rows.n_major, parts)


def _run_parts(rows, part, count: int) -> None:
    """part(0), …, part(count − 1): on threads where a pass of ``rows`` may use them."""
    if count > 1 and threads.usable(rows.stored) > 1:
        threads.run_all([lambda k=k: part(k) for k in range(count)])
    else:
        for k in range(count):
            part(k)


# A pure block's columns with fewer non-zeros than this run on one thread.
_THREAD_MIN_NNZ = 100_000
# The rows of the block-shift statistics are summed in this many ranges.
_SHIFT_PARTS = 4


class _ColumnEpoch:
    """A column epoch ``kernel`` (:func:`kernels.column_cd_epoch_packed`, ``_pair`` or
    ``_unit``) over ``order``, its pure blocks' columns on threads.

    The columns of a pure block touch disjoint rows, so their steps are independent: a
    thread per share of the block's columns gives the very bits of the sequential epoch
    (each column reads and writes only its own rows of the row state). The order's runs of
    consecutive columns of one pure block (the working set is sorted, and one-hot fields
    are ranges of columns) are split among the threads; everything else, the intercept
    included, runs in order on the calling thread.
    """

    def __init__(self, design: Design, order, block_of, kernel):
        self.kernel = kernel
        self.columns = design.columns
        self.n = design.rows.n_major
        self.segments = [(order, None)]
        n_threads = threads.usable(float(design.column_nnz[order[order >= 0]].sum()))
        if block_of is None or n_threads == 1:
            return
        blocks = np.where(order >= 0, block_of[np.maximum(order, 0)], -1)
        nnz = np.where(order >= 0, design.column_nnz[np.maximum(order, 0)], self.n)
        cuts = np.flatnonzero(np.diff(blocks)) + 1
        segments, serial = [], []
        for run in np.split(np.arange(len(order)), cuts):
            total = float(nnz[run].sum())
            if blocks[run[0]] < 0 or total < _THREAD_MIN_NNZ or len(run) < 2:
                serial.extend(run)
                continue
            if serial:
                segments.append((order[np.array(serial)], None))
                serial = []
            shares = np.searchsorted(
                np.cumsum(nnz[run]), total * np.arange(1, n_threads) / n_threads
            )
            parts = [part for part in np.split(order[run], shares) if len(part)]
            segments.append((None, parts))
        if serial:
            segments.append((order[np.array(serial)], None))
        self.segments = segments

    def run(self, *args) -> float:
        """One epoch; the largest violation met (as the kernel's)."""
        c = self.columns
        head = (c.data, c.indices, c.indptr, c.dense, self.n)
        worst = 0.0
        kernel = self.kernel
        for serial, parts in self.segments:
            if parts is None:
                worst = max(worst, kernel(*head, serial, *args))
                continue
            worst = max(
                worst,
                *threads.run_all([lambda part=part: kernel(*head, part, *args) for part in parts]),
            )
        return worst


def block_shift(
    design: Design, model: Model, block_of, working, delta, direction, delta_b, residual=None
) -> float:
    """The L1 model's exact minimum along the shifts of whole blocks (updates Δ, XΔ + Δb
    and Δb in place; or, ``direction`` None, the residual r = g + D(XΔ + Δb) in place of
    XΔ + Δb); returns the passes over X it took.

    On one-hot data the columns of a field sum to the ones vector: moving every non-zero
    coefficient of a field by the same c (against the intercept or another field) barely
    changes the margins, only the penalty, and coordinate descent crawls along those
    directions (50 epochs a Newton step, ~20 Newton steps at 0.8 each on a Criteo-like
    L1 problem). Here the non-zero coefficients of W in each block move by c_B, the
    intercept by c_b, and c minimizes the model exactly: a smooth k × k quadratic from one
    pass over the rows plus l1·Σ_j |θ_j + Δ_j + c_B|, convex piecewise linear in each c_B,
    by coordinate descent with exact 1-D steps over sorted kinks (the coarse level of
    :mod:`dask_scd.engines.coarse_level`, for a model with an L1 term).
    """
    problem = model.problem
    rows = design.rows
    p = rows.n_minor
    k = int(block_of.max()) + 1
    moved = model.coef[working] + delta[working]
    chosen = working[(moved != 0.0) & (block_of[working] >= 0)]
    if len(chosen) == 0:
        return 0.0
    shifted = np.full(p, -1, dtype=np.int64)
    shifted[chosen] = block_of[chosen]
    fit_b = problem.fit_intercept
    m = k + int(fit_b)
    if direction is not None:
        residual = model.grad_rows + model.curv * direction
    grad, hess, S = _shift_model(design, model.curv, shifted, chosen, k, fit_b, residual)
    values = model.coef[chosen] + delta[chosen]
    blocks = shifted[chosen]
    size = np.bincount(blocks, minlength=k)
    grad[:k] += problem.l2 * np.bincount(blocks, weights=values, minlength=k)
    hess[np.arange(k), np.arange(k)] += problem.l2 * size
    ordered = np.lexsort((-values, blocks))
    starts = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(size, out=starts[1:])
    shift = np.zeros(m)
    kernels.shift_solve(
        grad,
        hess,
        starts,
        -values[ordered],
        problem.l1,
        _SHIFT_SWEEPS,
        1e-14 * max(1.0, float(np.abs(grad).max())),
        shift,
    )
    if fit_b:
        delta_b[0] += shift[k]
    per_column = np.zeros(p)
    per_column[chosen] = shift[blocks]
    delta[chosen] += per_column[chosen]
    if S is not None:  # X·(the shift of each column) = S·c: no pass over X
        moved, passes = S @ shift, 1.0
    else:
        moved, passes = rows.dot(per_column) + (shift[k] if fit_b else 0.0), 2.0
    if direction is not None:
        direction += moved
    else:
        residual += model.curv * moved  # exact where D = 1
    return passes


def _shift_model(design: Design, curv, shifted, chosen, k: int, fit_b: bool, residual):
    """(Sᵀr/n, SᵀDS/n, S or None) of :func:`block_shift`: one pass over the rows and its
    k² products per row, or, with a constant curvature and a kept design (a path's
    points), from S itself kept dense and updated by the columns that joined or left the
    shift (:class:`_KeptShift`), which also gives the shift's X·c as S·c."""
    rows = design.rows
    n, p = rows.n_major, rows.n_minor
    m = k + int(fit_b)
    if design.unit_curvature and not rows.dense and n * m <= 2.0 * design.nnz + n:
        kept = design._kept_shift
        if kept is None or kept.fit_b != fit_b or kept.k != k:
            kept = design._kept_shift = _KeptShift(n, k, fit_b)
        kept.move_to(design.columns, shifted, chosen)
        return kept.S.T @ residual / n, kept.hess / n, kept.S
    # In _SHIFT_PARTS fixed ranges of rows, summed in order: the same bits on any number
    # of threads (run on several when there are).
    ranges = threads.line_ranges(None if rows.dense else rows.indptr, n, _SHIFT_PARTS)
    parts = [(np.empty(m), np.empty((m, m))) for _ in ranges]

    def part(r):
        lo, hi = ranges[r]
        sub = rows.lines(lo, hi)
        kernels.shift_stats(
            sub.data,
            sub.indices,
            sub.indptr,
            sub.dense,
            hi - lo,
            p,
            shifted,
            k,
            residual[lo:hi],
            curv[lo:hi],
            fit_b,
            *parts[r],
        )

    _run_parts(rows, part, len(ranges))
    grad, hess = parts[0]
    for g, h in parts[1:]:
        grad += g
        hess += h
    return grad / n, hess / n, None


class _KeptShift:
    """S (n × k, + the ones column) of the block shifts over the columns ``chosen``, and
    SᵀS, for the squared loss's constant curvature: a change ΔS of the shifted columns
    gives (S + ΔS)ᵀ(S + ΔS) = SᵀS + ΔSᵀS' + S'ᵀΔS − ΔSᵀΔS (S' = S + ΔS), products with
    the changed columns only; recomputed from S every :data:`_SHIFT_REFRESH` updates
    against the drift of the sums."""

    def __init__(self, n: int, k: int, fit_b: bool):
        self.k, self.fit_b = k, fit_b
        self.S = np.zeros((n, k + int(fit_b)))
        if fit_b:
            self.S[:, k] = 1.0
        self.hess = self.S.T @ self.S
        self.block = np.empty(0, dtype=np.int64)  # block of each shifted column, −1: none
        self.updates = 0

    def move_to(self, columns: MajorMatrix, shifted, chosen) -> None:
        block = np.full(columns.n_major, -1, dtype=np.int64)
        block[chosen] = shifted[chosen]
        if len(self.block) == 0:
            self.block = np.full(columns.n_major, -1, dtype=np.int64)
        changed = np.flatnonzero(block != self.block)
        if len(changed) == 0:
            return
        # ΔS: each changed column leaves its old block (if any) and joins its new one.
        starts, ends = columns.indptr[changed], columns.indptr[changed + 1]
        lengths = ends - starts
        entries = np.repeat(starts - np.cumsum(np.append(0, lengths[:-1])), lengths) + np.arange(
            int(lengths.sum())
        )
        rows = columns.indices[entries]
        values = columns.data[entries]
        old, new = np.repeat(self.block[changed], lengths), np.repeat(block[changed], lengths)
        left, joined = old >= 0, new >= 0
        r = np.concatenate([rows[left], rows[joined]])
        c = np.concatenate([old[left], new[joined]])
        v = np.concatenate([-values[left], values[joined]])
        step = scipy.sparse.csr_matrix((v, (r, c)), shape=self.S.shape)  # sums duplicates
        np.add.at(self.S, (r, c), v)
        self.block = block
        self.updates += 1
        if self.updates % _SHIFT_REFRESH == 0:
            self.hess = self.S.T @ self.S
            return
        cross = np.asarray(step.T @ self.S)  # ΔSᵀS'
        self.hess += cross + cross.T - np.asarray((step.T @ step).todense())
