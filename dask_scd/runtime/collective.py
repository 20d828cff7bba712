"""Exchanges between long-running tasks, worker to worker, without the scheduler.

A block-SCD epoch as a task graph is one stage of tasks per block: every block waits for
the scheduler to start the next stage's tasks and for the statistics to move between
workers through it, ~25 ms on a small cluster where the arithmetic of a block takes a
few. An epoch run *collectively* is one long task per worker (a "member"), and the members
exchange each block's partial statistics directly: a member sends its part to the others
over the workers' own connections (a handler of this module, :func:`register`) and waits
for theirs in a mailbox. Each member then sums all the parts in row-chunk order itself,
the same bits as the task graph.

Nothing here decides what is exchanged; :mod:`dask_scd.engines.block.block_collective` does.
A member that waits too long, or whose exchange the client aborted (a worker was lost),
raises :class:`Aborted`, and the engine runs that epoch as a task graph instead.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

HANDLER = "dask_scd_mail"

_box: dict = {}  # (token, stage, member) -> the member's part
_aborted: dict = {}  # tokens of aborted exchanges (as keys, oldest first), at most
ABORTED_KEPT = 1024  # this many: a member waits on one of the exchanges just aborted
_cond = threading.Condition()


class Aborted(RuntimeError):
    """A collective exchange that cannot finish: a member was lost, or waited too long."""


def _deliver(key: tuple, value) -> None:
    with _cond:
        if key[0] not in _aborted:
            _box[key] = value
        _cond.notify_all()


async def _mail(key=None, payload=None):
    """(worker handler) a part sent by another member."""
    _deliver(tuple(key), payload)


def register(dask_worker=None) -> bool:
    """(on a worker, by ``client.run``) install the mailbox's handler; idempotent."""
    dask_worker.handlers[HANDLER] = _mail
    return True


def abort(token: str, dask_worker=None) -> bool:
    """(on a worker, by ``client.run``) abort the exchange ``token``: its waiting members
    raise :class:`Aborted`, its parts are dropped."""
    with _cond:
        _aborted[token] = None
        while len(_aborted) > ABORTED_KEPT:  # the oldest: no member still waits on it
            del _aborted[next(iter(_aborted))]
        for key in [k for k in _box if k[0] == token]:
            del _box[key]
        _cond.notify_all()
    return True


# glibc's mallopt parameters (malloc.h): M_TRIM_THRESHOLD, M_MMAP_THRESHOLD.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 4 * 2**20  # blocks below this come from the heap
TRIM_THRESHOLD = 64 * 2**20  # free heap kept at its top before it is returned
_DEFAULT_MMAP_THRESHOLD = 128 * 2**10
_malloc_tuned = False


def tune_malloc() -> bool:
    """In a worker process that dask's nanny started with ``MALLOC_TRIM_THRESHOLD_`` (its
    default, 64 KiB, to hand memory back to the OS), glibc keeps its mmap threshold at
    128 KiB: every array of a row chunk's length (a 62,500-row chunk's margins are
    500 KB) is then a fresh mmap, zero-filled page by page, and freed with munmap. A
    member allocates such arrays for every block; measured on the 500k Criteo-like grid
    (2 worker processes) an iteration took 1.0 s so and 0.72 s with the threshold raised.
    This raises the mmap threshold to 4 MiB and the trim threshold to 64 MiB, once per
    process (memory above them is still returned to the OS). Under a memory limit both
    are scaled down with it (the trim threshold at most 1/32 of the limit, the mmap
    threshold 1/16 of that): the free memory glibc then keeps is unmanaged memory, and
    with 64 MiB kept a 640 MiB worker out of core sat above dask's pause threshold and
    stalled. Returns whether it did; nothing happens off glibc or without that
    variable."""
    global _malloc_tuned
    if _malloc_tuned or "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        return False
    _malloc_tuned = True
    trim, mmap = malloc_thresholds(_memory_limit())
    if mmap <= _DEFAULT_MMAP_THRESHOLD:
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return (
            libc.mallopt(_M_MMAP_THRESHOLD, mmap) == 1
            and libc.mallopt(_M_TRIM_THRESHOLD, trim) == 1
        )
    except (OSError, AttributeError):
        return False


def malloc_thresholds(memory_limit: int | None) -> tuple[int, int]:
    """(trim threshold, mmap threshold) in bytes for a worker of ``memory_limit`` bytes
    (None or 0: no limit)."""
    trim = TRIM_THRESHOLD if not memory_limit else min(TRIM_THRESHOLD, memory_limit // 32)
    return trim, min(MMAP_THRESHOLD, trim // 16)


def _memory_limit() -> int | None:
    try:
        from distributed import get_worker

        return get_worker().memory_manager.memory_limit
    except (ImportError, ValueError, AttributeError):
        return None


class Member:
    """One member of an exchange, inside its task: ``addresses[i]`` is member i's worker
    (None for the one member of a cluster of one worker thread, which runs anywhere)."""

    def __init__(self, token: str, index: int, addresses: list, timeout: float = 600.0):
        from distributed import get_worker

        self.token, self.index, self.addresses = token, index, list(addresses)
        self.timeout = timeout
        self.worker = get_worker()
        tune_malloc()
        self.stage = 0
        self.waited = 0.0  # seconds spent waiting for the other members' parts
        self._sent = []
        if self.addresses[index] is not None and self.worker.address != self.addresses[index]:
            # The task moved: its worker was lost and the scheduler ran it elsewhere. The
            # other members cannot be met again here: the engine reruns the epoch.
            raise Aborted(
                f"member {index} runs on {self.worker.address}, not on {self.addresses[index]}"
            )

    def exchange(self, part):
        """Send ``part`` to every other member and return every member's part, in member
        order (``part`` itself at this member's place)."""
        key = self._next_key(self.index)
        self._send_others(key, part)
        return self._collect(key, part)

    def gather(self, part, root: int = 0):
        """Every member's part at member ``root`` (a list in member order); None at the
        others."""
        key = self._next_key(self.index)
        if self.index != root:
            self._send(root, key, part)
            return None
        return self._collect(key, part)

    def broadcast(self, value=None, root: int = 0):
        """Member ``root``'s ``value`` at every member."""
        key = self._next_key(root)
        if self.index != root:
            return self._receive(key)
        self._send_others(key, value)
        return value

    def _send_others(self, key: tuple, part):
        for i in range(len(self.addresses)):
            if i != self.index:
                self._send(i, key, part)

    def _collect(self, key: tuple, part) -> list:
        """Every member's part of ``key``'s stage, in member order (``part``: this one's)."""
        return [
            part if i == self.index else self._receive((key[0], key[1], i))
            for i in range(len(self.addresses))
        ]

    def _next_key(self, sender: int) -> tuple:
        self.stage += 1
        return (self.token, self.stage - 1, sender)

    def _send(self, i: int, key: tuple, part):
        from distributed.protocol import to_serialize

        address = self.addresses[i]
        if address == self.worker.address:  # another member in this worker
            _deliver(key, part)
            return
        coro = self.worker.rpc(address).dask_scd_mail(key=list(key), payload=to_serialize(part))
        self._sent.append(asyncio.run_coroutine_threadsafe(coro, self.worker.loop.asyncio_loop))

    def _receive(self, key):
        began = time.monotonic()
        try:
            return self._wait_for(key)
        finally:
            self.waited += time.monotonic() - began

    def _wait_for(self, key):
        deadline = time.monotonic() + self.timeout
        with _cond:
            while key not in _box:
                if self.token in _aborted:
                    raise Aborted(f"exchange {self.token} aborted")
                self._check_sent()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Aborted(
                        f"member {self.index} waited {self.timeout:.0f} s for "
                        f"member {key[2]} at stage {key[1]}"
                    )
                _cond.wait(min(left, 0.5))
            return _box.pop(key)

    def _check_sent(self):
        done = [f for f in self._sent if f.done()]
        for f in done:
            self._sent.remove(f)
            if f.exception() is not None:
                raise Aborted(f"member {self.index} could not send: {f.exception()!r}")

    def close(self):
        """Wait for this member's sends to finish (their errors raise)."""
        for f in self._sent:
            try:
                f.result(timeout=self.timeout)
            except Exception as e:  # noqa: BLE001 - any failure of a send aborts
                raise Aborted(f"member {self.index} could not send: {e!r}") from e
        self._sent = []
