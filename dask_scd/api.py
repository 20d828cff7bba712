"""``dask_scd.fit``: one entry point, one result object, for every engine."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dask_scd.result import FitResult
from dask_scd.solvers import local
from dask_scd.solvers.gram import fit_gram
from dask_scd.validation import (
    check_fit_args,
    check_labels,
    check_matrix,
    check_problem,
    choose_solver,
)


def fit(
    X,
    y=None,
    *,
    loss: str = "squared",
    penalty: str = "l2",
    alpha: float = 1.0,
    l1_ratio: float = 0.5,
    fit_intercept: bool = True,
    tol: float = 1e-6,
    max_iter: int = 1000,
    solver: str = "auto",
    random_state=None,
    verbose: bool = False,
    **engine_options,
) -> FitResult:
    """Fit a regularized linear model by coordinate descent, certified by its duality gap.

    Minimizes ``(1/n) Σ loss(y_i, x_iᵀθ + b) + alpha·(l1_ratio·‖θ‖₁ + (1 − l1_ratio)/2·‖θ‖²)``
    (``penalty="l2"`` sets l1_ratio = 0, ``"l1"`` sets it to 1). The intercept b is not
    penalized.

    Parameters
    ----------
    X : array of shape (n_samples, n_features)
        numpy array or scipy.sparse matrix (in-memory engines); a dask array or a
        :class:`dask_scd.grid.Grid` runs the block-SCD engine over dask.
    y : array of shape (n_samples,)
        Targets; for classification losses any two distinct labels (mapped to ±1).
        Omitted for a Grid, which carries its labels.
    loss : {"squared", "logistic", "hinge", "squared_hinge"}
    penalty : {"l2", "l1", "elasticnet"}
    alpha : float > 0
    l1_ratio : float in [0, 1], used with ``penalty="elasticnet"``
    fit_intercept : bool
    tol : float
        Target relative duality gap ``(P − D)/|P|``.
    max_iter : int
        Epochs: passes over all coordinates (in memory) or over all blocks (dask engine).
    solver : {"auto", "gram", "scd", "sdca", "block_scd"}
        In memory, "auto" picks "gram" (coordinate descent on XᵀX/n, for the squared loss
        when n ≥ 4p and p ≤ 512), else primal SCD for L1/elastic net, and dual SDCA for the
        hinge, for p > n and for L2 problems whose dual is well conditioned
        (mean ‖x_i‖²/(alpha·n) ≤ 100), else SCD. For a dask array or a grid, "auto" fits
        in memory below ``in_memory_limit`` bytes and runs "block_scd" above.
    random_state : int, numpy Generator or None
    verbose : bool
        Print the relative gap after every epoch.
    **engine_options
        Options of the dask engine (``client``, ``blocks``, ``checkpoint``...).

    Returns
    -------
    FitResult
        ``coef_``, ``intercept_``, ``dual_gap_`` (relative), ``n_iter_``, ``history_``.
    """
    problem = check_problem(loss, penalty, alpha, l1_ratio, fit_intercept)
    check_fit_args(tol, max_iter)
    rng = np.random.default_rng(random_state)
    if _is_distributed(X):
        from dask_scd.solvers.block_scd import fit_block_scd

        return fit_block_scd(
            X, y, problem, penalty=penalty, tol=tol, max_iter=max_iter, rng=rng,
            solver=solver, verbose=verbose, **engine_options,
        )
    if engine_options:
        raise TypeError(f"unexpected arguments for in-memory data: {sorted(engine_options)}")
    X = check_matrix(X)
    y, classes = check_labels(y, X.shape[0], loss)
    solver = choose_solver(solver, problem, *X.shape, lambda: _mean_row_sq_norm(X))
    if solver == "block_scd":
        raise ValueError("solver='block_scd' needs a dask array or a Grid; got in-memory X")
    if solver == "gram":
        run = fit_gram(X, y, problem, tol=tol, max_iter=max_iter, rng=rng, verbose=verbose)
    elif solver == "scd":
        run = local.fit_scd(X, y, problem, tol=tol, max_iter=max_iter, rng=rng, verbose=verbose)
    else:
        run = local.fit_sdca(X, y, problem, tol=tol, max_iter=max_iter, rng=rng, verbose=verbose)
    return FitResult(
        coef_=run.coef,
        intercept_=run.intercept if fit_intercept else 0.0,
        dual_gap_=run.certificate.relative_gap,
        n_iter_=run.n_iter,
        history_=run.history,
        converged_=run.converged,
        solver_=solver,
        loss=loss,
        penalty=penalty,
        alpha=problem.alpha,
        l1_ratio=problem.l1_ratio,
        primal_=run.certificate.primal,
        classes_=classes,
    )


def _mean_row_sq_norm(X) -> float:
    """mean ‖x_i‖², the scale of the dual's conditioning (cheap: one pass over values)."""
    if sp.issparse(X):
        return float(np.dot(X.data, X.data)) / X.shape[0]
    return float(np.einsum("ij,ij->", X, X)) / X.shape[0]  # no n×p temporary


def _is_distributed(X) -> bool:
    """A dask array or a Grid goes to the dask engine (imports nothing when not)."""
    module = type(X).__module__
    return module.startswith("dask.") or module.startswith("dask_scd.grid")
