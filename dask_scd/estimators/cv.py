"""The cross-validated regressors LassoCV, ElasticNetCV and RidgeCV, and what they share
with LogisticRegressionCV (:mod:`dask_scd.estimators.logistic_cv`).

Each fold runs one warm-started, certified :func:`dask_scd.path` over the grid (one per
l1_ratio, and per class for one-vs-rest), as a task on the current
``distributed.Client`` when one is running; the best point by the mean score over the
folds is refitted on all the data.
"""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.base import is_classifier

from dask_scd.alpha_max import alphas_of, check_grid, max_alpha, positive_values
from dask_scd.estimators.base import _Classifier, _Regressor, _set_parameters
from dask_scd.estimators.docstrings import _docstring, _fill_doc
from dask_scd.estimators.path_cv import (
    ModelScores,
    check_fold_weights,
    cv_inputs,
    cv_weights,
    folds,
    mean_squared_errors,
    r2_scores,
    run_paths,
)
from dask_scd.estimators.regressors import Ridge


class _CrossValidated:
    """The refit: ``_problem_arguments`` are the chosen point's (set by ``fit``)."""

    warm_start = False  # the refit starts cold (not a parameter of the CV estimators)

    def _problem_arguments(self, n_samples: int) -> dict:
        return dict(self._refit_problem)

    def _fold_jobs(
        self, y, splits: list, score, weights, order, alphas, fit_weights=None, **problem
    ) -> list:
        """The arguments of :func:`~dask_scd.estimators.path_cv.fold_path` for each
        (train, test) split: the path of ``problem`` over ``alphas`` (or
        ``alphas(train)``), its points scored by ``score``; ``fit_weights``: the paths'
        weights where they are not ``weights`` (class weights), else None."""
        return [
            {
                "y": y,
                "train": train,
                "test": test,
                "score": score,
                "weights": weights,
                "fit_weights": fit_weights,
                "order": order,
                "path_options": {
                    "alphas": alphas(train) if callable(alphas) else alphas,
                    **problem,
                    "fit_intercept": self.fit_intercept,
                    **self._run_arguments(),
                },
            }
            for train, test in splits
        ]

    def _score(self, default, model, n_features: int):
        """The held-out score: ``default``, or ``scoring`` read on ``model`` (an unfitted
        estimator, made to look fitted) holding one path point at a time."""
        if self.scoring is None:
            return default
        model.n_features_in_ = n_features
        if isinstance(model, _Classifier):
            model.classes_ = np.array([-1.0, 1.0])
        return ModelScores(model, self.scoring)

    def _folds(self, data, sample_weight) -> tuple:
        """(weights, X, y, labels, splits) of a fit's input: its weights and folds,
        checked; a regressor's y for the paths as float64."""
        weights = cv_weights(data, sample_weight)
        X, y, labels = cv_inputs(data)
        classifier = is_classifier(self)
        if not classifier:
            y = None if y is None else np.asarray(y, dtype=np.float64)
            labels = np.asarray(labels, dtype=np.float64)
        splits = folds(self.cv, X, labels, classifier=classifier)
        check_fold_weights(splits, weights)
        return weights, X, y, labels, splits

    def _refit(self, data, weights, targets, **problem) -> list:
        """The models of ``problem`` on all of X, one per target."""
        self._refit_problem = {"fit_intercept": self.fit_intercept, **problem}
        return self._fit_models(data, targets, _refit_weights(data, weights))


# ----------------------------------------------------------------- lasso, enet


class _LinearModelCV(_CrossValidated, _Regressor):
    """LassoCV and ElasticNetCV: the mean squared error of a log grid of alphas (per
    l1_ratio) on held-out folds."""

    def _ratios(self) -> np.ndarray:
        return np.array([1.0])

    @_fill_doc
    def fit(self, X, y=None, sample_weight=None):
        """Cross-validate the path, then refit the best point on all of X.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        sample_weight : float, array-like or dask array of shape (n_samples,), optional
            {sample_weight}

        Returns
        -------
        self
        """
        data = self._read_fit_input(X, y, y_numeric=True)
        weights, X, y, _, splits = self._folds(data, sample_weight)
        ratios = self._ratios()
        grids = np.array([self._grid(X, y, ratio, weights) for ratio in ratios])
        jobs = [
            job
            for r, ratio in enumerate(ratios)
            for job in self._fold_jobs(
                y,
                splits,
                mean_squared_errors,
                weights,
                np.arange(grids.shape[1]),
                grids[r],
                loss="squared",
                penalty=_penalty(ratio),
                l1_ratio=float(ratio),
            )
        ]
        results = run_paths(X, jobs)
        # (n_l1_ratio, n_alphas, n_folds), as scikit-learn's mse_path_
        shape = (len(ratios), len(splits), -1)
        mse = np.array([result["scores"] for result in results]).reshape(shape).transpose(0, 2, 1)
        paths = np.array([result["coefs"] for result in results])
        paths = paths.reshape(len(ratios), len(splits), *paths.shape[1:])
        r, k = np.unravel_index(np.argmin(mse.mean(axis=2)), mse.shape[:2])
        self.alpha_, self.l1_ratio_ = float(grids[r, k]), float(ratios[r])
        single = np.ndim(getattr(self, "l1_ratio", 1.0)) == 0
        self.alphas_ = grids[0] if single else grids
        self.mse_path_ = mse[0] if single else mse
        self.coefs_paths_ = paths[0] if single else paths
        models = self._refit(
            data,
            weights,
            [data.y],
            loss="squared",
            penalty=_penalty(self.l1_ratio_),
            alpha=self.alpha_,
            l1_ratio=self.l1_ratio_,
        )
        self._set_fitted(models, single_output=True)
        return self

    def _grid(self, X, y, ratio: float, weights=None) -> np.ndarray:
        """The alphas, decreasing: given, or scikit-learn's log grid from the exact
        alpha_max of all of X, weighted by ``weights`` (the same grid for every fold; a
        dask array's or a grid's reduced over its cells)."""
        alphas = self.alphas
        given = alphas is not None and not isinstance(alphas, numbers.Integral)
        n_alphas = self.n_alphas if alphas is None else alphas
        grid = check_grid(alphas if given else None, n_alphas, self.eps)
        if grid[0] == "given":
            return grid[1]
        weighted_max = max_alpha(X, y, "squared", ratio, self.fit_intercept, sample_weight=weights)
        return alphas_of(grid, weighted_max)


def _penalty(ratio: float) -> str:
    return "l1" if ratio == 1.0 else "elasticnet"


class LassoCV(_LinearModelCV):
    def __init__(
        self,
        *,
        eps=1e-3,
        n_alphas=100,
        alphas=None,
        fit_intercept=True,
        cv=None,
        n_jobs=None,
        tol=1e-6,
        max_iter=1000,
        solver="auto",
        random_state=None,
        verbose=0,
        positive=False,
        lower_bounds=None,
        upper_bounds=None,
    ):
        _set_parameters(self, locals())

    __doc__ = _docstring("""Lasso with alpha chosen by cross-validation on a certified path.

    Minimizes ``(1/(2n))‖y − Xθ − b‖² + alpha‖θ‖₁`` (scikit-learn's ``Lasso``) for every
    alpha of the grid on each fold's training rows, keeps the alpha of the smallest mean
    squared error on the held-out rows, and refits it on all of X.

    Parameters
    ----------
    eps : float, default=1e-3
        The grid ends at ``eps · alpha_max``.
    n_alphas : int, default=100
        Points of the log grid.
    alphas : array-like or int, default=None
        The alphas to try (an int: that many on the log grid); default the log grid from
        alpha_max, the smallest alpha whose model is zero on all of X.
    fit_intercept : bool, default=True
{cv_parameters}
{bound_parameters}

    Attributes
    ----------
    alpha_ : float
        The chosen alpha.
    alphas_ : ndarray of shape (n_alphas,)
        The grid, decreasing.
    mse_path_ : ndarray of shape (n_alphas, n_folds)
        Held-out mean squared error of each alpha on each fold.
    coefs_paths_ : ndarray of shape (n_folds, n_alphas, n_features)
        Each fold's path.
    coef_ : ndarray of shape (n_features,)
    intercept_ : float
    dual_gap_ : float
        Relative duality gap of the refit.
    n_iter_ : int
        Iterations of the refit.

    Notes
    -----
{cv_notes}
    """)


class ElasticNetCV(_LinearModelCV):
    def __init__(
        self,
        *,
        l1_ratio=0.5,
        eps=1e-3,
        n_alphas=100,
        alphas=None,
        fit_intercept=True,
        cv=None,
        n_jobs=None,
        tol=1e-6,
        max_iter=1000,
        solver="auto",
        random_state=None,
        verbose=0,
        positive=False,
        lower_bounds=None,
        upper_bounds=None,
    ):
        _set_parameters(self, locals())

    def _ratios(self) -> np.ndarray:
        ratios = np.atleast_1d(np.asarray(self.l1_ratio, dtype=np.float64))
        if ratios.ndim != 1 or ratios.size == 0 or np.any(~(ratios > 0)) or np.any(ratios > 1):
            raise ValueError(
                f"l1_ratio={self.l1_ratio!r} must be a number or a list of numbers in (0, 1]"
            )
        return ratios

    __doc__ = _docstring("""Elastic net with alpha and l1_ratio chosen by cross-validation on
    certified paths.

    Minimizes ``(1/(2n))‖y − Xθ − b‖² + alpha·(l1_ratio‖θ‖₁ + (1 − l1_ratio)/2‖θ‖²)``
    (scikit-learn's ``ElasticNet``) along a grid of alphas for each l1_ratio, on each
    fold, and refits the pair of the smallest mean held-out squared error.

    Parameters
    ----------
    l1_ratio : float or list of float in (0, 1], default=0.5
        The L1 shares to try, each with its own grid.
    eps : float, default=1e-3
    n_alphas : int, default=100
    alphas : array-like or int, default=None
        As for :class:`LassoCV` (a given grid serves every l1_ratio).
    fit_intercept : bool, default=True
{cv_parameters}
{bound_parameters}

    Attributes
    ----------
    alpha_ : float
    l1_ratio_ : float
    alphas_ : ndarray of shape (n_alphas,) or (n_l1_ratio, n_alphas)
    mse_path_ : ndarray of shape (n_alphas, n_folds) or (n_l1_ratio, n_alphas, n_folds)
    coefs_paths_ : ndarray of shape (n_folds, n_alphas, n_features) or
        (n_l1_ratio, n_folds, n_alphas, n_features)
    coef_ : ndarray of shape (n_features,)
    intercept_ : float
    dual_gap_ : float
    n_iter_ : int

    Notes
    -----
{cv_notes}
    """)


# ------------------------------------------------------------------------ ridge


class RidgeCV(_CrossValidated, _Regressor):
    def __init__(
        self,
        alphas=(1e-3, 1e-2, 0.1, 1.0, 10.0),
        *,
        fit_intercept=True,
        scoring=None,
        cv=None,
        n_jobs=None,
        tol=1e-6,
        max_iter=1000,
        solver="auto",
        random_state=None,
        verbose=0,
        positive=False,
        lower_bounds=None,
        upper_bounds=None,
    ):
        _set_parameters(self, locals())

    @_fill_doc
    def fit(self, X, y=None, sample_weight=None):
        """Cross-validate the alphas, then refit the best one on all of X.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        sample_weight : float, array-like or dask array of shape (n_samples,), optional
            {sample_weight}

        Returns
        -------
        self
        """
        data = self._read_fit_input(X, y, y_numeric=True)
        alphas = positive_values(
            self.alphas, f"alphas must be finite numbers > 0, got {self.alphas!r}"
        )
        weights, X, y, _, splits = self._folds(data, sample_weight)
        score = self._score(r2_scores, Ridge(), X.shape[1])
        order = np.argsort(alphas)[::-1]
        jobs = self._fold_jobs(
            y, splits, score, weights, order, alphas, loss="squared", penalty="l2"
        )
        results = run_paths(X, jobs)
        self.scores_ = np.array([result["scores"] for result in results])  # (n_folds, n_alphas)
        self.coefs_paths_ = np.array([result["coefs"] for result in results])
        best = int(np.argmax(self.scores_.mean(axis=0)))
        self.alpha_, self.best_score_ = float(alphas[best]), float(self.scores_[:, best].mean())
        models = self._refit(
            data, weights, [data.y], loss="squared", penalty="l2", alpha=self.alpha_, l1_ratio=0.0
        )
        self._set_fitted(models, single_output=True)
        return self

    __doc__ = _docstring("""Ridge with alpha chosen by cross-validation on a certified path.

    Minimizes ``(1/(2n))‖y − Xθ − b‖² + (alpha/2)‖θ‖²`` (:class:`dask_scd.Ridge`) for each
    alpha on each fold's training rows, warm-started from the largest alpha down, keeps
    the alpha of the best mean held-out score and refits it on all of X.

    Parameters
    ----------
    alphas : array-like of float > 0, default=(1e-3, 1e-2, 0.1, 1.0, 10.0)
        Regularization strengths, per example as in :class:`dask_scd.Ridge`:
        scikit-learn's ``RidgeCV(alphas=a)`` fits each fold with ``alpha = a / n_train``
        in these terms (n_train the rows of the fold's training part).
    fit_intercept : bool, default=True
    scoring : str or callable, default=None
        A scikit-learn scorer name or callable; None: R² (scikit-learn's default).
        Efficient leave-one-out (scikit-learn's ``cv=None``) is not offered: None means
        5 folds here. With ``sample_weight`` the held-out scores are weighted (as in
        scikit-learn's leave-one-out; its ``RidgeCV`` with a ``cv`` weighs only the fits
        unless metadata routing is enabled).
{cv_parameters}
{bound_parameters}

    Attributes
    ----------
    alpha_ : float
    best_score_ : float
        Mean held-out score of ``alpha_``.
    scores_ : ndarray of shape (n_folds, n_alphas)
        Held-out score of each alpha (in the order given) on each fold.
    coefs_paths_ : ndarray of shape (n_folds, n_alphas, n_features)
    coef_ : ndarray of shape (n_features,)
    intercept_ : float
    dual_gap_ : float
    n_iter_ : int

    Notes
    -----
{cv_notes}
    """)


def _total(weights, rows) -> float:
    """Σw over ``rows`` (their number without weights; a repeated index counts again)."""
    return float(len(rows)) if weights is None else float(np.sum(weights[rows]))


def _refit_weights(data, weights):
    """The refit's weights: the given ones (numpy; a dask X's as a dask vector chunked
    like its rows), or None."""
    if weights is None or data.kind != "dask":
        return weights
    import dask.array as da

    return da.from_array(weights, chunks=(data.X.chunks[0],))
