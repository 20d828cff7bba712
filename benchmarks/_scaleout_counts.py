"""What a fit on a distributed cluster moves and waits for, counted epoch by epoch.

Four recorders, all read after the fit so that counting sends no message during it:

- **wire**: every message a process writes on a TCP comm (``distributed.comm.tcp.TCP.
  write``, its return value: the bytes of the frames, headers included), with the comm's
  two addresses and the time; installed in this process (client, scheduler and nannies
  of a LocalCluster) and in every worker. Both ends of every connection are known
  afterwards (each process reports its own addresses), so every byte is assigned a
  writer and a reader: client, scheduler or worker. Worker-to-worker bytes are dask's
  transfers of task results and the collective epochs' exchanges alike.
- **stages**: the exchanges of a collective epoch's members
  (:class:`dask_scd.runtime.collective.Member`, one per ``exchange`` / ``gather`` /
  ``broadcast``), timed in each worker.
- **tasks**: a scheduler plugin (the scheduler of a LocalCluster lives in this process)
  recording every task that finished: its compute seconds (the worker's startstops), its
  depth among the tasks of the same epoch (1 + its deepest dependency's), its worker.
- **driver**: the client's blocking calls (``Client.sync``: gather, result, run,
  scheduler_info, ...) made from the fitting thread, and the block engine's waits for a
  collective epoch's members, which poll the futures' states instead of calling sync
  (the worker checks made while it waits are "poll", off the critical path).

Epoch boundaries are the fit's ``callback`` (:class:`EpochMarks`), which also reads every
worker process's CPU time (psutil, no message).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import cloudpickle

# The worker-side functions below travel by value (the workers need not import this file).
cloudpickle.register_pickle_by_value(__import__(__name__))


def install_counters(dask_worker=None) -> bool:
    """Patch TCP.write and Member._next_key in this process to record their events
    (idempotent). State lives on the patched modules, so that a function sent by value
    finds it again."""
    from distributed.comm import tcp

    from dask_scd.runtime import collective

    if not hasattr(tcp, "_scaleout_wire"):
        wire, original = [], tcp.TCP.write
        tcp._scaleout_wire = wire

        async def write(self, msg, serializers=None, on_error="message"):
            n = await original(self, msg, serializers=serializers, on_error=on_error)
            wire.append((time.time(), self.local_address, self.peer_address, n))
            return n

        tcp.TCP.write = write
    if not hasattr(collective, "_scaleout_stages"):
        stages, next_key = [], collective.Member._next_key
        collective._scaleout_stages = stages

        def counted(self, sender):
            stages.append((time.time(), self.token, self.index))
            return next_key(self, sender)

        collective.Member._next_key = counted
    return True


def take_events(dask_worker=None) -> dict:
    """This process's recorded events since the last call (then forgotten), its pid and,
    in a worker, its listening address."""
    import os

    from distributed.comm import tcp

    from dask_scd.runtime import collective

    wire, stages = tcp._scaleout_wire, collective._scaleout_stages
    out = {
        "pid": os.getpid(),
        "address": None if dask_worker is None else dask_worker.address,
        "wire": list(wire),
        "stages": list(stages),
    }
    del wire[:], stages[:]
    return out


# ------------------------------------------------------------------ the scheduler's side


def task_recorder():
    """A SchedulerPlugin recording every finished task (see the module docstring)."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    class TaskRecorder(SchedulerPlugin):
        name = "scaleout-task-recorder"

        def __init__(self):
            self.epoch = 0
            self.records = []  # (time, epoch, prefix, worker, compute s, depth)
            self._depth = {}  # key -> (epoch, depth)
            self.scheduler = None

        async def start(self, scheduler):
            self.scheduler = scheduler

        def transition(self, key, start, finish, *args, **kwargs):
            if not (start == "processing" and finish == "memory"):
                if finish in ("released", "forgotten"):
                    self._depth.pop(key, None)
                return
            ts = self.scheduler.tasks.get(key)
            deps = [] if ts is None else [d.key for d in ts.dependencies]
            depth = 1 + max(
                [d for e, d in (self._depth.get(k, (-1, 0)) for k in deps) if e == self.epoch],
                default=0,
            )
            self._depth[key] = (self.epoch, depth)
            compute = sum(
                s["stop"] - s["start"]
                for s in kwargs.get("startstops", ())
                if s.get("action") == "compute"
            )
            prefix = key if isinstance(key, str) else str(key[0] if key else key)
            prefix = prefix.split("-", 1)[0]
            self.records.append(
                (time.time(), self.epoch, prefix, kwargs.get("worker"), compute, depth)
            )

    return TaskRecorder()


# --------------------------------------------------------------------- the driver's side


class DriverRecorder:
    """The client's blocking calls from the fitting thread, and the engine's waits for
    a collective epoch's members: ``(time at the end, what, seconds)``."""

    def __init__(self, client):
        self.client, self.calls, self.thread = client, [], threading.get_ident()
        self._sync = client.sync
        self._await = None

    def __enter__(self):
        waiting = self._waiting = [False]

        def sync(func, *args, **kwargs):
            began = time.time()
            try:
                return self._sync(func, *args, **kwargs)
            finally:
                if threading.get_ident() == self.thread:
                    name = getattr(func, "__name__", str(func)).lstrip("_")
                    if waiting[0] and name == "update_scheduler_info":
                        # the members' wait checks every second that their workers are
                        # still there: while it waits, not on the critical path
                        name = "poll"
                    self.calls.append((time.time(), name, time.time() - began))

        self.client.sync = sync
        from dask_scd.engines.block import block_scd

        self._await = original = block_scd._BlockSCD._await_members
        calls = self.calls

        def await_members(engine, *args, **kwargs):
            began = time.time()
            waiting[0] = True
            try:
                return original(engine, *args, **kwargs)
            finally:
                waiting[0] = False
                calls.append((time.time(), "members", time.time() - began))

        block_scd._BlockSCD._await_members = await_members
        return self

    def __exit__(self, *exc):
        from dask_scd.engines.block import block_scd

        del self.client.sync  # the instance attribute; the class's method again
        block_scd._BlockSCD._await_members = self._await
        return False


@dataclass
class EpochMarks:
    """The fit's ``callback``: the time of every epoch's end, the CPU seconds of every
    worker process and of this one (client, scheduler, nannies) then; tells the task
    recorder which epoch its tasks belong to. ``stop_after``: stop the fit then."""

    worker_pids: list
    recorder: object
    stop_after: int | None = None
    times: list = field(default_factory=list)
    worker_cpu: list = field(default_factory=list)
    main_cpu: list = field(default_factory=list)

    def start(self):
        """Mark the fit's start (epoch 0)."""
        self._mark()

    def _mark(self):
        import psutil

        self.times.append(time.time())
        cpu = []
        for pid in self.worker_pids:
            t = psutil.Process(pid).cpu_times()
            cpu.append(t.user + t.system)
        self.worker_cpu.append(cpu)
        self.main_cpu.append(time.process_time())

    def __call__(self, info) -> bool:
        self._mark()
        self.recorder.epoch = int(info["epoch"])
        return self.stop_after is not None and info["epoch"] >= self.stop_after


# ----------------------------------------------------------------- bytes, by who and whom


def address_roles(processes: list, client_locals: set, scheduler: str, main_pid: int) -> dict:
    """Every address seen in the wire events → "client", "scheduler" or "worker:<i>".

    ``processes``: :func:`take_events`' results (the workers' with their address, this
    process's with None); ``client_locals``: the local addresses of the client's own
    connections (the rest of this process's are the scheduler's and the nannies')."""
    roles = {scheduler: "scheduler"}
    for i, proc in enumerate(processes):
        if proc["address"] is not None:
            roles[proc["address"]] = f"worker:{i}"
    for i, proc in enumerate(processes):
        for _, local, _, _ in proc["wire"]:
            if local in roles:
                continue
            if proc["pid"] == main_pid:
                roles[local] = "client" if local in client_locals else "scheduler"
            else:
                roles[local] = f"worker:{i}"
    return roles


def split_bytes(processes: list, roles: dict, bounds: list) -> list:
    """Per interval of ``bounds`` (times), the bytes written between roles: a dict with
    "w2w" (worker to worker), "to_client", "from_client", "worker_sched" (both ways),
    "w2w_messages" and "in_by_worker" (bytes each worker read from the others)."""
    out = [defaultdict(int) for _ in range(len(bounds) - 1)]
    for proc in processes:
        for t, local, peer, n in proc["wire"]:
            k = _interval(bounds, t)
            if k is None:
                continue
            a, b = roles.get(local, "?"), roles.get(peer, "?")
            row = out[k]
            if a.startswith("worker") and b.startswith("worker"):
                row["w2w"] += n
                row["w2w_messages"] += 1
                row["in:" + b] += n
            elif b == "client":
                row["to_client"] += n
            elif a == "client":
                row["from_client"] += n
            elif {a.split(":")[0], b.split(":")[0]} == {"worker", "scheduler"}:
                row["worker_sched"] += n
    return [dict(r) for r in out]


def _interval(bounds: list, t: float):
    for k in range(len(bounds) - 1):
        if bounds[k] <= t < bounds[k + 1]:
            return k
    return None


def client_addresses(client) -> set:
    """The local addresses of the client's connections to the scheduler."""
    comms = [client.scheduler_comm.comm] if client.scheduler_comm is not None else []
    pool = client.rpc
    for held in (pool.available, pool.occupied):
        for comms_of_address in held.values():
            comms.extend(comms_of_address)
    return {c.local_address for c in comms if c is not None}


async def ping(target: str, n: int, dask_worker=None) -> float:
    """(on a worker, by ``client.run``) the median seconds of an rpc ``identity`` to the
    worker at ``target``, the connection made before timing."""
    import statistics

    await dask_worker.rpc(target).identity()
    times = []
    for _ in range(n):
        began = time.perf_counter()
        await dask_worker.rpc(target).identity()
        times.append(time.perf_counter() - began)
    return statistics.median(times)
