"""In-memory engine: dual SDCA over rows (``solver="sdca"``).

The solver is one loop that reads top to bottom — permute, run an epoch kernel, certify,
check — with every numerical step in :mod:`dask_scd.kernels.cpu` and
:mod:`dask_scd.kernels.sdca` and every objective in :mod:`dask_scd.objectives`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.kernels import cpu, device, sdca
from dask_scd.kernels.layout import MajorMatrix
from dask_scd.result import History
from dask_scd.solvers.base import CertificateSchedule, Options, Run
from dask_scd.solvers.certificates import dual_certificate, primal_certificate


def fit_sdca(data: InMemory, problem: obj.Problem, options: Options) -> Run:
    """Stochastic dual coordinate ascent (L2 penalty).

    The intercept's dual constraint Σ a_i = 0 is handled by the method of multipliers:
    SDCA epochs on the augmented Lagrangian, then b ← b + ρ Σ a_i, with ρ a fifth of the
    mean coordinate curvature ‖x_i‖²/(αn) (see :func:`dask_scd.kernels.cpu.sdca_epoch`). It
    beats steps on random pairs of rows, which keep Σ a_i = 0 exactly but crawl on the
    box-constrained hinge dual.

    Rows are visited in block-shuffled order (:func:`dask_scd.kernels.sdca.block_order`).
    The hinge and the squared hinge start at a = 0 and shrink as liblinear does
    (:func:`dask_scd.kernels.sdca.sdca_shrinking_epoch`); an epoch is then n row visits,
    spread over passes on the active rows. The certificate over all rows decides when
    to stop, whatever the active set.

    ``data.X``: ndarray or scipy.sparse matrix of shape (n_samples, n_features);
    ``data.y``: ndarray of shape (n_samples,), ±1 for classification losses.
    """
    X, y = data.X, data.y
    tol, max_iter, rng = options.tol, options.max_iter, options.rng
    matrix = MajorMatrix.from_array(X, "rows")
    epoch_matrix = device.place(matrix, options.device)  # what the epochs read: host or GPU
    kernels = device.kernels_for(epoch_matrix.data)
    n_samples, n_features = X.shape
    alpha_n = problem.alpha * n_samples
    row_sq_norms = matrix.sq_norms()
    rho = PENALTY_SCALE * float(row_sq_norms.mean()) / alpha_n if problem.fit_intercept else 0.0
    schedule = CertificateSchedule()
    intercept = 0.0
    if problem.fit_intercept:
        intercept = obj.optimal_intercept(problem.loss, y, np.zeros(n_samples))
    dual_coef = dual_start(problem, y, intercept)
    coef = matrix.scatter(dual_coef) / alpha_n

    history = History()
    start = time.perf_counter()
    epoch = 0
    # Shrinking is a sequential strategy: GPU epochs visit every row.
    shrinking = (_Shrinking.start(n_samples) if problem.loss in _BOX_DUALS and kernels is cpu
                 else None)
    all_rows = np.arange(n_samples)
    for epoch in range(1, max_iter + 1):
        dual_sum = np.array([dual_coef.sum()])
        if shrinking is None:
            max_delta = kernels.sdca_epoch(
                epoch_matrix.data, epoch_matrix.indices, epoch_matrix.indptr,
                epoch_matrix.dense, n_features, y,
                dual_coef, coef, _block_order(all_rows, rng), problem.loss_code, alpha_n,
                row_sq_norms, intercept, rho, dual_sum,
            )
            settled = False
        else:
            max_delta, settled = shrinking.epoch(
                matrix, y, dual_coef, coef, problem.loss_code, alpha_n, row_sq_norms,
                intercept, rho, dual_sum, rng,
            )
        intercept += rho * dual_sum[0]  # b ← b + ρ Σ a_i (ρ = 0 without intercept)
        if not (settled or schedule.due(epoch, max_delta, np.abs(dual_coef).max(),
                                        epoch == max_iter)):
            continue
        cert, _, _ = dual_certificate(problem, matrix, y, dual_coef, coef, intercept)
        history.append(epoch, cert.relative_gap, cert.primal, time.perf_counter() - start)
        options.progress.update(epoch, cert.relative_gap, cert.primal)
        if cert.relative_gap <= tol:
            break
    # w drifts from Xᵀa/(αn) by rounding over many axpys: certify the exact one.
    cert, intercept, coef = dual_certificate(problem, matrix, y, dual_coef, None, intercept)
    margins = matrix.dot(coef) + intercept
    primal_cert = primal_certificate(problem, matrix.scatter, y, coef, margins)
    if primal_cert.gap < cert.gap:
        cert = primal_cert
    return Run(coef, float(intercept), cert, epoch, history)


def dual_start(problem, y, intercept) -> np.ndarray:
    """A feasible first dual point, with Σ a_i = 0 when the intercept is fitted."""
    n_samples = len(y)
    if problem.loss in _BOX_DUALS:
        # liblinear's start a = 0 (w = 0). The dual point of θ = 0 would put every row at
        # β = 1 (β = 2 for the squared hinge), far from the few support vectors.
        return np.zeros(n_samples)
    # The dual point of θ = 0 with its best intercept.
    margins0 = np.full(n_samples, intercept)
    dual_coef = obj.dual_point(
        problem, y, margins0, obj.dual_scales(problem, obj.margin_sums(problem, y, margins0))
    )
    if problem.loss == "logistic":
        # The logistic dual is open at β ∈ {0, 1}; keep the start strictly inside.
        dual_coef = np.clip(dual_coef * y, 1e-3, 1 - 1e-3) * y
        if problem.fit_intercept:
            dual_coef = obj.project_sum_zero(dual_coef)
    return dual_coef


# ρ of the method of multipliers, in units of the mean coordinate curvature. Against 1,
# 0.2 took 2–3x fewer epochs to a gap of 1e-9 on breast cancer, digits, diabetes and the
# 300k-row benchmark data (all losses), and on Adult (a9a) too except the hinge (25
# epochs instead of 17); 0.05 and below made the hinge on Adult crawl (b moves slowly).
PENALTY_SCALE = 0.2

# Duals with a box constraint on β = a·y (rows sit at its bounds): SDCA with shrinking.
_BOX_DUALS = ("hinge", "squared_hinge")
# Rows per block of the visiting order. Larger blocks read X faster but slow the
# convergence of some problems (256 took 2.7x the epochs on the dense squared hinge).
_ROW_BLOCK = 32
# The shrunk problem is solved to this fraction of the whole problem's violation, or for
# at most this many epochs of work between two passes over all rows.
_RELATIVE_EPS = 1e-3
_SHRUNK_WORK = 2.0


def _block_order(rows, rng) -> np.ndarray:
    """``rows`` (sorted) in block-shuffled order (see :func:`sdca.block_order`)."""
    out = np.empty_like(rows)
    sdca.block_order(rows, _ROW_BLOCK, rng, out)
    return out


@dataclass
class _Shrinking:
    """liblinear's shrinking state, carried from epoch to epoch (see
    :func:`dask_scd.kernels.sdca.sdca_shrinking_epoch`): the active rows
    ``active[:n_active[0]]`` and ``bounds`` = (M̄, m̄, ε, row visits since the last pass
    over all rows); ``order`` and ``keep`` are the kernel's scratch arrays."""

    active: np.ndarray
    n_active: np.ndarray
    bounds: np.ndarray
    order: np.ndarray
    keep: np.ndarray

    @classmethod
    def start(cls, n_samples):
        return cls(np.arange(n_samples), np.array([n_samples]),
                   np.array([np.inf, -np.inf, np.inf, 0.0]), np.empty(n_samples, dtype=np.int64),
                   np.ones(n_samples, dtype=bool))

    def epoch(self, matrix, y, dual_coef, coef, loss_code, alpha_n, row_sq_norms, intercept,
              rho, dual_sum, rng):
        """One epoch of work; returns max |Δa_i| and whether all rows were solved to ε."""
        return sdca.sdca_shrinking_epoch(
            matrix.data, matrix.indices, matrix.indptr, matrix.dense, matrix.n_minor, y,
            dual_coef, coef, loss_code, alpha_n, row_sq_norms, intercept, rho, dual_sum,
            self.active, self.n_active, self.bounds, _ROW_BLOCK, rng, self.order, self.keep,
            _RELATIVE_EPS, _SHRUNK_WORK,
        )
