"""Block SCD over dask: the engine of the SCD paper ("robust large-scale ML in the cloud").

An iteration updates one column block from one reduction over the row chunks
(statistics → direction → [line search] → step); the margins stay on the workers next to
their row chunk and only block-sized vectors travel. An epoch runs as one task graph
(:class:`_Graph`, submitted whole: the client waits once for its steps, then once for the
coarse step and the certificate, chained) or collectively (:mod:`block_collective`), the
same bits either way. Margins recomputed from (θ, b) every epoch and sums in row-chunk
order keep the model independent of the workers, a lost worker's cost within one epoch,
and a resumed checkpoint bit for bit: see ``docs/engines/block_scd.md``.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.cells import hold_cells
from dask_scd.data.sources import Source
from dask_scd.engines.base import Options, Run
from dask_scd.engines.block import block_coarse, block_collective
from dask_scd.engines.block import block_ops as ops
from dask_scd.engines.block.block_cluster import ClusterBlocks
from dask_scd.engines.block.block_loop import Certified, RowChunks, block_steps, coarse_step
from dask_scd.runtime import collective, strategies
from dask_scd.runtime.cluster import ClusterRuntime, fit_client

# ------------------------------------------------------------------------- the engine


# The collective iterations of the fits run from one client process (CV folds side by
# side, dask_scd.estimators.path_cv) take turns. A member holds its worker's thread while
# it waits for its partners' statistics: two fits' members, queued crosswise on workers
# of one thread each, would wait for each other until MEMBER_TIMEOUT (LassoCV on a grid,
# 2 workers of one thread, 3 folds at once: over 5 min where the folds in turn took
# 167 s). Their other stages (certificates, coarse steps: ordinary tasks) still overlap.
_COLLECTIVE_TURN = threading.RLock()


def fit_block_scd(source: Source, problem: obj.Problem, options: Options) -> Run:
    """Block SCD on a dask array or a Grid (a :class:`~dask_scd.data.sources.Source`);
    in-memory X runs :func:`block_memory.fit_block_memory` (the registry's route).

    Engine options: :class:`~dask_scd.engines.options.BlockSCDOptions`. With a
    ``residency`` policy (a grid only) the blocks resident each epoch are chosen on the
    client from the last certificate's block gaps, so the model stays independent of the
    workers; each worker holds its row chunks' share of ``memory_budget``, and the Run's
    extras count the cells' bytes moved and swaps. Without one every block is updated
    every epoch, cells in each worker's LRU cache.
    """
    settings = options.engine
    if settings.residency is not None and not source.on_disk:
        raise ValueError(
            "residency applies to a Grid (a dask array's chunks already live "
            "in the workers' memory)"
        )
    with fit_client(settings.client) as c:
        engine = _BlockSCD(c, source, problem, options)
        try:
            run = engine.run(options.tol, options.max_iter, engine.hooks(settings))
        finally:
            engine.release()
    if engine.residency is not None:
        run.extras.update(engine.moved)
    if engine.member_seconds:  # where a collective iteration's time went (member 0)
        run.extras["member_seconds"] = [
            {"waiting": w, "epoch_and_coarse": e, "certificate": c}
            for w, e, c in engine.member_seconds
        ]
    if engine.fallbacks:  # collective iterations redone as task graphs, and why
        run.extras["collective_fallbacks"] = list(engine.fallbacks)
    return run


class _Kept:
    """Margins kept in the workers by the members of the collective iteration ``token``
    (:func:`block_collective.epoch_member`), not held by any future."""

    __slots__ = ("token",)

    def __init__(self, token: str):
        self.token = token


def collective_on_pure_blocks(source) -> bool:
    """Whether block SCD on ``source`` runs its epochs collectively (one task per worker,
    :mod:`dask_scd.engines.block.block_collective`) with every block pure, so every block
    step is exact. ``auto`` then prefers block SCD to block Newton's conjugate gradients."""
    return all(source.purity) and _fits_collectively(source, [(b, False) for b in source.slices])


def _fits_collectively(source, blocks) -> bool:
    """Whether an epoch over ``blocks`` (pairs of a block's columns and whether it takes a
    Gram step) may run collectively: on a grid, every block's statistics, which every
    member receives, within :attr:`_BlockSCD.COLLECTIVE_BYTES`."""
    limit = _BlockSCD.COLLECTIVE_BYTES
    return (
        _BlockSCD.collective
        and source.on_disk
        and all(_stats_bytes(source, block, gram) <= limit for block, gram in blocks)
    )


def _stats_bytes(source, block, gram: bool = False) -> int:
    """Bytes of ``block``'s statistics over all row chunks of ``source``: a row chunk's
    g, h, Σ|x|³ and column indices (8 bytes each) at most at one column per row, or a
    Gram block's width² products."""
    width = min(block.stop - block.start, int(np.diff(source.row_bounds).max()))
    return source.n_row_chunks * (width * width * 8 if gram else width * 32)


class _BlockSCD(ClusterBlocks):
    """Block SCD on the cluster: the loop of :class:`block_loop.BlockLoop`, an epoch as a
    task graph (:class:`_Graph`) or collectively (:mod:`block_collective`).

    The cells, labels and homes are :class:`block_cluster.ClusterBlocks`'; the block
    order within an epoch is a :class:`~dask_scd.runtime.strategies.BlockOrder`.
    """

    gram_max = 1024  # an impure block up to this wide takes the exact step of its Gram matrix

    def __init__(self, client, source: Source, problem: obj.Problem, options: Options):
        super().__init__(client, source, problem, options)
        residency, memory_budget = options.engine.residency, options.engine.memory_budget
        self.residency = None
        if residency is not None:
            self.residency = strategies.residency(residency, self.block_bytes)
            total = int(self.block_bytes.sum())
            self.memory_budget = int(memory_budget if memory_budget is not None else total // 4)
            if self.memory_budget < int(self.block_bytes.max()):
                raise ValueError(
                    f"memory_budget={self.memory_budget} bytes is smaller than one "
                    f"block's cells ({int(self.block_bytes.max())} bytes)"
                )
        self.moved = {"bytes_moved": 0, "swaps": 0, "rounds": {"blocks": [], "swaps": []}}
        # Pure logistic blocks take provable steps without a line search (one stage per
        # block instead of two), except those whose last step was unsure: those run the
        # trials this epoch (see _provable).
        self.bounded = self.problem.loss == "logistic" and not self.source.weighted
        self.unsure = set()
        self._slim = None  # see run
        self._resend = False  # see _collective_iteration
        self._fixed_parts = {}  # see _keeps_fixed_parts
        self._registered = set()  # workers with the collective iterations' mailbox
        self._collective_ran = False
        # Per collective iteration, member 0's (waiting for the others, epoch and coarse
        # step, certificate) seconds: where the time of an iteration goes.
        self.member_seconds = []
        self.fallbacks = []  # why collective iterations gave way to the task graph

    # -- the epoch (the loop is BlockLoop.run) -------------------------------------

    def _first(self, state, final) -> Certified:
        margins, (coef, intercept, cert) = self._certify(state)
        return Certified(coef, intercept, cert, [margins])

    def _next(self, point, final) -> Certified:
        # Iterations that do not end the fit return a certificate without what only a
        # final one needs (see block_collective._slimmed).
        tol = self.tol
        self._slim = None if final else (-tol if self._needs_gaps() else tol)
        self.runtime.assign_homes()  # a worker may have been lost or added
        order = self._block_order(point.certificate)
        # Handed over, not kept here: the epoch's first stage reads these margins, and a
        # reference held through the epoch kept them (~2 MB a row chunk) on the workers
        # beside the ones the epoch makes.
        box, point.carry = point.carry, None
        margins, (coef, intercept, cert) = self._iteration(
            box, order, point.coef, point.intercept, point.certificate.primal
        )
        return Certified(coef, intercept, cert, [margins])

    def _needs_gaps(self) -> bool:
        """Whether the block order or the residency reads every certificate's coordinate
        gaps."""
        return self.residency is not None or self.order.uses_gaps

    def _chosen(self, order, cert) -> list:
        if self.residency is None:
            return order
        chosen = self._make_resident(cert)
        return [b for b in order if b in chosen]

    def _make_resident(self, cert) -> set:
        """The residency's choice of blocks from the block gaps, pinned on every row
        chunk's home (cells of other blocks released); counts the bytes it moved."""
        block_gaps = np.array([max(cert.coordinate_gaps[s].sum(), 0.0) for s in self.slices])
        chosen = self.residency.choose(self.block_bytes, self.memory_budget, block_gaps, self.rng)
        held = self.runtime.gather(
            [
                self.runtime.submit_row(r, hold_cells, r, [self.cells[r][b] for b in chosen])
                for r in range(self.source.n_row_chunks)
            ]
        )
        loads = sum(h["loads"] for h in held)
        self.moved["bytes_moved"] += sum(h["bytes"] for h in held)
        self.moved["swaps"] += loads
        self.moved["rounds"]["blocks"].append([int(b) for b in chosen])
        self.moved["rounds"]["swaps"].append(int(loads))
        return {int(b) for b in chosen}

    def release(self):
        """Unpin the cells a residency policy held on the workers; drop what the
        collective iterations kept for this fit."""
        if self.residency is not None:
            self.runtime.run_on_rows(hold_cells, [])
        if self._collective_ran:
            with contextlib.suppress(Exception):
                self.client.run(block_collective.forget_fit, self.runtime._fit_token)

    def _iteration(self, box, order, coef, intercept, primal):
        """One epoch over the blocks of ``order``, the coarse step and the certificate:
        collectively where it can (:mod:`dask_scd.engines.block.block_collective`), else as a
        task graph; the same bits either way. ``box``: a list holding the margins, which
        the epoch takes out (so that nothing keeps them once read). Returns (margins,
        (coef, intercept, certificate)) after it; the margins are
        :class:`~dask_scd.runtime.cluster.Rows`, or :class:`_Kept` where the members
        kept them."""
        plan = self._plan(order)
        slack = 1e-13 * abs(primal)
        blocks = [(p.block, p.gram) for p in plan if p.block is not None]
        if _fits_collectively(self.source, blocks):
            done = self._collective_iteration(box[0], plan, coef, intercept, slack)
            if done is not None:
                return done
        if isinstance(box[0], _Kept):  # the same bits as the members' certificate's
            box[0], _ = self._certify({"coef": coef, "intercept": intercept})
        return self._certify(self._graph_epoch(box, plan, coef, intercept, slack))

    # A collective epoch sends every block's statistics to every member: not where one
    # block's, over all row chunks, would weigh more than this (the task graph sums those
    # in a tree of tasks, each holding a few row chunks' parts).
    COLLECTIVE_BYTES = 128 * 2**20
    collective = True  # run epochs collectively where possible (False: task graphs only)

    def _keeps_fixed_parts(self, addresses) -> bool:
        """Whether the members send the statistics' fixed parts once and keep the others'
        (:class:`block_collective._StaticParts`): unmanaged memory of the order of the
        other workers' cells' stored columns, so only where a worker's share of the grid
        takes at most a quarter of its memory limit (in core; out of core the parts are
        sent whole, as the task graph does)."""
        key = tuple(addresses)
        if key not in self._fixed_parts:
            workers = {} if addresses == [None] else self.client.scheduler_info().get("workers", {})
            limits = [workers.get(a, {}).get("memory_limit") or 0 for a in addresses]
            share = float(np.sum(self.block_bytes)) / len(addresses)
            # (no limit anywhere, or a single member: nothing is kept for another)
            self._fixed_parts[key] = (
                not any(limits) if not all(limits) else share <= 0.25 * min(limits)
            )
        return self._fixed_parts[key]

    def _members(self) -> tuple[list, list]:
        """The members of a collective epoch: one per home worker (every worker when the
        groups have no homes: a single member), with the groups each runs."""
        members = {}
        for g, home in enumerate(self.runtime.group_homes):
            members.setdefault(home, []).append(g)
        return list(members), list(members.values())

    def _collective_iteration(self, margins, plan, coef, intercept, slack):
        """The iteration as one task per worker exchanging statistics directly
        (:func:`block_collective.epoch_member`): (the margins the members kept, (coef,
        intercept, certificate)), or None where a member was lost or could not meet the
        others (the caller runs the task graph from the same margins). The fits of this
        process take turns (:data:`_COLLECTIVE_TURN`)."""
        with _COLLECTIVE_TURN:
            return self._members_iteration(margins, plan, coef, intercept, slack)

    def _members_iteration(self, margins, plan, coef, intercept, slack):
        runtime, client = self.runtime, self.client
        addresses, groups = self._members()
        single = addresses == [None]
        if not single:
            new = [a for a in addresses if a not in self._registered]
            if new:
                client.run(collective.register, workers=new)
                self._registered.update(new)
        token = f"epoch-{uuid.uuid4().hex}"
        self._collective_ran = True
        fit_key = self.runtime._fit_token
        kept = margins.token if isinstance(margins, _Kept) else None
        members = []
        for i, (address, mine) in enumerate(zip(addresses, groups)):
            rows = [runtime.groups[g] for g in mine]
            coarse = None
            if self.coarse:
                sums = (
                    None
                    if self.problem.l1 > 0.0
                    else [[self.row_sums[r] for r in group] for group in rows]
                )
                coarse = (fit_key, self.coarse_space, sums)
            certify = (
                fit_key,
                [[int(self.rows[r]) for r in group] for group in rows],
                self.offsets,
                kept,
                self._slim,
                self._resend if self._keeps_fixed_parts(addresses) else None,
            )
            place = {} if single else {"workers": [address], "allow_other_workers": True}
            members.append(
                runtime.submit(
                    block_collective.epoch_member,
                    token,
                    i,
                    addresses,
                    mine,
                    None if kept else [margins.parts[g] for g in mine],
                    None if kept else margins.pick,
                    [[self.cells[r] for r in group] for group in rows],
                    [[self.labels[r] for r in group] for group in rows],
                    None if kept else (coef, intercept),
                    plan,
                    self.problem,
                    self.source.n_samples,
                    slack,
                    self.MEMBER_TIMEOUT,
                    coarse,
                    certify,
                    name="epoch_member",
                    retries=0,
                    **place,
                )
            )
        try:
            result = self._await_members(members, addresses, single)
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the task graph redoes it
            # ... but the fit says so: a member's own error (not a lost worker) would
            # otherwise cost every epoch a collective attempt without a word.
            self.fallbacks.append(f"{type(exc).__name__}: {exc}"[:200])
            with contextlib.suppress(Exception):
                client.run(collective.abort, token)
            client.cancel(members)
            self._resend = True  # the others may lack what the members sent
            return None
        self._resend = False
        self.unsure = set(result["unsure"])
        self.member_seconds.append((float(result["waited"]),) + tuple(result["timing"]))
        certified = result["certified"]
        return _Kept(token), (
            certified["coef"],
            float(certified["intercept"]),
            certified["certificate"],
        )

    def _await_members(self, members, addresses, single: bool) -> dict:
        """The first member's result once every member has finished; a
        :class:`collective.Aborted` as soon as one fails, gives up or loses its worker."""
        runtime, client = self.runtime, self.client
        remaining, checked, pause = list(members), time.monotonic(), 0.001
        results = {}
        while remaining:
            # The futures' states are the client's own (its event loop updates them):
            # polling them costs no message.
            time.sleep(pause)
            pause = min(2 * pause, 0.01)
            if any(f.status in ("error", "cancelled", "lost") for f in remaining):
                raise collective.Aborted("a member failed")
            finished = [f for f in remaining if f.status == "finished"]
            # The members that finished, gathered in one round trip (not one each). A
            # member that gave up (its kept margins were lost with a replaced worker,
            # say) leaves the others waiting for its parts: end the exchange now rather
            # than at their timeout.
            for f, result in zip(finished, runtime.gather(finished) if finished else ()):
                results[f.key] = result
                if result is not None and "aborted" in result:
                    raise collective.Aborted(
                        "a member could not meet the others: " + str(result["aborted"])
                    )
            remaining = [f for f in remaining if f not in finished]
            if remaining and not single and time.monotonic() - checked > 1.0:
                checked = time.monotonic()
                # the scheduler's own list of workers (client.nthreads asks it; the
                # client's scheduler_info may answer from a cache)
                if not set(addresses) <= set(client.nthreads()):
                    raise collective.Aborted("a member's worker left")
        return results[members[0].key]

    MEMBER_TIMEOUT = 600.0  # s a member waits for another's statistics before it gives up

    def _graph_epoch(self, box, plan, coef, intercept, slack):
        """Submit one pass over the blocks and the coarse step as a single graph
        (:class:`_Graph`); wait only for the blocks' steps. ``box`` holds the margins,
        taken out here so that only the stages reading them keep them. Returns the state
        after it (a future after a coarse step: the certificate's gather fetches it); the
        margins are let go, the certificate makes them afresh."""
        rows = _Graph(self, box.pop())
        # θ at the start of the epoch, sent to each worker once (a task, not scattered
        # data: a copy lost with a worker is recomputed); a block's task reads its slice.
        start = self.runtime.submit(ops.held, (coef, intercept), name="epoch_start")
        state, unsure = block_steps(
            plan, (coef, intercept), slack, self.problem, self.source.n_samples, rows, start
        )
        self.unsure = set(unsure)
        if not self.coarse:
            return state
        row_sums = self.row_sums
        if self.problem.l1 > 0.0:  # the non-zero coefficients move; S over them, read afresh
            row_sums = self._active_row_sums(state["coef"])
        return coarse_step(
            rows, self.problem, self.source.n_samples, self.coarse_space, state, row_sums
        )

    # A block whose statistics (_stats_bytes) would weigh more than this in the one task
    # that sums them is summed in a tree of tasks, on a grid of more than INLINE_GROUPS row
    # chunks: a choice of the grid alone, never of the workers (the same bits on any
    # cluster). See "Wide blocks over many row chunks" in docs/engines/block_scd.md.
    TREE_BYTES = 32 * 2**20

    def _tree(self, block) -> bool:
        if block is None or self.source.n_row_chunks <= ClusterRuntime.INLINE_GROUPS:
            return False
        return _stats_bytes(self.source, block) > self.TREE_BYTES

    _support = _active = None  # the support S was last read for, and that S (Rows)

    def _active_row_sums(self, coef):
        """S over the non-zero coefficients: a pass over the cells, made again only when
        the support changed since the last one (late epochs of an L1 fit keep it)."""
        support = np.asarray(coef) != 0.0
        if self._support is None or not np.array_equal(support, self._support):
            self._active = self.runtime.map_rows(
                block_coarse.active_row_sums,
                (self.cells,),
                coef,
                self.offsets,
                self.problem.fit_intercept,
            )
            self._support = support
        return self._active


class _Graph(RowChunks):
    """The row chunks of :class:`_BlockSCD` for :func:`block_loop.block_steps`, as a task
    graph: every stage one task per group of row chunks (:meth:`ClusterRuntime.map_rows`),
    every reduction summing the row chunks' parts in order inside the task that reads
    them (:meth:`ClusterRuntime.inline_reduce`), or in a tree of tasks for a Gram block's
    matrices and a wide block's statistics over many row chunks. Nothing waits but the
    gather of the steps. ``margins`` (:class:`~dask_scd.runtime.cluster.Rows`) are
    rebound stage by stage: each stage's are released once read."""

    def __init__(self, engine: _BlockSCD, margins):
        self.engine, self.runtime, self.margins = engine, engine.runtime, margins

    def column(self, p) -> list:
        cells = self.engine.cells
        return [
            None if p.block is None else cells[r][p.b]
            for r in range(self.engine.source.n_row_chunks)
        ]

    def stats(self, p, pending):
        runtime, engine, cells = self.runtime, self.engine, self.column(p)
        loss, labels = engine.problem.loss, engine.labels
        if pending is None:
            return runtime.map_rows(ops.block_stats, (cells, labels, self.margins), loss, p.gram)
        # The step of the previous block is applied by the task that computes the next
        # block's statistics (one stage fewer per block) ...
        last, step = self.column(pending[0]), pending[1]
        if engine._tree(p.block):
            # ... but not a wide block's: a fused task's statistics live as long as its
            # margins (one result), i.e. through the line search.
            self.margins = runtime.map_rows(ops.apply_step, (self.margins, last), step)
            return runtime.map_rows(ops.block_stats, (cells, labels, self.margins), loss, p.gram)
        fused = runtime.map_rows(
            ops.apply_then_stats, (self.margins, last, cells, labels), step, loss, p.gram
        )
        self.margins = fused.item(0)
        return fused.item(1)

    def reduce(self, func, fixed: tuple, partials, tree: bool):
        if tree:
            return self.runtime.submit(func, *fixed, *self.runtime.tree_sum(partials))
        return self.runtime.inline_reduce(func, fixed, partials)

    def with_margins(self, func, per_row, *shared):
        return self.runtime.map_rows(func, (per_row, self.engine.labels, self.margins), *shared)

    def reduce_in_task(self, func, fixed: tuple, partials=None):
        return self.engine._reduce(func, fixed, partials)

    def kept(self, step):
        return self.runtime.evaluate(step)

    def resolved(self, steps: list) -> list:
        return self.runtime.gather(steps)

    def apply(self, pending):
        last = self.column(pending[0])
        self.margins = self.runtime.map_rows(ops.apply_step, (self.margins, last), pending[1])
