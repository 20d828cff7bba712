"""The registry of engines, and the one place where ``solver="auto"`` is resolved.

Adding an engine is one file and one line here: write ``run(data, problem, options) ->
Run`` (see :mod:`dask_scd.solvers.base`) in ``dask_scd/solvers/<name>.py`` and register
it below with the data it takes, the problems it solves and the options it accepts.
Entries name their function by import path, so nothing is imported until it runs (the
dask engine's imports cost a second).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from dask_scd.objectives import LOSSES, Problem

ANY_LOSS = LOSSES
SMOOTH = ("squared", "logistic", "squared_hinge")


@dataclass(frozen=True)
class Engine:
    """One way to run a problem.

    Attributes
    ----------
    name : the ``solver=`` value.
    entry : ``"module:function"`` of its ``run(data, problem, options)``.
    data : ``"memory"`` (numpy / scipy.sparse) or ``"dask"`` (dask array or Grid).
    losses : the losses it solves.
    l1 : whether it solves penalties with an L1 term.
    options : names of the keyword options it accepts.
    """

    name: str
    entry: str
    data: str
    losses: tuple = ANY_LOSS
    l1: bool = True
    options: tuple = ()

    def load(self):
        module, function = self.entry.split(":")
        return getattr(importlib.import_module(module), function)

    def refusal(self, problem: Problem) -> str | None:
        """Why this engine cannot solve ``problem`` (None if it can)."""
        if problem.loss not in self.losses:
            if problem.loss == "hinge":
                return (f"solver={self.name!r} needs a smooth loss; loss='hinge' is solved by "
                        "solver='sdca' (in memory), or use loss='squared_hinge'")
            return f"solver={self.name!r} solves loss in {self.losses}, got loss={problem.loss!r}"
        if problem.l1_ratio > 0 and not self.l1:
            return (f"solver={self.name!r} solves L2 problems only; use solver='scd' for "
                    "L1/elasticnet")
        return None


ENGINES: dict[str, Engine] = {}


def register(engine: Engine) -> Engine:
    ENGINES[engine.name] = engine
    return engine


register(Engine("gram", "dask_scd.solvers.gram:fit_gram", "memory", losses=("squared",)))
register(Engine("scd", "dask_scd.solvers.local:fit_scd", "memory", losses=SMOOTH))
register(Engine("sdca", "dask_scd.solvers.local:fit_sdca", "memory", l1=False))
register(Engine("duhl", "dask_scd.solvers.duhl:fit_duhl", "memory", options=(
    "memory_budget", "local_epochs", "residency", "chunk_size", "gap_refresh", "certify_every")))
_CLUSTER_OPTIONS = ("client", "selection", "checkpoint", "checkpoint_every", "resume", "callback")
register(Engine("block_scd", "dask_scd.solvers.block_scd:fit_block_scd", "dask", losses=SMOOTH,
                options=(*_CLUSTER_OPTIONS, "residency", "memory_budget")))
register(Engine("block_newton", "dask_scd.solvers.block_newton:fit_block_newton", "dask",
                losses=SMOOTH, options=_CLUSTER_OPTIONS))

SOLVERS = ("auto", *ENGINES)
# Above this many features H = XᵀX/n costs more than the epochs it saves (n·p²/2 flops
# against ~10–30 SCD epochs of n·p) and no longer fits in cache.
GRAM_MAX_FEATURES = 512
# Options of fit itself for dask input (not of an engine).
DATA_OPTIONS = ("blocks", "in_memory_limit")
IN_MEMORY_LIMIT = 256 * 2**20


def get(solver: str) -> Engine:
    if solver not in ENGINES:
        names = ", ".join(map(repr, SOLVERS))
        raise ValueError(f"solver={solver!r} is not one of {names}")
    return ENGINES[solver]


def runs_in_memory(solver: str, nbytes: int, in_memory_limit: int = IN_MEMORY_LIMIT) -> bool:
    """Whether a fit of dask input runs in memory: with ``"auto"`` below ``in_memory_limit``
    bytes (the local kernels beat any cluster's task overhead there), and whenever an
    in-memory engine is asked for by name."""
    if solver == "auto":
        return nbytes <= in_memory_limit
    return get(solver).data == "memory"


def resolve(solver: str, problem: Problem, data) -> Engine:
    """The engine that runs: ``solver`` checked against the problem, or ``"auto"`` decided.

    ``data`` is :class:`~dask_scd.solvers.base.InMemory`, or a dask source (which goes to
    the dask engine: :func:`runs_in_memory` has already said it stays distributed).
    """
    from dask_scd.solvers.base import InMemory

    in_memory = isinstance(data, InMemory)
    if solver == "auto":
        solver = _auto_in_memory(problem, *data.shape, data) if in_memory else _auto_dask(data)
        if not in_memory and problem.loss == "hinge":
            raise ValueError(
                "the block-SCD engine needs a smooth loss; for the hinge use "
                "loss='squared_hinge', or fit in memory with solver='sdca'"
            )
    engine = get(solver)
    reason = engine.refusal(problem)
    if reason is not None:
        raise ValueError(reason)
    if engine.data == "dask" and in_memory:
        raise ValueError(f"solver={solver!r} needs a dask array or a Grid; got in-memory X")
    return engine


# Block Newton forms the p × p curvature per row chunk: n·p² flops for dense cells, about
# n·(nnz per row)² for sparse ones. Below these it beats block SCD's epochs (and their task
# round trips) on every data set measured; above, block SCD runs.
NEWTON_MAX_FEATURES = 2048
NEWTON_MAX_ROW_COST = 256**2


def _auto_dask(source) -> str:
    n, p = source.n_samples, source.n_features
    per_row = source.nbytes / max(n, 1) / 8.0  # stored values per row (dense: p)
    if p <= NEWTON_MAX_FEATURES and min(per_row, p) ** 2 <= NEWTON_MAX_ROW_COST:
        return "block_newton"
    return "block_scd"


def _auto_in_memory(problem: Problem, n_samples: int, n_features: int, data) -> str:
    """L1 and elastic net need the primal (SCD). For L2 problems the dual (SDCA) converges
    at a rate set by ``mean ‖x_i‖² / (αn)`` alone, blind to correlated or collinear features
    (one-hot groups summing to the intercept) that slow primal coordinate descent down; it
    is chosen unless that ratio is large, and always for the hinge and for p > n. For the
    squared loss with n ≫ p, coordinate descent on the Gram matrix XᵀX/n ("gram") beats
    both: one pass over X, then O(p) per coordinate step and per certificate.
    """
    if (problem.loss == "squared" and n_features <= GRAM_MAX_FEATURES
            and n_samples >= 4 * n_features):
        return "gram"
    if problem.l1_ratio > 0:
        return "scd"
    if problem.loss == "hinge" or n_features > n_samples:
        return "sdca"
    if data.mean_row_sq_norm / (problem.alpha * n_samples) <= 100.0:
        return "sdca"
    return "scd"
