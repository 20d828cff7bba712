"""The block engines on a cluster: a dask array's or a grid's cells and labels on the
workers, their row chunks' homes, and what every epoch of block SCD and block Newton
reads (the checks and row sums of one pass over the cells, the certificate).

:class:`ClusterBlocks` is the set-up of :class:`block_loop.BlockLoop` on a
:class:`~dask_scd.runtime.cluster.ClusterRuntime` (homes, keyed submits, ordered sums,
the certificate chain); :mod:`block_scd` and :mod:`block_newton` fill in the epochs.
"""

from __future__ import annotations

import dataclasses
import operator

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.sources import Source
from dask_scd.engines.block import block_coarse
from dask_scd.engines.block import block_ops as ops
from dask_scd.engines.block.block_loop import BlockLoop
from dask_scd.runtime import strategies
from dask_scd.runtime.checkpoint import EpochHooks
from dask_scd.runtime.cluster import ClusterRuntime


def _live_columns(reports, slices) -> np.ndarray | None:
    """Which columns (grid order) hold a value in some cell, from the cells' inspection
    reports; None where all do (or a report does not say)."""
    live = np.zeros(slices[-1].stop if slices else 0, dtype=bool)
    for row in reports:
        for report, block in zip(row, slices):
            if report.get("columns") is None:
                return None
            width = block.stop - block.start
            live[block] |= np.unpackbits(report["columns"], count=width).astype(bool)
    return None if live.all() else live


class ClusterBlocks(BlockLoop):
    """A block engine's cells, labels and row-chunk homes on the cluster; θ in grid
    order (a warm start too). ``options``: the fit's :class:`~dask_scd.engines.base.Options`
    (its random generator, progress, warm start and the engine's ``selection``)."""

    def __init__(self, client, source: Source, problem: obj.Problem, options, coarse=True):
        self.client = client
        # The coarse step's whole-block shifts ignore a box on the coefficients: off there.
        self.coarse = coarse and problem.bounds is None
        self.source = source
        if problem.bounds is not None:  # the box in the grid's column order, as θ
            bounds = problem.bounds.take(source.feature_order)
            problem = dataclasses.replace(problem, bounds=bounds)
        self.problem = problem
        self.rng = options.rng
        self.selection = options.engine.selection
        self.progress = options.progress
        if options.start is not None:  # in the grid's column order
            coef = np.array(options.start[0], dtype=np.float64)[source.feature_order]
            self.warm = coef, float(options.start[1])
        self.slices = source.slices
        self.n_columns = source.n_features
        self.order = strategies.block_order(self.selection, self.slices)
        self.offsets = np.array([0] + [s.stop for s in self.slices], dtype=np.int64)
        # A grid's row chunks are placed on home workers (see ClusterRuntime.assign_homes).
        self.runtime = ClusterRuntime(
            client, source.n_row_chunks, pin=source.on_disk, row_counts=np.diff(source.row_bounds)
        )
        self.cells, self.labels = source.connect(client)
        if source.weighted and source.on_disk:
            # A grid's weights are arrays in the client: made into one task per row chunk
            # on its home (a lost copy is recomputed), not sent with every task.
            self.labels = [
                self.runtime.submit_row(r, ops.held, labels) for r, labels in enumerate(self.labels)
            ]
        self.rows = np.diff(source.row_bounds).astype(int)
        self._preflight()

    # -- set-up ---------------------------------------------------------------------

    def _preflight(self):
        """One pass over every cell: finite values, purity, and the coarse space's S_r."""
        submit_row = self.runtime.submit_row
        # One task per row chunk: a cell is read once for its check and its row sums.
        fused = [
            submit_row(
                r,
                block_coarse.inspect_row_chunk,
                self.cells[r],
                f"row chunk {r}",
                self.coarse,
                self.problem.fit_intercept,
            )
            for r in range(self.source.n_row_chunks)
        ]
        reports = self.runtime.gather(
            [submit_row(r, operator.getitem, fused[r], 0) for r in range(self.source.n_row_chunks)]
        )
        block_coarse.raise_finding(reports, self.source.row_bounds, self.source.blocks)
        n_blocks = len(self.slices)
        self.source.purity = self.purity = block_coarse.purity(reports, n_blocks)
        self.block_bytes = np.array(
            [
                sum(reports[r][b].get("nbytes", 0) for r in range(len(reports)))
                for b in range(n_blocks)
            ]
        )
        self.coarse_space = block_coarse.CoarseSpace(
            self.offsets, _live_columns(reports, self.slices)
        )
        if self.coarse:
            self.row_sums = [
                submit_row(r, operator.getitem, fused[r], 1)
                for r in range(self.source.n_row_chunks)
            ]

    def signature(self) -> dict:
        p = self.problem
        return {
            "loss": p.loss,
            "alpha": p.alpha,
            "l1_ratio": p.l1_ratio,
            "fit_intercept": p.fit_intercept,
            "shape": [self.source.n_samples, self.source.n_features],
            "blocks": [int(len(b)) for b in self.source.blocks],
            "row_bounds": [int(v) for v in self.source.row_bounds],
            "selection": self.selection,
            # a box: a checkpoint of another box is not this fit's (none: as before)
            **({} if p.bounds is None else {"bounds": repr(p.bounds)}),
        }

    def hooks(self, settings) -> EpochHooks:
        """The checkpoint and callback of the engine options ``settings``."""
        return EpochHooks(
            settings.checkpoint,
            settings.checkpoint_every,
            settings.resume,
            settings.callback,
            self.signature(),
        )

    def _original_order(self, coef) -> np.ndarray:
        out = np.empty_like(coef)
        out[self.source.feature_order] = coef
        return out

    def _label_stats(self) -> list:
        return self.runtime.gather(
            [
                self.runtime.submit_row(r, ops.label_stats, self.labels[r])
                for r in range(self.source.n_row_chunks)
            ]
        )

    def _reduce(self, func, fixed: tuple, partials=None):
        """``func(*fixed, *partials)`` in a task, the partials (where there are: a
        :class:`~dask_scd.runtime.cluster.Rows`) in row order."""
        if partials is None:
            return self.runtime.submit(func, *fixed)
        return self.runtime.reduce(func, fixed, partials)

    def _certify(self, state):
        """Fresh margins from the state (θ, b) and the certificate on them (see
        :meth:`ClusterRuntime.certify`)."""
        return self.runtime.certify(
            self.problem,
            self.source.n_samples,
            self.cells,
            self.labels,
            self.rows,
            self.offsets,
            state,
        )
