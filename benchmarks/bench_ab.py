"""Our engines on bench_peers' rows, one checkout against another (A/B), peers left out.

A refactor is held to "no row slower than before": each checkout's engines fit the same
problems (the alphas computed once, by one checkout) on one thread, and the best of a
few fits to a certified tol is compared. Run the same command with each checkout first on
PYTHONPATH, side by side pinned to one core each, then again with the cores swapped::

    python benchmarks/bench_ab.py specs specs.json          # the rows' alphas, once
    OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 PYTHONPATH=<checkout A> taskset -c 0 \\
        python benchmarks/bench_ab.py run specs.json a_1.json
    ... PYTHONPATH=<checkout B> taskset -c 1 ... run specs.json b_1.json
    python benchmarks/bench_ab.py table a_1.json,a_2.json b_1.json,b_2.json

The data are bench_peers' quick sizes (Adult from ../shared/data, 50,000 generated rows).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_peers as peers  # noqa: E402

TOL = 1e-6
REPEATS = {"sdca": 3, "lbfgs": 3}  # the slow engines; 7 fits of the others


def _datasets(keys) -> dict:
    return {key: peers.build_data(key, peers.QUICK)[0] for key in set(keys)}


def specs(args) -> None:
    rows = [r for r in peers.all_rows() if re.search(args.rows, r.name)]
    data = _datasets(r.data for r in rows)
    if data.get("adult") is None:  # Adult is read from ../shared/data, where it exists
        print(f"Adult not found in {peers.SHARED_DATA}: its rows are left out", file=sys.stderr)
        rows = [r for r in rows if r.data != "adult"]
    table = {
        r.name: [
            r.loss,
            r.penalty,
            float(r.alpha(data[r.data])),
            r.l1_ratio,
            r.fit_intercept,
            r.data,
        ]
        for r in rows
    }
    Path(args.out).write_text(json.dumps(table, indent=1))


def run(args) -> None:
    table = json.loads(Path(args.specs).read_text())
    data = _datasets(row[-1] for row in table.values())
    out = {}
    for name, (loss, penalty, alpha, l1_ratio, fit_intercept, key) in table.items():
        spec = peers.Spec(loss, penalty, alpha, l1_ratio, fit_intercept)
        d = data[key]
        y = d.y_cls if spec.classification else d.y_reg
        for solver in args.solvers.split(","):
            if solver == "sdca" and alpha * len(y) < 0.5:
                continue  # SDCA's epochs grow as 1/alpha: minutes a fit below alpha = 1/n
            X = d.columns if solver in peers.COLUMN_ENGINES else d.rows
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    peers.fit_ours(spec, X, y, solver, 1e-3, 1)  # compile, first calls
                    times = []
                    for _ in range(REPEATS.get(solver, 7)):
                        t0 = time.perf_counter()
                        result = peers.fit_ours(spec, X, y, solver, TOL, 100_000)
                        times.append(time.perf_counter() - t0)
            except (ValueError, TypeError) as e:  # a solver that refuses the problem
                out[f"{name} | {solver}"] = {"error": str(e)[:200]}
                continue
            out[f"{name} | {solver}"] = {
                "min": min(times),
                "n_iter": int(result.n_iter_),
                "solver": result.solver_,
                "primal": float(result.primal_),
                "gap": float(result.dual_gap_),
            }
            print(name, solver, out[f"{name} | {solver}"], flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


def table(args) -> None:
    a = [json.loads(Path(f).read_text()) for f in args.a.split(",")]
    b = [json.loads(Path(f).read_text()) for f in args.b.split(",")]
    print("| row | solver | engine | A, each run (s) | B, each run (s) | best B / best A |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for key in a[0]:
        if "error" in a[0][key] or any(key not in r or "error" in r[key] for r in b):
            continue
        best_a = min(r[key]["min"] for r in a)
        best_b = min(r[key]["min"] for r in b)
        worst = max(worst, best_b / best_a)
        row, solver = key.split(" | ")
        each_a = " / ".join(f"{r[key]['min']:.3g}" for r in a)
        each_b = " / ".join(f"{r[key]['min']:.3g}" for r in b)
        engine = a[0][key]["solver"]
        print(f"| {row} | {solver} | {engine} | {each_a} | {each_b} | {best_b / best_a:.2f} |")
    print(f"\nLargest ratio: {worst:.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("specs", help="compute the rows' alphas once")
    p.add_argument("out")
    p.add_argument("--rows", default="logistic", help="regular expression on row names")
    p = sub.add_parser("run", help="time this checkout's engines on the rows")
    p.add_argument("specs")
    p.add_argument("out")
    p.add_argument("--solvers", default="auto,newton,sdca,lbfgs")
    p = sub.add_parser("table", help="the markdown table of two checkouts' runs")
    p.add_argument("a", help="comma-separated JSON files of checkout A")
    p.add_argument("b", help="comma-separated JSON files of checkout B")
    args = parser.parse_args(argv)
    {"specs": specs, "run": run, "table": table}[args.mode](args)


if __name__ == "__main__":
    main()
