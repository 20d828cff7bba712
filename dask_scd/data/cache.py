"""The worker cell cache: cells and labels read from a grid, kept per process.

A dask worker reads a grid's cells once and keeps them in a least-recently-used cache
bounded in bytes (:class:`ByteLRU`), sized from what the worker has left below its pause
threshold (:class:`CellCache`); a residency policy may instead pin exactly the cells it
chose (:meth:`CellCache.hold`). Nothing here knows what a cell is: an item weighs its
``nbytes``.
"""

from __future__ import annotations

import os
import threading

import zict


class ByteLRU:
    """Least-recently-used items bounded in bytes (``zict.LRU`` weighted by ``weight``).

    Counts the bytes of every insertion (``bytes_moved``), insertions (``loads``) and
    evictions. An item heavier than the bound is not kept. Thread-safe.
    """

    def __init__(self, max_bytes: float, weight, on_evict=None):
        self._on_evict = on_evict
        self.loads = self.evictions = self.bytes_moved = 0
        self._lru = zict.LRU(max_bytes, {}, weight=lambda k, v: weight(v), on_evict=self._evicted)
        self.lock = threading.RLock()

    def _evicted(self, key, value):
        self.evictions += 1
        if self._on_evict is not None:
            self._on_evict(key, value)

    @property
    def max_bytes(self) -> float:
        return self._lru.n

    @max_bytes.setter
    def max_bytes(self, value: float):
        with self.lock:
            self._lru.n = value
            self._lru.evict_until_below_target()

    @property
    def nbytes(self) -> int:
        return int(self._lru.total_weight)

    @property
    def keys(self):
        """The resident keys, least recently used first."""
        return self._lru.order

    def lookup(self, key):
        """The value and True (marked most recently used), or (None, False)."""
        with self.lock:
            if key in self._lru:
                return self._lru[key], True
        return None, False

    def evict_oldest(self) -> int:
        """Drop the least recently used item; its bytes (0 if empty)."""
        with self.lock:
            if not len(self._lru):
                return 0
            _, _, weight = self._lru.evict()
            return int(weight)

    def discard(self, key) -> int:
        """Drop ``key`` if held (not counted as an eviction); its bytes (0 if absent)."""
        with self.lock:
            if key not in self._lru:
                return 0
            size = int(self._lru.weights[key])
            del self._lru[key]
            return size

    def insert(self, key, value, size: int):
        """Keep ``value``; the caller has made room (older items go if it has not)."""
        with self.lock:
            self._lru[key] = value
            self.loads += 1
            self.bytes_moved += size

    def clear(self):
        with self.lock:
            self._lru.clear()


class CellCache:
    """Least-recently-used cells of this process, bounded in bytes.

    A :class:`ByteLRU` (which counts the bytes it loads and
    its evictions) with a second bound. The cache is unmanaged memory: dask cannot spill
    it, and a worker whose process memory passes the pause threshold (80 % of its memory
    limit) stops running tasks. So the bound is taken from what the worker has left when
    the cache is first used — half of (pause threshold − resident memory then), the other
    half being for the tasks' own arrays — and before every insertion the resident memory
    is checked again: an insertion that would take the process past ``resident at start
    + bound`` first drops least-recently-used cells, and is skipped if that is not enough.
    """

    def __init__(self, max_bytes: int | None, ceiling: int | None = None):
        self.ceiling = ceiling  # resident bytes the process should stay under, or None
        self._lru = None if max_bytes is None else ByteLRU(max_bytes, _nbytes, self._evicted)
        self._sizing = threading.Lock()
        # Cells a residency policy holds (see hold): outside the LRU, never evicted by it.
        self._pinned: dict = {}
        self._groups: dict = {}
        self._pinning = threading.local()  # the hold running in this thread, if any
        self._recent: dict = {}  # row chunk -> (key, value): see _keep_recent
        self.pause_at = None  # resident bytes at which the worker pauses, or None
        self.relieved = False  # a relief lowered the bound (see renew)
        self.reads = 0  # loads from the store (every miss the spill did not serve)
        # The second tier (dask_scd.data.spill.Spill, or None: off), made at first use
        # from DASK_SCD_SPILL.
        self.spill = _UNSET
        self._spillable: set = set()  # keys read with spill=True

    def hold(self, group, resolve) -> dict:
        """Pin exactly the cells that ``resolve()`` reads, for ``group`` (a row chunk):
        the group's other pinned cells are released. Returns the loads and bytes this
        took (a cell already pinned costs nothing)."""
        pinning = self._pinning
        pinning.keys, pinning.loads, pinning.bytes = set(), 0, 0
        try:
            resolve()
            keep = pinning.keys
        finally:
            pinning.keys = None
        for key in self._groups.get(group, set()) - keep:
            self._pinned.pop(key, None)
        self._groups[group] = keep
        return {"loads": pinning.loads, "bytes": pinning.bytes}

    @property
    def max_bytes(self) -> int | None:
        return None if self._lru is None else self._lru.max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int):
        if self._lru is None:
            self._lru = ByteLRU(value, _nbytes, self._evicted)
        else:
            self._lru.max_bytes = value

    def get(self, key, load, read: bool = True, spill: bool = False):
        """The value of ``key``: held, else ``load()`` (a read from the store, counted
        in :attr:`reads` where ``read``) and kept if there is room. ``spill``: a value
        the LRU has no room for goes to the second tier (:mod:`dask_scd.data.spill`),
        from which a later miss reads it back instead of loading it."""
        with self._sizing:
            if self._lru is None:
                # Sized at first use, inside a task: at import time (while a task is being
                # unpacked) the worker and its memory limit are not reachable yet.
                bound, self.ceiling, self.pause_at = _cache_budget()
                self._lru = ByteLRU(bound, _nbytes, self._evicted)
            if spill and self.spill is _UNSET:
                from dask_scd.data.spill import from_environment

                self.spill = from_environment()
        pinning = getattr(self._pinning, "keys", None)
        if key in self._pinned:
            if pinning is not None:
                pinning.add(key)
            return self._pinned[key]
        lru = self._lru
        value, hit = lru.lookup(key)
        if pinning is not None:
            value = value if hit else load()
            self._pinned[key] = value
            pinning.add(key)
            self._pinning.loads += 1
            self._pinning.bytes += _nbytes(value)
            return value
        if hit:
            return value
        value, hit = self._last_read(key)
        if hit:
            return value
        second = self.spill if spill else None
        value = None if second is None else second.get(key)
        if value is None:
            value = load()
            self.reads += int(read)
        if second is None:
            self._keep(key, value)
            return value
        self._spillable.add(key)  # spilled when the LRU has no room, or evicts it
        if not self._keep(key, value, recent=False):
            # Spilled, it is not kept as its row chunk's last read as well: read back
            # from the file costs less than the memory (out of core a worker sits near
            # its pause threshold).
            group = _group(key)
            if second.put(key, value):
                self._recent.pop(group, None)
            else:
                self._keep_recent(group, key, value, _nbytes(value))
        return value

    def _evicted(self, key, value):
        """A value the LRU drops goes to the spill file if it may (a fit's first cells
        fill the cache, then make room for the others: out of core they were read from
        the store again)."""
        if key in self._spillable and self._second is not None:
            self._second.put(key, value)

    @property
    def _second(self):
        """The spill file (:class:`~dask_scd.data.spill.Spill`), or None: off, or not
        made yet."""
        return None if self.spill is _UNSET else self.spill

    def _last_read(self, key) -> tuple:
        """(value, True) where ``key`` is its row chunk's last read (see _keep_recent)."""
        recent = self._recent.get(_group(key))
        if recent is not None and recent[0] == key:
            return recent[1], True
        return None, False

    def lookup(self, key) -> tuple:
        """(value, True) where ``key`` is held (pinned, cached or the row chunk's last
        read), else (None, False); nothing is read."""
        if key in self._pinned:
            return self._pinned[key], True
        if self._lru is not None:
            value, hit = self._lru.lookup(key)
            if hit:
                return value, True
        return self._last_read(key)

    def drop(self, key) -> int:
        """Forget ``key`` (cached or its row chunk's last read): a form of a cell that
        another has replaced. Returns the bytes dropped from the LRU."""
        if self._last_read(key)[1]:
            self._recent.pop(_group(key), None)
        return 0 if self._lru is None else self._lru.discard(key)

    def keep(self, key, value, spill: bool = False):
        """Cache ``value``, read by the caller, as :meth:`get` would have after reading it
        (not counted as a read again)."""
        self.get(key, lambda: value, read=False, spill=spill)

    def _keep(self, key, value, recent: bool = True) -> bool:
        """Cache ``value`` if the LRU has room; returns whether it did (else, where
        ``recent``, it is kept as its row chunk's last read, if at all)."""
        lru = self._lru
        size = _nbytes(value)
        with lru.lock:
            if key not in lru.keys and size <= lru.max_bytes and self._make_room(size):
                lru.insert(key, value, size)
                if size:  # (a marker of no bytes, "not pure", is not the last read)
                    self._recent.pop(_group(key), None)
                return True
            if recent:
                self._keep_recent(_group(key), key, value, size)
            return False

    def _keep_recent(self, group, key, value, size: int):
        """Keep the last cell read for a row chunk that the LRU had no room for: the next
        stages of the same block iteration read it again (statistics, line search, apply),
        so a grid larger than the cache is still decoded once per pass. It replaces the
        row chunk's previous one. Kept while the row chunks' last reads take at most an
        eighth of the pause threshold, or while the process stays below 90 % of it: out
        of core a worker sits near its threshold, and reading every cell twice a pass
        costs more time than one cell per row chunk costs memory."""
        self._recent.pop(group, None)
        if self.pause_at is not None and _resident_bytes() + size > 0.9 * self.pause_at:
            held = sum(_nbytes(v) for _, v in self._recent.values())
            if held + size > self._allowance:
                return
        self._recent[group] = (key, value)

    def has_room(self, held: int = 0) -> bool:
        """May a task that holds ``held`` bytes of cells beyond the cache keep one more
        for a while? True where the process knows no pause threshold, else while it
        stays below 80 % of it (the rest is for the tasks' own arrays), and always for
        the first eighth of the threshold: a task that keeps one row chunk's cells for
        a second pass costs that much at most, while reading them again costs a pass
        over the store (out of core the process sits above 80 % most of the time)."""
        if self.pause_at is None or held <= self._allowance:
            return True
        return _resident_bytes() < 0.8 * self.pause_at

    @property
    def _allowance(self) -> int:
        """Bytes of cells kept beyond the cache whatever the process holds (the row
        chunks' last reads; a task's cells for its second pass): an eighth of the pause
        threshold. Measured on a grid 3x its workers' memory, 1/16 read more cells and
        took longer, 1/4 was no faster."""
        return self.pause_at // 8

    def _make_room(self, size: int) -> bool:
        """Drop old cells until ``size`` more bytes fit the bound and the process ceiling."""
        lru = self._lru
        excess = lru.nbytes + size - lru.max_bytes
        if self.ceiling is not None:
            excess = max(excess, _resident_bytes() + size - self.ceiling)
        while excess > 0 and lru.nbytes:
            excess -= lru.evict_oldest()
        return excess <= 0

    @property
    def _items(self):
        """The cached keys, least recently used first."""
        return () if self._lru is None else self._lru.keys

    @property
    def nbytes(self) -> int:
        return 0 if self._lru is None else self._lru.nbytes

    @property
    def holds_cells(self) -> bool:
        """Whether any cell is held: cached, pinned, or a row chunk's last read."""
        return bool(self.nbytes or self._pinned or self._recent)

    _bytes = nbytes

    def relieve(self) -> int:
        """Called while the worker is paused (its process memory above the pause
        threshold): its tasks wait, so nothing else will free memory, and a fit would
        wait for ever. Drops the row chunks' last reads and least-recently-used cells
        until the process is 10 % below the threshold, returns the freed heap to the OS,
        and lowers the cache's bound to what is left and its ceiling to that target, so
        that it does not fill up to the same point again. Pinned cells stay. Returns the
        bytes dropped."""
        lru = self._lru
        if self.pause_at is None or lru is None:
            return 0
        target = int(0.9 * self.pause_at)
        excess = _resident_bytes() - target
        if excess <= 0:
            return 0
        with lru.lock:
            dropped = sum(_nbytes(value) for _, value in self._recent.values())
            self._recent.clear()
            while dropped < excess and lru.nbytes:
                dropped += lru.evict_oldest()
            lru.max_bytes = lru.nbytes
            self.ceiling = target if self.ceiling is None else min(self.ceiling, target)
            self.relieved = True
        release_free_memory()
        return dropped

    def renew(self) -> bool:
        """At a fit's start, in a worker whose cache a relief lowered (:meth:`relieve`):
        its bound and ceiling from what the worker has left now, so that one fit that
        ran short of memory does not leave the next ones with a cache of nothing.
        Returns whether it did."""
        if not self.relieved or self._lru is None:
            return False
        bound, ceiling, pause_at = _cache_budget(held=self._lru.nbytes)
        with self._lru.lock:
            self._lru.max_bytes = bound
            self.ceiling, self.pause_at, self.relieved = ceiling, pause_at, False
        return True

    @property
    def counts(self) -> dict:
        """Bytes loaded into the cache, loads and evictions since the process started."""
        lru, spill = self._lru, self._second
        return {
            **{
                k: 0 if lru is None else getattr(lru, k)
                for k in ("bytes_moved", "loads", "evictions")
            },
            "reads": self.reads,
            "spill_hits": 0 if spill is None else spill.hits,
            "spill_bytes": 0 if spill is None else spill.nbytes,
        }

    def clear(self):
        self._recent.clear()
        if self._lru is not None:
            self._lru.clear()
        self._spillable.clear()
        if self._second is not None:
            self._second.close()


_UNSET = object()


def release_free_memory() -> bool:
    """Hand the free memory of the C heap back to the OS (glibc's ``malloc_trim``):
    arrays just dropped leave the process's resident memory, which is what dask's pause
    and resume read. False off glibc."""
    try:
        import ctypes

        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def _group(key):
    """The row chunk of a cell's key, (kind, path, grid, version, row chunk): see
    ``CellRef.key``; any other key is its own."""
    return key[:5] if isinstance(key, tuple) else key


def _nbytes(value) -> int:
    return getattr(value, "nbytes", 0)


def _resident_bytes() -> int:
    """This process's resident set size: read from /proc/self/statm where there is one
    (~3 µs; psutil's Process().memory_info() costs ~50 µs, and the cache asks at every
    cell out of core), else from psutil."""
    global _statm
    pid = os.getpid()
    if _statm is None or _statm[0] != pid:  # a forked child reads its own file
        try:
            _statm = (pid, os.open("/proc/self/statm", os.O_RDONLY))
        except OSError:
            _statm = (pid, None)
    if _statm[1] is not None:
        try:
            return int(os.pread(_statm[1], 128, 0).split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            pass
    import psutil

    return psutil.Process().memory_info().rss


_statm = None  # (pid, descriptor of its /proc/self/statm)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _cache_budget(held: int = 0) -> tuple[int, int | None, int | None]:
    """(bound in bytes, resident-memory ceiling, pause threshold in bytes) for this
    process's cell cache, which holds ``held`` bytes now (not counted as used).

    In a dask worker with a memory limit: half of what is left below the pause threshold
    (or the terminate threshold, or the limit) after the memory already resident, and the
    ceiling ``resident + bound`` or 85 % of the threshold, whichever is higher. Outside
    a worker, or without a limit: 1 GiB, no ceiling.
    """
    try:
        from distributed import get_worker

        manager = get_worker().memory_manager
        limit = manager.memory_limit
    except (ImportError, ValueError, AttributeError):
        return 1 << 30, None, None
    if not limit:
        return 1 << 30, None, None
    fraction = manager.memory_pause_fraction or manager.memory_terminate_fraction or 1.0
    resident = _resident_bytes() - held
    pause_at = int(fraction * limit)
    bound = max(0, int(0.5 * (pause_at - resident)))
    # The ceiling leaves room for the tasks' own arrays, but not twice: where they take
    # more than the other half (a worker holding many row chunks' margins), a ceiling of
    # resident + bound emptied the cache of a worker far below its pause threshold (13M
    # rows on 5.5 GiB workers: 8,178 cells read where 700 fit), so it is at least 85 %
    # of the threshold; a worker that pauses all the same gets memory back (relieve).
    return bound, max(resident + bound, int(0.85 * pause_at)), pause_at


CACHE = CellCache(None)
