"""The classifiers: LogisticRegression (multinomial or one-vs-rest for more than two
classes) and LinearSVC (one-vs-rest), certified by the duality gap."""

from __future__ import annotations

import numpy as np

from dask_scd.data.inputs import ModelInput
from dask_scd.engines import planner
from dask_scd.estimators.base import _Classifier, _set_parameters
from dask_scd.estimators.docstrings import _docstring
from dask_scd.estimators.fitting import _fit_one
from dask_scd.estimators.multiclass import _probabilities, _softmax
from dask_scd.objectives import MULTINOMIAL
from dask_scd.validation import is_dask

MULTI_CLASS = ("auto", "multinomial", "ovr")


class _Probabilities:
    """predict_proba and predict_log_proba of the logistic classifiers: softmax of a
    multinomial model's scores, else each one-vs-rest score's sigmoid, normalized."""

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
        normalize = (
            _softmax
            if scores.ndim == 2 and getattr(self, "multi_class_", "ovr") == "multinomial"
            else _probabilities
        )
        if is_dask(scores):
            new_axis = 1 if scores.ndim == 1 else None
            chunks = (scores.chunks[0], (len(self.classes_),))
            return scores.map_blocks(
                normalize, new_axis=new_axis, chunks=chunks, dtype=np.float64, meta=np.empty((0, 0))
            )
        return normalize(scores)

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
        return np.log(self.predict_proba(X))  # a ufunc: lazy on a dask array


class LogisticRegression(_Probabilities, _Classifier):
    _loss = "logistic"
    _default_alpha = 1e-4

    def __init__(
        self,
        alpha=None,
        *,
        C=None,
        penalty="l2",
        l1_ratio=0.5,
        fit_intercept=True,
        tol=1e-6,
        max_iter=1000,
        solver="auto",
        multi_class="auto",
        warm_start=False,
        random_state=None,
        verbose=0,
        class_weight=None,
        lower_bounds=None,
        upper_bounds=None,
    ):
        _set_parameters(self, locals())

    __doc__ = _docstring("""Logistic regression, multinomial or one-vs-rest for more than two
    classes, certified by its duality gap.

    For two classes the model minimizes ``(1/n) Σ log(1 + exp(−y_i(x_iᵀθ + b))) +
    alpha·(l1_ratio‖θ‖₁ + (1 − l1_ratio)/2‖θ‖²)`` with y_i = ±1. For more than two
    classes, by default (``multi_class="auto"`` on in-memory data) one multinomial model:
    K coefficient vectors θ_k and intercepts b_k minimize
    ``(1/n) Σ −log softmax(x_iᵀθ_k + b_k)_{y_i} + alpha·Σ_k (l1_ratio‖θ_k‖₁ +
    (1 − l1_ratio)/2‖θ_k‖²)`` (scikit-learn's ``LogisticRegression``); with
    ``multi_class="ovr"`` one binary model per class (that class against the rest), which
    on a ``distributed.Client`` are independent tasks.

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
    multi_class : {"auto", "multinomial", "ovr"}, default="auto"
        More than two classes: "multinomial" fits one softmax model (in memory by the
        "newton" engine: Newton-CG for L2, proximal Newton with coordinate descent for an
        L1 term; a dask array above ``in_memory_limit`` by "block_newton", L2 or no
        penalty); "ovr" one binary model per class. "auto" is "multinomial" for more
        than two classes wherever that runs, "ovr" elsewhere (a grid above the limit, an
        L1 term on a large dask array, a binary engine named by ``solver``) and for two
        classes (one binary model), and with coefficient bounds. ``multi_class_`` says
        which ran.
{class_weight}
{box_parameters}
        With more than two classes, bounds apply to one-vs-rest models (what
        ``multi_class="auto"`` fits then); the multinomial model takes none.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The class labels.
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
        For two classes the model of ``classes_[1]``; else one row per class (of the
        multinomial model, or of each binary model for one-vs-rest).
    intercept_ : ndarray of shape (1,) or (n_classes,)
        The intercept of each row of ``coef_``.
    multi_class_ : {"multinomial", "ovr"}
        What was fitted: one multinomial model, or binary models ("ovr", also for two
        classes fitted as one binary model).
{classifier_attributes}

    Notes
    -----
{inputs}

    ``predict_proba`` is the softmax of the decision values for a multinomial model; for
    binary models it is the logistic function of each one's decision value, normalized
    over the classes for one-vs-rest (as scikit-learn's ``OneVsRestClassifier``). A
    multinomial model of two classes (``multi_class="multinomial"``) is shown as one row,
    the difference θ_1 − θ_0, whose logistic function is the softmax.

    A multinomial model is one model: ``n_iter_``, ``dual_gap_`` have one entry and
    ``history_`` is one History; ``warm_start`` does not apply to it (it starts cold).
    """)

    def _fits_multinomial(self, data: ModelInput, n_classes: int) -> bool:
        """ "multinomial" as asked; for "auto", with more than two classes where an engine
        of the softmax loss runs: in memory (in-memory X, dask and grid input below the
        in-memory limit of ``solver="auto"``, ``solver="newton"``), and on a dask array
        above it without an L1 term (``"block_newton"``). Both engines take sample
        weights (``sample_weight``, ``class_weight``, a grid's stored weights)."""
        if self.multi_class not in MULTI_CLASS:
            raise ValueError(f"multi_class={self.multi_class!r} is not one of {MULTI_CLASS}")
        if self.multi_class != "auto":
            return self.multi_class == "multinomial"
        if n_classes <= 2 or self.solver not in ("auto", "newton", "block_newton"):
            return False
        if self._bound_arguments():  # bounds: binary models (the softmax takes none)
            return False
        if data.kind in ("native", "memory") or self.solver == "newton":
            return True
        if self.solver == "auto" and planner.auto_in_memory(_stored_bytes(data)):
            return True
        return data.kind == "dask" and self.penalty == "l2"

    def _fit_multinomial(self, data: ModelInput, sample_weight=None) -> None:
        """One softmax model over all classes (rows of ``coef_`` in ``classes_`` order);
        ``sample_weight``: the examples' weights (numpy or dask; class weights included),
        or None."""
        options = self._fit_options(data, sample_weight, loss=MULTINOMIAL)
        y = None if data.kind == "grid" else data.y
        result = _fit_one(data.X, y, options)
        coef = np.asarray(result.coef_, dtype=np.float64)
        intercept = np.asarray(result.intercept_, dtype=np.float64)
        if len(self.classes_) == 2:  # one row: softmax of two is the logistic of the difference
            coef, intercept = coef[1:] - coef[:1], intercept[1:] - intercept[:1]
        self.coef_, self.intercept_ = coef, intercept
        self._set_certificates([result], single_output=False)
        self.multi_class_ = "multinomial"

    def _set_fitted(self, results: list, single_output: bool) -> None:
        super()._set_fitted(results, single_output)
        self.multi_class_ = "ovr"


class LinearSVC(_Classifier):
    _default_alpha = 1e-4

    def __init__(
        self,
        alpha=None,
        *,
        C=None,
        loss="squared_hinge",
        penalty="l2",
        l1_ratio=0.5,
        fit_intercept=True,
        tol=1e-6,
        max_iter=1000,
        solver="auto",
        warm_start=False,
        random_state=None,
        verbose=0,
        class_weight=None,
    ):
        _set_parameters(self, locals())

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
{class_weight}

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


def _stored_bytes(data: ModelInput) -> int:
    """Bytes of dask or grid X as :func:`dask_scd.fit` counts them against its
    ``in_memory_limit`` (the non-zeros of sparse chunks)."""
    from dask_scd.data.sources import _grid_source, _stored_size

    if data.kind == "grid":  # a grid's own count (no labels read for the squared loss)
        return _grid_source(data.X, None, "squared", None).nbytes
    return _stored_size(data.X)[0]
