"""Threads for the in-memory kernels' long passes.

The numba kernels release the GIL (``nogil=True``), so a pass over many lines can be cut
into ranges run on several threads. Only passes whose ranges are independent are cut
(each line's result written by one range), so a threaded pass gives the very bits of the
single-threaded one, on any number of cores. A pass runs on one thread when it is short,
or when it is called from a thread other than the main one: a fit inside a Dask worker,
or in a user's thread pool, already has its parallelism.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# Environment variables that cap the threads (the smallest set wins): our own, and
# numba's, which a process limiting its libraries to one thread sets with OpenMP's and
# BLAS's (make bench-peers does).
THREAD_LIMITS = ("DASK_SCD_NUM_THREADS", "NUMBA_NUM_THREADS")


def _threads() -> int:
    """Cores this process may run on, at most 8 (the passes are memory-bound beyond
    that), capped by :data:`THREAD_LIMITS` where set to a positive integer."""
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    for name in THREAD_LIMITS:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            cores = min(cores, int(value))
    return max(1, min(8, cores))


THREADS = _threads()
# Stored entries below which a pass stays on one thread (a hand-off costs ~0.1 ms).
MIN_ENTRIES = 1_000_000

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _forget_pool() -> None:
    """In a forked child the parent's pool threads do not exist: start a fresh pool."""
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def usable(entries: float) -> int:
    """Threads for a pass over ``entries`` stored entries, called from this thread."""
    if THREADS == 1 or entries < MIN_ENTRIES:
        return 1
    if threading.current_thread() is not threading.main_thread():
        return 1
    return THREADS


def run_all(calls: list) -> list:
    """Call every callable; their results in order. The calls are cut into one run of
    consecutive calls per thread (at most :data:`THREADS`): the first run on this thread,
    the others on the pool. (Handing the pool every call but the first left four parts on
    two threads at 1 + 3: a pass took ¾ of its one-thread time, not ½.)"""
    if len(calls) <= 1 or THREADS == 1:
        return [call() for call in calls]
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=max(THREADS - 1, 1), thread_name_prefix="dask_scd-pass"
            )
    cuts = np.linspace(0, len(calls), min(THREADS, len(calls)) + 1).astype(np.int64)
    runs = [calls[lo:hi] for lo, hi in zip(cuts[:-1], cuts[1:])]
    jobs = [_pool.submit(_in_turn, run) for run in runs[1:]]
    first = _in_turn(runs[0])
    return first + [value for job in jobs for value in job.result()]


def _in_turn(calls: list) -> list:
    return [call() for call in calls]


def line_ranges(indptr, n_lines: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` ranges [lo, hi) of lines with about equal stored entries (``indptr`` of
    a sparse matrix; None for dense lines, all of one length)."""
    parts = max(1, min(parts, n_lines))
    if parts == 1:
        return [(0, n_lines)] if n_lines > 0 else []
    if indptr is None:
        cuts = np.array(_even_cuts(0.0, float(n_lines), parts)).astype(np.int64)
    else:
        targets = _even_cuts(float(indptr[0]), float(indptr[n_lines]), parts)
        cuts = np.searchsorted(indptr[: n_lines + 1], targets)
        cuts[0], cuts[-1] = 0, n_lines
        cuts = np.maximum.accumulate(cuts)
    return [(int(lo), int(hi)) for lo, hi in zip(cuts[:-1], cuts[1:]) if hi > lo]


def _even_cuts(start: float, stop: float, parts: int) -> list[float]:
    """``np.linspace(start, stop, parts + 1)`` as a list, the same floats (k·step + start,
    the last one ``stop``) without numpy's dispatch, which cost more than the cuts."""
    step = (stop - start) / parts
    return [k * step + start for k in range(parts)] + [stop]
