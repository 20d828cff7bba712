"""The coarse step: a Newton step on the subspace of whole-block shifts.

Coordinate descent is slow along directions that its coordinates only see together. On
one-hot data the sum of a field's columns is the all-ones vector (a set-valued field's
nearly so), so shifting a whole field against the intercept or against another field
barely changes the margins: along such directions only the small penalty curvature pulls
and coordinate descent can crawl for thousands of epochs. With S = [X_B 1 for every block
B] (+ the ones column of the intercept), the k-dimensional problem

    min_c  gᵀc + ½ cᵀHc + Σ_B Σ_{j∈B} pen(θ_j + c_B),   g = Sᵀℓ'(ŷ)/n,  H = Sᵀdiag(ℓ''(ŷ))S/n

is cheap (k = number of blocks + 1), is solved exactly by cyclic 1-D steps
(:func:`dask_scd.objectives.best_shift` handles the L1 kinks), and a line search keeps it
a descent step for non-quadratic losses. One such step per epoch takes the one-hot
problems of the tests from ~150 epochs to ~6 (L2 penalties; with an L1 part the kinks at
zero make whole-block shifts counterproductive, and it is not used). Both engines use it: the dask engine
reduces g and H over row chunks, the in-memory engine computes them directly.
"""

from __future__ import annotations

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
    for _ in range(sweeps):
        biggest = 0.0
        for b in range(k):
            curvature = h[b, b]
            linear = residual[b] - curvature * c[b]
            if b < len(blocks):
                new = obj.best_shift(problem, -blocks[b], linear, curvature)
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
            float(np.sum(_penalty(problem.l1, problem.l2, theta + t * shift[b]))
                  - np.sum(_penalty(problem.l1, problem.l2, theta)))
            for b, theta in enumerate(blocks)
        )
    model = float(g @ shift) + penalty_change(1.0)
    for t, loss_change in zip(LINE_SEARCH_STEPS, change):
        if loss_change + penalty_change(t) <= _ARMIJO * t * model:
            return float(t)
    return 0.0


class LocalCoarse:
    """The coarse space of an in-memory sparse X, with blocks from greedy colouring.

    The blocks are detected on the first rows (any partition gives valid steps; pure
    blocks recover the fields of one-hot data). Dense X, or more than
    :data:`MAX_DIMENSIONS` blocks, gives no coarse space (``LocalCoarse.build`` → None).
    """

    def __init__(self, row_sums: np.ndarray, blocks: list, fit_intercept: bool, flat: bool):
        self.row_sums = row_sums
        self.blocks = blocks
        self.fit_intercept = fit_intercept
        self.flat = flat
        self._gram = None  # SᵀS/n, constant for the squared loss

    @classmethod
    def build(cls, X, problem: obj.Problem):
        """The coarse space of sparse X, else None.

        With an L1 part a Newton step on whole-block shifts moves every zero coefficient
        off its kink (measured on Adult: it slowed lasso and elastic net down), so only
        the *flat* directions are kept: complete one-hot blocks (exactly one 1 per row),
        whose shift against the intercept (or another such block) changes no margin and
        is decided by the penalty alone, exactly.
        """
        fit_intercept = problem.fit_intercept
        if not sp.issparse(X):
            return None
        from dask_scd.grid.partition import detect_pure_blocks

        blocks = detect_pure_blocks(X[:_DETECTION_ROWS])
        if len(blocks) + int(fit_intercept) > MAX_DIMENSIONS or len(blocks) < 1:
            return None
        indicator = sp.csr_matrix(
            (np.ones(X.shape[1]), (np.concatenate(blocks), np.repeat(np.arange(len(blocks)),
                                                                      [len(b) for b in blocks]))),
            shape=(X.shape[1], len(blocks)),
        )
        row_sums = np.asarray((X @ indicator).todense(), dtype=np.float64)
        if problem.l1 > 0.0:
            binary = X.tocsc()
            complete = [b for k, b in enumerate(blocks)
                        if np.all(row_sums[:, k] == 1.0)
                        and np.all(binary[:, b].data == 1.0)]
            if not complete or (not fit_intercept and len(complete) < 2):
                return None
            return cls(None, complete, fit_intercept, flat=True)
        if fit_intercept:
            row_sums = np.column_stack([row_sums, np.ones(X.shape[0])])
        return cls(np.ascontiguousarray(row_sums), blocks, fit_intercept, flat=False)

    def step(self, problem: obj.Problem, y, margins, coef, intercept: float) -> float:
        """One coarse step; ``coef`` and ``margins`` in place, returns the new intercept."""
        if self.flat:
            return self._flat_step(problem, coef, intercept)
        n = len(y)
        S = self.row_sums
        g = S.T @ obj.loss_derivative(problem.loss, y, margins) / n
        if problem.loss == "squared":
            if self._gram is None:
                self._gram = S.T @ S / n
            h = self._gram
        else:
            h = S.T @ (S * obj.loss_second_derivative(problem.loss, y, margins)[:, None]) / n
        thetas = [coef[b] for b in self.blocks]
        shift = coarse_newton(problem, g, h, thetas)
        if not np.any(shift):
            return intercept
        u = S @ shift
        step = 1.0
        if problem.loss != "squared":
            base = obj.loss_value(problem.loss, y, margins)
            change = np.array([(obj.loss_value(problem.loss, y, margins + t * u) - base).sum() / n
                               for t in LINE_SEARCH_STEPS])
            step = coarse_line_search(problem, change, g, shift, thetas)
        if step == 0.0:
            return intercept
        for b, block in enumerate(self.blocks):
            coef[block] += step * shift[b]
        margins += step * u
        return intercept + step * shift[-1] if self.fit_intercept else intercept

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
