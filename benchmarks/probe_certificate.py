"""How tight our certificate is where it matters, per row of ``bench_peers``.

For each selected row, ``dask_scd.fit(..., tol=1e-6)`` with ``auto`` keeps its history;
P* comes from a fit at ``tol=1e-13``. Printed: the engine, the first iterate whose
relative error is ≤ 1e-6, the certified gap over that error there, the error and gap at
the stop, and the time to the certified stop over the time to the error.

    .venv/bin/python benchmarks/probe_certificate.py [ROW_REGEX] [N_GENERATED] [CARDINALITY]

Generated rows use ``N_GENERATED`` rows (default 100000) and one-hot fields of
``CARDINALITY`` values (default 1000); Adult rows need ``../shared/data``.
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_peers as bp  # noqa: E402

import dask_scd  # noqa: E402

TOL = 1e-6


def main(argv):
    pattern = argv[0] if argv else "."
    n = int(argv[1]) if len(argv) > 1 else 100_000
    cardinality = int(argv[2]) if len(argv) > 2 else 1000
    sizes = bp.Sizes(n, cardinality, n // 10, 3, 6, 6, 10)
    cache = {}
    for row in bp.all_rows():
        if not re.search(pattern, row.name):
            continue
        if row.data not in cache:
            cache[row.data] = bp.build_data(row.data, sizes)
        data, reason = cache[row.data]
        if data is None:
            print(f"{row.name}: skipped ({reason})")
            continue
        alpha = row.alpha(data)
        y = data.y_reg if row.loss == "squared" else data.y_cls
        kw = dict(loss=row.loss, penalty=row.penalty, alpha=alpha,
                  l1_ratio=row.l1_ratio or 0.5, fit_intercept=row.fit_intercept,
                  random_state=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = dask_scd.fit(data.columns, y, tol=1e-13, max_iter=100_000, **kw)
            fit = dask_scd.fit(data.columns, y, tol=TOL, **kw)
        h = fit.history_
        p_star = min(min(h.primal), ref.primal_)
        errors = [(p - p_star) / abs(p_star) for p in h.primal]
        gaps = list(h.relative_gap)
        first = next((k for k, e in enumerate(errors) if e <= TOL), None)
        last = len(gaps) - 1
        line = f"{row.name:38s} {fit.solver_:7s} iterates {last:4d}"
        if first is None:
            print(line + "  error never within 1e-6")
            continue
        ratio = gaps[first] / max(errors[first], 0.1 * TOL)
        print(f"{line}  first within 1e-6: {first:4d} (gap/error {ratio:8.2g})"
              f"  stop: error {errors[last]:.1e} gap {gaps[last]:.1e}"
              f"  time certified/error {h.seconds[last] / max(h.seconds[first], 1e-9):.2f}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
