"""Preconditioned conjugate gradients, the one inner solver of every Newton-CG step.

The engines hand it the curvature as a product ``product(v)`` and never a matrix: the
in-memory Newton engines a pass over X's rows (:mod:`dask_scd.engines.newton.quadratic`),
the multinomial engines two (:mod:`dask_scd.engines.newton.multinomial`), block Newton's
curvature-product path one reduction over the row chunks
(:mod:`dask_scd.engines.block.wide_newton`). The preconditioner is the caller's too: a
diagonal, its two-level form (:mod:`dask_scd.engines.coarse_level`), or the factor of a
sampled Hessian.

A vector of the solve is an array, or a tuple of arrays (the multinomial's coefficients
(n_features, n_classes) and intercepts (n_classes,) side by side): ``product`` and
``precondition`` then take and return such tuples, and inner products add up the parts'
in order.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np

# Iterations of one solve, at most, unless the caller says otherwise.
MAX_ITER = 500


def conjugate_gradients(
    product: Callable,
    rhs,
    precondition: Callable,
    stop: float | Callable,
    max_iter: int = MAX_ITER,
    dot: Callable = operator.matmul,
    on_step: Callable | None = None,
):
    """Solve A x = ``rhs`` from x = 0 by preconditioned conjugate gradients.

    Parameters
    ----------
    product : callable
        v ↦ A v, A symmetric.
    rhs : ndarray or tuple of ndarray
        The right-hand side; x, the residual r and the directions have its form.
    precondition : callable
        r ↦ M⁻¹ r.
    stop : float or callable
        The forcing term η: stop at ‖r‖ ≤ η·‖rhs‖; or a rule ``stop(x, r, ‖r‖) -> bool``
        whose target moves along the solve (it reads x and r, never writes them).
    max_iter : int
        Products with A, at most.
    dot : callable
        The inner product of two parts: ``a @ b`` (BLAS), or the multinomial's
        ``np.sum(a * b)`` over its two-dimensional parts, which rounds differently.
    on_step : callable, optional
        Called with the step length t after each update x ← x + t·direction (the last
        product's direction): a caller keeping a linear image of x (X x, from the
        products' own passes) updates it there.

    Returns
    -------
    x : ndarray or tuple of ndarray
    iterations : int
        The products with A taken. A direction of non-positive curvature ends the solve
        where it stands.
    """

    def inner(a, b) -> float:
        pairs = zip(_parts(a), _parts(b))
        total = float(dot(*next(pairs)))
        for a_part, b_part in pairs:
            total += float(dot(a_part, b_part))
        return total

    if not callable(stop):
        stop = _forcing_test(stop * float(np.sqrt(inner(rhs, rhs))))
    x = _each(np.zeros_like, rhs)
    r = _each(np.copy, rhs)
    z = precondition(r)
    direction = _each(np.copy, z)
    rz = inner(r, z)
    iterations = 0
    while iterations < max_iter:
        if stop(x, r, float(np.sqrt(inner(r, r)))):
            break
        image = product(direction)
        iterations += 1
        curvature = inner(direction, image)
        if not curvature > 0.0:
            break
        step = rz / curvature
        for x_part, r_part, d_part, image_part in zip(*map(_parts, (x, r, direction, image))):
            x_part += step * d_part
            r_part -= step * image_part
        if on_step is not None:
            on_step(step)
        z = precondition(r)
        rz, previous = inner(r, z), rz
        beta = rz / previous
        direction = _each(lambda z_part, d_part: z_part + beta * d_part, z, direction)
    return x, iterations


def _forcing_test(target: float):
    """The rule ‖r‖ ≤ ``target``."""
    return lambda x, r, norm: norm <= target


def _parts(vector) -> tuple:
    return vector if isinstance(vector, tuple) else (vector,)


def _each(function, *vectors):
    """``function`` applied to the vectors, part by part when they are tuples."""
    if isinstance(vectors[0], tuple):
        return tuple(function(*parts) for parts in zip(*vectors))
    return function(*vectors)
