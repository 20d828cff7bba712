"""The base classes of the estimators: input handling, fitting and prediction shared by
the five estimators (:class:`_LinearModel`), and what regressors (:class:`_Regressor`) and
classifiers (:class:`_Classifier`) add to it."""

from __future__ import annotations

import inspect
import numbers

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, is_classifier
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from dask_scd.data.inputs import ModelInput, read_input
from dask_scd.estimators.fitting import (
    _current_client,
    _fit_on_cluster,
    _fit_one,
    checked_problem,
)
from dask_scd.estimators.multiclass import _binary_targets, _classes, model_classes
from dask_scd.objectives import CLASSIFICATION_LOSSES
from dask_scd.result import Histories, class_labels
from dask_scd.result import dask_scores as _dask_scores
from dask_scd.validation import (
    ENGINE_DTYPES,
    ENGINE_SPARSE_FORMATS,
    check_2d,
    check_sample_weight,
    engine_dtype,
    is_dask,
    per_row_weights,
)

# scikit-learn's checks accept what the engines read (ENGINE_SPARSE_FORMATS,
# ENGINE_DTYPES) and convert any other numeric X to float64, as dask_scd.fit does.
# What every fitted model reports, and its type for a single model.
_PER_MODEL = {"n_iter_": int, "dual_gap_": float, "grad_norm_": float}


class _LinearModel(BaseEstimator):
    """Fitting, prediction and input handling shared by the five estimators.

    Subclasses set ``_loss``/``_penalty`` (class attributes) or have them as parameters.
    """

    _loss = None
    _penalty = None
    _default_alpha = None  # the classifiers' alpha when neither alpha nor C is given

    def _loss_name(self) -> str:
        return getattr(self, "loss", None) or self._loss

    def _alpha(self, n_samples: float) -> float:
        """``alpha``, or scikit-learn's ``C`` in its terms: ``C Σ loss + penalty`` is
        ``C·n`` times ``(1/n) Σ loss + penalty/(C·n)``, so alpha = 1/(C·n). With weights w,
        ``C Σ w_i loss_i + penalty`` is ``C·Σw`` times the weighted objective
        ``(1/Σw) Σ w_i loss_i + penalty/(C·Σw)``: ``n_samples`` is then Σw."""
        C = getattr(self, "C", None)
        if C is None:
            return self._default_alpha if self.alpha is None else self.alpha
        if self.alpha is not None:
            raise ValueError(
                f"give alpha or C, not both (alpha={self.alpha!r}, C={C!r}): "
                "C is scikit-learn's inverse strength, alpha = 1/(C·n_samples)"
            )
        if not isinstance(C, numbers.Real) or isinstance(C, bool) or not np.isfinite(C) or C <= 0:
            raise ValueError(f"C={C!r} must be a finite number > 0")
        return 1.0 / (float(C) * n_samples)

    def _problem_arguments(self, n_samples: int) -> dict:
        return {
            "loss": self._loss_name(),
            # LogisticRegression(penalty=None): no regularization (not the class default)
            "penalty": self.penalty if hasattr(self, "penalty") else self._penalty,
            "alpha": self._alpha(n_samples),
            "l1_ratio": getattr(self, "l1_ratio", 0.5),
            "fit_intercept": self.fit_intercept,
        }

    def _bound_arguments(self) -> dict:
        """``lower_bounds`` / ``upper_bounds`` of :func:`dask_scd.fit` from the parameters
        ``positive``, ``lower_bounds`` and ``upper_bounds`` (those an estimator has)."""
        lower = getattr(self, "lower_bounds", None)
        upper = getattr(self, "upper_bounds", None)
        if getattr(self, "positive", False):
            if lower is not None:
                raise ValueError(
                    "positive=True means lower_bounds=0: give positive or lower_bounds, "
                    f"not both (lower_bounds={lower!r})"
                )
            lower = 0.0
        given = {"lower_bounds": lower, "upper_bounds": upper}
        return {name: value for name, value in given.items() if value is not None}

    def _run_arguments(self) -> dict:
        """What every fit of the estimator takes beside its problem: the engine's options
        and the coefficient bounds."""
        return {
            "tol": self.tol,
            "max_iter": self.max_iter,
            "solver": self.solver,
            "random_state": self.random_state,
            "verbose": self.verbose,
            **self._bound_arguments(),
        }

    def _fit_options(self, data: ModelInput, sample_weight=None, **change) -> dict:
        """The options of :func:`dask_scd.fit` for ``data`` weighted by ``sample_weight``
        (numpy or dask, or None), ``change`` replacing some; the problem checked."""
        total = int(data.X.shape[0]) if sample_weight is None else _total(sample_weight)
        options = {**self._problem_arguments(total), **self._run_arguments(), **change}
        if sample_weight is not None:
            options["sample_weight"] = sample_weight
        checked_problem(options)
        return options

    # ----------------------------------------------------------------- inputs

    def _read_fit_input(self, X, y, y_numeric: bool, multi_output: bool = False) -> ModelInput:
        """Validate X and y once; set ``n_features_in_`` and ``feature_names_in_``.

        ``multi_output``: y may be 2-D, of shape (n_samples, n_targets).
        """
        data = read_input(X, y)
        if data.kind in ("native", "memory"):
            if data.kind == "native" and data.y is None:
                # scikit-learn's message for a missing target
                validate_data(self, data.X, None, accept_sparse=ENGINE_SPARSE_FORMATS)
            data.X, data.y = validate_data(
                self,
                data.X,
                data.y,
                accept_sparse=ENGINE_SPARSE_FORMATS,
                dtype=ENGINE_DTYPES,
                y_numeric=y_numeric,
                multi_output=multi_output,
            )
        else:
            if data.kind == "dask":
                _check_dask_matrix(data.X)
                if data.y is None:
                    raise ValueError(
                        f"{type(self).__name__} requires y to be passed, but the "
                        "target y is None (only a grid carries its labels)"
                    )
            self.n_features_in_ = int(data.X.shape[1])
            if hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
        if data.kind != "native" and data.feature_names is not None:
            self.feature_names_in_ = data.feature_names
        return data

    def _read_predict_input(self, X) -> ModelInput:
        check_is_fitted(self)
        # A dask DataFrame's partition lengths are left unknown: predictions stay lazy.
        data = read_input(X, None, n_features=getattr(self, "n_features_in_", None), lengths=False)
        if data.kind == "native":
            data.X = validate_data(
                self, data.X, accept_sparse=ENGINE_SPARSE_FORMATS, dtype=ENGINE_DTYPES, reset=False
            )
            return data
        if data.kind == "memory":
            data.X = check_array(data.X, accept_sparse=ENGINE_SPARSE_FORMATS, dtype=ENGINE_DTYPES)
        elif data.kind == "dask":
            _check_dask_matrix(data.X)
        if data.X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {data.X.shape[1]} features, but {type(self).__name__} "
                f"is expecting {self.n_features_in_} features as input."
            )
        fitted = getattr(self, "feature_names_in_", None)
        if (
            fitted is not None
            and data.feature_names is not None
            and not np.array_equal(fitted, data.feature_names)
        ):
            raise ValueError(
                "The feature names should match those that were passed during "
                f"fit: {list(fitted)[:5]}... against {list(data.feature_names)[:5]}..."
            )
        return data

    # ---------------------------------------------------------------- fitting

    def _fit_models(self, data: ModelInput, targets: list, sample_weight=None) -> list:
        """One :func:`dask_scd.fit` per target vector (one per class for one-vs-rest).

        In-memory one-vs-rest fits run as independent tasks on the current
        ``distributed.Client`` when there is one; dask and grid fits each use the cluster.
        ``sample_weight``: the examples' weights (numpy or dask), or None.
        """
        options = self._fit_options(data, sample_weight)
        previous = self._previous_models(data, len(targets))
        client = _current_client() if data.kind != "grid" and not is_dask(data.X) else None
        if client is not None and len(targets) > 1:
            return _fit_on_cluster(client, data.X, targets, options, previous)
        return [_fit_one(data.X, y, options, start) for y, start in zip(targets, previous)]

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
        self._set_certificates(results, single_output)

    def _set_certificates(self, results: list, single_output: bool) -> None:
        """``n_iter_``, ``dual_gap_``, ``grad_norm_`` (penalty=None only), ``history_``
        and ``solver_`` of the fitted models: one entry per model, or the one model's."""
        for name, scalar in _PER_MODEL.items():
            values = [getattr(r, name) for r in results]
            if values[0] is None:  # grad_norm_: a problem with a penalty has a gap instead
                self.__dict__.pop(name, None)
            else:
                setattr(self, name, scalar(values[0]) if single_output else np.array(values))
        histories = [r.history_ for r in results]
        self.history_ = histories[0] if len(histories) == 1 else self._histories(histories)
        self.solver_ = results[0].solver_

    def _histories(self, histories: list) -> Histories:
        """The models' histories together, each labelled by its class (one-vs-rest) or
        its output (several targets)."""
        classes = getattr(self, "classes_", None)
        if is_classifier(self) and classes is not None:
            labels = model_classes(np.asarray(classes))
            if len(labels) == len(histories):
                return Histories(histories, labels.tolist(), "class")
        return Histories(histories, name="output")

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
        one_column = np.ndim(self.coef_) == 1 or (coef.shape[0] == 1 and is_classifier(self))
        return scores[:, 0] if one_column else scores

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


class _ScoreOwnLabels:
    """``score`` of the scikit-learn mixin that follows, y read from a grid or a libsvm
    file when omitted."""

    def score(self, X, y=None, sample_weight=None):
        """R² of the predictions of a regressor, mean accuracy of a classifier (see
        :meth:`sklearn.base.RegressorMixin.score`, :meth:`sklearn.base.ClassifierMixin.score`).

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, dask array, xarray, Grid or path
            Of shape (n_samples, n_features).
        y : array-like of shape (n_samples,), optional
            True values or labels; omitted for a grid or a libsvm file.
        sample_weight : array-like of shape (n_samples,), optional
            Weights of the score.

        Returns
        -------
        float
        """
        return super().score(*_score_arguments(X, y), sample_weight=sample_weight)


class _Regressor(_ScoreOwnLabels, RegressorMixin, _LinearModel):
    _loss = "squared"
    _multi_output = False  # y of shape (n_samples, n_targets): one model per column

    def fit(self, X, y=None, sample_weight=None):
        """Fit the model, certified by its relative duality gap.

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, dask array, xarray, Grid or path
            The design matrix, of shape (n_samples, n_features). A path names a grid
            store or a libsvm file.
        y : array-like of shape (n_samples,) or (n_samples, n_targets), optional
            Targets; omitted for a grid or a libsvm file, which carry their labels. 2-D
            for ``Ridge`` only: one model per column.
        sample_weight : float, array-like or dask array of shape (n_samples,), optional
            Non-negative weights of the examples (a number: every row's): the loss term
            becomes ``(1/Σw) Σ w_i loss_i`` (a grid's stored weights when omitted).

        Returns
        -------
        self
            The fitted estimator.
        """
        data = self._read_fit_input(X, y, y_numeric=True, multi_output=self._multi_output)
        sample_weight = _base_weights(data, sample_weight)
        columns = np.ndim(data.y) == 2 and self._multi_output
        targets = [data.y[:, k] for k in range(data.y.shape[1])] if columns else [data.y]
        self._set_fitted(self._fit_models(data, targets, sample_weight), not columns)
        return self

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = self._multi_output
        return tags

    def predict(self, X):
        """Predict ``X @ coef_ + intercept_``.

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, dask array, xarray, Grid or path
            Of shape (n_samples, n_features).

        Returns
        -------
        ndarray or dask array of shape (n_samples,) or (n_samples, n_targets)
            A lazy dask array for dask or grid X; one column per target of a 2-D y.
        """
        return self._decision(X)


class _Classifier(_ScoreOwnLabels, ClassifierMixin, _LinearModel):
    def fit(self, X, y=None, sample_weight=None):
        """Fit one binary model, or one per class (one-vs-rest) for more than two classes.

        Parameters
        ----------
        X : array-like, sparse matrix, DataFrame, dask array, xarray, Grid or path
            The design matrix, of shape (n_samples, n_features). A path names a grid
            store or a libsvm file.
        y : array-like of shape (n_samples,), optional
            Class labels; omitted for a grid or a libsvm file, which carry their labels.
        sample_weight : float, array-like or dask array of shape (n_samples,), optional
            Non-negative weights of the examples (a number: every row's), multiplied by
            ``class_weight``: the loss term becomes ``(1/Σw) Σ w_i loss_i``, and ``C``
            maps to ``alpha = 1/(C·Σw)`` (scikit-learn's ``C Σ w_i loss_i + penalty``). A
            grid's stored weights when omitted.

        Returns
        -------
        self
            The fitted estimator.
        """
        loss = self._loss_name()
        if loss not in CLASSIFICATION_LOSSES:
            raise ValueError(
                f"loss={loss!r} is not a classification loss ({', '.join(CLASSIFICATION_LOSSES)})"
            )
        data = self._read_fit_input(X, y, y_numeric=False)
        self._set_classes(data)
        sample_weight = _class_weighted(
            data,
            _base_weights(data, sample_weight),
            getattr(self, "class_weight", None),
            self.classes_,
        )
        if self._fits_multinomial(data, len(self.classes_)):
            self._fit_multinomial(data, sample_weight)
            return self
        y = data.X.y if data.kind == "grid" else data.y
        targets = _binary_targets(self.classes_, y, data.kind == "grid")
        self._set_fitted(self._fit_models(data, targets, sample_weight), single_output=False)
        return self

    def _set_classes(self, data: ModelInput) -> None:
        """``classes_`` of the input: two classes at least."""
        self.classes_ = _classes(data)
        if len(self.classes_) < 2:
            raise ValueError(
                "This solver needs samples of at least 2 classes in the data, "
                f"but the data contains only one class: {self.classes_[0]!r}"
            )

    def _fits_multinomial(self, data: ModelInput, n_classes: int) -> bool:
        """Whether one multinomial model is fitted rather than binary ones (LogisticRegression)."""
        return False

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
        return class_labels(self.decision_function(X), self.classes_)


def _set_parameters(estimator, arguments: dict) -> None:
    """Each argument of an ``__init__`` (its ``locals()``) as the parameter of that name,
    unchanged: scikit-learn's ``get_params``, ``set_params`` and ``clone`` read them."""
    for name, value in arguments.items():
        if name != "self":
            setattr(estimator, name, value)


def _check_dask_matrix(X) -> None:
    check_2d(X)
    engine_dtype(X.dtype)  # raises for a dtype that is not numeric


def _score_arguments(X, y):
    """(X, y) for a score: a grid's or a libsvm file's own labels when y is omitted."""
    if y is not None:
        return X, y
    labels = _labels(read_input(X))
    if labels is None:
        raise ValueError("score needs y (only a grid or a libsvm file carry their labels)")
    return X, labels


def _labels(data: ModelInput):
    """The labels of the input in memory (a grid's in the dtype they were written in, to
    compare with ``classes_``), or None."""
    y = data.X.y if data.kind == "grid" else data.y
    if y is None:
        return None
    labels = np.asarray(y.compute() if is_dask(y) else y)
    return labels.astype(data.X.label_dtype) if data.kind == "grid" else labels


def _base_weights(data: ModelInput, sample_weight):
    """The weights given (numpy, one per row: a number is every row's weight; or dask for
    dask X), or a grid's stored weights; checked."""
    if sample_weight is None:
        return data.X.stored_weights() if data.kind == "grid" else None
    if is_dask(sample_weight):
        return sample_weight
    n_samples = int(data.X.shape[0])
    weights = np.asarray(per_row_weights(sample_weight, n_samples))  # a number: every row's
    check_sample_weight(weights, n_samples)  # raises on bad weights
    return weights


def _class_weighted(data: ModelInput, sample_weight, class_weight, classes):
    """sample_weight × class_weight[y_i] by scikit-learn's own rule
    (:func:`sklearn.utils.class_weight.compute_class_weight`: "balanced" weighs class k by
    n_samples / (n_classes · count_k), the counts weighted by sample_weight when given);
    None when both are None."""
    if class_weight is None:
        return sample_weight
    from sklearn.utils.class_weight import compute_class_weight

    labels = _labels(data)
    given = sample_weight
    if given is not None and is_dask(given):
        given = given.compute()
    weighted_counts = "sample_weight" in inspect.signature(compute_class_weight).parameters
    extra = {"sample_weight": given} if given is not None and weighted_counts else {}
    per_class = compute_class_weight(class_weight, classes=classes, y=labels, **extra)
    per_example = per_class[np.searchsorted(classes, labels)]
    if sample_weight is None:
        return per_example
    if is_dask(sample_weight):
        import dask.array as da

        return sample_weight * da.from_array(per_example, chunks=sample_weight.chunks)
    return np.asarray(sample_weight, dtype=np.float64) * per_example


def _total(sample_weight) -> float:
    """Σw (computed once for a dask vector)."""
    total = sample_weight.sum()
    total = float(total.compute() if is_dask(total) else total)
    if not total > 0.0:  # NaN, negatives and the rest are named by the fit's own checks
        raise ValueError(
            "sample_weight sums to zero (or is not a number): at least one "
            "example needs a positive weight"
        )
    return total
