"""Input checks, done once in the wrappers so that kernels never validate."""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp

from dask_scd.objectives import CLASSIFICATION_LOSSES, LOSSES, PENALTIES, Problem


def check_problem(loss, penalty, alpha, l1_ratio, fit_intercept) -> Problem:
    """Validate the problem's arguments and return a :class:`Problem`."""
    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r} is not one of {LOSSES}")
    if penalty not in PENALTIES:
        raise ValueError(f"penalty={penalty!r} is not one of {PENALTIES}")
    if not isinstance(alpha, numbers.Real) or not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(
            f"alpha={alpha!r} must be a finite number > 0 (the dual and the duality gap "
            "need a strictly positive regularization)"
        )
    if not isinstance(l1_ratio, numbers.Real) or not 0.0 <= l1_ratio <= 1.0:
        raise ValueError(f"l1_ratio={l1_ratio!r} must be in [0, 1]")
    if loss == "hinge" and penalty != "l2":
        raise ValueError(
            f"loss='hinge' needs penalty='l2' (got penalty={penalty!r}): the hinge is not "
            "smooth, so it is solved in the dual, which exists for the L2 penalty only; "
            "use loss='squared_hinge' for an L1 or elastic-net SVM"
        )
    rho = {"l2": 0.0, "l1": 1.0, "elasticnet": float(l1_ratio)}[penalty]
    return Problem(loss=loss, alpha=float(alpha), l1_ratio=rho, fit_intercept=bool(fit_intercept))


def check_fit_args(tol, max_iter) -> None:
    if not isinstance(tol, numbers.Real) or not tol > 0:
        raise ValueError(f"tol={tol!r} must be a number > 0 (a relative duality gap)")
    if not isinstance(max_iter, numbers.Integral) or max_iter < 1:
        raise ValueError(f"max_iter={max_iter!r} must be an integer ≥ 1")


def check_matrix(X):
    """Check an in-memory design matrix; returns it unchanged (never copied or modified)."""
    if sp.issparse(X):
        values = X.data
    else:
        X = np.asarray(X)
        values = X
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D of shape (n_samples, n_features), got shape {X.shape}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"X is empty: shape {X.shape}")
    if values.dtype.kind not in "biuf":
        raise ValueError(f"X must be numeric, got dtype {values.dtype}")
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        bad = np.argwhere(~np.isfinite(values))[0]
        where = f"stored value #{bad[0]}" if sp.issparse(X) else f"row {bad[0]}, column {bad[1]}"
        raise ValueError(f"X contains NaN or infinity (first at {where})")
    return X


def check_labels(y, n_samples: int, loss: str):
    """Check y; map classification labels to ±1.

    Returns
    -------
    y : array of shape (n_samples,), float64 (a new array: the caller's is untouched)
    classes : array of shape (2,) or None; ``classes[0]`` ↦ −1, ``classes[1]`` ↦ +1.
    """
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D of shape (n_samples,), got shape {y.shape}")
    if y.shape[0] != n_samples:
        raise ValueError(f"y has {y.shape[0]} labels but X has {n_samples} rows")
    if loss not in CLASSIFICATION_LOSSES:
        if y.dtype.kind not in "biuf":
            raise ValueError(f"y must be numeric for loss={loss!r}, got dtype {y.dtype}")
        y = y.astype(np.float64)  # always a copy
        if not np.isfinite(y).all():
            raise ValueError(f"y contains NaN or infinity (first at index {np.argmax(~np.isfinite(y))})")
        return y, None
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        raise ValueError(f"y contains NaN or infinity (first at index {np.argmax(~np.isfinite(y))})")
    classes = np.unique(y)
    if len(classes) > 2:
        raise ValueError(
            f"loss={loss!r} is a binary loss but y has {len(classes)} classes "
            f"({classes[:5].tolist()}...); for more than two classes fit one binary model per "
            "class (one-vs-rest: y == k against the rest)"
        )
    if len(classes) < 2:
        raise ValueError(f"y has a single class {classes.tolist()}: a classifier needs two")
    return np.where(y == classes[1], 1.0, -1.0), classes
