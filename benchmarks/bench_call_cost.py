"""What a small fit costs beyond its arithmetic: ``dask_scd.fit`` against a bare Newton loop.

On problems whose arithmetic takes microseconds, the fixed cost of a call (validation,
planning, the design, the certificate, the result) and the bookkeeping of each Newton
step (certificate, line search, stopping rule) are most of a fit's time. For each problem,
one thread, the fastest of ``--repeats`` fits:

- **call**: ``fit`` at a tolerance its starting point already meets (no step: input checks,
  plan, design, one certificate, the result);
- **fit**: ``fit`` to a relative gap of 1e-8 (``auto``; the engine and its steps are shown);

both from θ = 0 given as ``coef_init``: the Newton steps themselves (a cold start of an
n < p problem without intercept first runs SDCA's epochs on the n × n kernel, which may
end the fit without a step);
- **per step**: (fit − call) / steps;
- **bare step**: the same Newton step written as a bare numpy loop (the same BLAS and
  LAPACK calls: the Hessian or the n × n kernel, its Cholesky factor, the passes over X,
  the loss along the step at t = 1 and 2), no certificate, no checks: the arithmetic;
- **overhead per step**: per step − bare step.

``python benchmarks/bench_call_cost.py`` (about a minute), appended to
``benchmarks/results/call_cost.md``; ``--no-save`` prints only.
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
from _machine import cpu_model, library_commit, load_average, print_and_append  # noqa: E402
from scipy.linalg import lapack  # noqa: E402

import dask_scd  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "call_cost.md"
TOL = 1e-8


def problems():
    """(name, X, y, fit's keyword arguments): logistic L2, the shapes of benchopt's small
    rows and 200 × 50 (n > p: the p × p Hessian; n < p: the n × n kernel)."""
    rng = np.random.RandomState(42)
    out = []
    for n, p, intercept in (
        (200, 50, True),
        (200, 50, False),
        (1000, 10, False),
        (200, 500, False),
    ):
        X = rng.randn(n, p)
        y = np.sign(X @ rng.randn(p) + 0.5 * rng.randn(n))
        kwargs = dict(loss="logistic", penalty="l2", alpha=1.0 / n, fit_intercept=intercept)
        out.append((f"{n} × {p}{' + intercept' if intercept else ''}", X, y, kwargs))
    return out


def best(call, repeats: int) -> tuple[float, object]:
    """The fastest of ``repeats`` calls (seconds) and the last call's result."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
    return min(times), result


def bare_step(X, y, alpha: float, intercept: bool):
    """One logistic L2 Newton step at θ = 0 with the arithmetic of the engine's and none of
    its bookkeeping: for n < p the kernel K = XXᵀ (formed once, outside) and the n × n
    factor of αI + RKR, else XᵀDX/n + αI (p × p, with the intercept's row); two passes
    over X for the direction, one for the gradient, the objective at t = 1 and t = 2.
    The step returns the objective after the unit step."""
    n, p = X.shape
    kernel = X @ X.T if n < p else None

    def step():
        z = np.zeros(n)
        s = 1.0 / (1.0 + np.exp(y * z))
        g = -y * s / n
        c = s * (1.0 - s) / n
        r = -(X.T @ g)
        if kernel is not None:
            root = np.sqrt(c)
            S = kernel * np.outer(root, root)
            S.flat[:: n + 1] += alpha
            factor, _ = lapack.dpotrf(S, lower=True, clean=False)
            xr = X @ r
            w = root * lapack.dpotrs(factor, root * xr, lower=True)[0]
            image = (xr - kernel @ w) / alpha
            delta = (r - X.T @ w) / alpha
        else:
            A = np.hstack([X, np.ones((n, 1))]) if intercept else X
            H = (A * c[:, None]).T @ A
            H[np.arange(p), np.arange(p)] += alpha
            rhs = np.append(r, -g.sum()) if intercept else r
            factor, _ = lapack.dpotrf(H, lower=False, clean=False)
            delta = lapack.dpotrs(factor, rhs, lower=False)[0]
            image = A @ delta
        values = [
            np.logaddexp(0.0, -y * (z + t * image)).sum() / n
            + 0.5 * alpha * float((t * delta[:p]) @ (t * delta[:p]))
            for t in (1.0, 2.0)
        ]
        return values[0]  # the objective after a unit step

    return step


def measure(repeats: int) -> list[dict]:
    rows = []
    for name, X, y, kwargs in problems():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kwargs = dict(kwargs, coef_init=np.zeros(X.shape[1]))
            dask_scd.fit(X, y, tol=TOL, **kwargs)  # compile and warm
            call, _ = best(lambda: dask_scd.fit(X, y, tol=1e6, **kwargs), repeats)
            fit, result = best(lambda: dask_scd.fit(X, y, tol=TOL, **kwargs), repeats)
        step = bare_step(X, y, kwargs["alpha"], kwargs["fit_intercept"])
        bare, _ = best(step, repeats)
        steps = max(int(result.n_iter_), 1)
        per_step = (fit - call) / steps
        rows.append(
            dict(
                name=name,
                engine=result.solver_,
                steps=int(result.n_iter_),
                gap=float(result.dual_gap_),
                call=call,
                fit=fit,
                per_step=per_step,
                bare=bare,
            )
        )
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| logistic L2, α = 1/n | engine | steps | gap | call (ms) | fit (ms) | per step (ms) "
        "| bare step (ms) | overhead per step (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['engine']} | {r['steps']} | {r['gap']:.1e} "
            f"| {1e3 * r['call']:.3f} | {1e3 * r['fit']:.3f} | {1e3 * r['per_step']:.3f} "
            f"| {1e3 * r['bare']:.3f} | {1e3 * (r['per_step'] - r['bare']):.3f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    start = time.time()
    rows = measure(args.repeats)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join(
        [
            f"## {now} — {cpu_model()}, one thread",
            "",
            f"Command: `benchmarks/bench_call_cost.py {' '.join(argv or sys.argv[1:])}`; "
            f"library at {library_commit()}; load average {load_average()}; "
            f"{time.time() - start:.0f} s. The fastest of {args.repeats} fits each.",
            "",
            table(rows),
            "",
        ]
    )
    print_and_append(text, args.output, save=not args.no_save)


if __name__ == "__main__":
    main()
