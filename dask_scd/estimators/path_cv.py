"""What the cross-validated estimators share: the folds, one warm-started
:func:`dask_scd.path` per (fold, l1_ratio, class) as a task on the current
``distributed.Client`` (else in this process, one after the other), and the scores of
every path point on its held-out rows."""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.base import is_classifier
from sklearn.metrics import check_scoring
from sklearn.model_selection import check_cv

from dask_scd.estimators.fitting import _current_client
from dask_scd.paths import path
from dask_scd.validation import collect_warnings, reissue


def folds(cv, X, y, classifier: bool) -> list:
    """(train, test) index pairs of ``cv`` (int, splitter or iterable; None: 5 folds,
    stratified for a classifier, as scikit-learn)."""
    splitter = check_cv(5 if cv is None else cv, y, classifier=classifier)
    return list(splitter.split(X, y))


def check_in_memory(data, name: str) -> None:
    """Cross-validation slices rows: it takes in-memory X (numpy, scipy.sparse, pandas)."""
    if data.kind not in ("native", "memory"):
        raise TypeError(f"{name} cross-validates in-memory X (numpy, scipy.sparse, pandas); "
                        f"got {data.kind} input. For a dask array or a grid, run "
                        "dask_scd.path on each fold's rows.")


def check_grid_size(value, name: str) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be an integer ≥ 1")
    return int(value)


def run_paths(X, jobs: list) -> list:
    """One :func:`fold_path` per job (a dict of its arguments), as tasks on the current
    ``distributed.Client`` when there is one (X sent once), else here in turn; the
    warnings of every path are issued here."""
    client = _current_client()
    if client is None or len(jobs) < 2:
        outputs = [_fold_task(X, job) for job in jobs]
    else:
        X_future = client.scatter(X, broadcast=False)
        futures = [client.submit(_fold_task, X_future, job, pure=False) for job in jobs]
        outputs = client.gather(futures)
    results = []
    for result, collected in outputs:
        reissue(collected)
        results.append(result)
    return results


def _fold_task(X, job: dict):
    with collect_warnings() as collected:
        return fold_path(X, **job), collected


def fold_path(X, y, train, test, path_options: dict, score, order) -> dict:
    """The path on the training rows, scored on the test rows.

    ``score(margins, X_test, y_test, coefs, intercepts)`` gives one score per point from
    the test margins (n_test, n_alphas); ``order`` is the permutation that sorts the
    caller's grid into the path's (decreasing alpha): the results come back in the
    caller's order. Returns scores, coefs (n_alphas, n_features), intercepts, iterations,
    alphas and relative duality gaps.
    """
    result = path(X[train], y[train], **path_options)
    X_test = X[test]
    margins = np.asarray(X_test @ result.coefs) + result.intercepts
    scores = np.asarray(score(margins, X_test, y[test], result.coefs, result.intercepts),
                        dtype=np.float64)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    return {"scores": scores[back], "coefs": result.coefs.T[back],
            "intercepts": result.intercepts[back], "n_iter": result.n_iter[back],
            "alphas": result.alphas[back], "dual_gaps": result.dual_gaps[back]}


def mean_squared_errors(margins, X_test, y_test, coefs, intercepts) -> np.ndarray:
    """Mean squared error of each point's predictions."""
    return np.mean((np.asarray(y_test, dtype=np.float64)[:, None] - margins) ** 2, axis=0)


def r2_scores(margins, X_test, y_test, coefs, intercepts) -> np.ndarray:
    """R² of each point's predictions (scikit-learn's ``r2_score``: 1.0 for a perfect
    fit of constant y, 0.0 for an imperfect one)."""
    y_test = np.asarray(y_test, dtype=np.float64)
    residual = np.sum((y_test[:, None] - margins) ** 2, axis=0)
    total = float(np.sum((y_test - y_test.mean()) ** 2))
    if total == 0.0:
        return np.where(residual == 0.0, 1.0, 0.0)
    return 1.0 - residual / total


def accuracies(margins, X_test, y_test, coefs, intercepts) -> np.ndarray:
    """Accuracy of each point's labels (±1 targets; a margin > 0 predicts +1)."""
    return np.mean((margins > 0) == (np.asarray(y_test)[:, None] > 0), axis=0)


class ModelScores:
    """Scores of each point by a scikit-learn scorer, read on ``template`` (a fitted
    estimator) holding the point's coefficients; picklable, it travels to the workers."""

    def __init__(self, template, scoring):
        self.template, self.scoring = template, scoring

    def __call__(self, margins, X_test, y_test, coefs, intercepts) -> np.ndarray:
        scorer = check_scoring(self.template, scoring=self.scoring)
        values = []
        for k in range(coefs.shape[1]):
            hold(self.template, coefs[:, k], intercepts[k])
            values.append(scorer(self.template, X_test, y_test))
        return np.array(values, dtype=np.float64)


def hold(model, coef, intercept) -> None:
    """Give ``model`` (a fitted-looking estimator) the coefficients of one point."""
    if is_classifier(model):
        model.coef_, model.intercept_ = np.asarray(coef)[None, :], np.array([float(intercept)])
    else:
        model.coef_, model.intercept_ = np.asarray(coef), float(intercept)
