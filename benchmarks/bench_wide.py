"""Fits with fewer rows than columns (L2, no intercept): SDCA's epochs on the kernel against
Newton's steps alone.

A cold ``dask_scd.fit`` of such a problem first runs SDCA's epochs on K = XXᵀ, which stop
when their predicted cost passes 3/4 of Newton's (docs/engines/newton.md). Given θ = 0 as
``coef_init`` the same fit skips them: Newton's kernel steps from θ = 0, the same iterates
as a cold start made before the epochs existed. Both are timed in one process, one thread,
in alternation, the fastest of ``--repeats``, to a relative gap of 1e-6, on generated rows
the epochs are fast on (independent features; binary, dense or stored sparse) and rows
they are slow on (columns with correlation ρ^|i−j|, ρ = 0.6 and 0.9; a factor common to
all rows; scikit-learn's digits, 40 images of 64 pixels), at α = 1/n and 0.01/n, logistic
and squared hinge.

``python benchmarks/bench_wide.py`` (about two minutes), appended to
``benchmarks/results/wide.md``; ``--no-save`` prints only; ``--quick`` the n ≤ 400 rows.
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from _machine import cpu_model, library_commit, load_average, print_and_append  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import dask_scd  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "wide.md"
TOL = 1e-6
LOSSES = ("logistic", "squared_hinge")


def _correlated(rng, n, p, rho):
    """Rows whose columns have correlation ρ^|i−j| (an AR(1) chain along the columns)."""
    X = rng.standard_normal((n, p))
    for j in range(1, p):
        X[:, j] = rho * X[:, j - 1] + np.sqrt(1.0 - rho * rho) * X[:, j]
    return X


def problems(quick: bool = False):
    """(name, X, y) of the generated data sets, labels from a random linear model."""
    rng = np.random.default_rng(0)
    out = []

    def labelled(name, X, noise=0.0):
        score = X @ rng.standard_normal(X.shape[1]) + noise * rng.standard_normal(X.shape[0])
        out.append((name, X, np.where(score > 0, 1.0, -1.0)))

    labelled("independent 200 × 500", rng.standard_normal((200, 500)))
    labelled("ρ = 0.6, 200 × 500", _correlated(rng, 200, 500, 0.6))
    labelled("ρ = 0.9, 200 × 500", _correlated(rng, 200, 500, 0.9))
    common = rng.standard_normal((200, 500)) + 3.0 * rng.standard_normal((200, 1))
    out.append(("common factor 200 × 500", common, np.where(rng.random(200) < 0.5, 1.0, -1.0)))
    binary = (rng.random((300, 2000)) < 0.02).astype(float)
    labelled("binary 300 × 2000", binary)
    out.append(("binary 300 × 2000, CSR", sp.csr_matrix(binary), out[-1][2]))
    labelled("independent 400 × 450", rng.standard_normal((400, 450)))
    # Real rows: scikit-learn's bundled digits (8 × 8 pixels, 0–16), even against odd,
    # the first 40 images: rows that share much of their structure.
    digits = load_digits()
    out.append(
        ("digits 40 × 64", digits.data[:40], np.where(digits.target[:40] % 2 == 0, 1.0, -1.0))
    )
    if not quick:
        labelled("independent 1000 × 3000", rng.standard_normal((1000, 3000)))
    return out


def best_of_two(first, second, repeats: int):
    """The fastest time of each of two calls, run in alternation; their last results."""
    times, results = [[], []], [None, None]
    for _ in range(repeats):
        for k, call in enumerate((first, second)):
            tick = time.perf_counter()
            results[k] = call()
            times[k].append(time.perf_counter() - tick)
    return min(times[0]), min(times[1]), results


def measure(repeats: int, quick: bool = False) -> list[dict]:
    rows = []
    for name, X, y in problems(quick):
        n, p = X.shape
        for scale in (1.0, 0.01):
            for loss in LOSSES:
                kw = dict(loss=loss, alpha=scale / n, fit_intercept=False, tol=TOL)
                zero = np.zeros(p)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    dask_scd.fit(X, y, **kw)  # compile and warm

                    def cold():
                        return dask_scd.fit(X, y, **kw)

                    def newton():
                        return dask_scd.fit(X, y, coef_init=zero, **kw)

                    reps = repeats if n * p <= 1_000_000 else max(2, repeats // 10)
                    auto, alone, (fit, ref) = best_of_two(cold, newton, reps)
                rows.append(
                    dict(
                        name=name,
                        scale=scale,
                        loss=loss,
                        steps=int(fit.n_iter_),
                        newton_steps=int(ref.n_iter_),
                        gap=float(fit.dual_gap_),
                        newton_gap=float(ref.dual_gap_),
                        auto=auto,
                        newton=alone,
                    )
                )
                print(_line(rows[-1]), flush=True)
    return rows


def _line(r: dict) -> str:
    return (
        f"| {r['name']} | {r['scale']:g}/n | {r['loss']} | {r['steps']} | {r['gap']:.1e} "
        f"| {1e3 * r['auto']:.2f} | {r['newton_steps']} | {r['newton_gap']:.1e} "
        f"| {1e3 * r['newton']:.2f} | {r['auto'] / r['newton']:.2f} |"
    )


def table(rows: list[dict]) -> str:
    lines = [
        "| data | α | loss | steps after the epochs | gap | ms | Newton alone: steps | gap "
        "| ms | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_line(r) for r in rows]
    ratios = np.array([r["auto"] / r["newton"] for r in rows])
    lines.append("")
    lines.append(
        f"Cold fit / Newton alone: geometric mean {np.exp(np.log(ratios).mean()):.2f}, "
        f"best {ratios.min():.2f}, worst {ratios.max():.2f}; fits the epochs ended without "
        f"a step: {sum(r['steps'] == 0 for r in rows)} of {len(rows)}."
    )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    start = time.time()
    rows = measure(args.repeats, args.quick)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python benchmarks/bench_wide.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = "\n".join(
        [
            f"## {stamp} — {cpu_model()}, one thread",
            "",
            f"Command: `{command.strip()}` ({(time.time() - start) / 60:.1f} min); library at "
            f"{library_commit()}; load average {load_average()}. Fastest of the repeats, the "
            f"two fits in alternation in one process; tol = {TOL:g}, no intercept.",
            "",
            table(rows),
            "",
        ]
    )
    print_and_append(text, RESULTS, not args.no_save)


if __name__ == "__main__":
    main()
