"""What the local engines share: the epoch kernels as they call them (a MajorMatrix and
the iterate in, the weighted CPU kernel in place of the plain one when there are sample
weights), the check that weights run on the CPU, and the intercept of θ = 0."""

from __future__ import annotations

import numpy as np

from dask_scd.kernels import cpu
from dask_scd.kernels.layout import MajorMatrix


def scd_epoch(
    kernel,
    m: MajorMatrix,
    y,
    margins,
    coef,
    intercept,
    order,
    problem,
    l2,
    sq_norms,
    cubes,
    weights,
    bounds=None,
):
    """One primal SCD epoch over the coordinates ``order`` of the columns ``m``: ``kernel``
    (:func:`dask_scd.kernels.cpu.scd_epoch` or a twin with its arguments) without
    ``weights`` nor ``bounds`` (a :class:`~dask_scd.objectives.Bounds` of the columns of
    ``m``), else :func:`dask_scd.kernels.cpu.scd_weighted_epoch`; returns the kernel's."""
    args = (m.data, m.indices, m.indptr, m.dense, m.n_minor, y, margins, coef, intercept, order)
    args += (problem.loss_code, problem.l1, l2, sq_norms, cubes)
    if weights is None and bounds is None:
        return kernel(*args)
    weights = EMPTY if weights is None else weights
    return cpu.scd_weighted_epoch(*args, weights, *box_arrays(bounds))


EMPTY = np.zeros(0)  # the kernels' "no weights", "no bounds"


def box_arrays(bounds) -> tuple:
    """(lower, upper) of ``bounds`` (a :class:`~dask_scd.objectives.Bounds`), empty arrays
    for None."""
    return (EMPTY, EMPTY) if bounds is None else (bounds.lower, bounds.upper)


def sdca_epoch(
    kernel, m: MajorMatrix, y, dual_coef, coef, order, loss_code, alpha_n, sq_norms, weights, *shift
):
    """One SDCA epoch over the rows ``order`` of ``m``: ``kernel``
    (:func:`dask_scd.kernels.cpu.sdca_epoch` or its GPU twin) without ``weights``, else
    :func:`dask_scd.kernels.cpu.sdca_weighted_epoch`; ``shift`` = (b, ρ, [Σa]), the
    intercept's multiplier terms. Returns max |Δa_i|."""
    args = (m.data, m.indices, m.indptr, m.dense, m.n_minor, y, dual_coef, coef, order)
    args += (loss_code, alpha_n, sq_norms)
    if weights is None:
        return kernel(*args, *shift)
    return cpu.sdca_weighted_epoch(*args, weights, *shift)


def check_cpu_weights(weights, device: str, solver: str) -> None:
    """Sample weights are solved by the CPU epochs of the local engines only."""
    if weights is not None and device == "gpu":
        raise ValueError(
            f"sample weights are solved by the CPU epochs of solver={solver!r}: pass device='cpu'"
        )
