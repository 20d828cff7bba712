"""The inner solver of an L1 / elastic-net proximal Newton model: coordinate descent.

Coordinate descent on the quadratic model of :mod:`dask_scd.engines.newton.quadratic`
over a working set (the non-zero coefficients and the worst violators, at most as many
again: glmnet's IRLS-CD with celer's and skglm's growing working sets), on the weighted
Gram of the working set when it is small, else over its columns with XΔ kept as a vector
(newGLMNET), their pure blocks' columns on threads (:class:`_ColumnEpoch`). On one-hot
data the epochs alternate with exact steps along the shifts of whole blocks
(:func:`block_shift`). On the Gram, the epochs alternate with exact Newton steps on the
orthant of the model's current point (:func:`_orthant_newton`): once the signs have
settled, the model is solved exactly, whatever its conditioning.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse

from dask_scd.engines import cholesky
from dask_scd.engines.newton.design import GRAM_MAX, Design, run_parts
from dask_scd.engines.newton.quadratic import Model
from dask_scd.kernels import newton as kernels
from dask_scd.kernels import newton_shift, threads
from dask_scd.kernels.layout import MajorMatrix

# Inner coordinate-descent epochs: expected (cost model) and at most.
_CD_EXPECTED = 20
_CD_MAX_GRAM = 5000
# An orthant Newton step needs a support Hessian whose Cholesky pivots stay above this
# fraction of the largest: below it the support's columns are collinear to rounding.
_ORTHANT_PIVOT = 1e-8
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
# A pure block's columns with fewer non-zeros than this run on one thread.
_THREAD_MIN_NNZ = 100_000
# The rows of the block-shift statistics are summed in this many ranges.
_SHIFT_PARTS = 4


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
    # Disjoint sets of distinct indices (the support's excess is −inf): their union is
    # their sorted concatenation.
    return np.sort(np.concatenate((support, violators)))


@dataclass
class InnerMemory:
    """What the L1 models' solver carries from one outer step to the next."""

    # sign(θ) at the last outer step: the same signs now say the support has settled.
    signs: np.ndarray | None = None
    # Column epochs the last model over columns took, or would have taken to reach its
    # target at the rate it ran at (its epochs ran out first): the column solver's cost.
    column_epochs: float = _CD_EXPECTED

    def settled(self, coef) -> bool:
        """Whether θ has the signs of the last outer step (and remember them)."""
        signs = np.sign(coef)
        same = self.signs is not None and np.array_equal(signs, self.signs)
        self.signs = signs
        return same


def l1_direction(design: Design, model: Model, working, memory: InnerMemory | None = None):
    """Coordinate descent on the model restricted to W (Δ = 0 outside W): on W's weighted
    Gram when forming it costs less than the column epochs it saves, else over W's
    columns. Returns (Δ, Δb, XΔ + Δb, passes over X, the solver's name).

    The column epochs a model needs are :attr:`InnerMemory.column_epochs`, measured on
    the last one: an ill-conditioned model that the column epochs cannot solve within
    their limit moves to its Gram, where the Newton steps on its orthant solve it."""
    memory = memory or InnerMemory()
    settled = memory.settled(model.coef)
    n = design.rows.n_major
    k = len(working) + int(model.problem.fit_intercept)
    nnz_w = float(design.column_nnz[working].sum())
    # Σ_i nnz_i(W)², scaled from the whole matrix by the share of W's non-zeros.
    form = design.gram_flops * (nnz_w / max(design.nnz, 1.0)) ** 2
    if k <= GRAM_MAX and form + _CD_EXPECTED * k * k <= memory.column_epochs * (nnz_w + n):
        return _gram_direction(design, model, working, settled)
    share = nnz_w / max(design.nnz, 1.0)
    return _column_direction(design, model, working, share, memory)


def _gram_direction(design: Design, model: Model, working, settled: bool = False):
    """The model on the weighted Gram of W (+ the intercept's row and column), by
    :func:`_solve_gram_model`."""
    problem = model.problem
    fit_b = problem.fit_intercept
    target = min(model.forcing * model.violation(), model.dual_target)
    delta = np.zeros(design.rows.n_minor)
    hessian = design.gram(working, model.curv, fit_b)
    q = model.grad[working]
    coef_w = model.coef[working]
    if fit_b:
        q = np.append(q, model.grad_b)
        coef_w = np.append(coef_w, 0.0)
    delta_w = np.zeros(len(working) + int(fit_b))
    _solve_gram_model(hessian, q, coef_w, delta_w, problem, target, settled)
    delta[working] = delta_w[: len(working)]
    delta_b = float(delta_w[-1]) if fit_b else 0.0
    direction = design.rows.dot(delta) + delta_b
    return delta, delta_b, direction, 2.0, "gram_cd"


def _solve_gram_model(hessian, q, coef_w, delta_w, problem, target, settled) -> int:
    """Coordinate descent on the Gram model q(Δ) = cᵀΔ + ½ΔᵀHΔ + penalty, in rounds that
    each start with a Newton step on the orthant of the current point
    (:func:`_orthant_newton`); ``q`` holds c + HΔ, ``delta_w`` Δ, both updated in place.
    Returns the epochs run.

    Coordinate descent alone converges linearly, at a rate set by the conditioning of H
    (binary features and no L2 term: thousands of epochs), and an outer step left short of
    the model's minimizer converges linearly too. Where the model's signs are known its
    penalty is linear and the Newton step on the non-zero coordinates is its exact
    minimizer; the epochs find the signs and check them (a step whose signs hold leaves
    every violation at rounding level). An epoch costs k² flops, the step's Cholesky
    about k³/3: the rounds run k/3 epochs (the step never costs more than the epochs
    before it), and the first starts with the step when the signs of θ have settled.
    They stop at ``target``, at ``_CD_MAX_GRAM`` epochs, or after two rounds without a
    smaller violation (the rounding of q).
    """
    fit_b = problem.fit_intercept
    per_round = max(1, len(q) // 3)
    epochs, best, stalls = 0, np.inf, 0
    newton, skip, wait = settled, 0, 1
    while epochs < _CD_MAX_GRAM:
        moved = None
        if newton and skip == 0:
            moved = _orthant_newton(hessian, q, coef_w, delta_w, problem.l1, problem.l2, fit_b)
            # a singular support (collinear columns): the next tries after 1, 2, 4, ...
            # rounds of epochs alone, so failed factors cost little
            skip, wait = (wait, 2 * wait) if moved is False else (0, 1)
        elif skip > 0:
            skip -= 1
        run, worst = kernels.gram_cd(
            hessian,
            q,
            coef_w,
            delta_w,
            problem.l1,
            problem.l2,
            fit_b,
            target,
            min(per_round, _CD_MAX_GRAM - epochs),
        )
        epochs += run
        if worst <= target:
            break
        # Two rounds of Newton steps and epochs without a smaller violation: the rounding
        # of q (epochs alone, whose largest violation is not monotone, run on).
        stalls = stalls + 1 if moved is True and worst >= best else 0
        if stalls >= 2:
            break
        best, newton = min(best, worst), True
    return epochs


def _orthant_newton(hessian, q, coef_w, delta_w, l1, l2, fit_b) -> bool | None:
    """The Gram model's minimizer on the orthant of x = θ + Δ, moved toward up to its
    first sign change: the coordinates at zero stay there, the others (and the
    intercept, the last coordinate with ``fit_b``) solve

        (H_SS + l2·I) s = −(q_S + l2·x_S + l1·sign(x_S)),

    where the penalty is linear. Along s the model decreases up to the minimizer (s is
    its Newton step) and the orthant ends at the first x_j + t·s_j = 0, which is set to
    zero exactly. Updates Δ and q = c + HΔ in place; returns True when it moved, False
    where the support's Hessian is singular or nearly so (no step), None with no
    support."""
    x = coef_w + delta_w
    free = x != 0.0
    penalized = np.ones(len(q), dtype=bool)
    if fit_b:
        free[-1], penalized[-1] = True, False
    index = np.flatnonzero(free)
    if len(index) == 0:
        return None
    pen = penalized[index]
    sign = np.where(pen, np.sign(x[index]), 0.0)
    system = hessian[np.ix_(index, index)]
    system[np.diag_indices_from(system)] += l2 * pen
    try:
        factor = cholesky.factor(system)
    except np.linalg.LinAlgError:
        return False  # singular on the support: coordinate descent alone
    pivots = np.abs(np.diag(factor[0]))
    if not pivots.min() > _ORTHANT_PIVOT * pivots.max():
        # Collinear columns in the support (one-hot fields without an intercept sum to
        # the same vector): the step would run along the null space, cut at once by a
        # sign change. Coordinate descent alone there.
        return False
    step = cholesky.solve(factor, -(q[index] + l2 * pen * x[index] + l1 * sign))
    if not np.all(np.isfinite(step)):
        return False
    # t_j = −x_j / s_j where s moves x_j through zero
    crossing = pen & (x[index] * step < 0.0)
    t, hit = 1.0, -1
    if np.any(crossing):
        ratios = -x[index][crossing] / step[crossing]
        first = int(np.argmin(ratios))
        if ratios[first] < 1.0:
            t, hit = float(ratios[first]), int(index[crossing][first])
    moved = delta_w.copy()
    delta_w[index] += t * step
    if hit >= 0:
        delta_w[hit] = -coef_w[hit]
    moved = delta_w[index] - moved[index]
    q += hessian[:, index] @ moved
    return True


def _column_direction(design: Design, model: Model, working, share: float, memory=None):
    """Column epochs over W (``share``: W's part of X's non-zeros), alternating with the
    block shifts (:func:`block_shift`) on epochs 1, 2, 4, 8, ... when X has pure blocks."""
    problem = model.problem
    fit_b = problem.fit_intercept
    # A column epoch costs a pass over X_W: solved as far as the forcing term asks (the
    # superlinear rate), and no further than the model's dual point needs to certify.
    target = model.forcing * model.violation()
    if np.isfinite(model.dual_target):
        target = max(target, model.dual_target)
    unit = _unit_curvature(design, model)
    col_curv, passes = _column_curvatures(design, model, unit, working, share)
    state, residual, direction, kernel = _row_state(design, model, unit)
    order = np.append(working, -1) if fit_b else working.copy()
    delta = np.zeros(design.rows.n_minor)
    delta_b = np.zeros(1)
    block_of = design.block_of
    epochs = 0
    epoch = _ColumnEpoch(design, order, block_of, kernel)
    args = (state, col_curv, model.coef, delta, problem.l1, problem.l2, fit_b, delta_b)
    first = None
    for epochs in range(1, _CD_MAX_COLUMNS + 1):
        passes += share
        worst = epoch.run(*args)
        first = worst if first is None else first
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
    if memory is not None:
        memory.column_epochs = _epochs_needed(epochs, first, worst, target)
    if unit:
        return delta, float(delta_b[0]), residual - model.grad_rows, passes, "column_cd"
    if direction is None:
        direction = design.rows.dot(delta) + delta_b[0]
        passes += 1.0
    else:
        direction = direction.copy()
    return delta, float(delta_b[0]), direction, passes, "column_cd"


def _epochs_needed(epochs: int, first: float, last: float, target: float) -> float:
    """Epochs to reach ``target``: ``epochs`` if the last one's violation ``last`` did,
    else those to come at the rate from ``first`` (the first epoch's) to ``last``."""
    if last <= target or epochs < 2:
        return float(epochs)
    if not 0.0 < last < first:
        return np.inf
    rate = np.log(last / first) / (epochs - 1)
    return epochs + np.log(max(target, 1e-300) / last) / rate


def _column_curvatures(design: Design, model: Model, unit: bool, working, share: float):
    """(Σ_i d_i x_ij² / n of the columns ``working`` (of every column: the squared loss),
    kept off zero, and the passes over X they are counted as); the column epochs read no
    other column's. ``share``: W's part of X's non-zeros."""
    n = design.rows.n_major
    if unit:
        return design.column_sq_norms / n, 1.0  # Σ_i x_ij² / n, the same at every step
    columns = design.columns
    if 2 * len(working) < columns.n_major:  # the working set's columns alone
        col_curv = columns.dot_lines(working, model.curv, squared=True) / n
        passes = share
    else:  # a threaded pass
        col_curv = columns.dot(model.curv, squared=True) / n
        passes = 1.0
    # A column whose rows all sit far out on the logistic's tail has ~no curvature,
    # and its model step ~(q ± l1)/0 (a 2e18 step stalled a weak-L1 fit at gap 0.86):
    # the curvature is kept above a millionth of its largest value, d = 1/4 (2 for the
    # squared hinge), which only such columns meet.
    floor = _CURVATURE_FLOOR * (2.0 if model.problem.loss == "squared_hinge" else 0.25) / n
    np.maximum(col_curv, floor * design.column_sq_norms, out=col_curv)
    return col_curv, passes


def _row_state(design: Design, model: Model, unit: bool):
    """(the rows' state the column epochs read and write, its residual r or None, its
    XΔ + Δb or None, the epoch kernel)."""
    n = design.rows.n_major
    if unit:
        # The squared loss without weights: the model's residual r = g + XΔ + Δb is all
        # the epochs read and write (XΔ + Δb = r − g at the end).
        residual = model.grad_rows.copy()
        return residual, residual, None, kernels.column_cd_epoch_unit
    if design.columns.dense:
        # r and D each contiguous, read in order along every dense column; XΔ + Δb by one
        # product at the end.
        rows = np.stack((model.grad_rows, model.curv))
        return rows, rows[0], None, kernels.column_cd_epoch_dense  # rows[0]: a view
    if n >= PAIR_ROWS:
        # r = g + D(XΔ + Δb) and D side by side; XΔ + Δb by one product at the end.
        state = np.column_stack((model.grad_rows, model.curv))
        # state[:, 0] is a view: the epochs and the block shifts move it in place
        return state, state[:, 0], None, kernels.column_cd_epoch_pair
    # The epochs read g, D and XΔ + Δb row by row in the order of each column's rows:
    # packed side by side, one cache line per row visited instead of three.
    state = np.column_stack((model.grad_rows, model.curv, np.zeros(n)))
    # state[:, 2] is a view: the epochs and the block shifts move it in place
    return state, None, state[:, 2], kernels.column_cd_epoch_packed


def _unit_curvature(design: Design, model: Model) -> bool:
    """Whether the model's curvature is 1 on every row (the squared loss without sample
    weights)."""
    if model.problem.loss != "squared":
        return False
    return design.unit_curvature or bool(np.all(model.curv == 1.0))


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
    newton_shift.shift_solve(
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
        newton_shift.shift_stats(
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

    grad, hess = run_parts(rows, part, parts)
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
