"""Cholesky factors of the engines' small symmetric positive definite systems, straight
from LAPACK (``potrf`` / ``potrs``, the routines behind :func:`scipy.linalg.cho_factor`
and :func:`scipy.linalg.cho_solve`, with the same results): an outer Newton step of a
small problem solves one such system, where scipy's checks and conversions cost more
than the factorization itself."""

from __future__ import annotations

import numpy as np
from scipy.linalg import LinAlgError, lapack


def factor(
    matrix: np.ndarray, lower: bool = False, check_finite: bool = True, overwrite: bool = False
):
    """(c, lower): the Cholesky factor of the float64 ``matrix`` as
    :func:`scipy.linalg.cho_factor` gives it; with ``overwrite`` an F-ordered ``matrix`` is
    factored in place (no copy). Raises ``LinAlgError`` where the matrix is not positive
    definite and ``ValueError`` where it holds NaN or inf (when checked)."""
    if check_finite and not np.isfinite(matrix).all():
        raise ValueError("the system to factor holds NaN or inf")
    c, info = lapack.dpotrf(matrix, lower=lower, overwrite_a=overwrite, clean=False)
    if info > 0:
        raise LinAlgError(f"{info}-th leading minor of the array is not positive definite")
    if info < 0:
        raise ValueError(f"LAPACK dpotrf: illegal value in argument {-info}")
    return c, lower


def solve(factored, rhs: np.ndarray) -> np.ndarray:
    """A⁻¹·rhs from ``factored`` = :func:`factor` (A)."""
    c, lower = factored
    x, info = lapack.dpotrs(c, rhs, lower=lower, overwrite_b=False)
    if info != 0:
        raise ValueError(f"LAPACK dpotrs: illegal value in argument {-info}")
    return x
