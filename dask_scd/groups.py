"""Complete one-hot groups: the flat directions of one-hot data, and the step along them.

On one-hot data every categorical variable contributes exactly one 1 per example, so the
sum of its columns is the all-ones vector: shifting that group's coefficients by −c and
the intercept (or another complete group) by +c changes no margin. Coordinate descent
crawls along such directions at a rate set only by the tiny penalty curvature, which is
why it can take thousands of epochs on data like Adult. One exact 1-D step per group
(:func:`dask_scd.objectives.best_shift`) removes the problem for the cost of O(p).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from numba import njit

from dask_scd.objectives import Problem, best_shift


@njit(cache=True)
def _greedy_groups(data, indices, indptr, n_rows, order, max_groups):
    """Assign 0/1 columns to groups whose rows never overlap (first fit, given order)."""
    n_features = indptr.shape[0] - 1
    occupied = np.zeros((max_groups, n_rows), dtype=np.bool_)
    filled = np.zeros(max_groups, dtype=np.int64)
    group = np.full(n_features, -1, dtype=np.int64)
    n_groups = 0
    for j in order:
        start, end = indptr[j], indptr[j + 1]
        if start == end:
            continue
        binary = True
        for idx in range(start, end):
            if data[idx] != 1.0:
                binary = False
                break
        if not binary:
            continue
        target = -1
        for g in range(n_groups):
            clash = False
            for idx in range(start, end):
                if occupied[g, indices[idx]]:
                    clash = True
                    break
            if not clash:
                target = g
                break
        if target < 0:
            if n_groups == max_groups:
                continue
            target = n_groups
            n_groups += 1
        for idx in range(start, end):
            occupied[target, indices[idx]] = True
        filled[target] += end - start
        group[j] = target
    return group, filled[:n_groups]


def complete_onehot_groups(X, max_groups: int = 256) -> list[np.ndarray]:
    """Groups of 0/1 columns of X that hold exactly one 1 in every row.

    Parameters
    ----------
    X : scipy.sparse matrix of shape (n_samples, n_features)

    Returns
    -------
    list of int arrays of feature indices (possibly empty). Dense X returns [].
    """
    if not sp.issparse(X):
        return []
    C = X.tocsc()
    if not C.has_canonical_format:
        C = C.copy()
        C.sum_duplicates()
    nnz = np.diff(C.indptr)
    order = np.argsort(-nnz, kind="stable").astype(np.int64)
    group, filled = _greedy_groups(C.data, C.indices, C.indptr, C.shape[0], order, max_groups)
    return [np.flatnonzero(group == g) for g in np.flatnonzero(filled == C.shape[0])]


def recenter(problem: Problem, coef, intercept: float, groups) -> float:
    """Exact steps along the flat directions of complete one-hot groups; returns b.

    With an intercept each group's shift goes into b; without one, into the first group.
    ``coef`` is updated in place; margins are unchanged by construction.
    """
    if not groups:
        return intercept
    if problem.fit_intercept:
        for g in groups:
            c = best_shift(problem, coef[g])
            coef[g] -= c
            intercept += c
        return intercept
    anchor = groups[0]
    for g in groups[1:]:
        c = best_shift(problem, np.concatenate([coef[g], -coef[anchor]]))
        coef[g] -= c
        coef[anchor] += c
    return intercept
