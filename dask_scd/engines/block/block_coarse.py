"""What one row chunk computes for the coarse step of block SCD, and the step itself.

The directions "shift a whole block" (and the intercept) span the slow subspace of
coordinate descent on one-hot-like data (:mod:`dask_scd.engines.coarse`): each row chunk
keeps S_r, its rows' sums over every block (:func:`block_row_sums`, made in the one pass
that checks its cells, :func:`inspect_row_chunk`), and gives the partial gradient and
curvature on that subspace (:func:`coarse_stats`) and the line search's trials
(:func:`coarse_trials`); the engine sums them in row-chunk order and takes the step
(:func:`coarse_direction`, :func:`coarse_apply`). Pure and deterministic, as
:mod:`dask_scd.engines.block.block_ops`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.cells import cell_view, inspect_cell, labels, pure_rows, row_weights
from dask_scd.data.findings import finding_error
from dask_scd.engines.coarse import LINE_SEARCH_STEPS, coarse_line_search, coarse_newton
from dask_scd.engines.coarse_level import RowSums
from dask_scd.kernels import block as block_kernels
from dask_scd.runtime.passes import sum_partials


def block_row_sums(cells, with_intercept: bool) -> RowSums:
    """S_r = [X_cell(b) 1 for every block b] (+ a column of ones), compactly; ``cells``
    a row chunk's cells in block order (a list, or a generator: each is read as its
    column is made). A complete one-hot block sums to the ones vector, which is not
    stored: on one-hot data S_r takes 1 byte per row and set-valued block instead of 8 per
    row and block.
    """
    columns = (_cell_matvec(cell, np.ones) for cell in cells)
    return RowSums.from_columns(columns, with_intercept)


def inspect_row_chunk(cells: list, where: str, row_sums: bool, with_intercept: bool) -> tuple:
    """(task) :func:`~dask_scd.data.cells.inspect_cell` of every cell of a row chunk, and
    with ``row_sums`` its :func:`block_row_sums` too, each cell's sums made right after
    its check: out of core the cell is then read once for both (it is the row chunk's
    last read), where a task per cell and one per row chunk read every cell twice.
    Returns (reports, row sums or None); ``where`` names the row chunk in a finding. A
    cell's bad value is not raised here (the worker would log the failed task): its
    report is ``{"finding": ...}``, the last of the reports, with no row sums, and the
    client raises the error (:func:`raise_finding`)."""
    reports = []

    def inspected():
        for b, cell in enumerate(cells):
            reports.append(inspect_cell(cell, f"cell ({where}, block {b})", raises=False))
            if "finding" in reports[-1]:
                return
            yield cell

    if not row_sums:
        for _ in inspected():
            pass
        return reports, None
    sums = block_row_sums(inspected(), with_intercept)
    return reports, None if "finding" in reports[-1] else sums


def raise_finding(reports: list, row_bounds, blocks) -> None:
    """The error of the first bad value that :func:`inspect_row_chunk` found (``reports``:
    each row chunk's), naming its cell and, for a NaN or an infinity, its row and column
    in X (``row_bounds``: the row chunks' first rows; ``blocks``: the original feature
    indices of each column block); nothing where none was found."""
    for r, row in enumerate(reports):
        for b, report in enumerate(row):
            if "finding" in report:
                raise finding_error(report["finding"], r, b, row_bounds, blocks)


def purity(reports: list, n_blocks: int) -> list:
    """Per block, whether no row holds two of its entries, from every row chunk's
    :func:`~dask_scd.data.cells.inspect_cell` reports (one per block)."""
    return [max(row[b]["max_per_row"] for row in reports) <= 1 for b in range(n_blocks)]


def _cell_matvec(cell, vector_of) -> np.ndarray:
    """X_cell v for v = ``vector_of(n_columns)``: a pure cell by rows (the form its passes
    read and the cache holds: out of core, reading its column-major form for this was a
    read more of every cell), any other by its view."""
    form = pure_rows(cell) or cell_view(cell)
    return form.matvec(vector_of(form.n_columns))


def active_row_sums(cells: list, coef, offsets, with_intercept: bool) -> RowSums:
    """S_r over the non-zero coefficients only: [X_cell(b) [θ_b ≠ 0] for every block b]
    (+ a column of ones), the coarse space of an L1 problem (its zero coefficients stay
    at zero: shifting them too would pay l1·|c| for each)."""

    def columns():
        for b, cell in enumerate(cells):
            live = (coef[offsets[b] : offsets[b + 1]] != 0.0).astype(np.float64)
            yield _cell_matvec(cell, lambda n_columns, live=live: live)

    return RowSums.from_columns(columns(), with_intercept)


def coarse_stats(row_sums: RowSums, y, margins, loss: str) -> dict:
    """Partial gradient Sᵀℓ'(ŷ) and curvature Sᵀ diag(ℓ''(ŷ)) S of the coarse problem.

    Summed in row order by a loop (never BLAS), so the same bits on every worker.
    """
    v = row_weights(y)
    y = labels(y)
    d1 = obj.loss_derivative(loss, y, margins)
    d2 = obj.loss_second_derivative(loss, y, margins)
    if v is not None:
        d1, d2 = d1 * v, d2 * v
    g, h = block_kernels.coarse_stats(row_sums.counts, row_sums.column_of, d1, d2)
    return {"g": g, "h": h}


def coarse_direction(problem: obj.Problem, n_samples: int, offsets, state: dict, *partials) -> dict:
    """Sum the coarse statistics in order and solve the k-dimensional Newton problem."""
    total = sum_partials(*partials)
    g, h = total["g"] / n_samples, total["h"] / n_samples
    blocks = _blocks(state["coef"], offsets, problem)
    return {"shift": coarse_newton(problem, g, h, blocks), "g": g}


def coarse_trials(row_sums: RowSums, y, margins, direction: dict, loss: str) -> dict:
    """Partial Σ ℓ(ŷ + t·S c) − ℓ(ŷ) for the line search of the coarse step."""
    shift = direction["shift"]
    if not np.any(shift):
        return {"trials": np.zeros(len(LINE_SEARCH_STEPS))}
    v = row_weights(y)
    y = labels(y)
    u = block_kernels.coarse_matvec(row_sums.counts, row_sums.column_of, shift)
    return line_trials(y, margins, u, obj.LOSS_CODES[loss], v)


def line_trials(y, margins, u, code: int, v) -> dict:
    """{"trials": Σ v_i (ℓ(ŷ_i + t·u_i) − ℓ(ŷ_i)) for each t of LINE_SEARCH_STEPS}: one
    pass, the changes summed directly (no difference of two losses; the logistic loss's by
    the product form: one exp and expm1 per row for all steps)."""
    quarters = block_kernels.are_quarters(LINE_SEARCH_STEPS)
    return {
        "trials": block_kernels.line_trials(y, margins, u, LINE_SEARCH_STEPS, quarters, code, v)
    }


def coarse_apply(
    problem: obj.Problem, n_samples: int, offsets, state: dict, direction: dict, *trials
) -> dict:
    """The state moved by the coarse step (line-searched when ``trials`` are given).
    ``offsets``: the blocks' bounds, or a :class:`CoarseSpace`."""
    shift = direction["shift"]
    if not np.any(shift):
        return state
    blocks = _blocks(state["coef"], offsets, problem)
    step = 1.0
    if trials:
        change = sum_partials(*[p["trials"] for p in trials]) / n_samples
        step = coarse_line_search(problem, change, direction["g"], shift, blocks)
    coef = state["coef"].copy()
    for b, (span, moved) in enumerate(_moved(coef, offsets, problem)):
        coef[span][moved] += step * shift[b]
    intercept = state["intercept"]
    if problem.fit_intercept:
        intercept += step * shift[-1]
    return {"coef": coef, "intercept": float(intercept)}


def _blocks(coef, offsets, problem) -> list:
    """The coefficients each block shift moves (:func:`_moved`)."""
    return [coef[span][moved] for span, moved in _moved(coef, offsets, problem)]


def _moved(coef, offsets, problem) -> list:
    """Per block, (its columns, which of them a block shift moves): those that hold a
    value in X (all of them but where a :class:`CoarseSpace` says otherwise), or with an
    L1 term its non-zero ones (:func:`active_row_sums`)."""
    live = None
    if isinstance(offsets, CoarseSpace):
        offsets, live = offsets.offsets, offsets.live
    spans = [slice(offsets[b], offsets[b + 1]) for b in range(len(offsets) - 1)]
    if problem.l1 > 0.0:
        return [(span, coef[span] != 0.0) for span in spans]
    if live is not None:
        return [(span, live[span]) for span in spans]
    return [(span, slice(None)) for span in spans]


@dataclass(frozen=True)
class CoarseSpace:
    """The blocks' bounds ``offsets`` (grid column order) and ``live``: which columns hold
    a value somewhere in X. A block shift moves the live columns only: shifting a column
    without a value (to_grid puts those in its first block) only adds to the penalty, and
    made the shifts ~10⁴ times too small (measured in "The coarse step" of
    ``docs/engines/block_scd.md``)."""

    offsets: np.ndarray
    live: np.ndarray | None = None
