"""The loop of the block engines: select → reduce → update → certify, one epoch at a time.

Block SCD on the cluster (:mod:`block_scd`), block SCD in memory (:mod:`block_memory`)
and block Newton (:mod:`block_newton`) run the same loop, :meth:`BlockLoop.run`, and fill
in how an epoch is computed (:meth:`BlockLoop._first`, :meth:`BlockLoop._next`). The
epoch of block SCD is :func:`block_steps` over the blocks of a plan
(:meth:`BlockLoop._plan`), then :func:`coarse_step`; a variant says only how its row
chunks compute and reduce (:class:`RowChunks`), so every variant takes the same steps,
the same bits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dask_scd.engines.base import Run
from dask_scd.engines.block import block_coarse
from dask_scd.engines.block import block_ops as ops
from dask_scd.engines.block.block_ops import INTERCEPT
from dask_scd.result import History
from dask_scd.runtime import passes
from dask_scd.runtime.checkpoint import EpochHooks


@dataclass(frozen=True)
class BlockPlan:
    """What the epoch does with one block: the same decisions for both ways of running it."""

    b: int  # the block (block_ops.INTERCEPT for the intercept)
    block: slice | None  # its columns in grid order, None for the intercept
    pure: bool
    gram: bool  # an impure block small enough for the exact Newton step of its Gram matrix
    tree: bool  # statistics summed in a tree of tasks (a Gram block, or a wide one)
    provable: bool  # a final step without a line search
    trials: bool  # a line search follows the direction


def plan_blocks(order, slices, purity, loss: str, gram_max: int, provable, tree) -> list:
    """What an epoch does with each block of ``order``, in that order (a
    :class:`BlockPlan` each): ``provable(b, pure)`` says whether block b takes a provable
    step, ``tree(block)`` whether its statistics are summed in a tree."""
    plan = []
    for b in order:
        pure = b == INTERCEPT or purity[b]
        block = None if b == INTERCEPT else slices[b]
        # An impure block small enough takes the exact Newton step of its Gram matrix.
        gram = not pure and (1 if block is None else block.stop - block.start) <= gram_max
        sure = provable(b, pure)
        plan.append(
            BlockPlan(
                b,
                block,
                pure,
                gram,
                gram or tree(block),
                sure,
                not (sure or (pure or gram) and loss == "squared"),
            )
        )
    return plan


@dataclass
class Certified:
    """A certified state: (θ, b), its certificate, and ``carry``: what the next epoch
    starts from besides them (block SCD's margins, block Newton's next state)."""

    coef: np.ndarray
    intercept: float
    certificate: object
    carry: object = None


class BlockLoop:
    """The loop of a block engine (:meth:`run`) and what its epochs share: the block order
    and its plan.

    A variant sets ``problem``, ``rng``, ``progress``, ``n_columns`` (θ's length),
    ``slices``, ``purity``, ``order`` (a :class:`~dask_scd.runtime.strategies.BlockOrder`),
    ``gram_max``, ``bounded`` and ``warm``, and fills in :meth:`_first`, :meth:`_next` and :meth:`_label_stats`.
    """

    warm = None  # a warm start (θ in the engine's column order, b), or None for a cold one
    records_start = False  # whether the start's certificate is an iteration (block Newton)

    # -- what a variant fills in ----------------------------------------------------

    def _first(self, state: dict, final: bool) -> Certified:
        """The certificate of the start ``state`` ({"coef", "intercept"}); ``final``: no
        epoch follows."""
        raise NotImplementedError

    def _next(self, point: Certified, final: bool) -> Certified:
        """One epoch from ``point``, certified; ``final``: the last one of the fit."""
        raise NotImplementedError

    def _label_stats(self) -> list:
        """Every row chunk's :func:`block_ops.label_stats`, in row order."""
        raise NotImplementedError

    def _done(self, point: Certified, tol: float) -> bool:
        """Whether the fit stops at ``point``."""
        return not point.certificate.relative_gap > tol

    def _original_order(self, coef) -> np.ndarray:
        """θ in the original feature order."""
        raise NotImplementedError

    # -- the loop -------------------------------------------------------------------

    def run(self, tol, max_iter, hooks: EpochHooks) -> Run:
        """Certify the start, then run epochs until :meth:`_done` or ``max_iter``; θ of
        the Run in the original feature order, its extras for the variant to fill in."""
        self.tol = tol
        coef, intercept, epoch, history = self._start(hooks)
        began = time.perf_counter() - (history.seconds[-1] if len(history) else 0.0)
        point = self._first({"coef": coef, "intercept": intercept}, epoch >= max_iter)
        done, stopped = self._done(point, tol), False
        if self.records_start:
            stopped = self._record(epoch, point, history, began, hooks, done)
        while not (done or stopped) and epoch < max_iter:
            epoch += 1
            point = self._next(point, epoch >= max_iter)
            done = self._done(point, tol)
            stopped = self._record(epoch, point, history, began, hooks, done)
        return Run(
            self._original_order(point.coef),
            point.intercept,
            point.certificate,
            epoch,
            history,
            stopped_by_callback=stopped,
        )

    def _start(self, hooks: EpochHooks) -> tuple:
        """(θ, b, epoch, history) to start from: a checkpoint's, a warm start, or θ = 0
        with the best intercept for it."""
        saved = hooks.load(self.rng)
        if saved is not None:
            self.unsure = set(saved.get("engine", {}).get("unsure", []))
            return saved["coef"], saved["intercept"], saved["epoch"], saved["history"]
        if self.warm is not None:
            return self.warm[0], self.warm[1], 0, History()
        intercept = self._initial_intercept() if self.problem.fit_intercept else 0.0
        bounds = self.problem.bounds  # in the engine's column order: its start nearest 0
        coef = np.zeros(self.n_columns) if bounds is None else bounds.start()
        return coef, intercept, 0, History()

    def _record(self, epoch, point: Certified, history, began, hooks, done) -> bool:
        """History, progress, checkpoint and callback after an epoch; True: the callback
        asked to stop."""
        cert = point.certificate
        history.append(epoch, cert.relative_gap, cert.primal, time.perf_counter() - began)
        self.progress.update(epoch, cert.relative_gap, cert.primal)
        return hooks.after_epoch(
            epoch,
            point.coef,
            point.intercept,
            cert,
            history,
            self.rng,
            done,
            self._original_order,
            {"unsure": sorted(self.unsure)},
        )

    def _initial_intercept(self) -> float:
        """The best intercept for θ = 0: a cheap exact start from per-row-chunk label counts."""
        total = passes.sum_partials(*self._label_stats())
        return ops.intercept_at_zero(
            self.problem.loss, float(total["n"][0]), float(total["sum"][0]), float(total["pos"][0])
        )

    # -- select: the blocks of an epoch and what is done with each ------------------

    unsure: set = frozenset()  # blocks whose last step was unsure (see _provable)

    def _block_order(self, cert) -> list:
        """The blocks of the next epoch, the intercept among them at a random place."""
        order = self._chosen(self.order.order(len(self.slices), cert, self.rng), cert)
        if self.problem.fit_intercept:
            order.insert(int(self.rng.integers(len(order) + 1)), INTERCEPT)
        return order

    def _chosen(self, order: list, cert) -> list:
        """The blocks of ``order`` this epoch updates (a residency policy's): all."""
        return order

    def _plan(self, order) -> list:
        """What the epoch does with each block of ``order``, in that order."""
        return plan_blocks(
            order,
            self.slices,
            self.purity,
            self.problem.loss,
            self.gram_max,
            self._provable,
            self._tree,
        )

    def _provable(self, b, pure: bool) -> bool:
        """Whether block ``b`` takes a provable step (no line search) this epoch: a pure
        block under the unweighted logistic loss whose last step was sure, i.e. took
        every coordinate's full Newton step (:func:`block_ops.provable_steps`). A block
        whose step was cut, or whose trials had to try a coordinate, runs the trials
        until a step of it is sure again: the line search is kept where it can take more
        than the bound proves, and skipped (one stage fewer per block) where the bound
        already proves the full step. The choice depends on the iterates alone, never
        on the workers."""
        return self.bounded and pure and b not in self.unsure

    def _tree(self, block) -> bool:
        """Whether the statistics of ``block`` are summed in a tree of tasks: no."""
        return False


class RowChunks:
    """How a variant of block SCD computes over its row chunks, for :func:`block_steps`:
    the statistics of a block after the last block's step, a function of every row
    chunk's margins, the reduction of their partial results, and the last step on the
    margins."""

    def stats(self, p, pending):
        """Every row chunk's statistics of block ``p`` (a :class:`BlockPlan`), after the
        step ``pending`` = (plan, step) of the block before (None: the first)."""
        raise NotImplementedError

    def column(self, p) -> list:
        """Block ``p``'s cells per row chunk, as :meth:`with_margins` reads ``per_row``
        (None for the intercept)."""
        raise NotImplementedError

    def reduce(self, func, fixed: tuple, partials, tree: bool):
        """``func(*fixed, *partials)``, the partials in row order (``tree``: a variant that
        sums a block's statistics in a tree of tasks sums them so)."""
        return func(*fixed, *partials)

    def with_margins(self, func, per_row, *shared):
        """Every row chunk's ``func(per_row[r], labels[r], margins[r], *shared)`` in row
        order (a direction's trials, ``per_row`` its cells; the coarse step's statistics
        and trials, ``per_row`` its S)."""
        raise NotImplementedError

    def reduce_in_task(self, func, fixed: tuple, partials=None):
        """``func(*fixed, *partials)`` (a variant on the cluster: in one task of its own)."""
        return func(*fixed, *(partials or ()))

    def kept(self, step):
        """A block's step as :meth:`resolved` reads it."""
        return step

    def resolved(self, steps: list) -> list:
        """The steps' values."""
        return steps

    def apply(self, pending):
        """The last step on the margins."""
        raise NotImplementedError


def block_steps(plan, start, slack, problem, n_samples, rows: RowChunks, first=None):
    """One pass over the blocks of ``plan`` from ``start`` = (θ, b): per block the
    statistics (reduce), the direction, the line search where the plan has one (reduce),
    the step (update). Returns (the state after the steps, the blocks whose step was
    unsure). ``first``: what the tasks read the start from (default ``start``)."""
    steps, pending = [], None
    fixed = start if first is None else first
    for p in plan:
        stats = rows.stats(p, pending)
        step = direction = rows.reduce(
            ops.block_direction_from,
            (problem, n_samples, fixed, p.block, p.provable),
            stats,
            p.tree,
        )
        if p.trials:
            trials = rows.with_margins(ops.block_trials, rows.column(p), direction, problem, p.pure)
            step = rows.reduce(ops.block_choose, (direction, n_samples, slack), trials, p.tree)
        pending = (p, step)
        steps.append(rows.kept(step))
    if pending is not None:
        rows.apply(pending)
    steps = rows.resolved(steps)
    unsure = [int(p.b) for p, step in zip(plan, steps) if step.get("unsure", 0)]
    state = ops.state_after(
        start[0], start[1], [(p.block, step["theta"]) for p, step in zip(plan, steps)]
    )
    return state, unsure


def coarse_step(rows: RowChunks, problem, n_samples, space, state, row_sums):
    """A Newton step on the subspace of whole-block shifts (+ intercept) from ``state``
    after :func:`block_steps` on ``rows``: the curvature of the loss on it from every row
    chunk's margins (reduce), the small problem solved with the penalty exactly
    (:func:`dask_scd.engines.coarse.coarse_newton`), and for a non-quadratic loss a line
    search keeping it a descent step (reduce). ``space``: the coarse space
    (:class:`block_coarse.CoarseSpace` or the blocks' offsets); ``row_sums``: S per row
    chunk. Coordinate descent is slow along directions its coordinates only see together
    (on one-hot data, a whole field against the intercept or another field): this step
    takes them. Returns the new state {"coef", "intercept"}."""
    loss, fixed = problem.loss, (problem, n_samples, space, state)
    stats = rows.with_margins(block_coarse.coarse_stats, row_sums, loss)
    direction = rows.reduce_in_task(block_coarse.coarse_direction, fixed, stats)
    if loss == "squared":
        return rows.reduce_in_task(block_coarse.coarse_apply, (*fixed, direction))
    trials = rows.with_margins(block_coarse.coarse_trials, row_sums, direction, loss)
    return rows.reduce_in_task(block_coarse.coarse_apply, (*fixed, direction), trials)
