"""Same-machine bit check of the iterates of every declared combination.

``python tests/bit_check.py record FILE`` fits every row of the conformance matrix
(tests/conformance_matrix.py: every engine × loss × penalty × data kind × weights × bounds
the registry declares) and, for every in-memory engine that takes it, each problem of
:data:`LARGER` (one-hot fields, correlated dense rows: the paths that 90 × 5 rows do not
reach, such as pure-block detection and working sets), and writes each fit's
coefficients, intercept, reported gap and iterations, as hex floats, to FILE.
``python tests/bit_check.py compare FILE`` fits them again and lists the rows whose
coefficients changed and those whose gap alone changed; it exits 1 when a coefficient
changed.

Run ``record`` before a change meant to keep the iterates and ``compare`` after it, on
the same machine (another CPU's vector width changes the last bits of reassociated sums:
tests/test_seam.py's pinned iterates allow for that, this check does not). A run takes a
few minutes on two cores.
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
from conformance_matrix import ALPHA, DECLARED, fit_row, grid_stores
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd.datasets import make_onehot
from dask_scd.engines import registry

# (name, X, y for the squared loss, y for the binary losses): larger in-memory problems.
# Each is fitted by every in-memory engine that declares the problem, at alphas that
# leave a small and a large support, with and without intercept.
_rng = np.random.default_rng(0)
_onehot, _, _ = make_onehot(3000, 6, [3, 40, 7, 100, 2, 60], random_state=0)
_onehot_y = np.asarray(_onehot @ _rng.normal(size=_onehot.shape[1])).ravel()
_onehot_y = _onehot_y + 0.3 * _rng.normal(size=len(_onehot_y))
_factor = _rng.normal(size=(400, 1))
_dense = 0.6 * _factor + 0.8 * _rng.normal(size=(400, 80))
_dense_y = _dense @ (_rng.normal(size=80) * (_rng.random(80) < 0.2)) + 0.5 * _rng.normal(size=400)
LARGER = {
    "onehot-csr": (_onehot, _onehot_y),
    "onehot-dense": (_onehot.toarray(), _onehot_y),
    "correlated-dense": (_dense, _dense_y),
}
_LARGER_ALPHAS = {"squared": (0.3, 0.01), "other": (0.05, 0.002)}
_LOSSES = ("squared", "logistic", "squared_hinge", "hinge")
_PENALTIES = ("l2", "l1", "elasticnet")


def _record(result) -> dict:
    return {
        "coef": [float(v).hex() for v in np.ravel(result.coef_)],
        "intercept": [float(v).hex() for v in np.ravel(result.intercept_)],
        "gap": float(result.dual_gap_).hex(),
        "n_iter": int(result.n_iter_),
    }


def _matrix_rows(out: dict) -> None:
    from distributed import Client, LocalCluster

    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        grids = grid_stores(Path(tmp))
        for row in DECLARED:
            if row.device != "cpu":
                continue
            out[row.id] = _record(fit_row(row, grids, client, tol=1e-8))


def _larger_rows(out: dict) -> None:
    for (name, (X, y_real)), loss, penalty, intercept in _combos():
        binary = np.where(y_real > np.median(y_real), 1.0, -1.0)
        y = y_real if loss == "squared" else binary
        for alpha in _LARGER_ALPHAS["squared" if loss == "squared" else "other"]:
            for engine in _memory_engines(loss, penalty, intercept):
                key = (
                    f"larger-{name}-{engine}-{loss}-{penalty}-{'b' if intercept else 'nob'}-{alpha}"
                )
                result = dask_scd.fit(
                    X,
                    y,
                    loss=loss,
                    penalty=penalty,
                    alpha=alpha,
                    l1_ratio=0.5,
                    fit_intercept=intercept,
                    solver=engine,
                    tol=1e-9,
                    max_iter=300,
                    random_state=0,
                )
                out[key] = _record(result)


def _combos():
    for item in LARGER.items():
        for loss in _LOSSES:
            for penalty in _PENALTIES:
                for intercept in (True, False):
                    yield item, loss, penalty, intercept


def _memory_engines(loss, penalty, intercept):
    """The in-memory engines that declare the problem, and ``auto``."""
    from dask_scd.validation import check_problem

    try:
        problem = check_problem(loss, penalty, ALPHA, 0.5, intercept)
    except ValueError:
        return []
    names = ["auto"]
    for name, engine in registry.ENGINES.items():
        if engine.refusal(problem, weighted=False, kind="memory") is None:
            names.append(name)
    return names


def run() -> dict:
    out: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _matrix_rows(out)
        _larger_rows(out)
    return out


def compare(reference: dict, now: dict) -> tuple[list, list, list]:
    """(rows whose coefficients changed, rows whose gap alone changed, rows added or
    removed)."""
    coef, gap = [], []
    for key in sorted(set(reference) & set(now)):
        old, new = reference[key], now[key]
        if (old["coef"], old["intercept"], old["n_iter"]) != (
            new["coef"],
            new["intercept"],
            new["n_iter"],
        ):
            coef.append(key)
        elif old["gap"] != new["gap"]:
            gap.append(key)
    return coef, gap, sorted(set(reference) ^ set(now))


def main(argv) -> int:
    if len(argv) != 3 or argv[1] not in ("record", "compare"):
        print(__doc__)
        return 2
    path = Path(argv[2])
    now = run()
    if argv[1] == "record":
        path.write_text(json.dumps(now, indent=0) + "\n")
        print(f"recorded {len(now)} fits in {path}")
        return 0
    coef, gap, other = compare(json.loads(path.read_text()), now)
    print(f"{len(now)} fits: coefficients changed on {len(coef)}, the gap alone on {len(gap)}")
    for key in coef:
        print("  coef", key)
    for key in gap:
        print("  gap ", key)
    for key in other:
        print("  only in one of the two:", key)
    return 1 if coef else 0


if __name__ == "__main__":
    warnings.simplefilter("ignore", ConvergenceWarning)
    sys.exit(main(sys.argv))
