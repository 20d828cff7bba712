"""Out of core where the data do not fit the machine: the out-of-core fit of
``bench_scale.py`` (``--cgroup-memory``) run inside a memory cgroup, whose limit counts the
page cache as well as the processes' own memory.

Without it the operating system's page cache keeps the whole store (and the workers'
spill files) after the first pass, and no later pass reads the disk. Here the fit's
process tree (the client with its scheduler and nannies, the LocalCluster's workers) runs
in a fresh memory cgroup (v1 ``memory.limit_in_bytes`` or v2 ``memory.max``; made by
``_cgroup.py``) after the page cache was dropped, with the grid and the spill files many
times what the limit leaves to the page cache: every pass reads them from the disk. Per epoch (the fit's callback): the time and the bytes read
from the block device holding the work directory (``/proc/diskstats``) and by the
cgroup (v1 ``blkio.throttle.io_service_bytes``, v2 ``io.stat``). Against it: the disk's
sequential read speed (a file read with ``O_DIRECT``), which makes the floor of a pass,
and the same fit in core (large workers, no cgroup, page cache warm), whose coefficients
must be the same bits.

Needs root and a cgroup memory controller; without them the section is skipped with one
line saying why.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _cgroup import (
    MemoryCgroup,
    UsagePoller,
    detect,
    device_of,
    drop_caches,
    floor_seconds,
    parse_diskstats,
    per_pass,
    read_text,
    read_tree,
    sequential_read_speed,
    skip_message,
)

# ------------------------------------------------------------------------ the runs


def run_fit(scale, path, memory, epochs, timeout, probe_dir, cgroup=None, tol=None) -> dict:
    """``bench_scale.py --_ooc`` in a fresh process (in ``cgroup`` when given, which
    its children inherit) with an :class:`EpochProbe` as the fit's callback; θ and b
    saved in ``probe_dir``; ``tol`` the fit's (default: 1e-12, so that ``epochs`` are
    run). Returns {"outcome", "result"} as ``run_ooc``."""
    cmd = [sys.executable, scale.__file__, "--_ooc", str(path), "--_memory", str(memory)]
    cmd += ["--_epochs", str(epochs), "--_probe", str(probe_dir)]
    cmd += [] if tol is None else ["--_tol", repr(tol)]
    Path(probe_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(probe_dir) / "stderr.txt", "w") as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
            preexec_fn=None if cgroup is None else cgroup.enter,
        )
        try:
            stdout, _ = proc.communicate(timeout=timeout)
            outcome = "finished" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            stdout, _ = proc.communicate()
            outcome = f"over cap ({timeout:.0f} s)"
    res = [json.loads(x.split(" ", 1)[1]) for x in stdout.splitlines() if x.startswith("RESULT")]
    return {"outcome": outcome, "result": res[-1] if res else None}


def same_bits(dir_a, dir_b) -> bool | None:
    """Whether the two fits saved the same θ and b, byte for byte (None: one is missing)."""
    try:
        a, b = (np.load(Path(d) / "coef.npz") for d in (dir_a, dir_b))
    except OSError:
        return None
    return bool(
        np.array_equal(a["coef"], b["coef"])
        and a["coef"].tobytes() == b["coef"].tobytes()
        and a["intercept"].tobytes() == b["intercept"].tobytes()
    )


def save_fit(probe_dir, result) -> None:
    """θ and b of a fit, for :func:`same_bits`."""
    np.savez(
        Path(probe_dir) / "coef.npz",
        coef=np.asarray(result.coef_, dtype=np.float64).ravel(),
        intercept=np.asarray(result.intercept_, dtype=np.float64),
    )


# ------------------------------------------------------------------------ the section

DEFAULT_ROWS = 13_000_000
DEFAULT_WORKER_MEMORY = "640MiB"  # the 13M-row grid's workers (benchmarks/results/scale.md)


def main_cgroup(scale, args) -> None:
    """``bench_scale.py --cgroup-memory LIMIT``: the disk's read speed, the grid written,
    the fit in a cgroup of LIMIT and in core, one section appended to ``--output``."""
    support = detect()
    if support.version == 0:
        print(skip_message(support), flush=True)
        return
    started = time.perf_counter()
    limit = scale._parse_bytes(args.cgroup_memory)
    worker = scale._parse_bytes(args.ooc_memory or DEFAULT_WORKER_MEMORY)
    rows = args.ooc_rows or DEFAULT_ROWS
    workdir = args.workdir / "cgroup"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    commit = scale.library_commit()
    scale.log("== disk: sequential read speed (O_DIRECT)")
    speed = sequential_read_speed(workdir)
    scale.log(f"  {speed['speed'] / 1e6:.0f} MB/s ({speed['method']})")
    grid = workdir / "ooc.zarr"
    written = write_grid(scale, grid, rows, args.data)
    if written is None:
        return
    runs = fit_runs(scale, support, grid, limit, worker, written, args)
    # again after the fits: the disk is shared with the machine's other work
    again = sequential_read_speed(workdir)
    scale.log(f"  disk again: {again['speed'] / 1e6:.0f} MB/s")
    speed = {**max(speed, again, key=lambda x: x["speed"]), "both": (speed, again)}
    facts = {
        "support": support,
        "limit": limit,
        "worker": worker,
        "speed": speed,
        "written": written,
        "commit": commit,
        "elapsed": time.perf_counter() - started,
        "device": parse_diskstats(read_text("/proc/diskstats")).get(device_of(grid), ("?",))[0],
    }
    text = report(scale, args, facts, runs)
    shutil.rmtree(workdir, ignore_errors=True)
    from _machine import print_and_append

    print_and_append(text, args.output, save=not args.no_save)


def write_grid(scale, grid, rows: int, data: str) -> dict | None:
    """``bench_scale.py --_write``: the grid of ``rows`` rows of the data set ``data``
    written piece by piece in a fresh process; its RESULT (seconds, nnz, shape, peak
    RSS, bytes on disk), or None after one line saying why it failed."""
    scale.log(f"== writing {rows:,} rows piece by piece")
    cmd = [sys.executable, scale.__file__, "--_write", str(grid), "--_rows", str(rows)]
    out = subprocess.run(cmd + ["--data", data], capture_output=True, text=True)
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT")]
    if not lines:
        print(f"writing the grid failed: {out.stderr[-600:]}", flush=True)
        return None
    written = json.loads(lines[-1].split(" ", 1)[1])
    scale.log(f"  {scale.fmt_bytes(written['disk'])} in {scale.fmt_s(written['seconds'])}")
    return written


def incore_memory(scale, nnz: int) -> int:
    """memory_limit per worker of the in-core run: the grid in the workers' cell caches
    (``section_ooc``'s rule)."""
    stored = nnz * 12
    return max(4 * 2**30, int((stored + scale.OOC_FLOOR) / 0.8) + 2**28)


def fit_runs(scale, support, grid, limit, worker, written, args) -> dict:
    """The fits: in the cgroup after the page cache was dropped; with ``--cgroup-warm``
    the same workers without it (page cache warm); in core. Name → run_fit's answer."""
    epochs, cap = args.cgroup_epochs, args.cap or 300.0
    timeout = cap * (epochs + 2)
    work = Path(grid).parent
    runs = {}
    scale.log(f"== fit in a cgroup of {scale.fmt_bytes(limit)}, workers {scale.fmt_bytes(worker)}")
    drop_caches()
    cgroup = MemoryCgroup(support, f"dask_scd_ooc_{os.getpid()}", limit)
    try:
        cgroup.create(device_of(grid))
        poller = UsagePoller(cgroup)
        poller.start()
        runs["out of core (cgroup)"] = run_fit(
            scale, grid, worker, epochs, timeout, work / "cgroup", cgroup
        )
        poller.stop()
        runs["out of core (cgroup)"]["memory"] = {
            **cgroup.stats(),
            "rss": poller.rss,
            "cache": poller.cache,
        }
    finally:
        cgroup.remove()
    shutil.rmtree(work / "scratch", ignore_errors=True)
    incore = incore_memory(scale, written["nnz"])
    plan = [("in core", incore, "incore")]
    if args.cgroup_warm:
        plan.insert(0, ("same workers, no cgroup", worker, "warm"))
    for label, memory, folder in plan:
        scale.log(f"== fit {label}, workers {scale.fmt_bytes(memory)}, page cache warm")
        read_tree(grid)
        runs[label] = run_fit(scale, grid, memory, epochs, timeout, work / folder)
        runs[label]["worker"] = memory
        runs[label]["same_bits"] = same_bits(work / folder, work / "incore")
        shutil.rmtree(work / "scratch", ignore_errors=True)
    runs["out of core (cgroup)"]["worker"] = worker
    runs["out of core (cgroup)"]["same_bits"] = same_bits(work / "cgroup", work / "incore")
    for name, r in runs.items():
        scale.log(f"  {name}: {r['outcome']}")
    return runs


def pass_figures(run: dict) -> dict:
    """Per-epoch (seconds, device bytes, cgroup bytes) of a run, and the steady passes'
    means (epochs 2 on: the first holds the setup, the start's certificate and, out of
    core, the spill files' writing)."""
    samples = (run.get("result") or {}).get("probe") or []
    disk, io = per_pass(samples, "disk"), per_pass(samples, "io")
    epochs = [(e, s, d, i[2]) for (e, s, d), i in zip(disk, io)]
    steady = epochs[1:] or epochs

    def mean(k):
        values = [x[k] for x in steady if x[k] is not None]
        return sum(values) / len(values) if values else None

    return {"epochs": epochs, "seconds": mean(1), "disk": mean(2), "io": mean(3)}


def ratio(a, b) -> str:
    return f"{a / b:.2f}" if a is not None and b else "—"


def run_table(scale, runs: dict, data: int, speed: float) -> str:
    """One line per run: where it ran, its time per pass, what a pass read."""
    b, s = scale.fmt_bytes, scale.fmt_s
    rows = []
    for name, r in runs.items():
        res, f = r.get("result") or {}, pass_figures(r)
        mem = r.get("memory")
        cache = res.get("cache") or []
        first = f["epochs"][0][1] if f["epochs"] else None
        rows.append(
            [
                name,
                b(r["worker"]),
                r["outcome"],
                len(f["epochs"]) or "—",
                s(first),
                f"**{s(f['seconds'])}**" if f["seconds"] else "—",
                "—" if f["disk"] is None else b(f["disk"]),
                "—" if f["io"] is None else b(f["io"]),
                ratio(f["io"] if f["io"] is not None else f["disk"], data),
                s(floor_seconds(f["io"] if f["io"] is not None else f["disk"], speed)),
                "—" if mem is None else f"{b(mem['rss'])} / {b(mem['cache'])}",
                " / ".join(b(v) for v in res.get("worker_peaks", [])) or "—",
                b(sum(c[4] for c in cache)) if cache else "—",
                {True: "yes", False: "**no**", None: "—"}[r.get("same_bits")],
            ]
        )
    head = [
        "run",
        "memory_limit / worker",
        "outcome",
        "epochs",
        "epoch 1 (+ setup)",
        "time / pass (epochs 2+)",
        "device read / pass",
        "cgroup read / pass",
        "read / (grid + spill)",
        "floor at disk speed",
        "cgroup peak: processes / page cache",
        "worker peak RSS",
        "spill files",
        "θ, b = in core's bits",
    ]
    return scale.md_table(head, rows)


def epoch_table(scale, runs: dict, speed: float) -> str:
    """Every epoch of every run: seconds, bytes read, the disk's floor for them."""
    b, s = scale.fmt_bytes, scale.fmt_s
    rows = []
    for name, r in runs.items():
        for epoch, seconds, disk, io in pass_figures(r)["epochs"]:
            read = io if io is not None else disk
            floor = floor_seconds(read, speed)
            rows.append(
                [
                    name,
                    epoch,
                    s(seconds),
                    "—" if disk is None else b(disk),
                    "—" if io is None else b(io),
                    s(floor),
                    ratio(floor, seconds),
                ]
            )
    head = ["run", "epoch", "seconds", "device read", "cgroup read", "floor", "floor / time"]
    return scale.md_table(head, rows)


def report(scale, args, facts: dict, runs: dict) -> str:
    """The section: machine, command, what was run, the two tables, the ratios."""
    import datetime
    import platform
    import shlex

    import dask
    import distributed
    import psutil
    import zarr
    from _machine import cpu_model

    b, s, w = scale.fmt_bytes, scale.fmt_s, facts["written"]
    ooc = runs["out of core (cgroup)"]
    cache = (ooc.get("result") or {}).get("cache") or []
    spill = sum(c[4] for c in cache)
    data = w["disk"] + spill
    speed = facts["speed"]
    f_ooc, f_in = pass_figures(ooc), pass_figures(runs["in core"])
    cmd = " ".join(shlex.quote(a) for a in ["benchmarks/bench_scale.py", *args.argv])
    load = os.getloadavg()
    version = facts["support"].version
    limit_file = "memory.limit_in_bytes" if version == 1 else "memory.max"
    io_file = "blkio.throttle.io_service_bytes" if version == 1 else "io.stat"
    return (
        f"## {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} — {cpu_model()}, "
        f"{os.cpu_count()} cores, {b(psutil.virtual_memory().total)} RAM (out of core under "
        "a memory cgroup)\n\n"
        f"Command: `{cmd}` (run took {facts['elapsed'] / 60:.1f} min; load average at the "
        f"end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}); library at {facts['commit']}; "
        f"Linux {platform.release()}, cgroup v{version}; numpy {np.__version__}, dask "
        f"{dask.__version__}, distributed {distributed.__version__}, zarr {zarr.__version__}."
        "\n\n"
        f"Grid: {w['shape'][0]:,} rows x {w['shape'][1]:,} features, {w['nnz']:,} "
        f"non-zeros, **{b(w['disk'])} on disk** (zstd), written in {s(w['seconds'])} "
        f"piece by piece; the workers' spill files (decoded cells, written in the first "
        f"epoch) {b(spill)}: **grid + spill = {b(data)}**, "
        f"{data / facts['limit']:.2f}x the cgroup's limit of **{b(facts['limit'])}** "
        f"({limit_file}; it counts the processes' memory and the page cache they fill). "
        f"Disk: {facts['device']}, sequential read **{speed['speed'] / 1e6:.0f} MB/s** "
        f"(a {b(speed['bytes'])} file read with {speed['method']}, page cache dropped: "
        + " before the fits and ".join(f"{x['speed'] / 1e6:.0f} MB/s" for x in speed["both"])
        + " after; the faster is the floor's). block_scd, logistic "
        f"L2 alpha = 1/n, {args.cgroup_epochs} epochs, random_state=0, 2 LocalCluster "
        "workers x 1 thread, each fit in a fresh process. Out of core: that process and "
        "every process it starts (scheduler, nannies, workers) in a fresh memory cgroup, "
        "the page cache dropped first (`sync; echo 3 > /proc/sys/vm/drop_caches`). In "
        f"core: workers of {b(incore_memory(scale, w['nnz']))} (the grid fits in their "
        "cell caches), no cgroup, the grid read into the page cache first. Per epoch, "
        "from the fit's callback: the time and the bytes read from the device holding the "
        "grid (/proc/diskstats: every process on the machine) and by the cgroup "
        f"({io_file}: its processes alone); floor = bytes read / the disk's sequential "
        "speed. 'cgroup peak': the most process memory (rss) and page cache (cache) "
        "polled in memory.stat.\n\n"
        + run_table(scale, runs, data, speed["speed"])
        + "\n\n"
        + epoch_table(scale, runs, speed["speed"])
        + "\n\nTime per pass out of core (in the cgroup) / in core: "
        f"**{ratio(f_ooc['seconds'], f_in['seconds'])}** "
        f"({s(f_ooc['seconds'])} / {s(f_in['seconds'])}). θ and b of the out-of-core fit "
        "equal the in-core fit's byte for byte: "
        f"**{ {True: 'yes', False: 'no', None: 'not compared'}[ooc.get('same_bits')] }**.\n"
    )
