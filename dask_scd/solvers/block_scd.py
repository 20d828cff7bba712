"""Block SCD over dask: the engine of the SCD paper ("robust large-scale ML in the cloud").

The design matrix is a grid of cells (row chunks × column blocks). One iteration updates
one block B:

    select B → one task per row chunk: partial (g_B, h_B) from its cell, labels, margins
             → one task sums them in row-chunk order and takes the coordinate step
             → [line search: one task per row chunk tries step sizes, one task chooses]
             → one task per row chunk applies Δθ_B to its margins

Margins ŷ live on the workers as futures next to their row chunk; only block-sized
vectors travel. The block update runs inside a task, so a whole epoch (one pass over all
blocks and the intercept) is submitted without waiting; the client waits for the
epoch's steps, then once for the coarse step and the duality-gap certificate, chained.
Every task of a row chunk runs on that row chunk's home worker. On a *pure* block (≤ 1
non-zero per example) the block step equals sequential coordinate descent; impure blocks
take a line-searched step.

Each epoch starts from margins recomputed exactly from (θ, b), and every sum runs in a
fixed order, so the model is independent of the number of workers, a worker lost
mid-epoch is recomputed from its lineage (at most one epoch long), and a checkpoint of
(θ, b, epoch, RNG state) resumes to the same model bit for bit.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from dask_scd import objectives as obj
from dask_scd.result import History
from dask_scd.runtime import strategies
from dask_scd.runtime.cluster import ClusterRuntime, EpochHooks
from dask_scd.solvers import block_ops as ops
from dask_scd.solvers.base import Options, Run
from dask_scd.validation import check_labels

INTERCEPT = -1  # the intercept's block index: a pure block whose cell is all ones
SELECTIONS = ("shuffle", "cyclic", "gap")


# ------------------------------------------------------------------------- the data


@dataclass
class _Source:
    """Where the cells and labels of the grid come from, and what is known of them."""

    n_samples: int
    n_features: int
    row_bounds: np.ndarray
    blocks: list  # original feature indices of each block, in grid column order
    cell: object  # cell(r, b) -> CellRef or a future of the chunk
    label: object  # label(r) -> LabelRef or a future / array of ±1 (or real) labels
    nbytes: int
    materialize: object  # () -> (X in original feature order, y) in memory
    classes: np.ndarray | None = None
    purity: list = field(default_factory=list)

    @property
    def n_row_chunks(self) -> int:
        return len(self.row_bounds) - 1

    @property
    def slices(self) -> list:
        offsets = np.concatenate([[0], np.cumsum([len(b) for b in self.blocks])]).astype(int)
        return [slice(offsets[b], offsets[b + 1]) for b in range(len(self.blocks))]

    @property
    def feature_order(self) -> np.ndarray:
        return np.concatenate(self.blocks)


def _grid_source(grid, y, loss, blocks) -> _Source:
    from dask_scd.grid import Grid

    assert isinstance(grid, Grid)
    if y is not None:
        raise ValueError("a Grid carries its own labels: call fit(grid) without y")
    if blocks is not None:
        raise ValueError("a Grid carries its own blocks; write it again with to_grid(blocks=...)")
    classes = None
    if loss in obj.CLASSIFICATION_LOSSES:
        classes = _classes(_grid_classes(grid), loss)

    def materialize():
        X = grid.X.compute()
        X = sp.csr_matrix(X) if grid.is_sparse else np.asarray(X)
        inverse = np.empty_like(grid.feature_order)
        inverse[grid.feature_order] = np.arange(len(grid.feature_order))
        return X[:, inverse], grid.y.compute()

    itemsize = np.dtype(grid.dtype).itemsize
    nbytes = grid.nnz * (itemsize + 4) if grid.is_sparse else grid.shape[0] * grid.shape[1] * itemsize
    label_classes = tuple(classes.tolist()) if classes is not None else None
    return _Source(
        n_samples=grid.shape[0], n_features=grid.shape[1], row_bounds=np.asarray(grid.row_bounds),
        blocks=list(grid.blocks),
        cell=lambda r, b: ops.CellRef(grid.path, grid.grid_id, r, b, grid.store_version),
        label=lambda r: ops.LabelRef(grid.path, grid.grid_id, r, label_classes,
                                     grid.store_version),
        nbytes=int(nbytes), materialize=materialize, classes=classes,
    )


def _grid_classes(grid) -> np.ndarray:
    """The distinct labels of a grid, read one row chunk at a time (never all of y)."""
    seen = np.zeros(0)
    for r in range(grid.n_row_chunks):
        seen = np.union1d(seen, np.unique(grid.read_labels(r)))
        if len(seen) > 2:
            break  # already too many classes for a binary loss
    return seen


def _dask_source(X, y, loss, blocks) -> _Source:
    import dask.array as da

    if X.ndim != 2:
        raise ValueError(f"X must be 2-D of shape (n_samples, n_features), got shape {X.shape}")
    if any(np.isnan(c) for chunks in X.chunks for c in chunks):
        raise ValueError(
            "X has unknown chunk sizes (NaN in X.chunks); call X.compute_chunk_sizes() first"
        )
    if y is None:
        raise ValueError("y is required for a dask array X (only a Grid carries its labels)")
    n, p = X.shape
    if n == 0 or p == 0:
        raise ValueError(f"X is empty: shape {X.shape}")
    if X.dtype.kind not in "biuf":
        raise ValueError(f"X must be numeric, got dtype {X.dtype}")
    if blocks is None:
        bounds = np.concatenate([[0], np.cumsum(X.chunks[1])])
        blocks = [np.arange(bounds[b], bounds[b + 1]) for b in range(len(X.chunks[1]))]
    else:
        from dask_scd.grid import validate_blocks

        blocks = validate_blocks(blocks, p)
        order = np.concatenate(blocks)
        X = X[:, order].rechunk({1: tuple(len(b) for b in blocks)})
    row_bounds = np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(np.int64)
    if isinstance(y, da.Array):
        if y.ndim != 1 or y.shape[0] != n:
            raise ValueError(f"y has shape {y.shape} but X has {n} rows: y must be (n_samples,)")
        values = y.rechunk((X.chunks[0],)).compute()
    else:
        values = y  # check_labels reads lists, pandas and numpy alike
    y_checked, classes = check_labels(values, n, loss)
    y_chunks = [y_checked[row_bounds[r]:row_bounds[r + 1]] for r in range(len(row_bounds) - 1)]

    def materialize():
        computed = X.compute()
        inverse = np.empty(p, dtype=np.int64)
        inverse[np.concatenate(blocks)] = np.arange(p)
        if not isinstance(computed, np.ndarray):
            computed = ops.to_scipy(computed)
        return computed[:, inverse], values

    source = _Source(
        n_samples=n, n_features=p, row_bounds=row_bounds, blocks=blocks,
        cell=None, label=lambda r: y_chunks[r],
        nbytes=int(n * p * X.dtype.itemsize), materialize=materialize, classes=classes,
    )
    source.dask_X = X  # persisted on the cluster once a client exists
    return source


def _classes(values, loss):
    if len(values) > 2:
        raise ValueError(
            f"loss={loss!r} is a binary loss but y has {len(values)} classes; for more than two "
            "classes fit one binary model per class (one-vs-rest: y == k against the rest)"
        )
    if len(values) < 2:
        raise ValueError(f"y has a single class {list(values)}: a classifier needs two")
    return values


def make_source(X, y, loss, blocks) -> _Source:
    """Validate dask/grid input and describe its cells."""
    if type(X).__module__.startswith("dask_scd.grid"):
        return _grid_source(X, y, loss, blocks)
    return _dask_source(X, y, loss, blocks)


# ------------------------------------------------------------------------- the engine


def fit_block_scd(source: _Source, problem: obj.Problem, options: Options) -> Run:
    """Block SCD on a dask array or a Grid (see :func:`make_source`).

    Engine options (``options.engine``)
    -----------------------------------
    client : distributed.Client, optional
        Defaults to the current client, else an in-process threaded cluster for the fit.
    selection : {"shuffle", "cyclic", "gap"}
        Block order within an epoch: a fresh permutation, the grid order, or by decreasing
        block duality gap (from the last certificate).
    checkpoint : path, optional
        File (.npz) written atomically every ``checkpoint_every`` epochs.
    resume : bool
        Continue from ``checkpoint`` if it exists.
    callback : callable, optional
        Called after every epoch with a dict (epoch, coef in the original feature order,
        intercept, relative_gap); returning True stops the fit.
    residency : {"duhl", "sequential", "random", "importance"}, optional
        A grid only: each epoch updates only the blocks this policy makes resident within
        ``memory_budget`` (bytes of cells over the whole grid; each worker holds its row
        chunks' share), chosen on the client from the last certificate's block gaps, so
        the model stays independent of the workers. Default: every block, every epoch,
        cells in each worker's LRU cache. The Run's extras count the cells' bytes moved
        and swaps.
    memory_budget : int, bytes
        Default: a quarter of the grid.
    """
    engine_options = dict(options.engine)
    selection = engine_options.pop("selection", "shuffle")
    if selection not in SELECTIONS:
        raise ValueError(f"selection={selection!r} is not one of {SELECTIONS}")
    client = engine_options.pop("client", None)
    residency = engine_options.pop("residency", None)
    budget = engine_options.pop("memory_budget", None)
    if residency is not None and source.cell is None:
        raise ValueError("residency applies to a Grid (a dask array's chunks already live "
                         "in the workers' memory)")
    with _client(client) as c:
        engine = _BlockSCD(c, source, problem, options.rng, selection, options.progress,
                           residency=residency, memory_budget=budget)
        hooks = EpochHooks(engine_options.get("checkpoint"),
                           engine_options.get("checkpoint_every", 1),
                           engine_options.get("resume", False), engine_options.get("callback"),
                           engine.signature())
        try:
            run = engine.run(options.tol, options.max_iter, hooks)
        finally:
            engine.release()
    coef = np.empty(source.n_features)
    coef[source.feature_order] = run["coef"]
    extras = engine.moved if residency is not None else {}
    return Run(coef, run["intercept"], run["certificate"], run["epoch"], run["history"], extras)


@contextlib.contextmanager
def _client(client):
    """The given client, else the current one, else an in-process threaded cluster."""
    if client is not None:
        yield client
        return
    from distributed import Client, LocalCluster, default_client

    # Found before the yield: an error of the fit (a ValueError too) must reach the caller
    # as it is, not be taken for "no current client" and start a cluster of its own.
    try:
        current = default_client()
    except ValueError:
        current = None
    if current is not None:
        yield current
        return
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=os.cpu_count() or 1,
                      dashboard_address=":0") as cluster, Client(cluster) as local:
        yield local


class _BlockSCD:
    """The solver loop: select → reduce → update → certify, one epoch at a time.

    The cluster plumbing (homes, keyed submits, ordered sums, the certificate) is the
    :class:`~dask_scd.runtime.cluster.ClusterRuntime`; the block order within an epoch is
    a :class:`~dask_scd.runtime.strategies.BlockOrder`.
    """

    def __init__(self, client, source: _Source, problem: obj.Problem, rng, selection, progress,
                 gram_max=1024, coarse=True, residency=None, memory_budget=None):
        self.client = client
        self.coarse = coarse
        self.gram_max = gram_max
        self.source = source
        self.problem = problem
        self.rng = rng
        self.selection = selection
        self.progress = progress
        self.slices = source.slices
        self.order = strategies.block_order(selection, self.slices)
        self.offsets = np.array([0] + [s.stop for s in self.slices], dtype=np.int64)
        # A grid's row chunks are placed on home workers (see ClusterRuntime.assign_homes).
        self.runtime = ClusterRuntime(client, source.n_row_chunks, pin=source.cell is not None)
        self._connect_cells()
        self._preflight()
        self.residency = None
        if residency is not None:
            self.residency = strategies.residency(residency, self.block_bytes)
            total = int(self.block_bytes.sum())
            self.memory_budget = int(memory_budget if memory_budget is not None else total // 4)
            if self.memory_budget < int(self.block_bytes.max()):
                raise ValueError(f"memory_budget={self.memory_budget} bytes is smaller than one "
                                 f"block's cells ({int(self.block_bytes.max())} bytes)")
        self.moved = {"bytes_moved": 0, "swaps": 0, "rounds": {"blocks": [], "swaps": []}}

    # -- set-up ---------------------------------------------------------------------

    def _connect_cells(self):
        """Persist a dask array's chunks on the cluster; labels go there too."""
        source = self.source
        if source.cell is None:
            persisted = self.client.persist(source.dask_X)
            from distributed import futures_of

            by_key = {f.key: f for f in futures_of(persisted)}
            keys = persisted.__dask_keys__()
            source.cell = lambda r, b: by_key[keys[r][b]]
            # Submitted as tasks, not scattered: a lost copy is recomputed from the task.
            labels = [self.client.submit(ops.labels, source.label(r))
                      for r in range(source.n_row_chunks)]
            source.label = lambda r: labels[r]
        self.cells = [[source.cell(r, b) for b in range(len(self.slices))]
                      for r in range(source.n_row_chunks)]
        self.labels = [source.label(r) for r in range(source.n_row_chunks)]
        self.rows = np.diff(source.row_bounds).astype(int)

    def _preflight(self):
        """One pass over every cell: finite values, purity, and the coarse space's S_r."""
        submit_row = self.runtime.submit_row
        reports = [
            [submit_row(r, ops.inspect_cell, self.cells[r][b], f"cell (row chunk {r}, block {b})")
             for b in range(len(self.slices))]
            for r in range(self.source.n_row_chunks)
        ]
        reports = self.runtime.gather(reports)
        n_blocks = len(self.slices)
        self.source.purity = [max(reports[r][b]["max_per_row"] for r in range(len(reports))) <= 1
                              for b in range(n_blocks)]
        self.block_bytes = np.array([sum(reports[r][b].get("nbytes", 0)
                                         for r in range(len(reports))) for b in range(n_blocks)])
        if self.coarse:
            self.row_sums = [submit_row(r, ops.block_row_sums, self.cells[r],
                                        self.problem.fit_intercept)
                             for r in range(self.source.n_row_chunks)]

    # The runtime under the names the engines built on this class call it by.
    def _submit(self, func, *args, **kwargs):
        return self.runtime.submit(func, *args, **kwargs)

    def _submit_row(self, r, func, *args):
        return self.runtime.submit_row(r, func, *args)

    def _tree_sum(self, partials, split_every=4):
        return self.runtime.tree_sum(partials, split_every)

    def _assign_homes(self):
        self.runtime.assign_homes()

    def signature(self) -> dict:
        p = self.problem
        return {
            "loss": p.loss, "alpha": p.alpha, "l1_ratio": p.l1_ratio,
            "fit_intercept": p.fit_intercept,
            "shape": [self.source.n_samples, self.source.n_features],
            "blocks": [int(len(b)) for b in self.source.blocks],
            "row_bounds": [int(v) for v in self.source.row_bounds],
            "selection": self.selection,
        }

    # -- the loop -------------------------------------------------------------------

    def run(self, tol, max_iter, hooks: EpochHooks) -> dict:
        coef = np.zeros(self.source.n_features)
        intercept = 0.0
        history = History()
        epoch = 0
        saved = hooks.load(self.rng)
        if saved is not None:
            coef, intercept, epoch, history = (saved["coef"], saved["intercept"], saved["epoch"],
                                               saved["history"])
        elif self.problem.fit_intercept:
            intercept = self._initial_intercept()
        start = time.perf_counter() - (history.seconds[-1] if len(history) else 0.0)
        margins, (coef, intercept, cert) = self._certify({"coef": coef, "intercept": intercept})
        while cert.relative_gap > tol and epoch < max_iter:
            epoch += 1
            self.runtime.assign_homes()  # a worker may have been lost or added
            order = self._block_order(cert)
            coef, intercept, margins = self._epoch(margins, order, coef, intercept, cert.primal)
            state = {"coef": coef, "intercept": intercept}
            if self.coarse and self.problem.l1 == 0.0:  # see dask_scd.coarse
                state = self._coarse_step(margins, state)
            margins, (coef, intercept, cert) = self._certify(state)
            history.append(epoch, cert.relative_gap, cert.primal, time.perf_counter() - start)
            self.progress.update(epoch, cert.relative_gap, cert.primal)
            if hooks.after_epoch(epoch, coef, intercept, cert, history, self.rng, tol,
                                 self._original_order):
                break
        return {"coef": coef, "intercept": intercept, "epoch": epoch, "history": history,
                "certificate": cert}

    def _original_order(self, coef) -> np.ndarray:
        out = np.empty_like(coef)
        out[self.source.feature_order] = coef
        return out

    def _initial_intercept(self) -> float:
        """The best intercept for θ = 0: a cheap exact start from per-row-chunk label counts."""
        stats = [self.runtime.submit_row(r, ops.label_stats, self.labels[r])
                 for r in range(self.source.n_row_chunks)]
        total = ops.sum_partials(*self.runtime.gather(stats))
        return ops.intercept_at_zero(self.problem.loss, float(total["n"][0]),
                                     float(total["sum"][0]), float(total["pos"][0]))

    def _block_order(self, cert) -> list:
        order = self.order.order(len(self.slices), cert, self.rng)
        if self.residency is not None:
            chosen = self._make_resident(cert)
            order = [b for b in order if b in chosen]
        if self.problem.fit_intercept:
            order.insert(int(self.rng.integers(len(order) + 1)), INTERCEPT)
        return order

    def _make_resident(self, cert) -> set:
        """The residency's choice of blocks from the block gaps, pinned on every row
        chunk's home (cells of other blocks released); counts the bytes it moved."""
        block_gaps = np.array([max(cert.coordinate_gaps[s].sum(), 0.0) for s in self.slices])
        chosen = self.residency.choose(self.block_bytes, self.memory_budget, block_gaps,
                                       self.rng)
        held = self.runtime.gather([
            self.runtime.submit_row(r, ops.hold_cells, r,
                                    [self.cells[r][b] for b in chosen])
            for r in range(self.source.n_row_chunks)])
        loads = sum(h["loads"] for h in held)
        self.moved["bytes_moved"] += sum(h["bytes"] for h in held)
        self.moved["swaps"] += loads
        self.moved["rounds"]["blocks"].append([int(b) for b in chosen])
        self.moved["rounds"]["swaps"].append(int(loads))
        return {int(b) for b in chosen}

    def release(self):
        """Unpin the cells a residency policy held on the workers."""
        if self.residency is not None:
            self.runtime.run_on_rows(ops.hold_cells, [])

    def _epoch(self, margins, order, coef, intercept, primal):
        """Submit one pass over the blocks as a single graph; wait only for its end."""
        submit, submit_row = self.runtime.submit, self.runtime.submit_row
        problem, n = self.problem, self.source.n_samples
        slack = 1e-13 * abs(primal)
        steps = {}
        for b in order:
            pure = b == INTERCEPT or self.source.purity[b]
            cells = [None if b == INTERCEPT else self.cells[r][b] for r in range(len(margins))]
            theta = np.array([intercept]) if b == INTERCEPT else coef[self.slices[b]].copy()
            # An impure block small enough takes the exact Newton step of its Gram matrix.
            gram = not pure and len(theta) <= self.gram_max
            stats = [submit_row(r, ops.block_stats, cells[r], self.labels[r], margins[r],
                                problem.loss, gram) for r in range(len(margins))]
            if gram:
                stats = self.runtime.tree_sum(stats)
            step = direction = submit(ops.block_direction, problem, n, theta, b == INTERCEPT,
                                      *stats)
            if not ((pure or gram) and problem.loss == "squared"):
                trials = [submit_row(r, ops.block_trials, cells[r], self.labels[r],
                                     margins[r], direction, problem, pure)
                          for r in range(len(margins))]
                step = submit(ops.block_choose, direction, n, slack, *trials)
            margins = [submit_row(r, ops.apply_step, margins[r], cells[r], step)
                       for r in range(len(margins))]
            steps[b] = step
        results = self.runtime.gather(steps)
        coef = coef.copy()
        for b, step in results.items():
            if b == INTERCEPT:
                intercept = float(step["theta"][0])
            else:
                coef[self.slices[b]] = step["theta"]
        return coef, intercept, margins

    def _coarse_step(self, margins, state):
        """A Newton step on the k-dimensional subspace of whole-block shifts (+ intercept).

        Coordinate descent is slow along directions its coordinates only see together —
        on one-hot data, shifting a whole field against the intercept or another field.
        One reduction gives the k×k curvature of the loss on that subspace; the penalty
        is added exactly, and the small problem is solved in a task
        (:func:`dask_scd.coarse.coarse_newton`). A line search keeps it a descent step
        for non-quadratic losses. Returns a future of the new state, {"coef",
        "intercept"}: nothing waits here, the certificate's gather fetches it.
        """
        submit, submit_row = self.runtime.submit, self.runtime.submit_row
        problem, n = self.problem, self.source.n_samples
        R = len(margins)
        stats = [submit_row(r, ops.coarse_stats, self.row_sums[r], self.labels[r],
                            margins[r], problem.loss) for r in range(R)]
        direction = submit(ops.coarse_direction, problem, n, self.offsets, state, *stats)
        trials = []
        if problem.loss != "squared":
            trials = [submit_row(r, ops.coarse_trials, self.row_sums[r], self.labels[r],
                                 margins[r], direction, problem.loss) for r in range(R)]
        return submit(ops.coarse_apply, problem, n, self.offsets, state, direction, *trials)

    def _certify(self, state):
        """Fresh margins from the state (θ, b) and the certificate on them (see
        :meth:`ClusterRuntime.certify`)."""
        return self.runtime.certify(self.problem, self.source.n_samples, self.cells,
                                    self.labels, self.rows, self.offsets, state)
