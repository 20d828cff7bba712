"""Sample weights in the objective: ``(1/Σw) Σ w_i ℓ_i`` is ``(1/n) Σ v_i ℓ_i`` with v = n·w/Σw."""

from __future__ import annotations

import numbers

import numpy as np


def check_sample_weight(sample_weight, n_samples: int, where: str = "sample_weight"):
    """Check per-example weights and scale them to mean 1.

    The weighted objective ``(1/Σw) Σ w_i ℓ_i + penalty`` is ``(1/n) Σ v_i ℓ_i + penalty``
    with ``v = n·w/Σw``: the engines keep their 1/n and read v.

    ``sample_weight`` is one weight per row, or a number, the same weight for every row
    (scikit-learn's scalar ``sample_weight``: the unweighted problem).

    Returns
    -------
    v : array of shape (n_samples,), float64 (a new array: the caller's is untouched),
        or None when ``sample_weight`` is None or every weight is the same.
    """
    if sample_weight is None:
        return None
    w = one_per_row(per_row_weights(sample_weight, n_samples), n_samples, where, "entries")
    if w.dtype.kind not in "biuf":
        raise ValueError(f"{where} must be numeric, got dtype {w.dtype}")
    w = w.astype(np.float64)  # always a copy
    if not np.isfinite(w).all():
        raise ValueError(
            f"{where} contains NaN or infinity (first at index {np.argmax(~np.isfinite(w))})"
        )
    if (w < 0).any():
        first = int(np.argmax(w < 0))
        raise ValueError(f"{where} must be non-negative: {where}[{first}] = {w[first]!r}")
    total = float(w.sum())
    if not total > 0.0:
        raise ValueError(f"{where} sums to zero: at least one example needs a positive weight")
    if not np.isfinite(total):
        raise ValueError(f"{where} sums to infinity; rescale it (only ratios matter)")
    if (w == w[0]).all():
        return None  # equal weights: the unweighted problem itself
    w *= n_samples / total
    return w


def per_row_weights(sample_weight, n_samples: int):
    """The weights as one per row: a number (not a bool) as that weight for every row, a
    pandas Series as its numpy array, anything else as given (a dask vector untouched)."""
    if isinstance(sample_weight, numbers.Real) and not isinstance(sample_weight, bool):
        return np.full(n_samples, float(sample_weight))
    if type(sample_weight).__module__.startswith("pandas"):
        return sample_weight.to_numpy()
    return sample_weight


def one_per_row(values, n_samples: int, name: str, items: str) -> np.ndarray:
    """``values`` as a 1-D array of ``n_samples`` entries (a single column flattened),
    else a ValueError naming ``name`` and its ``items``."""
    values = np.asarray(values)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1:
        raise ValueError(f"{name} must be 1-D of shape (n_samples,), got shape {values.shape}")
    if values.shape[0] != n_samples:
        raise ValueError(f"{name} has {values.shape[0]} {items} but X has {n_samples} rows")
    return values
