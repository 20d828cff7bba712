"""Decision values of dask input: lazy ``X @ coef.T + intercept`` over any chunking,
sparse chunks never densified."""

from __future__ import annotations

import numpy as np


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
