"""The cross-validated estimators: LassoCV, ElasticNetCV, RidgeCV and
LogisticRegressionCV.

Each fold runs one warm-started, certified :func:`dask_scd.path` over the grid (one per
l1_ratio, and per class for one-vs-rest), as a task on the current
``distributed.Client`` when one is running; the best point by the mean score over the
folds is refitted on all the data.
"""

from __future__ import annotations

import numbers

import numpy as np

from dask_scd.alpha_max import alpha_grid, max_alpha
from dask_scd.estimators.base import _Classifier, _Regressor
from dask_scd.estimators.classifiers import LogisticRegression
from dask_scd.estimators.multiclass import _classes, _targets
from dask_scd.estimators.path_cv import (
    ModelScores,
    accuracies,
    check_fold_weights,
    check_grid_size,
    cv_inputs,
    cv_weights,
    folds,
    mean_squared_errors,
    r2_scores,
    run_paths,
)
from dask_scd.estimators.regressors import Ridge

_CV_PARAMETERS = """
    cv : int, cross-validation splitter or iterable, default=None
        The folds (scikit-learn's ``cv``): None for 5 folds, an int for that many
        (``KFold``; ``StratifiedKFold`` for a classifier), a splitter such as
        ``KFold(5, shuffle=True, random_state=0)``, or (train, test) index pairs.
    tol : float, default=1e-6
        Target relative duality gap ``(P − D)/|P|`` of every path point and of the refit.
    max_iter : int, default=1000
        Maximum iterations of the engine per point (see :func:`dask_scd.fit`).
    solver : str, default="auto"
        The engine (see :func:`dask_scd.fit`).
    random_state : int, numpy.random.Generator or None, default=None
        Seeds the engines' coordinate order.
    verbose : bool or int, default=0
        Progress of each fit (see :class:`dask_scd.Progress`).
"""

_CV_NOTES = """
    In memory (numpy, scipy.sparse, pandas), on a running ``distributed.Client`` the
    folds' paths are tasks on its workers (X sent once); else they run here, one after
    the other. A dask array or a grid is never sliced or copied: each fold's path is the
    weighted :func:`dask_scd.path` of all of X with weight 0 on the held-out rows (the
    same objective as the training rows' alone), the folds one after the other, each
    point a :func:`dask_scd.fit` that runs on the cluster (in memory below
    ``in_memory_limit``, as ``fit`` decides); the held-out rows are scored from a lazy
    product of X with the path's coefficients. The folds, the grid and the choice are
    those of the same data in memory. Every path point is certified below ``tol`` by
    its duality gap.
"""


_SAMPLE_WEIGHT = """
            Non-negative weights of the examples (a number: the same for every row; a
            dask vector chunked like y for a dask X; a grid's stored weights when
            omitted). Each fold's path weighs its training rows by w, the held-out
            scores are weighted by w, and the refit uses w: integer weights are the
            rows repeated, with the same folds.
"""


def _doc(template: str) -> str:
    return template.replace("{cv_parameters}", _CV_PARAMETERS.strip("\n")).replace(
        "{cv_notes}", _CV_NOTES.strip("\n")
    )


def _fit_doc(method):
    """``{sample_weight}`` in a ``fit`` docstring."""
    method.__doc__ = method.__doc__.replace("{sample_weight}", _SAMPLE_WEIGHT.strip())
    return method


class _CrossValidated:
    """The refit: ``_problem_arguments`` are the chosen point's (set by ``fit``)."""

    warm_start = False  # the refit starts cold (not a parameter of the CV estimators)

    def _problem_arguments(self, n_samples: int) -> dict:
        return dict(self._refit_problem)

    def _path_options(self, **problem) -> dict:
        return {
            **problem,
            "tol": self.tol,
            "max_iter": self.max_iter,
            "solver": self.solver,
            "random_state": self.random_state,
            "verbose": self.verbose,
        }


# ----------------------------------------------------------------- lasso, enet


class _LinearModelCV(_CrossValidated, _Regressor):
    """LassoCV and ElasticNetCV: the mean squared error of a log grid of alphas (per
    l1_ratio) on held-out folds."""

    def _ratios(self) -> np.ndarray:
        return np.array([1.0])

    @_fit_doc
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
        weights = cv_weights(data, sample_weight)
        X, y, labels = cv_inputs(data)
        y = None if y is None else np.asarray(y, dtype=np.float64)
        ratios = self._ratios()
        grids = np.array([self._grid(X, y, ratio, weights) for ratio in ratios])
        splits = folds(self.cv, X, np.asarray(labels, dtype=np.float64), classifier=False)
        check_fold_weights(splits, weights)
        jobs = [
            {
                "y": y,
                "train": train,
                "test": test,
                "score": mean_squared_errors,
                "weights": weights,
                "order": np.arange(grids.shape[1]),
                "path_options": self._path_options(
                    alphas=grids[r],
                    loss="squared",
                    penalty=_penalty(ratio),
                    l1_ratio=float(ratio),
                    fit_intercept=self.fit_intercept,
                ),
            }
            for r, ratio in enumerate(ratios)
            for train, test in splits
        ]
        results = run_paths(X, jobs)
        n_folds = len(splits)
        # (n_l1_ratio, n_alphas, n_folds), as scikit-learn's mse_path_
        mse = np.array(
            [
                [results[r * n_folds + f]["scores"] for f in range(n_folds)]
                for r in range(len(ratios))
            ]
        ).transpose(0, 2, 1)
        paths = np.array(
            [
                [results[r * n_folds + f]["coefs"] for f in range(n_folds)]
                for r in range(len(ratios))
            ]
        )
        r, k = np.unravel_index(np.argmin(mse.mean(axis=2)), mse.shape[:2])
        self.alpha_, self.l1_ratio_ = float(grids[r, k]), float(ratios[r])
        single = np.ndim(getattr(self, "l1_ratio", 1.0)) == 0
        self.alphas_ = grids[0] if single else grids
        self.mse_path_ = mse[0] if single else mse
        self.coefs_paths_ = paths[0] if single else paths
        self._refit_problem = {
            "loss": "squared",
            "penalty": _penalty(self.l1_ratio_),
            "alpha": self.alpha_,
            "l1_ratio": self.l1_ratio_,
            "fit_intercept": self.fit_intercept,
        }
        self._set_fitted(
            self._fit_models(data, [data.y], _refit_weights(data, weights)), single_output=True
        )
        return self

    def _grid(self, X, y, ratio: float, weights=None) -> np.ndarray:
        """The alphas, decreasing: given, or scikit-learn's log grid from the exact
        alpha_max of all of X, weighted by ``weights`` (the same grid for every fold; a
        dask array's or a grid's reduced over its cells)."""
        alphas = self.alphas
        if alphas is not None and not isinstance(alphas, numbers.Integral):
            values = np.asarray(alphas, dtype=np.float64).ravel()
            if values.size == 0 or not np.all(np.isfinite(values)) or np.any(values <= 0):
                raise ValueError(f"alphas must be finite numbers > 0, got {alphas!r}")
            return np.sort(values)[::-1]
        n_alphas = check_grid_size(self.n_alphas if alphas is None else alphas, "n_alphas")
        if not 0.0 < self.eps < 1.0:
            raise ValueError(f"eps={self.eps!r} must be in (0, 1)")
        return alpha_grid(
            max_alpha(X, y, "squared", ratio, self.fit_intercept, sample_weight=weights),
            n_alphas,
            self.eps,
        )


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
        tol=1e-6,
        max_iter=1000,
        solver="auto",
        random_state=None,
        verbose=0,
    ):
        self.eps = eps
        self.n_alphas = n_alphas
        self.alphas = alphas
        self.fit_intercept = fit_intercept
        self.cv = cv
        self.tol = tol
        self.max_iter = max_iter
        self.solver = solver
        self.random_state = random_state
        self.verbose = verbose

    __doc__ = _doc("""Lasso with alpha chosen by cross-validation on a certified path.

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
        tol=1e-6,
        max_iter=1000,
        solver="auto",
        random_state=None,
        verbose=0,
    ):
        self.l1_ratio = l1_ratio
        self.eps = eps
        self.n_alphas = n_alphas
        self.alphas = alphas
        self.fit_intercept = fit_intercept
        self.cv = cv
        self.tol = tol
        self.max_iter = max_iter
        self.solver = solver
        self.random_state = random_state
        self.verbose = verbose

    def _ratios(self) -> np.ndarray:
        ratios = np.atleast_1d(np.asarray(self.l1_ratio, dtype=np.float64))
        if ratios.ndim != 1 or ratios.size == 0 or np.any(~(ratios > 0)) or np.any(ratios > 1):
            raise ValueError(
                f"l1_ratio={self.l1_ratio!r} must be a number or a list of numbers in (0, 1]"
            )
        return ratios

    __doc__ = _doc("""Elastic net with alpha and l1_ratio chosen by cross-validation on
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
        tol=1e-6,
        max_iter=1000,
        solver="auto",
        random_state=None,
        verbose=0,
    ):
        self.alphas = alphas
        self.fit_intercept = fit_intercept
        self.scoring = scoring
        self.cv = cv
        self.tol = tol
        self.max_iter = max_iter
        self.solver = solver
        self.random_state = random_state
        self.verbose = verbose

    @_fit_doc
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
        weights = cv_weights(data, sample_weight)
        X, y, labels = cv_inputs(data)
        y = None if y is None else np.asarray(y, dtype=np.float64)
        alphas = np.asarray(self.alphas, dtype=np.float64).ravel()
        if alphas.size == 0 or not np.all(np.isfinite(alphas)) or np.any(alphas <= 0):
            raise ValueError(f"alphas must be finite numbers > 0, got {self.alphas!r}")
        splits = folds(self.cv, X, np.asarray(labels, dtype=np.float64), classifier=False)
        check_fold_weights(splits, weights)
        score = (
            r2_scores
            if self.scoring is None
            else ModelScores(_point_model(Ridge(), X.shape[1]), self.scoring)
        )
        jobs = [
            {
                "y": y,
                "train": train,
                "test": test,
                "score": score,
                "weights": weights,
                "order": np.argsort(alphas)[::-1],
                "path_options": self._path_options(
                    alphas=alphas, loss="squared", penalty="l2", fit_intercept=self.fit_intercept
                ),
            }
            for train, test in splits
        ]
        results = run_paths(X, jobs)
        self.scores_ = np.array([result["scores"] for result in results])  # (n_folds, n_alphas)
        self.coefs_paths_ = np.array([result["coefs"] for result in results])
        best = int(np.argmax(self.scores_.mean(axis=0)))
        self.alpha_, self.best_score_ = float(alphas[best]), float(self.scores_[:, best].mean())
        self._refit_problem = {
            "loss": "squared",
            "penalty": "l2",
            "alpha": self.alpha_,
            "l1_ratio": 0.0,
            "fit_intercept": self.fit_intercept,
        }
        self._set_fitted(
            self._fit_models(data, [data.y], _refit_weights(data, weights)), single_output=True
        )
        return self

    __doc__ = _doc("""Ridge with alpha chosen by cross-validation on a certified path.

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


# ---------------------------------------------------------------------- logistic


class LogisticRegressionCV(_CrossValidated, _Classifier):
    _loss = "logistic"

    def __init__(
        self,
        *,
        Cs=10,
        l1_ratios=None,
        fit_intercept=True,
        cv=None,
        penalty="l2",
        scoring=None,
        tol=1e-6,
        max_iter=1000,
        solver="auto",
        refit=True,
        random_state=None,
        verbose=0,
    ):
        self.Cs = Cs
        self.l1_ratios = l1_ratios
        self.fit_intercept = fit_intercept
        self.cv = cv
        self.penalty = penalty
        self.scoring = scoring
        self.tol = tol
        self.max_iter = max_iter
        self.solver = solver
        self.refit = refit
        self.random_state = random_state
        self.verbose = verbose

    def _loss_name(self) -> str:
        return "logistic"

    @_fit_doc
    def fit(self, X, y=None, sample_weight=None):
        """Cross-validate C (and l1_ratio), then refit the best on all of X.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
            Class labels; more than two classes: one model per class against the rest,
            each with its own C.
        sample_weight : float, array-like or dask array of shape (n_samples,), optional
            {sample_weight}
            ``C`` maps to ``alpha = 1/(C·Σw)``, Σw over the fold's training rows for
            its path and over all rows for the refit (scikit-learn's
            ``C Σ w_i loss_i + penalty``).

        Returns
        -------
        self
        """
        data = self._read_fit_input(X, y, y_numeric=False)
        self.classes_ = _classes(data)
        if len(self.classes_) < 2:
            raise ValueError(
                "This solver needs samples of at least 2 classes in the data, "
                f"but the data contains only one class: {self.classes_[0]!r}"
            )
        weights = cv_weights(data, sample_weight)
        X, y, labels = cv_inputs(data)
        Cs, ratios = self._Cs(), self._ratios()
        self.Cs_, self.l1_ratios_ = Cs, ratios
        positive = self.classes_[1:] if len(self.classes_) == 2 else self.classes_
        if y is None and len(positive) == 1:
            targets = [None]  # a grid's own two labels, mapped to ±1 by its paths and fits
        else:
            targets = [_targets(labels, label) for label in positive]
        splits = folds(self.cv, X, labels, classifier=True)
        check_fold_weights(splits, weights)
        score = (
            accuracies
            if self.scoring is None
            else ModelScores(_point_model(LogisticRegression(), X.shape[1]), self.scoring)
        )
        order = np.argsort(Cs, kind="stable")  # the path's order: C increasing
        jobs = [
            {
                "y": target,
                "train": train,
                "test": test,
                "score": score,
                "order": order,
                "weights": weights,
                "path_options": self._path_options(
                    alphas=1.0 / (Cs * _total(weights, train)),
                    loss="logistic",
                    penalty=self.penalty,
                    l1_ratio=float(ratio),
                    fit_intercept=self.fit_intercept,
                ),
            }
            for target in targets
            for ratio in ratios
            for train, test in splits
        ]
        results = run_paths(X, jobs)
        self._select(results, targets, splits, Cs, ratios)
        if self.refit:
            fitted = []
            total = _total(weights, np.arange(X.shape[0]))
            for k, target in enumerate(targets):
                self._refit_problem = {
                    "loss": "logistic",
                    "penalty": self.penalty,
                    "alpha": 1.0 / (self.C_[k] * total),
                    "l1_ratio": float(self.l1_ratio_[k]),
                    "fit_intercept": self.fit_intercept,
                }
                fitted.extend(self._fit_models(data, [target], _refit_weights(data, weights)))
            self._set_fitted(fitted, single_output=False)
        return self

    def _select(self, results, targets, splits, Cs, ratios) -> None:
        """scores_, coefs_paths_, C_, l1_ratio_ per class; without refit, coef_ and
        intercept_ are the folds' mean at each fold's best point (scikit-learn's)."""
        n_folds, n_ratios, n_cs = len(splits), len(ratios), len(Cs)
        elastic = self.penalty == "elasticnet"
        self.scores_, self.coefs_paths_ = {}, {}
        C_, ratio_, coefs, intercepts = [], [], [], []
        labels = self.classes_[1:] if len(self.classes_) == 2 else self.classes_
        for k, label in enumerate(labels):
            block = results[k * n_ratios * n_folds : (k + 1) * n_ratios * n_folds]
            # scores[f, c, r] and coefficients (+ intercept) [f, c, r, :]
            scores = np.array(
                [
                    [block[r * n_folds + f]["scores"] for r in range(n_ratios)]
                    for f in range(n_folds)
                ]
            ).transpose(0, 2, 1)
            paths = np.array(
                [
                    [
                        np.column_stack(
                            [block[r * n_folds + f]["coefs"], block[r * n_folds + f]["intercepts"]]
                        )
                        for r in range(n_ratios)
                    ]
                    for f in range(n_folds)
                ]
            )
            paths = paths.transpose(0, 2, 1, 3)  # [f, c, r, features + intercept]
            kept = paths if self.fit_intercept else paths[..., :-1]
            self.scores_[label] = scores if elastic else scores[:, :, 0]
            self.coefs_paths_[label] = kept if elastic else kept[:, :, 0]
            # scikit-learn's order: l1_ratio outer, C inner; the first best wins
            mean = scores.mean(axis=0).T.ravel()
            if self.refit:
                best = int(np.argmax(mean))
                C_.append(Cs[best % n_cs])
                ratio_.append(ratios[best // n_cs])
                continue
            per_fold = [int(np.argmax(scores[f].T.ravel())) for f in range(n_folds)]
            C_.append(float(np.mean([Cs[b % n_cs] for b in per_fold])))
            ratio_.append(float(np.mean([ratios[b // n_cs] for b in per_fold])))
            point = np.mean([paths[f, b % n_cs, b // n_cs] for f, b in enumerate(per_fold)], axis=0)
            coefs.append(point[:-1])
            intercepts.append(point[-1])
        self.C_, self.l1_ratio_ = np.array(C_, dtype=np.float64), np.array(ratio_)
        if not self.refit:
            self.coef_, self.intercept_ = np.array(coefs), np.array(intercepts)

    def _Cs(self) -> np.ndarray:
        if isinstance(self.Cs, numbers.Integral) and not isinstance(self.Cs, bool):
            return np.logspace(-4, 4, check_grid_size(self.Cs, "Cs"))
        Cs = np.asarray(self.Cs, dtype=np.float64).ravel()
        if Cs.size == 0 or not np.all(np.isfinite(Cs)) or np.any(Cs <= 0):
            raise ValueError(f"Cs={self.Cs!r} must be an int or finite numbers > 0")
        return Cs

    def _ratios(self) -> np.ndarray:
        if self.penalty not in ("l2", "l1", "elasticnet"):
            raise ValueError(f"penalty={self.penalty!r} is not one of 'l2', 'l1', 'elasticnet'")
        if self.penalty != "elasticnet":
            return np.array([0.0 if self.penalty == "l2" else 1.0])
        if self.l1_ratios is None:
            raise ValueError("penalty='elasticnet' needs l1_ratios (a list of numbers in [0, 1])")
        ratios = np.atleast_1d(np.asarray(self.l1_ratios, dtype=np.float64))
        if ratios.size == 0 or np.any(~(ratios >= 0)) or np.any(ratios > 1):
            raise ValueError(f"l1_ratios={self.l1_ratios!r} must be numbers in [0, 1]")
        return ratios

    __doc__ = _doc("""Logistic regression with C chosen by cross-validation on certified paths.

    Each binary model minimizes ``(1/n) Σ log(1 + exp(−y_i(x_iᵀθ + b))) +
    alpha·(l1_ratio‖θ‖₁ + (1 − l1_ratio)/2‖θ‖²)`` with ``alpha = 1/(C·n)`` (``1/(C·Σw)``
    with sample weights), scikit-learn's ``C``. Each fold runs the path of the Cs from the
    smallest (warm-started), keeps the C (and l1_ratio) of the best mean held-out score
    and refits it on all of X. More than two classes: one model per class against the
    rest, each with its own C.

    Parameters
    ----------
    Cs : int or array-like of float > 0, default=10
        The Cs to try; an int: that many on ``logspace(-4, 4)`` (scikit-learn's).
    l1_ratios : list of float in [0, 1], default=None
        With ``penalty="elasticnet"``: the L1 shares to try.
    fit_intercept : bool, default=True
        An unpenalized intercept.
    penalty : {"l2", "l1", "elasticnet"}, default="l2"
    scoring : str or callable, default=None
        A scikit-learn scorer name or callable, read on the one-vs-rest ±1 targets; None:
        accuracy (scikit-learn's default).
    refit : bool, default=True
        Refit the best C on all of X; False: the mean of the folds' models at each fold's
        best point, and ``C_`` the mean of their Cs (scikit-learn's).
{cv_parameters}

    Attributes
    ----------
    Cs_ : ndarray of shape (n_cs,)
    l1_ratios_ : ndarray of shape (n_l1_ratios,)
        The l1_ratios tried (0.0 for "l2", 1.0 for "l1").
    C_ : ndarray of shape (1,) or (n_classes,)
        The chosen C per binary model.
    l1_ratio_ : ndarray of shape (1,) or (n_classes,)
    scores_ : dict
        Class label → held-out scores of shape (n_folds, n_cs), or
        (n_folds, n_cs, n_l1_ratios) for "elasticnet" (one entry, the positive class, for
        two classes).
    coefs_paths_ : dict
        Class label → coefficients of shape (n_folds, n_cs, n_features (+ 1 with an
        intercept, last)), or (n_folds, n_cs, n_l1_ratios, ...) for "elasticnet".
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
    intercept_ : ndarray of shape (1,) or (n_classes,)
    dual_gap_ : ndarray
        Relative duality gap of each refit model.
    n_iter_ : ndarray
        Iterations of each refit model.

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


def _point_model(model, n_features: int):
    """``model`` made to look fitted, for a scorer to read one path point at a time."""
    model.n_features_in_ = n_features
    if isinstance(model, _Classifier):
        model.classes_ = np.array([-1.0, 1.0])
    return model
