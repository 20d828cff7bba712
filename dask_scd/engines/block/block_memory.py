"""Block SCD in memory: the block engine's exact block steps on numpy / scipy.sparse X.

X is cut once into cells (row chunks × blocks, each a column-major copy, a pure one also
by rows), and every epoch takes the plan, directions, line searches and coarse step of
the Dask engine (:mod:`block_loop`, :mod:`block_ops`, :mod:`block_coarse`,
:mod:`dask_scd.runtime.passes`) in this process, without Dask. On a pure cell the margins
are updated in place and a block's statistics come from one pass over the row chunk's
rows (:func:`~dask_scd.kernels.block.pure_stats`, which also applies the last block's
step). The row chunks run on this process's threads; their number depends on the size
of X alone and every sum runs over them in row order: the same bits on any number of
cores. The blocks are X's pure blocks (one-hot fields) where there are 2 to 256, else runs
of :data:`BLOCK_COLUMNS` columns taking the exact Newton step of their Gram matrix;
columns without a stored value keep θ_j = 0, their optimum. See "In memory" in
``docs/engines/block_scd.md``.
"""

from __future__ import annotations

import dataclasses
import uuid

import numpy as np
import scipy.sparse as sp

from dask_scd import objectives as obj
from dask_scd.data.cells import CellView, PureRows, WeightedLabels, inspect_cell
from dask_scd.engines.base import Options, Run
from dask_scd.engines.block import block_coarse, block_collective
from dask_scd.engines.block import block_ops as ops
from dask_scd.engines.block.block_loop import (
    BlockLoop,
    Certified,
    RowChunks,
    block_steps,
    coarse_step,
)
from dask_scd.engines.block.block_ops import INTERCEPT
from dask_scd.engines.coarse_level import MAX_BLOCKS
from dask_scd.kernels import block as block_kernels
from dask_scd.kernels import threads
from dask_scd.runtime import passes, strategies
from dask_scd.runtime.checkpoint import EpochHooks

# Columns per block where X has no pure blocks (each block a Gram step: ≤ 1024 columns).
BLOCK_COLUMNS = 256
# Row chunks of X: at least ROW_CHUNKS (for the threads), of at most CHUNK_ROWS rows (a row
# chunk's margins and labels stay in cache while a block's pass gathers and scatters into
# them). Fixed by the size of X (never by the cores): the same sums, and the same model,
# on any machine.
ROW_CHUNKS = 4
CHUNK_ROWS = 131_072
GRAM_MAX = 1024  # an impure block up to this wide takes the exact step of its Gram matrix


_ONES = np.zeros(0)  # the values of a one-hot cell by rows: all 1


def fit_block_memory(data, problem: obj.Problem, options: Options) -> Run:
    """Block SCD on :class:`~dask_scd.data.memory.InMemory` data.

    Engine options: ``selection`` ("shuffle", "cyclic", "gap": the block order within an
    epoch) and ``callback`` (called after every epoch with {epoch, relative_gap, primal,
    seconds, coef, intercept}; returning True stops the fit), as on Dask input.
    """
    given = options.engine.changed("cluster")
    if given:
        raise ValueError(
            f"{given} apply to solver='block_scd' on a dask array or a Grid; "
            "X is in memory, where the engine runs in this process"
        )
    selection = options.engine.selection
    engine = _Engine(data, problem, options.rng, selection, options.progress, options.memo)
    if options.start is not None:
        engine.warm = (
            np.array(options.start[0], dtype=np.float64)[engine.columns],
            float(options.start[1]),
        )
    try:
        run = engine.run(
            options.tol, options.max_iter, EpochHooks(callback=options.engine.callback)
        )
    finally:
        block_collective.forget_fit(engine.fit_key)
    run.extras = {"blocks": len(engine.slices), "row_chunks": len(engine.cells)}
    return run


def column_blocks(data, every: bool = False) -> list[np.ndarray]:
    """The blocks of X's columns that hold a value: its pure blocks (one-hot fields) when
    there are 2 to :data:`MAX_BLOCKS`, else runs of :data:`BLOCK_COLUMNS` columns;
    ``every``: the empty columns too, in runs of their own (a box may hold their θ_j away
    from 0, and the certificate counts their penalty)."""
    blocks = _blocks_of_values(data)
    if not every:
        return blocks
    used = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int64)
    empty = np.setdiff1d(np.arange(data.X.shape[1]), used)
    return blocks + [empty[i : i + BLOCK_COLUMNS] for i in range(0, len(empty), BLOCK_COLUMNS)]


def _blocks_of_values(data) -> list[np.ndarray]:
    """:func:`column_blocks` of the columns that hold a value."""
    X = data.X
    blocks = data.pure_blocks
    if blocks is not None and 2 <= len(blocks) <= MAX_BLOCKS:
        # Detected on the first rows: a rare column may share a row with its block's
        # others further down, and an impure block loses the exact step.
        from dask_scd.grid.partition import pure_on_all_rows

        blocks = pure_on_all_rows(X, blocks)
        if len(blocks) <= MAX_BLOCKS:
            return blocks
    if sp.issparse(X):
        used = np.flatnonzero(np.bincount(sp.csr_matrix(X).indices, minlength=X.shape[1]))
    else:
        used = np.arange(X.shape[1])
    if not len(used):  # X holds no value: one block of empty columns (θ stays 0)
        used = np.arange(min(X.shape[1], BLOCK_COLUMNS))
    return [used[i : i + BLOCK_COLUMNS] for i in range(0, len(used), BLOCK_COLUMNS)]


def row_bounds(n_rows: int, entries: int) -> np.ndarray:
    """Where the row chunks start and end: about equal runs of at most
    :data:`CHUNK_ROWS` rows, and at least :data:`ROW_CHUNKS` of them, above
    :data:`threads.MIN_ENTRIES` stored entries; else one."""
    parts = 1
    if entries >= threads.MIN_ENTRIES:
        parts = max(ROW_CHUNKS, -(-n_rows // CHUNK_ROWS))
    return np.linspace(0, n_rows, min(parts, n_rows) + 1).astype(np.int64)


def _on_threads(calls: list, n_threads: int) -> list:
    """[call() for call in calls]: on this process's threads (:func:`threads.run_all`, a
    run of consecutive calls per thread) where ``n_threads`` (:func:`threads.usable`)
    allows more than one."""
    if n_threads <= 1:
        return [call() for call in calls]
    return threads.run_all(calls)


class _Engine(BlockLoop):
    """Block SCD in this process: the loop of :class:`block_loop.BlockLoop`, an epoch
    over the row chunks on threads."""

    gram_max = GRAM_MAX

    # What depends on X alone (kept in Options.memo between the points of a path).
    _LAYOUT = (
        "n",
        "n_features",
        "columns",
        "offsets",
        "slices",
        "rows",
        "cells",
        "labels",
        "by_rows",
        "purity",
        "threads",
        "weighted",
    )

    def __init__(self, data, problem, rng, selection, progress, memo=None):
        self.problem, self.rng, self.progress = problem, rng, progress
        every = problem.bounds is not None  # with a box every column is a coordinate
        key = "block_scd" + ("/every column" if every else "")
        kept = None if memo is None else memo.get(key)
        if kept is None:
            self._lay_out(data, every)
            kept = {name: getattr(self, name) for name in self._LAYOUT}
            if memo is not None:
                memo[key] = kept
        else:
            self.__dict__.update({name: kept[name] for name in self._LAYOUT})
        if every:  # the box in the engine's column order, as θ
            self.problem = dataclasses.replace(problem, bounds=problem.bounds.take(self.columns))
        self.order = strategies.block_order(selection, self.slices)
        self.n_columns = len(self.columns)
        self.bounded = problem.loss == "logistic" and not data.weighted
        self.unsure: set = set()
        self.fit_key = f"memory-{uuid.uuid4().hex}"
        self.row_sums = None
        if problem.l1 <= 0.0 and not every:  # the coarse space's S (L1: over the support)
            key = ("row_sums", problem.fit_intercept)
            if key not in kept:
                kept[key] = self.each(
                    lambda k: block_coarse.block_row_sums(self.cells[k], problem.fit_intercept)
                )
            self.row_sums = kept[key]

    def _lay_out(self, data, every: bool = False):
        """The blocks, the row chunks and their cells (``every``: of every column)."""
        self.n, self.n_features = data.n_samples, data.n_features
        blocks = column_blocks(data, every)
        self.columns = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int64)
        widths = [len(b) for b in blocks]
        self.offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
        self.slices = [slice(int(a), int(b)) for a, b in zip(self.offsets[:-1], self.offsets[1:])]
        bounds = row_bounds(self.n, data.nnz)
        self.rows = np.diff(bounds).astype(int)
        self.cells, self.labels, self.by_rows, self.purity = self._cells(data, bounds)
        self.threads = threads.usable(data.nnz) if len(self.cells) > 1 else 1
        self.weighted = data.weighted
        if data.weighted:  # the fused passes are for unweighted losses
            self.by_rows = None

    def _cells(self, data, bounds) -> tuple[list, list, list | None, list]:
        """(cells, labels, by_rows, purity): cells[k] = [the cells of row chunk k, one per
        block]; labels[k] = its labels (with its sample weights, where there are);
        by_rows[k][b] = block b's pure cell by rows, a :class:`PureRows` (a sparse X; else
        None); purity[b]: no row holds two entries of block b. The row chunks are cut on
        threads."""
        X, labels = data.X, []
        chunks = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
        for lo, hi in chunks:
            y = np.ascontiguousarray(data.y[lo:hi], dtype=np.float64)
            labels.append(y if data.weights is None else WeightedLabels(y, data.weights[lo:hi]))
        if not sp.issparse(X):
            cells = [
                [CellView(np.ascontiguousarray(X[lo:hi][:, self.columns[s]])) for s in self.slices]
                for lo, hi in chunks
            ]
            reports = _on_threads(
                [
                    lambda k=k: [inspect_cell(cell, "X") for cell in cells[k]]
                    for k in range(len(cells))
                ],
                threads.usable(data.nnz),
            )
            return cells, labels, None, block_coarse.purity(reports, len(self.slices))
        X = sp.csr_matrix(X)  # not a copy when X is CSR
        width = len(self.columns)
        position = np.full(X.shape[1], -1, dtype=np.int32)
        position[self.columns] = np.arange(width, dtype=np.int32)
        block_of = np.repeat(np.arange(len(self.slices), dtype=np.int32), np.diff(self.offsets))

        def chunk(lo, hi):
            starts, rows, values = block_kernels.rows_by_columns(
                X.indptr, X.indices, X.data, lo, hi, position, width
            )
            cells = []
            for s in self.slices:
                a, b = starts[s.start], starts[s.stop]
                indptr = (starts[s.start : s.stop + 1] - a).astype(np.int32)
                cells.append(
                    CellView(
                        sp.csc_matrix(
                            (values[a:b], rows[a:b], indptr),
                            shape=(hi - lo, s.stop - s.start),
                            copy=False,
                        )
                    )
                )
            by_rows = block_kernels.rows_by_blocks(
                X.indptr, X.indices, X.data, lo, hi, position, block_of, self.offsets
            )
            return cells, by_rows

        done = _on_threads(
            [lambda lo=lo, hi=hi: chunk(lo, hi) for lo, hi in chunks], threads.usable(data.nnz)
        )
        impure = np.any([by_rows[2] for _, by_rows in done], axis=0)
        purity = [not bool(flag) for flag in impure]
        # One-hot X keeps no values by rows (the kernels take an empty one as all ones).
        ones = bool(np.all(X.data == 1))
        by_rows = [
            [
                PureRows(
                    column[b],
                    _ONES if ones else value[b],
                    None,
                    view.n_columns,
                    view.n_columns,
                    view.cube_sums(),
                )
                if purity[b]
                else None
                for b, view in enumerate(cells)
            ]
            for cells, (column, value, _) in done
        ]
        return [cells for cells, _ in done], labels, by_rows, purity

    def each(self, fn) -> list:
        """[fn(k) for every row chunk k], on this process's threads where there are."""
        return _on_threads([lambda k=k: fn(k) for k in range(len(self.cells))], self.threads)

    def _label_stats(self) -> list:
        return [ops.label_stats(y) for y in self.labels]

    def _original_order(self, coef) -> np.ndarray:
        out = np.zeros(self.n_features)
        out[self.columns] = coef
        return out

    def _first(self, state, final) -> Certified:
        margins, (coef, intercept, cert) = self._certify(state)
        return Certified(coef, intercept, cert, margins)

    def _next(self, point, final) -> Certified:
        """The block steps, the coarse step and the certificate of the new state."""
        margins = point.carry
        plan = self._plan(self._block_order(point.certificate))
        start, slack = (point.coef, point.intercept), 1e-13 * abs(point.certificate.primal)
        rows = _Rows(self, margins)
        state, unsure = block_steps(plan, start, slack, self.problem, self.n, rows)
        if self.problem.bounds is None:  # whole-block shifts ignore a box
            state = coarse_step(
                rows, self.problem, self.n, self.offsets, state, self._row_sums(state)
            )
        self.unsure = set(unsure)
        return self._first(state, final)

    # -- one epoch: the block steps and the coarse step on _Rows ----------------------

    def _cell(self, k, b):
        return None if b == INTERCEPT else self.cells[k][b]

    _NONE = (*ops.NO_STEP, 0.0)  # no step to apply: no cell by rows, no shift

    def _pending(self, k, margins, pending) -> tuple:
        """The last block's step for a fused pass over row chunk k: (its cell by rows and
        Δ, or empty; the intercept's shift). A step the fused passes cannot take is
        applied here, and nothing is left for them."""
        if pending is None:
            return self._NONE
        p, step = pending
        delta = step["delta"]
        if not np.any(delta):
            return self._NONE
        if p.block is None:
            return (*self._NONE[:3], float(delta[0]))
        if self._fused(p):
            rows = self.by_rows[k][p.b]
            return rows.column, rows.value, np.ascontiguousarray(delta, dtype=np.float64), 0.0
        margins[k] = ops.apply_step(margins[k], self.cells[k][p.b], step)
        return self._NONE

    def _apply(self, k, margins, pending):
        """The last block's step on row chunk k's margins, in place."""
        column, value, delta, shift = self._pending(k, margins, pending)
        if shift != 0.0:
            margins[k] += shift
        elif len(delta):
            block_kernels.pure_apply(column, value, delta, margins[k])

    def _fused(self, p) -> bool:
        return p.block is not None and p.pure and self.by_rows is not None

    def _stats(self, k, p, margins, pending) -> dict:
        """Row chunk k's statistics of block ``p`` (:func:`block_ops.block_stats`), after
        the last block's step (``pending``) on its margins, in one pass where it can."""
        y, loss = self.labels[k], self.problem.loss
        if p.block is None and not self.weighted:
            rows = ops.INTERCEPT_ROWS
        elif self._fused(p):
            rows = self.by_rows[k][p.b]
        else:
            self._apply(k, margins, pending)
            return ops.block_stats(self._cell(k, p.b), y, margins[k], loss, p.gram)
        *last, shift = self._pending(k, margins, pending)
        return ops.stats_by_rows(rows, y, margins[k], loss, tuple(last), shift)

    def _row_sums(self, state) -> list:
        """The coarse space's S per row chunk: over all columns (L2), or over the support,
        made again when it changes (L1)."""
        if self.row_sums is not None:
            return self.row_sums
        return [
            group[0]
            for group in block_collective._active_row_sums(
                self.each,
                self.fit_key,
                list(range(len(self.cells))),
                [[cells] for cells in self.cells],
                state["coef"],
                self.offsets,
                self.problem.fit_intercept,
            )
        ]

    def _certify(self, state) -> tuple:
        """Fresh margins from ``state`` and the certificate on them: (margins per row
        chunk, (coef, intercept, certificate)), the calls of the Dask engine's certificate
        in the same order."""
        problem, n, offsets = self.problem, self.n, self.offsets

        def cells(k) -> list:  # a pure cell by rows (by_rows), as the fused passes read it
            if self.by_rows is None:
                return self.cells[k]
            return [
                view if rows is None else rows for rows, view in zip(self.by_rows[k], self.cells[k])
            ]

        fresh = self.each(
            lambda k: passes.certificate_pass(
                cells(k), int(self.rows[k]), self.labels[k], state, offsets, problem, True
            )
        )
        margins = [f[0] for f in fresh]
        level = passes.tree_sum([f[1] for f in fresh])
        del fresh
        total = passes.sum_partials(*level)
        slim = passes.slim_total(problem, n, total)
        duals = self.each(
            lambda k: passes.dual_loss_sum(self.labels[k], margins[k], problem, slim, n)
        )
        result = passes.certificate(problem, n, state, total, *duals)
        return margins, (result["coef"], float(result["intercept"]), result["certificate"])


class _Rows(RowChunks):
    """The row chunks of :class:`_Engine` for :func:`block_loop.block_steps`: on this
    process's threads, a pure block of a sparse X read with the fused kernels
    (:func:`pure_apply`, :func:`pure_stats`); ``margins`` per row chunk, updated in
    place."""

    def __init__(self, engine: _Engine, margins: list):
        self.engine, self.margins = engine, margins

    def stats(self, p, pending):
        engine, margins = self.engine, self.margins
        return engine.each(lambda k: engine._stats(k, p, margins, pending))

    def column(self, p) -> list:
        return [self.engine._cell(k, p.b) for k in range(len(self.engine.cells))]

    def with_margins(self, func, per_row, *shared):
        engine, margins = self.engine, self.margins
        return engine.each(lambda k: func(per_row[k], engine.labels[k], margins[k], *shared))

    def apply(self, pending):
        engine, margins = self.engine, self.margins
        engine.each(lambda k: engine._apply(k, margins, pending))
