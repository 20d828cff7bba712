"""``dask_scd.fit``: validate once, pick the engine, run it, build the one result object."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from dask_scd.data import in_memory, make_source, read_input
from dask_scd.data.memory import InMemory
from dask_scd.engines import planner, registry
from dask_scd.engines.base import Options, Run
from dask_scd.engines.options import DataOptions, EpochOptions, engine_options
from dask_scd.grid.kinds import is_grid
from dask_scd.kernels import device as kernel_device
from dask_scd.progress import Progress
from dask_scd.result import FitResult
from dask_scd.runtime.session import fit_session
from dask_scd.validation import (
    check_bounds,
    check_fit_args,
    check_problem,
    check_random_state,
    check_start,
    is_dask,
    warn,
)


def fit(
    X,
    y=None,
    *,
    loss: str = "squared",
    penalty: str | None = "l2",
    alpha: float = 1.0,
    l1_ratio: float = 0.5,
    fit_intercept: bool = True,
    tol: float = 1e-6,
    max_iter: int = 1000,
    solver: str = "auto",
    random_state=None,
    verbose: bool = False,
    device: str = "cpu",
    sample_weight=None,
    coef_init=None,
    intercept_init: float | None = None,
    lower_bounds=None,
    upper_bounds=None,
    **engine_options,
) -> FitResult:
    """Fit a regularized linear model by coordinate descent, certified by its duality gap.

    Minimizes ``(1/n) Σ loss(y_i, x_iᵀθ + b) + alpha·(l1_ratio·‖θ‖₁ + (1 − l1_ratio)/2·‖θ‖²)``
    (``penalty="l2"`` sets l1_ratio = 0, ``"l1"`` sets it to 1). The intercept b is not
    penalized. With ``sample_weight`` w the loss term is ``(1/Σw) Σ w_i loss(...)``.

    Parameters
    ----------
    X : array of shape (n_samples, n_features), dask array or DataFrame, Grid, xarray object
        or path
        numpy array or scipy.sparse matrix (in-memory engines); a dask array or a
        :class:`dask_scd.grid.Grid` runs the block engines over dask. A dask DataFrame is
        the dask array of its numeric columns, its partition lengths computed once (with
        y's, when y is a dask Series or one-column DataFrame). An xarray DataArray
        or Dataset is read by :func:`dask_scd.data.read_input`; a path names a grid store
        (directory) or a libsvm file, which carry their labels (pass ``y=None``).
    y : array of shape (n_samples,)
        Targets; for classification losses any two distinct labels (mapped to ±1); for
        "multinomial" two or more labels.
        Omitted for a Grid, which carries its labels.
    loss : {"squared", "logistic", "hinge", "squared_hinge", "multinomial"}
        "multinomial": the softmax loss of K classes, one coefficient vector and intercept
        per class (``coef_`` of shape (K, n_features), ``intercept_`` (K,)), fitted in
        memory by "newton", and over dask by "block_newton" (a dask array above
        ``in_memory_limit``, L2 penalty; an L1 term or a grid there raises a
        ValueError: ``LogisticRegression(multi_class="ovr")`` fits binary models).
    penalty : {"l2", "l1", "elasticnet"} or None
        None (losses "squared", "logistic", "multinomial"): no regularization, alpha ignored, fitted
        by "newton" in memory (other solvers raise a ValueError). Without a penalty there
        is no dual: the fit stops at ``‖∇P‖∞ ≤ tol·max(1, |P|)`` (the intercept's
        derivative included), reported as ``grad_norm_``, with ``dual_gap_`` NaN.
    alpha : float > 0
    l1_ratio : float in [0, 1], used with ``penalty="elasticnet"``
    fit_intercept : bool
    tol : float
        Target relative duality gap ``(P − D)/|P|``.
    max_iter : int
        Iterations of the engine that runs: epochs (passes over all coordinates, or over
        all blocks for block SCD), Newton steps ("newton", "block_newton"), rounds ("duhl").
    solver : {"auto", "gram", "scd", "sdca", "newton", "duhl", "block_scd", "block_newton", "cocoa"}
        The engine (:mod:`dask_scd.engines.registry` lists them all). In memory, "auto"
        takes the applicable engine with the fewest predicted passes over X
        (:func:`dask_scd.engines.cost_model.predicted_passes`): "gram" for the squared loss
        with n ≥ 4p and p ≤ 512; for the hinge "newton" (smoothed) when p < 2000 unless
        "sdca" is predicted to need fewer than ~60 epochs; for other L2 problems "sdca" when
        its dual is well conditioned (≈ 10·mean‖x_i‖²/(alpha·n) epochs), else proximal Newton
        ("newton"); for L1/elastic net "newton" when p ≤ 2000 and the loss is not squared,
        else "scd" (working sets, extrapolation). For a dask array or a grid, "auto" fits in
        memory below ``in_memory_limit`` bytes (stored bytes: the non-zeros of sparse
        chunks); above, "block_newton" where it forms the p × p curvature (p ≤ 2048 and
        the rows cheap); wider, "block_scd" for an L1 term, and for L2 on a grid of pure
        blocks whose epochs run collectively, else "block_newton" by conjugate gradients
        on curvature products.
        "cocoa" (never picked by "auto") runs in memory or over dask: X in K parts by
        feature or by example, combined by the exact step (docs/engines/cocoa.md).
        "block_scd" or "block_newton" named for dask input so small, or so finely
        chunked, that the scheduler's tasks will dominate its epochs warns once
        (:class:`dask_scd.TaskOverheadWarning`: larger chunks, or "auto").
    random_state : int, numpy Generator or None
    verbose : bool
        Print the relative gap after every certified iteration.
    device : {"cpu", "gpu", "auto"}
        Where the epochs of the "scd" and "sdca" engines run. "gpu" runs them as CUDA
        kernels (TPA-SCD: one thread block per coordinate, asynchronous; see docs/gpu.md),
        with X copied to the GPU once; it needs numba.cuda to find a GPU. With
        ``solver="auto"`` it picks "sdca" or "scd" (never "gram"). "auto" takes the GPU when
        there is one and the engine has GPU kernels, else the CPU. The Dask engines
        ("block_scd", "block_newton") run where the chunks are: a dask array of cupy
        arrays needs "gpu" or "auto" and runs their cells' CUDA kernels; host chunks and
        grids need "cpu" or "auto".
    sample_weight : float, array-like or dask array of shape (n_samples,), optional
        Non-negative weights of the examples (not all zero; an example of weight 0
        counts for nothing; a number is every example's weight, the unweighted problem); the objective's loss term becomes
        ``(1/Σw) Σ w_i loss(y_i, x_iᵀθ + b)``, certified by the weighted duality gap
        (docs/objectives.md). A dask vector is rechunked like y. A grid written with
        ``to_grid(..., sample_weight=...)`` carries its weights; passing sample_weight
        replaces them. Solved by "newton" (smooth losses), "sdca" (L2, every loss), "scd"
        (smooth losses), "duhl", "gram" (squared loss), "block_newton" and "block_scd"
        (Dask, smooth losses), which "auto" picks among, and "cocoa" (every loss, in
        memory or over Dask, when named); "newton" for the hinge raises a ValueError.
        The caller's array is never modified.
    coef_init : array of shape (n_features,), optional
        Warm start: the engines with a primal iterate ("gram", "scd", "newton" for the
        smooth losses, "block_scd", "block_newton") start from θ = coef_init (and b =
        ``intercept_init``, default the best intercept at θ = 0 for θ = 0, else 0) rather
        than from zero; the others start cold. The answer is the same, only the work
        changes (:func:`dask_scd.path` runs its points this way).
    intercept_init : float, optional
        The intercept of the warm start (with ``fit_intercept=True``).
    lower_bounds, upper_bounds : float or array of shape (n_features,), optional
        Coefficient constraints ``lower_bounds <= θ <= upper_bounds`` (``-inf`` / ``+inf``
        leave a side open; lower ≤ upper, else a ValueError naming the first feature
        where it is not); the intercept is never bounded. Each coordinate step clips
        into the box and the certificate is the box's duality gap (docs/objectives.md).
        Solved by the engines that declare them (``bounds`` in
        :mod:`dask_scd.engines.registry`: "scd" in memory, "block_scd" in memory and
        over dask, smooth losses), which "auto" picks; the others raise a ValueError
        naming those. A warm start is clipped into the box.
    **engine_options
        Every engine: ``callback``, called after every certified epoch (Newton step,
        round) with a dict ``{"epoch", "relative_gap", "primal", "seconds"}`` (the block
        engines add ``coef`` in the original feature order and ``intercept``); returning
        True stops the fit after that epoch: the result is the engine's returned point,
        certified as usual, with ``n_iter_`` the epochs run, no ConvergenceWarning, and
        ``extras_["stopped_by_callback"]`` True. The callback never changes the
        arithmetic. For dask input: ``blocks`` (column blocks of a dask array) and ``in_memory_limit``
        (bytes, default 256 MiB); the options of the engine that runs (block_scd:
        ``client``, ``selection``, ``checkpoint``, ``checkpoint_every``, ``resume``;
        on a dask-jobqueue cluster a fit that names no ``checkpoint`` writes
        one every 5 epochs, see docs/clusters.md), ``performance_report`` (a path: the
        dask engines' ``distributed.performance_report``, an HTML page of where the time
        went); sdca: ``n_threads``, default 1, and ``sync_every``, default 1: the
        epochs on that many threads sharing w without locks, w recomputed from the duals
        every ``sync_every`` epochs, 0 never; several threads are not bit-reproducible,
        see docs/engines/sdca.md). ``solver="sdca"`` on a Grid runs out of core, row chunk
        by row chunk in this process (``check_every``: certify every k epochs, default the
        in-memory schedule; ``chunk_order``: "random", default, or "sequential";
        ``spill``: False, default, True or a directory: a dense grid's row chunks kept
        decoded in a temporary file after the first pass, which later passes read back
        instead of decoding the grid; it takes the grid's decoded size on disk).

    Returns
    -------
    FitResult
        ``coef_``, ``intercept_``, ``dual_gap_`` (relative), ``n_iter_``, ``history_``;
        ``extras_["plan"]``: the engine, the device, the rule of
        :mod:`dask_scd.engines.planner` that chose them and the predicted passes where the
        cost model did; ``extras_["device"]``: where the epochs ran.
    """
    problem = check_problem(loss, penalty, alpha, l1_ratio, fit_intercept)
    check_fit_args(tol, max_iter)
    rng = check_random_state(random_state)
    prepared = prepare(X, y, problem, solver, device, engine_options, sample_weight)
    problem = bounded(problem, lower_bounds, upper_bounds, prepared.data.n_features)
    plan, settings = plan_fit(prepared, problem, solver, device)
    start = warm_start(problem, coef_init, intercept_init, prepared.data.n_features)
    options = Options(tol, max_iter, rng, engine=settings, device=plan.device, start=start)
    engine, run = _run(prepared, plan, problem, options, solver, verbose)
    return _result(run, engine.name, problem, penalty, tol, prepared.classes, plan)


def bounded(problem, lower_bounds, upper_bounds, n_features: int):
    """``problem`` with the box of :func:`~dask_scd.validation.check_bounds` (in the
    caller's feature order), or as it is without one."""
    bounds = check_bounds(lower_bounds, upper_bounds, n_features)
    return problem if bounds is None else dataclasses.replace(problem, bounds=bounds)


def warm_start(problem, coef_init, intercept_init, n_features: int):
    """The warm start (θ, b) of :func:`~dask_scd.validation.check_start` (None: a cold
    start), θ clipped into the problem's box when it has one."""
    start = check_start(coef_init, intercept_init, n_features, problem.fit_intercept)
    if start is None or problem.bounds is None:
        return start
    return problem.bounds.clip(start[0]), start[1]


@dataclass
class Prepared:
    """The caller's data as the engines receive it, and what the plan needs to know of it."""

    X: object  # the input as read: a dask array or a Grid stays one
    y: object  # None for a Grid
    # InMemory or Source, what the engine receives: dask input below in_memory_limit (or
    # for a named in-memory engine) is read into memory
    data: object
    classes: object  # None, or the labels mapped to −1 and +1 (the softmax loss: its classes)
    kind: str  # the caller's kind of X: "memory", "dask" or "grid"
    on_device: bool  # a dask array of cupy chunks
    available: str  # "cpu" or "gpu": where this machine runs epochs for the caller's device
    options: dict  # the engine's keyword options (fit's own for dask input taken out)
    performance_report: object = None  # a path, or None


def prepare(X, y, problem, solver: str, device: str, options: dict, sample_weight=None):
    """Read the input, check it and the solver's name, and build the data the engine
    receives (:class:`Prepared`); shared by :func:`fit` and :func:`dask_scd.path`."""
    options = dict(options)
    performance_report = options.pop("performance_report", None)
    if solver not in registry.SOLVERS:
        registry.get(solver)  # raises the list of solvers
    available = kernel_device.resolve(device)  # "cpu" or "gpu"; "gpu" without one raises
    given = read_input(X, y)  # any input: a path, an xarray object, dask data frames, ...
    X, y = given.X, given.y
    kind = "grid" if is_grid(X) else "dask" if is_dask(X) else "memory"
    if kind == "memory":
        data_options = sorted(set(options) & set(DataOptions.names()))
        if data_options:
            raise TypeError(f"unexpected arguments for in-memory data: {data_options}")
        data, classes = in_memory(X, y, problem.loss, sample_weight)
    else:
        data, classes, options = _dask_data(X, y, problem, solver, options, sample_weight)
    on_device = kind != "memory" and kernel_device.is_device_array(getattr(X, "_meta", None))
    return Prepared(X, y, data, classes, kind, on_device, available, options, performance_report)


def plan_fit(prepared: Prepared, problem, solver: str, device: str):
    """(:class:`~dask_scd.engines.planner.Plan`, the engine's options checked)."""
    plan = planner.plan(
        solver,
        problem,
        prepared.data,
        requested=device,
        available=prepared.available,
        on_device=prepared.on_device,
        given=prepared.kind,
        options=prepared.options,
    )
    data_options = prepared.kind != "memory"
    return plan, engine_options(plan.engine, prepared.options, solver, data_options)


def _run(prepared: Prepared, plan, problem, options: Options, solver: str, verbose):
    """(the engine that ran last, its run): the planned engine in the fit's session, and
    Newton from its iterate where the planner hands over."""
    engine, data = plan.engine, prepared.data
    identity = {"engine": engine.name, "problem": repr(problem), "data": _identity(data)}
    # The Dask engines on dask input (block_scd runs in-memory X in this process).
    on_cluster = engine.name in kernel_device.DASK_ENGINES and not isinstance(data, InMemory)
    report = prepared.performance_report
    with (
        fit_session(on_cluster, dict(prepared.options), verbose, identity, report) as given,
        Progress(engine.name, options.tol, options.max_iter, verbose) as progress,
    ):
        # the session may name the client and a default checkpoint
        settings = dataclasses.replace(options.engine, **given)
        options = dataclasses.replace(options, progress=progress, engine=settings)
        run = engine.load()(data, problem, options)
        if planner.fit_hands_over(solver, engine, run, data, problem, options.tol):
            return _newton_from(engine.name, run, data, problem, options)
    return engine, run


def _newton_from(first: str, run: Run, data, problem, options: Options):
    """(newton, its run) from the iterate of ``run`` (engine ``first``): its steps count
    after the run's iterations, the history goes on from the run's, and ``extras_`` say
    so ("handed_over_from")."""
    newton = registry.get("newton")
    start = (np.array(run.coef, dtype=np.float64), float(run.intercept))
    more = newton.load()(data, problem, dataclasses.replace(options, start=start, memo=None))
    history = run.history
    offset = history.seconds[-1] if history.seconds else 0.0
    for k, it in enumerate(more.history.iteration):
        history.append(
            run.n_iter + it,
            more.history.relative_gap[k],
            more.history.primal[k],
            offset + more.history.seconds[k],
        )
    extras = dict(
        more.extras,
        handed_over_from={
            "solver": first,
            "iterations": run.n_iter,
            "relative_gap": run.certificate.relative_gap,
        },
    )
    return newton, dataclasses.replace(
        more, n_iter=run.n_iter + more.n_iter, history=history, extras=extras
    )


def _dask_data(X, y, problem, solver, options, sample_weight=None):
    """(data for the engine, classes, the options left for the engine) of a dask array or
    a Grid: its source, or the source read into memory where the planner says it runs
    there (the Dask engines' options the named engine does not take then dropped, with a
    warning for a checkpoint that would never be written; every engine takes the
    callback)."""
    given = {name: options.pop(name) for name in DataOptions.names() if name in options}
    data_options = DataOptions(**given)
    source = make_source(X, y, problem.loss, data_options.blocks, sample_weight)
    if not planner.runs_in_memory(solver, source, problem, data_options.in_memory_limit):
        return source, source.classes, options
    every = EpochOptions.names()
    takes = every if solver == "auto" else registry.get(solver).options.names()
    for name in registry.get("block_scd").options.names():
        if name in takes:
            continue
        if options.pop(name, None) is not None and name == "checkpoint":
            warn(
                f"{name} applies to the block-SCD engine only; this fit runs in memory "
                "(pass solver='block_scd' to use it)"
            )
    data, classes = in_memory(*source.materialize(), problem.loss, source.sample_weight)
    return data, classes, options


def _result(run: Run, solver, problem, penalty, tol, classes, plan) -> FitResult:
    cert = run.certificate
    converged = run.converged(tol)
    if not converged and not run.stopped_by_callback:
        measure = (
            f"relative duality gap {cert.relative_gap:.3e}"
            if run.grad_norm is None
            else f"relative gradient norm ‖∇P‖∞/max(1, |P|) {run.grad_norm:.3e}"
        )
        warn(
            f"Did not converge after {run.n_iter} iterations of solver={solver!r}: "
            f"{measure} > tol={tol:.1e}. Increase max_iter.",
            ConvergenceWarning,
        )
    return FitResult(
        coef_=run.coef,
        intercept_=_intercept(run, problem),
        dual_gap_=cert.relative_gap,
        n_iter_=run.n_iter,
        history_=run.history,
        converged_=converged,
        solver_=solver,
        loss=problem.loss,
        penalty=penalty,
        alpha=problem.alpha,
        l1_ratio=problem.l1_ratio,
        primal_=cert.primal,
        classes_=classes,
        extras_={**run.extras, **_stop(run), "device": plan.device, "plan": plan.as_dict()},
        grad_norm_=run.grad_norm,
        fit_intercept=problem.fit_intercept,
    )


def _stop(run: Run) -> dict:
    """``{"stopped_by_callback": True}`` for a run the caller's callback stopped."""
    return {"stopped_by_callback": True} if run.stopped_by_callback else {}


def _intercept(run: Run, problem):
    """b as a float (one per class, an array, for the multinomial loss; zeros unfitted)."""
    if np.ndim(run.intercept):
        intercept = np.asarray(run.intercept, dtype=np.float64)
        return intercept if problem.fit_intercept else np.zeros_like(intercept)
    return float(run.intercept) if problem.fit_intercept else 0.0


def _identity(data) -> list:
    """What tells one data set from another (names a fit's default checkpoint)."""
    grid = getattr(data, "grid", None)
    return [
        type(data).__name__,
        getattr(data, "n_samples", None),
        getattr(data, "n_features", None),
        str(getattr(grid, "path", "")),
    ]
