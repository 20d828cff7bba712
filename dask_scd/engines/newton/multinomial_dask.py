"""The multinomial loss over dask: Newton-CG with every pass a reduction over row chunks.

The in-memory engine's L2 method (:mod:`dask_scd.engines.newton.multinomial`) with X a dask
array: each row chunk's task reads its cells and sums its share of

- the gradient pass: Σ_i ℓ_i, XᵀP, Σ_i p_i, Σ_i H(p_i) and the Hessian's diagonal
  (X²)ᵀ(P(1 − P)) (P recomputed from the chunk's margins XW + b);
- a Hessian-vector product: XᵀR with R_ik = p_ik(U_ik − Σ_l p_il U_il), U = XV + v_b;
- the line search: the loss at every trial step t ∈ {1, ½, ..., 2⁻¹⁰} along XΔ + Δb,

and the client adds the partial sums in row order (the model does not depend on the
number of workers). Only p × K arrays travel. XᵀY and Xᵀ1 are one more pass, once.

The certificate needs no second pass: the mixed dual point's entropy is bounded below
by concavity, H((1 − t)p_i + tπ) ≥ (1 − t)H(p_i) + tH(π), so
D ≥ (1/n)[(1 − t)Σ_i H(p_i) + n·t·H(π)] − Σ g*(XᵀA/n) is a valid dual value from the
gradient pass's sums; it is exact at t = 0, the optimum. For an L2 penalty (an L1
term's inner coordinate descent reads every row at every step).

With sample weights each row chunk's labels travel with its weights v, scaled to mean 1
(:class:`~dask_scd.data.cells.WeightedLabels`), and every sum above is the weighted one:
Σ v_i ℓ_i, XᵀVP, Σ v_i p_i, Σ v_i H(p_i), the curvature's V·P(1 − P) (and the Hessian's
V), XᵀVR, XᵀVY, Xᵀv, the weighted class counts and the line-search trials. The bound by
concavity holds as it is: Σ_i v_i = n.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.special import entr

from dask_scd import objectives as obj
from dask_scd.data.cells import labels as label_values
from dask_scd.data.cells import row_chunk_finding, row_weights
from dask_scd.data.findings import finding_error
from dask_scd.data.sources import DaskSource, Source
from dask_scd.engines import cholesky
from dask_scd.engines.base import Options, Run
from dask_scd.engines.newton.multinomial import (
    armijo_step,
    column_sums,
    curvature_rows,
    l2_forcing,
    newton_cg,
    newton_steps,
)
from dask_scd.engines.newton.newton_loop import Meter
from dask_scd.objectives import multinomial as mn
from dask_scd.runtime.cluster import fit_client
from dask_scd.runtime.passes import sum_partials

# Above this many variables ((p + 1)·K) the Hessian is not formed: it costs n·((p + 1)K)²
# flops a step where a conjugate-gradient product costs ~4·n·p·K (dense 20,000 × 100,
# 10 classes: 47 s with the Hessian against 3 s in memory by products); conjugate
# gradients on its products then, one reduction each. The same row cost as block
# Newton's limit (block_newton.MAX_ROW_COST = 256²).
MAX_CURVATURE = 256
_PATIENCE = 8
_TRIALS = tuple(0.5**k for k in range(11))


# ---------------------------------------------------------------- row-chunk tasks


def _rows(cells):
    """The row chunk's cells side by side (grid column order), float64."""
    if any(sp.issparse(c) or hasattr(c, "to_scipy_sparse") for c in cells):
        from dask_scd.validation import to_scipy

        return sp.hstack([to_scipy(c) for c in cells], format="csr", dtype=np.float64)
    return np.hstack([np.asarray(c, dtype=np.float64) for c in cells])


def _probabilities(X, W, b):
    margins = np.asarray(X @ W) + b
    P, lse = mn.softmax_rows(margins)
    return margins, P, lse


def _codes(y):
    """(class indices, sample weights or None) of a row chunk's labels argument."""
    # the labels' tasks hand out float64
    return label_values(y).astype(np.intp), row_weights(y)


def gradient_part(cells, y, W, b, with_labels: bool, curvature: bool = False) -> dict:
    """A row chunk's share of the gradient pass (and, once, of XᵀVY, Xᵀv and the class
    counts; with ``curvature``, of the whole Hessian of the loss)."""
    X = _rows(cells)
    codes, v = _codes(y)
    margins, P, lse = _probabilities(X, W, b)
    rows = np.arange(len(codes))
    squares = X.multiply(X) if sp.issparse(X) else X * X
    VP = mn.weighted_rows(P, v)
    part = {
        "loss": obj.weighted_sum(lse - margins[rows, codes], v),
        "xt_prob": np.asarray(X.T @ VP),
        "prob_sums": VP.sum(axis=0),
        "entropy": mn.entropy_sum(P, v),
        "diagonal": np.asarray(squares.T @ (VP * (1.0 - P))),
        "diagonal_b": (VP * (1.0 - P)).sum(axis=0),
    }
    if curvature:
        part["hessian"] = _hessian(X, P, v)
    if with_labels:
        K = W.shape[1]
        part["xt_onehot"] = np.asarray(X.T @ mn.weighted_rows(mn.one_hot(codes, K), v))
        part["column_sums"] = column_sums(X, v)
        part["counts"] = mn.class_counts(codes, K, v)
    return part


def _hessian(X, P, v=None):
    """Σ_i v_i (diag(p_i) − p_i p_iᵀ) ⊗ x̃_i x̃_iᵀ over the chunk, x̃_i = (x_i, 1), as a
    ((p + 1)K)² matrix indexed (feature, class) in row-major order: K(K + 1)/2 weighted
    Gram matrices X̃ᵀ diag(w_kl) X̃, w_kl = v·p_k(δ_kl − p_l) (v = 1 without weights)."""
    n, K = P.shape
    if sp.issparse(X):
        Xa = sp.hstack([X, np.ones((n, 1))], format="csr")
    else:
        Xa = np.hstack([X, np.ones((n, 1))])
    q = Xa.shape[1]
    H = np.empty((q, K, q, K))
    for k in range(K):
        for m in range(k, K):
            w = P[:, k] * ((k == m) - P[:, m])
            if v is not None:
                w = w * v
            weighted = Xa.multiply(w[:, None]).tocsr() if sp.issparse(Xa) else Xa * w[:, None]
            gram = Xa.T @ weighted
            gram = gram.toarray() if sp.issparse(gram) else gram
            H[:, k, :, m] = gram
            H[:, m, :, k] = gram.T
    return H.reshape(q * K, q * K)


def hessian_part(cells, y, W, b, V, v_b) -> dict:
    """A row chunk's share of the Hessian-vector product of the loss."""
    X = _rows(cells)
    _, P, _ = _probabilities(X, W, b)
    U = np.asarray(X @ V) + v_b
    R = curvature_rows(P, U, row_weights(y))
    return {"xt_r": np.asarray(X.T @ R), "r_sums": R.sum(axis=0)}


def trials_part(cells, y, W, b, D, d_b) -> np.ndarray:
    """A row chunk's loss sums at every trial step along (D, d_b)."""
    X = _rows(cells)
    codes, v = _codes(y)
    margins = np.asarray(X @ W) + b
    U = np.asarray(X @ D) + d_b
    return np.array([mn.loss_sum(margins + t * U, codes, v) for t in _TRIALS])


# ------------------------------------------------------------------------- engine


class _Reducer:
    """Submits one task per row chunk and adds the parts in row order
    (:func:`~dask_scd.runtime.passes.sum_partials`)."""

    def __init__(self, client, cells, labels):
        self.client, self.cells, self.labels = client, cells, labels

    def map(self, function, *args, labels=False):
        futures = [
            self.client.submit(
                function, self.cells[r], *((self.labels[r],) if labels else ()), *args, pure=False
            )
            for r in range(len(self.cells))
        ]
        return sum_partials(*self.client.gather(futures))


def fit_multinomial_dask(source: Source, problem: obj.Problem, options: Options) -> Run:
    """Newton-CG for the multinomial loss (L2 penalty) on a dask array.

    ``source``: a :class:`~dask_scd.data.sources.DaskSource` whose labels are class
    indices, with its sample weights if any. ``options.max_iter`` counts Newton steps.
    The Run's ``coef`` has shape (n_classes, n_features) in the original feature order,
    its ``intercept`` (n_classes,).
    """
    if not isinstance(source, DaskSource):
        raise ValueError(
            "loss='multinomial' over dask takes a dask array; a grid above "
            "in_memory_limit is fitted by LogisticRegression(multi_class='ovr')"
        )
    unsupported = [name for name in options.engine.changed() if name not in ("client", "callback")]
    if unsupported:
        raise ValueError(
            f"loss='multinomial' over dask takes no {unsupported} (only client= and callback=)"
        )
    with fit_client(options.engine.client) as client:
        cells, labels = source.connect(client)
        _check_values(client, cells, source)
        p = source.n_features
        K = int(max(int(c.max()) for c in source.y_chunks)) + 1
        reduce = _Reducer(client, cells, labels)
        steps = _Steps(reduce, problem, source.n_samples, (p + 1) * K <= MAX_CURVATURE)
        run = newton_steps(steps, problem, options, np.zeros((p, K)), np.zeros(K))
    coef = np.empty_like(run.coef)
    coef[:, source.feature_order] = run.coef
    run.coef = coef
    return run


def _check_values(client, cells, source) -> None:
    """One pass over the cells for a NaN, an infinity or a value too large, each row
    chunk's finding returned by its task and raised here, naming the row and column."""
    found = client.gather(
        [
            client.submit(row_chunk_finding, cells[r], f"row chunk {r}", pure=False)
            for r in range(len(cells))
        ]
    )
    for r, finding in enumerate(found):
        if finding is not None:
            b = finding["block"]
            raise finding_error(finding["finding"], r, b, source.row_bounds, source.blocks)


@dataclass
class _Point:
    """The gradient pass's sums at (W, b) (``part``) and what the loop reads of them."""

    W: np.ndarray
    b: np.ndarray
    part: dict
    objective: float
    grad_loss: np.ndarray
    grad_b: np.ndarray


class _Steps:
    """:func:`~dask_scd.engines.newton.multinomial.newton_steps` by reductions over the
    row chunks; ``curvature``: whether the gradient pass sums the whole Hessian."""

    def __init__(self, reduce: _Reducer, problem, n: int, curvature: bool):
        self.reduce, self.problem, self.n, self.curvature = reduce, problem, n, curvature
        self.meter, self.first_norm = Meter(), None
        self.fixed = None  # XᵀVY, Xᵀv and the class counts, from the first pass

    def point(self, W, b) -> _Point:
        problem, n, reduce, curvature = self.problem, self.n, self.reduce, self.curvature
        tick = time.perf_counter()
        part = reduce.map(gradient_part, W, b, self.fixed is None, curvature, labels=True)
        if self.fixed is None:
            self.fixed = fixed = {k: part[k] for k in ("xt_onehot", "column_sums", "counts")}
            mn.check_class_weights(fixed["counts"], problem.fit_intercept)
            if problem.fit_intercept:  # the best b for W = 0, then the pass again
                b = np.log(fixed["counts"]) - np.log(fixed["counts"]).mean()
                part = reduce.map(gradient_part, W, b, False, curvature, labels=True)
        self.meter.add("gradient", 1.0, tick)
        fixed = self.fixed
        grad_loss = (part["xt_prob"] - fixed["xt_onehot"]) / n
        grad_b = (
            (part["prob_sums"] - fixed["counts"]) / n if problem.fit_intercept else np.zeros_like(b)
        )
        objective = part["loss"] / n + mn.penalty_value(problem, W)
        return _Point(W, b, part, objective, grad_loss, grad_b)

    def certify(self, point: _Point) -> obj.Certificate:
        return _certificate(self.problem, point.W, point.part, self.fixed, self.n, point.objective)

    def recertify(self, W, b) -> obj.Certificate:
        part = self.reduce.map(gradient_part, W, b, False, labels=True)
        primal = part["loss"] / self.n + mn.penalty_value(self.problem, W)
        return _certificate(self.problem, W, part, self.fixed, self.n, primal)

    def move(self, point: _Point):
        problem, n, W, b = self.problem, self.n, point.W, point.b
        tick = time.perf_counter()
        grad, forcing, self.first_norm = l2_forcing(problem, point, self.first_norm)
        if self.curvature:
            D, d_b = _newton_direction(problem, n, point.part["hessian"], grad, point.grad_b)
            self.meter.add("solve:cholesky", 0.0, tick)
        else:
            part = point.part
            diagonal = (part["diagonal"] / n + problem.l2, part["diagonal_b"] / n)
            D, d_b, passes = _cg(
                self.reduce, problem, n, W, b, grad, point.grad_b, diagonal, forcing
            )
            self.meter.add("solve:cg", passes, tick)
        tick = time.perf_counter()

        def losses():  # every trial's in one pass
            return self.reduce.map(trials_part, W, b, D, d_b, labels=True) / n

        t = armijo_step(problem, point, D, d_b, _TRIALS, losses)
        self.meter.add("line_search", 1.0, tick)
        return t, D, d_b


def _certificate(problem, W, part, fixed, n, primal) -> obj.Certificate:
    """The certificate of the module's docstring from the gradient pass's sums."""
    t, pi = mn.mixing(part["prob_sums"], fixed["counts"]) if problem.fit_intercept else (0.0, None)
    xt_q = (1.0 - t) * part["xt_prob"]
    if t > 0.0:
        xt_q = xt_q + t * np.outer(fixed["column_sums"], pi)
    correlation = (fixed["xt_onehot"] - xt_q) / n
    entropy = (1.0 - t) * part["entropy"] / n
    if t > 0.0:
        entropy += t * float(entr(pi).sum())
    g = obj.penalty_terms(problem, W)
    g_star = obj.penalty_conjugate(problem, correlation, np.inf)
    dual = mn._rounded_down(entropy - float(g_star.sum()))
    coordinate_gaps = g + g_star - correlation * W
    intercept_gap = primal - dual - float(coordinate_gaps.sum())
    return obj.Certificate(primal, dual, coordinate_gaps, intercept_gap, correlation)


def _newton_direction(problem, n, hessian, grad, grad_b):
    """Solve H d = −∇P with the reduced Hessian. The loss is flat along a common shift
    of the intercepts (and, without a penalty, of a feature's K coefficients), which the
    gradient is orthogonal to: a ridge of 1e-12·max diag makes the system definite and
    leaves the direction's other components as they are to that order."""
    p, K = grad.shape
    H = hessian / n
    index = np.arange(p * K)
    H[index, index] += problem.l2
    scale = float(np.max(np.diag(H), initial=0.0)) or 1.0
    H[np.diag_indices_from(H)] += 1e-12 * scale
    rhs = -np.concatenate([grad.ravel(), grad_b])
    try:
        solution = cholesky.solve(cholesky.factor(H), rhs)
    except np.linalg.LinAlgError:
        solution = scipy.linalg.lstsq(H, rhs)[0]
    d_b = solution[p * K :] if problem.fit_intercept else np.zeros(K)
    return solution[: p * K].reshape(p, K), d_b


def _cg(reduce, problem, n, W, b, grad, grad_b, diagonal, forcing):
    """Preconditioned conjugate gradients on H d = −∇P, one reduction per product."""

    def product(vector):
        v, v_b = vector
        part = reduce.map(hessian_part, W, b, v, v_b, labels=True)
        Hv = part["xt_r"] / n + problem.l2 * v
        Hv_b = part["r_sums"] / n if problem.fit_intercept else np.zeros_like(v_b)
        return Hv, Hv_b

    d, d_b, products = newton_cg(
        product, (-grad, -grad_b), *diagonal, forcing, problem.fit_intercept
    )
    return d, d_b, float(products)
