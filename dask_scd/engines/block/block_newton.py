"""Proximal Newton over dask: the block engine's outer loop when the features are few.

Every row chunk gives, in one read of its cells, its share of the gradient, of the
curvature Xᵀ diag(ℓ''(ŷ)) X / n (with the intercept's) and of the certificate of the
current model (margins made afresh from (θ, b)); one task solves the local quadratic
model (the intercept by its Schur complement; ridge by Cholesky, an L1 term by coordinate
descent on H and an exact solve on its support), and a second read line-searches along
XΔ (not for the squared loss, whose model is exact). One wait per iteration: logistic
regression converges in 5–20 iterations at any regularization, where coordinate descent
takes hundreds of passes at the regularization users choose. It runs on the block
engine's runtime (homes, keyed submits, fixed-order sums, checkpoints): the same model on
any workers, a lost worker recomputed. See ``docs/engines/block_newton.md``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dask_scd import objectives as obj
from dask_scd.data.cells import DeviceCellView, cell_view, labels, row_weights
from dask_scd.data.sources import Source
from dask_scd.engines import cholesky
from dask_scd.engines.base import Options, Run
from dask_scd.engines.block import block_coarse, wide_newton
from dask_scd.engines.block.block_cluster import ClusterBlocks
from dask_scd.engines.block.block_loop import Certified
from dask_scd.engines.certificates import with_values
from dask_scd.kernels import block as block_kernels
from dask_scd.kernels.scalar import ARMIJO, DOUBLINGS, TRIAL_STEPS, best_doubling
from dask_scd.kernels.scalar import penalty as _scalar_penalty
from dask_scd.runtime import passes
from dask_scd.runtime.cluster import fit_client

# Block Newton forms the p × p curvature per row chunk: n·p² flops for dense cells, about
# n·(nnz per row)² for sparse ones. Below these it forms H; above, an L2 problem takes its
# Newton steps by conjugate gradients on curvature products (dask_scd.engines.block.wide_newton)
# and an L1 term goes to block SCD.
MAX_FEATURES = 2048
MAX_ROW_COST = 256**2


def newton_forms_curvature(source) -> bool:
    """Whether block Newton forms the p × p curvature of ``source`` (else products)."""
    n, p = source.n_samples, source.n_features
    per_row = (source.nnz if source.nnz is not None else source.nbytes / 8.0) / max(n, 1)
    return p <= MAX_FEATURES and min(per_row, p) ** 2 <= MAX_ROW_COST


# Rounds of (coordinate descent on H, exact solve on its support) for an L1 model, and
# the sweeps of each (a sweep is O(p²)).
_INNER_ROUNDS = 30
_INNER_SWEEPS = 50

_penalty = _scalar_penalty.py_func  # elementwise on arrays


# ---------------------------------------------------------------- row-chunk tasks


def _row_matrix(cells: list):
    """The row chunk's cells side by side, in grid column order, in float64 (a
    :class:`_DeviceRow` when they are in device memory)."""
    views = [cell_view(cell) for cell in cells]
    if isinstance(views[0], DeviceCellView):
        return _DeviceRow(views)
    parts = []
    for view in views:
        m = view.matrix
        if view.by_columns:
            parts.append(
                sp.csc_matrix((m.data, m.indices, m.indptr), shape=(view.n_rows, view.n_columns))
            )
        else:
            parts.append(m.data.reshape(view.n_rows, view.n_columns))
    if views[0].by_columns:
        return sp.hstack(parts, format="csr", dtype=np.float64)
    return np.hstack(parts).astype(np.float64, copy=False)


class _DeviceRow:
    """A row chunk's device cells side by side: the products :func:`newton_row` and
    :func:`newton_trials` take of the row matrix A (``A @ v``, ``A.T @ u``, and the
    weighted Gram matrix block by block), by the CUDA kernels of the cells, on the host."""

    def __init__(self, views: list):
        self.views = views
        self.offsets = np.cumsum([0] + [view.n_columns for view in views])

    def __matmul__(self, v) -> np.ndarray:
        """A v = Σ_b X_b v_b."""
        out = np.zeros(self.views[0].n_rows)
        for view, lo, hi in zip(self.views, self.offsets[:-1], self.offsets[1:]):
            if np.any(v[lo:hi]):
                out += view.matvec(v[lo:hi])
        return out

    @property
    def T(self) -> "_DeviceRow._Transposed":
        return self._Transposed(self)

    class _Transposed:
        def __init__(self, row):
            self.row = row

        def __matmul__(self, u) -> np.ndarray:
            """Aᵀ u, the blocks' column sums concatenated."""
            return np.concatenate([view.rmatvec(u) for view in self.row.views])

    def weighted_gram(self, weights) -> np.ndarray:
        """Aᵀ diag(weights) A, one kernel per pair of blocks b ≤ c."""
        offsets, views = self.offsets, self.views
        out = np.empty((offsets[-1], offsets[-1]))
        for b, view in enumerate(views):
            for c in range(b, len(views)):
                block = view.gram(weights, None if c == b else views[c])
                out[offsets[b] : offsets[b + 1], offsets[c] : offsets[c + 1]] = block
                out[offsets[c] : offsets[c + 1], offsets[b] : offsets[b + 1]] = block.T
        return out


def newton_row(cells: list, y, state: dict, offsets, problem: obj.Problem):
    """Everything one Newton iteration needs from a row chunk, in one read of its cells.

    Margins ŷ = Xθ + b are computed afresh from ``state`` (no rounding carried between
    iterations, so a resumed fit takes the same steps), then the shares of the gradient
    and the curvature (with the intercept's) and of the certificate of ``state``
    (:func:`dask_scd.runtime.passes.certificate_stats`'s keys: the dual point
    a = −ℓ'(ŷ) split by sign, whose scales are known only after the reduction).

    Returns (statistics, margins).
    """
    v = row_weights(y)
    y = labels(y)
    A = _row_matrix(cells)
    margins = np.asarray(A @ state["coef"]).ravel() + float(state["intercept"])
    d1, d2 = passes.weighted_derivatives(problem.loss_code, y, margins, v)
    pos, neg = np.where(d1 < 0, -d1, 0.0), np.where(d1 > 0, -d1, 0.0)  # a = −ℓ'(ŷ) by sign
    if isinstance(A, _DeviceRow):
        hessian = A.weighted_gram(d2)
    elif sp.issparse(A):
        hessian = np.asarray((A.T @ sp.diags(d2) @ A).todense())
    else:
        hessian = A.T @ (A * d2[:, None])
    xt_pos, xt_neg = np.asarray(A.T @ pos).ravel(), np.asarray(A.T @ neg).ravel()
    stats = {
        "h": hessian,
        "hx": np.asarray(A.T @ d2).ravel(),
        "h0": np.array([d2.sum()]),
        "loss": np.array([obj.weighted_sum(obj.loss_value(problem.loss, y, margins), v)]),
        "pos": np.array([pos.sum()]),
        "neg": np.array([neg.sum()]),
        "xt_pos": xt_pos,
        "xt_neg": xt_neg,
        "margin_pos": np.array([obj.vdot(pos, margins)]),
        "margin_neg": np.array([obj.vdot(neg, margins)]),
    }
    return stats, margins


def newton_trials(cells: list, y, margins, direction: dict, problem: obj.Problem) -> dict:
    """Σ ℓ(ŷ + t·u) − ℓ(ŷ) over the row chunk for each trial step t, u = XΔ + δ
    (:func:`~dask_scd.runtime.passes.newton_line_trials`), and Σ −ℓ*(−a'_i) for the
    model's dual point a' = −(ℓ'(ŷ) + ℓ''(ŷ)·u) (−inf if some a'_i is outside the loss's
    dual domain): see :func:`model_dual_value`."""
    v = row_weights(y)
    y = labels(y)
    u = np.asarray(_row_matrix(cells) @ direction["d_coef"]).ravel() + direction["d_b"]
    d1, d2 = passes.weighted_derivatives(problem.loss_code, y, margins, v)
    dual = obj.dual_loss(problem.loss, y, -(d1 + d2 * u), v).sum()
    return {**passes.newton_line_trials(problem, y, margins, u, v), "model_dual": np.array([dual])}


# ---------------------------------------------------------------- client-side steps


def newton_direction(problem: obj.Problem, n_samples: int, state: dict, total: dict) -> dict:
    """The prox-Newton direction (Δθ, δb) of the summed model at ``state``."""
    terms = wide_newton.model_terms(problem, n_samples, total)
    g, g0, h0, hx, eliminate = terms
    hessian = total["h"] / n_samples
    theta = np.asarray(state["coef"], dtype=np.float64)
    if eliminate:
        # min over δ of the model: δ = −(g0 + hxᵀΔ)/h0; what is left is a model in Δ alone
        # with H − hx hxᵀ/h0 and g − hx g0/h0 (the Schur complement of the intercept).
        hessian = hessian - np.outer(hx, hx) / h0
        g = g - hx * (g0 / h0)
    target = _solve_model(hessian, g, theta, problem.l1, problem.l2)
    pen = _penalty(problem.l1, problem.l2, target) - _penalty(problem.l1, problem.l2, theta)
    return wide_newton.newton_step(problem, state, theta, target - theta, terms, float(np.sum(pen)))


def _solve_model(hessian, g, theta, l1: float, l2: float) -> np.ndarray:
    """argmin_t gᵀ(t−θ) + ½(t−θ)ᵀH(t−θ) + l1‖t‖₁ + l2/2‖t‖².

    Ridge: one Cholesky solve. With an L1 term, coordinate descent finds the signs; on the
    ill-conditioned curvature of real data (one-hot groups, collinear columns) it would
    then crawl, so each round solves the model exactly on the current support and signs
    (a linear system), keeps it when its optimality conditions hold, and otherwise moves
    toward it as far as the signs hold — a descent step of the orthant's quadratic — and
    lets coordinate descent change the support (an active-set method).
    """
    if l1 == 0.0:
        return _solve_ridge(hessian + l2 * np.eye(len(theta)), g + l2 * theta, theta)
    hessian = np.ascontiguousarray(hessian)
    scale = l1 + np.abs(g).max(initial=0.0)
    t = theta.copy()
    for _ in range(_INNER_ROUNDS):
        t = block_kernels.block_newton_qp(
            hessian, g + hessian @ (t - theta), t, l1, l2, _INNER_SWEEPS, 1e-13
        )
        support = np.flatnonzero(t)
        signs = np.sign(t[support])
        refined = np.zeros_like(t)
        if len(support):
            rhs = hessian[support] @ theta - g[support] - l1 * signs
            block = hessian[np.ix_(support, support)] + l2 * np.eye(len(support))
            refined[support] = _solve_ridge(block, -rhs, np.zeros(len(support)))
        slope = g + hessian @ (refined - theta) + l2 * refined
        zeros = np.setdiff1d(np.arange(len(t)), support)
        # A singular support block (a complete one-hot group) may have no exact solution:
        # the least-squares answer must also zero the support's slope.
        solved = np.all(np.abs(slope[support] + l1 * signs) <= 1e-9 * scale)
        flipped = np.sign(refined[support]) != signs
        if solved and not flipped.any() and np.all(np.abs(slope[zeros]) <= l1 * (1 + 1e-9)):
            return refined
        if solved:
            # The orthant's quadratic decreases all the way to ``refined``: go as far as
            # the first coordinate that reaches zero.
            tj, rj = t[support][flipped], refined[support][flipped]
            step = min(1.0, float(np.min(tj / (tj - rj)))) if flipped.any() else 1.0
            moved = t + step * (refined - t)
            moved[support[flipped][np.argmin(tj / (tj - rj))] if flipped.any() else []] = 0.0
            t = moved
    return t


def _solve_ridge(system, rhs, start) -> np.ndarray:
    """start − system⁻¹ rhs (Cholesky; least squares for a singular generalized Hessian)."""
    try:
        return start - cholesky.solve(cholesky.factor(system), rhs)
    except np.linalg.LinAlgError:
        return start - np.linalg.lstsq(system, rhs, rcond=None)[0]


def newton_choose(
    problem: obj.Problem, n_samples: int, slack: float, direction: dict, *partials
) -> dict:
    """The new state: the largest trial step passing Armijo (the full step for squared
    loss), a unit step extended to the best of the doublings where they were tried (as in
    memory, :func:`dask_scd.engines.newton.newton.extrapolate`)."""
    theta, d = direction["coef"], direction["d_coef"]
    step = 1.0
    if partials:
        total = passes.sum_partials(*partials)
        trials = total["trials"] / n_samples
        pen = lambda t: float(np.sum(_penalty(problem.l1, problem.l2, theta + t * d)))  # noqa: E731
        base = pen(0.0)
        accept = [
            trials[k] + pen(t) - base <= ARMIJO * t * direction["model"] + slack
            for k, t in enumerate(TRIAL_STEPS)
        ]
        step = float(TRIAL_STEPS[accept.index(True)]) if any(accept) else 0.0
        if step == 1.0 and "doubled" in total:
            doubled = total["doubled"] / n_samples
            values = (doubled[k] + pen(t) for k, t in enumerate(DOUBLINGS))
            step = best_doubling(trials[0] + pen(1.0), values)
    return {
        "coef": theta + step * d,
        "intercept": direction["intercept"] + step * direction["d_b"],
        "step": step,
    }


# ---------------------------------------------------------------- the engine


def model_dual_value(
    problem: obj.Problem, n_samples: int, total: dict, direction: dict, cert: dict, *partials
) -> float:
    """D(a') for the model's dual point a' = −(ℓ'(ŷ) + ℓ''(ŷ)∘(XΔ + δ)), or −inf.

    The model is solved exactly (Cholesky, or the active-set solve for an L1 term), so
    Xᵀa'/n = −(∇f + HΔ + h_x·δ) comes from the reduced statistics with no pass over the
    grid, and Σa' = −n(g₀ + h_xᵀΔ + h₀δ) = 0 with the intercept eliminated. D* − D(a') is
    of the order of the square of the step's error: the certificate of the current state
    with D(a') is of the order of its true error, where the gap of a = −ℓ'(ŷ) is up to the
    condition number larger (``docs/engines/newton.md``). A pure L1 penalty is
    Lipschitzed with the bound of the state's primal value, as the certificate is.
    """
    if problem.loss == "squared" or not partials:
        return -np.inf  # ridge/lasso: a' is the next residual, the next certificate's own
    gradient, _, _, _, eliminate = wide_newton.model_terms(problem, n_samples, total)
    if problem.fit_intercept and not eliminate:
        return -np.inf  # δ is a gradient step: Σa' ≠ 0
    psi = float(passes.sum_partials(*partials)["model_dual"][0])
    if not np.isfinite(psi):
        return -np.inf
    d_coef, d_b = direction["d_coef"], direction["d_b"]
    correlation = -(gradient + (total["h"] @ d_coef) / n_samples + (total["hx"] / n_samples) * d_b)
    bound = obj.lipschitz_bound(problem, cert["certificate"].primal)
    loss_part = psi / n_samples
    conjugate = float(obj.penalty_conjugate(problem, correlation, bound).sum())
    # Xᵀa' comes from sums of H, not from X: a margin for their rounding keeps the bound
    # below D(a') (this point is tight enough for the gap to reach the rounding of P).
    return loss_part - conjugate - obj.DUAL_ROUNDING * (abs(loss_part) + conjugate)


def _tightened(cert: obj.Certificate, dual: float) -> obj.Certificate:
    """``cert`` with a higher dual value (any feasible dual point bounds P* from below)."""
    if not dual > cert.dual:
        return cert
    return with_values(cert, cert.primal, dual)


class _BlockNewton(ClusterBlocks):
    """The block engine's runtime (cells, labels, homes, keyed submits, fixed-order sums)
    driving Newton iterations: two reads of the grid and one wait each."""

    records_start = True  # iteration k certifies the k-th state (0: the start)

    def _first(self, state, final) -> Certified:
        self.passes, self.steps = 0, []
        return self._certified(state, final)

    def _next(self, point, final) -> Certified:
        chosen = point.carry
        self.steps.append(chosen["step"])
        return self._certified(
            {"coef": chosen["coef"], "intercept": float(chosen["intercept"])}, final
        )

    def _done(self, point, tol) -> bool:
        chosen = point.carry
        return point.certificate.relative_gap <= tol or chosen is None or chosen["step"] == 0.0

    def _certified(self, state, final) -> Certified:
        """The certificate of ``state`` and the next state (None where ``final``)."""
        self.runtime.assign_homes()  # a worker may have been lost or added
        cert, chosen = self._iteration(state, final)
        return Certified(state["coef"], state["intercept"], cert, chosen)

    def _read(self, func, per_row: tuple, state: dict):
        """One read of the grid: ``func(*per_row, state, offsets, problem)`` on every row
        chunk (statistics, margins, ...), the statistics' total and the certificate of
        ``state`` on the margins; (their :class:`~dask_scd.runtime.cluster.Rows`, total,
        certificate), futures."""
        runtime, problem, n = self.runtime, self.problem, self.source.n_samples
        rows = runtime.map_rows(func, per_row, state, self.offsets, problem)
        total = runtime.submit(passes.sum_partials, *runtime.tree_sum(rows.item(0)))
        duals = runtime.map_rows(
            passes.dual_loss_sum, (self.labels, rows.item(1)), problem, total, n
        )
        self.passes += 1
        return rows, total, runtime.reduce(passes.certificate, (problem, n, state, total), duals)

    def _trials(self, func, margins, direction, *shared):
        """The line search's trials of ``direction`` on every row chunk (none under the
        squared loss: its step is exact): ``func(cells, labels, margins, direction,
        *shared, problem)``, :class:`~dask_scd.runtime.cluster.Rows`, or None."""
        if self.problem.loss == "squared":
            return None
        self.passes += 1
        return self.runtime.map_rows(
            func, (self.cells, self.labels, margins), direction, *shared, self.problem
        )

    def _iteration(self, state: dict, final: bool):
        """The certificate of ``state`` (with the dual value of the model solved at it) and,
        unless ``final``, the next state; one wait."""
        if self.wide:
            return self._wide_iteration(state, final)
        runtime, problem, n = self.runtime, self.problem, self.source.n_samples
        rows, total, cert = self._read(newton_row, (self.cells, self.labels), state)
        if final:
            return cert.result()["certificate"], None
        direction = runtime.submit(newton_direction, problem, n, state, total)
        trials = self._trials(newton_trials, rows.item(1), direction)
        # Below ~1e-13·P a change of objective is rounding noise (as in block SCD).
        slack = runtime.submit(_slack, cert)
        chosen = self._reduce(newton_choose, (problem, n, slack, direction), trials)
        # The model's dual point bounds P* for the current state too: a step whose model
        # certifies tol is not taken.
        model_dual = self._reduce(model_dual_value, (problem, n, total, direction, cert), trials)
        cert, chosen, model_dual = self.client.gather([cert, chosen, model_dual])
        return _tightened(cert["certificate"], model_dual), chosen

    def _wide_iteration(self, state: dict, final: bool):
        """Above :data:`MAX_FEATURES`: the certificate of ``state`` (one read), then unless
        ``final`` or certified, the Newton step by conjugate gradients on curvature
        products (one read and one wait each) and its line search (one read)."""
        runtime, problem, n = self.runtime, self.problem, self.source.n_samples
        rows, total, cert = self._read(
            wide_newton.wide_row, (self.cells, self.labels, self.row_sums), state
        )
        cert, total = self.client.gather([cert, total])
        cert = cert["certificate"]
        if final or cert.relative_gap <= self.tol:
            return cert, None

        def product(v):
            shared = self.client.scatter(v, hash=False)
            parts = runtime.map_rows(
                wide_newton.curvature_product, (self.cells, rows.item(2)), self.offsets, shared
            )
            return runtime.reduce(passes.sum_partials, (), parts).result()["hv"]

        direction, products = wide_newton.newton_cg_direction(
            problem,
            n,
            state,
            total,
            product,
            cert.relative_gap,
            self.offsets,
            tol_primal=self.tol * abs(cert.primal),
        )
        self.passes += products
        self.products.append(products)
        trials = self._trials(wide_newton.line_trials, rows.item(1), direction, self.offsets)
        slack = 1e-13 * abs(cert.primal)
        chosen = self._reduce(newton_choose, (problem, n, slack, direction), trials).result()
        return cert, chosen


def _slack(cert: dict) -> float:
    return 1e-13 * abs(cert["certificate"].primal)


def fit_block_newton(source: Source, problem: obj.Problem, options: Options) -> Run:
    """Proximal Newton on a dask array or a Grid: the p × p curvature reduced over row
    chunks up to :data:`MAX_FEATURES` features, conjugate gradients on curvature products
    above (L2 penalties; :mod:`dask_scd.engines.block.wide_newton`).

    Engine options: :class:`~dask_scd.engines.options.BlockNewtonOptions`; an
    iteration is one Newton step, and ``Run.extras["total_passes"]`` counts the reads of the grid.
    """
    settings = options.engine
    wide = not newton_forms_curvature(source)
    if wide and problem.l1 > 0.0:
        raise ValueError(
            f"solver='block_newton' with p = {source.n_features} features (more "
            f"than {MAX_FEATURES}, or rows too dense to form the p × p curvature) "
            "finds its steps by conjugate gradients, for L2 penalties only; use "
            "solver='block_scd' for an L1 or elastic-net penalty"
        )
    with fit_client(settings.client) as c:
        engine = _BlockNewton(c, source, problem, options, coarse=False)
        engine.wide, engine.products = wide, []
        if wide:  # the block-sum directions of the preconditioner's coarse level
            engine.row_sums = [
                engine.runtime.submit_row(r, block_coarse.block_row_sums, engine.cells[r], False)
                for r in range(source.n_row_chunks)
            ]
        run = engine.run(options.tol, options.max_iter, engine.hooks(settings))
    run.extras = {
        "total_passes": float(engine.passes),
        "steps": engine.steps,
        "cg_products": engine.products,
    }
    return run
