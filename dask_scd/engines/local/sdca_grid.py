"""Out-of-core engine: dual SDCA over a grid's row chunks (``solver="sdca"`` on a Grid).

The idea of SA-SDCA (Tran et al. 2015, *Scaling up stochastic dual coordinate ascent*,
§4): data larger than memory is cut into row blocks on disk; each epoch visits the
blocks in a pseudo-random order and runs SDCA steps on the rows of the block in memory,
while the next block is read by another thread. Here the blocks are the grid's row
chunks: a fresh permutation of the row chunks from the fit's ``random_state`` every
epoch, the rows of each chunk block-shuffled as the in-memory engine shuffles all rows
(:func:`dask_scd.engines.local.sdca._block_order`), and the same row steps
(:func:`dask_scd.kernels.cpu.sdca_epoch`: losses, L2 penalty, the intercept by the
method of multipliers). A row chunk in memory is its cells side by side, one CSR (or
dense) matrix in grid column order; w is kept in grid column order and mapped back to
the original feature order once, at the end.

Memory: at most two row chunks (the one being stepped on and the one being read: a
``ThreadPoolExecutor(1)`` reads and decodes chunk k + 1 while the numba kernel, which
releases the GIL, steps on chunk k; a dense grid's are two reused buffers, used in turn,
:class:`ChunkMemory`), w (p floats; twice while a certificate is summed),
and five vectors of n floats: the dual variables a, the labels, the squared norms of the
rows, and, while a certificate is summed, the margins X w and the certified a.

A certificate of the point (w, a) after epoch e needs the margins X_k w and X_kᵀ a of
every row chunk (the exact Xᵀa/(αn) of the dual point, which the running w drifts from
by rounding and, with an intercept, by the projection of a onto Σ a_i = 0). They are
summed during epoch e + 1's read pass, each row chunk before the steps on it (a row's
a_i only moves when its row chunk is visited, and w is a copy), so a certificate costs
no read of its own except after the last epoch. The primal objective is taken at w with
its best intercept, the dual at a: each bound is valid on its own, so their difference
is a duality gap.

Decoding is the cost of a read (~3 ms of zstd for a 4,096 x 120 float64 row chunk, about
the SDCA steps on it): with ``spill``, a dense grid's row chunks are decoded once and
kept decoded in a temporary file (:class:`dask_scd.data.spill.Spill`), which the later
passes read back.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dask_scd import objectives as obj
from dask_scd.data.spill import Spill
from dask_scd.engines.base import CertificateSchedule, Options, Run, Trace
from dask_scd.engines.local.epochs import sdca_epoch
from dask_scd.engines.local.sdca import PENALTY_SCALE, _block_order, cold_start
from dask_scd.grid.read import CellBuffers, read_cell, read_dense_row_chunk, read_labels
from dask_scd.kernels import cpu
from dask_scd.kernels.layout import MajorMatrix
from dask_scd.validation import check_feature_magnitude, check_label_values, largest_magnitude


@dataclass(eq=False)
class RowChunk:
    """Row chunk ``r`` of a grid in memory: rows ``start:stop``, all columns in grid
    column order."""

    r: int
    start: int
    stop: int
    matrix: MajorMatrix


def read_row_chunk(
    grid, r: int, memory: "ChunkMemory | None" = None, spill: "Spill | None" = None
) -> RowChunk:
    """Read and decode the cells of row chunk ``r`` into one matrix (CSR when sparse).

    A dense one is decoded into ``memory``'s next buffer (the chunk is then a view of it,
    valid until the read after next; fresh buffers when none is given); with a ``spill``
    (dense grids), a row chunk spilled before is read back from it instead, and one read
    from the grid is spilled."""
    if grid.is_sparse:
        cells = [read_cell(grid.path, grid.grid_id, r, b) for b in range(grid.n_blocks)]
        X = sp.hstack(cells, format="csr")
    else:
        if memory is None:  # a read of its own (np.empty: the unused buffer is not touched)
            memory = ChunkMemory(grid)
        out = memory.next()
        X = spill.get(r, out) if spill is not None else None
        if X is None:
            X = read_dense_row_chunk(grid.path, grid.grid_id, r, out, memory.cells)
            if spill is not None:
                spill.put(r, X)
    matrix = MajorMatrix.from_array(X, "rows")
    bounds = grid.row_bounds
    return RowChunk(r, int(bounds[r]), int(bounds[r + 1]), matrix)


class ChunkMemory:
    """Two row-chunk buffers, used in turn (the chunk being stepped on and the one being
    read), and the reading thread's cell buffers: the reads of a dense grid allocate
    nothing (fresh memory costs its page faults at every read)."""

    def __init__(self, grid):
        shape = (max(grid.row_chunks, default=0), grid.shape[1])
        self.buffers = [np.empty(shape, dtype=grid.dtype) for _ in range(2)]
        self.cells = CellBuffers()
        self.turn = 0

    def next(self) -> np.ndarray:
        self.turn ^= 1
        return self.buffers[self.turn]


class ChunkStream:
    """Passes over a grid's row chunks, each chunk read one ahead by a background thread.

    ``spill``: False, True or a directory (True: the system's temporary directory) where
    a dense grid's row chunks are kept decoded after their first read, in a file that
    takes the grid's decoded size (:class:`~dask_scd.data.spill.Spill`; a write that
    fails, disk full, drops it with a warning, and the grid is decoded again)."""

    def __init__(self, grid, spill=False):
        self.grid = grid
        self.pool = ThreadPoolExecutor(1)
        self.passes = 0
        self.memory = None if grid.is_sparse else ChunkMemory(grid)
        self.spill = None
        if spill is not False:
            directory = tempfile.gettempdir() if spill is True else spill
            size = grid.shape[0] * grid.shape[1] * np.dtype(grid.dtype).itemsize
            self.spill = Spill(directory, size, what="row chunks", warn=True)

    def each(self, order, work) -> None:
        """``work(chunk)`` for the row chunks in ``order``; chunk k + 1 is read while
        ``work`` runs on chunk k, and chunk k is released before chunk k + 2 is read (into
        chunk k's buffer, on a dense grid: ``work`` must not keep a chunk)."""
        self.passes += 1
        memory = () if self.memory is None else (self.memory, self.spill)
        pending = self.pool.submit(read_row_chunk, self.grid, int(order[0]), *memory)
        for k in range(len(order)):
            chunk, pending = pending.result(), None
            if k + 1 < len(order):
                pending = self.pool.submit(read_row_chunk, self.grid, int(order[k + 1]), *memory)
            work(chunk)
            chunk = None  # noqa: F841 (dropped before the next read: two chunks at most)

    def close(self) -> None:
        self.pool.shutdown()
        if self.spill is not None:
            self.spill.close()


def fit_sdca_grid(source, problem: obj.Problem, options: Options) -> Run:
    """Stochastic dual coordinate ascent (L2 penalty) on a Grid, out of core.

    ``source``: :class:`~dask_scd.data.sources.GridSource` (its ``grid`` is read, never
    materialized). Engine options (:class:`~dask_scd.engines.options.SDCAOptions`):
    ``check_every`` (None: certify on the in-memory engine's schedule,
    :class:`~dask_scd.engines.base.CertificateSchedule`), ``chunk_order``, ``spill``
    (:class:`~dask_scd.data.spill.Spill`); ``n_threads`` must be 1.
    """
    settings, grid = options.engine, source.grid
    _check_on_grid(settings, options.device, grid)
    tol, max_iter, rng = options.tol, options.max_iter, options.rng
    n_samples, n_chunks = source.n_samples, source.n_row_chunks
    alpha_n = problem.alpha * n_samples
    y, intercept, dual_coef = _cold_start(source, problem)
    stream = ChunkStream(grid, settings.spill)
    try:
        state = _start(stream, n_chunks, dual_coef, alpha_n, source.n_features)
        rho = (
            PENALTY_SCALE * state.row_sq_sum / n_samples / alpha_n if problem.fit_intercept else 0.0
        )
        coef = state.coef
        schedule = CertificateSchedule()
        trace, orders = Trace(options.progress, options.callback), []

        def settle(pending):
            cert, cert_intercept = pending.finish(problem, y, alpha_n)
            trace.record(pending.epoch, cert.relative_gap, cert.primal)
            return cert, cert_intercept, pending

        # The certificate of epoch e is summed during epoch e + 1's pass (no read pass of
        # its own); when it stops the fit, epoch e + 1's steps are dropped and the fit
        # returns epoch e's w.
        pending, settled = None, None
        for epoch in range(1, max_iter + 1):
            order = rng.permutation(n_chunks) if settings.chunk_order == "random" else None
            order = np.arange(n_chunks) if order is None else order
            orders.append(order.tolist())
            max_delta, dual_total = _epoch(
                stream, order, problem, y, dual_coef, state, alpha_n, intercept, rho, rng, pending
            )
            if pending is not None:
                settled = settle(pending)
                if settled[0].relative_gap <= tol or trace.stopped:
                    break
            intercept += rho * dual_total  # b ← b + ρ Σ a_i (ρ = 0 without intercept)
            final = epoch == max_iter
            if settings.check_every is None:
                due = schedule.due(epoch, max_delta, np.abs(dual_coef).max(), final)
            else:
                due = final or epoch % settings.check_every == 0
            pending = (
                _PointCertificate.at(epoch, problem, dual_coef, coef, intercept) if due else None
            )
        else:
            if pending is not None:  # the last epoch's: a pass of its own
                stream.each(np.arange(n_chunks), pending.add)
                settled = settle(pending)
        passes = stream.passes
    finally:
        stream.close()
    cert, cert_intercept, point = settled
    extras = {"chunk_orders": orders[: point.epoch], "read_passes": passes, "row_chunks": n_chunks}
    coef = grid.to_original_order(point.coef)
    return trace.ended(Run(coef, float(cert_intercept), cert, point.epoch, trace.history, extras))


def _cold_start(source, problem: obj.Problem) -> tuple:
    """(y, b, a): the labels of every row chunk, the best intercept for θ = 0 and the dual
    point SDCA starts from."""
    y = _labels(source.grid, source.classes)
    if problem.loss == "squared":
        check_label_values(y)
    return (y, *cold_start(problem, y))


def _check_on_grid(engine, device_name: str, grid) -> None:
    """SDCA's options (:class:`~dask_scd.engines.options.SDCAOptions`) checked against a
    Grid run out of core."""
    if device_name == "gpu":
        raise ValueError(
            "solver='sdca' on a Grid runs out of core on the CPU; pass "
            "device='cpu' (or read the grid into memory: fit(*source arrays))"
        )
    if engine.n_threads != 1:
        raise ValueError(
            f"n_threads={engine.n_threads!r}: solver='sdca' on a Grid runs "
            "its epochs on one thread (a second one reads the next row chunk); "
            "leave n_threads=1"
        )
    if engine.spill is not False and grid.is_sparse:
        raise ValueError(
            "spill keeps a dense grid's row chunks decoded; this grid is sparse "
            "(its row chunks are decoded at every pass): leave spill=False"
        )


def _labels(grid, classes) -> np.ndarray:
    """The labels of every row chunk, ±1 for a classification loss (n floats)."""
    parts = [read_labels(grid.path, grid.grid_id, r) for r in range(grid.n_row_chunks)]
    y = np.concatenate(parts) if parts else np.zeros(0)
    if classes is not None:
        y = np.where(y == classes[1], 1.0, -1.0)
    return y


@dataclass
class _Start:
    """What the first read pass gives: w = Xᵀa/(αn) of the first dual point, ‖x_i‖² of
    every row (kept: the epochs need them, and a read should not recompute them) and
    their sum (the scale of ρ)."""

    coef: np.ndarray
    row_sq_norms: np.ndarray
    row_sq_sum: float


def _start(stream, n_chunks, dual_coef, alpha_n, n_features) -> _Start:
    state = _Start(np.zeros(n_features), np.empty(len(dual_coef)), 0.0)

    def work(chunk):
        # The in-memory engines' check of X, one row chunk at a time.
        check_feature_magnitude(largest_magnitude(chunk.matrix.data), f" in row chunk {chunk.r}")
        lo, hi = chunk.start, chunk.stop
        state.coef += chunk.matrix.scatter(dual_coef[lo:hi])
        norms = chunk.matrix.sq_norms()
        state.row_sq_norms[lo:hi] = norms
        state.row_sq_sum += float(norms.sum())

    stream.each(np.arange(n_chunks), work)
    state.coef /= alpha_n
    return state


def _epoch(stream, order, problem, y, dual_coef, state, alpha_n, intercept, rho, rng, pending):
    """One SDCA epoch, row chunk by row chunk in ``order``; returns max |Δa_i| and Σ a_i.

    ``pending``: a :class:`_PointCertificate` of the point before this epoch, summed over
    each row chunk before the steps on it (its a_i are still the point's then).
    """
    dual_sum = np.array([dual_coef.sum()])
    max_delta = [0.0]

    def work(chunk):
        if pending is not None:
            pending.add(chunk)
        lo, hi = chunk.start, chunk.stop
        m = chunk.matrix
        rows = _block_order(np.arange(hi - lo), rng)
        delta = sdca_epoch(
            cpu.sdca_epoch,
            m,
            y[lo:hi],
            dual_coef[lo:hi],
            state.coef,
            rows,
            problem.loss_code,
            alpha_n,
            state.row_sq_norms[lo:hi],
            None,
            intercept,
            rho,
            dual_sum,
        )
        max_delta[0] = max(max_delta[0], delta)

    stream.each(order, work)
    return max_delta[0], dual_sum[0]


@dataclass(eq=False)
class _PointCertificate:
    """The certificate of the point (w, a) after ``epoch``, summed over one read pass.

    The primal bound is P at w and its best intercept; the dual bound is D at a,
    projected onto Σ a_i = 0 when an intercept is fitted
    (:func:`dask_scd.objectives.project_sum_zero`, which keeps it feasible), with its
    own Xᵀa/(αn) summed over the row chunks. w and a are copies: the pass may be the
    next epoch's, which moves the running ones.
    """

    epoch: int
    coef: np.ndarray
    dual_point: np.ndarray
    intercept_start: float  # the running intercept, where w's best one is searched from
    margins: np.ndarray
    exact: np.ndarray  # Xᵀa, divided by αn once summed

    @classmethod
    def at(cls, epoch, problem, dual_coef, coef, intercept) -> "_PointCertificate":
        dual_point = dual_coef.copy()
        if problem.fit_intercept and dual_coef.sum() != 0.0:
            dual_point = obj.project_sum_zero(dual_coef)
        return cls(
            epoch, coef.copy(), dual_point, intercept, np.empty(len(dual_coef)), np.zeros_like(coef)
        )

    def add(self, chunk: RowChunk) -> None:
        lo, hi = chunk.start, chunk.stop
        self.margins[lo:hi] = chunk.matrix.dot(self.coef)
        self.exact += chunk.matrix.scatter(self.dual_point[lo:hi])

    def finish(self, problem, y, alpha_n):
        """The certificate and w's best intercept, once every row chunk was added."""
        n_samples = len(y)
        dual_point, margins = self.dual_point, self.margins
        exact = self.exact / alpha_n
        intercept = 0.0
        if problem.fit_intercept:
            intercept = obj.optimal_intercept(problem.loss, y, margins, start=self.intercept_start)
        margins += intercept
        losses = obj.loss_value(problem.loss, y, margins)
        duals = obj.dual_loss(problem.loss, y, dual_point)
        half_alpha = 0.5 * problem.alpha
        primal = float(losses.sum()) / n_samples + half_alpha * obj.vdot(self.coef, self.coef)
        dual = float(duals.sum()) / n_samples - half_alpha * obj.vdot(exact, exact)
        # Per example (ℓ_i(ŷ_i) + ℓ*_i(−a_i) + a_i ŷ_i)/n as in obj.sdca_certificate; the
        # rest (w against Xᵀa/(αn), a projected) is booked to the intercept.
        coordinate_gaps = (losses - duals + dual_point * margins) / n_samples
        cert = obj.Certificate(
            primal, dual, coordinate_gaps, primal - dual - float(coordinate_gaps.sum())
        )
        return cert, intercept
