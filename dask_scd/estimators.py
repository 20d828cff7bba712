"""scikit-learn estimators over :func:`dask_scd.fit`: Ridge, Lasso, ElasticNet,
LogisticRegression and LinearSVC.

They take what ``fit`` takes (numpy, scipy.sparse, pandas, dask arrays, grid stores,
xarray, libsvm files) and pass the scikit-learn estimator checks. Every model minimizes

    P(θ, b) = (1/n) Σ loss(y_i, x_iᵀθ + b) + alpha·(l1_ratio·‖θ‖₁ + (1 − l1_ratio)/2·‖θ‖²)

and carries the certificate of its fit: ``dual_gap_`` (relative duality gap) and
``history_``.
"""

from __future__ import annotations

import inspect
import sys

import numpy as np
from scipy.special import expit
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from dask_scd.api import fit
from dask_scd.data.inputs import ModelInput, is_dask, read_input
from dask_scd.objectives import CLASSIFICATION_LOSSES, certificate
from dask_scd.validation import check_problem

_ACCEPT_SPARSE = ("csr", "csc")
_DTYPES = (np.float64, np.float32)


class _LinearModel(BaseEstimator):
    """Fitting, prediction and input handling shared by the five estimators.

    Subclasses set ``_loss``/``_penalty`` (class attributes) or have them as parameters.
    """

    _loss = None
    _penalty = None

    def _problem_arguments(self) -> dict:
        return {
            "loss": getattr(self, "loss", None) or self._loss,
            "penalty": getattr(self, "penalty", None) or self._penalty,
            "alpha": self.alpha,
            "l1_ratio": getattr(self, "l1_ratio", 0.5),
            "fit_intercept": self.fit_intercept,
        }

    def _fit_options(self) -> dict:
        return {
            **self._problem_arguments(),
            "tol": self.tol,
            "max_iter": self.max_iter,
            "solver": self.solver,
            "random_state": self.random_state,
            "verbose": self.verbose,
        }

    # ----------------------------------------------------------------- inputs

    def _read_fit_input(self, X, y, y_numeric: bool) -> ModelInput:
        """Validate X and y once; set ``n_features_in_`` and ``feature_names_in_``."""
        data = read_input(X, y)
        if data.kind in ("native", "memory"):
            if data.kind == "native" and data.y is None:
                # scikit-learn's message for a missing target
                validate_data(self, data.X, None, accept_sparse=_ACCEPT_SPARSE)
            data.X, data.y = validate_data(
                self, data.X, data.y, accept_sparse=_ACCEPT_SPARSE, dtype=_DTYPES,
                y_numeric=y_numeric,
            )
        else:
            if data.kind == "dask":
                _check_dask_matrix(data.X)
                if data.y is None:
                    raise ValueError(f"{type(self).__name__} requires y to be passed, but the "
                                     "target y is None (only a grid carries its labels)")
            self.n_features_in_ = int(data.X.shape[1])
            if hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
        if data.kind != "native" and data.feature_names is not None:
            self.feature_names_in_ = data.feature_names
        return data

    def _read_predict_input(self, X) -> ModelInput:
        check_is_fitted(self)
        data = read_input(X, None, n_features=getattr(self, "n_features_in_", None))
        if data.kind == "native":
            data.X = validate_data(self, data.X, accept_sparse=_ACCEPT_SPARSE, dtype=_DTYPES,
                                   reset=False)
            return data
        if data.kind == "memory":
            data.X = check_array(data.X, accept_sparse=_ACCEPT_SPARSE, dtype=_DTYPES)
        elif data.kind == "dask":
            _check_dask_matrix(data.X)
        if data.X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {data.X.shape[1]} features, but {type(self).__name__} "
                             f"is expecting {self.n_features_in_} features as input.")
        fitted = getattr(self, "feature_names_in_", None)
        if (fitted is not None and data.feature_names is not None
                and not np.array_equal(fitted, data.feature_names)):
            raise ValueError("The feature names should match those that were passed during "
                             f"fit: {list(fitted)[:5]}... against {list(data.feature_names)[:5]}...")
        return data

    # ---------------------------------------------------------------- fitting

    def _fit_models(self, data: ModelInput, targets: list) -> list:
        """One :func:`dask_scd.fit` per target vector (one per class for one-vs-rest).

        In-memory one-vs-rest fits run as independent tasks on the current
        ``distributed.Client`` when there is one; dask and grid fits each use the cluster.
        """
        options = self._fit_options()
        check_problem(options["loss"], options["penalty"], options["alpha"],
                      options["l1_ratio"], options["fit_intercept"])
        previous = self._previous_models(data, len(targets))
        client = _current_client() if data.kind != "grid" and not is_dask(data.X) else None
        if client is not None and len(targets) > 1:
            return _fit_on_cluster(client, data.X, targets, options, previous)
        return [_fit_one(data.X, y, options, start)
                for y, start in zip(targets, previous)]

    def _previous_models(self, data: ModelInput, n_models: int) -> list:
        """The previous solution of each model when ``warm_start`` can use it, else None."""
        starts = [None] * n_models
        if not self.warm_start or not hasattr(self, "coef_"):
            return starts
        coef = np.atleast_2d(self.coef_)
        intercept = np.atleast_1d(self.intercept_)
        if coef.shape != (n_models, data.X.shape[1]):
            return starts
        return [(coef[k], float(intercept[k])) for k in range(n_models)]

    def _set_fitted(self, results: list, single_output: bool) -> None:
        coef = np.array([np.asarray(r.coef_, dtype=np.float64).ravel() for r in results])
        intercept = np.array([float(r.intercept_) for r in results])
        self.coef_ = coef[0] if single_output else coef
        self.intercept_ = float(intercept[0]) if single_output else intercept
        n_iter = np.array([r.n_iter_ for r in results])
        gaps = np.array([r.dual_gap_ for r in results])
        self.n_iter_ = int(n_iter[0]) if single_output else n_iter
        self.dual_gap_ = float(gaps[0]) if single_output else gaps
        histories = [r.history_ for r in results]
        self.history_ = histories[0] if len(histories) == 1 else histories
        self.solver_ = results[0].solver_

    # ------------------------------------------------------------- prediction

    def _decision(self, X):
        """X @ coef_ᵀ + intercept_ (numpy, or a lazy dask array for dask and grid X)."""
        data = self._read_predict_input(X)
        coef = np.atleast_2d(self.coef_)
        intercept = np.atleast_1d(self.intercept_)
        if data.kind == "grid":
            scores = _dask_scores(data.X.X, coef[:, data.X.feature_order], intercept)
        elif data.kind == "dask":
            scores = _dask_scores(data.X, coef, intercept)
        else:
            scores = np.asarray(data.X @ coef.T) + intercept
        return scores[:, 0] if np.ndim(self.coef_) == 1 or coef.shape[0] == 1 else scores

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


class _Regressor(RegressorMixin, _LinearModel):
    _loss = "squared"

    def fit(self, X, y=None):
        """Fit the model, certified by its relative duality gap.

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, dask array, xarray, Grid or path
            The design matrix, of shape (n_samples, n_features). A path names a grid
            store or a libsvm file.
        y : array-like of shape (n_samples,), optional
            Targets; omitted for a grid or a libsvm file, which carry their labels.

        Returns
        -------
        self
            The fitted estimator.
        """
        data = self._read_fit_input(X, y, y_numeric=True)
        results = self._fit_models(data, [data.y])
        self._set_fitted(results, single_output=True)
        return self

    def predict(self, X):
        """Predict ``X @ coef_ + intercept_``.

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, dask array, xarray, Grid or path
            Of shape (n_samples, n_features).

        Returns
        -------
        ndarray or dask array of shape (n_samples,)
            A lazy dask array for dask or grid X.
        """
        return self._decision(X)

    def score(self, X, y=None, sample_weight=None):
        """R² of the predictions (see :meth:`sklearn.base.RegressorMixin.score`).

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, dask array, xarray, Grid or path
            Of shape (n_samples, n_features).
        y : array-like of shape (n_samples,), optional
            True values; omitted for a grid or a libsvm file.
        sample_weight : array-like of shape (n_samples,), optional
            Weights of the score (the fit itself does not weight rows).

        Returns
        -------
        float
        """
        return super().score(*_score_arguments(X, y), sample_weight=sample_weight)


class _Classifier(ClassifierMixin, _LinearModel):
    def fit(self, X, y=None):
        """Fit one binary model, or one per class (one-vs-rest) for more than two classes.

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, dask array, xarray, Grid or path
            The design matrix, of shape (n_samples, n_features). A path names a grid
            store or a libsvm file.
        y : array-like of shape (n_samples,), optional
            Class labels; omitted for a grid or a libsvm file, which carry their labels.

        Returns
        -------
        self
            The fitted estimator.
        """
        loss = self._problem_arguments()["loss"]
        if loss not in CLASSIFICATION_LOSSES:
            raise ValueError(f"loss={loss!r} is not a classification loss "
                             f"({', '.join(CLASSIFICATION_LOSSES)})")
        data = self._read_fit_input(X, y, y_numeric=False)
        self.classes_ = _classes(data)
        if len(self.classes_) < 2:
            raise ValueError("This solver needs samples of at least 2 classes in the data, "
                             f"but the data contains only one class: {self.classes_[0]!r}")
        positive = self.classes_[1:] if len(self.classes_) == 2 else self.classes_
        if data.kind == "grid" and len(self.classes_) == 2:
            targets = [None]  # the engine maps a grid's two labels to ±1 itself
        else:
            targets = [_one_vs_rest(data, label) for label in positive]
        results = self._fit_models(data, targets)
        self._set_fitted(results, single_output=False)
        return self

    def decision_function(self, X):
        """Signed distance to the separating hyperplane(s): ``X @ coef_.T + intercept_``.

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, dask array, xarray, Grid or path
            Of shape (n_samples, n_features).

        Returns
        -------
        ndarray or dask array of shape (n_samples,) or (n_samples, n_classes)
            One column per class for more than two classes; for two classes, > 0 means
            ``classes_[1]``. A lazy dask array for dask or grid X.
        """
        return self._decision(X)

    def predict(self, X):
        """Predict class labels: the class of the largest decision value.

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, dask array, xarray, Grid or path
            Of shape (n_samples, n_features).

        Returns
        -------
        ndarray or dask array of shape (n_samples,)
            Labels from ``classes_``; a lazy dask array for dask or grid X.
        """
        scores = self.decision_function(X)
        classes = self.classes_
        if is_dask(scores):
            meta = np.empty(0, dtype=classes.dtype)
            if scores.ndim == 1:
                return scores.map_blocks(_binary_labels, classes, dtype=classes.dtype, meta=meta)
            return scores.map_blocks(_argmax_labels, classes, drop_axis=1, dtype=classes.dtype,
                                     meta=meta)
        if scores.ndim == 1:
            return _binary_labels(scores, classes)
        return _argmax_labels(scores, classes)

    def score(self, X, y=None, sample_weight=None):
        """Mean accuracy (see :meth:`sklearn.base.ClassifierMixin.score`).

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, dask array, xarray, Grid or path
            Of shape (n_samples, n_features).
        y : array-like of shape (n_samples,), optional
            True labels; omitted for a grid or a libsvm file.
        sample_weight : array-like of shape (n_samples,), optional
            Weights of the score (the fit itself does not weight rows).

        Returns
        -------
        float
        """
        return super().score(*_score_arguments(X, y), sample_weight=sample_weight)


# ===================================================================== the estimators

_COMMON_PARAMETERS = """
    fit_intercept : bool, default=True
        Fit an unpenalized intercept b (X is never centred).
    tol : float, default=1e-6
        Target relative duality gap ``(P − D)/|P|``: the fit stops once it is certified
        below ``tol`` (a bound on the objective's distance to the optimum, unlike
        scikit-learn's ``tol``, which bounds the coefficients' last change).
    max_iter : int, default=1000
        Maximum number of epochs (passes over all coordinates, or over all blocks on a
        cluster).
    solver : {"auto", "gram", "scd", "sdca", "block_scd"}, default="auto"
        The engine (see :func:`dask_scd.fit`); "auto" chooses from the problem and the
        size of the data. Not scikit-learn's solver names.
    warm_start : bool, default=False
        Reuse the previous solution when refitting (regularization paths). The engines
        cannot start from a given point yet: the previous model is kept, without any
        epoch, when its certificate for the new parameters is already below ``tol``
        (in-memory data), and the fit starts cold otherwise.
    random_state : int, numpy.random.Generator or None, default=None
        Seeds the coordinate (or block) order: the same seed gives the same model.
    verbose : bool, int or "auto", default=0
        0: silent; 1: a progress bar in a terminal or notebook, else a line per
        certified epoch; 2: a line per certified epoch (see :class:`dask_scd.Progress`).
"""

_COMMON_ATTRIBUTES = """
    n_iter_ : {n_iter}
        Epochs run{per_model}.
    dual_gap_ : {dual_gap}
        Relative duality gap ``(P − D)/|P|`` certified at the end of the fit{per_model}.
    history_ : History{history}
        The certified epochs: relative gap, objective and time of each.
    solver_ : str
        The engine that ran.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of the features seen during fit (DataFrame columns, the feature coordinate
        of an xarray object, a grid's feature names); absent when X has none.
"""

_INPUTS = """
    X may be a numpy array, a scipy.sparse matrix, a pandas DataFrame, a dask array
    (numpy or scipy.sparse chunks, any chunking: column chunks are the engine's blocks),
    a :class:`dask_scd.Grid` or the path of one, an xarray DataArray (sample, feature)
    or Dataset (one column per 1-D variable), or the path of a libsvm file. ``predict``
    of a dask array or a grid is lazy and returns a dask array.

    Rows cannot be weighted: the engines have no per-row weights, so ``fit`` takes no
    ``sample_weight``.
"""

_REGRESSOR_ATTRIBUTES = _COMMON_ATTRIBUTES.format(
    n_iter="int", dual_gap="float", history="", per_model="")
_CLASSIFIER_ATTRIBUTES = _COMMON_ATTRIBUTES.format(
    n_iter="ndarray of shape (n_models,)", dual_gap="ndarray of shape (n_models,)",
    history=" or list of History", per_model=", one entry per binary model")


def _docstring(template: str) -> str:
    return (template.replace("{common_parameters}", _COMMON_PARAMETERS.strip("\n"))
            .replace("{regressor_attributes}", _REGRESSOR_ATTRIBUTES.strip("\n"))
            .replace("{classifier_attributes}", _CLASSIFIER_ATTRIBUTES.strip("\n"))
            .replace("{inputs}", _INPUTS.strip("\n")))


class Ridge(_Regressor):
    _penalty = "l2"

    def __init__(self, alpha=1.0, *, fit_intercept=True, tol=1e-6, max_iter=1000,
                 solver="auto", warm_start=False, random_state=None, verbose=0):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.solver = solver
        self.warm_start = warm_start
        self.random_state = random_state
        self.verbose = verbose

    __doc__ = _docstring("""Least squares with an L2 penalty, certified by its duality gap.

    Minimizes ``(1/(2n))‖y − Xθ − b‖² + (alpha/2)‖θ‖²``.

    Parameters
    ----------
    alpha : float > 0, default=1.0
        Regularization strength, per example: scikit-learn's ``Ridge(alpha=a)``
        minimizes ``‖y − Xθ − b‖² + a‖θ‖²``, which is this model with
        ``alpha = a / n_samples``.
{common_parameters}

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
        θ, in the original feature order.
    intercept_ : float
        b (0.0 when ``fit_intercept=False``).
{regressor_attributes}

    Notes
    -----
{inputs}

    Examples
    --------
    >>> import numpy as np
    >>> from dask_scd import Ridge
    >>> X = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [2.0, 1.0]])
    >>> model = Ridge(alpha=0.01, tol=1e-10).fit(X, X @ [1.0, 2.0] + 3.0)
    >>> bool(model.dual_gap_ <= 1e-10)
    True
    """)


class Lasso(_Regressor):
    _penalty = "l1"

    def __init__(self, alpha=1.0, *, fit_intercept=True, tol=1e-6, max_iter=1000,
                 solver="auto", warm_start=False, random_state=None, verbose=0):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.solver = solver
        self.warm_start = warm_start
        self.random_state = random_state
        self.verbose = verbose

    __doc__ = _docstring("""Least squares with an L1 penalty, certified by its duality gap.

    Minimizes ``(1/(2n))‖y − Xθ − b‖² + alpha‖θ‖₁``, scikit-learn's ``Lasso`` objective:
    ``alpha`` has the same meaning.

    Parameters
    ----------
    alpha : float > 0, default=1.0
        Weight of the L1 penalty.
{common_parameters}

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
        θ, in the original feature order.
    intercept_ : float
        b (0.0 when ``fit_intercept=False``).
{regressor_attributes}

    Notes
    -----
{inputs}
    """)


class ElasticNet(_Regressor):
    _penalty = "elasticnet"

    def __init__(self, alpha=1.0, *, l1_ratio=0.5, fit_intercept=True, tol=1e-6,
                 max_iter=1000, solver="auto", warm_start=False, random_state=None, verbose=0):
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.solver = solver
        self.warm_start = warm_start
        self.random_state = random_state
        self.verbose = verbose

    __doc__ = _docstring("""Least squares with L1 and L2 penalties, certified by its duality gap.

    Minimizes ``(1/(2n))‖y − Xθ − b‖² + alpha·(l1_ratio‖θ‖₁ + (1 − l1_ratio)/2‖θ‖²)``,
    scikit-learn's ``ElasticNet`` objective: ``alpha`` and ``l1_ratio`` have the same
    meaning.

    Parameters
    ----------
    alpha : float > 0, default=1.0
        Regularization strength.
    l1_ratio : float in [0, 1], default=0.5
        The L1 share of the penalty.
{common_parameters}

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
        θ, in the original feature order.
    intercept_ : float
        b (0.0 when ``fit_intercept=False``).
{regressor_attributes}

    Notes
    -----
{inputs}
    """)


class LogisticRegression(_Classifier):
    _loss = "logistic"

    def __init__(self, alpha=1e-4, *, penalty="l2", l1_ratio=0.5, fit_intercept=True,
                 tol=1e-6, max_iter=1000, solver="auto", warm_start=False, random_state=None,
                 verbose=0):
        self.alpha = alpha
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
    alpha : float > 0, default=1e-4
        Regularization strength, per example. scikit-learn's ``LogisticRegression(C=c)``
        with the L2 penalty ½‖θ‖² minimizes ``c Σ loss + ½‖θ‖²``, which is this model with
        ``alpha = 1 / (c · n_samples)`` (with the L1 penalty likewise). The intercept is
        never penalized, as in scikit-learn's lbfgs solver.
    penalty : {"l2", "l1", "elasticnet"}, default="l2"
        The penalty.
    l1_ratio : float in [0, 1], default=0.5
        The L1 share of the penalty, used with ``penalty="elasticnet"`` only.
{common_parameters}

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
    def __init__(self, alpha=1e-4, *, loss="squared_hinge", penalty="l2", l1_ratio=0.5,
                 fit_intercept=True, tol=1e-6, max_iter=1000, solver="auto", warm_start=False,
                 random_state=None, verbose=0):
        self.alpha = alpha
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
    alpha : float > 0, default=1e-4
        Regularization strength, per example. scikit-learn's ``LinearSVC(C=c)`` minimizes
        ``½‖θ‖² + c Σ loss``, which is this model with ``alpha = 1 / (c · n_samples)``.
        Unlike liblinear, the intercept is not penalized (no ``intercept_scaling``).
    loss : {"squared_hinge", "hinge"}, default="squared_hinge"
        The hinge needs ``penalty="l2"`` (it is solved in the dual).
    penalty : {"l2", "l1", "elasticnet"}, default="l2"
        The penalty.
    l1_ratio : float in [0, 1], default=0.5
        The L1 share of the penalty, used with ``penalty="elasticnet"`` only.
{common_parameters}

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


# ====================================================================== helpers


def _check_dask_matrix(X) -> None:
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D of shape (n_samples, n_features), got shape {X.shape}")
    if X.dtype.kind not in "biuf":
        raise ValueError(f"X must be numeric, got dtype {X.dtype}")


def _classes(data: ModelInput) -> np.ndarray:
    """The sorted class labels, computed on the cluster for dask and grid labels."""
    if data.kind == "native" or data.kind == "memory":
        check_classification_targets(data.y)
        return np.unique(data.y)
    y = data.X.y if data.kind == "grid" else data.y
    if is_dask(y):
        import dask.array as da

        classes = np.unique(np.asarray(da.unique(y).compute()))
    else:
        classes = np.unique(np.asarray(y))
    if type_of_target(classes) not in ("binary", "multiclass"):
        raise ValueError(f"Unknown label type: {type_of_target(classes)!r} (a classifier "
                         f"needs class labels; got {len(classes)} distinct values)")
    return classes


def _one_vs_rest(data: ModelInput, label):
    """±1 targets: ``label`` against the rest."""
    y = data.X.y if data.kind == "grid" else data.y
    if is_dask(y):
        import dask.array as da

        return da.where(y == label, 1.0, -1.0)
    return np.where(np.asarray(y) == label, 1.0, -1.0)


def _fit_one(X, y, options: dict, start=None):
    """One :func:`dask_scd.fit`; a grid with ±1 targets fits its cells as a dask array."""
    from dask_scd.data.inputs import is_grid

    if is_grid(X):
        if y is None or options["loss"] not in CLASSIFICATION_LOSSES:
            return fit(X, **options)
        # One-vs-rest on a grid: the grid's cells as a dask array (columns in grid
        # order, one chunk per block), with the targets of this class.
        result = fit(X.X, y, **options)
        result.coef_ = X.to_original_order(result.coef_)
        return result
    if start is not None:
        reused = _reuse_previous(X, y, options, start)
        if reused is not None:
            return reused
    return fit(X, y, **options)


def _reuse_previous(X, y, options: dict, start):
    """Warm start: pass the previous solution to an engine that takes one, or keep it when
    its certificate for the new problem is already below ``tol``."""
    coef, intercept = start
    if "coef_init" in inspect.signature(fit).parameters:
        return fit(X, y, coef_init=coef, intercept_init=intercept, **options)
    if is_dask(X) or is_dask(y):
        return None
    problem = check_problem(options["loss"], options["penalty"], options["alpha"],
                            options["l1_ratio"], options["fit_intercept"])
    y = np.asarray(y, dtype=np.float64)
    if problem.loss in CLASSIFICATION_LOSSES:
        labels = np.unique(y)
        if len(labels) != 2:
            return None
        y = np.where(y == labels[1], 1.0, -1.0)
    intercept = intercept if problem.fit_intercept else 0.0
    cert = certificate(problem, X, y, coef, intercept)
    if cert.relative_gap > options["tol"]:
        return None
    from dask_scd.result import FitResult, History

    return FitResult(
        coef_=np.array(coef, dtype=np.float64), intercept_=intercept,
        dual_gap_=cert.relative_gap, n_iter_=0, history_=History(), converged_=True,
        solver_="warm_start", loss=problem.loss, penalty=options["penalty"],
        alpha=problem.alpha, l1_ratio=problem.l1_ratio, primal_=cert.primal,
    )


def _fit_task(X, y, options):
    return fit(X, y, **options)


def _fit_on_cluster(client, X, targets: list, options: dict, previous: list) -> list:
    """Independent binary fits as tasks on the cluster, X sent once."""
    results = [None] * len(targets)
    for k, (y, start) in enumerate(zip(targets, previous)):
        if start is not None:
            results[k] = _reuse_previous(X, y, options, start)
    todo = [k for k in range(len(targets)) if results[k] is None]
    if todo:
        X_future = client.scatter(X, broadcast=False)
        futures = [client.submit(_fit_task, X_future, targets[k], options, pure=False)
                   for k in todo]
        for k, result in zip(todo, client.gather(futures)):
            results[k] = result
    return results


def _current_client():
    """The current ``distributed.Client``, or None (distributed is not imported for this)."""
    if "distributed" not in sys.modules:
        return None
    from distributed import default_client

    try:
        return default_client()
    except ValueError:
        return None


def _dask_scores(X, coef: np.ndarray, intercept: np.ndarray):
    """Lazy ``X @ coef.T + intercept`` over any chunking: one partial product per chunk,
    summed over the column chunks (sparse chunks never densified)."""
    import dask.array as da

    weights = da.from_array(np.ascontiguousarray(coef.T), chunks=(X.chunks[1], coef.shape[0]))
    partial = da.blockwise(
        _chunk_scores, "ijk", X, "ij", weights, "jk", adjust_chunks={"j": 1},
        dtype=np.float64, meta=np.empty((0, 0, 0)),
    )
    return partial.sum(axis=1) + intercept


def _chunk_scores(block, weights):
    scores = block @ weights
    if hasattr(scores, "todense"):  # a pydata sparse chunk gives a sparse product
        scores = scores.todense()
    return np.asarray(scores, dtype=np.float64).reshape(block.shape[0], 1, weights.shape[1])


def _binary_labels(scores, classes):
    return classes[(np.asarray(scores) > 0).astype(np.intp)]


def _argmax_labels(scores, classes):
    return classes[np.argmax(scores, axis=1)]


def _probabilities(scores):
    if scores.ndim == 1:
        positive = expit(scores)
        return np.column_stack([1.0 - positive, positive])
    probabilities = expit(scores)
    return probabilities / probabilities.sum(axis=1, keepdims=True)


def _score_arguments(X, y):
    """(X, y) for a score: a grid's or a libsvm file's own labels when y is omitted."""
    if y is not None:
        return X, y
    data = read_input(X)
    labels = data.X.y if data.kind == "grid" else data.y
    if labels is None:
        raise ValueError("score needs y (only a grid or a libsvm file carry their labels)")
    return X, np.asarray(labels.compute() if is_dask(labels) else labels)
