"""What every engine receives and returns: the seam between ``fit`` and the engines.

An engine is a function ``run(data, problem, options) -> Run``:

- ``data`` is :class:`InMemory` (validated X and y) for the in-memory engines, or the
  dask source of :func:`dask_scd.solvers.block_scd.make_source` for the dask engines;
- ``problem`` is the :class:`dask_scd.objectives.Problem`;
- ``options`` is :class:`Options`: the common fit arguments, a :class:`Progress` reporter
  and the engine's own keyword options (already checked against the names it declares).

It returns a :class:`Run`: coefficients, intercept and the final certificate. Engines
never validate user input, never call :func:`dask_scd.fit`, and never build the user's
result: :func:`dask_scd.api.fit` does those once, for all of them. The registry of
engines is :mod:`dask_scd.solvers.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from dask_scd import objectives as obj
from dask_scd.progress import Progress
from dask_scd.result import History


@dataclass
class InMemory:
    """Validated in-memory data: X (numpy or scipy.sparse CSR/CSC) and y (±1 for classifiers)."""

    X: object
    y: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.X.shape

    @cached_property
    def nnz(self) -> int:
        return int(self.X.nnz) if sp.issparse(self.X) else int(np.prod(self.X.shape))

    @cached_property
    def gram_flops(self) -> float:
        """Multiply-adds of XᵀDX: Σ_i nnz(x_i)² (n·p² when dense)."""
        X = self.X
        if sp.issparse(X):
            if X.format == "csr":
                per_row = np.diff(X.indptr)
            elif X.format == "csc":
                per_row = np.bincount(X.indices, minlength=X.shape[0])
            else:
                per_row = np.diff(X.tocsr().indptr)
            return float(np.dot(per_row.astype(np.float64), per_row))
        return float(X.shape[0]) * X.shape[1] ** 2

    @cached_property
    def mean_row_sq_norm(self) -> float:
        """mean ‖x_i‖², the scale of the dual's conditioning (one pass over the values)."""
        X = self.X
        if sp.issparse(X):
            return float(np.dot(X.data, X.data)) / X.shape[0]
        return float(np.einsum("ij,ij->", X, X)) / X.shape[0]  # no n×p temporary


@dataclass
class Options:
    """The fit's common arguments, as every engine receives them."""

    tol: float
    max_iter: int
    rng: np.random.Generator
    progress: Progress = field(default_factory=lambda: Progress("", 0.0, 0))
    engine: dict = field(default_factory=dict)  # the engine's own options
    device: str = "cpu"  # where epochs run, "cpu" or "gpu" (see dask_scd.kernels.device)


@dataclass
class Run:
    """What an engine hands back to :func:`dask_scd.fit`."""

    coef: np.ndarray
    intercept: float
    certificate: obj.Certificate
    n_iter: int
    history: History
    extras: dict = field(default_factory=dict)  # engine-specific figures (bytes moved, ...)

    def converged(self, tol: float) -> bool:
        return self.certificate.relative_gap <= tol


class CertificateSchedule:
    """When to pay for a certificate (a full pass over X): the two-stage test.

    Every epoch at first; then when the cheap test says the iterate has nearly stopped
    moving (max |Δθ| ≤ 1e-3·max |θ|) and ``spacing`` epochs have passed since the last
    certificate, and at least every ``every`` epochs.
    """

    def __init__(self, first=3, every=5, gate=1e-3):
        self.first, self.every, self.gate = first, every, gate
        self.last = 0

    def due(self, epoch, max_delta, max_coef, final, spacing=1) -> bool:
        due = (final or epoch <= self.first or epoch - self.last >= self.every
               or (max_delta <= self.gate * max_coef and epoch - self.last >= spacing))
        if due:
            self.last = epoch
        return due
