"""The regressors: Ridge, Lasso and ElasticNet (least squares, certified by the duality
gap)."""

from __future__ import annotations

from dask_scd.estimators.base import _Regressor, _set_parameters
from dask_scd.estimators.docstrings import _docstring


class _PenalizedLeastSquares(_Regressor):
    """Ridge's and Lasso's parameters."""

    def __init__(
        self,
        alpha=1.0,
        *,
        fit_intercept=True,
        tol=1e-6,
        max_iter=1000,
        solver="auto",
        warm_start=False,
        random_state=None,
        verbose=0,
        positive=False,
        lower_bounds=None,
        upper_bounds=None,
    ):
        _set_parameters(self, locals())


class Ridge(_PenalizedLeastSquares):
    _penalty = "l2"
    _multi_output = True

    __doc__ = _docstring("""Least squares with an L2 penalty, certified by its duality gap.

    Minimizes ``(1/(2n))‖y − Xθ − b‖² + (alpha/2)‖θ‖²``.

    Parameters
    ----------
    alpha : float > 0, default=1.0
        Regularization strength, per example: scikit-learn's ``Ridge(alpha=a)``
        minimizes ``‖y − Xθ − b‖² + a‖θ‖²``, which is this model with
        ``alpha = a / n_samples``.
{common_parameters}
{bound_parameters}

    With y of shape (n_samples, n_targets), one model is fitted per column (scikit-learn's
    multi-target ``Ridge``): ``coef_`` has one row per target.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
        θ, in the original feature order; one row per target for a 2-D y.
    intercept_ : float or ndarray of shape (n_targets,)
        b (0.0 when ``fit_intercept=False``); one per target for a 2-D y.
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


class Lasso(_PenalizedLeastSquares):
    _penalty = "l1"

    __doc__ = _docstring("""Least squares with an L1 penalty, certified by its duality gap.

    Minimizes ``(1/(2n))‖y − Xθ − b‖² + alpha‖θ‖₁``, scikit-learn's ``Lasso`` objective:
    ``alpha`` has the same meaning.

    Parameters
    ----------
    alpha : float > 0, default=1.0
        Weight of the L1 penalty.
{common_parameters}
{bound_parameters}

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

    def __init__(
        self,
        alpha=1.0,
        *,
        l1_ratio=0.5,
        fit_intercept=True,
        tol=1e-6,
        max_iter=1000,
        solver="auto",
        warm_start=False,
        random_state=None,
        verbose=0,
        positive=False,
        lower_bounds=None,
        upper_bounds=None,
    ):
        _set_parameters(self, locals())

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
{bound_parameters}

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
