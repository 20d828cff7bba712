"""LogisticRegressionCV: C (and l1_ratio) chosen by cross-validation on certified paths,
one per fold, l1_ratio and class (one-vs-rest); the cross-validated regressors'
machinery (:mod:`dask_scd.estimators.cv`)."""

from __future__ import annotations

import numbers

import numpy as np

from dask_scd.alpha_max import check_grid_size, positive_values
from dask_scd.estimators.base import _class_weighted, _Classifier, _set_parameters
from dask_scd.estimators.classifiers import LogisticRegression, _Probabilities
from dask_scd.estimators.cv import _CrossValidated, _total
from dask_scd.estimators.docstrings import _docstring, _fill_doc
from dask_scd.estimators.multiclass import _binary_targets, model_classes
from dask_scd.estimators.path_cv import accuracies, check_fold_weights, run_paths


class LogisticRegressionCV(_CrossValidated, _Probabilities, _Classifier):
    _loss = "logistic"

    def __init__(
        self,
        *,
        Cs=10,
        l1_ratios=None,
        fit_intercept=True,
        cv=None,
        n_jobs=None,
        penalty="l2",
        scoring=None,
        tol=1e-6,
        max_iter=1000,
        solver="auto",
        refit=True,
        random_state=None,
        verbose=0,
        class_weight=None,
    ):
        _set_parameters(self, locals())

    def _loss_name(self) -> str:
        return "logistic"

    @_fill_doc
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
        self._set_classes(data)
        sample_weights, X, y, labels, splits = self._folds(data, sample_weight)
        # the paths and the refit weigh by class too; the held-out scores by
        # sample_weight alone (scikit-learn's)
        weights = _class_weighted(data, sample_weights, self.class_weight, self.classes_)
        check_fold_weights(splits, weights)
        Cs, ratios = self._Cs(), self._ratios()
        self.Cs_, self.l1_ratios_ = Cs, ratios
        # a grid's own two labels are mapped to ±1 by its paths and fits
        targets = _binary_targets(self.classes_, labels, grid=y is None)
        score = self._score(accuracies, LogisticRegression(), X.shape[1])
        order = np.argsort(Cs, kind="stable")  # the path's order: C increasing
        jobs = [
            job
            for target in targets
            for ratio in ratios
            for job in self._fold_jobs(
                target,
                splits,
                score,
                sample_weights,
                order,
                lambda train: 1.0 / (Cs * _total(weights, train)),
                fit_weights=None if weights is sample_weights else weights,
                loss="logistic",
                penalty=self.penalty,
                l1_ratio=float(ratio),
            )
        ]
        results = run_paths(X, jobs)
        self._select(results, splits, Cs, ratios)
        if self.refit:
            fitted = []
            total = _total(weights, np.arange(X.shape[0]))
            for k, target in enumerate(targets):
                fitted += self._refit(
                    data,
                    weights,
                    [target],
                    loss="logistic",
                    penalty=self.penalty,
                    alpha=1.0 / (self.C_[k] * total),
                    l1_ratio=float(self.l1_ratio_[k]),
                )
            self._set_fitted(fitted, single_output=False)
        return self

    def _select(self, results, splits, Cs, ratios) -> None:
        """scores_, coefs_paths_, C_, l1_ratio_ per class; without refit, coef_ and
        intercept_ are the folds' mean at each fold's best point (scikit-learn's)."""
        n_folds, n_ratios, n_cs = len(splits), len(ratios), len(Cs)
        elastic = self.penalty == "elasticnet"
        self.scores_, self.coefs_paths_ = {}, {}
        C_, ratio_, coefs, intercepts = [], [], [], []
        for k, label in enumerate(model_classes(self.classes_)):
            block = results[k * n_ratios * n_folds : (k + 1) * n_ratios * n_folds]
            # the jobs ran l1_ratio outer, fold inner: taken here fold outer
            runs = [block[r * n_folds + f] for f in range(n_folds) for r in range(n_ratios)]
            # scores[f, c, r] and coefficients (+ intercept) [f, c, r, :]
            scores = np.array([run["scores"] for run in runs]).reshape(n_folds, n_ratios, -1)
            scores = scores.transpose(0, 2, 1)
            paths = np.array([np.column_stack([run["coefs"], run["intercepts"]]) for run in runs])
            paths = paths.reshape(n_folds, n_ratios, n_cs, -1).transpose(0, 2, 1, 3)
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
        return positive_values(self.Cs, f"Cs={self.Cs!r} must be an int or finite numbers > 0")

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

    __doc__ = _docstring("""Logistic regression with C chosen by cross-validation on certified paths.

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
    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, as :class:`LogisticRegression` takes them, multiplying
        ``sample_weight``: "balanced" is computed once on all of y (the counts weighted
        by ``sample_weight``), as scikit-learn does. The folds' paths and the refit weigh
        every example by both (``C`` maps to ``1/(C·Σw)`` with these combined weights);
        the held-out scores are weighted by ``sample_weight`` alone (scikit-learn's).

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
