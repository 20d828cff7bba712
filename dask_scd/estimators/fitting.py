"""The fits behind the estimators: one :func:`dask_scd.fit` per target vector (a grid's
one-vs-rest targets on its cells), warm starts, and the independent binary fits of
one-vs-rest as tasks on the current ``distributed.Client``."""

from __future__ import annotations

import sys

import numpy as np

from dask_scd.api import bounded, fit
from dask_scd.grid.kinds import is_grid
from dask_scd.objectives import CLASSIFICATION_LOSSES, certificate
from dask_scd.validation import (
    check_problem,
    check_sample_weight,
    collect_warnings,
    is_dask,
    reissue,
)

# The arguments of check_problem, in its order.
_PROBLEM = ("loss", "penalty", "alpha", "l1_ratio", "fit_intercept")


def _fit_one(X, y, options: dict, start=None):
    """One :func:`dask_scd.fit`, warm-started from ``start`` (θ, b) when given (in
    memory, kept when already certified); a grid with ±1 targets fits its cells as a
    dask array."""
    if is_grid(X):
        if y is None or options["loss"] not in CLASSIFICATION_LOSSES:
            return fit(X, **options)
        # One-vs-rest on a grid: the grid's cells as a dask array (columns in grid
        # order, one chunk per block), with the targets of this class.
        result = fit(X.X, y, **options)
        result.coef_ = X.to_original_order(result.coef_)
        return result
    kept = None
    if start is not None and not (
        is_dask(X) or is_dask(y) or is_dask(options.get("sample_weight"))
    ):
        kept = _keep_previous(X, y, options, *start)
    return kept if kept is not None else fit(X, y, **_started(options, start))


def _keep_previous(X, y, options: dict, coef, intercept):
    """Warm start: the previous solution as the result when its certificate for the new
    problem is already below ``tol`` (in memory), else None: the fit starts from it
    (engines with a primal iterate)."""
    if options["penalty"] is None:
        return None  # no certificate to keep a previous solution by
    lower, upper = options.get("lower_bounds"), options.get("upper_bounds")
    problem = bounded(checked_problem(options), lower, upper, X.shape[1])  # certified in the box
    y = np.asarray(y, dtype=np.float64)
    weights = options.get("sample_weight")
    if weights is not None:
        weights = check_sample_weight(weights, len(y))
    if problem.loss in CLASSIFICATION_LOSSES:
        labels = np.unique(y)
        if len(labels) != 2:
            return None
        y = np.where(y == labels[1], 1.0, -1.0)
    intercept = intercept if problem.fit_intercept else 0.0
    cert = certificate(problem, X, y, coef, intercept, weights=weights)
    if cert.relative_gap > options["tol"]:
        return None
    from dask_scd.result import FitResult, History

    return FitResult(
        coef_=np.array(coef, dtype=np.float64),
        intercept_=intercept,
        dual_gap_=cert.relative_gap,
        n_iter_=0,
        history_=History(),
        converged_=True,
        solver_="warm_start",
        loss=problem.loss,
        penalty=options["penalty"],
        alpha=problem.alpha,
        l1_ratio=problem.l1_ratio,
        primal_=cert.primal,
        fit_intercept=problem.fit_intercept,
    )


def checked_problem(options: dict):
    """The :class:`~dask_scd.objectives.Problem` of a fit's ``options``, checked."""
    return check_problem(*(options[name] for name in _PROBLEM))


def _fit_task(X, y, options):
    """One fit on a worker, with the warnings it raised (the worker's process would print
    them where nobody sees them; the caller issues them again)."""
    with collect_warnings() as collected:
        result = fit(X, y, **options)
    return result, collected


def _fit_on_cluster(client, X, targets: list, options: dict, previous: list) -> list:
    """Independent binary fits as tasks on the cluster, X sent once."""
    results = [None] * len(targets)
    for k, (y, start) in enumerate(zip(targets, previous)):
        if start is not None:
            results[k] = _keep_previous(X, y, options, *start)
    todo = [k for k in range(len(targets)) if results[k] is None]
    if todo:
        jobs = [(targets[k], _started(options, previous[k])) for k in todo]
        for k, (result, collected) in zip(todo, _run_on_cluster(client, _fit_task, X, jobs)):
            reissue(collected)
            results[k] = result
    return results


def _run_on_cluster(client, func, X, jobs: list) -> list:
    """``func(X, *job)`` for every job, as tasks on ``client`` with X sent once; their
    results in the jobs' order.

    X goes under a key of its own, not its content's hash: the scatter travels apart from
    the release of the previous fit's X, so the next fit on the same X could reuse the key
    while that release was still on its way to the scheduler, which then cancelled the new
    tasks ("lost dependencies") or left them waiting for data no worker had. The tasks
    and X are cancelled on the way out, a failure included: a failed task leaves none of
    the others queued, running or held for a result nobody will read.
    """
    X_future = client.scatter(X, broadcast=False, hash=False)
    futures = []
    try:
        for job in jobs:
            futures.append(client.submit(func, X_future, *job, pure=False))
        return client.gather(futures)
    finally:
        client.cancel([*futures, X_future])


def _started(options: dict, start) -> dict:
    """The fit's options, with the warm start ``start`` (θ, b) when there is one."""
    if start is None:
        return options
    return {**options, "coef_init": start[0], "intercept_init": start[1]}


def _current_client():
    """The current ``distributed.Client``, or None (distributed is not imported for this)."""
    if "distributed" not in sys.modules:
        return None
    from distributed import default_client

    try:
        return default_client()
    except ValueError:
        return None
