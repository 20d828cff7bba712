"""SA-SDCA: epoch time of ``solver="sdca"`` on one thread against two, synced and wild.

For each problem (logistic L2 on dense 1M × 50 Gaussian rows, and on one-hot 1M ×
100k rows with 20 non-zeros each), fits of ``EPOCHS`` epochs with ``n_threads=1``,
``n_threads=2, sync_every=1`` and ``n_threads=2, sync_every=0`` (wild): wall time per
epoch of the epochs alone (the part the threads share, ``extras_["epoch_seconds"]``) and
of the whole fit (set-up and certificates included, the same schedule for all: epochs
1, 2, 3 and 8), the speed-ups over one thread, and the relative gap the epochs reached. The load average is
recorded with the numbers: other processes on the machine take cores from the threads.
Appends markdown to ``benchmarks/results/sdca.md``.

Run ``make bench-sdca`` (about 2 minutes on 2 cores) or ``--rows 100000`` for a smoke run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from _machine import cpu_model, print_and_append
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd.datasets import make_onehot

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "sdca.md"
EPOCHS = 8
RUNS = (
    ("1 thread", dict(n_threads=1)),
    ("2 threads, sync_every=1", dict(n_threads=2, sync_every=1)),
    ("2 threads, wild (sync_every=0)", dict(n_threads=2, sync_every=0)),
)


def problems(n_rows: int) -> list:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n_rows, 50))
    y = np.where(X @ rng.normal(size=50) + rng.logistic(size=n_rows) > 0, 1.0, -1.0)
    Xs, ys, _ = make_onehot(n_rows, 20, max(n_rows // 200, 10), random_state=0)
    return [(f"dense {n_rows:,} × 50", X, y), (f"one-hot {n_rows:,} × {Xs.shape[1]:,}", Xs, ys)]


def fit(X, y, **threads):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        start = time.perf_counter()
        result = dask_scd.fit(
            X,
            y,
            loss="logistic",
            alpha=1.0 / X.shape[0],
            solver="sdca",
            tol=1e-14,
            max_iter=EPOCHS,
            random_state=0,
            **threads,
        )
        return result, time.perf_counter() - start


def table(name, X, y) -> list[str]:
    lines = [
        f"**logistic L2, alpha = 1/n, {name}**",
        "",
        f"| run | s / epoch, epochs alone | speed-up | s / epoch, whole fit | speed-up "
        f"| relative gap after {EPOCHS} epochs |",
        "|---|---|---|---|---|---|",
    ]
    base = base_fit = None
    for label, threads in RUNS:
        result, seconds = fit(X, y, **threads)
        per_epoch = result.extras_["epoch_seconds"] / result.n_iter_
        per_fit = seconds / result.n_iter_
        base, base_fit = base or per_epoch, base_fit or per_fit
        lines.append(
            f"| {label} | {per_epoch:.3f} | {base / per_epoch:.2f}x | {per_fit:.3f} | "
            f"{base_fit / per_fit:.2f}x | {result.dual_gap_:.2e} |"
        )
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    Xw, yw, _ = make_onehot(2000, 4, 10, random_state=0)  # compile before timing
    for _, threads in RUNS:
        fit(Xw, yw, **threads)
        fit(Xw.toarray(), yw, **threads)
    load_before = os.getloadavg()
    body = []
    for name, X, y in problems(args.rows):
        body += table(name, X, y) + [""]
    load_after = os.getloadavg()
    header = [
        f"## {datetime.date.today()}: {os.cpu_count()} cores, {cpu_model()}, "
        f"{platform.python_version()}",
        "",
        f"`{' '.join([os.path.basename(sys.executable), *sys.argv])}`; load average "
        f"(1, 5, 15 min) before {tuple(round(v, 2) for v in load_before)}, after "
        f"{tuple(round(v, 2) for v in load_after)}.",
        "",
    ]
    print_and_append("\n".join(header + body), RESULTS, save=not args.no_save)


if __name__ == "__main__":
    main()
