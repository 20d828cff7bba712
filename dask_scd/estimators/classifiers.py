"""The classifiers: LogisticRegression and LinearSVC (one-vs-rest for more than two
classes, certified by the duality gap)."""

from __future__ import annotations

import numpy as np

from dask_scd.data.inputs import is_dask
from dask_scd.estimators.base import _Classifier
from dask_scd.estimators.docstrings import _docstring
from dask_scd.estimators.multiclass import _probabilities


class LogisticRegression(_Classifier):
    _loss = "logistic"
    _default_alpha = 1e-4

    def __init__(self, alpha=None, *, C=None, penalty="l2", l1_ratio=0.5, fit_intercept=True,
                 tol=1e-6, max_iter=1000, solver="auto", warm_start=False, random_state=None,
                 verbose=0, class_weight=None):
        self.alpha = alpha
        self.C = C
        self.class_weight = class_weight
        self.penalty = penalty
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.solver = solver
        self.warm_start = warm_start
        self.random_state = random_state
        self.verbose = verbose

    __doc__ = _docstring("""Logistic regression, one-vs-rest for more than two classes, certified by
    its duality gap.

    Each binary model minimizes ``(1/n) Σ log(1 + exp(−y_i(x_iᵀθ + b))) +
    alpha·(l1_ratio‖θ‖₁ + (1 − l1_ratio)/2‖θ‖²)`` with y_i = ±1. With more than two
    classes one such model is fitted per class (that class against the rest); on a
    ``distributed.Client`` these fits are independent tasks.

    Parameters
    ----------
    alpha : float > 0, default=None
        Regularization strength, per example; 1e-4 when neither ``alpha`` nor ``C`` is
        given. scikit-learn's ``LogisticRegression(C=c)`` with the L2 penalty ½‖θ‖²
        minimizes ``c Σ loss + ½‖θ‖²``, which is this model with
        ``alpha = 1 / (c · n_samples)`` (with the L1 and elastic-net penalties likewise).
        The intercept is never penalized, as in scikit-learn's lbfgs solver.
    C : float > 0, default=None
        scikit-learn's inverse regularization strength, with its meaning: the model is
        fitted with ``alpha = 1 / (C · n_samples)`` (``1 / (C · Σw)`` with weights). Give
        ``alpha`` or ``C``, not both.
    penalty : {"l2", "l1", "elasticnet"} or None, default="l2"
        The penalty. None fits without regularization (alpha and C are ignored) by the
        "newton" engine, in memory: there is no dual, so the fit stops on the relative
        gradient norm ``‖∇P‖∞ / max(1, |P|) ≤ tol`` (``grad_norm_``; ``dual_gap_`` is
        NaN). The data must be well posed (not separable).
    l1_ratio : float in [0, 1], default=0.5
        The L1 share of the penalty, used with ``penalty="elasticnet"`` only.
{common_parameters}
    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplying ``sample_weight``, as scikit-learn defines
        them: a dict ``{label: weight}`` (classes left out weigh 1), or "balanced",
        ``n_samples / (n_classes · count_k)`` for class k (the counts weighted by
        ``sample_weight`` when given). With ``C`` the model is fitted with
        ``alpha = 1 / (C · Σw)``, Σw the sum of the combined weights, which is
        scikit-learn's ``C Σ w_i loss_i + penalty``. With more than two classes every
        one-vs-rest model weighs each example by its own class's weight.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The class labels.
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
        One row per binary model: for two classes the model of ``classes_[1]``.
    intercept_ : ndarray of shape (1,) or (n_classes,)
        The intercept of each binary model.
{classifier_attributes}

    Notes
    -----
{inputs}

    ``predict_proba`` is the logistic function of each binary model's decision value,
    normalized over the classes for one-vs-rest (as scikit-learn's ``multi_class="ovr"``).
    """)

    def predict_proba(self, X):
        """Class probabilities.

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, dask array, xarray, Grid or path
            Of shape (n_samples, n_features).

        Returns
        -------
        ndarray or dask array of shape (n_samples, n_classes)
            Columns in the order of ``classes_``; lazy for dask or grid X.
        """
        scores = self.decision_function(X)
        if is_dask(scores):
            new_axis = 1 if scores.ndim == 1 else None
            chunks = (scores.chunks[0], (len(self.classes_),))
            return scores.map_blocks(_probabilities, new_axis=new_axis, chunks=chunks,
                                     dtype=np.float64, meta=np.empty((0, 0)))
        return _probabilities(scores)

    def predict_log_proba(self, X):
        """Logarithm of the class probabilities.

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, dask array, xarray, Grid or path
            Of shape (n_samples, n_features).

        Returns
        -------
        ndarray or dask array of shape (n_samples, n_classes)
        """
        probabilities = self.predict_proba(X)
        if is_dask(probabilities):
            import dask.array as da

            return da.log(probabilities)
        return np.log(probabilities)


class LinearSVC(_Classifier):
    _default_alpha = 1e-4

    def __init__(self, alpha=None, *, C=None, loss="squared_hinge", penalty="l2",
                 l1_ratio=0.5, fit_intercept=True, tol=1e-6, max_iter=1000, solver="auto",
                 warm_start=False, random_state=None, verbose=0, class_weight=None):
        self.alpha = alpha
        self.C = C
        self.class_weight = class_weight
        self.loss = loss
        self.penalty = penalty
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.solver = solver
        self.warm_start = warm_start
        self.random_state = random_state
        self.verbose = verbose

    __doc__ = _docstring("""Linear support vector classifier, one-vs-rest for more than two
    classes, certified by its duality gap.

    Each binary model minimizes ``(1/n) Σ loss(y_i, x_iᵀθ + b) + alpha·(l1_ratio‖θ‖₁ +
    (1 − l1_ratio)/2‖θ‖²)`` with y_i = ±1 and the hinge ``max(0, 1 − yz)`` or the squared
    hinge ``max(0, 1 − yz)²``.

    Parameters
    ----------
    alpha : float > 0, default=None
        Regularization strength, per example; 1e-4 when neither ``alpha`` nor ``C`` is
        given. scikit-learn's ``LinearSVC(C=c)`` minimizes ``½‖θ‖² + c Σ loss``, which is
        this model with ``alpha = 1 / (c · n_samples)``. Unlike liblinear, the intercept is
        not penalized (no ``intercept_scaling``).
    C : float > 0, default=None
        scikit-learn's inverse regularization strength, with its meaning: the model is
        fitted with ``alpha = 1 / (C · n_samples)`` (``1 / (C · Σw)`` with weights). Give
        ``alpha`` or ``C``, not both.
    loss : {"squared_hinge", "hinge"}, default="squared_hinge"
        The hinge needs ``penalty="l2"`` (it is solved in the dual).
    penalty : {"l2", "l1", "elasticnet"}, default="l2"
        The penalty.
    l1_ratio : float in [0, 1], default=0.5
        The L1 share of the penalty, used with ``penalty="elasticnet"`` only.
{common_parameters}
    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplying ``sample_weight``, as scikit-learn defines
        them: a dict ``{label: weight}`` (classes left out weigh 1), or "balanced",
        ``n_samples / (n_classes · count_k)`` for class k (the counts weighted by
        ``sample_weight`` when given). With ``C`` the model is fitted with
        ``alpha = 1 / (C · Σw)``, Σw the sum of the combined weights, which is
        scikit-learn's ``C Σ w_i loss_i + penalty``. With more than two classes every
        one-vs-rest model weighs each example by its own class's weight.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The class labels.
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
        One row per binary model: for two classes the model of ``classes_[1]``.
    intercept_ : ndarray of shape (1,) or (n_classes,)
        The intercept of each binary model.
{classifier_attributes}

    Notes
    -----
{inputs}
    """)
