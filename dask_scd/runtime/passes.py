"""The passes every dask engine makes over a row chunk, and the ordered sums of their parts.

Fresh margins ŷ = Xθ + b from the state, and one row chunk's share of the duality-gap
certificate; their parts are plain dicts of float64 arrays that :func:`sum_partials` adds
key by key in row-chunk order (never in arrival order), in a tree fixed by their number
(:func:`tree_sum`), so the model does not depend on which worker computed what. Every function is pure and deterministic: a task dask re-runs
after losing a worker gives the same bytes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.cache import CACHE
from dask_scd.data.cells import cell_view, labels, pure_rows, row_weights
from dask_scd.kernels import block as block_kernels
from dask_scd.kernels.scalar import DOUBLINGS, TRIAL_STEPS, extrapolates


def refresh_margins(cells: list, n_rows: int, state: dict, offsets) -> np.ndarray:
    """ŷ = Σ_b X_cell(b) θ_b + b for one row chunk, exactly (no accumulated rounding).

    ``state`` is {"coef", "intercept"} with coef in grid column order; block b is
    ``coef[offsets[b]:offsets[b + 1]]``.
    """
    return cells_matvec(cells, state["coef"], offsets, np.full(n_rows, float(state["intercept"])))


def certificate_pass(
    cells: list, n_rows: int, y, state: dict, offsets, problem: obj.Problem, compact: bool = False
) -> tuple:
    """:func:`refresh_margins` then :func:`certificate_stats` of one row chunk, in one
    task: (margins, stats), the same bits as the two apart. With ``compact`` (the block
    engine's) the pure cells are also read by rows (:func:`~dask_scd.data.cells.pure_rows`).

    Out of core, each cell read for the margins is kept for the statistics while the
    process has room for it (:meth:`CellCache.has_room`), so the certificate reads a cell
    once instead of twice; in core the cells come from the cache either way.
    """
    kept = []
    margins = cells_matvec(
        cells, state["coef"], offsets, np.full(n_rows, float(state["intercept"])), kept, compact
    )
    return margins, certificate_stats(kept, y, margins, problem, compact)


def cells_matvec(
    cells: list, coef, offsets, out: np.ndarray, kept: list | None = None, by_rows: bool = False
):
    """out += Σ_b X_cell(b) θ_b over a row chunk's cells (a block of zeros is skipped);
    returns ``out``.

    ``kept``: a list that receives every cell, the ones read here as their views (a pure
    cell read by rows: its :class:`~dask_scd.data.cells.PureRows`) while the process has
    room for them (:meth:`CellCache.has_room`: a row chunk's cells up to an eighth of the
    pause threshold in any case), for a second pass.
    ``by_rows``: pure cells are read by rows (each margin takes one product: the same
    bits).
    """
    held = 0
    for b, cell in enumerate(cells):
        theta = coef[offsets[b] : offsets[b + 1]]
        if np.any(theta):
            read = pure_rows(cell) if by_rows else None
            if read is not None:
                block_kernels.pure_apply(read.column, read.value, read.compact(theta), out)
            else:
                read = cell_view(cell)
                out += read.matvec(theta)
            size = int(getattr(read, "nbytes", 0))
            if kept is not None and CACHE.has_room(held + size):
                cell, held = read, held + size
        if kept is not None:
            kept.append(cell)
    return out


# ------------------------------------------------------------------ certificate


def certificate_stats(cells: list, y, margins, problem: obj.Problem, compact: bool = False) -> dict:
    """One row chunk's share of the certificate, before the dual point's projection.

    The projection scales the positive and negative parts of a = −ℓ'(ŷ) by factors known
    only after the reduction, so the linear terms are kept apart by sign:
    Xᵀa = s₊ Xᵀa₊ + s₋ Xᵀa₋ (all blocks concatenated in grid column order). The cells are
    read one at a time, so at most one of them is held beyond the cache.

    ``compact``: where cells store few of their columns (``CellView.stored_columns``),
    Xᵀa₊ and Xᵀa₋ are sent at the stored columns alone, "cols" giving their indices in
    grid column order and "width" the number of columns; :func:`sum_partials` adds them
    in place (the same sums).
    """
    v, y, pos, neg = signed_dual_point(problem, y, margins)
    xt_pos, xt_neg, columns = [], [], []
    offset, stored_any = 0, False
    for cell in cells:
        rows = pure_rows(cell) if compact else None
        if rows is not None:
            x_pos, x_neg = block_kernels.pure_rmatvec_pair(
                rows.column, rows.value, pos, neg, rows.width
            )
            if rows.stored is None:
                columns.append(offset + np.arange(rows.n_columns))
            else:
                columns.append(offset + rows.stored)
                stored_any = True
            offset += rows.n_columns
            xt_pos.append(x_pos)
            xt_neg.append(x_neg)
            continue
        view = cell_view(cell)
        stored = getattr(view, "stored_columns", None) if compact else None
        if stored is not None:
            x_pos, x_neg = view.stored_sums_pair(pos, neg)
            columns.append(offset + stored)
            stored_any = True
        else:
            if getattr(view, "matrix", None) is not None and view.by_columns:
                # CSC on the host: both products in one read of the cell.
                x_pos, x_neg = view.matrix.dot_pair(pos, neg)
            else:
                x_pos, x_neg = view.rmatvec(pos), view.rmatvec(neg)
            columns.append(offset + np.arange(view.n_columns))
        offset += view.n_columns
        xt_pos.append(x_pos)
        xt_neg.append(x_neg)
        del view
    out = certificate_sums(problem, y, v, margins, pos, neg, xt_pos, xt_neg)
    if stored_any:
        out.update(cols=np.concatenate(columns), width=offset, sparse=("xt_pos", "xt_neg"))
    return out


def signed_dual_point(problem: obj.Problem, y, margins) -> tuple:
    """(v, y, a₊, a₋): the sample weights (or None), the labels, and the positive and
    negative parts of the dual point a = −v∘ℓ'(ŷ) of one row chunk."""
    v = row_weights(y)
    y = labels(y)
    a = obj.dual_direction(problem, y, margins, v)
    return v, y, np.where(a > 0, a, 0.0), np.where(a < 0, a, 0.0)


def certificate_sums(
    problem: obj.Problem, y, v, margins, pos, neg, xt_pos: list, xt_neg: list
) -> dict:
    """One row chunk's certificate statistics from its dual point's parts and the cells'
    products Xᵀa₊, Xᵀa₋ (one per block, in grid column order)."""
    return {
        "loss": np.array([obj.weighted_sum(obj.loss_value(problem.loss, y, margins), v)]),
        "pos": np.array([pos.sum()]),
        "neg": np.array([neg.sum()]),
        "xt_pos": np.concatenate(xt_pos) if xt_pos else np.zeros(0),
        "xt_neg": np.concatenate(xt_neg) if xt_neg else np.zeros(0),
        "margin_pos": np.array([obj.vdot(pos, margins)]),
        "margin_neg": np.array([obj.vdot(neg, margins)]),
    }


def dual_loss_sum(
    y, margins, problem: obj.Problem, total: dict, n_samples: int | None = None
) -> np.ndarray:
    """Σ −ℓ*(−a_i) over one row chunk for the dual point projected with ``total``'s sums.

    With ``n_samples``, for a pure L1 penalty, also Σ −ℓ*(−κa_i) at the rescaled point
    κa, κ = min(1, α/‖Xᵀa/n‖∞) (:func:`objectives.rescaled_lasso_from_dual`): the
    certificate takes the better of the two (see :func:`certificate`).
    """
    v = row_weights(y)
    y = labels(y)
    a = obj.dual_point(problem, y, margins, _scales(problem, total), v)
    sums = [obj.dual_loss(problem.loss, y, a, v).sum()]
    kappa = _lasso_kappa(problem, n_samples, total)
    if kappa is not None:
        sums.append(obj.dual_loss(problem.loss, y, kappa * a, v).sum())
    return np.array(sums)


def _scales(problem, total) -> tuple[float, float]:
    return obj.dual_scales(problem, {"pos": total["pos"][0], "neg": total["neg"][0]})


def _correlation(problem, n_samples: int, total: dict) -> np.ndarray:
    """Xᵀa/n of the projected dual point, from the reduced sums."""
    scales = _scales(problem, total)
    return (scales[0] * total["xt_pos"] + scales[1] * total["xt_neg"]) / n_samples


def slim_total(problem: obj.Problem, n_samples: int, total: dict) -> dict:
    """What :func:`dual_loss_sum` reads of the summed statistics: the sign counts and κ,
    computed once (the same bits), in place of the per-feature sums."""
    return {
        "pos": total["pos"],
        "neg": total["neg"],
        "kappa": _lasso_kappa(problem, n_samples, total),
    }


def _lasso_kappa(problem, n_samples, total) -> float | None:
    """κ of the rescaled lasso dual point (the same bits wherever it is computed), or None
    where it does not apply (no ``n_samples``, or not a pure L1 penalty)."""
    if "kappa" in total:  # a slim_total
        return total["kappa"]
    if n_samples is None or problem.l1 <= 0.0 or problem.l2 > 0.0:
        return None
    top = float(np.abs(_correlation(problem, n_samples, total)).max(initial=0.0))
    return min(1.0, problem.l1 / top) if top > 0 else 1.0


def certificate(problem: obj.Problem, n_samples: int, state: dict, total: dict, *duals) -> dict:
    """The duality-gap certificate of ``state`` from the reduced statistics.

    Returns ``state`` with its certificate under "certificate": the client fetches both
    in one round trip.
    """
    scales = _scales(problem, total)
    sums = sum_partials(*duals)
    correlation = _correlation(problem, n_samples, total)
    margin_dot = scales[0] * total["margin_pos"][0] + scales[1] * total["margin_neg"][0]
    cert = obj.primal_certificate(
        problem,
        n_samples,
        state["coef"],
        float(total["loss"][0]),
        float(sums[0]),
        correlation,
        float(margin_dot),
    )
    if len(sums) > 1:  # the rescaled lasso point's dual, summed by dual_loss_sum
        better = obj.rescaled_lasso_from_dual(
            problem, cert, state["coef"], lambda kappa: float(sums[1]) / n_samples
        )
        if better is not cert:
            # The rescaled point gives the gap. The per-coordinate gaps that order the
            # blocks and choose the resident ones stay the plain point's: under κa a zero
            # coefficient's violation shows nowhere, and a block of zeros would never be
            # chosen again.
            cert = dataclasses.replace(
                better,
                coordinate_gaps=cert.coordinate_gaps,
                intercept_gap=better.gap - float(cert.coordinate_gaps.sum()),
            )
    return {**state, "certificate": cert}


def weighted_derivatives(code: int, y, margins, weights):
    """v∘ℓ'(ŷ) and v∘ℓ''(ŷ) (ℓ' and ℓ'' without sample weights)."""
    d1, d2 = block_kernels.derivatives(code, y, margins)
    if weights is not None:
        d1 *= weights
        d2 *= weights
    return d1, d2


def newton_line_trials(problem, y, margins, u, weights, doublings=True) -> dict:
    """A Newton step's line search on a row chunk: Σ v_i (ℓ(ŷ_i + t·u_i) − ℓ(ŷ_i)) for each
    trial step t of TRIAL_STEPS ("trials"; v = 1 without weights) and, with
    ``doublings`` where ``problem`` extrapolates
    (:func:`~dask_scd.kernels.scalar.extrapolates`), of DOUBLINGS ("doubled")."""
    code = problem.loss_code
    quarters = block_kernels.are_quarters(TRIAL_STEPS)
    out = {"trials": block_kernels.line_trials(y, margins, u, TRIAL_STEPS, quarters, code, weights)}
    if doublings and extrapolates(problem):
        out["doubled"] = block_kernels.line_trials(y, margins, u, DOUBLINGS, False, code, weights)
    return out


_LAYOUT = ("cols", "width", "sparse")


def sum_partials(*partials):
    """Σ of the partials in their (row-chunk) order, accumulated in float64: the same bits
    whatever worker made each. Arrays are added left to right; dicts key by key (the
    aggregate of a tree reduction).

    A dict may hold some keys (its "sparse") at columns "cols" of "width" only (see
    :func:`certificate_stats`): they are added in place into zeros, the same sums as the
    full vectors; the result is full.
    """
    if not isinstance(partials[0], dict):
        total = np.array(partials[0], dtype=np.float64, copy=True)
        for part in partials[1:]:
            total += part
        return total
    sparse = set().union(*(p.get("sparse", ()) for p in partials))
    return {
        key: scattered_sum(partials, key)
        if key in sparse
        else sum_partials(*[p[key] for p in partials])
        for key in partials[0]
        if key not in _LAYOUT
    }


def tree_sum(partials: list, split_every: int = 4, combine=None, first=None) -> list:
    """What a tree sum fixed by the number of partials leaves: runs of ``split_every``
    consecutive partials summed, level by level, until at most ``split_every`` are left
    (dask's ``split_every``). Their :func:`sum_partials` is the total, the same bits
    wherever each run was summed.

    ``combine(start, run)``: the sum of ``run``, ``start`` the index of its first row chunk
    (on the cluster a run is summed on that row chunk's home); default
    :func:`sum_partials`, here. ``first``: the combine of a first level made whatever the
    number of partials (row-chunk results held in groups), default none.
    """
    combine = combine or (lambda start, run: sum_partials(*run))
    starts = list(range(len(partials)))
    if first is not None:
        partials, starts = _tree_level(partials, starts, first, split_every)
    while len(partials) > split_every:
        partials, starts = _tree_level(partials, starts, combine, split_every)
    return partials


def _tree_level(partials: list, starts: list, combine, split_every: int) -> tuple:
    """One level: every run of ``split_every`` consecutive partials combined, and the row
    chunk each run starts at."""
    runs = range(0, len(partials), split_every)
    summed = [combine(starts[i], partials[i : i + split_every]) for i in runs]
    return summed, [starts[i] for i in runs]


def scattered_sum(partials, key, width: int | None = None) -> np.ndarray:
    """Σ of the partials' ``key`` in their order, full width. A partial with "cols" holds
    ``key`` at those columns only (unless its "sparse" names other keys): added in place
    into zeros, the same sums as the full vectors. ``width``: the full length (default
    the partials' "width")."""
    if width is None:
        width = next(p["width"] for p in partials if "width" in p)
    first = np.asarray(partials[0][key])
    total = np.zeros(first.shape[:-1] + (width,))
    for p in partials:
        if "cols" in p and key in p.get("sparse", (key,)):
            values = p[key]
            if total.ndim == 1 and isinstance(values, np.ndarray) and values.dtype == np.float64:
                # (one addition per stored column, as below, without numpy's temporaries)
                block_kernels.add_at_columns(total, p["cols"], values)
            else:
                total[..., p["cols"]] += values
        else:
            total += p[key]
    return total
