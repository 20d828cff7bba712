"""The planner: for :func:`dask_scd.fit` and :func:`dask_scd.path` alike, where a fit runs
(in memory or on the cluster), its engine, its device, whether Newton finishes it, and why.

The registry (:mod:`dask_scd.engines.registry`) declares what each engine solves and
holds the cost model of ``solver="auto"``; this module is the one that applies them to a
fit. No other module chooses an engine: ``fit`` and ``path`` ask here and run what they
are told, and every result carries the plan (``extras_["plan"]``: the engine, the device,
the rule that fired and, where the cost model decided, its predicted passes).
"""

from __future__ import annotations

from dataclasses import dataclass

from dask_scd.engines import cost_model, registry
from dask_scd.engines.options import IN_MEMORY_LIMIT
from dask_scd.objectives import MULTINOMIAL, Problem
from dask_scd.validation import TaskOverheadWarning, warn

# The coordinate engines "auto" may choose for an L1 term in memory; where one stops
# short of tol (coordinate descent crawls near a lasso's interpolating end when X has no
# full column rank, which p ≥ n only hints at: LassoCV's refit on 57 rows of rank 15,
# p = 30, stopped at a gap of 1e-2 after 1000 SCD epochs), proximal Newton finishes from
# its iterate, as the paths do.
HANDS_OVER = ("scd", "gram")
# The in-memory engines that start from a given (θ, b) (Options.start): a path's warm
# points choose among them.
WARM_ENGINES = ("gram", "scd", "newton")
# The task overhead of a Dask engine named for small data: the scheduler's time per task
# (dispatch, bookkeeping, a round trip: ~1 ms on a local cluster), the stored values the
# kernels pass per second on one core, and the ratio of the two per epoch above which a
# fit is warned (569 × 30 dense in chunks of 100 × 10: ~24 tasks an epoch against 17k
# values; 8–19 s of block SCD on a shared 2-core machine for what takes milliseconds
# in memory).
TASK_SECONDS = 1e-3
VALUES_PER_SECOND = 1e8
OVERHEAD_RATIO = 10.0
# Block Newton's passes over the row chunks per step: gradient with certificate,
# curvature (or its products), line search.
_NEWTON_PASSES = 4


@dataclass(frozen=True)
class Plan:
    """What runs, where, and why: the :class:`~dask_scd.engines.registry.Engine`, the
    ``device`` ("cpu" or "gpu"), the ``rule`` that chose the engine ("named" when the caller
    did) and the cost model's predicted ``passes`` over X of the engines it weighed (or
    None)."""

    engine: registry.Engine
    device: str
    rule: str
    passes: dict | None = None

    def as_dict(self) -> dict:
        """The plan as the results report it (``extras_["plan"]``)."""
        return {
            "engine": self.engine.name,
            "device": self.device,
            "rule": self.rule,
            "predicted_passes": self.passes,
        }


def runs_in_memory(solver: str, source, problem: Problem, limit: int) -> bool:
    """Whether a fit of dask input (``source``, a dask array's or a grid's) runs in memory:
    under ``"auto"`` below ``limit`` stored bytes (the local kernels beat any cluster's task
    overhead there), or a weighted fit whose Dask engine would not solve the weights (said
    in a warning); a named in-memory engine always, unless it runs a grid out of core
    (:meth:`~dask_scd.engines.registry.Engine.out_of_core`)."""
    if solver != "auto":
        engine = registry.get(solver)
        return engine.data == "memory" and not (source.on_disk and engine.out_of_core("grid"))
    if auto_in_memory(source.nbytes, limit):
        return True
    if (
        source.weighted
        and problem.loss not in registry.get(registry.dask_auto(source, problem)).weighted
    ):
        warn(
            f"the Dask engine for this problem does not solve sample weights: this weighted "
            f"fit brings X ({source.nbytes / 2**20:.0f} MiB stored) into memory"
        )
        return True
    return False


def auto_in_memory(nbytes: int, limit: int = IN_MEMORY_LIMIT) -> bool:
    """Whether ``solver="auto"`` fits dask input of ``nbytes`` stored bytes in memory
    (the estimators ask before they choose one softmax model or one-vs-rest)."""
    return nbytes <= limit


def plan(
    solver: str,
    problem: Problem,
    data,
    *,
    requested: str = "cpu",
    available: str = "cpu",
    on_device: bool = False,
    given: str | None = None,
    options=(),
) -> Plan:
    """The plan of a fit of ``data`` (in memory, or a dask source that stays there).

    Parameters
    ----------
    solver : str
        The caller's ``solver=`` ("auto" or an engine's name).
    problem : Problem
    data : InMemory or Source
    requested, available : {"cpu", "gpu", "auto"}, {"cpu", "gpu"}
        The caller's ``device=`` and what this machine has.
    on_device : bool
        A dask array of cupy chunks.
    given : {"memory", "dask", "grid"} or None
        The kind of the caller's X (dask input read into memory is "memory" here).
    options : iterable of str
        The names of the engine options passed.
    """
    engine = registry.resolve(solver, problem, data, given=given)
    if solver != "auto":
        warn_of_task_overhead(engine.name, data)
    rule, passes = _why(solver, problem, data)
    if solver == "auto" and engine.name == "block_newton" and _keeps_a_budget(options):
        engine, rule = registry.get("block_scd"), "a memory budget is block SCD's to keep"
    device = _device(engine, solver, problem, data, requested, available, on_device, given)
    if isinstance(device, Plan):  # auto again, among the engines with GPU kernels
        return device
    return Plan(engine, device, rule, passes)


def tasks_per_epoch(engine: str, source) -> int | None:
    """The tasks an epoch of the Dask engine ``engine`` submits on ``source`` (a dask
    array's or a grid's), about: block SCD, a stage of one task per row chunk and their
    sum and step for every column block; block Newton, a few passes of one task per row
    chunk and their sum. None for an engine that does not run there as a task graph."""
    if registry.data_kind(source) == "memory" or engine not in ("block_scd", "block_newton"):
        return None
    row_chunks, blocks = source.n_row_chunks, len(source.blocks)
    if engine == "block_scd":
        return blocks * (row_chunks + 2)
    return _NEWTON_PASSES * (row_chunks + 1)


def warn_of_task_overhead(engine: str, source) -> None:
    """A :class:`~dask_scd.validation.TaskOverheadWarning` when the Dask engine named
    for ``source`` will spend its epochs on the scheduler's tasks (:data:`TASK_SECONDS`
    each) rather than on arithmetic (its stored values at :data:`VALUES_PER_SECOND`):
    what was found, and what to do."""
    tasks = tasks_per_epoch(engine, source)
    if tasks is None:
        return
    values = source.nnz if source.nnz is not None else source.n_samples * source.n_features
    overhead, arithmetic = tasks * TASK_SECONDS, values / VALUES_PER_SECOND
    if overhead < OVERHEAD_RATIO * arithmetic:
        return
    row_chunks, blocks = source.n_row_chunks, len(source.blocks)
    warn(
        f"solver={engine!r} on X of {source.n_samples} rows × {source.n_features} columns "
        f"in {_count(row_chunks, 'row chunk')} × {_count(blocks, 'column block')} "
        f"({row_chunks * blocks} cells, {source.n_samples / row_chunks:.0f} rows per row "
        "chunk): an epoch "
        f"submits about {tasks} tasks, ~{overhead * 1e3:.0f} ms of task overhead against "
        f"~{arithmetic * 1e3:.2g} ms of arithmetic ({values} stored values), so the "
        "scheduler will dominate the fit. Use larger chunks (fewer row chunks and column "
        "blocks: X.rechunk(...)), or solver='auto', which fits data this small in memory.",
        TaskOverheadWarning,
    )


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" + ("" if n == 1 else "s")


def _keeps_a_budget(options) -> bool:
    """Whether the options passed name one that block SCD takes and block Newton does not
    (its residency policies within a memory budget)."""
    block_scd = registry.get("block_scd").options.names()
    return bool(set(options) & (set(block_scd) - set(registry.get("block_newton").options.names())))


def point_plan(
    solver: str, problem: Problem, data, *, requested: str, available: str, warm: bool
) -> Plan:
    """The plan of one point of an in-memory path: with ``solver="auto"`` and a warm start
    on the CPU, the cheapest of the engines that start from it (SDCA's dual iterate
    cannot: Adult, 10 logistic L2 points from C = 0.01 to 10, 0.9 s by Newton alone
    against 7.4 s with SDCA's five cold starts); else as :func:`plan`."""
    if solver == "auto" and warm and available == "cpu" and problem.loss != "hinge":
        # With an L1 term, not the Gram engine: its coordinate epochs on the Gram matrix
        # stall on correlated columns at small alphas (Adult lasso at 1e-3·alpha_max:
        # relative gap 8e-3 after 1000 epochs, where Newton certifies 2e-10 in 2 steps).
        among = WARM_ENGINES[1:] if problem.l1 > 0.0 else WARM_ENGINES
        return _cheapest(problem, data, list(among), "cpu", "warm start")
    return plan(solver, problem, data, requested=requested, available=available)


def fit_hands_over(solver: str, engine, run, data, problem: Problem, tol: float) -> bool:
    """Whether the in-memory run that ``solver="auto"`` chose ends in Newton's: a
    coordinate engine (:data:`HANDS_OVER`, which take no options) short of tol on an L1
    problem, without a callback stop, where Newton solves the problem."""
    return (
        solver == "auto"
        and engine.name in HANDS_OVER
        and registry.data_kind(data) == "memory"
        and problem.l1 > 0.0
        and not run.stopped_by_callback
        and not run.converged(tol)
        and registry.get("newton").refusal(problem, data.weighted) is None
    )


def point_hands_over(solver: str, engine, gap: float, tol: float) -> bool:
    """Whether a path's point that ``solver="auto"`` chose ends in Newton's: any engine
    but Newton short of tol (the Gram engine's rounding floor on correlated columns)."""
    return gap > tol and solver == "auto" and engine.name != "newton"


def _device(engine, solver, problem, data, requested, available, on_device, given):
    """Where the epochs run ("cpu" or "gpu"), or a new :class:`Plan` when ``auto`` picks
    again among the engines with GPU kernels.

    The Dask engines run where the chunks are: chunks in device memory (a dask array of
    cupy arrays) take the cells' CUDA kernels, which ``device="gpu"`` or ``"auto"`` must
    allow; host chunks and grids (read from disk into host memory) run on the CPU.
    """
    kind = registry.data_kind(data)
    if engine.data != "memory" and kind != "memory":
        if on_device and requested == "cpu":
            raise ValueError(
                "the chunks of X are in device memory (cupy): pass device='gpu' "
                "(or 'auto') to run the block engines' CUDA kernels on them, or "
                "move them to the host (X.map_blocks(cupy.asnumpy))"
            )
        if not on_device and requested == "gpu":
            raise ValueError(
                "device='gpu' with dask input runs on chunks in device memory: "
                "make them cupy arrays (X.map_blocks(cupy.asarray)); a grid's "
                "cells are read into host memory"
            )
        return "gpu" if on_device else "cpu"
    if available == "cpu":
        return "cpu"
    weighted = getattr(data, "weighted", False)
    reason = engine.refusal(problem, weighted, kind, given, device="gpu")
    if reason is None:
        return "gpu"
    if requested == "auto":  # the GPU where the engine's epochs run there, else the CPU
        return "cpu"
    among = registry.engines_solving(problem, kind, weighted, device="gpu")
    if solver == "auto" and among:
        # Among the engines with GPU kernels (the Gram engine's regime, n ≥ 4p, is then
        # the primal's: p coordinates, not n).
        return _cheapest(problem, data, among, "gpu", "on the GPU")
    raise ValueError(f"device='gpu': {reason}")


def _cheapest(problem, data, among: list, device: str, why: str) -> Plan:
    """The plan of the engine of ``among`` with the fewest predicted passes."""
    engine = registry.resolve("auto", problem, data, among=among)
    rule = f"{why}: the fewest predicted passes of {among}"
    return Plan(engine, device, rule, _passes(problem, data, among))


def _why(solver, problem, data) -> tuple[str, dict | None]:
    """The rule that chose the engine, and the cost model's passes where it decided."""
    if solver != "auto":
        return "named", None
    if registry.data_kind(data) != "memory":
        if problem.loss == MULTINOMIAL:
            return "the softmax loss on the cluster: block Newton", None
        return registry.dask_choice(data, problem)[1], None
    if problem.unpenalized or problem.loss == MULTINOMIAL:
        return "the one engine of penalty=None and of the softmax loss", None
    among = registry.auto_among(problem, data.weighted)
    return "the fewest predicted passes over X", _passes(problem, data, among)


def _passes(problem, data, among=None) -> dict:
    """The cost model's predicted passes (of ``among``, when given)."""
    costs = cost_model.predicted_passes(problem, data)
    return {name: float(cost) for name, cost in costs.items() if among is None or name in among}
