"""CoCoA: distributed coordinate descent with adaptive aggregation (``solver="cocoa"``).

The TPA-SCD paper's §IV (Algorithms 3 and 4). X is split into K parts by feature (the
primal: each part owns some columns, the margins ŷ = Xθ + b are shared) or by example
(the dual: each part owns some rows and their dual values, w = Xᵀa/(αn) is shared).
Every round each part runs ``local_epochs`` epochs of its local solver from the shared
vector, the updates are summed in part order, and the iterate moves by γ times the sum
(γ: the exact line minimum, "adaptive"; 1/K, "average"; or 1, "add", with CoCoA+'s safe
local problems σ' = K); then the certificate. Parts of a dask array or a Grid are
assembled once on a worker each from the cells and only the shared vector, the updates
and a few scalars move; in-memory parts are solved here by the same functions: the same
model, bit for bit. Sample weights v travel with the labels. See ``docs/engines/cocoa.md``.
"""

from __future__ import annotations

import dataclasses
import operator

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.cells import WeightedLabels
from dask_scd.data.findings import finding_error
from dask_scd.data.memory import InMemory
from dask_scd.engines.base import Options, Run, Trace
from dask_scd.engines.cocoa import cocoa_ops as ops
from dask_scd.engines.cocoa import cocoa_parts
from dask_scd.engines.local.sdca import PENALTY_SCALE
from dask_scd.runtime.cluster import ClusterRuntime, fit_client
from dask_scd.runtime.passes import sum_partials

IN_MEMORY_PARTITIONS = 4


def fit_cocoa(data, problem: obj.Problem, options: Options) -> Run:
    """CoCoA on in-memory X (:class:`~dask_scd.data.memory.InMemory`) or on a dask array or
    a Grid (a :class:`~dask_scd.data.sources.Source`).

    Engine options: :class:`~dask_scd.engines.options.CoCoAOptions`. K =
    ``n_partitions`` defaults to 4 in memory, to the number of dask workers for dask
    input (at most its column blocks, or row chunks for the dual), whose blocks (row
    chunks) are then grouped into K contiguous runs.

    With sample weights (``data.weights`` in memory, a Source's ``sample_weight``) the
    objective is the weighted one, (1/n) Σ v_i ℓ_i + g(θ) with v of mean 1: weighted SCD
    epochs by feature, SDCA's weighted epochs on u = a/v by example, and γ and the
    certificate of the weighted problem (:mod:`~dask_scd.engines.cocoa.cocoa_ops`).

    The Run's extras hold ``rounds`` (round, step γ, relative gap per round),
    ``n_partitions``, ``split`` and ``aggregation``.
    """
    settings = _with_split(options.engine, problem)
    if options.device == "gpu":
        raise NotImplementedError(
            "solver='cocoa' runs its local solvers on the CPU; "
            "device='gpu' is not implemented for it"
        )
    if isinstance(data, InMemory):
        return _run(_Here(), _memory_parts(data, problem, settings), problem, options, settings)
    with fit_client(settings.client) as client:
        here = _Cluster(client)
        run = _run(here, _dask_parts(here, data, problem, settings), problem, options, settings)
    coef = np.empty(data.n_features)
    coef[data.feature_order] = run.coef
    run.coef = coef
    return run


def _with_split(engine, problem):
    """CoCoA's options (:class:`~dask_scd.engines.options.CoCoAOptions`) with the split
    that runs ``problem``."""
    split = engine.split
    if split == "auto":
        split = "examples" if problem.loss == "hinge" and problem.l1 == 0.0 else "features"
    if split == "examples" and problem.l1 > 0.0:
        raise ValueError(
            "split='examples' solves the dual, which needs an L2 penalty; use "
            "split='features' for an L1 term"
        )
    if split == "features" and problem.loss == "hinge":
        raise ValueError(
            "loss='hinge' is solved by example (split='examples'), whose dual "
            "needs an L2 penalty; or use loss='squared_hinge'"
        )
    return dataclasses.replace(engine, split=split)


# ------------------------------------------------------------------ where tasks run


class _Here:
    """Parts in this process: a task runs when it is submitted."""

    def submit(self, func, *args, part=None):
        return func(*args)

    def each(self, func, per_part: tuple, *shared) -> list:
        """Part k's task ``func(*(values[k] for values in per_part), *shared)``, for
        every part k."""
        return [self.submit(func, *own, *shared, part=k) for k, own in enumerate(zip(*per_part))]

    def gather(self, values):
        return values


class _Cluster(_Here):
    """Parts on a dask cluster: part k's tasks ask for worker k mod W (any worker may
    take them, e.g. after a loss), keyed cheaply by the runtime."""

    def __init__(self, client):
        self.runtime = ClusterRuntime(client, 1, pin=False)
        self.workers = sorted(client.scheduler_info()["workers"])

    def submit(self, func, *args, part=None):
        placement = {}
        if part is not None and self.workers:
            placement = {
                "workers": [self.workers[part % len(self.workers)]],
                "allow_other_workers": True,
            }
        return self.runtime.submit(func, *args, **placement)

    def gather(self, futures):
        return self.runtime.gather(futures)


# ------------------------------------------------------------------------ the parts


def _memory_parts(data: InMemory, problem, settings) -> dict:
    """K slices of in-memory X (contiguous columns or rows)."""
    X, y, weights = data.X, data.y, data.weights
    by_features = settings.split == "features"
    n_lines = X.shape[1] if by_features else X.shape[0]
    K = settings.n_partitions or min(IN_MEMORY_PARTITIONS, n_lines)
    if K > n_lines:
        what = "features" if by_features else "examples"
        raise ValueError(f"n_partitions={K} is more than the {n_lines} {what} to split")
    bounds = np.linspace(0, n_lines, K + 1).astype(int)
    logistic = problem.loss == "logistic"
    if by_features:
        Xc = X.tocsc() if hasattr(X, "tocsc") else X
        parts = [
            cocoa_parts.make_part(Xc[:, lo:hi], "columns", logistic=logistic, weights=weights)
            for lo, hi in zip(bounds[:-1], bounds[1:])
        ]
    else:
        Xr = X.tocsr() if hasattr(X, "tocsr") else X
        parts = [
            cocoa_parts.make_part(
                Xr[lo:hi], "rows", y[lo:hi], weights=None if weights is None else weights[lo:hi]
            )
            for lo, hi in zip(bounds[:-1], bounds[1:])
        ]
    sizes = np.diff(bounds)
    if weights is not None:  # what the tasks of every row read: the labels with their v
        y = WeightedLabels(y, weights)
    return {
        "parts": parts,
        "sizes": sizes,
        "y": y,
        "n_samples": X.shape[0],
        "n_features": X.shape[1],
        # Σ_i ‖x_i‖² (= Σ_j ‖x_j‖²) from the parts' line norms (Σ_i v_i ‖x_i‖² by feature
        # with weights; only the dual reads it)
        "n_row_sq": float(sum(float(p.sq_norms.sum()) for p in parts)),
    }


def _dask_parts(here: _Cluster, source, problem, settings) -> dict:
    """K parts of a dask array or Grid, each assembled from its cells on a worker: runs
    of column blocks (by feature) or of row chunks (by example). With sample weights the
    labels of every row chunk carry them (:meth:`~dask_scd.data.sources.Source.connect`)
    and a part by feature reads them all, for its weighted column norms."""
    cells, labels = source.connect(here.runtime.client)
    by_features = settings.split == "features"
    units = len(source.blocks) if by_features else source.n_row_chunks
    what = "column blocks" if by_features else "row chunks"
    K = settings.n_partitions or max(1, min(len(here.workers), units))
    if K > units:
        raise ValueError(
            f"n_partitions={K} is more than the {units} {what} of X: the parts "
            f"are runs of its {what}; rechunk X (or write the grid) finer"
        )
    groups = np.array_split(np.arange(units), K)
    R = source.n_row_chunks
    logistic = problem.loss == "logistic"
    parts = []
    for k, group in enumerate(groups):
        where = f"part {k} ({what} {group[0]}–{group[-1]})"
        if by_features:
            part_cells = [[cells[r][b] for b in group] for r in range(R)]
            args = ("columns", where, labels if source.weighted else None, logistic)
        else:
            part_cells = [list(cells[r]) for r in group]
            args = ("rows", where, [labels[r] for r in group], False)
        parts.append(here.submit(cocoa_parts.assemble_part, part_cells, *args, part=k))
    summaries = here.gather(here.each(cocoa_parts.part_summary, (parts,)))
    for group, summary in zip(groups, summaries):
        if "finding" in summary:  # (i, j) in the part's cells: its row chunk and block
            i, j = summary["cell"]
            r, b = (i, group[j]) if by_features else (group[i], j)
            raise finding_error(summary["finding"], r, b, source.row_bounds, source.blocks)
    sizes = np.array([s["lines"] for s in summaries])
    y = here.submit(cocoa_parts.join_labels, *labels)
    return {
        "parts": parts,
        "sizes": sizes,
        "y": y,
        "n_samples": source.n_samples,
        "n_features": source.n_features,
        "n_row_sq": float(sum(s["sq_norm_sum"] for s in summaries)),
    }


# ------------------------------------------------------------------------- the loop


def _run(here, parts: dict, problem, options: Options, settings) -> Run:
    rounds = {"round": [], "step": [], "relative_gap": [], "seconds": []}
    loop = _Primal if settings.split == "features" else _Dual
    solver = loop(here, parts, problem, settings)
    trace = Trace(options.progress, options.callback)
    cert = solver.certify()
    epoch = 0
    while cert.relative_gap > options.tol and epoch < options.max_iter and not trace.stopped:
        epoch += 1
        gamma = solver.round(options.rng)
        cert = solver.certify()
        seconds = trace.record(epoch, cert.relative_gap, cert.primal)
        rounds["round"].append(epoch)
        rounds["step"].append(gamma)
        rounds["relative_gap"].append(float(cert.relative_gap))
        rounds["seconds"].append(float(seconds))
    coef, intercept = solver.model()
    extras = {
        "rounds": rounds,
        "n_partitions": solver.K,
        "split": settings.split,
        "aggregation": settings.aggregation,
    }
    return trace.ended(Run(coef, intercept, cert, epoch, trace.history, extras))


class _Loop:
    """What both splits hold: the parts, K, the intercept (the best one for θ = 0) and σ
    (CoCoA+'s safe local problems under ``aggregation="add"``)."""

    def __init__(self, here, parts: dict, problem, settings):
        self.here, self.problem, self.settings = here, problem, settings
        self.parts, self.y = parts["parts"], parts["y"]
        self.K = len(self.parts)
        self.intercept = 0.0
        if problem.fit_intercept:
            self.intercept = here.gather(here.submit(ops.initial_intercept, problem, self.y))
        self.sigma = float(self.K) if settings.aggregation == "add" else 1.0


class _Primal(_Loop):
    """By feature: part k owns the coefficients θ_k of its columns (part 0 also the
    intercept); the client holds θ and b, the margins live where they were computed."""

    def __init__(self, here, parts: dict, problem, settings):
        super().__init__(here, parts, problem, settings)
        bounds = np.concatenate([[0], np.cumsum(parts["sizes"])]).astype(int)
        self.slices = [slice(bounds[k], bounds[k + 1]) for k in range(self.K)]
        self.coef = np.zeros(parts["n_features"])
        self.margins = None

    def certify(self) -> obj.Certificate:
        """Fresh margins from (θ, b), then the certificate: one pass over each part for
        X_kθ_k and one for X_kᵀa."""
        here, problem = self.here, self.problem
        shares = here.each(ops.part_matvec, (self.parts, [self.coef[s] for s in self.slices]))
        point = here.submit(ops.primal_point, problem, self.y, self.intercept, *shares)
        dual_point = here.submit(operator.getitem, point, "a")
        correlations = here.each(ops.part_correlation, (self.parts,), dual_point)
        self.margins = here.submit(operator.getitem, point, "margins")
        return here.gather(
            here.submit(ops.primal_certificate, problem, self.y, self.coef, point, *correlations)
        )

    def round(self, rng) -> float:
        here, problem, settings = self.here, self.problem, self.settings
        seeds = rng.integers(2**63, size=self.K)
        updates = [
            here.submit(
                ops.primal_solve,
                p,
                self.y,
                self.margins,
                self.coef[s],
                self.intercept,
                problem,
                settings.local_epochs,
                int(seed),
                k == 0 and problem.fit_intercept,
                self.sigma,
                part=k,
            )
            for k, (p, s, seed) in enumerate(zip(self.parts, self.slices, seeds))
        ]
        direction = here.submit(ops.primal_direction, *updates)
        step = here.gather(
            here.submit(
                ops.primal_step,
                problem,
                self.y,
                self.margins,
                self.coef,
                direction,
                settings.aggregation,
                self.K,
            )
        )
        gamma = step["gamma"]
        self.coef = self.coef + gamma * step["coef"]
        self.intercept = self.intercept + gamma * step["intercept"]
        return gamma

    def model(self):
        return self.coef, float(self.intercept)


class _Dual(_Loop):
    """By example: part k owns the dual values a_k of its rows (they stay on its worker;
    u_k = a_k/v with sample weights); the client holds w and the intercept's multiplier b."""

    def __init__(self, here, parts: dict, problem, settings):
        super().__init__(here, parts, problem, settings)
        n = parts["n_samples"]
        self.n_samples, self.alpha_n = n, problem.alpha * n
        self.rho = 0.0
        # The intercept: each round solves the dual with b fixed at the best intercept of
        # the last certificate's w (b is a primal coordinate minimized exactly; then Σa → 0
        # at the optimum). The hinge's best b jumps between the kinks of a piecewise linear
        # function, and it keeps SDCA's method of multipliers instead (b ← b + ρΣa, steps
        # on the augmented Lagrangian). Ridge on 300 × 20 Gaussian rows, K = 4, to 1e-9:
        # 167 adaptive rounds with the best b against 523 with the multiplier; the hinge
        # to 1e-6: 1104 with the multiplier, > 2000 with the best b.
        self.multiplier = problem.fit_intercept and problem.loss == "hinge"
        if self.multiplier:
            self.rho = PENALTY_SCALE * parts["n_row_sq"] / n / self.alpha_n
        self.duals = here.each(ops.dual_start, (self.parts,), problem, self.intercept)
        self.labels = here.each(ops.part_labels, (self.parts,))
        scatters = here.each(ops.part_scatter, (self.parts, self.duals), 1.0 / self.alpha_n)
        self.coef = here.gather(here.submit(sum_partials, *scatters))
        sums = here.each(ops.part_dual_sum, (self.parts, self.duals))
        self.total = here.gather(here.submit(ops.dual_total, *sums))
        self.certified = None

    def certify(self) -> obj.Certificate:
        """The SDCA certificate of a projected onto Σa = 0, with w and b recomputed for it
        (two passes over each part)."""
        here, problem, K = self.here, self.problem, self.K
        per_part = (self.parts, self.duals)
        scales = here.submit(ops.dual_projection, problem, *here.each(ops.dual_sign_sums, per_part))
        scatters = here.each(ops.part_projected_scatter, per_part, scales, self.alpha_n)
        coef = here.submit(sum_partials, *scatters)
        margins = here.each(ops.part_margins, (self.parts,), coef)
        result = here.gather(
            here.submit(
                ops.dual_certificate,
                problem,
                coef,
                self.intercept,
                scales,
                K,
                *self.labels,
                *self.duals,
                *margins,
            )
        )
        self.certified = result
        if not self.multiplier:
            self.intercept = result["intercept"]
        return result["certificate"]

    def round(self, rng) -> float:
        here, problem, settings = self.here, self.problem, self.settings
        seeds = rng.integers(2**63, size=self.K)
        updates = [
            here.submit(
                ops.dual_solve,
                p,
                a,
                self.coef,
                self.intercept,
                self.rho,
                self.total,
                problem,
                self.alpha_n,
                settings.local_epochs,
                int(seed),
                self.sigma,
                part=k,
            )
            for k, (p, a, seed) in enumerate(zip(self.parts, self.duals, seeds))
        ]
        direction = here.submit(ops.dual_direction, *here.each(ops.dual_summary, (updates,)))
        step = here.submit(
            ops.dual_step,
            problem,
            self.n_samples,
            self.coef,
            self.intercept,
            self.rho,
            direction,
            settings.aggregation,
            self.K,
        )
        self.duals = here.each(ops.dual_apply, (self.duals, updates), step)
        step = here.gather(step)
        gamma = step["gamma"]
        self.coef = self.coef + gamma * step["coef"]
        self.total = step["dual_total"]
        self.intercept += self.rho * self.total  # the multiplier: b ← b + ρΣa
        return gamma

    def model(self):
        """w and b of the last certificate (a projected onto Σa = 0)."""
        return np.asarray(self.certified["coef"]), float(self.certified["intercept"])
