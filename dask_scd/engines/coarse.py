"""The coarse step: a Newton step on the subspace of whole-block shifts.

On one-hot data shifting a whole field against the intercept or another field barely
changes the margins, and coordinate descent can crawl along such directions for
thousands of epochs. With S = [X_B 1 for every block B] (+ the intercept's ones), the
k-dimensional problem min_c gᵀc + ½ cᵀHc + Σ_B Σ_{j∈B} pen(θ_j + c_B) (g = Sᵀℓ'(ŷ)/n,
H = Sᵀdiag(ℓ''(ŷ))S/n) is cheap, solved exactly by cyclic 1-D steps (the L1 kinks by
:func:`dask_scd.objectives.best_shift`) and kept a descent step by a line search. The
dask engine reduces g and H over row chunks (with an L1 part it shifts each block's
non-zero coefficients only); the in-memory SCD engine computes them directly, as often
as its cost model allows (:class:`CoarseCost`), L2 only. See "Flat directions of
one-hot data" in ``docs/objectives.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dask_scd import objectives as obj
from dask_scd.kernels.scalar import ARMIJO as _ARMIJO
from dask_scd.kernels.scalar import TRIAL_STEPS
from dask_scd.kernels.scalar import penalty as _scalar_penalty

_penalty = _scalar_penalty.py_func  # elementwise on arrays too

# Step sizes tried by the line searches, all in one reduction: 1, 1/4, 1/16, 1/64. Each
# costs a loss evaluation per non-zero, so few; a coordinate that accepts none keeps its
# value this epoch and gets a fresh Newton direction in the next.
LINE_SEARCH_STEPS = TRIAL_STEPS
# The in-memory coarse space is skipped when it has more dimensions than this.
MAX_DIMENSIONS = 256
_DETECTION_ROWS = 20_000


def coarse_newton(problem, g, h, blocks, sweeps=100) -> np.ndarray:
    """argmin_c gᵀc + ½cᵀhc + Σ_B Σ_{j∈B} pen(θ_j + c_B) by cyclic exact 1-D steps.

    The last coordinate is the intercept (unpenalized) when there is one. Without an L1
    part the problem is a linear system, solved directly.
    """
    k = len(g)
    if problem.l1 == 0.0:
        sizes = np.zeros(k)
        sums = np.zeros(k)
        sizes[: len(blocks)] = [len(theta) for theta in blocks]
        sums[: len(blocks)] = [theta.sum() for theta in blocks]
        system = h + np.diag(problem.l2 * sizes)
        try:
            return np.linalg.solve(system, -(g + problem.l2 * sums))
        except np.linalg.LinAlgError:
            return np.linalg.lstsq(system, -(g + problem.l2 * sums), rcond=None)[0]
    c = np.zeros(k)
    residual = g.copy()  # g + h c
    ordered = [np.sort(-theta) for theta in blocks]  # best_shift's breakpoints, sorted once
    for _ in range(sweeps):
        biggest = 0.0
        for b in range(k):
            curvature = h[b, b]
            linear = residual[b] - curvature * c[b]
            if b < len(blocks):
                new = obj.best_shift(problem, ordered[b], linear, curvature, presorted=True)
            else:
                new = -linear / curvature if curvature > 0 else c[b]
            delta = new - c[b]
            if delta != 0.0:
                residual += h[:, b] * delta
                c[b] = new
                biggest = max(biggest, abs(delta))
        if biggest <= 1e-15 * max(1.0, np.abs(c).max()):
            break
    return c


def coarse_line_search(problem, change, g, shift, blocks) -> float:
    """The largest step t ∈ {1, 1/2, …} with Armijo decrease (0 if none)."""

    def penalty_change(t):
        return sum(
            float(
                np.sum(_penalty(problem.l1, problem.l2, theta + t * shift[b]))
                - np.sum(_penalty(problem.l1, problem.l2, theta))
            )
            for b, theta in enumerate(blocks)
        )

    model = float(g @ shift) + penalty_change(1.0)
    for t, loss_change in zip(LINE_SEARCH_STEPS, change):
        if loss_change + penalty_change(t) <= _ARMIJO * t * model:
            return float(t)
    return 0.0


@dataclass(frozen=True)
class CoarseCost:
    """The cost model of the in-memory coarse step, in operations (one per stored entry
    of X read in a pass, ``loss_cost`` per loss value or derivative).

    An epoch costs ``epoch``. A step costs ``step``: the gradient Sᵀℓ'(ŷ) and the shift
    S c (two passes over S, whose stored entries number at most X's plus n), two loss
    evaluations of the line search, the k³ solve, and the curvature SᵀDS/n on every
    ``stride``-th row only (its full cost Σ_i s_i², s_i the blocks row i touches, grows
    as n·k² on one-hot data). The step runs every ``spacing`` epochs, so that it costs at
    most :data:`BUDGET` of the epochs it serves, or not at all (``used`` False) when that
    would need more than :data:`MAX_SPACING` epochs, or when the sampled rows are too
    few to estimate the curvature (fewer than :data:`ROWS_PER_DIMENSION` per dimension).
    """

    epoch: float
    step: float
    stride: int
    spacing: int
    used: bool

    @classmethod
    def plan(cls, n_samples, row_touches, n_entries, dimensions, loss_cost, fit_intercept):
        """The plan for ``row_touches`` (s_i per row, the intercept included),
        ``n_entries`` stored entries of X and ``dimensions`` = k."""
        n = n_samples
        epoch = loss_cost * (n_entries + n * int(fit_intercept))
        touches = float(np.sum(row_touches))
        pairs = float(np.dot(row_touches.astype(np.float64), row_touches))
        fixed = 3 * loss_cost * n + 2 * touches + dimensions**3 / 3
        stride = max(1, int(np.ceil(pairs / (HESSIAN_BUDGET * epoch))))
        step = fixed + (pairs + loss_cost * n) / stride
        spacing = max(1, int(np.ceil(step / (BUDGET * epoch))))
        used = n / stride >= ROWS_PER_DIMENSION * dimensions and spacing <= MAX_SPACING
        return cls(epoch, step, stride, spacing, used)


# A coarse step costs at most this fraction of the epochs it serves (its curvature at
# most HESSIAN_BUDGET of one epoch); it is skipped rather than spaced by more than
# MAX_SPACING epochs, or estimated from fewer than ROWS_PER_DIMENSION rows per dimension.
BUDGET = 0.25
HESSIAN_BUDGET = 0.1
MAX_SPACING = 8
ROWS_PER_DIMENSION = 10
# Operations per example of a loss value or derivative (an exponential costs several).
LOSS_COST = {"squared": 1.0, "logistic": 4.0, "squared_hinge": 1.5, "hinge": 1.0}


class LocalCoarse:
    """The coarse space of an in-memory sparse X, with blocks from greedy colouring.

    The blocks are detected on the first rows (any partition gives valid steps; pure
    blocks recover the fields of one-hot data). Dense X, more than
    :data:`MAX_DIMENSIONS` blocks, or a step the cost model (:class:`CoarseCost`) finds
    too dear gives no coarse space (``LocalCoarse.build`` → None). S (the block sums of
    the rows, and the ones of the intercept) is kept sparse: at most one stored entry per
    stored entry of X and one per row.
    """

    def __init__(
        self,
        row_sums,
        blocks: list,
        fit_intercept: bool,
        flat: bool,
        cost: CoarseCost | None = None,
        weights=None,
    ):
        self.row_sums = row_sums
        self.weights = weights  # the sample weights v (mean 1), or None
        self.blocks = blocks
        self.fit_intercept = fit_intercept
        self.flat = flat
        self.cost = cost
        self.sampled = None if row_sums is None else row_sums[:: cost.stride]
        self._gram = None  # SᵀS/n, constant for the squared loss

    @classmethod
    def build(cls, X, problem: obj.Problem, weights=None):
        """The coarse space of sparse X, else None (``weights``: the sample weights v of
        the loss, or None).

        With an L1 part a Newton step on whole-block shifts moves every zero coefficient
        off its kink (measured on Adult: it slowed lasso and elastic net down), so only
        the *flat* directions are kept: complete one-hot blocks (exactly one 1 per row),
        whose shift against the intercept (or another such block) changes no margin and
        is decided by the penalty alone, exactly. That step reads no data (O(p log p)).

        Without an L1 part the cost model is checked first on the row counts of X (a row
        touches at most as many blocks as it has non-zeros, and there are at least as
        many blocks as the fullest row has non-zeros), so that data on which the step
        could not pay never pays for the detection of its blocks either.
        """
        fit_intercept = problem.fit_intercept
        if not sp.issparse(X):
            return None
        n_samples = X.shape[0]
        if problem.l1 == 0.0:
            cost = cls.cost_bound(X, problem)
            if not cost.used:
                return None
        from dask_scd.grid.partition import detect_pure_blocks

        # A column without entries is in no flat direction: shifting it only moves its
        # penalty (and a coordinate step cannot bring it back: its curvature is zero).
        used = _column_counts(X) > 0
        blocks = [b[used[b]] for b in detect_pure_blocks(X[:_DETECTION_ROWS])]
        blocks = [b for b in blocks if len(b)]
        if len(blocks) + int(fit_intercept) > MAX_DIMENSIONS or len(blocks) < 1:
            return None
        columns = np.concatenate(blocks)
        indicator = sp.csr_matrix(
            (
                np.ones(len(columns)),
                (columns, np.repeat(np.arange(len(blocks)), [len(b) for b in blocks])),
            ),
            shape=(X.shape[1], len(blocks)),
        )
        row_sums = sp.csr_matrix(X @ indicator, dtype=np.float64)
        if problem.l1 > 0.0:
            ones = np.bincount(row_sums.indices[row_sums.data == 1.0], minlength=len(blocks))
            binary = _column_counts(X, X.data != 1.0) == 0
            complete = [
                b for k, b in enumerate(blocks) if ones[k] == n_samples and np.all(binary[b])
            ]
            if not complete or (not fit_intercept and len(complete) < 2):
                return None
            return cls(None, complete, fit_intercept, flat=True)
        if fit_intercept:
            row_sums = sp.hstack([row_sums, np.ones((n_samples, 1))], format="csr")
        row_sums.sum_duplicates()
        cost = CoarseCost.plan(
            n_samples,
            np.diff(row_sums.indptr),
            int(X.nnz),
            row_sums.shape[1],
            LOSS_COST[problem.loss],
            fit_intercept,
        )
        if not cost.used:
            return None
        return cls(row_sums, blocks, fit_intercept, flat=False, cost=cost, weights=weights)

    @staticmethod
    def cost_bound(X, problem: obj.Problem) -> CoarseCost:
        """The cost model with the blocks bounded from the row counts of X alone."""
        n_samples = X.shape[0]
        touches = _row_counts(X) + int(problem.fit_intercept)
        return CoarseCost.plan(
            n_samples,
            touches,
            int(X.nnz),
            int(touches.max(initial=0)),
            LOSS_COST[problem.loss],
            problem.fit_intercept,
        )

    def due(self, epoch: int) -> bool:
        """Whether the step runs after ``epoch`` (every ``cost.spacing`` epochs)."""
        return self.flat or epoch % self.cost.spacing == 0

    def step(self, problem: obj.Problem, y, margins, coef, intercept: float) -> float:
        """One coarse step; ``coef`` and ``margins`` in place, returns the new intercept."""
        if self.flat:
            return self._flat_step(problem, coef, intercept)
        n = len(y)
        S = self.row_sums
        derivatives = obj.loss_derivative(problem.loss, y, margins)
        if self.weights is not None:
            derivatives = derivatives * self.weights
        g = S.T @ derivatives / n
        h = self._curvature(problem, y, margins)
        thetas = [coef[b] for b in self.blocks]
        shift = coarse_newton(problem, g, h, thetas)
        if not np.any(shift):
            return intercept
        u = S @ shift
        if problem.loss == "squared":
            step = self._exact_step(problem, g, shift, u, thetas)
        else:
            step = self._line_search(problem, y, margins, g, shift, u, thetas)
        if step == 0.0:
            return intercept
        for b, block in enumerate(self.blocks):
            coef[block] += step * shift[b]
        margins += step * u
        return intercept + step * shift[-1] if self.fit_intercept else intercept

    def _curvature(self, problem, y, margins) -> np.ndarray:
        """SᵀDS/n estimated on every ``stride``-th row (constant for the squared loss),
        D = diag(v∘ℓ''(ŷ)) with sample weights v."""
        stride = self.cost.stride
        if problem.loss == "squared" and self.weights is None:
            if self._gram is None:
                self._gram = (self.sampled.T @ self.sampled).toarray() * stride / len(y)
            return self._gram
        d2 = obj.loss_second_derivative(problem.loss, y[::stride], margins[::stride])
        if self.weights is not None:
            d2 = d2 * self.weights[::stride]
        weighted = sp.diags(d2) @ self.sampled
        return (self.sampled.T @ weighted).toarray() * stride / len(y)

    def _exact_step(self, problem, g, shift, u, thetas) -> float:
        """argmin_t of the quadratic objective along the shift: 1 when the curvature is
        exact, the correction of its row sample otherwise."""
        slope = float(g @ shift) + problem.l2 * sum(
            float(shift[b] * theta.sum()) for b, theta in enumerate(thetas)
        )
        curve = obj.weighted_sum(u * u, self.weights) / len(u) + problem.l2 * sum(
            len(theta) * float(shift[b]) ** 2 for b, theta in enumerate(thetas)
        )
        return max(0.0, -slope / curve) if curve > 0 else 0.0

    def _line_search(self, problem, y, margins, g, shift, u, thetas) -> float:
        """The first of :data:`LINE_SEARCH_STEPS` with Armijo decrease (0 if none); the
        loss is evaluated at a step only when the larger ones failed."""
        n = len(y)
        v = self.weights
        base = obj.weighted_sum(obj.loss_value(problem.loss, y, margins), v)

        def changes():
            for t in LINE_SEARCH_STEPS:
                trial = obj.weighted_sum(obj.loss_value(problem.loss, y, margins + t * u), v)
                yield (trial - base) / n

        return coarse_line_search(problem, changes(), g, shift, thetas)

    def _flat_step(self, problem, coef, intercept: float) -> float:
        """Exact steps along the flat directions: margins unchanged by construction."""
        if self.fit_intercept:
            for block in self.blocks:
                c = obj.best_shift(problem, coef[block])
                coef[block] -= c
                intercept += c
            return intercept
        anchor = self.blocks[0]
        for block in self.blocks[1:]:
            c = obj.best_shift(problem, np.concatenate([coef[block], -coef[anchor]]))
            coef[block] -= c
            coef[anchor] += c
        return intercept


def _row_counts(X) -> np.ndarray:
    """Stored entries of every row of sparse X (CSR or CSC), without converting it."""
    if X.format == "csr":
        return np.diff(X.indptr).astype(np.int64)
    rows = X.indices if X.format == "csc" else X.tocoo().row
    return np.bincount(rows, minlength=X.shape[0]).astype(np.int64)


def _column_counts(X, where=None) -> np.ndarray:
    """Stored entries of every column of sparse X (only those ``where`` is true)."""
    if X.format == "csc":
        columns = np.repeat(np.arange(X.shape[1]), np.diff(X.indptr))
    elif X.format == "csr":
        columns = X.indices
    else:
        X = X.tocsr()
        columns = X.indices
    if where is not None:
        columns = columns[where]
    return np.bincount(columns, minlength=X.shape[1])
