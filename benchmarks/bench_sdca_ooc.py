"""Out-of-core SDCA on a grid against in-memory SDCA on the same data, the out-of-core
fit held to a third of the decoded grid.

Writes a dense grid (logistic labels, ``--rows`` × ``--features`` float64, row chunks of
``--row-chunk`` rows, three column blocks) to a temporary directory, then fits
``--epochs`` epochs of ``solver="sdca"`` (logistic L2, alpha = 1/n, certificates on the
engines' common schedule: epochs 1, 2, 3, then when the iterate settles or every 5
epochs, and the last) three ways, each in its own subprocess:

- in memory: the grid read into memory first (``GridSource.materialize``), then
  ``fit(X, y, solver="sdca")``;
- out of core, row chunks in a fresh random order each epoch (``chunk_order="random"``);
- out of core, row chunks in storage order (``chunk_order="sequential"``);
- out of core, random order, the row chunks kept decoded in a temporary file after the
  first pass (``spill=True``: later passes read them back instead of decoding the grid).

The limit is a third of the decoded grid, the acceptance's "grid 3× a worker's memory
limit". It is not imposed by ``RLIMIT_AS`` (numba's and BLAS's address-space
reservations would trip it long before the resident memory does): each subprocess
resets its peak resident memory (``VmHWM``, by writing 5 to /proc/self/clear_refs) after
the imports and a warm-up fit of the numba kernels on a tiny grid, and the table compares
the peak above the resident memory at that point with the limit.
Appends markdown to ``benchmarks/results/sdca_ooc.md``.

Run ``make bench-sdca-ooc`` (a 366 MiB grid: about a minute on a 2-core machine) or
``--rows 20000 --no-save`` for a smoke run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _machine import cpu_model, print_and_append

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "sdca_ooc.md"
EPOCHS = 10
RUNS = (
    ("in memory (grid read first)", "memory"),
    ("out of core, random chunk order", "random"),
    ("out of core, chunks in storage order", "sequential"),
    ("out of core, random chunk order, spill=True", "spill"),
)


def write_grid(path: Path, n_rows: int, n_features: int, row_chunk: int) -> None:
    """Dense logistic data written row chunk by row chunk (never all of it in memory)."""
    import dask.array as da

    from dask_scd.grid import to_grid

    rng = np.random.default_rng(0)
    theta = rng.normal(size=n_features)
    X = da.random.default_rng(1).normal(size=(n_rows, n_features), chunks=(row_chunk, -1))
    noise = da.random.default_rng(2).logistic(size=n_rows, chunks=row_chunk)
    y = da.where(X @ theta + noise > 0, 1.0, -1.0)
    to_grid(X, y, path, row_chunk=row_chunk, blocks=-(-n_features // 3))


def _reset_peak() -> bool:
    """VmHWM := VmRSS (Linux ≥ 4.0); False where /proc refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _cpu_seconds() -> float:
    """User and system CPU time of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _memory_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def child(path: str, mode: str, epochs: int) -> None:
    """One measured fit (run in a subprocess); prints a JSON line."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    import dask_scd
    from dask_scd.data.sources import make_source
    from dask_scd.grid import open_grid, to_grid

    warnings.simplefilter("ignore", ConvergenceWarning)
    rng = np.random.default_rng(0)
    small = rng.normal(size=(256, 6))
    labels = np.sign(small[:, 0] + 0.1)
    with tempfile.TemporaryDirectory() as tmp:  # warm-up: numba kernels, zarr's readers
        warm = to_grid(small, labels, Path(tmp) / "warm.zarr", row_chunk=64, blocks=2)
        dask_scd.fit(warm, loss="logistic", solver="sdca", max_iter=2)
        dask_scd.fit(
            *make_source(warm, None, "logistic", None).materialize(),
            loss="logistic",
            solver="sdca",
            max_iter=2,
        )
    baseline = _memory_kib("VmRSS")
    reset = _reset_peak()
    grid = open_grid(path)
    n = grid.shape[0]
    kw = dict(
        loss="logistic", alpha=1.0 / n, solver="sdca", tol=1e-14, max_iter=epochs, random_state=0
    )
    read, passes = 0.0, None
    if mode == "memory":
        start = time.perf_counter()
        X, y = make_source(grid, None, "logistic", None).materialize()
        read = time.perf_counter() - start
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        result = dask_scd.fit(X, y, **kw)
    else:
        engine = (
            dict(chunk_order="random", spill=True) if mode == "spill" else dict(chunk_order=mode)
        )
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        result = dask_scd.fit(grid, **engine, **kw)
        passes = result.extras_["read_passes"]
    seconds = time.perf_counter() - start
    cpu = _cpu_seconds() - cpu_start
    print(
        json.dumps(
            dict(
                seconds=seconds,
                cpu=cpu,
                read=read,
                passes=passes,
                gap=result.dual_gap_,
                epochs=result.n_iter_,
                peak_kib=_memory_kib("VmHWM") - baseline,
                baseline_kib=baseline,
                reset=reset,
                certificates=len(result.history_.iteration),
                load=os.getloadavg()[0],
            )
        )
    )


def measure(path: Path, mode: str, epochs: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(path), mode, str(epochs)],
        check=True,
        capture_output=True,
        text=True,
        cwd=os.getcwd(),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--features", type=int, default=120)
    parser.add_argument("--row-chunk", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, mode, epochs = args.child
        child(path, mode, int(epochs))
        return
    decoded = args.rows * args.features * 8
    limit = decoded / 3
    chunk_bytes = args.row_chunk * args.features * 8
    with tempfile.TemporaryDirectory(prefix="bench-sdca-ooc-") as tmp:
        path = Path(tmp) / "grid.zarr"
        start = time.perf_counter()
        write_grid(path, args.rows, args.features, args.row_chunk)
        written = time.perf_counter() - start
        rows = [(label, measure(path, mode, args.epochs)) for label, mode in RUNS]
    mib = 2.0**20
    in_memory = rows[0][1]["seconds"] / rows[0][1]["epochs"]
    in_memory_cpu = rows[0][1]["cpu"] / rows[0][1]["epochs"]
    reset = all(r["reset"] for _, r in rows)
    peak_from = (
        "the reset"
        if reset
        else "the start (/proc/self/clear_refs refused the reset; the warm-up's peak counts too)"
    )
    lines = [
        f"## {datetime.datetime.now():%Y-%m-%d %H:%M}, {cpu_model()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}",
        "",
        f"Logistic L2, alpha = 1/n, dense {args.rows:,} × {args.features} float64 grid "
        f"(decoded {decoded / mib:.0f} MiB; row chunks of {args.row_chunk:,} rows, "
        f"{chunk_bytes / mib:.1f} MiB each; written in {written:.1f} s), {args.epochs} epochs. "
        "s / epoch: the fit's wall time (the start, every certificate and, out of core, "
        "every read included; in memory, reading the grid first not included) over the "
        "epochs; CPU s / epoch: the CPU time of all the fit's threads over the epochs (the "
        "reading thread included; on a loaded machine the wall time depends on how much of a "
        "second core the reading thread gets, the CPU time does not). Limit: a third of the "
        "decoded grid (the grid is 3× a worker's memory). "
        "Peak RSS: VmHWM of the fitting process since " + peak_from + ", above its RSS "
        "after the imports and warm-up fits on a tiny grid (measured, not imposed: "
        "RLIMIT_AS misjudges numba's reservations; spill=True's file is in the page cache "
        "and on disk, not in the process). Load: 1-minute load average at the end of each "
        "run.",
        "",
        "| run | s / epoch | × in memory | CPU s / epoch | × in memory | read passes of the "
        "grid | certificates | peak RSS above baseline (MiB) | limit (MiB) | peak / limit | "
        "relative gap | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, r in rows:
        peak = r["peak_kib"] * 1024
        per_epoch, cpu = r["seconds"] / r["epochs"], r["cpu"] / r["epochs"]
        passes = "1 (reading first)" if r["passes"] is None else str(r["passes"])
        lines.append(
            f"| {label} | {per_epoch:.3f} | {per_epoch / in_memory:.2f} | {cpu:.3f} | "
            f"{cpu / in_memory_cpu:.2f} | {passes} | "
            f"{r['certificates']} | {peak / mib:.0f} | {limit / mib:.0f} | "
            f"{peak / limit:.2f} | {r['gap']:.2e} | {r['load']:.1f} |"
        )
    lines.append("")
    print_and_append("\n".join(lines), RESULTS, save=not args.no_save)


if __name__ == "__main__":
    main()
