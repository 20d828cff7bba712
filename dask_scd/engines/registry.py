"""The registry of engines, and the one place where ``solver="auto"`` is resolved.

Adding an engine is one file and one line here: write ``run(data, problem, options) ->
Run`` (see :mod:`dask_scd.engines.base`) in ``dask_scd/engines/<name>.py`` and add its
:class:`Engine` to ``ENGINES`` below with the data it takes, the problems it solves and
the options it accepts.
Entries name their function by import path, so nothing is imported until it runs (the
dask engine's imports cost a second).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass

from dask_scd.engines import cost_model
from dask_scd.engines.block.block_newton import newton_forms_curvature
from dask_scd.engines.options import (
    BlockNewtonOptions,
    BlockSCDOptions,
    CoCoAOptions,
    DuHLOptions,
    EpochOptions,
    NoOptions,
    SDCAOptions,
)
from dask_scd.objectives import LOSSES, MULTINOMIAL, Bounds, Problem

ANY_LOSS = LOSSES
SMOOTH = ("squared", "logistic", "squared_hinge")


@dataclass(frozen=True)
class Engine:
    """One way to run a problem.

    Attributes
    ----------
    name : the ``solver=`` value.
    entry : ``"module:function"`` of its ``run(data, problem, options)``.
    data : ``"memory"`` (numpy / scipy.sparse), ``"dask"`` (dask array or Grid) or
        ``"any"`` (either, as it is given: dask input stays distributed).
    losses : the losses it solves.
    l1 : whether it solves penalties with an L1 term.
    options : the :class:`~dask_scd.engines.options.EngineOptions` of the keyword
        options it accepts (names, defaults, checks); ``callback`` among them
        (:class:`~dask_scd.engines.options.EpochOptions`) where the engine calls the
        caller's callback after every certified epoch and stops when it returns True
        (the conformance matrix checks each that declares it).
    routes : ``((kind, loss), "module:function")`` pairs: the function that runs data of
        that kind (:func:`data_kind`; None: any) and that loss (None: any) in place of
        ``entry``, the first that matches (one ``solver=`` value, one function per
        case). An in-memory engine routing "grid" runs a Grid named by ``solver=`` out
        of core (read chunk by chunk in the calling process, never materialized);
        without, a Grid is read into memory first.
    unpenalized : whether it solves ``penalty=None`` (no regularization, no dual).
    weighted : the losses it solves with sample weights.
    l2_only : the losses it solves with an L2 penalty only (no L1 term), where ``l1`` is
        True for the others.
    grid_weighted : the losses it solves with sample weights out of core on a grid.
    no_grid : the losses it does not solve on a grid.
    gpu : the losses its epochs solve on a GPU (``device="gpu"``, in-memory X), without
        sample weights (its weighted epochs run on the CPU).
    bounds : the losses it solves with coefficient bounds (``lower_bounds`` /
        ``upper_bounds``, the estimators' ``positive=True``), with sample weights where it
        takes them, on the CPU: every coordinate step clipped into the box.

    What an engine declares here is what it solves, exactly: the conformance matrix
    (tests/test_conformance.py) fits every declared combination against a reference and
    checks that every other one is refused by :meth:`refusal`, naming the engines that
    solve it.
    """

    name: str
    entry: str
    data: str
    losses: tuple = ANY_LOSS
    l1: bool = True
    options: type = NoOptions
    routes: tuple = ()
    unpenalized: bool = False
    weighted: tuple = ()
    l2_only: tuple = ()
    grid_weighted: tuple = ()
    no_grid: tuple = ()
    gpu: tuple = ()
    bounds: tuple = ()

    def entry_for(self, kind: str, loss: str) -> str:
        """The ``"module:function"`` that runs ``loss`` on data of ``kind``."""
        for (on, of), entry in self.routes:
            if on in (None, kind) and of in (None, loss):
                return entry
        return self.entry

    def load(self):
        """Its ``run(data, problem, options)``: a ``run`` that imports and runs the
        function of the data's kind and the problem's loss (:meth:`entry_for`)."""
        if not self.routes:
            return _function(self.entry)

        def run(data, problem, options):
            return _function(self.entry_for(data_kind(data), problem.loss))(data, problem, options)

        return run

    def kinds(self) -> tuple:
        """The data kinds it takes: "memory" (numpy, scipy.sparse), "dask" (a dask array)
        and "grid" (a grid store). An in-memory engine named for dask input reads X into
        memory first; one routing "grid" runs a grid out of core."""
        return ("dask", "grid") if self.data == "dask" else ("memory", "dask", "grid")

    def out_of_core(self, kind: str) -> bool:
        """Whether a grid runs through a function of its own (read chunk by chunk)."""
        return (
            kind == "grid" and self.data == "memory" and self.entry_for("grid", None) != self.entry
        )

    def refusal(
        self,
        problem: Problem,
        weighted: bool = False,
        kind: str = "memory",
        given: str | None = None,
        device: str = "cpu",
    ) -> str | None:
        """Why this engine cannot solve ``problem`` on data of ``kind`` (None if it can),
        with sample weights when ``weighted``: what it lacks, and the engines that do
        solve it (:func:`engines_solving`) on the caller's kind of data, ``given`` (dask
        input read into memory is "memory" to the engine, "dask" or "grid" to the caller).
        """
        reason = self._lacks(problem, weighted, kind, device)
        if reason is None:
            return None
        kind = given or kind
        others = engines_solving(problem, kind, weighted, device)
        where = {"memory": "in-memory X", "dask": "a dask array", "grid": "a grid"}[kind]
        where += " on a GPU" if device == "gpu" else ""
        if others:
            return f"{reason}; the engines that solve it on {where}: {others}"
        return f"{reason}; no engine solves it on {where}"

    def _lacks(
        self, problem: Problem, weighted: bool, kind: str, device: str = "cpu"
    ) -> str | None:
        name = repr(self.name)
        if device == "gpu":
            if problem.bounds is not None:
                return f"solver={name} does not take coefficient bounds on a GPU"
            if problem.loss not in self.gpu or self.out_of_core(kind):
                return f"solver={name} runs loss={problem.loss!r} on the CPU only"
            if weighted:
                return (
                    f"solver={name} solves sample weights by its CPU epochs only; pass device='cpu'"
                )
        if kind not in self.kinds():
            return f"solver={name} needs a dask array or a Grid, got in-memory X"
        if problem.loss not in self.losses:
            if problem.loss == "hinge":
                return (
                    f"solver={name} needs a smooth loss (loss='squared_hinge' is one), "
                    "got loss='hinge'"
                )
            return f"solver={name} solves loss in {self.losses}, got loss={problem.loss!r}"
        if kind == "grid" and problem.loss in self.no_grid:
            return f"solver={name} does not fit loss={problem.loss!r} on a grid"
        if problem.unpenalized and not self.unpenalized:
            return (
                f"solver={name} needs a penalty: penalty=None (no regularization, so no "
                "duality gap) is fitted in memory"
            )
        if problem.l1_ratio > 0 and (not self.l1 or problem.loss in self.l2_only):
            return (
                f"solver={name} solves loss={problem.loss!r} with an L2 penalty only, got "
                f"an L1 term (l1_ratio={problem.l1_ratio})"
            )
        if weighted:
            losses = self.grid_weighted if self.out_of_core(kind) else self.weighted
            if problem.loss not in losses:
                how = " out of core on a grid" if self.out_of_core(kind) else ""
                return (
                    f"solver={name} does not take sample weights (given to fit or stored "
                    f"in the grid) for loss={problem.loss!r}{how}"
                )
        if problem.bounds is not None and (
            problem.loss not in self.bounds or self.out_of_core(kind)
        ):
            return (
                f"solver={name} does not take coefficient bounds (lower_bounds, "
                f"upper_bounds, positive=True) for loss={problem.loss!r}"
            )
        return None


def engines_solving(
    problem: Problem, kind: str = "memory", weighted: bool = False, device: str = "cpu"
) -> list:
    """The engines that solve ``problem`` on data of ``kind`` ("memory", "dask", "grid"),
    with sample weights when ``weighted``, on ``device`` ("cpu", "gpu"), as declared."""
    return [
        name
        for name, engine in ENGINES.items()
        if engine._lacks(problem, weighted, kind, device) is None
    ]


def weighted_engines(loss: str) -> list[str]:
    """The engines that solve ``loss`` with sample weights (in memory)."""
    return [name for name, engine in ENGINES.items() if loss in engine.weighted]


def bounded_engines(loss: str) -> list[str]:
    """The engines that solve ``loss`` with coefficient bounds."""
    return [name for name, engine in ENGINES.items() if loss in engine.bounds]


def auto_among(problem: Problem, weighted: bool, among=None) -> list | None:
    """The engines of ``among`` (None: all) that ``solver="auto"`` may pick in memory: only
    those that take the sample weights and the coefficient bounds, where there are."""
    if weighted:
        among = [name for name in weighted_engines(problem.loss) if among is None or name in among]
    if problem.bounds is not None:
        among = [name for name in bounded_engines(problem.loss) if among is None or name in among]
    return among


def _function(entry: str):
    module, function = entry.split(":")
    return getattr(importlib.import_module(module), function)


# Every engine, by its ``solver=`` name.
ENGINES: dict[str, Engine] = {
    engine.name: engine
    for engine in (
        Engine(
            "gram",
            "dask_scd.engines.local.gram:fit_gram",
            "memory",
            options=EpochOptions,
            losses=("squared",),
            weighted=("squared",),
        ),
        Engine(
            "scd",
            "dask_scd.engines.local.scd:fit_scd",
            "memory",
            options=EpochOptions,
            losses=SMOOTH,
            weighted=SMOOTH,
            gpu=SMOOTH,
            bounds=SMOOTH,
        ),
        # Out of core on a grid SDCA solves the unweighted problem only (grid_weighted is empty):
        # its chunk epochs and certificate have no weights.
        Engine(
            "sdca",
            "dask_scd.engines.local.sdca:fit_sdca",
            "memory",
            l1=False,
            options=SDCAOptions,
            routes=((("grid", None), "dask_scd.engines.local.sdca_grid:fit_sdca_grid"),),
            weighted=ANY_LOSS,
            gpu=ANY_LOSS,
        ),
        Engine(
            "newton",
            "dask_scd.engines.newton.newton:fit_newton",
            "memory",
            options=EpochOptions,
            losses=(*SMOOTH, "hinge", MULTINOMIAL),
            routes=(
                ((None, "hinge"), "dask_scd.engines.newton.hinge_newton:fit_hinge_newton"),
                ((None, MULTINOMIAL), "dask_scd.engines.newton.multinomial:fit_multinomial"),
            ),
            unpenalized=True,
            weighted=(*SMOOTH, MULTINOMIAL),
        ),
        Engine(
            "lbfgs",
            "dask_scd.engines.newton.lbfgs:fit_lbfgs",
            "memory",
            options=EpochOptions,
            losses=SMOOTH,
            l1=False,
            weighted=SMOOTH,
        ),
        Engine(
            "duhl",
            "dask_scd.engines.local.duhl:fit_duhl",
            "memory",
            options=DuHLOptions,
            routes=((("grid", None), "dask_scd.engines.local.duhl:fit_grid"),),
            weighted=ANY_LOSS,
            grid_weighted=ANY_LOSS,
            l2_only=("hinge",),
        ),
        # Block SCD runs a dask array or a Grid on the cluster, and in-memory X in this process
        # (dask_scd.engines.block.block_memory: the same steps, the row chunks on threads).
        Engine(
            "block_scd",
            "dask_scd.engines.block.block_scd:fit_block_scd",
            "any",
            losses=SMOOTH,
            options=BlockSCDOptions,
            routes=((("memory", None), "dask_scd.engines.block.block_memory:fit_block_memory"),),
            weighted=SMOOTH,
            bounds=SMOOTH,
        ),
        Engine(
            "block_newton",
            "dask_scd.engines.block.block_newton:fit_block_newton",
            "dask",
            losses=(*SMOOTH, MULTINOMIAL),
            options=BlockNewtonOptions,
            routes=(
                (
                    (None, MULTINOMIAL),
                    "dask_scd.engines.newton.multinomial_dask:fit_multinomial_dask",
                ),
            ),
            weighted=(*SMOOTH, MULTINOMIAL),
            l2_only=(MULTINOMIAL,),
            no_grid=(MULTINOMIAL,),
        ),
        Engine(
            "cocoa",
            "dask_scd.engines.cocoa.cocoa:fit_cocoa",
            "any",
            options=CoCoAOptions,
            weighted=ANY_LOSS,
            l2_only=("hinge",),
        ),
    )
}

SOLVERS = ("auto", *ENGINES)


def get(solver: str) -> Engine:
    if solver not in ENGINES:
        names = ", ".join(map(repr, SOLVERS))
        raise ValueError(f"solver={solver!r} is not one of {names}")
    return ENGINES[solver]


def data_kind(data) -> str:
    """ "memory" (:class:`~dask_scd.data.memory.InMemory`), "grid" (a grid source) or
    "dask" (a dask array's source)."""
    from dask_scd.data.memory import InMemory

    if isinstance(data, InMemory):
        return "memory"
    return "grid" if getattr(data, "on_disk", False) else "dask"


def resolve(solver: str, problem: Problem, data, among=None, given: str | None = None) -> Engine:
    """The engine that runs: ``solver`` checked against the problem, or ``"auto"`` decided.

    ``data`` is :class:`~dask_scd.data.memory.InMemory`, or a dask source (which goes to
    the dask engine: :func:`dask_scd.engines.planner.runs_in_memory` has already said it
    stays distributed). ``among`` restricts the engines ``"auto"`` may pick (those with
    GPU kernels, say). ``given``: the kind of the caller's X (:func:`data_kind`), where
    dask input was read into memory: what a refusal is about, and which engines it names.
    """
    kind = data_kind(data)
    weighted = getattr(data, "weighted", False)
    on_cluster = solver == "auto" and kind != "memory"
    if solver == "auto" and kind == "memory":
        solver = _auto_in_memory(problem, data, auto_among(problem, weighted, among))
    elif on_cluster:
        solver = "block_newton" if problem.loss == MULTINOMIAL else dask_auto(data, problem)
    engine = get(solver)
    reason = engine.refusal(problem, weighted, kind, given)
    if reason is not None and on_cluster:  # auto has no Dask engine for it: say how to fit it
        raise ValueError(
            f"X is above in_memory_limit, so solver='auto' runs a Dask engine, and none "
            f"solves this problem on it ({reason}); pass a larger in_memory_limit to fit "
            "it in memory"
            + (
                ", or fit one binary model per class on the cluster with "
                "LogisticRegression(multi_class='ovr')"
                if problem.loss == MULTINOMIAL
                else ""
            )
        )
    if reason is not None:
        raise ValueError(reason)
    return engine


def dask_auto(source, problem: Problem) -> str:
    """The Dask engine that ``solver="auto"`` runs on ``source`` (see :func:`dask_choice`)."""
    return dask_choice(source, problem)[0]


def dask_choice(source, problem: Problem) -> tuple[str, str]:
    """(engine, the rule that chose it) of ``solver="auto"`` on the cluster, for a binary
    loss.

    Block Newton where it forms the p × p curvature (a few steps of one read each).
    Wider: block SCD for an L1 term, and for L2 too on a grid of pure blocks whose epochs
    run collectively (exact block steps, one task per worker and iteration: Criteo-like
    500k × 611k, 2 workers, to 1e-6: logistic at 1/n 4.95 s against block Newton's 5.83 s,
    at 0.1/n 9.33 s against 14.8 s, squared loss 4.92 s against 4.51 s; 2M rows at 1/n
    9.63 s against 10.2 s); else block Newton by conjugate gradients on curvature products
    (5–10 steps of 2 + CG reads, one reduction per read: a task graph of block SCD pays
    the scheduler's latency per block)."""
    if problem.bounds is not None:
        return "block_scd", "coefficient bounds: block SCD, whose steps clip into the box"
    if newton_forms_curvature(source):
        return "block_newton", "block Newton forms the p × p curvature of the row chunks"
    from dask_scd.engines.block.block_scd import collective_on_pure_blocks

    if problem.l1 > 0.0 or collective_on_pure_blocks(source):
        return "block_scd", (
            "wide X: block SCD (an L1 term, or L2 on a grid of pure blocks run collectively)"
        )
    return "block_newton", "wide X: block Newton by conjugate gradients on curvature products"


def _auto_in_memory(problem: Problem, data, among=None) -> str:
    """The applicable engine (of ``among``, if given) with the fewest predicted passes."""
    if problem.unpenalized or problem.loss == MULTINOMIAL:
        return "newton"  # the one engine without a dual, and of the softmax loss
    costs = cost_model.predicted_passes(problem, data)
    if among is not None:
        costs = {name: cost for name, cost in costs.items() if name in among}
        if not costs:  # e.g. only "gram" applied: the primal runs its regime
            fallback = [
                name
                for name in ("scd", "newton", *among)
                if name in among and get(name).refusal(problem) is None
            ]
            costs = {fallback[0] if fallback else "scd": 1.0}
    return min(costs, key=costs.get)


def capability_table() -> str:
    """The capability matrix of every engine, as a markdown page (docs/capabilities.md,
    which a test keeps equal to this): the data kinds it takes, the problems it solves on
    each, with and without sample weights, read from the declarations alone."""
    losses = (*ANY_LOSS, MULTINOMIAL)
    lines = [
        "# Capability matrix",
        "",
        "Generated from the engine registry (`dask_scd.engines.registry.capability_table`;",
        "`tests/test_conformance.py` checks this page against it, and fits every combination",
        "marked here against an independent reference). A cell lists the losses the engine",
        "solves on that data kind and penalty: `sq` squared, `log` logistic, `hinge`,",
        "`sqh` squared hinge, `mn` multinomial; `w:` those it also solves with sample",
        "weights. Any other combination is refused with a ValueError that names the engines",
        "that solve it. In-memory engines named for dask input read X into memory first; on a",
        "grid, `sdca` runs out of core. On a GPU the engines' epochs run as CUDA kernels on",
        "X in memory, L1 terms included where the CPU engine takes them (the block engines",
        "run a dask array of cupy chunks on its GPUs: docs/gpu.md). `bounds`: the losses",
        "it solves with coefficient bounds (`lower_bounds` / `upper_bounds`, `positive=True`),",
        "with every penalty and, where it takes them, sample weights.",
        "",
        "| engine | data kind | l2 | l1 / elasticnet | penalty=None "
        '| GPU (`device="gpu"`) | bounds |',
        "|---|---|---|---|---|---|---|",
    ]
    short = {
        "squared": "sq",
        "logistic": "log",
        "hinge": "hinge",
        "squared_hinge": "sqh",
        MULTINOMIAL: "mn",
    }
    box = Bounds([0.0], [1.0])
    for name, engine in ENGINES.items():
        for kind in engine.kinds():

            def solved(penalty, weighted=False, bounds=None):
                return [
                    short[loss]
                    for loss in losses
                    if _solves(engine, kind, loss, penalty, weighted, bounds)
                ]

            cells = []
            for penalty in ("l2", "l1", None):
                plain, weighted = solved(penalty), solved(penalty, weighted=True)
                cells.append(
                    ", ".join(plain) + f"; w: {', '.join(weighted) or '—'}" if plain else "—"
                )
            gpu = [short[loss] for loss in losses if loss in engine.gpu]
            cells.append(
                ", ".join(gpu) + " (unweighted)" if gpu and not engine.out_of_core(kind) else "—"
            )
            cells.append(", ".join(solved("l2", bounds=box)) or "—")
            where = kind + (" (out of core)" if engine.out_of_core(kind) else "")
            lines.append(f"| `{name}` | {where} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _solves(engine: Engine, kind: str, loss: str, penalty, weighted: bool, bounds) -> bool:
    """Whether ``engine`` solves ``loss`` with ``penalty`` (and ``bounds``) on ``kind``, as
    declared."""
    from dask_scd.validation import check_problem

    try:  # what no engine solves (the hinge with L1) is refused before any engine
        problem = check_problem(loss, penalty, 1.0, 0.5, True)
    except ValueError:
        return False
    if bounds is not None:
        problem = dataclasses.replace(problem, bounds=bounds)
    return engine._lacks(problem, weighted, kind) is None
