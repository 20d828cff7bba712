"""Numba kernel: one epoch of coordinate descent on the Gram matrix (squared loss).

For the squared loss the coordinate step needs only ``H = XᵀX/n`` (centred when there is
an intercept) and the gradient ``q = Hθ − Xᵀy/n``: a step on coordinate j moves q by
``H[j] Δθ_j``, p operations instead of a pass over a column of n values ("covariance
updates", Friedman, Hastie & Tibshirani 2010, section 2.2). The wrapper is
:func:`dask_scd.engines.local.gram.fit_gram`.
"""

from __future__ import annotations

from numba import njit

from dask_scd.kernels.lines import FAST as _FAST
from dask_scd.kernels.scalar import prox_newton as _prox_newton


@njit(nogil=True, cache=True, fastmath=_FAST)
def gram_epoch(gram, gradient, coef, order, l1, l2):
    """One epoch of exact coordinate minimization in the given coordinate ``order``.

    Parameters
    ----------
    gram : array of shape (n_features, n_features), C order, ``H = XᵀX/n``
    gradient : array of shape (n_features,), ``q = Hθ − Xᵀy/n``, updated in place
    coef : array of shape (n_features,), updated in place

    Returns max |Δθ_j| and max |θ_j| over the epoch.
    """
    n_features = coef.shape[0]
    max_delta = 0.0
    max_coef = 0.0
    for k in range(order.shape[0]):
        j = order[k]
        old = coef[j]
        new = _prox_newton(old, gradient[j], gram[j, j], l1, l2)
        delta = new - old
        if delta != 0.0:
            coef[j] = new
            row = gram[j]
            for i in range(n_features):  # q += H[:, j] Δθ_j  (H symmetric: its row j)
                gradient[i] += row[i] * delta
        max_delta = max(max_delta, abs(delta))
        max_coef = max(max_coef, abs(new))
    return max_delta, max_coef
