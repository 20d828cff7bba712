"""A block-SCD iteration run collectively: one long task per worker (a *member*) over all
of its groups of row chunks, instead of a stage of tasks per block that waits for the
scheduler (:meth:`_BlockSCD._graph_epoch`).

The members swap each block's statistics directly (:mod:`dask_scd.runtime.collective`)
and call the very functions the task graph calls on the same values in the same row-chunk
order (its trees of sums summed locally, :func:`passes.tree_sum`), so the epoch, the
coarse step and the certificate (:func:`_certify`) give the same bits either way. A member
keeps its fresh margins in its worker process for the next iteration and returns nothing
a task reads, so no lineage holds a member: a lost member, or margins not where a member
expects them, make the engine run the iteration as a task graph from (θ, b), as it does
where a block's statistics are too large to send to every member. See "One iteration as
one task per worker" in ``docs/engines/block_scd.md``.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from dask_scd.data.cells import CellRef
from dask_scd.engines.block import block_coarse
from dask_scd.engines.block import block_ops as ops
from dask_scd.engines.block.block_loop import RowChunks, block_steps, coarse_step
from dask_scd.runtime import passes
from dask_scd.runtime.cluster import picked
from dask_scd.runtime.collective import Aborted, Member


def epoch_member(
    token: str,
    index: int,
    addresses: list,
    groups: list,
    margins,
    pick,
    cells: list,
    labels: list,
    start,
    plan: list,
    problem,
    n_samples: int,
    slack: float,
    timeout: float,
    coarse=None,
    certify=None,
) -> dict | None:
    """(task) One member's share of a collective iteration: the epoch, the coarse step,
    then the certificate with the next iteration's margins.

    ``groups``: the indices of this member's groups of row chunks; ``margins[k]`` the
    margins of group k (a list per row chunk, element ``pick`` of each where not None),
    or ``margins`` None: those this worker kept from the iteration ``certify[3]``, and
    ``start`` None: the state that iteration certified, kept with them; ``cells[k][i]``
    row chunk i of group k's cells (one per block), ``labels[k][i]`` its labels;
    ``coarse``: None (no coarse step) or (fit key, the :class:`block_coarse.CoarseSpace`,
    row sums per group or None to take them over the non-zero coefficients);
    ``certify``: None, or (fit key, rows of each row chunk per group, offsets, the token
    of the iteration whose margins to read or None, ``slim``: None, or the tolerance
    above which the certificate returned leaves out what only a final one needs (see
    :func:`_slimmed`), ``resend``: None to send the statistics whole, else whether to
    send their fixed parts again (see :class:`_StaticParts`)).

    Returns, from member 0 only (every member computes the same): {"state": (θ, b) after
    the iteration, "unsure": the blocks whose step was unsure, "certified": the
    certificate's result (:func:`passes.certificate`) with ``certify``}; the other
    members None. A member that cannot meet the others, or lacks the margins it should
    have kept, returns {"aborted": why} (not an error: the engine runs the iteration as a
    task graph).
    """
    try:
        member = Member(token, index, addresses, timeout)
        if margins is None:
            pick = None
            margins = [
                list(_kept_value(certify, g, f"the margins of group {g} are not kept here"))
                for g in groups
            ]
        if start is None:
            start = _kept_value(
                certify, "state", "the state of the last iteration is not kept here"
            )
        began = time.perf_counter()
        static = (
            None
            if certify is None or certify[5] is None
            else _StaticParts(certify[0], addresses, problem.loss, certify[5])
        )
        with _GroupPool(member.worker, len(groups)) as each:
            rows = [list(picked(m, pick)) for m in margins]
            rows = _MemberRows(member, each, groups, rows, cells, labels, problem, static)
            state, unsure = block_steps(plan, start, slack, problem, n_samples, rows)
            if coarse is not None:
                fit_key, space, row_sums = coarse
                if row_sums is None:  # S over the non-zero coefficients
                    row_sums = _active_row_sums(
                        each,
                        fit_key,
                        groups,
                        cells,
                        state["coef"],
                        space.offsets,
                        problem.fit_intercept,
                    )
                state = coarse_step(rows, problem, n_samples, space, state, row_sums)
            epoch_done = time.perf_counter()
            certified = None
            if certify is not None:
                certified = _certify(
                    member, each, groups, cells, labels, state, problem, n_samples, certify
                )
        member.close()
        if static is not None:
            static.commit()
        timing = (epoch_done - began, time.perf_counter() - epoch_done)
    except Aborted as e:
        return {"aborted": str(e)}
    if index != 0:
        return None
    if certified is not None and certify[4] is not None:
        certified = _slimmed(certified, certify[4])
    return {
        "state": state,
        "unsure": unsure,
        "certified": certified,
        "waited": member.waited,
        "timing": timing,
    }


def _slimmed(certified: dict, slim: float) -> dict:
    """The certificate's result as the client needs it after an iteration that does not
    end the fit (relative gap above |``slim``|): without the per-feature correlation
    Xᵀa/n (warm starts and screening read a final certificate's), and without the
    coordinate gaps where ``slim`` ≥ 0 (the engine's block order and residency read
    them otherwise). Two vectors of the model's width less to send every iteration."""
    cert = certified["certificate"]
    if cert.relative_gap <= abs(slim):
        return certified
    gaps = cert.coordinate_gaps if slim < 0 else None
    return {
        **certified,
        "certificate": dataclasses.replace(cert, correlation=None, coordinate_gaps=gaps),
    }


class _GroupPool:
    """``each(fn)``: [fn(k) for every group k of a member], the groups on the worker's
    threads at once (the kernels release the GIL); each group's arithmetic is the same
    whichever thread runs it."""

    def __init__(self, worker, n_groups: int):
        threads = int(getattr(getattr(worker, "state", None), "nthreads", 1) or 1)
        self.n_groups = n_groups
        self.pool = None
        if min(threads, n_groups) > 1:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(
                min(threads, n_groups), thread_name_prefix="dask-scd-member"
            )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    def __call__(self, fn) -> list:
        if self.pool is None:
            return [fn(k) for k in range(self.n_groups)]
        return list(self.pool.map(fn, range(self.n_groups)))


def _certify(member, each, groups, cells, labels, state, problem, n_samples, certify):
    """:meth:`ClusterRuntime.certify` among the members: fresh margins from ``state`` and
    the certificate on them, the same calls in the same order (the statistics summed at
    member 0, the dual sums too). Every member keeps its margins for the next iteration;
    member 0 returns the certificate's result."""
    fit_key, n_rows, offsets = certify[:3]
    fresh = each(
        lambda k: [
            passes.certificate_pass(cells[k][i], n_rows[k][i], y, state, offsets, problem, True)
            for i, y in enumerate(labels[k])
        ]
    )
    margins = [[f[0] for f in group] for group in fresh]
    stats = [[f[1] for f in group] for group in fresh]
    del fresh
    parts = member.gather(dict(zip(groups, stats)))
    del stats
    total = slim = None
    if parts is not None:  # member 0
        total = passes.sum_partials(*passes.tree_sum(_in_row_order(parts)))
        slim = passes.slim_total(problem, n_samples, total)
    slim = member.broadcast(slim)
    duals = each(
        lambda k: [
            passes.dual_loss_sum(y, margins[k][i], problem, slim, n_samples)
            for i, y in enumerate(labels[k])
        ]
    )
    parts = member.gather(dict(zip(groups, duals)))
    _keep_margins(fit_key, groups, member.token, margins, state)
    if parts is None:
        return None
    return passes.certificate(problem, n_samples, state, total, *_in_row_order(parts))


def _in_row_order(parts) -> list:
    """Every row chunk's value in row order from the members' {group: [values]}."""
    merged = {g: values for part in parts for g, values in part.items()}
    return [value for g in sorted(merged) for value in merged[g]]


# The margins of the running fits' last collective certificate, per group of row chunks
# held by this worker process: {(fit key, group): (iteration token, [margins per row
# chunk])}. The next iteration's member reads them here instead of from a task's result
# (a member's result in a lineage could not be recomputed on its own).
_kept: dict = {}
_kept_lock = threading.Lock()


def _keep_margins(fit_key, groups, token, margins, state):
    """Keep this member's fresh margins and the state they belong to (the next
    iteration's start: the client then sends neither)."""
    with _kept_lock:
        for g, values in zip(groups, margins):
            _kept[(fit_key, g)] = (token, values)
        _kept[(fit_key, "state")] = (token, (state["coef"], float(state["intercept"])))


def _kept_value(certify: tuple, what, missing: str):
    """What :func:`_keep_margins` kept under ``what`` (a group, or "state") for the fit
    ``certify[0]`` in the iteration ``certify[3]``; else :class:`Aborted` (``missing``)."""
    with _kept_lock:
        kept = _kept.get((certify[0], what))
    if kept is None or kept[0] != certify[3]:
        raise Aborted(missing)
    return kept[1]


class _MemberRows(RowChunks):
    """A member's groups of row chunks for :func:`block_loop.block_steps`: each group's
    on the member's threads (``each``), the partial results of every row chunk exchanged
    with the other members (in row order); a tree of sums where the task graph has one,
    summed here (:func:`passes.tree_sum`). ``rows[k][i]``: the margins of row chunk i of group k."""

    def __init__(self, member, each, groups, rows, cells, labels, problem, static):
        self.member, self.each, self.groups, self.rows = member, each, groups, rows
        self.cells, self.labels, self.problem, self.static = cells, labels, problem, static

    def column(self, p) -> list:  # per group and row chunk
        return [
            [None if p.block is None else row_cells[p.b] for row_cells in group]
            for group in self.cells
        ]

    def stats(self, p, pending):
        rows, labels, loss = self.rows, self.labels, self.problem.loss
        column = self.column(p)
        last = None if pending is None else self.column(pending[0])

        def stats_of(k):
            per_row = []
            for i, y in enumerate(labels[k]):
                if pending is None:
                    per_row.append(ops.block_stats(column[k][i], y, rows[k][i], loss, p.gram))
                else:
                    rows[k][i], s = ops.apply_then_stats(
                        rows[k][i], last[k][i], column[k][i], y, pending[1], loss, p.gram
                    )
                    per_row.append(s)
            return per_row

        return self.everyone(self.each(stats_of), column)

    def reduce(self, func, fixed: tuple, partials, tree: bool):
        return func(*fixed, *(passes.tree_sum(partials) if tree else partials))

    def with_margins(self, func, per_row, *shared):
        rows, labels = self.rows, self.labels
        return self.everyone(
            self.each(
                lambda k: [
                    func(per_row[k][i], y, rows[k][i], *shared) for i, y in enumerate(labels[k])
                ]
            )
        )

    def apply(self, pending):
        rows, last = self.rows, self.column(pending[0])
        self.rows = self.each(
            lambda k: [
                ops.apply_step(rows[k][i], last[k][i], pending[1]) for i in range(len(rows[k]))
            ]
        )

    def everyone(self, mine, column=None):
        """Every row chunk's value in row order: this member's and the others'. With
        ``column`` (the cells of a block's statistics ``mine``), the parts the others
        already hold are not sent again (:class:`_StaticParts`)."""
        member, groups, static = self.member, self.groups, self.static
        if static is None or column is None:
            return _in_row_order(member.exchange(dict(zip(groups, mine))))
        sent = {
            g: [static.strip(cell, part) for cell, part in zip(column[k], mine[k])]
            for k, g in enumerate(groups)
        }
        parts = member.exchange(sent)
        parts = [
            dict(zip(groups, mine))
            if i == member.index
            else {g: [static.restore(part) for part in values] for g, values in got.items()}
            for i, got in enumerate(parts)
        ]
        return _in_row_order(parts)


# The parts of a block's statistics that are the same in every epoch of a fit (functions
# of the cell alone): held by every member process for the others' cells, {(fit key, cell
# key): {name: value}}; and, per fit and set of members, the cells whose parts this
# process has sent to the others in an iteration that completed.
_static: dict = {}
_static_sent: dict = {}
_static_lock = threading.Lock()


class _StaticParts:
    """A block's statistics of a row chunk, as sent to the other members: their parts that
    do not change between epochs (the stored columns, Σ|x|³, and (X∘X)ᵀ1 under the
    squared loss) are sent in the first iteration of a fit only; the members keep the
    others' and put them back (:meth:`restore`), the same values. A member missing them
    (a replaced worker) ends the iteration (:class:`Aborted`: the task graph runs it)."""

    def __init__(self, fit_key, addresses, loss: str, resend: bool = False):
        self.fit_key = fit_key
        self.names = ("cols", "cube", "width", "sparse") + (("h",) if loss == "squared" else ())
        self.peers = (fit_key, tuple(addresses))
        with _static_lock:
            if resend:  # the last iteration did not complete collectively: send them all
                _static_sent.pop(self.peers, None)
            self.held = set(_static_sent.get(self.peers, ()))
        self.sending: set = set()

    def strip(self, cell, stats: dict) -> dict:
        key = getattr(cell, "key", None)
        if not isinstance(cell, CellRef) or not any(n in stats for n in self.names):
            return stats
        if key in self.held:
            return {**{k: v for k, v in stats.items() if k not in self.names}, "_held": key}
        self.sending.add(key)
        return {**stats, "_cell": key}

    def restore(self, stats: dict) -> dict:
        if "_held" in stats:
            with _static_lock:
                kept = _static.get((self.fit_key, stats["_held"]))
            if kept is None:
                raise Aborted(f"the statistics' fixed parts of {stats['_held']} are not kept here")
            return {**{k: v for k, v in stats.items() if k != "_held"}, **kept}
        if "_cell" in stats:
            kept = {k: stats[k] for k in self.names if k in stats}
            with _static_lock:
                _static[(self.fit_key, stats["_cell"])] = kept
            return {k: v for k, v in stats.items() if k != "_cell"}
        return stats

    def commit(self):
        """The iteration completed: the others hold what this member sent."""
        with _static_lock:
            _static_sent.setdefault(self.peers, set()).update(self.sending)


# S over the non-zero coefficients of the running fit, per row chunk, made again only
# where the support changed (late epochs of an L1 fit keep it): {"fit", "rows": {(g, i):
# (support, S)}}. One fit's at a time per worker process.
_active = {"fit": None, "rows": {}}
_active_lock = threading.Lock()


def _active_row_sums(each, fit_key, groups, cells, coef, offsets, with_intercept) -> list:
    support = coef != 0.0
    with _active_lock:
        if _active["fit"] != fit_key:
            _active["fit"], _active["rows"] = fit_key, {}
        held = dict(_active["rows"])

    def group(k):
        per_row = []
        for i, row_cells in enumerate(cells[k]):
            kept = held.get((groups[k], i))
            if kept is None or not np.array_equal(kept[0], support):
                kept = (
                    support,
                    block_coarse.active_row_sums(row_cells, coef, offsets, with_intercept),
                )
                with _active_lock:
                    if _active["fit"] == fit_key:
                        _active["rows"][(groups[k], i)] = kept
            per_row.append(kept[1])
        return per_row

    return each(group)


def forget_fit(fit_key, dask_worker=None) -> bool:
    """(on a worker, by ``client.run``) drop what a finished fit kept: its S, its margins."""
    with _active_lock:
        if _active["fit"] == fit_key:
            _active["fit"], _active["rows"] = None, {}
    with _kept_lock:
        for key in [k for k in _kept if k[0] == fit_key]:
            del _kept[key]
    with _static_lock:
        for table in (_static, _static_sent):
            for key in [k for k in table if k[0] == fit_key]:
                del table[key]
    return True
