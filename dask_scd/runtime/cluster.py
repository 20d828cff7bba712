"""The cluster runtime of the dask engines: where tasks run, how they are named, how
partial results are summed, the certificate.

Everything here is independent of *which* block an engine updates and of what stays in
fast memory (those are strategies, :mod:`dask_scd.runtime.strategies`). It keeps the
engines' three invariants:

- every task of row chunk r runs on r's *home* worker (loosely: a lost worker's chunks
  run elsewhere), so margins never move between workers;
- every sum over row chunks runs in row-chunk order, in groups fixed by the number of
  row chunks alone, so the model is the same bits whatever the workers;
- tasks are named cheaply and uniquely (no tokenizing of large arguments).
"""

from __future__ import annotations

import contextlib
import operator
import os
import threading
import uuid

from dask_scd.runtime import passes


@contextlib.contextmanager
def fit_client(client):
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
    with (
        LocalCluster(
            processes=False,
            n_workers=1,
            threads_per_worker=os.cpu_count() or 1,
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as local,
    ):
        yield local


STALE_HOMES = "dask-scd-stale-homes"


def _stale_homes_plugin():
    """A scheduler plugin: when a worker joins, tasks waiting for a worker ("no-worker")
    whose named workers have all left, and which may run elsewhere
    (``allow_other_workers``), lose their restrictions, so the newcomer takes them.

    Without it such a task waits forever: when every worker of a cluster left at once
    (jobs reaching their lifetime together, a cancelled allocation), the scheduler gives
    its no-worker tasks to a newcomer only if the newcomer is one of their named workers,
    loose restrictions or not. The class is made here so that it is pickled by value: a
    scheduler without dask_scd installed loads it too.
    """
    from distributed.diagnostics.plugin import SchedulerPlugin

    class StaleHomes(SchedulerPlugin):
        name = STALE_HOMES
        idempotent = True  # registered once per scheduler, whatever the number of fits
        scheduler = None

        async def start(self, scheduler):
            self.scheduler = scheduler

        @staticmethod
        def _released(ts, scheduler) -> bool:
            """Lift a stale task's restrictions; whether it was one."""
            stale = bool(
                ts.loose_restrictions
                and ts.worker_restrictions
                and not any(a in scheduler.workers for a in ts.worker_restrictions)
            )
            if stale:
                ts.worker_restrictions = set()
                ts.loose_restrictions = False
            return stale

        def add_worker(self, scheduler, worker):  # runs before the no-worker tasks move
            for ts in list(scheduler.unrunnable):
                self._released(ts, scheduler)

        def transition(self, key, start, finish, *args, **kwargs):
            # A task that reaches no-worker while a newcomer registers (the scheduler
            # awaits its plugins between adding the worker and moving the no-worker
            # tasks) misses add_worker above: release it here, and move it once this
            # transition is over. Released also while no worker runs: a newcomer
            # registered but not yet running takes the no-worker tasks when its status
            # changes, by their restrictions, which add_worker had no task to clear
            # (a rare hang under load: the task waited for ever).
            scheduler = self.scheduler
            if finish != "no-worker" or scheduler is None:
                return
            ts = scheduler.tasks.get(key)
            if ts is not None and self._released(ts, scheduler) and scheduler.running:
                scheduler.loop.add_callback(self._move, key)

        def _move(self, key):
            scheduler = self.scheduler
            ts = scheduler.tasks.get(key)
            if ts is not None and ts.state == "no-worker" and scheduler.running:
                scheduler.transitions({key: "processing"}, stimulus_id=f"stale-homes-{key}")

    return StaleHomes()


def _register(client, plugin, name: str) -> bool:
    """Register ``plugin`` on the client's cluster. Returns False where it could not be
    registered (an old or unreachable cluster: the fit runs without it)."""
    try:
        client.register_plugin(plugin, name=name)
    except Exception:
        return False
    return True


def release_stale_homes(client) -> bool:
    """Register the :func:`_stale_homes_plugin` on the client's scheduler."""
    return _register(client, _stale_homes_plugin(), STALE_HOMES)


CACHE_RELIEF = "dask_scd-cache-relief"


def _cache_relief_plugin():
    """A worker plugin: every 250 ms, while the worker is paused, its cell cache gives
    memory back (:meth:`~dask_scd.data.cache.CellCache.relieve`); and dask's spilling is
    held off while it cannot help (:func:`spill_helps`), restored when it can and when
    the plugin is removed."""
    from distributed import WorkerPlugin
    from distributed.core import Status
    from tornado.ioloop import PeriodicCallback

    class CacheRelief(WorkerPlugin):
        idempotent = True  # registered once per cluster, whatever the number of fits

        def setup(self, worker):
            from dask_scd.data.cache import CACHE

            manager = worker.memory_manager
            self.spill = manager.memory_spill_fraction  # the worker's own setting

            def check():
                if worker.status == Status.paused:
                    CACHE.relieve()
                if self.spill is not False:
                    helps = spill_helps(worker, CACHE, self.spill)
                    manager.memory_spill_fraction = self.spill if helps else False

            callback = PeriodicCallback(check, 250)
            worker.periodic_callbacks[CACHE_RELIEF] = callback
            callback.start()

        def teardown(self, worker):
            callback = worker.periodic_callbacks.pop(CACHE_RELIEF, None)
            if callback is not None:
                callback.stop()
            worker.memory_manager.memory_spill_fraction = self.spill

    return CacheRelief()


def spill_helps(worker, cache, spill_fraction) -> bool:
    """Whether dask's spilling can bring ``worker`` below its target: not while the cell
    cache holds cells and the memory outside dask's data is alone above the target.

    Above its spill threshold dask moves the worker's results to disk until the process
    is below its target, all of them if it must; out of core, the cells a fit reads and
    keeps (outside dask's data) hold the process above it whatever is spilled, so every
    margin and statistic a task made was written to disk and read back by the next
    (~3 s of a 15 s pass on a grid 3x its 640 MiB workers). The pause threshold and the
    cache's relief still bound the process.
    """
    manager = worker.memory_manager
    fast = getattr(worker.data, "fast", None)
    managed = getattr(fast, "total_weight", None)
    if not manager.memory_limit or managed is None or not cache.holds_cells:
        return True
    target = (manager.memory_target_fraction or spill_fraction) * manager.memory_limit
    return worker.monitor.get_process_memory() - managed <= target


def relieve_paused_workers(client) -> bool:
    """Register :func:`_cache_relief_plugin` on the client's workers (present and
    future)."""
    return _register(client, _cache_relief_plugin(), CACHE_RELIEF)


def _tune_malloc(dask_worker=None) -> bool:
    """(on a worker, by ``client.run``, when a fit starts) :func:`collective.tune_malloc`,
    and the cell cache's budget renewed where a relief lowered it (``CellCache.renew``)."""
    from dask_scd.data.cache import CACHE
    from dask_scd.runtime.collective import tune_malloc

    CACHE.renew()
    return tune_malloc()


class Rows:
    """Per-row-chunk values held as one future per group of row chunks (a list each, in
    row order): what :meth:`ClusterRuntime.map_rows` returns and takes.

    ``pick``: where a stage returns a tuple per row chunk (a fused stage), the element
    these Rows stand for, taken inside the task that reads them (no task of its own).
    """

    __slots__ = ("parts", "pick")

    def __init__(self, parts: list, pick: int | None = None):
        self.parts = parts
        self.pick = pick

    def item(self, i: int) -> Rows:
        """Element ``i`` of every row chunk's tuple."""
        return Rows(self.parts, i)


def picked(values, pick):
    """``values``, or element ``pick`` of each (where not None): a fused stage's
    element, taken inside the task that reads it."""
    return values if pick is None else [value[pick] for value in values]


def _run_rows(func, picks: tuple, *args) -> list:
    """(task) ``func`` on each row chunk of a group: ``args[:len(picks)]`` are lists with
    one value per row chunk of the group (element ``picks[k]`` of each, where not None),
    the rest shared (an inline reduction among them computed here, once)."""
    n_per_row = len(picks)
    per_row = [picked(a, p) for a, p in zip(args[:n_per_row], picks)]
    shared = [_resolved(a) for a in args[n_per_row:]]
    return [func(*row, *shared) for row in zip(*per_row)]


def _call_on_rows(func, n_fixed: int, pick, *args):
    """(task) ``func(*fixed, *results)``, the groups' results flattened in row order."""
    fixed, groups = [_resolved(a) for a in args[:n_fixed]], args[n_fixed:]
    return func(*fixed, *picked([value for group in groups for value in group], pick))


# ------------------------------------------------------------------ inline reductions
#
# A reduction whose result only the next stage's tasks read need not be a task of its
# own: every task of that stage receives the row chunks' parts (a handful of groups, the
# parts compact) and sums them itself, in row-chunk order, so each gets the same bits.
# A block iteration then waits for one transfer per reduction instead of two (parts to a
# reducing task, its result back to every row chunk) and for one task fewer. A worker
# remembers what it computed (by the reduction's unique token), so its later tasks and
# the engine's own copy of the result (:meth:`ClusterRuntime.evaluate`) reuse it.

_INLINE = "dask_scd.inline-reduction"  # the tag of a reduction spec (a plain tuple, so
# that dask finds the futures inside it)
MEMO_BYTES = 24 * 2**20  # per worker process: what the inline reductions may keep (a
# block's direction and step are read by the next two tasks; the largest block's are ~15 MB)
_memo: dict = {}
_memo_lock = threading.Lock()


def _nbytes(value) -> int:
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    return int(getattr(value, "nbytes", 64))


def _resolved(arg):
    """An argument as the task uses it: an inline reduction's spec is computed (or taken
    from this worker's memo); anything else is itself."""
    if not (isinstance(arg, tuple) and len(arg) == 6 and arg[0] == _INLINE):
        return arg
    _, token, func, fixed, pick, groups = arg
    with _memo_lock:
        if token in _memo:
            value = _memo.pop(token)
            _memo[token] = value  # most recently used last
            return value
    value = _call_on_rows(func, len(fixed), pick, *fixed, *groups)
    with _memo_lock:
        _memo[token] = value
        total = sum(_nbytes(v) for v in _memo.values())
        while total > MEMO_BYTES and len(_memo) > 1:
            total -= _nbytes(_memo.pop(next(iter(_memo))))
    return value


def _sum_picked(index, pick, *groups) -> dict:
    """(task) :func:`passes.sum_partials` of the row-chunk results at ``index`` (pairs of
    group, position in it), in that order."""
    return passes.sum_partials(*picked([groups[g][i] for g, i in index], pick))


class ClusterRuntime:
    """Submitting a fit's tasks to a ``distributed.Client``.

    Parameters
    ----------
    client : distributed.Client
    n_row_chunks : int
    pin : bool
        Place row chunks on home workers (a grid); a dask array's chunks already live
        where dask persisted them.
    """

    # A group's task holds a few vectors of each of its rows and the partial sums of
    # each of its row chunks at once: at most this many rows per group (more groups than
    # worker threads where a grid is large), so that a worker's memory does not scale
    # with its share of the grid.
    GROUP_ROWS = 1_048_576

    def __init__(self, client, n_row_chunks: int, pin: bool, row_counts=None):
        self.client = client
        self.n_row_chunks = n_row_chunks
        self.pin = pin
        self.row_counts = None if row_counts is None else [int(k) for k in row_counts]
        self._fit_token, self._n_submitted = uuid.uuid4().hex, 0
        self.groups = self._make_groups()
        self.homes = [None] * n_row_chunks
        self.group_homes = [None] * len(self.groups)
        if pin:
            release_stale_homes(client)
        with contextlib.suppress(Exception):  # a speed-up only (see tune_malloc)
            client.run(_tune_malloc)
        relieve_paused_workers(client)
        self.assign_homes()

    def _slots(self) -> list:
        """One entry per thread of every worker (its address), in address order."""
        workers = self.client.scheduler_info()["workers"]
        return [
            address
            for address in sorted(workers)
            for _ in range(max(1, int(workers[address].get("nthreads", 1))))
        ]

    def _make_groups(self) -> list:
        """Row chunks run in groups, one task per group and stage: contiguous runs, one per
        worker thread (a grid), fixed for the fit; a dask array's chunks one by one.

        A task's fixed cost on the scheduler (~2 ms) is paid once per group instead of once
        per row chunk. Every row chunk's result is still computed on its own and the sums
        run over row chunks in order (:meth:`reduce`), so the model does not depend on
        the grouping, hence on the workers.
        """
        R = self.n_row_chunks
        if not self.pin:
            return [[r] for r in range(R)]
        slots = max(1, len(self._slots()))
        G = min(slots, R)
        if self.row_counts is not None:
            G = max(G, -(-sum(self.row_counts) // self.GROUP_ROWS))
            # A multiple of the worker threads: the groups are dealt to them in runs,
            # and 13 groups on 2 workers gave one of them 27 row chunks of 50, which
            # the other waited for at every stage.
            G = min(R, -(-G // slots) * slots)
        return [[r for r in range(R) if r * G // R == g] for g in range(G)]

    def assign_homes(self):
        """Each group of row chunks → one worker thread (its "home"), in contiguous runs.

        Every task of a group asks for its home (``allow_other_workers=True``: a lost
        worker's groups go elsewhere until the next call reassigns them), so the
        stages of a block iteration are balanced, the margins never move between workers
        and each worker caches only its own cells. Placement never changes the model
        (every task is deterministic).
        """
        R, G = self.n_row_chunks, len(self.groups)
        self.homes = [None] * R
        self.group_homes = [None] * G
        if not self.pin:
            return
        slots = self._slots()
        if len(slots) > 1:
            self.group_homes = [slots[g * len(slots) // G] for g in range(G)]
            for g, rows in enumerate(self.groups):
                for r in rows:
                    self.homes[r] = self.group_homes[g]

    def submit(self, func, *args, name: str | None = None, **kwargs):
        """Submit a task under a cheap unique key (prefixed ``name``, default the function's).

        ``client.submit`` would otherwise tokenize every argument (problem, θ, cell
        references) to name the task: ~600 times per epoch, on the cores the scheduler
        needs.
        """
        self._n_submitted += 1
        key = f"{name or func.__name__}-{self._fit_token}-{self._n_submitted}"
        return self.client.submit(func, *args, key=key, **kwargs)

    def submit_row(self, r, func, *args, name: str | None = None, **kwargs):
        """Submit a task of row chunk r on its home worker."""
        return self.submit(func, *args, name=name, **self._placement(self.homes[r]), **kwargs)

    def gather(self, futures):
        return self.client.gather(futures)

    def map_rows(self, func, per_row: tuple, *shared, priority: int = 0) -> Rows:
        """``func(*row_args, *shared)`` for every row chunk, one task per group.

        ``per_row`` holds, per argument, either a list with one value per row chunk (cells,
        labels) or :class:`Rows` (results of an earlier :meth:`map_rows`); ``shared``
        arguments (futures too) are the same for every row chunk. Returns :class:`Rows`.
        ``priority``: dask's (higher runs first among a worker's ready tasks).
        """
        parts = []
        picks = tuple(a.pick if isinstance(a, Rows) else None for a in per_row)
        for g, rows in enumerate(self.groups):
            args = [a.parts[g] if isinstance(a, Rows) else [a[r] for r in rows] for a in per_row]
            task = self.submit(
                _run_rows,
                func,
                picks,
                *args,
                *shared,
                name=func.__name__,
                priority=priority,
                **self._placement(self.group_homes[g]),
            )
            parts.append(task)
        return Rows(parts)

    def reduce(self, func, fixed: tuple, rows: Rows):
        """One task ``func(*fixed, *results in row-chunk order)``: the results of every row
        chunk, flattened from their groups in order, so the sums keep the same bits
        whatever the grouping."""
        return self.submit(
            _call_on_rows, func, len(fixed), rows.pick, *fixed, *rows.parts, name=func.__name__
        )

    # Inline reductions beyond this many groups would send every group's parts to every
    # task (groups² transfers): a reducing task is cheaper there.
    INLINE_GROUPS = 8

    def inline_reduce(self, func, fixed: tuple, rows: Rows):
        """:meth:`reduce`, computed inside the tasks that take the result (see "inline
        reductions" above): a spec to pass as a shared argument of :meth:`map_rows`, or
        in ``fixed`` of a :meth:`reduce` / another inline reduction. Where the row chunks
        run in more than :attr:`INLINE_GROUPS` groups, an ordinary reducing task."""
        if len(rows.parts) > self.INLINE_GROUPS:
            return self.reduce(func, fixed, rows)
        self._n_submitted += 1
        token = f"{func.__name__}-{self._fit_token}-{self._n_submitted}"
        return (_INLINE, token, func, tuple(fixed), rows.pick, list(rows.parts))

    def evaluate(self, value):
        """A future of an inline reduction's value (a low-priority task: the value is
        usually in the memo of the worker that runs it), or ``value`` if it is a future."""
        if not (isinstance(value, tuple) and value and value[0] == _INLINE):
            return value
        return self.submit(_resolved, value, name=value[2].__name__, priority=-10)

    def _placement(self, home) -> dict:
        return {} if home is None else {"workers": [home], "allow_other_workers": True}

    def tree_sum(self, partials, split_every=4):
        """:func:`passes.tree_sum` of row-chunk results (a list of futures or
        :class:`Rows`), each run summed in a task on the home of its first row chunk,
        where most of its parts already are.

        One task receiving all R partials at once would hold all of them (R Gram
        matrices of |B|² can exceed a small worker). The first level of :class:`Rows`
        takes each run from the groups holding it (the same bits as summing per-row
        futures).
        """

        def combine(start, run):
            return self.submit_row(start, passes.sum_partials, *run, priority=1)

        if not isinstance(partials, Rows):
            return passes.tree_sum(partials, split_every, combine)

        def first(start, run):
            needed = sorted({g for g, _ in run})
            index = [(needed.index(g), i) for g, i in run]
            groups = [partials.parts[g] for g in needed]
            return self.submit_row(
                start, _sum_picked, index, partials.pick, *groups, name="sum_partials", priority=1
            )

        where = [(g, i) for g, rows in enumerate(self.groups) for i in range(len(rows))]
        return passes.tree_sum(where, split_every, combine, first)

    def certify(self, problem, n_samples, cells, labels, rows, offsets, state):
        """Fresh margins from the state (θ, b) and the duality-gap certificate on them.

        ``cells[r]`` are row chunk r's cells (all blocks), ``state`` a dict {"coef",
        "intercept"} or a future of one: the whole chain is submitted at once and the
        client waits once, for (θ, b) and the certificate together. Returns (margins as
        :class:`Rows`, (coef, intercept, certificate)).
        """
        # One task per group makes the margins and the statistics (a cell read once);
        # the margins then become a result of their own, so the statistics are released
        # as soon as they are summed rather than kept with the margins for an epoch.
        fused = self.map_rows(
            passes.certificate_pass,
            (cells, [int(k) for k in rows], labels),
            state,
            offsets,
            problem,
            True,
        )
        # The margins apart and the first sums run as soon as their parts exist (a
        # higher priority than the next group's pass), and nothing here keeps the
        # fused results: else a worker held every row chunk's statistics (~10 MB each
        # on a 600k-column one-hot grid) until the last was made, and paused.
        margins = self.map_rows(operator.getitem, (fused,), 0, priority=1)
        # Per-feature sums of every row chunk: summed in a tree (what one task holds is
        # bounded), the same bits whatever the workers.
        level = self.tree_sum(fused.item(1))
        del fused
        total = level[0] if len(level) == 1 else self.submit(passes.sum_partials, *level)
        del level
        dual = self.map_rows(passes.dual_loss_sum, (labels, margins), problem, total, n_samples)
        result = self.reduce(passes.certificate, (problem, n_samples, state, total), dual).result()
        return margins, (result["coef"], float(result["intercept"]), result["certificate"])

    def run_on_rows(self, func, *args) -> list:
        """``func(r, *args)`` on the home of every row chunk; the results in row order."""
        return self.gather([self.submit_row(r, func, r, *args) for r in range(self.n_row_chunks)])
