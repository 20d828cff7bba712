"""benchopt solver for dask_scd: installed as ``solvers/dask_scd.py`` into a copy of
benchmark_logreg_l2, benchmark_logreg_l1 or benchmark_lasso by
``benchmarks/bench_benchopt.py``, beside ``benchmark_utils/dask_scd_mapping.py``
(``benchmarks/benchopt_dask_scd/mapping.py``).

Each ``run(tol)`` is one cold ``dask_scd.fit`` at that target relative duality gap,
benchopt lowering tol from run to run (its "tolerance" sampling).
"""

from benchopt import BaseSolver, safe_import_context
from benchopt.stopping_criterion import SufficientProgressCriterion

with safe_import_context() as import_ctx:
    import json
    import os
    import warnings

    import numpy as np
    from benchmark_utils.dask_scd_mapping import (
        OBJECTIVES,
        benchopt_beta,
        benchopt_value,
        fit_arguments,
    )
    from sklearn.exceptions import ConvergenceWarning

    import dask_scd

# Below this relative gap a certificate in float64 stops being informative; benchopt's
# smaller tolerances rerun it, and the identical results end the curve (no progress).
TOL_FLOOR = 1e-12
MAX_ITER = 10_000
WARM_UP_ITER = 5
# A JSON-lines file (set by the runner) that receives, per problem, benchopt's objective
# of our warm-up fit next to n times our own objective of it.
CHECKS = "DASK_SCD_BENCHOPT_CHECKS"
# Each run is a cold fit whose cost grows like log(1/tol) (coordinate descent) or barely
# at all (Newton): benchopt's default 1.5x step between tolerances would spend a timeout
# on near-identical fits, so tol falls tenfold per run (1e-1, 1e-2, ... after a first
# run at benchopt's initial value). A time to a target is then that of the first fit whose
# tol was at most ten times looser than needed.
TOL_STEP = 10.0
# Successive tolerances can return the very same iterate: the fit stops at the first
# certified epoch whose relative gap is below tol, and a gap can sit orders of magnitude
# above the objective's true error (the L1 certificate's Lipschitz bound). benchopt's
# default patience of 3 unchanged runs would end the curve there; 5 lets tol fall 1e5x.
PATIENCE = 5


class Solver(BaseSolver):
    name = "dask_scd"
    sampling_strategy = "tolerance"
    stopping_criterion = SufficientProgressCriterion(patience=PATIENCE, strategy="tolerance")
    references = ["dask_scd: coordinate-descent and Newton solvers for regularized linear models"]

    def skip(self, X, y, lmbd, fit_intercept=False):
        if self._objective.name not in OBJECTIVES:
            return True, f"no mapping for the objective {self._objective.name!r}"
        return False, None

    def set_objective(self, X, y, lmbd, fit_intercept=False):
        self.X, self.y = X, y
        self.fit_intercept = fit_intercept
        benchmark = OBJECTIVES[self._objective.name]
        self.arguments = fit_arguments(benchmark, X.shape[0], lmbd, fit_intercept)
        # A few iterations on this very data compile the numba kernels for its layout
        # and dtype before anything is timed.
        warm = self._fit(TOL_FLOOR, WARM_UP_ITER)
        self._record_check(benchmark, warm)
        self.beta = np.zeros(X.shape[1] + int(fit_intercept))

    def run(self, tol):
        result = self._fit(max(tol, TOL_FLOOR), MAX_ITER)
        self.beta = benchopt_beta(result, self.fit_intercept)

    def get_next(self, stop_val):
        return min(stop_val, 1.0) / TOL_STEP

    def get_result(self):
        return dict(beta=self.beta)

    def _fit(self, tol, max_iter):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return dask_scd.fit(self.X, self.y, tol=tol, max_iter=max_iter, **self.arguments)

    def _record_check(self, benchmark, result):
        path = os.environ.get(CHECKS)
        if not path:
            return
        value = self._objective.evaluate_result(beta=benchopt_beta(result, self.fit_intercept))
        if isinstance(value, dict):
            value = value["value"]
        record = {
            "benchmark": benchmark,
            "shape": list(self.X.shape),
            "arguments": self.arguments,
            "benchopt": float(value),
            "ours_times_n": benchopt_value(result.primal_, self.X.shape[0]),
        }
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
