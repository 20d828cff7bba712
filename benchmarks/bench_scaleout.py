"""The scale-out model of block SCD on a grid: what an epoch moves, waits for and computes
on distributed clusters of 1 to 16 worker processes, and the cost model fitted to it.

Data (generated, seeded): the Criteo-like one-hot design of ``bench_scale.py`` (26 fields,
611,438 features, 26 non-zeros per row) written as a grid of ``--row-chunks`` row chunks
by ``bench_scale.write_grid_pieces``. Problem: logistic L2, alpha = 1/n, intercept. For
each cluster size W (LocalCluster, W processes x 1 thread) and engine (``block_scd`` and
``auto`` run collectively, ``block_scd`` as a task graph), a few epochs are counted
epoch by epoch (``_scaleout_counts.py``): bytes between workers, to and from the client,
the client's blocking round trips, the exchange stages or the task graph's depth, the
tasks, the workers' and the scheduler's CPU seconds. The machine's latencies (a client
round trip, a worker-to-worker ping, a hop between dependent tasks) and the in-memory
kernels' throughput are measured too. The cost model (``_scaleout_model.py``) is fitted to
the counts and projected to a 1-billion-row grid on 64 nodes x 16 cores; see
docs/scale_out.md.

Wall time is not the measure: the machine has 2 cores, and 16 worker processes share
them. Run ``python benchmarks/bench_scaleout.py`` (10-20 minutes); see
benchmarks/README.md.
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import logging  # noqa: E402
import pickle  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _scaleout_counts as counts  # noqa: E402
import _scaleout_report as report  # noqa: E402
from _machine import load_average, print_and_append  # noqa: E402
from bench_scale import make_data, write_grid_pieces  # noqa: E402

RESULTS = HERE / "results" / "scaleout.md"
DATA = HERE / "data" / "bench_scaleout"  # gitignored (benchmarks/data/)
RAW = HERE / "data" / "bench_scaleout.pickle"  # the last run's counts (--from-raw)
WORKERS = (1, 2, 4, 8, 16)
# (label, solver, collective, extra fit options): auto above in_memory_limit, as at scale
CONFIGS = {
    "block_scd": ("block_scd", True, {}),
    "auto": ("auto", True, {"in_memory_limit": 0}),
    "graph": ("block_scd", False, {}),
}


# ------------------------------------------------------------------------ the cluster


def start_cluster(workers: int, memory_limit="2GiB"):
    """A LocalCluster of ``workers`` processes x 1 thread and its client, counters
    installed everywhere; returns (cluster, client, task recorder, worker pids)."""
    from distributed import Client, LocalCluster

    counts.install_counters()
    cluster = LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        memory_limit=memory_limit,
        dashboard_address=None,
    )
    client = Client(cluster)
    client.wait_for_workers(workers)
    client.run(counts.install_counters)
    recorder = counts.task_recorder()
    recorder.scheduler = cluster.scheduler  # add_plugin does not call start
    cluster.scheduler.add_plugin(recorder)
    pids = client.run(os.getpid)
    return cluster, client, recorder, [pids[a] for a in sorted(pids)]


def _noop(i):
    return i


def _chain(x, i):
    return x + i


def latencies(client, n=60) -> dict:
    """Medians, in seconds, of: a client round trip (``submit(...).result()`` of a
    trivial task), a worker-to-worker ping (an rpc ``identity`` from worker 0 to the
    next), and a hop between dependent trivial tasks on alternating workers."""
    rt = []
    for i in range(n):
        t = time.perf_counter()
        client.submit(_noop, i, pure=False).result()
        rt.append(time.perf_counter() - t)
    workers = sorted(client.scheduler_info()["workers"])
    ping = float("nan")
    if len(workers) > 1:
        ping = client.run(counts.ping, workers[1], n, workers=[workers[0]])[workers[0]]
    t = time.perf_counter()
    x = client.submit(_noop, 0, pure=False, workers=[workers[0]])
    for i in range(n):
        x = client.submit(_chain, x, i, pure=False, workers=[workers[(i + 1) % len(workers)]])
    x.result()
    return {
        "round_trip": float(np.median(rt)),
        "ping": ping,
        "hop": (time.perf_counter() - t) / (n + 1),
    }


def idle_cpu(pids, seconds=3.0) -> float:
    """CPU seconds per second of an idle worker process (its event loop, heartbeats,
    memory monitor; the mean over the workers) and of this process (scheduler, client,
    nannies): on 2 cores W processes stretch an epoch's wall time, and this much of
    their CPU time is theirs whatever the epoch does."""
    import psutil

    def total():
        return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)

    before, main, began = total(), time.process_time(), time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - began
    return {
        "worker": (total() - before) / wall / len(pids),
        "main": (time.process_time() - main) / wall,
    }


# ------------------------------------------------------------------------ one fit


@contextlib.contextmanager
def engine_mode(collective: bool):
    """block_scd's epochs collectively (its default) or as task graphs only."""
    from dask_scd.engines.block import block_scd

    saved = block_scd._BlockSCD.collective
    block_scd._BlockSCD.collective = collective
    try:
        yield
    finally:
        block_scd._BlockSCD.collective = saved


def count_fit(client, recorder, pids, grid, config: str, epochs: int) -> dict:
    """Fit ``epochs`` epochs of engine ``config`` and count them: {"epochs": per-epoch
    dicts (:func:`report.epoch_rows`), "engine": the engine that ran}."""
    import dask_scd

    solver, collective, extra = CONFIGS[config]
    client.run(counts.take_events)
    counts.take_events()
    recorder.epoch, recorder.records[:] = 0, []
    marks = counts.EpochMarks(pids, recorder)
    with counts.DriverRecorder(client) as driver, engine_mode(collective):
        marks.start()
        res = dask_scd.fit(
            grid,
            loss="logistic",
            penalty="l2",
            alpha=1.0 / grid.shape[0],
            tol=1e-14,
            max_iter=epochs,
            solver=solver,
            client=client,
            callback=marks,
            random_state=0,
            **extra,
        )
    processes = list(client.run(counts.take_events).values()) + [counts.take_events()]
    roles = counts.address_roles(
        processes, counts.client_addresses(client), client.scheduler.address, os.getpid()
    )
    rows = report.epoch_rows(marks, processes, roles, recorder.records, driver.calls)
    fallbacks = list(res.extras_.get("collective_fallbacks", []))
    return {"epochs": rows, "engine": res.solver_, "fallbacks": fallbacks}


def kernel_throughput(n: int, epochs: int = 4) -> dict:
    """Non-zeros per second of one core for the in-memory engines on the same data
    (``scd`` on CSC, and block SCD in memory), from their histories."""
    import dask_scd

    X, y, _ = make_data(n)
    out = {"nnz": int(X.nnz)}
    for solver, data in (("scd", X.tocsc()), ("block_scd", X)):
        res = dask_scd.fit(
            data,
            y,
            loss="logistic",
            penalty="l2",
            alpha=1.0 / n,
            tol=1e-14,
            max_iter=epochs,
            solver=solver,
        )
        seconds = float(res.history_.seconds[-1])
        out[solver] = X.nnz * res.n_iter_ / seconds
    return out


# ------------------------------------------------------------------------ main


def measure(args) -> dict:
    """Everything the report needs: per W and engine the counted epochs, per W the
    latencies, the grid's shape and the kernels' throughput."""
    from dask_scd import open_grid

    path = args.workdir / "grid"
    t = time.perf_counter()
    write_grid_pieces(path, args.rows, -(-args.rows // args.row_chunks))
    grid = open_grid(path)
    log(
        f"grid {grid.shape}, {grid.nnz:,} nnz, {grid.n_row_chunks} row chunks "
        f"written in {time.perf_counter() - t:.0f} s"
    )
    out = {"grid": grid_facts(grid), "runs": {}, "latency": {}, "idle": {}}
    for W in args.workers:
        cluster, client, recorder, pids = start_cluster(W)
        try:
            out["latency"][W] = latencies(client)
            out["idle"][W] = idle_cpu(pids)
            for config in args.configs:
                t = time.perf_counter()
                out["runs"][(W, config)] = count_fit(
                    client, recorder, pids, grid, config, args.epochs
                )
                log(f"W={W} {config}: {time.perf_counter() - t:.0f} s")
        finally:
            client.close()
            cluster.close()
    out["kernels"] = kernel_throughput(args.rows)
    return out


def grid_facts(grid) -> dict:
    return {
        "n": int(grid.shape[0]),
        "p": int(grid.shape[1]),
        "nnz": int(grid.nnz),
        "row_chunks": int(grid.n_row_chunks),
    }


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=240_000)
    p.add_argument("--row-chunks", type=int, default=32)
    p.add_argument("--workers", default=",".join(map(str, WORKERS)))
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--epochs", type=int, default=4, help="epochs per fit (>= 3)")
    p.add_argument("--no-save", action="store_true", help="print only")
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--workdir", type=Path, default=DATA)
    p.add_argument("--from-raw", type=Path, default=None, help="render a saved run (RAW)")
    args = p.parse_args(argv)
    args.workers = [int(w) for w in args.workers.split(",")]
    args.configs = [c for c in args.configs.split(",") if c]
    unknown = sorted(set(args.configs) - set(CONFIGS))
    if unknown or args.epochs < 3:
        p.error(f"unknown engines {unknown} (known: {list(CONFIGS)}), or --epochs < 3")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv=None):
    args = parse_args(argv)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    began = time.perf_counter()
    if args.from_raw:  # render again what an earlier run measured
        measured = pickle.loads(args.from_raw.read_bytes())
    else:
        args.workdir.mkdir(parents=True, exist_ok=True)
        try:
            measured = measure(args)
        finally:
            shutil.rmtree(args.workdir, ignore_errors=True)
        cmd = " ".join(
            shlex.quote(a)
            for a in [os.path.relpath(sys.executable), "benchmarks/bench_scaleout.py", *args.argv]
        )
        measured["meta"] = {
            "cmd": cmd,
            "minutes": (time.perf_counter() - began) / 60,
            "date": now(),
            "load": load_average(),
            "epochs": args.epochs,
        }
        RAW.parent.mkdir(parents=True, exist_ok=True)
        RAW.write_bytes(pickle.dumps(measured))
    text = report.render(measured)

    print_and_append(text, args.output, save=not args.no_save)


def now() -> str:
    return f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"


if __name__ == "__main__":
    main()
