"""In-memory engine: dual SDCA over rows (``solver="sdca"``).

The solver is one loop that reads top to bottom — permute, run an epoch kernel, certify,
check — with every numerical step in :mod:`dask_scd.kernels.cpu` and
:mod:`dask_scd.kernels.sdca` and every objective in :mod:`dask_scd.objectives`.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.engines.base import CertificateSchedule, Options, Run, Trace
from dask_scd.engines.certificates import dual_certificate, exact_dual_certificate
from dask_scd.engines.local.epochs import check_cpu_weights, sdca_epoch
from dask_scd.kernels import cpu, device, lines, sdca, sdca_threads
from dask_scd.kernels.layout import MajorMatrix


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

    With sample weights v (``data.weights``) each example's dual box scales with v_i:
    the epochs move u = a/v in the unweighted box with curvature v_i·‖x_i‖²/(αn)
    (:func:`dask_scd.kernels.cpu.sdca_weighted_epoch`, and the shrinking epochs of the
    box duals with the same scaling), on the CPU.
    """
    X, y, weights = data.X, data.y, data.weights
    tol, max_iter, rng = options.tol, options.max_iter, options.rng
    check_cpu_weights(weights, options.device, "sdca")
    _check_in_memory(options.engine, options.device)
    matrix = MajorMatrix.from_array(X, "rows")
    epoch_matrix = device.place(matrix, options.device)  # what the epochs read: host or GPU
    kernels = device.kernels_for(epoch_matrix.data)
    n_samples, n_features = X.shape
    alpha_n = problem.alpha * n_samples
    row_sq_norms = matrix.sq_norms()
    rho = PENALTY_SCALE * float(row_sq_norms.mean()) / alpha_n if problem.fit_intercept else 0.0
    rho /= device.dual_concurrency(epoch_matrix, n_samples)  # B rows at once on a GPU
    schedule = CertificateSchedule()
    intercept, dual_coef = cold_start(problem, y, weights)  # u = a/v with weights
    coef = matrix.scatter(weighted_dual(dual_coef, weights)) / alpha_n

    trace = Trace(options.progress, options.callback)
    epoch = 0
    epochs = _Epochs(matrix, epoch_matrix, kernels, problem, y, options.engine, rng, weights)
    in_epochs = 0.0  # seconds inside the epochs alone (the threads' part of a fit)
    try:
        for epoch in range(1, max_iter + 1):
            tick = time.perf_counter()
            max_delta, settled, dual_total = epochs.run(
                dual_coef, coef, alpha_n, row_sq_norms, intercept, rho
            )
            in_epochs += time.perf_counter() - tick
            intercept += rho * dual_total  # b ← b + ρ Σ a_i (ρ = 0 without intercept)
            certify = settled or schedule.due(
                epoch, max_delta, np.abs(dual_coef).max(), epoch == max_iter
            )
            exact = epochs.resync(epoch, certify, dual_coef, coef, alpha_n)
            if not certify:
                continue
            dual = weighted_dual(dual_coef, weights)
            w = coef if exact is None else exact
            cert, _, _ = dual_certificate(problem, matrix, y, dual, w, intercept, weights)
            if trace.certified(epoch, cert, tol):
                break
    finally:
        epochs.close()
    dual = weighted_dual(dual_coef, weights)
    coef, intercept, cert = exact_dual_certificate(problem, matrix, y, dual, intercept, weights)
    # The returned certificate (on the exact w, the better of the dual and the primal
    # one) is that of the last epoch: its entry, replacing the loop's if it had one.
    trace.record(epoch, cert.relative_gap, cert.primal, report=False)
    return trace.ended(
        Run(coef, intercept, cert, epoch, trace.history, {"epoch_seconds": in_epochs})
    )


def cold_start(problem, y, weights=None) -> tuple[float, np.ndarray]:
    """(b₀, the dual point of θ = 0 at b₀ (:func:`dual_start`))."""
    intercept = obj.zero_intercept(problem, y, weights)
    return intercept, dual_start(problem, y, intercept, weights)


def dual_start(problem, y, intercept, weights=None) -> np.ndarray:
    """A feasible first dual point, with Σ a_i = 0 when the intercept is fitted; with sample
    weights v, the point u = a/v in the unweighted domain (0 where v = 0)."""
    n_samples = len(y)
    if problem.loss in _BOX_DUALS:
        # liblinear's start a = 0 (w = 0). The dual point of θ = 0 would put every row at
        # β = 1 (β = 2 for the squared hinge), far from the few support vectors.
        return np.zeros(n_samples)
    # The dual point of θ = 0 with its best intercept: a = −ℓ'(b), so u = −ℓ'(b) too.
    margins0 = np.full(n_samples, intercept)
    sums = obj.margin_sums(problem, y, margins0, weights)
    dual_coef = obj.dual_point(problem, y, margins0, obj.dual_scales(problem, sums))
    if problem.loss == "logistic":
        # The logistic dual is open at β ∈ {0, 1}; keep the start strictly inside.
        dual_coef = np.clip(dual_coef * y, 1e-3, 1 - 1e-3) * y
    if weights is None:
        if problem.loss == "logistic" and problem.fit_intercept:
            dual_coef = obj.project_sum_zero(dual_coef)
        return dual_coef
    dual_coef = np.where(weights > 0.0, dual_coef, 0.0)
    if problem.fit_intercept:  # Σ v_i u_i = 0: shrink one sign of a = v∘u
        a = obj.project_sum_zero(weights * dual_coef)
        dual_coef = np.where(weights > 0.0, a / np.where(weights > 0.0, weights, 1.0), 0.0)
    return dual_coef


def weighted_dual(unit_dual, weights):
    """The dual point a = v∘u of the weighted losses (u itself without weights)."""
    return unit_dual if weights is None else weights * unit_dual


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


def _order_by_shares(rows, rng):
    """``share(lo, hi)``: positions lo:hi of :func:`_block_order`'s order of ``rows``,
    drawn here once and made by whichever thread asks for its share
    (:func:`sdca.block_order_fill`: the same order)."""
    perm, uniforms = sdca.block_order_draws(len(rows), _ROW_BLOCK, rng)
    order = np.empty_like(rows)

    def share(lo: int, hi: int) -> np.ndarray:
        sdca.block_order_fill(rows, _ROW_BLOCK, perm, uniforms, order, lo, hi)
        return order[lo:hi]

    return share


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
        return cls(
            np.arange(n_samples),
            np.array([n_samples]),
            np.array([np.inf, -np.inf, np.inf, 0.0]),
            np.empty(n_samples, dtype=np.int64),
            np.ones(n_samples, dtype=bool),
        )

    def epoch(self, matrix, rng, weights, *args):
        """One epoch of work on ``args`` = (y, a, w, loss code, αn, ‖x_i‖², b, ρ, [Σa]);
        returns max |Δa_i| and whether all rows were solved to ε."""
        m = matrix
        head = (m.data, m.indices, m.indptr, m.dense, m.n_minor)
        state = (self.active, self.n_active, self.bounds, _ROW_BLOCK, rng, self.order, self.keep)
        return sdca.sdca_shrinking_epoch(*head, *args, *state, _RELATIVE_EPS, _SHRUNK_WORK, weights)


def _check_in_memory(engine, device_name: str) -> None:
    """SDCA's options (:class:`~dask_scd.engines.options.SDCAOptions`) checked against
    in-memory X and the device."""
    given = engine.changed("grid")
    if given:
        raise ValueError(
            f"{given} apply to solver='sdca' on a Grid (out of core, row chunk "
            "by row chunk); this X is in memory"
        )
    if engine.n_threads > 1 and device_name == "gpu":
        raise ValueError(
            "n_threads applies to SDCA epochs on the CPU; on the GPU every "
            "epoch is already asynchronous (leave n_threads=1)"
        )


PUBLISH = 64  # visits between two publications of a thread's Σa changes
# Visits between two merges of a thread's private w on dense rows (sdca_thread_epoch_local):
# on dense 1M × 50 logistic at alpha = 1/n, 64 gave 1.49x one thread's epoch speed but a
# relative gap of 2.0e-1 after 8 epochs where one thread reached 1.6e-1; 16 gave 1.56x and
# 1.7e-1; 4 gave 1.39x and 1.6e-1.
MERGE_DENSE = 16
HOT = 1e-3  # a feature held by more than this fraction of the rows is updated atomically


def hot_features(matrix, n_samples: int) -> np.ndarray:
    """Per feature: is it held by more than ``HOT`` of the rows (every feature of dense
    data)? The threads of SA-SDCA add to those atomically (sdca_threads.sdca_thread_epoch)."""
    if matrix.dense:
        return np.ones(matrix.n_minor, dtype=np.bool_)
    counts = lines.index_counts(matrix.indices, matrix.n_minor)
    return counts > HOT * n_samples


class _Epochs:
    """SDCA epochs on ``n_threads`` threads: SA-SDCA (Tran et al. 2015, Algorithm 2).

    The threads share w and add their steps to it without locks (the kernels release the
    GIL); each a_i has one writer in an epoch: the epoch's visiting order
    (:func:`_block_order` of all rows) is cut into one slice per thread, so that run one
    after the other they would be the sequential epoch. A thread reads
    w while the others write it, and an update read-modified-written by two threads at
    once is lost, so w drifts from Xᵀa/(αn): every ``sync_every`` epochs (0: never, the
    "wild" A-SDCA of the paper, which may stall above the optimum) w is recomputed from
    the duals, which are exact. A certificate always reads the recomputed w.

    With one thread this is the sequential engine (and ``rng`` draws as it always did).
    """

    def __init__(self, matrix, epoch_matrix, kernels, problem, y, settings, rng, weights=None):
        n_samples = len(y)
        self.matrix, self.epoch_matrix, self.kernels, self.y = matrix, epoch_matrix, kernels, y
        self.weights = weights
        self.loss_code, self.rng = problem.loss_code, rng
        self.all_rows = np.arange(n_samples)
        n_threads = min(settings.n_threads, n_samples)
        self.sync_every = settings.sync_every if n_threads > 1 else 0
        self.bounds = np.linspace(0, n_samples, n_threads + 1).astype(np.int64)
        self.pool = ThreadPoolExecutor(n_threads - 1) if n_threads > 1 else None
        if self.pool is not None:
            self.hot = hot_features(epoch_matrix, n_samples)
        # Shrinking is a sequential strategy: GPU epochs, and epochs on several threads,
        # visit every row (per-thread shrinking, each thread on a fixed range of rows,
        # took 10–20x the epochs of one thread on the hinge of breast cancer).
        self.shrinking = None
        if problem.loss in _BOX_DUALS and kernels is cpu and n_threads == 1:
            self.shrinking = _Shrinking.start(n_samples)

    def _ranges(self):
        return list(zip(self.bounds[:-1].tolist(), self.bounds[1:].tolist()))

    def _map(self, function, jobs):
        """``function(*job)`` for every job, the first in this thread, in job order."""
        first, *rest = jobs
        futures = [self.pool.submit(function, *job) for job in rest]
        return [function(*first), *(future.result() for future in futures)]

    def run(self, dual_coef, coef, alpha_n, row_sq_norms, intercept, rho):
        """One epoch on every thread; returns max |Δa_i|, whether every thread's rows are
        settled, and Σ a_i after it."""
        dual_sum = np.array([weighted_dual(dual_coef, self.weights).sum()])
        if self.pool is None:
            max_delta, settled = self._epoch(
                dual_coef, coef, alpha_n, row_sq_norms, intercept, rho, dual_sum
            )
            return max_delta, settled, dual_sum[0]
        # Σ a_i enters the steps as ρΣa (the intercept's multiplier). A thread that saw
        # only its own changes would correct all of Σa, and k threads k times over (the
        # multiplier then diverges); one scalar written by every thread at every step
        # would bounce between the cores. Each thread publishes its own changes every
        # PUBLISH visits and reads the others' (sdca_threads.sdca_thread_epoch).
        share = _order_by_shares(self.all_rows, self.rng)
        slots = np.zeros((len(self.bounds) - 1, sdca_threads.SLOT))
        m, weights = self.epoch_matrix, self.weights
        unit = np.ones(0) if weights is None else weights

        common = (m.data, m.indices, m.indptr, m.dense, m.n_minor, self.y, dual_coef, coef)
        step = (
            self.loss_code,
            alpha_n,
            row_sq_norms,
            unit,
            intercept,
            rho,
            float(dual_sum[0]),
            slots,
        )
        if m.dense:  # a private copy of w per thread, merged every MERGE_DENSE visits
            copies = np.empty((2 * (len(self.bounds) - 1), len(coef)))

            def thread(k, lo, hi):
                return sdca_threads.sdca_thread_epoch_local(
                    *common, share(lo, hi), *step, k, MERGE_DENSE, copies[2 * k], copies[2 * k + 1]
                )
        else:

            def thread(k, lo, hi):
                return sdca_threads.sdca_thread_epoch(
                    *common, share(lo, hi), *step, k, PUBLISH, self.hot
                )

        jobs = [(k, lo, hi) for k, (lo, hi) in enumerate(self._ranges())]
        max_delta = max(self._map(thread, jobs))
        # exact: each a_i has one writer
        return max_delta, False, weighted_dual(dual_coef, self.weights).sum()

    def _epoch(self, dual_coef, coef, alpha_n, row_sq_norms, *shift):
        """(max |Δa_i|, settled) of the epoch on this thread; ``shift`` = (b, ρ, Σa)."""
        if self.shrinking is not None:
            args = (self.y, dual_coef, coef, self.loss_code, alpha_n, row_sq_norms, *shift)
            return self.shrinking.epoch(self.matrix, self.rng, self.weights, *args)
        order = _order_by_shares(self.all_rows, self.rng)(0, len(self.all_rows))
        args = (self.y, dual_coef, coef, order, self.loss_code, alpha_n, row_sq_norms, self.weights)
        return sdca_epoch(self.kernels.sdca_epoch, self.epoch_matrix, *args, *shift), False

    def resync(self, epoch, certify, dual_coef, coef, alpha_n):
        """With several threads: w = Xᵀa/(αn) when a certificate or a sync is due (then
        returned; the shared w takes it unless the run is wild); else None."""
        if self.pool is None:
            return None
        synced = self.sync_every > 0 and (certify or epoch % self.sync_every == 0)
        if not (certify or synced):
            return None

        dual = weighted_dual(dual_coef, self.weights)

        def scatter(lo, hi):
            return self.matrix.lines(lo, hi).scatter(dual[lo:hi])

        exact = np.zeros_like(coef)
        for part in self._map(scatter, self._ranges()):  # in row order, whatever the timing
            exact += part
        exact /= alpha_n
        if synced:
            coef[:] = exact
        return exact

    def close(self):
        if self.pool is not None:
            self.pool.shutdown()
