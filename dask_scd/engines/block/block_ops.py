"""What one row chunk computes in the block-SCD engine: the engine's task functions.

Every function here is pure (inputs are never modified, results are new arrays) and
deterministic, so a task that dask re-runs after losing a worker gives the same bytes.
A *cell* (the part of X in one row chunk and one column block) arrives as the data layer
hands it (:mod:`dask_scd.data.cells`); the intercept is the block ``None`` whose cell is
a column of ones. The passes every dask engine shares (fresh margins, the certificate)
are :mod:`dask_scd.runtime.passes`.

Partial results are plain dicts of float64 arrays, summed over row chunks in row-chunk
order by the engine (never in arrival order), so the model does not depend on which
worker computed what.
"""

from __future__ import annotations

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.cells import cell_view, labels, pure_rows, row_weights
from dask_scd.engines.block.block_coarse import line_trials
from dask_scd.engines.coarse import LINE_SEARCH_STEPS
from dask_scd.kernels import block as block_kernels
from dask_scd.kernels import scalar
from dask_scd.kernels.scalar import ARMIJO as _ARMIJO
from dask_scd.runtime.passes import scattered_sum, sum_partials

INTERCEPT = -1  # the intercept's block index: a pure block whose cell is all ones


def state_after(coef, intercept: float, steps) -> dict:
    """The state {"coef", "intercept"} after an epoch's block steps: ``steps`` pairs each
    block's columns (a slice, None for the intercept) with its new θ_B; θ is copied."""
    coef = np.array(coef, dtype=np.float64)
    for block, theta in steps:
        if block is None:
            intercept = float(theta[0])
        else:
            coef[block] = theta
    return {"coef": coef, "intercept": float(intercept)}


# ------------------------------------------------------------------- labels


def label_stats(y) -> dict:
    """One row chunk's label counts: {"n", "sum", "pos"} (Σ y, and #(y > 0)); with sample
    weights v the weighted ones (Σv, Σ v·y, Σ_{y > 0} v)."""
    v = row_weights(y)
    y = labels(y)
    if v is not None:
        return {
            "n": np.array([float(v.sum())]),
            "sum": np.array([obj.vdot(v, y)]),
            "pos": np.array([float(v[y > 0].sum())]),
        }
    return {
        "n": np.array([float(len(y))]),
        "sum": np.array([y.sum()]),
        "pos": np.array([float(np.count_nonzero(y > 0))]),
    }


def intercept_at_zero(loss: str, n: float, total: float, pos: float) -> float:
    """argmin_b (1/n) Σ ℓ(y_i, b): the best intercept for θ = 0, from label counts.

    At θ = 0 every margin is b, so a ±1-labelled loss sees only the counts n₊ and n₋:
    logistic b = log(n₊/n₋), squared hinge b = (n₊ − n₋)/n, hinge b = sign(n₊ − n₋) (any
    b in [−1, 1] when n₊ = n₋; 0 is taken), squared loss b = mean(y). No label vector is
    needed, whatever n.
    """
    neg = n - pos
    if loss == "squared":
        return total / n
    if loss == "logistic":
        if pos == 0 or neg == 0:
            raise ValueError("y has a single class: a classifier needs two")
        return float(np.log(pos / neg))
    if loss == "squared_hinge":
        return (pos - neg) / n
    if loss == "hinge":
        return float(np.sign(pos - neg))
    raise ValueError(f"unknown loss {loss!r}")


def held(value):
    """(task) ``value`` itself: a client-side value kept on a worker as a task's result."""
    return value


# --------------------------------------------------------------------- margins


def apply_step(margins, cell, step: dict) -> np.ndarray:
    """ŷ + X_cell Δθ_B for the step of one block (a new array)."""
    delta = step["delta"]
    if not np.any(delta):
        return margins
    if cell is None:
        return margins + delta[0]
    rows = pure_rows(cell)
    if rows is not None:  # each margin takes one product: the bits of ŷ + X_cell Δ
        out = np.array(margins, dtype=np.float64)
        block_kernels.pure_apply(rows.column, rows.value, rows.compact(delta), out)
        return out
    return margins + cell_view(cell).matvec(delta)


# A fused pass's "last step" when there is none: (cell by rows: columns, values; Δ).
NO_STEP = (np.zeros(0, dtype=np.int32), np.zeros(0), np.zeros(0))


def apply_then_stats(
    margins, cell, next_cell, y, step: dict, loss: str, gram: bool = False
) -> tuple:
    """:func:`apply_step` of one block, then :func:`block_stats` of the next on the new
    margins: one task where two would follow each other. Returns (margins, stats).

    Where the next block is pure (or the intercept) and the losses unweighted, the two
    are one pass over the rows (:func:`~dask_scd.kernels.block.pure_stats`): the last
    step is added to each margin as it is read (by rows too where its cell is pure)."""
    fused = not gram and row_weights(y) is None
    delta = step["delta"]
    # The last block's cell is read before the next one's: out of core a row chunk keeps
    # its last read, which the next block's line search and apply read again (read in
    # the other order, each cell was read three times an epoch).
    prev = pure_rows(cell) if fused and cell is not None and np.any(delta) else None
    rows = None if not fused else (INTERCEPT_ROWS if next_cell is None else pure_rows(next_cell))
    if rows is None:
        margins = apply_step(margins, cell, step)
        return margins, block_stats(next_cell, y, margins, loss, gram)
    shift, last = 0.0, NO_STEP
    if np.any(delta):
        if cell is None:
            shift = float(delta[0])
        elif prev is None:
            margins = apply_step(margins, cell, step)
        else:
            last = (prev.column, prev.value, prev.compact(delta))
    out = np.array(margins, dtype=np.float64)
    return out, stats_by_rows(rows, labels(y), out, loss, last, shift)


INTERCEPT_ROWS = object()  # the intercept's "cell": every row, by rows


def stats_by_rows(rows, y, margins, loss: str, last=NO_STEP, shift: float = 0.0):
    """:func:`block_stats` of a pure block (``rows``: its cell by rows, a
    :class:`~dask_scd.data.cells.PureRows`, or :data:`INTERCEPT_ROWS`) on unweighted
    losses, in one pass over the rows that first adds ``last`` (a pure cell by rows and
    its step) and ``shift`` (the intercept's) to ``margins``, in place."""
    code = obj.LOSS_CODES[loss]
    if rows is INTERCEPT_ROWS:
        if shift != 0.0:  # (the intercept does not follow itself)
            margins += shift
        g, h = block_kernels.shift_stats(*last, y, margins, code)
        stats = {"g": np.array([g]), "h": np.array([h])}
        if loss == "logistic":
            stats["cube"] = np.array([float(len(margins))])
        return stats
    g, h = np.empty(rows.width), np.empty(rows.width)
    block_kernels.pure_stats(*last, shift, rows.column, rows.value, y, margins, code, g, h)
    stats = {"g": g, "h": h}
    if loss == "logistic":
        stats["cube"] = rows.cube
    if rows.stored is not None:  # sums at the cell's stored columns only (see _summed)
        stats.update(cols=rows.stored, width=rows.n_columns, sparse=tuple(k for k in stats))
    return stats


# ------------------------------------------------------------- one block iteration


def block_stats(cell, y, margins, loss: str, gram: bool = False) -> dict:
    """Partial sums of g = Xᵀℓ'(ŷ) and h = (X∘X)ᵀℓ''(ŷ) over one row chunk.

    With ``gram`` also the block's weighted Gram matrix X_Bᵀ diag(ℓ''(ŷ)) X_B, for an exact
    Newton step on an impure block. A pure cell with unweighted losses is read by rows
    (:func:`stats_by_rows`), as :func:`apply_then_stats` reads it.
    """
    v = row_weights(y)
    if not gram and v is None and cell is not None:
        rows = pure_rows(cell)
        if rows is not None:
            return stats_by_rows(rows, labels(y), np.array(margins, dtype=np.float64), loss)
    y = labels(y)
    d1, d2 = block_kernels.derivatives(obj.LOSS_CODES[loss], y, margins)
    if v is not None:  # the weighted losses v_i·ℓ_i
        d1, d2 = d1 * v, d2 * v
    view = cell_view(cell)
    # The cubic bound's Σ|x|³ counts every example once: not with weights.
    cube = loss == "logistic" and v is None
    if view is None:  # the intercept: a column of ones, Σ|x|³ = the rows
        stats = {"g": np.array([d1.sum()]), "h": np.array([d2.sum()])}
        if cube:
            stats["cube"] = np.array([float(len(margins))])
        return stats
    # Under the squared loss ℓ'' = 1: h is the same in every epoch (and the same bits).
    constant_h = loss == "squared" and v is None
    stored = None if gram else getattr(view, "stored_columns", None)
    if stored is not None:  # sums at the cell's stored columns only (see _summed)
        h = view.squared_sums()[stored] if constant_h else view.stored_sums(d2, squared=True)
        stats = {"cols": stored, "g": view.stored_sums(d1), "h": h}
        if cube:
            stats["cube"] = view.cube_sums()[stored]
        # What passes.sum_partials needs to add them in a tree (see _BlockSCD._tree).
        stats.update(width=view.n_columns, sparse=tuple(k for k in stats if k != "cols"))
        return stats
    h = view.squared_sums() if constant_h else view.rmatvec(d2, squared=True)
    stats = {"g": view.rmatvec(d1), "h": h}
    if gram:
        stats["gram"] = view.gram(d2)
    elif cube:
        stats["cube"] = view.cube_sums()
    return stats


def _summed(partials, key: str, width: int) -> np.ndarray:
    """Σ of the row chunks' ``key`` in row-chunk order. A partial with "cols" holds its
    values at those columns only (:func:`passes.scattered_sum`)."""
    if not any("cols" in p for p in partials):
        return sum_partials(*[p[key] for p in partials])
    return scattered_sum(partials, key, width)


def block_direction(
    problem: obj.Problem,
    n_samples: int,
    theta,
    intercept_block: bool,
    *partials,
    provable: bool = False,
    box=None,
) -> dict:
    """Sum the partial statistics (in order) and take the prox-Newton coordinate step.

    θ*_j = S(h_j θ_j − g_j, αρ)/(h_j + α(1−ρ)) (the SCD paper's θ* = T/(T'+λ)); for the
    intercept, b* = b − g/h. Returns the direction and the model decrease of each
    coordinate that the Armijo test compares with.

    ``provable`` (a pure block under the logistic loss): the step is final, each
    coordinate's Newton step scaled by the largest 4⁻ᵏ for which the cubic bound proves
    the Armijo decrease (:func:`provable_steps`), so no line search follows.

    ``box``: the block's :class:`~dask_scd.objectives.Bounds` (None: none); the step is then
    the clip of θ* into it, the exact minimizer of each coordinate's model there, and the
    direction carries the box for the steps that follow.
    """
    width = len(theta)
    g = _summed(partials, "g", width) / n_samples
    h = _summed(partials, "h", width) / n_samples
    l1, l2 = (0.0, 0.0) if intercept_block else (problem.l1, problem.l2)
    if "gram" in partials[0]:
        hessian = sum_partials(*[p["gram"] for p in partials]) / n_samples
        start = np.asarray(theta, dtype=np.float64)
        if box is None:
            target = block_kernels.block_newton_qp(hessian, g, start, l1, l2, 1000, 1e-15)
        else:
            target = block_kernels.block_box_qp(
                hessian, g, start, l1, l2, 1000, 1e-15, box.lower, box.upper
            )
    else:
        denom = h + l2
        z = h * theta - g
        with np.errstate(divide="ignore", invalid="ignore"):
            target = np.where(
                denom > 0, np.sign(z) * np.maximum(np.abs(z) - l1, 0.0) / denom, theta
            )
        if box is not None:
            target = box.clip(target)
    direction = target - theta
    model = g * direction + _penalty(l1, l2, target) - _penalty(l1, l2, theta)
    # "theta"/"delta" are the full step, exact on a pure block under squared loss;
    # otherwise block_choose scales it.
    out = {
        "start": theta,
        "direction": direction,
        "model": model,
        "l1": l1,
        "l2": l2,
        "theta": target,
        "delta": direction,
    }
    if box is not None:
        out.update(lower=box.lower, upper=box.upper)
    cube = _summed(partials, "cube", width) / n_samples if "cube" in partials[0] else None
    if provable:
        if cube is None:  # no bound: no step this epoch, trials the next
            zero = np.zeros(width)
            return {
                **out,
                "theta": np.array(theta, dtype=np.float64),
                "delta": zero,
                "direction": zero,
                "unsure": int(np.count_nonzero(direction)),
            }
        return provable_steps(out, g, h, cube)
    if cube is not None:
        out["proven"] = _cubic_accepts(model, h, direction, cube)
    return out


def block_direction_from(
    problem: obj.Problem, n_samples: int, start: tuple, block, provable: bool, *partials
) -> dict:
    """:func:`block_direction` with θ_B read from the epoch's start: ``start`` is (θ in
    grid order, b), sent to each worker once per epoch rather than a block's slice of it
    inside every task; ``block`` the block's column slice, or None for the intercept."""
    coef, intercept = start
    theta = np.array([intercept]) if block is None else coef[block].copy()
    box = None if block is None or problem.bounds is None else problem.bounds.take(block)
    return block_direction(
        problem, n_samples, theta, block is None, *partials, provable=provable, box=box
    )


# Step sizes a provable step may take: 1, 1/4, ..., 4⁻⁷ (the bound's cubic term shrinks
# as t³ against the model's t, so a small enough one always proves).
PROVABLE_STEPS = 0.25 ** np.arange(8)


def provable_steps(out: dict, g, h, cube) -> dict:
    """The final step of a pure logistic block without a line search.

    Its coordinates touch disjoint examples, so the block's objective change is the sum
    of theirs, each bounded by Taylor with remainder (:func:`scalar.logistic_taylor_bound`,
    exact in g and h). Each coordinate takes the largest t in :data:`PROVABLE_STEPS`
    whose bound lies below the Armijo line at tΔ: a certain decrease, the same test the
    trials would pass, from the statistics the direction already summed. ``unsure``
    counts the coordinates cut below the full step (their trials might have accepted
    more): the engine runs the line search on that block next epoch.
    """
    theta, d, l1, l2 = out["start"], out["direction"], out["l1"], out["l2"]
    chosen = np.zeros(len(d))
    left = d != 0.0
    for t in PROVABLE_STEPS:
        index = np.flatnonzero(left)
        if not len(index):
            break
        step = t * d[index]
        model = (
            g[index] * step + _penalty(l1, l2, theta[index] + step) - _penalty(l1, l2, theta[index])
        )
        bound = scalar.logistic_taylor_bound(model, h[index], step, cube[index])
        ok = (bound <= _ARMIJO * model) & (model < 0.0)
        chosen[index[ok]] = t
        left[index[ok]] = False
    unsure = int(np.count_nonzero((chosen < 1.0) & (d != 0.0)))
    return {**out, **landed(out, theta, chosen * d), "unsure": unsure}


def _cubic_accepts(model, h, delta, cube_mean) -> np.ndarray:
    """Per coordinate of a pure block: does the Armijo test surely pass at the full step
    (the bound of :func:`provable_steps`, the in-memory engine's test)? Those coordinates
    are left out of the trials."""
    bound = scalar.logistic_taylor_bound(model, h, delta, cube_mean)
    return (bound <= _ARMIJO * model) & (delta != 0.0)


def block_trials(cell, y, margins, direction: dict, problem: obj.Problem, pure: bool) -> dict:
    """Partial objective changes along the direction, for the line search.

    Pure block: per coordinate and step size (its coordinates touch disjoint examples).
    Impure block: for the whole block, per step size; under squared loss the exact
    quadratic instead, from ⟨u, ŷ − y⟩ and ‖u‖² with u = X_cell d.
    """
    d = direction["direction"]
    if pure and "proven" in direction:  # coordinates proven to pass at the full step: not tried
        d = np.where(direction["proven"], 0.0, d)
        if not np.any(d):
            empty = np.zeros((len(LINE_SEARCH_STEPS), 0))
            return _trials_at(np.zeros(0, dtype=np.int64), len(d), empty)
    v = row_weights(y)
    y = labels(y)
    rows = pure_rows(cell) if pure and v is None else None
    if rows is not None:  # read by rows, as its statistics were
        trials = block_kernels.pure_trials(
            rows.column,
            rows.value,
            y,
            margins,
            rows.compact(d),
            LINE_SEARCH_STEPS,
            block_kernels.are_quarters(LINE_SEARCH_STEPS),
            problem.loss_code,
            rows.width,
        )
        return _trials_at(rows.stored, len(d), trials)
    view = cell_view(cell)
    stored = getattr(view, "stored_columns", None) if pure else None
    if stored is not None:
        trials = view.stored_trials(problem.loss_code, y, margins, d[stored], LINE_SEARCH_STEPS, v)
        return _trials_at(stored, len(d), trials)
    if view is None or not pure:
        u = np.full(len(margins), d[0]) if view is None else view.matvec(d)
        if problem.loss == "squared":
            vu = u if v is None else v * u
            return {
                "linear": np.array([obj.vdot(vu, margins - y)]),
                "quadratic": np.array([obj.vdot(vu, u)]),
            }
        return line_trials(y, margins, u, problem.loss_code, v)
    return {"trials": view.trials(problem.loss_code, y, margins, d, LINE_SEARCH_STEPS, v)}


def _trials_at(cols, width: int, trials) -> dict:
    """Trials at the columns ``cols`` of a block of ``width`` only (summed by
    :func:`passes.scattered_sum`), or at all of them where ``cols`` is None."""
    if cols is None:
        return {"trials": trials}
    return {"cols": cols, "width": width, "sparse": ("trials",), "trials": trials}


def block_choose(direction: dict, n_samples: int, slack: float, *partials) -> dict:
    """Pick the step sizes from the summed trials (Armijo) or solve the squared-loss line.

    ``slack`` is the rounding noise of an objective change (≈ 1e-13·P): a step whose
    change is below it is accepted rather than stalling at the precision floor.
    """
    theta, d = direction["start"], direction["direction"]
    l1, l2 = direction["l1"], direction["l2"]
    if "quadratic" in partials[0]:
        linear = sum_partials(*[p["linear"] for p in partials])[0] / n_samples
        quadratic = sum_partials(*[p["quadratic"] for p in partials])[0] / n_samples
        step = _exact_line(theta, d, linear, quadratic, l1, l2, _longest(direction))
        return landed(direction, theta, step * d)
    trials = _summed(partials, "trials", len(d)) / n_samples  # (K,) or (K, |B|)
    if trials.ndim == 2:  # a pure block: per coordinate
        return _choose_per_coordinate(direction, trials, slack)
    steps = LINE_SEARCH_STEPS  # the whole block, one step size
    change = (
        trials
        + _penalty(l1, l2, theta + steps[:, None] * d).sum(axis=1)
        - _penalty(l1, l2, theta).sum()
    )
    chosen = _largest_accepted(change, steps, direction["model"].sum(), slack)
    return landed(direction, theta, chosen * d)


def _largest_accepted(change, steps, model, slack: float):
    """Per column of ``change`` (a row per step size of :data:`LINE_SEARCH_STEPS`), the
    largest step size whose change passes Armijo against ``model``, or 0."""
    accept = change <= _ARMIJO * steps * model + slack
    first = np.argmax(accept, axis=0)
    return np.where(accept.any(axis=0), LINE_SEARCH_STEPS[first], 0.0)


def _choose_per_coordinate(direction: dict, trials, slack: float) -> dict:
    """The Armijo choice of a pure block, coordinate by coordinate, on the coordinates
    that move and were not proven by the cubic bound: a coordinate with Δ = 0 keeps θ
    whatever its step size, a proven one takes the full step."""
    theta, d, model = direction["start"], direction["direction"], direction["model"]
    l1, l2 = direction["l1"], direction["l2"]
    tried = d != 0.0
    if "proven" in direction:
        tried &= ~direction["proven"]
    unsure = int(np.count_nonzero(tried))
    chosen = np.ones(len(d))
    index = np.flatnonzero(tried)
    if len(index):
        t, dj, mj = theta[index], d[index], model[index]
        steps = LINE_SEARCH_STEPS[:, None]
        change = trials[:, index] + _penalty(l1, l2, t + steps * dj) - _penalty(l1, l2, t)
        chosen[index] = _largest_accepted(change, steps, mj, slack)
    return {**landed(direction, theta, chosen * d), "unsure": unsure}


def landed(direction: dict, theta, delta) -> dict:
    """{"theta": θ + Δ, "delta": Δ}; with the direction's box, θ + Δ clipped into it (it
    may round past the bound it reaches) and Δ what moved."""
    if "lower" not in direction:
        return {"theta": theta + delta, "delta": delta}
    moved = np.clip(theta + delta, direction["lower"], direction["upper"])
    return {"theta": moved, "delta": moved - theta}


def _longest(direction: dict) -> float:
    """The largest a with θ + a·d inside the direction's box (inf without one; at least 1:
    the full step lands inside)."""
    if "lower" not in direction:
        return np.inf
    theta, d = direction["start"], direction["direction"]
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.where(
            d > 0,
            (direction["upper"] - theta) / d,
            np.where(d < 0, (direction["lower"] - theta) / d, np.inf),
        )
    return max(1.0, float(room.min(initial=np.inf)))


def _exact_line(theta, d, linear, quadratic, l1, l2, longest=np.inf) -> float:
    """argmin_a a·linear + a²/2·quadratic + Σ_j pen(θ_j + a d_j) for 0 ≤ a ≤ ``longest``
    (convex, 1-D)."""
    from scipy.optimize import minimize_scalar

    f = lambda a: a * linear + 0.5 * a * a * quadratic + _penalty(l1, l2, theta + a * d).sum()  # noqa: E731
    if l1 == 0.0:
        curvature = quadratic + l2 * obj.vdot(d, d)
        slope = linear + l2 * obj.vdot(theta, d)
        return min(max(0.0, -slope / curvature), longest) if curvature > 0 else 0.0
    result = minimize_scalar(
        f, bounds=(0.0, min(2.0, longest)), method="bounded", options={"xatol": 1e-12}
    )
    return float(result.x) if f(result.x) < f(0.0) else 0.0


_penalty = scalar.penalty.py_func  # elementwise on arrays too
