"""The alphas of a regularization path: alpha_max, the smallest alpha whose solution is
θ = 0, from the dual point of θ = 0 (in memory, or over a dask array's or a grid's cells),
and the log grid below it.

At θ = 0 with the best intercept b₀ the dual point is a = −v∘ℓ'(y, b₀) (v the sample
weights scaled to mean 1, or 1) and the optimality condition of every coordinate is
|x_jᵀa|/n ≤ alpha·ρ, so alpha_max = ‖Xᵀa‖∞ / (n·ρ) (ρ = l1_ratio; for a pure L2 penalty
glmnet's ρ = 1e-3 stands in, where no alpha zeroes θ).
"""

from __future__ import annotations

import numbers

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data import in_memory, make_source
from dask_scd.data.memory import InMemory
from dask_scd.grid.kinds import is_grid
from dask_scd.validation import is_dask

# glmnet's stand-in for ρ when the penalty has no L1 part (alpha_max is then finite).
L2_RATIO_FLOOR = 1e-3


def check_grid(alphas, n_alphas, eps):
    """A path's grid from its arguments: ("given", sorted alphas) or ("log", n_alphas,
    eps), whose alphas :func:`alphas_of` gives once alpha_max is known."""
    if alphas is not None:
        values = positive_values(alphas, f"alphas must be finite numbers > 0, got {alphas!r}")
        return ("given", np.sort(values)[::-1])
    n_alphas = check_grid_size(n_alphas, "n_alphas")
    if not (isinstance(eps, (int, float, np.floating)) and 0.0 < eps < 1.0):
        raise ValueError(f"eps={eps!r} must be a number in (0, 1)")
    return ("log", n_alphas, float(eps))


def check_grid_size(value, name: str) -> int:
    """``value`` (the size of a grid) as an int, else a ValueError naming ``name``."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be an integer ≥ 1")
    return int(value)


def positive_values(values, message: str) -> np.ndarray:
    """``values`` as a float64 vector of finite numbers > 0, else a ValueError."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.size == 0 or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ValueError(message)
    return values


def alpha_grid(alpha_max: float, n_alphas: int, eps: float) -> np.ndarray:
    """``n_alphas`` values from ``alpha_max`` down to ``eps·alpha_max`` on a log scale
    (scikit-learn's grid)."""
    if alpha_max <= 0.0:  # y constant (or X zero): every alpha gives θ = 0
        alpha_max = np.finfo(float).resolution
    return np.geomspace(alpha_max, alpha_max * eps, num=n_alphas)


def alphas_of(grid, alpha_max: float) -> np.ndarray:
    """The alphas of a grid of :func:`check_grid`."""
    return grid[1] if grid[0] == "given" else alpha_grid(alpha_max, grid[1], grid[2])


def zero_dual(loss: str, y, intercept: float, weights=None) -> np.ndarray:
    """a = −v∘ℓ'(y, b₀), the dual point of θ = 0 (v = 1 without ``weights``)."""
    a = -obj.loss_derivative(loss, y, np.full(len(y), intercept))
    return a if weights is None else a * weights


def max_alpha(X, y, loss: str, l1_ratio: float, fit_intercept: bool, sample_weight=None) -> float:
    """alpha_max: ``‖Xᵀa‖∞ / (n·ρ)`` with a = −v∘ℓ'(y, b₀), ρ floored at 1e-3.

    X in memory (numpy or scipy.sparse) with y (±1 for a classification loss), or a dask
    array or a grid (y None: its own labels), reduced over its cells; ``sample_weight``
    as given to :func:`dask_scd.path`.
    """
    problem = obj.Problem(loss, 1.0, l1_ratio, fit_intercept)
    if is_dask(X) or is_grid(X):
        source = make_source(X, y, loss, None, sample_weight)
        correlation, _ = correlation_at_zero(source, problem)
    else:
        data, _ = in_memory(X, y, loss, sample_weight)
        correlation, _ = memory_correlation_at_zero(data, problem)
    return alpha_max_of(correlation, l1_ratio)


def alpha_max_of(correlation, l1_ratio: float) -> float:
    """``‖Xᵀa‖∞ / (n·ρ)`` from the correlation Xᵀa/n at θ = 0, ρ floored at 1e-3."""
    return float(np.abs(correlation).max(initial=0.0)) / max(l1_ratio, L2_RATIO_FLOOR)


def memory_correlation_at_zero(data: InMemory, problem: obj.Problem):
    """(Xᵀa/n, b₀) at θ = 0 of in-memory data, a = −v∘ℓ'(y, b₀)."""
    intercept = obj.zero_intercept(problem, data.y, data.weights)
    a = zero_dual(problem.loss, data.y, intercept, data.weights)
    return np.asarray(data.X.T @ a).ravel() / data.n_samples, intercept


def _row_chunk_labels(source) -> list:
    from dask_scd.data.cells import labels

    return [labels(source.label(r)) for r in range(source.n_row_chunks)]


def correlation_at_zero(source, problem: obj.Problem):
    """(Xᵀa/n in the original feature order, b₀) at θ = 0, a = −v∘ℓ'(y, b₀): one task per
    cell, summed over row chunks in a fixed order."""
    import dask

    chunks = _row_chunk_labels(source)
    weights = source.unit_weights()
    intercept = obj.zero_intercept(problem, np.concatenate(chunks), weights)
    bounds = source.row_bounds
    duals = [
        zero_dual(
            problem.loss,
            y,
            intercept,
            None if weights is None else weights[bounds[r] : bounds[r + 1]],
        )
        for r, y in enumerate(chunks)
    ]
    cells = _cells(source)
    products = [
        [dask.delayed(_transpose_dot)(cells[r][b], duals[r]) for b in range(len(source.blocks))]
        for r in range(source.n_row_chunks)
    ]
    (computed,) = dask.compute(products)
    by_block = [
        sum(computed[r][b] for r in range(source.n_row_chunks)) for b in range(len(source.blocks))
    ]
    correlation = np.empty(source.n_features)
    correlation[source.feature_order] = np.concatenate(by_block) / source.n_samples
    return correlation, intercept


def _cells(source) -> list:
    """cells[r][b] as dask objects: the chunks of a dask array, reads of a grid's cells."""
    if source.on_disk:
        import dask

        from dask_scd.grid.read import read_cell

        grid = source.grid
        return [
            [
                dask.delayed(read_cell)(grid.path, grid.grid_id, r, b)
                for b in range(len(source.blocks))
            ]
            for r in range(source.n_row_chunks)
        ]
    return source.X.to_delayed().tolist()


def _transpose_dot(cell, a) -> np.ndarray:
    from dask_scd.validation import to_scipy

    if not isinstance(cell, np.ndarray):
        cell = to_scipy(cell)
    return np.asarray(cell.T @ a).ravel()


def zero_gap(source, problem: obj.Problem, intercept: float) -> float:
    """The relative gap of θ = 0 at alpha ≥ alpha_max (no cell read: θ = 0 gives the
    margins, and the correlations do not enter the gap while they are below alpha·ρ)."""
    y = np.concatenate(_row_chunk_labels(source))
    weights = source.unit_weights()
    margins = np.full(len(y), intercept)
    sums = obj.margin_sums(problem, y, margins, weights)
    a = obj.dual_point(problem, y, margins, obj.dual_scales(problem, sums), weights)
    dual = float(obj.dual_loss(problem.loss, y, a, weights).sum()) / len(y)
    return obj.relative_gap(sums["loss"] / len(y), dual)
