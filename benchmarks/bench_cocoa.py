"""Benchmark of the CoCoA engine (``solver="cocoa"``): aggregation and parts.

Two tables, printed and appended as markdown to ``benchmarks/results/cocoa.md``:

1. Rounds and seconds to a relative duality gap of 1e-3 and 1e-5 for the aggregations
   "adaptive", "average" and "add" at K = 2, 4, 8 parts, in memory (the parts solved one
   after the other in this process: the rounds are what a cluster would run, the seconds
   are the work of all parts together). Data: Adult (``a8a`` from the shared data folder,
   skipped when absent), generated dense (Gaussian, AR(1) correlation 0.5 between
   neighbouring columns) and generated one-hot (``make_onehot``, pure blocks).
2. CoCoA against block SCD on the same dask input (a LocalCluster of 2 workers, one thread
   each, in this process): seconds and iterations (rounds, epochs) to 1e-5.

Run ``python benchmarks/bench_cocoa.py`` (about 10 minutes on 2 busy cores) or
``--quick``. See benchmarks/README.md.
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from _machine import cpu_model, print_and_append  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "cocoa.md"
ADULT = HERE.parents[1] / "shared" / "data" / "a8a"
TARGETS = (1e-3, 1e-5)
AGGREGATIONS = ("adaptive", "average", "add")
PARTS = (2, 4, 8)


def _dense(n, p, seed=0):
    rng = np.random.default_rng(seed)
    X = np.empty((n, p))
    X[:, 0] = rng.standard_normal(n)
    for j in range(1, p):  # AR(1): neighbouring columns correlated 0.5
        X[:, j] = 0.5 * X[:, j - 1] + np.sqrt(0.75) * rng.standard_normal(n)
    w = np.zeros(p)
    w[rng.choice(p, p // 4, replace=False)] = rng.standard_normal(p // 4)
    return X, X @ w + rng.standard_normal(n)


def datasets(quick: bool) -> list:
    """(name, X, y, loss, alpha, dask chunks) of each problem."""
    from dask_scd.datasets import make_onehot

    n = 5_000 if quick else 20_000
    out = []
    if ADULT.exists():
        from sklearn.datasets import load_svmlight_file

        X, y = load_svmlight_file(str(ADULT), n_features=123)
        # alpha = 1e-2 (C ≈ 0.004): at alpha = 1/n no aggregation reaches 1e-3 in 300 rounds.
        out.append(("Adult a8a logistic α=1e-2", X.tocsr(), y, "logistic", 1e-2, None))
    else:
        print(f"skipping Adult: {ADULT} is absent")
    X, y = _dense(n, 64)
    out.append((f"dense {n}x64 ridge", X, y, "squared", 1e-3, (n // 2, 16)))
    X, y, _ = make_onehot(n, n_fields=8, cardinality=50, task="regression", random_state=0)
    out.append((f"one-hot {n}x400 ridge", X.tocsr(), y, "squared", 1e-3, None))
    return out


def _reached(history, target):
    """(rounds, seconds) at the first certified iteration at or below ``target``."""
    for it, gap, sec in zip(history.iteration, history.relative_gap, history.seconds):
        if gap <= target:
            return it, sec
    return None, None


def _cell(value, fmt):
    return "—" if value is None else fmt.format(value)


def aggregation_table(problems, max_iter) -> str:
    import dask_scd

    lines = [
        "| data | K | aggregation | rounds to 1e-3 | s to 1e-3 | rounds to 1e-5 | "
        "s to 1e-5 | mean γ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, X, y, loss, alpha, _ in problems:
        for K in PARTS:
            for aggregation in AGGREGATIONS:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    result = dask_scd.fit(
                        X,
                        y,
                        loss=loss,
                        alpha=alpha,
                        solver="cocoa",
                        tol=min(TARGETS),
                        max_iter=max_iter,
                        n_partitions=K,
                        aggregation=aggregation,
                        random_state=0,
                    )
                cells = []
                for target in TARGETS:
                    rounds, seconds = _reached(result.history_, target)
                    cells += [_cell(rounds, "{}"), _cell(seconds, "{:.2f}")]
                gamma = float(np.mean(result.extras_["rounds"]["step"]))
                lines.append(
                    f"| {name} | {K} | {aggregation} | " + " | ".join(cells) + f" | {gamma:.2f} |"
                )
                print(lines[-1], flush=True)
    return "\n".join(lines)


def cluster_table(problems, max_iter) -> str:
    import dask.array as da
    from distributed import Client, LocalCluster

    import dask_scd

    lines = [
        "| data | engine | iterations | seconds to 1e-5 | relative gap |",
        "|---|---|---|---|---|",
    ]
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster),
    ):
        for name, X, y, loss, alpha, chunks in problems:
            if chunks is None:  # sparse: two row chunks, four column blocks
                chunks = (-(-X.shape[0] // 2), -(-X.shape[1] // 4))
            Xd = da.from_array(X, chunks=chunks).persist()
            for solver, options in (("cocoa", {"n_partitions": 4}), ("block_scd", {})):
                start = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    result = dask_scd.fit(
                        Xd,
                        y,
                        loss=loss,
                        alpha=alpha,
                        solver=solver,
                        tol=1e-5,
                        max_iter=max_iter,
                        random_state=0,
                        **options,
                    )
                seconds = time.perf_counter() - start
                lines.append(
                    f"| {name} | {solver} | {result.n_iter_} | {seconds:.1f} | "
                    f"{result.dual_gap_:.1e} |"
                )
                print(lines[-1], flush=True)
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5,000 generated rows")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    import dask_scd

    problems = datasets(args.quick)
    dask_scd.fit(problems[-1][1][:200], problems[-1][2][:200], solver="cocoa")  # compile
    load = os.getloadavg()[0]
    header = (
        f"\n## {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC — "
        f"`{shlex.join(['python', 'benchmarks/bench_cocoa.py', *sys.argv[1:]])}`\n\n"
        f"{cpu_model()}, load average {load:.1f} at the start. In memory: K parts "
        "solved one after the other in this process (rounds as on a cluster; seconds "
        "are all parts' work). One local epoch per round, at most 300 rounds (— : not "
        "reached); the cluster runs at most 200 iterations.\n"
    )
    first = aggregation_table(problems, max_iter=300)
    second = cluster_table(problems, max_iter=200)
    text = (
        header
        + "\n### Rounds to a relative gap, by aggregation and parts\n\n"
        + first
        + "\n\n### CoCoA (K = 4) against block SCD on the same dask array "
        "(LocalCluster, 2 workers x 1 thread)\n\n" + second + "\n"
    )
    print_and_append(text, RESULTS, save=not args.no_save)


if __name__ == "__main__":
    main()
