"""How the objectives of benchopt's benchmarks map onto ``dask_scd.fit``, without benchopt.

benchopt's benchmarks write their objectives as sums over the n samples::

    logreg_l2   Σ log(1 + exp(−y_i x_iᵀβ)) + λ/2 ‖β‖²
    logreg_l1   Σ log(1 + exp(−y_i x_iᵀβ)) + λ ‖β‖₁
    lasso       ½ ‖y − Xβ − c‖² + λ ‖β‖₁        (c only with fit_intercept)

``dask_scd.fit`` minimizes the mean loss plus ``alpha`` times the penalty, with the
squared loss ½(y − z)² and the L2 penalty ½‖θ‖², so with ``alpha = λ/n`` each benchmark's
objective is n times ours at the same coefficients: ``P_benchopt = n · P_ours``. The
benchmark's ``beta`` is our ``coef_``, with the intercept appended when it is fitted.

This module is copied into each benchmark's ``benchmark_utils`` package by
``benchmarks/bench_benchopt.py`` and read by the solver there; tests/test_bench_benchopt.py
checks it against the formulas above.
"""

from __future__ import annotations

import numpy as np

# loss and penalty of ``dask_scd.fit`` for each benchmark, by the name of its checkout
# (benchmark_<name>).
PROBLEMS = {
    "logreg_l2": ("logistic", "l2"),
    "logreg_l1": ("logistic", "l1"),
    "lasso": ("squared", "l1"),
}

# The benchmark of each objective, by the objective's ``name``.
OBJECTIVES = {
    "L2 Logistic Regression": "logreg_l2",
    "Sparse Logistic Regression": "logreg_l1",
    "Lasso Regression": "lasso",
}


def fit_arguments(benchmark: str, n_samples: int, lmbd: float, fit_intercept: bool = False):
    """The keyword arguments of ``dask_scd.fit`` for a benchmark's objective.

    Parameters
    ----------
    benchmark : {"logreg_l2", "logreg_l1", "lasso"}
    n_samples : int
        Rows of the benchmark's X.
    lmbd : float
        The benchmark's regularization strength λ (of its sum-of-losses objective).
    fit_intercept : bool
        Whether the objective has an unpenalized intercept (the Lasso benchmark's option).

    Returns
    -------
    dict
        ``loss``, ``penalty``, ``alpha`` (= λ / n_samples) and ``fit_intercept``.
    """
    loss, penalty = PROBLEMS[benchmark]
    return {
        "loss": loss,
        "penalty": penalty,
        "alpha": lmbd / n_samples,
        "fit_intercept": bool(fit_intercept),
    }


def benchopt_beta(result, fit_intercept: bool = False) -> np.ndarray:
    """A fit's coefficients as the benchmark's ``beta``.

    Parameters
    ----------
    result : FitResult
        What ``dask_scd.fit`` returned; for a classification loss its ``classes_`` must
        be (−1, +1) in this order, the labels the logistic benchmarks use.
    fit_intercept : bool
        Append the intercept (the Lasso benchmark's layout).

    Returns
    -------
    ndarray of shape (n_features,) or (n_features + 1,)
    """
    classes = getattr(result, "classes_", None)
    if classes is not None and list(np.asarray(classes, dtype=float)) != [-1.0, 1.0]:
        raise ValueError(f"labels must be -1 and +1, got {list(classes)}")
    beta = np.asarray(result.coef_, dtype=np.float64).ravel()
    if fit_intercept:
        beta = np.r_[beta, float(result.intercept_)]
    return beta


def benchopt_value(primal: float, n_samples: int) -> float:
    """The benchmark's objective at a fit's coefficients, from our objective ``primal``."""
    return n_samples * primal
