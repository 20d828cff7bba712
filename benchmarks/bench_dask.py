"""Benchmark of the block-SCD engine over dask.distributed (``solver="block_scd"``).

Five tables, printed and appended as markdown to ``benchmarks/results/dask.md``:

1. Per block iteration, kernel time vs framework overhead (squared and logistic loss) on a
   one-hot grid, LocalCluster of 2 worker processes x 1 thread, from the task stream:
   wall time per epoch, task compute time per task prefix, kernel time
   (Σ compute / n_workers, and the busiest worker's compute) and overhead = wall − kernel,
   per epoch and per block iteration (an epoch is n_blocks + 1 block iterations).
2. The floor of dask.distributed itself in the same cluster: chains of no-op tasks with the
   very graph shape of the engine's block iterations (R tasks → 1 reduce → [R trials → 1
   choose] → R tasks → ...), one epoch submitted at once; engine overhead / floor.
3. 1 vs 2 workers: time per epoch and time to a fixed relative gap on a bigger grid, with
   the same number of epochs, and the largest coefficient difference of the two models.
4. Time to a relative duality gap of 1e-6: the engine on the cluster vs the in-memory
   solvers (``dask_scd.fit(X, y)``) on the same data, and what ``solver="auto"`` picks.
5. Out of core: a grid ≥ 3x the workers' total ``memory_limit`` (uncompressed: nnz × 12
   bytes), written piece by piece (never whole in memory) and fitted for a few epochs;
   peak RSS of every worker process and of the client process.

Run ``python benchmarks/bench_dask.py`` (full size, < ~40 min on 2 cores) or ``--quick``
(small sizes, < 3 min). See benchmarks/README.md.
"""

from __future__ import annotations

import os

# One thread per worker process for numba and BLAS (the workers inherit the environment).
for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from _machine import cpu_model  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "dask.md"
DATA = HERE / "data" / "bench_dask"  # gitignored (benchmarks/data/)

# The data: 20 one-hot fields of 1000 values (pure blocks) + 1 set-valued field (impure).
N_FIELDS, CARDINALITY, SET_VALUED, SET_SIZE = 20, 1000, 1, 3
N_FEATURES = (N_FIELDS + SET_VALUED) * CARDINALITY
ALPHA = 1e-4

SIZES = {
    "quick": dict(
        main_rows=100_000,
        main_chunk=25_000,
        profile_epochs=2,
        floor_epochs=3,
        gap_budget=8.0,
        inmem_max_iter=300,
        inmem_budget=4.0,
        scale_rows=200_000,
        scale_chunk=50_000,
        scale_epochs={"squared": 3, "logistic": 2},
        ooc_rows=400_000,
        ooc_chunk=100_000,
        ooc_epochs=1,
        ooc_runs=[("512MiB", False, 15.0, 60.0), ("1GiB", False, 20.0, 90.0)],
    ),
    "full": dict(
        main_rows=2_000_000,
        main_chunk=250_000,
        profile_epochs=3,
        floor_epochs=6,
        gap_budget=120.0,
        inmem_max_iter=300,
        inmem_budget=45.0,
        scale_rows=4_000_000,
        scale_chunk=500_000,
        scale_epochs={"squared": 12, "logistic": 2},
        ooc_rows=12_000_000,
        ooc_chunk=500_000,
        ooc_epochs=2,
        ooc_runs=[("512MiB", False, 45.0, 900.0), ("1GiB", False, 120.0, 1200.0)],
    ),
}


def _quiet():
    warnings.filterwarnings("ignore")
    for name in (
        "distributed",
        "distributed.worker",
        "distributed.nanny",
        "distributed.scheduler",
        "distributed.core",
        "distributed.utils_perf",
        "bokeh",
        "tornado",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)


# ------------------------------------------------------------------------------ utilities


def fmt_s(x) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "—"
    if x >= 100:
        return f"{x:.0f} s"
    if x >= 1:
        return f"{x:.3g} s"
    if x >= 1e-3:
        return f"{x * 1e3:.3g} ms"
    return f"{x * 1e6:.3g} µs"


def fmt_bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return f"{n:.3g} TiB"


def parse_bytes(text: str) -> int:
    from dask.utils import parse_bytes as pb

    return int(pb(text))


def md_table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


class Report:
    """Collects markdown sections; prints each as it comes."""

    def __init__(self):
        self.parts: list[str] = []

    def add(self, text: str):
        print("\n" + text + "\n", flush=True)
        self.parts.append(text)

    def markdown(self) -> str:
        return "\n\n".join(self.parts) + "\n"


def cluster(n_workers=2, memory_limit="4GiB", local_directory=None):
    from distributed import LocalCluster

    kwargs = {"local_directory": str(local_directory)} if local_directory else {}
    return LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        memory_limit=memory_limit,
        dashboard_address=None,
        **kwargs,
    )


def fit_kwargs(loss):
    return dict(loss=loss, alpha=ALPHA, random_state=0)


# ----------------------------------------------------------------------------------- data


def onehot_blocks():
    return [np.arange(k * CARDINALITY, (k + 1) * CARDINALITY) for k in range(N_FIELDS + SET_VALUED)]


def make_data(n, seed=0):
    from dask_scd.datasets import make_onehot

    return make_onehot(
        n,
        n_fields=N_FIELDS,
        cardinality=CARDINALITY,
        set_valued=SET_VALUED,
        set_size=SET_SIZE,
        random_state=seed,
    )


def write_grid_in_memory(path, n, row_chunk, seed=0):
    """make_onehot whole, then to_grid: returns the grid and the in-memory (X, y)."""
    from dask_scd.grid import to_grid

    X, y, blocks = make_data(n, seed)
    grid = to_grid(X, y, path, row_chunk=row_chunk, blocks=blocks, overwrite=True)
    return grid, X, y


def _piece(i, rows, seed, truth):
    """Rows of piece i: make_onehot's design, labels from one planted model for all pieces."""
    X, _, _ = make_data(rows, seed=[seed, i])
    score = X @ truth / np.sqrt(N_FIELDS + SET_VALUED) - 0.5
    rng = np.random.default_rng([seed, i, 1])
    y = np.where(rng.random(rows) < 1.0 / (1.0 + np.exp(-score)), 1.0, -1.0)
    return X, y


def write_grid_pieces(path, n, row_chunk, seed=0):
    """Write a grid without ever holding X whole: a dask array of per-row-chunk delayed
    scipy.sparse pieces (make_onehot on each), which to_grid reads one row chunk at a time."""
    import dask
    import dask.array as da

    from dask_scd.grid import to_grid

    truth = np.random.default_rng(seed).normal(size=N_FEATURES)
    xs, ys = [], []
    for i, start in enumerate(range(0, n, row_chunk)):
        rows = min(row_chunk, n - start)
        part = dask.delayed(_piece, nout=2, pure=True)(i, rows, seed, truth)
        xs.append(
            da.from_delayed(
                part[0],
                shape=(rows, N_FEATURES),
                dtype=np.float64,
                meta=sp.csr_matrix((0, 0), dtype=np.float64),
            )
        )
        ys.append(da.from_delayed(part[1], shape=(rows,), dtype=np.float64))
    X, y = da.concatenate(xs, axis=0), da.concatenate(ys, axis=0)
    with dask.config.set(scheduler="threads"):
        return to_grid(X, y, path, row_chunk=row_chunk, blocks=onehot_blocks(), overwrite=True)


def write_grid_subprocess(path, n, row_chunk, seed=0) -> dict:
    """Run write_grid_pieces in a fresh process (so this process's RSS is not touched)."""
    cmd = [
        sys.executable,
        __file__,
        "--_write-grid",
        str(path),
        "--_rows",
        str(n),
        "--_row-chunk",
        str(row_chunk),
        "--_seed",
        str(seed),
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _write_grid_main(args):
    t = time.perf_counter()
    grid = write_grid_pieces(args._write_grid, args._rows, args._row_chunk, args._seed)
    print(
        json.dumps(
            {
                "seconds": time.perf_counter() - t,
                "nnz": grid.nnz,
                "shape": list(grid.shape),
                "cells": [grid.n_row_chunks, grid.n_blocks],
                "peak_rss": vm_hwm(),
                "disk_bytes": _du(args._write_grid),
            }
        )
    )


def vm_hwm(pid="self") -> int:
    """Peak RSS of a process image (VmHWM; unlike ru_maxrss, not inherited across exec)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _du(path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, f))
    return total


def grid_bytes(grid) -> int:
    """Uncompressed size as the engine counts it: nnz × (8-byte value + 4-byte index)."""
    return int(grid.nnz) * 12


# ------------------------------------------------------------ instrumentation of the engine


class EngineProbe:
    """Timestamps the engine's phases and every task it submits, without touching it.

    Wraps the phase methods of ``_BlockSCD`` that exist (``_epoch``, ``_coarse_step``,
    ``_certify``; class attributes, restored on exit) and the client's ``submit`` /
    ``gather`` (instance attributes, removed on exit). Each submitted key is tagged with
    (epoch, phase, block iteration); the functions submitted in each block iteration are
    recorded in order, which gives the graph shape the floor reproduces.
    """

    PHASES = (("_epoch", "block"), ("_coarse_step", "coarse"), ("_certify", "certify"))

    def __init__(self, client):
        self.client = client
        self.phases = []  # (epoch, phase, start, stop) in time.time()
        self.tags = {}  # key -> (epoch, phase, iteration)
        self.calls = defaultdict(list)  # (epoch, iteration) -> [function name] (block phase)
        self.prefix_order = []  # task prefixes in order of first submission
        self.submit_seconds = defaultdict(float)  # (epoch, phase) -> client time in submit
        self.gather_seconds = defaultdict(float)
        self.epoch = 0
        self.phase = None
        self.iteration = -1
        self._prev = None

    def __enter__(self):
        from dask.utils import key_split

        from dask_scd.engines.block import block_ops as ops
        from dask_scd.engines.block import block_scd

        self._cls = block_scd._BlockSCD
        self._orig = {}
        for method, phase in self.PHASES:
            orig = getattr(self._cls, method, None)
            if orig is None:
                continue
            self._orig[method] = orig

            def wrapper(engine, *a, _orig=orig, _phase=phase, **k):
                if _phase == "block":
                    self.epoch += 1
                return self._timed(_phase, _orig, engine, *a, **k)

            setattr(self._cls, method, wrapper)
        submit, gather, stats = self.client.submit, self.client.gather, ops.block_stats

        def timed_submit(func, *a, **k):
            t = time.perf_counter()
            fut = submit(func, *a, **k)
            self.submit_seconds[(self.epoch, self.phase)] += time.perf_counter() - t
            if self.phase == "block":
                if func is stats and self._prev is not stats:
                    self.iteration += 1
                self.calls[(self.epoch, self.iteration)].append(func.__name__)
            self._prev = func
            self.tags[fut.key] = (self.epoch, self.phase, self.iteration)
            prefix = key_split(fut.key)
            if prefix not in self.prefix_order:
                self.prefix_order.append(prefix)
            return fut

        def timed_gather(*a, **k):
            t = time.perf_counter()
            try:
                return gather(*a, **k)
            finally:
                self.gather_seconds[(self.epoch, self.phase)] += time.perf_counter() - t

        self.client.submit, self.client.gather = timed_submit, timed_gather
        return self

    def _timed(self, phase, func, *a, **k):
        self.phase, self._prev = phase, None
        t = time.time()
        try:
            return func(*a, **k)
        finally:
            self.phases.append((self.epoch, phase, t, time.time()))
            self.phase = None

    def __exit__(self, *exc):
        for method, orig in self._orig.items():
            setattr(self._cls, method, orig)
        del self.client.submit, self.client.gather

    def pattern(self, epoch):
        """The block iterations of an epoch as stages: [[(function, n_tasks), ...], ...]."""
        out = []
        for (e, _), names in sorted(self.calls.items()):
            if e != epoch:
                continue
            stages = []
            for name in names:
                if stages and stages[-1][0] == name:
                    stages[-1][1] += 1
                else:
                    stages.append([name, 1])
            out.append([tuple(s) for s in stages])
        return out


def analyse_epochs(probe: EngineProbe, stream, n_workers, n_iterations):
    """Per epoch (≥ 1): walls of the phases, compute per task prefix, kernel, overhead."""
    from dask.utils import key_split

    tasks = defaultdict(list)  # (epoch, phase) -> [(prefix, worker, compute, transfer, iteration)]
    for rec in stream:
        tag = probe.tags.get(rec["key"])
        if tag is None or tag[0] < 1:
            continue
        compute = sum(s["stop"] - s["start"] for s in rec["startstops"] if s["action"] == "compute")
        transfer = sum(
            s["stop"] - s["start"] for s in rec["startstops"] if s["action"] == "transfer"
        )
        tasks[tag[:2]].append((key_split(rec["key"]), rec.get("worker"), compute, transfer, tag[2]))
    windows = defaultdict(dict)
    for epoch, phase, start, stop in probe.phases:
        if epoch >= 1:
            windows[epoch][phase] = (start, stop)
    epochs = []
    for epoch in sorted(windows):
        w = windows[epoch]
        if "block" not in w or "certify" not in w:
            continue
        e = {"epoch": epoch, "wall": w["certify"][1] - w["block"][0]}
        for phase in ("block", "coarse", "certify"):
            e[f"wall_{phase}"] = (w[phase][1] - w[phase][0]) if phase in w else 0.0
        e["wall_client_between"] = (
            e["wall"] - e["wall_block"] - e["wall_coarse"] - e["wall_certify"]
        )
        per_prefix = defaultdict(float)
        n_tasks = defaultdict(int)
        for phase in ("block", "coarse", "certify"):
            recs = tasks[(epoch, phase)]
            e[f"compute_{phase}"] = sum(r[2] for r in recs)
            e[f"transfer_{phase}"] = sum(r[3] for r in recs)
            e[f"tasks_{phase}"] = len(recs)
            e[f"submit_{phase}"] = probe.submit_seconds[(epoch, phase)]
            for prefix, _, c, _, _ in recs:
                per_prefix[prefix] += c
                n_tasks[prefix] += 1
            # busiest worker: per block iteration (block phase) or for the whole phase
            groups = defaultdict(lambda: defaultdict(float))
            for prefix, worker, c, _, it in recs:
                groups[it if phase == "block" else 0][worker] += c
            e[f"busiest_{phase}"] = sum(max(g.values()) for g in groups.values())
        e["per_prefix"], e["n_tasks"] = dict(per_prefix), dict(n_tasks)
        e["compute"] = e["compute_block"] + e["compute_coarse"] + e["compute_certify"]
        e["tasks"] = e["tasks_block"] + e["tasks_coarse"] + e["tasks_certify"]
        e["transfer"] = e["transfer_block"] + e["transfer_coarse"] + e["transfer_certify"]
        e["kernel"] = e["compute"] / n_workers
        e["kernel_block"] = e["compute_block"] / n_workers
        e["overhead"] = e["wall"] - e["kernel"]
        e["overhead_block"] = e["wall_block"] - e["kernel_block"]
        e["busiest"] = e["busiest_block"] + e["busiest_coarse"] + e["busiest_certify"]
        e["iterations"] = n_iterations
        epochs.append(e)
    return epochs


def mean_epoch(epochs):
    """Mean over the epochs after the first (the first one also warms caches), else all."""
    use = epochs[1:] if len(epochs) > 1 else epochs
    out = {}
    for key in use[0]:
        if isinstance(use[0][key], dict):
            keys = set().union(*(e[key] for e in use))
            out[key] = {k: float(np.mean([e[key].get(k, 0.0) for e in use])) for k in keys}
        else:
            out[key] = float(np.mean([e[key] for e in use]))
    out["n_epochs_averaged"] = len(use)
    return out


def profile_engine(client, grid, loss, epochs):
    """A few epochs under the task stream; returns per-epoch analyses, the result, the probe."""
    from distributed import get_task_stream

    import dask_scd

    n_workers = len(client.scheduler_info()["workers"])
    with EngineProbe(client) as probe, get_task_stream(client) as ts:
        t = time.perf_counter()
        result = dask_scd.fit(
            grid, tol=1e-12, max_iter=epochs, solver="block_scd", client=client, **fit_kwargs(loss)
        )
        total = time.perf_counter() - t
    analysed = analyse_epochs(probe, ts.data, n_workers, grid.n_blocks + 1)
    return analysed, result, total, probe


# -------------------------------------------------------------------------------- the floor


def floor_task(*deps):
    """The no-op of the floor: takes its dependencies, returns a small int."""
    return 0


def floor_epoch(client, R, pattern):
    """One epoch of no-op tasks in the engine's graph shape, submitted at once, gathered.

    ``pattern`` lists the block iterations of one engine epoch as stages
    ``[(function, n_tasks), ...]`` (recorded by :class:`EngineProbe`). A stage of R tasks
    is one task per row chunk, each on that row chunk's current "margins" task and on the
    last single task of the iteration (as block_trials on margins[r] and the direction,
    apply_step on margins[r] and the step); the last R-stage of an iteration becomes the new
    margins. A single task depends on the whole previous R-stage and the previous single
    task (as block_choose on the trials and the direction). The last single task of each
    iteration is its "step", gathered at the end. Returns the wall time from the first
    submit to the gathered steps.
    """
    chain = [client.submit(floor_task, r, pure=False) for r in range(R)]
    client.gather(chain)
    submit = client.submit
    t = time.perf_counter()
    steps = []
    for stages in pattern:
        last_r = max((i for i, (_, n) in enumerate(stages) if n > 1), default=-1)
        previous, single = [], None
        for i, (_, n) in enumerate(stages):
            extra = [single] if single is not None else []
            if n == 1:
                single = submit(floor_task, *previous, *extra, pure=False)
                previous = []
            else:
                previous = [
                    submit(floor_task, chain[r % len(chain)], *extra, pure=False) for r in range(n)
                ]
                if i == last_r:
                    chain = previous
        if single is not None:
            steps.append(single)
    client.gather(steps + chain)
    return time.perf_counter() - t


def measure_floor(client, R, pattern, epochs):
    floor_epoch(client, R, pattern)  # warm-up
    walls = [floor_epoch(client, R, pattern) for _ in range(epochs)]
    wall = float(np.median(walls))
    n_tasks = sum(n for stages in pattern for _, n in stages)
    return {
        "wall_epoch": wall,
        "per_iteration": wall / len(pattern),
        "tasks_per_epoch": n_tasks,
        "iterations": len(pattern),
        "per_task": wall / n_tasks,
        "walls": walls,
    }


def describe_pattern(pattern) -> str:
    """'22 x [block_stats x8 → block_direction → apply_step x8]' style summary."""
    kinds = defaultdict(int)
    for stages in pattern:
        kinds[" → ".join(f"{name} x{n}" if n > 1 else name for name, n in stages)] += 1
    return "; ".join(f"{count} x [{text}]" for text, count in kinds.items())


# ---------------------------------------------------------------------------- sections 1-2


def section_profile(report, client, grid, sizes):
    results = {}
    prefix_order = []
    client.run(_install_cache_counter)
    for loss in ("squared", "logistic"):
        print(f"[bench_dask] profiling {loss}: {sizes['profile_epochs']} epochs", flush=True)
        epochs, result, total, probe = profile_engine(client, grid, loss, sizes["profile_epochs"])
        pattern = probe.pattern(epochs[-1]["epoch"])
        floor = measure_floor(client, grid.n_row_chunks, pattern, sizes["floor_epochs"])
        results[loss] = {
            "epochs": epochs,
            "mean": mean_epoch(epochs),
            "floor": floor,
            "gap": result.history_.relative_gap,
            "total": total,
            "pattern": pattern,
        }
        prefix_order += [p for p in probe.prefix_order if p not in prefix_order]
    n_workers = len(client.scheduler_info()["workers"])
    it = grid.n_blocks + 1
    R = grid.n_row_chunks
    losses = ("squared", "logistic")

    # Table 1a: where the compute goes, per task prefix
    rows = []
    for prefix in prefix_order:
        cells = []
        for loss in losses:
            m = results[loss]["mean"]
            c, n = m["per_prefix"].get(prefix, 0.0), m["n_tasks"].get(prefix, 0.0)
            cells += [fmt_s(c) if n else "—", f"{n:.0f}" if n else "0", fmt_s(c / n) if n else "—"]
        if any(results[loss]["mean"]["n_tasks"].get(prefix) for loss in losses):
            rows.append([f"`{prefix}`", *cells])
    totals = []
    for loss in losses:
        m = results[loss]["mean"]
        totals += [f"**{fmt_s(m['compute'])}**", f"{m['tasks']:.0f}", ""]
    rows.append(["**total**", *totals])
    t1a = md_table(
        [
            "task prefix",
            "squared: Σ compute / epoch",
            "tasks / epoch",
            "per task",
            "logistic: Σ compute / epoch",
            "tasks / epoch",
            "per task",
        ],
        rows,
    )

    # Table 1b: wall vs kernel vs overhead
    rows = []
    for loss in losses:
        m = results[loss]["mean"]
        rows.append(
            [
                loss,
                f"{m['n_epochs_averaged']:.0f}",
                fmt_s(m["wall"]),
                " / ".join(
                    fmt_s(m[f"wall_{p}"]) for p in ("block", "coarse", "certify", "client_between")
                ),
                fmt_s(m["compute"]),
                fmt_s(m["kernel"]),
                fmt_s(m["busiest"]),
                fmt_s(m["overhead"]),
                f"{m['overhead'] / m['wall']:.0%}",
                fmt_s(m["wall"] / it),
                fmt_s(m["kernel"] / it),
                f"**{fmt_s(m['overhead'] / it)}**",
                fmt_s((m["wall"] - m["busiest"]) / it),
                " / ".join(fmt_s(m[f"submit_{p}"]) for p in ("block", "coarse", "certify")),
                fmt_s(m["transfer"]),
            ]
        )
    t1b = md_table(
        [
            "loss",
            "epochs avg",
            "wall / epoch",
            "phases: block / coarse / certify / client",
            "Σ compute",
            f"kernel = Σ/{n_workers}",
            "kernel (busiest worker)",
            "overhead = wall − kernel",
            "overhead share",
            "wall / block it.",
            "kernel / block it.",
            "overhead / block it.",
            "(wall − busiest) / block it.",
            "client submit time: block / coarse / certify",
            "Σ transfer",
        ],
        rows,
    )

    # Table 1c: every epoch (to show the spread)
    rows = []
    for loss in losses:
        for e in results[loss]["epochs"]:
            rows.append(
                [
                    loss,
                    e["epoch"],
                    fmt_s(e["wall"]),
                    fmt_s(e["wall_block"]),
                    fmt_s(e["kernel_block"]),
                    fmt_s(e["wall_coarse"]),
                    fmt_s(e["wall_certify"]),
                    fmt_s(e["kernel"]),
                    fmt_s(e["overhead"]),
                    fmt_s(e["overhead"] / it),
                    f"{results[loss]['gap'][e['epoch'] - 1]:.3e}",
                ]
            )
    t1c = md_table(
        [
            "loss",
            "epoch",
            "wall",
            "block phase",
            "block kernel (Σ/n_workers)",
            "coarse phase",
            "certify phase",
            "kernel (all)",
            "overhead",
            "overhead / block it.",
            "relative gap",
        ],
        rows,
    )

    # Table 2: the floor
    rows = []
    for loss in losses:
        m, f = results[loss]["mean"], results[loss]["floor"]
        engine_block = m["overhead_block"] / it
        engine_all = m["overhead"] / it
        rows.append(
            [
                loss,
                f"{f['tasks_per_epoch'] / f['iterations']:.1f}",
                fmt_s(f["wall_epoch"]),
                f"**{fmt_s(f['per_iteration'])}**",
                fmt_s(f["per_task"]),
                fmt_s(engine_block),
                f"**{engine_block / f['per_iteration']:.2f}x**",
                fmt_s(engine_all),
                f"{engine_all / f['per_iteration']:.2f}x",
            ]
        )
    t2 = md_table(
        [
            "loss (graph shape)",
            "tasks / iteration",
            "floor wall / epoch (median)",
            "floor / iteration",
            "floor / task",
            "engine overhead / block it. (block phase)",
            "engine / floor",
            "engine overhead / block it. (whole epoch)",
            "whole epoch / floor",
        ],
        rows,
    )
    shapes = "\n".join(f"- {loss}: {describe_pattern(results[loss]['pattern'])}" for loss in losses)

    shape_note = (
        f"Grid: {grid.shape[0]:,} rows x {grid.shape[1]:,} features, {grid.nnz:,} non-zeros "
        f"({fmt_bytes(grid_bytes(grid))} uncompressed), {R} row chunks x {grid.n_blocks} blocks "
        f"({sum(grid.purity)} pure); an epoch = {it} block iterations ({grid.n_blocks} blocks + "
        f"the intercept), then the engine's other per-epoch phases (coarse step, certificate). "
        f"LocalCluster: {n_workers} worker processes x 1 thread, memory_limit 4GiB; the scheduler "
        f"runs in the client process. alpha={ALPHA}."
    )
    report.add(
        "### 1. Per block iteration: kernel time vs framework overhead\n\n" + shape_note + "\n\n"
        "Phases are timed on the client by wrapping the engine's methods `_BlockSCD._epoch` "
        "(block phase: submit the whole epoch, gather the steps), `_coarse_step` (coarse phase) "
        "and `_certify` (certify phase); 'client' is the rest of the epoch loop. Task compute "
        'times come from `distributed.get_task_stream` (startstops with action "compute"), '
        "each task attributed to its epoch, phase and block iteration by its key. kernel = "
        "Σ compute / n_workers (perfect parallelism); busiest worker = per block iteration "
        "(per phase outside the block phase), the largest compute of one worker, summed: a "
        "tighter bound given the actual placement. overhead = wall − kernel. Averages over "
        f"epochs 2..{sizes['profile_epochs']} (epoch 1 is in table 1c).\n\n"
        f"Cell cache of each worker after these fits: hit rate of all cell reads "
        f"(cached bytes / bound): {cache_summary(client)}.\n\n"
        "#### 1a. Task compute time per epoch, by task prefix\n\n"
        + t1a
        + "\n\n#### 1b. Wall vs kernel vs overhead (per epoch, then per block iteration)\n\n"
        + t1b
        + "\n\n#### 1c. Every epoch\n\n"
        + t1c
    )
    report.add(
        "### 2. The floor of dask.distributed (same cluster, same graph shape)\n\n"
        "No-op tasks (`client.submit(noop, *deps, pure=False)`) in the graph shape of one epoch "
        "of the engine's block phase, as recorded from the engine's own submissions in the last "
        "profiled epoch: per block iteration, stages of R tasks (one per row chunk, on that row "
        "chunk's previous task) and single reduce tasks on the whole previous stage, "
        f"{it} iterations submitted at once with no waiting, then one gather of the steps; "
        f"median of {sizes['floor_epochs']} epochs after one warm-up. R = {R}. Recorded shapes:"
        f"\n\n{shapes}\n\n"
        "The engine's block-phase overhead per block iteration (wall − Σ compute / n_workers of "
        "the block phase, / block iterations) is compared with the floor per iteration "
        "(target ≤ 1.5x); the last two columns charge the whole epoch's overhead (coarse step, "
        "certificate, client work) to the block iterations.\n\n" + t2
    )
    return results


# ------------------------------------------------------------------------------ section 3


def _time_to(history, target):
    for gap, seconds, epoch in zip(history.relative_gap, history.seconds, history.iteration):
        if gap <= target:
            return seconds, epoch
    return None, None


def section_scaling(report, grid, sizes):
    from distributed import Client, get_task_stream

    import dask_scd

    target_tol = 1e-4
    rows, rows_b = [], []
    for loss, max_iter in sizes["scale_epochs"].items():
        runs, streams, cache = {}, {}, {}
        for n_workers in (1, 2):
            print(f"[bench_dask] scaling {loss}: {n_workers} worker(s)", flush=True)
            with cluster(n_workers) as c, Client(c) as client:
                client.run(_install_cache_counter)
                with get_task_stream(client) as ts:
                    t = time.perf_counter()
                    r = dask_scd.fit(
                        grid,
                        tol=target_tol,
                        max_iter=max_iter,
                        solver="block_scd",
                        client=client,
                        **fit_kwargs(loss),
                    )
                    runs[n_workers] = (r, time.perf_counter() - t)
                cache[n_workers] = cache_summary(client)
            streams[n_workers] = _stream_totals(ts.data)
        h1, h2 = runs[1][0].history_, runs[2][0].history_
        reached = min(h1.relative_gap[-1], h2.relative_gap[-1]) <= target_tol
        target = (
            target_tol if reached else _round_target(max(h1.relative_gap[-1], h2.relative_gap[-1]))
        )
        per_epoch = {}
        for k, (r, _) in runs.items():
            steps = np.diff([0.0] + list(r.history_.seconds))
            per_epoch[k] = float(np.mean(steps[1:] if len(steps) > 1 else steps))
        to = {k: _time_to(runs[k][0].history_, target) for k in runs}
        diff = float(np.max(np.abs(runs[1][0].coef_ - runs[2][0].coef_)))
        idiff = abs(runs[1][0].intercept_ - runs[2][0].intercept_)
        rows.append(
            [
                loss,
                f"{len(h1)} / {len(h2)}",
                fmt_s(per_epoch[1]),
                fmt_s(per_epoch[2]),
                f"**{per_epoch[1] / per_epoch[2]:.2f}x**",
                f"{target:.0e}"
                + ("" if reached else f" (1e-4 not reached in max_iter={max_iter})"),
                f"{fmt_s(to[1][0])} (ep {to[1][1]})",
                f"{fmt_s(to[2][0])} (ep {to[2][1]})",
                f"**{to[1][0] / to[2][0]:.2f}x**" if to[1][0] and to[2][0] else "—",
                fmt_s(runs[1][1]),
                fmt_s(runs[2][1]),
                f"{diff:.1e} (intercept {idiff:.1e})",
                f"{h1.relative_gap[-1]:.3e} / {h2.relative_gap[-1]:.3e}",
            ]
        )
        for k in (1, 2):
            st, r = streams[k], runs[k][0]
            rows_b.append(
                [
                    loss,
                    k,
                    fmt_s(runs[k][1]),
                    fmt_s(st["compute"]),
                    fmt_s(st["compute"] / k),
                    f"{st['compute'] / k / runs[k][1]:.0%}",
                    fmt_s(st["transfer"]),
                    st["tasks"],
                    cache[k],
                    ", ".join(
                        f"{p} {fmt_s(st['per_task'][p])}"
                        for p in (
                            "block_stats",
                            "block_trials",
                            "apply_step",
                            "refresh_margins",
                            "certificate_stats",
                            "coarse_stats",
                        )
                        if p in st["per_task"]
                    ),
                ]
            )
    report.add(
        "### 3. 1 vs 2 workers\n\n"
        f"Grid: {grid.shape[0]:,} rows, {grid.nnz:,} non-zeros ({fmt_bytes(grid_bytes(grid))} "
        f"uncompressed), {grid.n_row_chunks} row chunks x {grid.n_blocks} blocks, written piece by "
        f"piece. A fresh LocalCluster of 1 or 2 worker processes x 1 thread (4GiB each) per fit; "
        "tol=1e-4, max_iter = "
        + ", ".join(f"{v} epochs ({k})" for k, v in sizes["scale_epochs"].items())
        + " (logistic epochs are long: capped to stay in the time budget; its gap target is then "
        "the last gap both runs reached, rounded up to a power of ten); both fits run the same "
        "epochs. Time per epoch = mean "
        "history_.seconds increment of the epochs after the first; time to the target = "
        "history_.seconds at the first epoch whose certified gap ≤ target (epoch loop, setup "
        "excluded); 'total' is the whole fit call (preflight, initial intercept included).\n\n"
        + md_table(
            [
                "loss",
                "epochs (1w / 2w)",
                "1 worker / epoch",
                "2 workers / epoch",
                "speed-up",
                "gap target",
                "1 worker to target",
                "2 workers to target",
                "speed-up to target",
                "total 1w",
                "total 2w",
                "max |coef 1w − coef 2w|",
                "final gap 1w / 2w",
            ],
            rows,
        )
        + "\n\nWhere the time goes (task stream over the whole fit, preflight included): if the "
        "compute time per task grows with the second worker, the two workers are competing for "
        "the cores (the client and the scheduler need CPU too, and so does anything else running "
        "on the machine). Cell-cache hits are counted by wrapping the engine's per-process cache "
        "(`dask_scd.data.cache.CACHE.get`) on each worker with `client.run`; a miss reads, decompresses "
        "and converts the cell from the zarr store.\n\n"
        + md_table(
            [
                "loss",
                "workers",
                "fit wall",
                "Σ task compute",
                "Σ compute / workers",
                "busy share of wall",
                "Σ transfer",
                "tasks",
                "cell cache hits per worker (cached / bound)",
                "mean compute per task",
            ],
            rows_b,
        )
    )


def _install_cache_counter():
    """(client.run) Count hits and misses of the engine's per-process cell cache."""
    from dask_scd.data import cache as cell_cache

    cache = cell_cache.CACHE
    if getattr(cache, "_bench_counts", None) is not None:
        return
    cache._bench_counts = {"hit": 0, "miss": 0}
    get = cache.get

    def counted(key, load):
        with cache._sizing:
            hit = key in cache._items
        cache._bench_counts["hit" if hit else "miss"] += 1
        return get(key, load)

    cache.get = counted


def _read_cache_counter():
    from dask_scd.data import cache as cell_cache

    counts = getattr(cell_cache.CACHE, "_bench_counts", None) or {"hit": 0, "miss": 0}
    return {**counts, "bytes": cell_cache.CACHE._bytes, "max_bytes": cell_cache.CACHE.max_bytes}


def cache_summary(client) -> str:
    stats = client.run(_read_cache_counter).values()
    return " / ".join(
        f"{s['hit'] / max(s['hit'] + s['miss'], 1):.0%} of {s['hit'] + s['miss']} "
        f"({fmt_bytes(s['bytes'])} of {fmt_bytes(s['max_bytes'])})"
        for s in stats
    )


def _stream_totals(stream) -> dict:
    from dask.utils import key_split

    compute, transfer = 0.0, 0.0
    per = defaultdict(list)
    for rec in stream:
        c = sum(s["stop"] - s["start"] for s in rec["startstops"] if s["action"] == "compute")
        transfer += sum(
            s["stop"] - s["start"] for s in rec["startstops"] if s["action"] == "transfer"
        )
        compute += c
        per[key_split(rec["key"])].append(c)
    return {
        "compute": compute,
        "transfer": transfer,
        "tasks": len(stream),
        "per_task": {p: float(np.mean(v)) for p, v in per.items()},
    }


def _round_target(gap):
    return float(10.0 ** np.ceil(np.log10(gap)))


# ------------------------------------------------------------------------------ section 4


def section_time_to_gap(report, client, grid, X, y, sizes):
    import dask_scd

    target = 1e-6
    budget = sizes["gap_budget"]
    rows = []
    auto = {}
    for loss in ("squared", "logistic"):
        print(f"[bench_dask] time to 1e-6, {loss}: engine (budget {budget:.0f} s)", flush=True)
        start = time.perf_counter()

        def stop(info, start=start):
            return time.perf_counter() - start > budget

        t = time.perf_counter()
        r = dask_scd.fit(
            grid,
            tol=target,
            max_iter=100_000,
            solver="block_scd",
            client=client,
            callback=stop,
            **fit_kwargs(loss),
        )
        wall = time.perf_counter() - t
        to, ep = _time_to(r.history_, target)
        per_epoch = r.history_.seconds[-1] / max(r.n_iter_, 1)
        rows.append(
            [
                loss,
                "block_scd on the cluster (2 workers)",
                f"{fmt_s(to)} (ep {ep})" if to else f"not reached in {budget:.0f} s budget",
                r.n_iter_,
                fmt_s(per_epoch),
                f"{r.dual_gap_:.2e}",
                fmt_s(wall),
                "",
            ]
        )
        engine = r
        for solver in ("auto", "scd"):
            print(f"[bench_dask] time to 1e-6, {loss}: in memory, solver={solver}", flush=True)
            # max_iter from a 2-epoch probe, so that the fit stays within its time budget
            probe = dask_scd.fit(X, y, tol=target, max_iter=2, solver=solver, **fit_kwargs(loss))
            per = probe.history_.seconds[-1] / max(probe.n_iter_, 1)
            max_iter = int(
                min(sizes["inmem_max_iter"], max(2, sizes["inmem_budget"] / max(per, 1e-3)))
            )
            t = time.perf_counter()
            m = dask_scd.fit(X, y, tol=target, max_iter=max_iter, solver=solver, **fit_kwargs(loss))
            wall = time.perf_counter() - t
            to, ep = _time_to(m.history_, target)
            per_epoch = m.history_.seconds[-1] / max(m.n_iter_, 1)
            diff = float(np.max(np.abs(m.coef_ - engine.coef_)))
            rows.append(
                [
                    loss,
                    f"in memory, solver={solver!r} → {m.solver_}",
                    f"{fmt_s(to)} (ep {ep})"
                    if to
                    else f"not reached in {max_iter} epochs (budget)",
                    m.n_iter_,
                    fmt_s(per_epoch),
                    f"{m.dual_gap_:.2e}",
                    fmt_s(wall),
                    f"{diff:.1e}",
                ]
            )
            if solver == "auto":
                auto[f"in memory ({loss})"] = m.solver_
    # What solver="auto" picks for the grid itself (one epoch is enough to see it).
    from distributed import Client  # noqa: F401

    r_auto = dask_scd.fit(
        grid, tol=1e-12, max_iter=1, solver="auto", client=client, **fit_kwargs("squared")
    )
    nbytes = grid_bytes(grid)
    report.add(
        "### 4. Time to a relative duality gap of 1e-6: engine vs in memory\n\n"
        f"Same data as table 1 ({grid.shape[0]:,} rows, {fmt_bytes(nbytes)} uncompressed). "
        f"The engine runs on the same 2-worker cluster with a time budget of {budget:.0f} s per "
        "loss (a callback stops it; max_iter is otherwise unbounded); the in-memory solvers run "
        f"in this process on the scipy CSR matrix, single thread (max_iter sized from a 2-epoch probe "
        f"to a {sizes['inmem_budget']:.0f} s budget, at most {sizes['inmem_max_iter']}). Times are history_.seconds (the epoch loop, setup excluded) of the first epoch "
        "whose certified gap ≤ 1e-6; 'total wall' is the whole fit call. The squared loss is fit "
        "on the same ±1 labels. 'max |Δcoef|' is against the engine's final coefficients.\n\n"
        + md_table(
            [
                "loss",
                "engine",
                "time to 1e-6",
                "epochs run",
                "time / epoch",
                "final gap",
                "total wall",
                "max |Δcoef| vs engine",
            ],
            rows,
        )
        + f'\n\n`solver="auto"` on this grid (nnz × 12 = {fmt_bytes(nbytes)}, default '
        f"`in_memory_limit` = 256 MiB): **{r_auto.solver_}**"
        + (
            ""
            if nbytes > 256 * 2**20
            else " (below the limit: X is materialized on the client and fitted in memory)"
        )
        + '. In memory, `solver="auto"` picks: '
        + ", ".join(f"{k}: **{v}**" for k, v in auto.items())
        + "."
    )


# ------------------------------------------------------------------------------ section 5


class RssPoller(threading.Thread):
    """Peak RSS of this process and of its worker processes, polled every ``interval`` s.

    Worker processes are the children started by the LocalCluster's nannies (which live in
    this process); a worker restarted by its nanny shows up as a new pid.
    """

    def __init__(self, interval=0.2):
        super().__init__(daemon=True)
        import psutil

        self.me = psutil.Process()
        self.client_peak = 0
        self.workers = {}  # pid -> peak RSS
        self.now = {}  # pid -> last RSS
        self.interval = interval
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.interval)

    def sample(self):
        with contextlib.suppress(Exception):
            self.client_peak = max(self.client_peak, self.me.memory_info().rss)
        now = {}
        for child in self.me.children(recursive=True):
            with contextlib.suppress(Exception):
                if "spawn_main" not in " ".join(child.cmdline()):
                    continue  # the multiprocessing resource tracker
                rss = child.memory_info().rss
                now[child.pid] = rss
                self.workers[child.pid] = max(self.workers.get(child.pid, 0), rss)
        self.now = now

    def stop(self):
        self._stop_event.set()
        self.join()
        self.sample()


def _worker_stats(dask_worker=None):
    from dask_scd.data import cache as cell_cache

    out = {
        "vm_hwm": vm_hwm(),
        "cache_bytes": cell_cache.CACHE._bytes,
        "cache_max": cell_cache.CACHE.max_bytes,
        "status": str(getattr(dask_worker, "status", "?")),
    }
    with contextlib.suppress(Exception):
        out["spilled_bytes"] = int(dask_worker.data.spilled_total.disk)
    return out


def _cache_bound_plugin():
    """A worker plugin that sets the engine's cell-cache bound to memory_limit // 3.

    The library's earlier rule, kept for comparison (``:fix`` in ``--ooc-runs``): the
    library now sizes the cache itself from what the worker has left below its pause
    threshold (``dask_scd.data.cache._cache_budget``). Runs on every (re)started worker.
    """
    from distributed.diagnostics.plugin import WorkerPlugin

    class CacheBound(WorkerPlugin):
        name = "bench-dask-cache-bound"

        def setup(self, worker):
            from dask_scd.data import cache as cell_cache

            cell_cache.CACHE.max_bytes = int(worker.memory_manager.memory_limit) // 3

    return CacheBound()


def _worker_status(dask_worker=None):
    return str(getattr(dask_worker, "status", "?")).split(".")[-1]


def _ooc_fit_main(args):
    """In a fresh process (the client; the scheduler lives here too): open the grid, fit a few
    epochs, watch every process's RSS. Prints STATUS / EPOCH / RESULT lines of JSON."""
    _quiet()
    from distributed import Client

    import dask_scd
    from dask_scd.grid import open_grid

    def emit(kind, obj):
        print(kind, json.dumps(obj), flush=True)

    grid = open_grid(args._ooc_fit)
    poller = RssPoller()
    poller.start()
    t0 = time.perf_counter()
    with (
        cluster(2, args._memory, local_directory=Path(args._ooc_fit).parent / "scratch") as c,
        Client(c) as client,
    ):
        if args._cache_fix:
            client.register_plugin(_cache_bound_plugin())
        done = threading.Event()

        def report_status():
            while not done.wait(2.0):
                try:
                    status = client.run(_worker_status, wait=True)
                except Exception:  # a worker restarting
                    status = {}
                emit(
                    "STATUS",
                    {
                        "t": time.perf_counter() - t0,
                        "status": list(status.values()),
                        "client_peak": poller.client_peak,
                        "worker_peaks": list(poller.workers.values()),
                        "worker_now": list(poller.now.values()),
                    },
                )

        threading.Thread(target=report_status, daemon=True).start()

        def on_epoch(info):
            emit(
                "EPOCH",
                {
                    "epoch": info["epoch"],
                    "gap": info["relative_gap"],
                    "t": time.perf_counter() - t0,
                },
            )

        t = time.perf_counter()
        r = dask_scd.fit(
            grid,
            tol=1e-12,
            max_iter=args._epochs,
            solver="block_scd",
            client=client,
            callback=on_epoch,
            **fit_kwargs(args._loss),
        )
        wall = time.perf_counter() - t
        done.set()
        poller.stop()
        stats = client.run(_worker_stats)
    emit(
        "RESULT",
        {
            "wall": wall,
            "seconds": r.history_.seconds,
            "gaps": r.history_.relative_gap,
            "epochs": len(r.history_),
            "client_peak": poller.client_peak,
            "client_vm_hwm": vm_hwm(),
            "worker_peaks": list(poller.workers.values()),
            "workers": list(stats.values()),
        },
    )


def run_ooc_fit(path, memory, epochs, loss, stall_after, timeout, cache_fix) -> dict:
    """Run _ooc_fit_main in a child process (its own session: its workers are killed with it
    if it stalls: a worker paused for ``stall_after`` s in a row, or ``timeout`` s in all)."""
    import signal

    cmd = [
        sys.executable,
        __file__,
        "--_ooc-fit",
        str(path),
        "--_memory",
        memory,
        "--_epochs",
        str(epochs),
        "--_loss",
        loss,
    ] + (["--_cache-fix"] if cache_fix else [])
    err_path = Path(path).parent / f"ooc-{memory}-{int(cache_fix)}.stderr"
    err = open(err_path, "w")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
    )
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    t0, outcome = time.perf_counter(), "finished"
    paused_since = None
    while proc.poll() is None:
        time.sleep(1.0)
        status = [
            json.loads(line.split(" ", 1)[1]) for line in list(lines) if line.startswith("STATUS")
        ]
        if status and "paused" in status[-1]["status"]:
            paused_since = paused_since or time.perf_counter()
        elif status:
            paused_since = None
        if paused_since and time.perf_counter() - paused_since > stall_after:
            outcome = f"stalled: a worker paused for {stall_after:.0f} s in a row"
        elif time.perf_counter() - t0 > timeout:
            outcome = f"timed out after {timeout:.0f} s"
        else:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the child's session: it and its workers
        proc.wait()
        break
    reader.join(timeout=5)
    err.close()
    if proc.returncode not in (0, None) and outcome == "finished":
        errors = [
            line.strip()
            for line in open(err_path, errors="replace")
            if "Error" in line or "Exception" in line or "Killed" in line
        ]
        last = errors[-1][:160] if errors else ""
        outcome = (
            f"failed (exit code {proc.returncode}): `{last}`"
            if last
            else f"failed (exit code {proc.returncode})"
        )
    parsed = defaultdict(list)
    for line in lines:
        kind, _, body = line.partition(" ")
        with contextlib.suppress(ValueError):
            parsed[kind].append(json.loads(body))
    return {
        "outcome": outcome,
        "status": parsed["STATUS"],
        "epochs": parsed["EPOCH"],
        "result": parsed["RESULT"][-1] if parsed["RESULT"] else None,
        "elapsed": time.perf_counter() - t0,
    }


def _peaks(values) -> str:
    values = sorted(values, reverse=True)
    if len(values) <= 4:
        return " / ".join(fmt_bytes(v) for v in values)
    return f"max {fmt_bytes(values[0])} over {len(values)} processes (median {fmt_bytes(np.median(values))})"


def section_out_of_core(report, sizes, workdir):
    path = workdir / "ooc.zarr"
    print(
        f"[bench_dask] out of core: writing {sizes['ooc_rows']:,} rows piece by piece", flush=True
    )
    w = write_grid_subprocess(path, sizes["ooc_rows"], sizes["ooc_chunk"], seed=2)
    nbytes = w["nnz"] * 12
    rows = []
    for memory, cache_fix, stall_after, timeout in sizes["ooc_runs"]:
        print(
            f"[bench_dask] out of core: fitting {sizes['ooc_epochs']} epoch(s), "
            f"memory_limit={memory}, cache bound {'memory_limit/3' if cache_fix else 'library'}",
            flush=True,
        )
        o = run_ooc_fit(
            path, memory, sizes["ooc_epochs"], "squared", stall_after, timeout, cache_fix
        )
        shutil.rmtree(workdir / "scratch", ignore_errors=True)
        res, last = o["result"], (o["status"][-1] if o["status"] else {})
        worker_peaks = res["worker_peaks"] if res else last.get("worker_peaks", [])
        client_peak = res["client_peak"] if res else last.get("client_peak", 0)
        ratio = nbytes / (2 * parse_bytes(memory))
        if res:
            per_epoch = res["seconds"][-1] / max(res["epochs"], 1)
            wall = fmt_s(res["wall"])
            cache = " / ".join(
                f"{fmt_bytes(s['cache_bytes'])} of {fmt_bytes(s['cache_max'])}"
                for s in res["workers"]
            )
            spilled = " / ".join(fmt_bytes(s.get("spilled_bytes", 0)) for s in res["workers"])
            ru = " / ".join(fmt_bytes(s["vm_hwm"]) for s in res["workers"])
            gaps = " → ".join(f"{g:.2e}" for g in res["gaps"])
            client = f"{fmt_bytes(client_peak)} (VmHWM {fmt_bytes(res['client_vm_hwm'])})"
        else:
            per_epoch, wall, cache, spilled, ru = (
                None,
                f"— ({fmt_s(o['elapsed'])} elapsed)",
                "—",
                "—",
                "—",
            )
            gaps = " → ".join(f"{e['gap']:.2e}" for e in o["epochs"]) or "no epoch finished"
            client = fmt_bytes(client_peak)
        paused = sum(1 for st in o["status"] if "paused" in st["status"])
        rows.append(
            [
                memory,
                "memory_limit / 3 (plugin)" if cache_fix else "library (½ of pause − resident)",
                f"{ratio:.2f}x",
                o["outcome"],
                len(o["epochs"]),
                wall,
                fmt_s(per_epoch),
                _peaks(worker_peaks),
                max(0, len(worker_peaks) - 2),
                f"{paused} of {len(o['status'])}",
                ru,
                cache,
                spilled,
                client,
                f"{max(client_peak, res['client_vm_hwm'] if res else 0) / nbytes:.1%}",
                gaps,
            ]
        )
    shutil.rmtree(path, ignore_errors=True)
    report.add(
        "### 5. Out of core\n\n"
        f"Grid: {w['shape'][0]:,} rows, {w['nnz']:,} non-zeros = **{fmt_bytes(nbytes)} uncompressed** "
        f"(nnz × 12 B), {w['cells'][0]} row chunks x {w['cells'][1]} blocks, "
        f"{fmt_bytes(w['disk_bytes'])} on disk (zstd). Written in {fmt_s(w['seconds'])} by a "
        "separate process from a dask array of per-row-chunk delayed `make_onehot` pieces "
        "(`da.from_delayed`, scipy.sparse chunks, labels from one planted model) passed to "
        f"`to_grid`, which reads it one row chunk at a time: the writer's peak RSS (VmHWM) was "
        f"{fmt_bytes(w['peak_rss'])}, so X was never whole in memory. "
        "Each fit runs in a fresh process (the client; the LocalCluster's scheduler and nannies "
        f'live in it too) on 2 workers x 1 thread, solver="block_scd", squared loss, '
        f"max_iter={sizes['ooc_epochs']}. RSS of the client and of every worker process is polled "
        "every 0.2 s (psutil; a worker restarted by its nanny is a new process, counted in "
        "'restarts'); worker status (running / paused) is polled every 2 s. A fit is killed when a worker stays paused (process memory > 80 % of "
        "memory_limit) for a while: it cannot make progress then. VmHWM (/proc/pid/status) is "
        "the peak RSS of a process image, read at the end (not ru_maxrss, which Linux carries "
        "over from the parent across fork + exec). 'ratio' = uncompressed grid "
        "/ total memory_limit of the workers. The grid store is deleted afterwards.\n\n"
        + md_table(
            [
                "memory_limit / worker",
                "cell cache bound",
                "ratio",
                "outcome",
                "epochs done",
                "fit wall",
                "time / epoch",
                "worker peak RSS (poll, per process)",
                "worker restarts",
                "status polls with a paused worker",
                "worker VmHWM (end, live workers)",
                "cell cache at end",
                "spilled to disk (end)",
                "client peak RSS",
                "client peak / grid",
                "relative gap",
            ],
            rows,
        )
    )


# ----------------------------------------------------------------------------------- main


def warm_up(client, workdir):
    """Load the numba kernels and the modules in every worker (1 epoch on a tiny grid)."""
    import dask_scd

    grid, _, _ = write_grid_in_memory(workdir / "tiny.zarr", 20_000, 5_000, seed=9)
    for loss in ("squared", "logistic"):
        dask_scd.fit(
            grid, tol=1e-12, max_iter=1, solver="block_scd", client=client, **fit_kwargs(loss)
        )
    shutil.rmtree(workdir / "tiny.zarr", ignore_errors=True)


def header(args, sizes, elapsed, git_start):
    import dask
    import distributed
    import psutil
    import zarr

    import dask_scd

    load = os.getloadavg()
    git = (
        git_start
        if git_start == _git_state()
        else f"{git_start} at the start, {_git_state()} at the end"
    )
    cmd = " ".join(
        shlex.quote(a) for a in [".venv/bin/python", "benchmarks/bench_dask.py", *args.argv]
    )
    return (
        f"## {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} — {cpu_model()}, "
        f"{os.cpu_count()} cores (nproc), {fmt_bytes(psutil.virtual_memory().total)} RAM; "
        f"dask {dask.__version__}, distributed {distributed.__version__}, numpy {np.__version__}, "
        f"zarr {zarr.__version__}, dask_scd {getattr(dask_scd, '__version__', '?')} ({git})\n\n"
        f"Command: `{cmd}` ({'quick' if args.quick else 'full'} sizes; run took "
        f"{elapsed / 60:.1f} min; load average at the end {load[0]:.2f} / {load[1]:.2f} / "
        f"{load[2]:.2f} — other processes on this 2-core machine add noise to every timing)"
    )


def _git_state() -> str:
    root = HERE.parent
    try:
        head = subprocess.run(
            ["git", "log", "-1", "--format=%h", "--", "dask_scd"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "dask_scd"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "git state unknown"
    return f"dask_scd/ at git {head}" + (" + uncommitted changes" if dirty else "")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, < 3 min")
    p.add_argument(
        "--no-save", action="store_true", help="print only, do not append to the results"
    )
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--workdir", type=Path, default=DATA, help="where the grid stores are written")
    p.add_argument("--ooc-rows", type=int, help="rows of the out-of-core grid (default: by size)")
    p.add_argument(
        "--ooc-runs",
        help="out-of-core fits, e.g. '512MiB,512MiB:fix,1GiB:fix' "
        "(':fix' = cell-cache bound set to memory_limit/3 by a worker plugin)",
    )
    p.add_argument(
        "--only",
        default="profile,scaling,gap,ooc",
        help="comma-separated sections: profile (tables 1-2), scaling, gap, ooc",
    )
    # internal: sub-processes
    p.add_argument("--_write-grid", dest="_write_grid", help=argparse.SUPPRESS)
    p.add_argument("--_rows", dest="_rows", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_row-chunk", dest="_row_chunk", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_seed", dest="_seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--_ooc-fit", dest="_ooc_fit", help=argparse.SUPPRESS)
    p.add_argument("--_memory", dest="_memory", help=argparse.SUPPRESS)
    p.add_argument("--_epochs", dest="_epochs", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_loss", dest="_loss", default="squared", help=argparse.SUPPRESS)
    p.add_argument("--_cache-fix", dest="_cache_fix", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args._write_grid:
        return _write_grid_main(args)
    if args._ooc_fit:
        return _ooc_fit_main(args)
    _quiet()
    from distributed import Client

    sizes = dict(SIZES["quick" if args.quick else "full"])
    if args.ooc_rows:
        sizes["ooc_rows"] = args.ooc_rows
    if args.ooc_runs:
        stall, timeout = sizes["ooc_runs"][-1][2:]
        sizes["ooc_runs"] = [
            (r.split(":")[0], r.endswith(":fix"), stall, timeout) for r in args.ooc_runs.split(",")
        ]
    only = set(args.only.split(","))
    workdir = args.workdir / ("quick" if args.quick else "full")
    workdir.mkdir(parents=True, exist_ok=True)
    report = Report()
    git_start = _git_state()
    t0 = time.perf_counter()
    try:
        if only & {"profile", "gap"}:
            print(f"[bench_dask] writing the main grid ({sizes['main_rows']:,} rows)", flush=True)
            grid, X, y = write_grid_in_memory(
                workdir / "main.zarr", sizes["main_rows"], sizes["main_chunk"], seed=0
            )
            with cluster(2) as c, Client(c) as client:
                warm_up(client, workdir)
                if "profile" in only:
                    section_profile(report, client, grid, sizes)
                if "gap" in only:
                    section_time_to_gap(report, client, grid, X, y, sizes)
            del X, y
            gc.collect()
        if "scaling" in only:
            print(
                f"[bench_dask] writing the scaling grid ({sizes['scale_rows']:,} rows)", flush=True
            )
            write_grid_subprocess(
                workdir / "scale.zarr", sizes["scale_rows"], sizes["scale_chunk"], seed=1
            )
            from dask_scd.grid import open_grid

            section_scaling(report, open_grid(workdir / "scale.zarr"), sizes)
        if "ooc" in only:
            section_out_of_core(report, sizes, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = header(args, sizes, time.perf_counter() - t0, git_start) + "\n\n" + report.markdown()
    print("\n" + text)
    if not args.no_save:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        with open(args.output, "a") as f:
            f.write(("\n" if args.output.exists() and args.output.stat().st_size else "") + text)
        print(f"[bench_dask] appended to {args.output}")


if __name__ == "__main__":
    main()
