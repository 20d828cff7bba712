"""What the cross-validated estimators share: the folds, one warm-started
:func:`dask_scd.path` per (fold, l1_ratio, class) as a task on the current
``distributed.Client`` (else in this process, one after the other), and the scores of
every path point on its held-out rows.

A dask array or a grid is never sliced: a fold's path is the weighted path of all of X
with weight 0 on the held-out rows (the weighted objective ``(1/Σw) Σ w_i ℓ_i`` is then
exactly the training rows' own), each point a fit on the cluster; with a client, up to
``FOLDS_AT_ONCE`` folds' paths run side by side from threads here (each fit waits on its
reductions, the others' tasks fill those waits; every fit's model is the one it would
be alone), else one after the other. The held-out rows are scored by a lazy product of
X with the path's coefficients.

With sample weights w, a fold's path weighs its training rows by w (times how often each
is a training row) and its held-out scores are weighted by w on the held-out rows: with
integer weights, the folds of the rows repeated w_i times.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from sklearn.base import is_classifier
from sklearn.metrics import check_scoring
from sklearn.model_selection import check_cv

from dask_scd.estimators.fitting import _current_client, _run_on_cluster
from dask_scd.grid.kinds import is_grid
from dask_scd.paths import path
from dask_scd.result import dask_scores
from dask_scd.validation import check_sample_weight, collect_warnings, is_dask, reissue


def cv_inputs(data) -> tuple:
    """(X, y for the paths, labels in memory) of a model's input: in memory, y as given;
    a dask array's labels computed here (n numbers: the folds are drawn from them); a
    grid's read here, with y None for the paths, which read the grid's own."""
    if data.kind == "grid":
        return data.X, None, grid_labels(data.X)
    labels = np.asarray(data.y.compute() if is_dask(data.y) else data.y)
    return data.X, labels, labels


def cv_weights(data, sample_weight):
    """The examples' weights as numpy float64 (a dask vector computed here, n numbers, as
    the labels are; a number: that weight for every row; a grid's stored weights when
    none are given), checked; None without weights."""
    from dask_scd.estimators.base import _base_weights

    weights = _base_weights(data, sample_weight)
    if weights is None:
        return None
    weights = np.asarray(weights.compute() if is_dask(weights) else weights, dtype=np.float64)
    check_sample_weight(weights, int(data.X.shape[0]))  # raises on bad weights
    return weights


def check_fold_weights(splits: list, weights) -> None:
    """Every fold needs training rows and held-out rows of positive weight."""
    if weights is None:
        return
    for k, (train, test) in enumerate(splits):
        for rows, part in ((train, "training"), (test, "held-out")):
            if not np.sum(weights[rows]) > 0.0:
                raise ValueError(
                    f"fold {k}: the sample weights of its {part} rows sum to "
                    "zero (each fold needs rows of positive weight on both "
                    "sides)"
                )


def distributed(X) -> bool:
    """A dask array or a grid: its folds are weighted paths of all of X."""
    return is_dask(X) or is_grid(X)


def folds(cv, X, y, classifier: bool) -> list:
    """(train, test) index pairs of ``cv`` (int, splitter or iterable; None: 5 folds,
    stratified for a classifier, as scikit-learn); y in memory, X any input (a grid's
    cells as their dask array: the splitter reads only its length)."""
    splitter = check_cv(5 if cv is None else cv, y, classifier=classifier)
    return list(splitter.split(X.X if is_grid(X) else X, y))


# Fold paths of a dask array or a grid run at once from this process's threads. Each
# holds its fit's state on the workers (margins, a row chunk's statistics): a few at once
# fill one another's waits without multiplying what a worker holds by the folds.
FOLDS_AT_ONCE = 3


def run_paths(X, jobs: list) -> list:
    """One :func:`fold_path` per job (a dict of its arguments), as tasks on the current
    ``distributed.Client`` when there is one (X sent once), else here in turn; the
    warnings of every path are issued here, in the jobs' order. A dask array's or a
    grid's paths run from threads here, ``FOLDS_AT_ONCE`` at a time, their points on
    the cluster (here in turn without a client)."""
    client = _current_client()
    if client is None or len(jobs) < 2:
        outputs = [_fold_task(X, job) for job in jobs]
    elif distributed(X):
        with ThreadPoolExecutor(
            max_workers=min(len(jobs), FOLDS_AT_ONCE), thread_name_prefix="dask_scd-fold"
        ) as pool:
            outputs = list(pool.map(lambda job: _fold_task(X, job), jobs))
    else:
        outputs = _run_on_cluster(client, _fold_task, X, [(job,) for job in jobs])
    results = []
    for result, collected in outputs:
        reissue(collected)
        results.append(result)
    return results


def _fold_task(X, job: dict):
    with collect_warnings() as collected:
        return fold_path(X, **job), collected


def fold_path(
    X, y, train, test, path_options: dict, score, order, weights=None, fit_weights=None
) -> dict:
    """The path on the training rows, scored on the test rows.

    ``score(margins, X_test, y_test, coefs, intercepts, weights)`` gives one score per
    point from the test margins (n_test, n_alphas; a dask array for dask or grid X, the
    scores then lazy too) and the test rows' weights (None: unweighted); ``order`` is
    the permutation that sorts the caller's grid into the path's (decreasing alpha):
    the results come back in the caller's order. y None: a grid's own labels (±1 for a
    classification loss). ``weights``: the weights of all of X's rows (numpy), or None;
    ``fit_weights``: the path's weights of all rows where they are not ``weights``
    (sample weights times class weights, which the held-out scores do not take), else
    None.
    Returns scores, coefs (n_alphas, n_features), intercepts, iterations, alphas and
    relative duality gaps.
    """
    path_weights = weights if fit_weights is None else fit_weights
    if distributed(X):
        result, X_test, margins, y_test = _weighted_fold(
            X, y, train, test, path_options, path_weights
        )
    else:
        sample_weight = None if path_weights is None else path_weights[train]
        result = path(X[train], y[train], sample_weight=sample_weight, **path_options)
        X_test, y_test = X[test], y[test]
        margins = np.asarray(X_test @ result.coefs) + result.intercepts
    test_weights = None if weights is None else weights[test]
    scores = score(margins, X_test, y_test, result.coefs, result.intercepts, test_weights)
    scores = np.asarray(scores.compute() if is_dask(scores) else scores, dtype=np.float64)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    return {
        "scores": scores[back],
        "coefs": result.coefs.T[back],
        "intercepts": result.intercepts[back],
        "n_iter": result.n_iter[back],
        "alphas": result.alphas[back],
        "dual_gaps": result.dual_gaps[back],
    }


def _weighted_fold(X, y, train, test, path_options: dict, sample_weight=None) -> tuple:
    """(path, X_test, margins, y_test) of a fold of a dask array or a grid: the path of
    all of X weighted by how often each row is a training row (0 on the held-out rows;
    times ``sample_weight``, else a grid's stored weights), and the held-out rows'
    margins as a dask array."""
    weights = np.bincount(train, minlength=X.shape[0]).astype(np.float64)
    if sample_weight is not None:
        weights *= sample_weight
    elif is_grid(X) and X.has_weights:
        weights *= X.stored_weights()
    if is_grid(X) and y is not None:
        # Targets other than the grid's labels (one class against the rest): its cells
        # as a dask array, columns in grid order.
        result = path(X.X, y, sample_weight=weights, **path_options)
        result.coefs = X.to_original_order(result.coefs)
    else:
        result = path(X, y, sample_weight=weights, **path_options)
    if y is None:  # a grid's labels, as its path saw them
        y = grid_labels(X, result.classes)
    if is_grid(X):
        inverse = np.argsort(X.feature_order)
        cells, coefs = X.X, result.coefs[X.feature_order]
        X_test = X.X[test][:, inverse]
    else:
        cells, coefs, X_test = X, result.coefs, X[test]
    margins = dask_scores(cells, coefs.T, result.intercepts)[test]
    return result, X_test, margins, y[test]


def grid_labels(grid, classes=None) -> np.ndarray:
    """A grid's labels read here, in their own dtype; ±1 (classes[1] is +1) given a
    classification path's ``classes``."""
    labels = np.concatenate([grid.read_labels(r) for r in range(grid.n_row_chunks)])
    if classes is None:
        return labels.astype(grid.label_dtype, copy=False)
    return np.where(labels == classes[1], 1.0, -1.0)


def _mean(values, weights):
    """The mean of each column of ``values`` (numpy or dask), weighted by ``weights``
    (numpy, one per row) when given."""
    if weights is None:
        return np.mean(values, axis=0)
    return (values * weights[:, None]).sum(axis=0) / np.sum(weights)


def mean_squared_errors(margins, X_test, y_test, coefs, intercepts, weights=None) -> np.ndarray:
    """Mean squared error of each point's predictions (weighted: scikit-learn's
    ``np.average`` of the squared residuals)."""
    return _mean((np.asarray(y_test, dtype=np.float64)[:, None] - margins) ** 2, weights)


def r2_scores(margins, X_test, y_test, coefs, intercepts, weights=None) -> np.ndarray:
    """R² of each point's predictions (scikit-learn's ``r2_score``, weighted when given:
    1.0 for a perfect fit of constant y, 0.0 for an imperfect one)."""
    y_test = np.asarray(y_test, dtype=np.float64)
    w = np.ones(len(y_test)) if weights is None else weights
    residual = np.sum((y_test[:, None] - margins) ** 2 * w[:, None], axis=0)
    total = float(np.sum(w * (y_test - np.average(y_test, weights=w)) ** 2))
    if total == 0.0:
        return np.where(residual == 0.0, 1.0, 0.0)
    return 1.0 - residual / total


def accuracies(margins, X_test, y_test, coefs, intercepts, weights=None) -> np.ndarray:
    """Accuracy of each point's labels (±1 targets; a margin > 0 predicts +1), weighted
    when given."""
    return _mean((margins > 0) == (np.asarray(y_test)[:, None] > 0), weights)


class ModelScores:
    """Scores of each point by a scikit-learn scorer, read on ``template`` (a fitted
    estimator) holding the point's coefficients; picklable, it travels to the workers."""

    def __init__(self, template, scoring):
        self.template, self.scoring = template, scoring

    def __call__(self, margins, X_test, y_test, coefs, intercepts, weights=None) -> np.ndarray:
        scorer = check_scoring(self.template, scoring=self.scoring)
        extra = {} if weights is None else {"sample_weight": weights}
        values = []
        for k in range(coefs.shape[1]):
            hold(self.template, coefs[:, k], intercepts[k])
            values.append(scorer(self.template, X_test, y_test, **extra))
        return np.array(values, dtype=np.float64)


def hold(model, coef, intercept) -> None:
    """Give ``model`` (a fitted-looking estimator) the coefficients of one point."""
    if is_classifier(model):
        model.coef_, model.intercept_ = np.asarray(coef)[None, :], np.array([float(intercept)])
    else:
        model.coef_, model.intercept_ = np.asarray(coef), float(intercept)
