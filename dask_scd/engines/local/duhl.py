"""DuHL: coordinate descent when only part of X fits in fast memory (the DuHL paper,
Algorithm 2).

Fast memory (a RAM budget over a zarr grid, a GPU over host RAM) holds a few chunks of
lines of X: columns for the primal problems (lasso, elastic net, any smooth loss), rows
for the dual of the hinge SVM. Each round:

1. choose the chunks to hold from the *gap memory* z (one entry per line, the line's
   duality gap when last seen) by a residency policy — DuHL takes the chunks with the
   largest summed z (eq. 13) — and swap in what is missing (bytes counted by the tier);
2. the fast side solves on the resident lines: ``local_epochs`` epochs of the coordinate
   kernel restricted to them (CPU, or CUDA with ``Options.device == "gpu"``), given the
   shared vector (the margins Xθ + b in the primal, w = Xᵀa/(αn) in the dual), then
   refreshes z on its own lines;
3. meanwhile the slow side refreshes z for randomly sampled lines from the shared vector
   as it was when the round started (stale by design: the selection tolerates it).

The certificate (a full pass on the slow side) decides when to stop. Lines whose gap
is zero (a lasso coefficient that stays at 0, an SVM example well outside the margin)
drop out of the resident set, so fast memory stays on what still moves the objective
and swaps die out, where sequential blocks reload all of X every pass.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.engines.base import Options, Run, Trace
from dask_scd.engines.certificates import (
    dual_certificate,
    exact_dual_certificate,
    margins_dual_point,
    primal_certificate,
)
from dask_scd.engines.local.epochs import check_cpu_weights, scd_epoch, sdca_epoch
from dask_scd.engines.local.sdca import PENALTY_SCALE, cold_start, weighted_dual
from dask_scd.kernels import device
from dask_scd.runtime import strategies
from dask_scd.runtime.tiers import DeviceMemory, GridStore, HostMemory, MatrixStore, SlowStore, Tier

# Lines per chunk by default: about this many chunks (smaller chunks sharpen the choice;
# each costs a little bookkeeping per round).
_DEFAULT_CHUNKS = 256


def fit_duhl(data: InMemory, problem: obj.Problem, options: Options) -> Run:
    """DuHL on in-memory X: the slow side is the matrix itself, fast memory a copy of a
    budget's worth of its chunks, in RAM or, with ``options.device == "gpu"``, in device
    memory, where the CUDA epoch kernels (TPA-SCD) solve on it.

    Engine options: :class:`~dask_scd.engines.options.DuHLOptions` (``local_epochs`` is θ
    of the paper).

    With sample weights v (``data.weights``, mean 1) the example i's loss is v_i·ℓ_i: the
    primal epochs are the weighted coordinate steps
    (:func:`dask_scd.kernels.cpu.scd_weighted_epoch`), the dual ones SDCA's weighted
    steps on u = a/v (:func:`dask_scd.kernels.cpu.sdca_weighted_epoch`), and every gap
    is the weighted problem's; on the CPU.
    """
    check_cpu_weights(data.weights, options.device, "duhl")
    axis = _axis(problem)
    n_lines = data.X.shape[1] if axis == "columns" else data.X.shape[0]
    chunk_size = options.engine.chunk_size or max(1, -(-n_lines // _DEFAULT_CHUNKS))
    store = MatrixStore(data.X, axis, chunk_size)
    return _run(store, data.y, problem, options, data.weights)


def fit_grid(source, problem: obj.Problem, options: Options) -> Run:
    """DuHL with host RAM over a zarr grid on disk (``source``: a
    :class:`~dask_scd.data.sources.GridSource`): a chunk is a column block of the grid
    (primal) or a row chunk (dual), so ``chunk_size`` does not apply; coefficients come
    back in the original feature order. Labels of a classifier map to ±1 in sorted order.
    Every read the slow side makes (gap refreshes, certificates) is counted in
    ``extras["slow_bytes_read"]``. The source's sample weights (the fit's, else the ones
    the grid stores) weigh the losses, as in :func:`fit_duhl`."""
    grid, weights = source.grid, source.unit_weights()
    check_cpu_weights(weights, options.device, "duhl")
    axis = _axis(problem)
    store = GridStore(grid, axis)
    y = store.labels()
    if problem.loss in obj.CLASSIFICATION_LOSSES:
        values = np.unique(y)
        if len(values) != 2:
            raise ValueError(
                f"loss={problem.loss!r} needs two classes in the grid's labels, got {len(values)}"
            )
        y = np.where(y == values[1], 1.0, -1.0)
    run = _run(store, y, problem, options, weights)
    run.coef = grid.to_original_order(run.coef)
    return run


def _axis(problem) -> str:
    if problem.loss == "hinge":
        if problem.l1 > 0:
            raise ValueError(
                "solver='duhl' solves the hinge in the dual, which needs an L2 "
                "penalty; use loss='squared_hinge' for an L1 term"
            )
        return "rows"
    return "columns"


def _run(store: SlowStore, y, problem, options: Options, sample_weight=None) -> Run:
    settings = options.engine
    budget = settings.memory_budget
    if budget is None:
        budget = max(int(store.sizes.sum()) // 4, int(store.sizes.max()))
    fast = DeviceMemory() if options.device == "gpu" else HostMemory()
    tier = Tier(store, fast, int(budget))
    weights = None
    if settings.residency == "importance":  # a pass over X: only when it is needed
        weights = np.bincount(
            store.chunk_of_line, weights=store.sq_norms(), minlength=store.n_chunks
        )
    policy = strategies.residency(settings.residency, weights)
    solver = (_Primal if store.axis == "columns" else _Dual)(store, y, problem, sample_weight)
    return _Rounds(tier, solver, policy, options).run()


class _Rounds:
    """The loop of Algorithm 2, the same for the primal and the dual ``solver``."""

    def __init__(self, tier: Tier, solver, policy, options: Options):
        self.tier, self.solver, self.policy = tier, solver, policy
        self.options, self.settings = options, options.engine
        fields = ("round", "relative_gap", "swaps", "bytes_moved", "resident_lines", "seconds")
        self.rounds = {name: [] for name in fields}

    def run(self) -> Run:
        tier, solver, rng = self.tier, self.solver, self.options.rng
        store, every = tier.slow, self.settings.certify_every
        trace = Trace(self.options.progress, self.options.callback)
        cert = solver.certificate()
        z = solver.certified_gaps(cert)
        n_refresh = round(self.settings.gap_refresh * store.n_lines)
        chunk_of_line = store.chunk_of_line
        epoch = 0
        pool = ThreadPoolExecutor(1) if store.concurrent and n_refresh else None
        try:
            while (
                cert.relative_gap > self.options.tol
                and epoch < self.options.max_iter
                and not trace.stopped
            ):
                epoch += 1
                certify = epoch % every == 0 or epoch == self.options.max_iter
                scores = np.bincount(chunk_of_line, weights=z, minlength=store.n_chunks)
                chosen = self.policy.choose(store.sizes, tier.budget, scores, rng)
                loads = tier.make_resident(chosen)
                # The slow side samples while the fast side solves, from the shared vector
                # as the round found it; a certified round refreshes every line instead.
                sample = store.sample_lines(rng, n_refresh) if n_refresh and not certify else None
                refresh = None
                if sample is not None:
                    snapshot = solver.snapshot()
                    if pool is not None:
                        refresh = pool.submit(solver.gaps, snapshot, sample, store)
                matrix, lines = tier.matrix()
                solver.solve(matrix, tier.epoch_matrix(), lines, self.settings.local_epochs, rng)
                if sample is not None:
                    z[sample] = (
                        refresh.result()
                        if refresh is not None
                        else solver.gaps(snapshot, sample, store)
                    )
                z[lines] = solver.resident_gaps(matrix, lines)
                if certify:
                    cert = solver.certificate()
                    z = solver.certified_gaps(cert)
                    trace.record(epoch, cert.relative_gap, cert.primal)
                self._record(epoch, cert if certify else None, loads, len(lines), trace.seconds())
        finally:
            if pool is not None:
                pool.shutdown()
        coef, intercept, cert = solver.final()
        extras = {**tier.counts(), "rounds": self.rounds}
        return trace.ended(Run(coef, intercept, cert, epoch, trace.history, extras))

    def _record(self, epoch, cert, loads, resident_lines, seconds):
        r = self.rounds
        r["round"].append(epoch)
        r["relative_gap"].append(float(cert.relative_gap) if cert is not None else np.nan)
        r["swaps"].append(int(loads))
        r["bytes_moved"].append(int(self.tier.bytes_moved))
        r["resident_lines"].append(int(resident_lines))
        r["seconds"].append(float(seconds))


# ----------------------------------------------------------------------------- primal


class _Primal:
    """Lines are columns; the shared vector is the margins ŷ = Xθ + b. ``weights``: the
    sample weights v (mean 1) or None."""

    def __init__(self, store: SlowStore, y, problem, weights=None):
        self.store, self.y, self.problem = store, np.asarray(y, dtype=np.float64), problem
        self.weights = weights
        self.coef = np.zeros(store.n_lines)
        self.intercept = np.array([obj.zero_intercept(problem, self.y, weights)])
        self.margins = np.full(len(y), self.intercept[0])

    def certificate(self):
        return primal_certificate(
            self.problem, self.store.dot, self.y, self.coef, self.margins, self.weights
        )

    def certified_gaps(self, cert) -> np.ndarray:
        # The Lipschitzed gaps, not the rescaled lasso certificate's: at θ = 0 those are
        # all zero, blind to the columns that will enter the support.
        return self._gaps(self.margins, self.coef, self.coef, lambda a: cert.correlation)

    def snapshot(self):
        return self.margins.copy(), self.coef.copy()

    def _gaps(self, margins, coef, coef_lines, correlation_of):
        """gap_j of the columns whose θ_j are ``coef_lines``, at these margins, given
        ``correlation_of(a/n)``: their x_jᵀa/n for the dual point a of the margins."""
        problem, y = self.problem, self.y
        sums, a = margins_dual_point(problem, y, margins, self.weights)
        primal = sums["loss"] / len(y) + obj.penalty_value(problem, coef)
        bound = obj.lipschitz_bound(problem, primal)
        correlation = correlation_of(a / len(y))
        gaps = (
            obj.penalty_terms(problem, coef_lines)
            + obj.penalty_conjugate(problem, correlation, bound)
            - correlation * coef_lines
        )
        return np.maximum(gaps, 0.0)

    def gaps(self, snapshot, lines, store) -> np.ndarray:
        """The slow side: gap_j for the sampled columns at the snapshot's margins."""
        margins, coef = snapshot
        return self._gaps(margins, coef, coef[lines], lambda a: store.line_dots(lines, a))

    def resident_gaps(self, matrix, lines) -> np.ndarray:
        """The fast side after its solve: gap_j of its own columns, at the new margins."""
        return self._gaps(self.margins, self.coef, self.coef[lines], matrix.dot)

    def solve(self, matrix, epoch_matrix, lines, epochs, rng):
        """``epochs`` epochs of primal SCD on the resident columns (and the intercept),
        reading ``epoch_matrix`` (``matrix`` or its device copy)."""
        p, m = self.problem, epoch_matrix
        kernels = device.kernels_for(m.data)
        theta = self.coef[lines]  # a copy: the kernel's coefficient vector
        sq_norms = matrix.sq_norms(self.weights)
        cubes = matrix.cube_sums(self.weights) if p.loss == "logistic" else np.zeros(0)
        k = len(lines) + int(p.fit_intercept)
        for _ in range(epochs):
            order = rng.permutation(k)
            scd_epoch(
                kernels.scd_epoch,
                m,
                self.y,
                self.margins,
                theta,
                self.intercept,
                order,
                p,
                p.l2,
                sq_norms,
                cubes,
                self.weights,
            )
        self.coef[lines] = theta

    def final(self):
        # Certify on margins recomputed from scratch, free of accumulated rounding.
        self.margins = self.store.scatter(self.coef) + self.intercept[0]
        cert = self.certificate()
        return self.coef, float(self.intercept[0]), cert


# ------------------------------------------------------------------------------- dual


class _Dual:
    """Lines are rows (examples); the shared vector is w = Xᵀa/(αn). The intercept's dual
    constraint Σa = 0 is kept by the method of multipliers, as in SDCA
    (:func:`dask_scd.engines.local.sdca.fit_sdca`). With sample ``weights`` v, ``dual_coef``
    holds u = a/v in the unweighted domain, as SDCA's weighted epochs move it."""

    def __init__(self, store: SlowStore, y, problem, weights=None):
        self.store, self.y, self.problem = store, np.asarray(y, dtype=np.float64), problem
        self.weights = weights
        n = len(y)
        self.alpha_n = problem.alpha * n
        self.row_sq_norms = store.sq_norms()
        self.rho = (
            PENALTY_SCALE * float(self.row_sq_norms.mean()) / self.alpha_n
            if problem.fit_intercept
            else 0.0
        )
        self.intercept, self.dual_coef = cold_start(problem, self.y, weights)
        self.coef = store.scatter(self.dual()) / self.alpha_n

    def dual(self, dual_coef=None):
        """The dual point a = v∘u (of ``dual_coef``, default all rows')."""
        return weighted_dual(self.dual_coef if dual_coef is None else dual_coef, self.weights)

    def certificate(self):
        cert, _, _ = dual_certificate(
            self.problem, self.store, self.y, self.dual(), self.coef, self.intercept, self.weights
        )
        return cert

    def certified_gaps(self, cert) -> np.ndarray:
        # The gaps at the iterate's own intercept (a pass over X), not the certificate's:
        # that one is re-solved for w, and at w ≈ 0 it puts every row of the majority
        # class outside the margin, gap 0, so DuHL never chose them and the multiplier
        # b ← b + ρΣa, fed by the other class alone, left a at 0 (relative gap 1).
        margins = self.store.dot(self.coef) + self.intercept
        return self._row_gaps(np.arange(len(self.y)), margins, self.dual_coef)

    def snapshot(self):
        return self.coef.copy(), self.intercept, self.dual_coef.copy()

    def _row_gaps(self, rows, margins, dual_coef_rows):
        """gap_i of the rows, ``dual_coef_rows`` their u (a without weights)."""
        p, y = self.problem, self.y[rows]
        v = None if self.weights is None else self.weights[rows]
        a = weighted_dual(dual_coef_rows, v)
        losses = obj.loss_value(p.loss, y, margins)
        if v is not None:
            losses = losses * v
        gaps = (losses - obj.dual_loss(p.loss, y, a, v) + a * margins) / len(self.y)
        return np.maximum(gaps, 0.0)

    def gaps(self, snapshot, lines, store) -> np.ndarray:
        coef, intercept, dual_coef = snapshot
        margins = store.line_dots(lines, coef) + intercept
        return self._row_gaps(lines, margins, dual_coef[lines])

    def resident_gaps(self, matrix, lines) -> np.ndarray:
        margins = matrix.dot(self.coef) + self.intercept
        return self._row_gaps(lines, margins, self.dual_coef[lines])

    def solve(self, matrix, epoch_matrix, lines, epochs, rng):
        """``epochs`` SDCA epochs on the resident rows, reading ``epoch_matrix``
        (``matrix`` or its device copy); b ← b + ρΣa after each."""
        p, m = self.problem, epoch_matrix
        kernels = device.kernels_for(m.data)
        local = self.dual_coef[lines]
        sq_norms = self.row_sq_norms[lines]
        y = self.y[lines]
        # B rows step at once on a GPU: ρ/B keeps their joint step on Σa at one ρ's.
        rho = self.rho / device.dual_concurrency(m, len(lines))
        for _ in range(epochs):
            dual_sum = np.array([self.dual().sum()])  # Σa over all rows, carried by the kernel
            order = rng.permutation(len(lines))
            weights = None if self.weights is None else self.weights[lines]
            sdca_epoch(
                kernels.sdca_epoch,
                m,
                y,
                local,
                self.coef,
                order,
                p.loss_code,
                self.alpha_n,
                sq_norms,
                weights,
                self.intercept,
                rho,
                dual_sum,
            )
            self.dual_coef[lines] = local
            self.intercept += rho * dual_sum[0]

    def final(self):
        return exact_dual_certificate(
            self.problem, self.store, self.y, self.dual(), self.intercept, self.weights
        )
