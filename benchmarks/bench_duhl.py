"""DuHL against sequential, random and importance residency, with a quarter of X in fast
memory.

For each problem (lasso and elastic net in the primal on dense data with a sparse true
support, a hinge SVM in the dual) and each residency policy: bytes moved into fast
memory, swaps (chunk loads), rounds and wall time to a certified relative duality gap of
1e-4. In memory (the slow side is the matrix itself) and with RAM over a zarr grid on
disk (a chunk is a column block of the grid; the slow side's own reads for gap refreshes
and certificates are counted apart). Appends markdown to ``benchmarks/results/duhl.md``
and saves the gap-against-bytes plot as ``benchmarks/results/duhl.png``.

Run ``make bench-duhl`` (about 5 minutes on 2 cores) or ``--quick`` (smaller data in
memory; the zarr tier always runs at that size).
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse
import datetime
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _machine import cpu_model

from dask_scd import objectives as obj
from dask_scd.data import make_source
from dask_scd.data.memory import InMemory
from dask_scd.engines.base import Options
from dask_scd.engines.local.duhl import fit_duhl, fit_grid
from dask_scd.engines.options import DuHLOptions
from dask_scd.grid import open_grid, to_grid

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "duhl.md"
PLOT = HERE / "results" / "duhl.png"
POLICIES = ("duhl", "sequential", "random", "importance")
TOL = 1e-4


def regression(n, p, support, seed=0):
    """Dense Gaussian X; y from ``support`` of its columns plus noise."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    beta = np.zeros(p)
    beta[rng.choice(p, support, replace=False)] = 2.0 * rng.normal(size=support)
    return X, X @ beta + 0.5 * rng.normal(size=n)


def classification(n, p, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    return X, np.sign(X @ rng.normal(size=p) + 0.5 * rng.normal(size=n))


def cases(quick: bool) -> list:
    scale = 2 if quick else 1
    Xr, yr = regression(5000 // scale, 1000 // scale, 50 // scale)
    Xc, yc = classification(8000 // scale, 200 // scale)
    return [
        ("lasso", Xr, yr, obj.Problem("squared", 0.1, 1.0, True), 4, 300),
        ("elastic net", Xr, yr, obj.Problem("squared", 0.1, 0.5, True), 4, 300),
        ("hinge SVM (dual)", Xc, yc, obj.Problem("hinge", 1e-2, 0.0, True), 16, 1000),
    ]


def run(fit, data, problem, policy, chunk_size, max_iter, budget):
    engine = {"memory_budget": budget, "residency": policy, "local_epochs": 2}
    if chunk_size is not None:
        engine["chunk_size"] = chunk_size
    options = Options(TOL, max_iter, np.random.default_rng(0), engine=DuHLOptions(**engine))
    start = time.perf_counter()
    result = fit(data, problem, options)
    return result, time.perf_counter() - start


def table(name, nbytes, rows, zarr=False) -> list[str]:
    seq = next(r for p, r, _ in rows if p == "sequential")
    head = (
        "| policy | rounds | reached 1e-4 | swaps | bytes moved | × X | vs sequential "
        "| wall (s) |" + (" slow side read |" if zarr else "")
    )
    lines = [
        f"**{name}** (X: {nbytes / 2**20:.1f} MiB, budget 25 %)",
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    for policy, r, seconds in rows:
        e = r.extras
        reached = r.converged(TOL)
        ratio = seq.extras["bytes_moved"] / max(e["bytes_moved"], 1)
        mark = "" if reached and seq.converged(TOL) else " (≥)" if not seq.converged(TOL) else ""
        line = (
            f"| {policy} | {r.n_iter} | {'yes' if reached else 'no'} "
            f"({r.certificate.relative_gap:.1e}) | {e['swaps']} | "
            f"{e['bytes_moved'] / 2**20:.1f} MiB | {e['bytes_moved'] / nbytes:.2f} | "
            f"{ratio:.1f}x{mark} | {seconds:.2f} |"
        )
        if zarr:
            line += f" {e['slow_bytes_read'] / 2**20:.0f} MiB |"
        lines.append(line)
    return lines + [""]


def plot(curves, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 4))
    for ax, (name, nbytes, rows) in zip(np.atleast_1d(axes), curves):
        for policy, r, _ in rows:
            rounds = r.extras["rounds"]
            ax.semilogy(
                np.array(rounds["bytes_moved"]) / nbytes, rounds["relative_gap"], label=policy
            )
        ax.axhline(TOL, color="gray", lw=0.5)
        ax.set_title(name)
        ax.set_xlabel("bytes moved into fast memory / bytes of X")
        ax.set_ylabel("relative duality gap")
        ax.set_xscale("log")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    out, curves = [], []
    warm = regression(200, 40, 4)
    run(
        fit_duhl,
        InMemory(*warm),
        obj.Problem("squared", 0.1, 1.0, True),
        "duhl",
        4,
        5,
        warm[0].nbytes,
    )  # compile the kernels outside the timings
    out.append("### In memory (the slow side is the matrix; a load is a copy)\n")
    for name, X, y, problem, chunk, max_iter in cases(args.quick):
        rows = []
        for policy in POLICIES:
            r, seconds = run(
                fit_duhl, InMemory(X, y), problem, policy, chunk, max_iter, X.nbytes // 4
            )
            rows.append((policy, r, seconds))
            print(
                f"{name:18s} {policy:11s} rounds {r.n_iter:4d} "
                f"gap {r.certificate.relative_gap:.1e} "
                f"bytes {r.extras['bytes_moved'] / X.nbytes:7.2f} x  {seconds:6.2f} s",
                flush=True,
            )
        out += table(name, X.nbytes, rows)
        curves.append((name, X.nbytes, rows))
    out.append("### RAM over a zarr grid on disk (a chunk is a column block of 4 features)\n")
    with tempfile.TemporaryDirectory() as tmp:
        # At the quick size whatever the run: every round's certificate reads the grid.
        for name, X, y, problem, chunk, max_iter in cases(True)[:2]:
            path = Path(tmp) / f"{name.replace(' ', '_')}.zarr"
            if not path.exists():
                to_grid(X, y, str(path), row_chunk=X.shape[0], blocks=chunk)
            grid = open_grid(path)
            rows = []
            for policy in POLICIES:
                source = make_source(grid, None, problem.loss, None)
                r, seconds = run(fit_grid, source, problem, policy, None, max_iter, X.nbytes // 4)
                rows.append((policy, r, seconds))
                print(
                    f"zarr {name:13s} {policy:11s} rounds {r.n_iter:4d} bytes "
                    f"{r.extras['bytes_moved'] / X.nbytes:7.2f} x  {seconds:6.2f} s",
                    flush=True,
                )
            out += table(
                f"{name}, zarr grid {grid.n_row_chunks} x {grid.n_blocks} cells",
                X.nbytes,
                rows,
                zarr=True,
            )
    text = "\n".join([header(args)] + out)
    print(text)
    if not args.no_save:
        RESULTS.parent.mkdir(exist_ok=True)
        with open(RESULTS, "a", encoding="utf-8") as f:
            f.write(text + "\n")
        plot(curves, PLOT)
        print(f"appended to {RESULTS}; plot in {PLOT}")


def header(args) -> str:
    root = HERE.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    command = "python benchmarks/bench_duhl.py " + " ".join(sys.argv[1:])
    return (
        f"## {now} — {cpu_model()}, {platform.python_version()}, commit {commit}, "
        f"load {os.getloadavg()[0]:.1f}\n\n`{command.strip()}`; one thread; "
        f"local_epochs=2, gap memory refreshed by the certificate of every round; "
        f"rounds capped per problem (sequential on the SVM does not reach 1e-4: its "
        f"ratio is a lower bound, marked ≥).\n"
    )


if __name__ == "__main__":
    main()
