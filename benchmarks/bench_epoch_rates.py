"""The in-memory engines' speed on the scale benchmark's data, one thread:
``bench_scale.py --epoch-rates ROWS`` (with its ``--data``).

The grid's epoch on the workers is compared with it (non-zeros per second per worker
against the same engine in memory on one thread). For logistic and squared L2 at
alpha = 1/n: coordinate descent (``scd``, the per-coordinate kernel) and block SCD in
memory (``block_scd``, the block kernels the grid's workers run), 6 epochs each after a
warm-up fit on a slice (numba's compilation), random_state=0. An epoch's time = the
history's seconds between its first and last certified iterations over the epochs between
them (the first epoch, holding the setup, left out); non-zeros per second = nnz(X) /
that time. Runs in a fresh process whose BLAS, OpenMP and numba use one thread.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from _machine import cpu_model, print_and_append

ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
PROBLEMS = ("logistic", "squared")
SOLVERS = ("scd", "block_scd")


def steady_epoch(seconds: list, iterations: list) -> float:
    """Seconds an epoch, from a history's certified iterations after the first."""
    if len(iterations) < 2:
        return seconds[-1] / max(iterations[-1], 1)
    return (seconds[-1] - seconds[0]) / (iterations[-1] - iterations[0])


def _measure(rows: int, data: str) -> None:
    """(in the one-thread process) every rate, one RESULT line each."""
    import warnings

    warnings.filterwarnings("ignore")
    import bench_scale

    import dask_scd

    bench_scale.DATASET = data
    X, y, _ = bench_scale.make_data(rows, seed=0)
    X = X.tocsr()
    for loss in PROBLEMS:
        for solver in SOLVERS:
            kw = {"loss": loss, "alpha": 1.0 / rows, "solver": solver, "tol": 1e-12}
            dask_scd.fit(X[:20_000], y[:20_000], max_iter=2, **kw)
            h = dask_scd.fit(X, y, max_iter=6, random_state=0, **kw).history_
            epoch = steady_epoch(h.seconds, h.iteration)
            out = {"loss": loss, "solver": solver, "epoch": epoch, "nnz": int(X.nnz)}
            print("RESULT", json.dumps(out), flush=True)


def measure(scale, rows: int, data: str) -> list:
    """The rates, measured in a fresh one-thread process."""
    env = {**os.environ, **dict.fromkeys(ONE_THREAD, "1")}
    cmd = [sys.executable, __file__, "--_rows", str(rows), "--_data", data]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    found = [json.loads(x.split(" ", 1)[1]) for x in out.stdout.splitlines() if x[:6] == "RESULT"]
    if not found:
        scale.log(f"epoch rates failed: {out.stderr[-600:]}")
    return found


def main_rates(scale, args) -> None:
    """``bench_scale.py --epoch-rates ROWS``: the table, appended to ``--output``."""
    import datetime

    rows = args.epoch_rates
    found = measure(scale, rows, args.data)
    table = scale.md_table(
        ["loss", "engine (in memory, one thread)", "time / epoch", "non-zeros / s"],
        [
            [
                r["loss"],
                r["solver"],
                scale.fmt_s(r["epoch"]),
                f"{r['nnz'] / r['epoch'] / 1e6:.1f} M",
            ]
            for r in found
        ],
    )
    nnz = found[0]["nnz"] if found else 0
    text = (
        f"## {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} — {cpu_model()}, "
        "the in-memory engines' epoch on one thread\n\n"
        f"Command: `benchmarks/bench_scale.py {' '.join(args.argv)}`; library at "
        f"{scale.library_commit()}. Data: {scale.data_description()} at {rows:,} rows "
        f"({nnz:,} non-zeros), L2 alpha = 1/n, intercept. {' '.join(__doc__.split(chr(10) * 2, 1)[1].split())}"
        "\n\n" + table + "\n"
    )
    print_and_append(text, args.output, save=not args.no_save)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    argv = sys.argv[1:]
    _measure(int(argv[argv.index("--_rows") + 1]), argv[argv.index("--_data") + 1])
