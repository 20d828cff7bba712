"""``dask_scd.path``: a regularization path, warm-started from alpha_max down, every point
certified by its duality gap.

The grid starts at alpha_max, the smallest alpha whose solution is θ = 0: at θ = 0 with
the best intercept b₀ the dual point is a = −ℓ'(y, b₀) and the optimality condition of
every coordinate is |x_jᵀa|/n ≤ alpha·ρ, so

    alpha_max = ‖Xᵀa‖∞ / (n·ρ)

(ρ = l1_ratio; for a pure L2 penalty glmnet's ρ = 1e-3 stands in, where no alpha zeroes
θ). It goes down to eps·alpha_max on a log grid (:mod:`dask_scd.alpha_max`), each point
started from the previous solution.

In memory, each point first screens features by the gap-safe rule (Fercoq, Gramfort &
Salmon 2015; Ndiaye et al. 2017): the dual is (1/(nL))-strongly concave when ℓ'' ≤ L
(squared 1, logistic ¼, squared hinge 2), so the optimal dual point a* lies within
√(2nL·gap) of any feasible dual point a, and a feature with

    |x_jᵀa|/n + ‖x_j‖·√(2L·gap/n) < alpha·ρ

is zero at the optimum. The previous solution gives (a, gap) for the new alpha without a
product with Xᵀ: a = −ℓ'(Xθ + b) does not depend on alpha, so the correlation Xᵀa/n of
the last point's certificate serves, and only the margins are recomputed. When the rule
removes at least half the features the point is solved on the rest, except by Newton,
whose working sets already leave them out of every solve (a slice would only add its
copy). The point is then certified on all of X: the screening is safe, and the
certificate is what says so.

What a single fit pays once, the points share: the engine's design of X (Newton's rows,
columns, and, for the squared loss's constant curvature, its Gram blocks and the block
shifts' SᵀS), and the margins of the start. Each point starts from the secant through
the last two solutions carried on to its alpha (the lasso's path is linear in alpha
while its signs hold), clipped to their signs, when that lowers the objective.

Dask arrays and grids run each point as a normal :func:`dask_scd.fit`, warm-started,
one after the other (or in memory when ``fit`` would run them there).

With sample weights w every statement above holds for the weighted objective
``(1/Σw) Σ w_i ℓ_i + penalty``, which is ``(1/n) Σ v_i ℓ_i + penalty`` with v = n·w/Σw
(mean 1): a = −v∘ℓ'(y, b₀) with the weighted b₀, and the dual's term of example i is
v_i·ℓ*(−a_i/v_i), (1/(n·L·v_i))-strongly concave in a_i, so by Cauchy–Schwarz the radius
term of feature j is ‖x_j‖_v·√(2L·gap/n) with ‖x_j‖_v² = Σ v_i x_ij² (an example of
weight 0 has a_i = 0 and drops out). Integer weights give the path of repeated rows,
zero weights that of the rows left.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning

from dask_scd import objectives as obj
from dask_scd.alpha_max import (
    alpha_max_of,
    alphas_of,
    check_grid,
    correlation_at_zero,
    memory_correlation_at_zero,
    zero_gap,
)
from dask_scd.api import bounded, fit, prepare, warm_start
from dask_scd.data.memory import InMemory
from dask_scd.engines import planner, registry
from dask_scd.engines.base import Options, Run
from dask_scd.engines.options import EngineOptions, NoOptions, engine_options
from dask_scd.kernels import device as kernel_device
from dask_scd.progress import Progress
from dask_scd.validation import (
    check_fit_args,
    check_problem,
    check_random_state,
    warn,
)

# Bound L on ℓ'' (the dual's strong concavity is 1/(nL)); the hinge has none.
_CURVATURE_BOUND = {"squared": 1.0, "logistic": 0.25, "squared_hinge": 2.0}
# Solve a point on the screened features only when at most this share of them is kept
# (slicing X costs about a pass).
_SCREEN_SHARE = 0.5
# Tighter subproblem tolerances tried when a point solved on the screened features is
# not yet certified on all of X (each a tenth of the last).
_RETRIES = 3


@dataclass
class PathResult:
    """A regularization path: one certified model per alpha.

    Attributes
    ----------
    alphas : ndarray of shape (n_alphas,)
        Decreasing.
    coefs : ndarray of shape (n_features, n_alphas)
        θ at each alpha, in the original feature order.
    intercepts : ndarray of shape (n_alphas,)
    dual_gaps : ndarray of shape (n_alphas,)
        Relative duality gap ``(P − D)/|P|`` of each point, certified on all of X.
    n_iter : ndarray of int, shape (n_alphas,)
        Iterations of the engine at each point (0 where θ = 0 is exact).
    alpha_max : float
        The smallest alpha at which θ = 0 (with ρ = 1e-3 standing in for a pure L2 penalty).
    n_screened : ndarray of int, shape (n_alphas,)
        Features the gap-safe rule set to zero before the point was solved (in memory).
    solvers : list of str
        The engine of each point ("zero" where θ = 0 needed none).
    classes : ndarray of shape (2,) or None
        The labels mapped to −1 and +1 for a classification loss.
    """

    alphas: np.ndarray
    coefs: np.ndarray
    intercepts: np.ndarray
    dual_gaps: np.ndarray
    n_iter: np.ndarray
    alpha_max: float
    n_screened: np.ndarray
    solvers: list = field(default_factory=list)
    classes: np.ndarray | None = None
    loss: str = "squared"
    l1_ratio: float = 1.0


def path(
    X,
    y=None,
    *,
    alphas=None,
    n_alphas: int = 100,
    eps: float = 1e-3,
    loss: str = "squared",
    penalty: str = "l1",
    l1_ratio: float = 0.5,
    fit_intercept: bool = True,
    tol: float = 1e-6,
    max_iter: int = 1000,
    solver: str = "auto",
    random_state=None,
    verbose: bool = False,
    device: str = "cpu",
    screening: bool = True,
    sample_weight=None,
    lower_bounds=None,
    upper_bounds=None,
    **engine_options,
) -> PathResult:
    """Fit a regularization path, each point warm-started from the previous one.

    Parameters
    ----------
    X, y
        As for :func:`dask_scd.fit`: numpy or scipy.sparse (in memory), a dask array, a
        Grid, a path, xarray or dask DataFrames.
    alphas : array-like, optional
        The alphas (sorted decreasing). Default: ``n_alphas`` on a log grid from
        alpha_max down to ``eps·alpha_max``.
    n_alphas : int
    eps : float in (0, 1)
    loss, penalty, l1_ratio, fit_intercept, tol, max_iter, solver, random_state, verbose,
    device, **engine_options
        As for :func:`dask_scd.fit`; ``tol`` holds at every point.
    screening : bool
        In memory, drop the features the gap-safe rule proves zero before solving a point.
    sample_weight : float, array-like or dask array of shape (n_samples,), optional
        As for :func:`dask_scd.fit`: every point minimizes ``(1/Σw) Σ w_i loss_i +
        penalty``, and alpha_max and the screening are those of this objective (a weight
        of 0 leaves its row out of the path). A grid's stored weights when omitted.
    lower_bounds, upper_bounds : float or array of shape (n_features,), optional
        As for :func:`dask_scd.fit`: every point keeps lower_bounds ≤ θ ≤ upper_bounds
        (the grid of alphas is the unbounded problem's, as scikit-learn's; no screening).

    Returns
    -------
    PathResult
        ``alphas``, ``coefs`` (n_features, n_alphas), ``intercepts``, ``dual_gaps``,
        ``n_iter``, ``alpha_max``.

    Examples
    --------
    >>> import numpy as np
    >>> import dask_scd
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.5]])
    >>> result = dask_scd.path(X, [1.0, 2.0, 3.0, 4.5], n_alphas=5, tol=1e-10)
    >>> result.coefs.shape
    (2, 5)
    >>> bool(np.all(result.coefs[:, 0] == 0.0)) and bool(np.all(result.dual_gaps <= 1e-10))
    True
    """
    problem = check_problem(loss, penalty, 1.0, l1_ratio, fit_intercept)
    if problem.unpenalized:
        raise ValueError("a path needs a penalty: penalty=None has no alpha to vary")
    check_fit_args(tol, max_iter)
    grid = check_grid(alphas, n_alphas, eps)
    rng = check_random_state(random_state)
    prepared = prepare(X, y, problem, solver, device, engine_options, sample_weight)
    problem = bounded(problem, lower_bounds, upper_bounds, prepared.data.n_features)
    settings = _Settings(
        problem, penalty, tol, max_iter, solver, rng, verbose, device, prepared.options
    )
    if isinstance(prepared.data, InMemory):
        return _memory_path(prepared.data, prepared.classes, grid, settings, screening)
    return _distributed_path(prepared, grid, settings, dict(engine_options))


@dataclass
class _Settings:
    """The arguments every point of a path shares."""

    problem: obj.Problem  # with alpha = 1; each point sets its own
    penalty: str
    tol: float
    max_iter: int
    solver: str
    rng: object  # a numpy Generator, or a validation.LazyGenerator (made on first draw)
    verbose: bool
    device: str
    engine: dict

    def at(self, alpha: float) -> obj.Problem:
        return replace(self.problem, alpha=float(alpha))

    def zero_solves(self, alpha: float, alpha_max: float) -> bool:
        """Whether θ = 0 is the point's solution: alpha_max or above with an L1 term, and 0
        inside the box (the unbounded solution 0 is then the box's too)."""
        bounds = self.problem.bounds
        inside = bounds is None or bounds.contains(np.zeros(len(bounds.lower)))
        return self.problem.l1_ratio > 0.0 and alpha >= alpha_max and inside


# ----------------------------------------------------------------------- in memory


def _memory_path(data: InMemory, classes, grid, settings: _Settings, screening: bool):
    X, y, weights = data.X, data.y, data.weights
    problem = settings.problem
    n, p = X.shape
    correlation, intercept = memory_correlation_at_zero(data, problem)
    alpha_max = alpha_max_of(correlation, problem.l1_ratio)
    alphas = alphas_of(grid, alpha_max)
    screening = screening and problem.bounds is None  # the rule is the unbounded problem's
    norms = _column_norms(X, weights) if screening and problem.l1 > 0 else None
    coef = np.zeros(p)
    out = _Points(len(alphas), p)
    available = kernel_device.resolve(settings.device)
    layouts = _Layouts(data)
    trail = None  # (θ, b, alpha, margins) of the point before the last one
    for k, alpha in enumerate(alphas):
        point = settings.at(alpha)
        if settings.zero_solves(alpha, alpha_max):
            # θ = 0 is the solution: certify it as it is.
            coef = np.zeros(p)
            cert = obj.certificate(point, X, y, coef, intercept, weights=weights)
            correlation, trail = cert.correlation, None
            out.set(k, coef, intercept, cert.relative_gap, 0, "zero", 0)
            continue
        warm = bool(np.any(coef))
        engine, device = _engine(settings, point, data, available, warm)
        margins = np.asarray(X @ coef).ravel() + intercept
        keep = None
        if norms is not None:
            # The previous point's θ with its dual point a, Xᵀa/n kept from its certificate
            # (only alpha changed): the screening costs the margins, no product with Xᵀ.
            cert = _certificate_at(point, data, coef, intercept, margins, correlation)
            keep = _safe_features(point, cert, norms, n)
        last = (coef, intercept, alphas[k - 1] if k else None, margins)
        coef, intercept, margins = _predicted(point, data, last, trail)
        trail = last
        layouts.memo_of(data, engine.name)["margins"] = (coef, intercept, margins)
        share = 1.0 if keep is None else len(keep) / max(p, 1)
        # Newton's working sets already leave the screened features out of every solve:
        # a slice of X would only add its copy and a new design.
        sliced = share <= _SCREEN_SHARE and engine.name != "newton"
        sub = _columns(data, keep) if sliced else data
        tol = settings.tol
        for attempt in range(_RETRIES + 1):
            if sub is not data or attempt:
                engine, device = _engine(settings, point, sub, available, warm)
            start = (coef, intercept) if sub is data else (coef[keep], intercept)
            options = engine_options(engine, settings.engine, settings.solver)
            run = _run(engine, layouts, sub, point, settings, tol, start, device, options)
            if sub is data:
                coef, intercept = np.array(run.coef, dtype=np.float64), float(run.intercept)
                gap, correlation = run.certificate.relative_gap, _kept(run, engine)
                break
            coef = np.zeros(p)
            coef[keep] = run.coef
            intercept = float(run.intercept)
            cert = obj.certificate(point, X, y, coef, intercept, weights=weights)
            gap, correlation = cert.relative_gap, cert.correlation
            if gap <= settings.tol or run.n_iter >= settings.max_iter:
                break
            if attempt == _RETRIES - 1:
                sub = data  # the last try: all features
            tol = tol / 10.0
        n_iter = run.n_iter
        if problem.bounds is None and planner.point_hands_over(
            settings.solver, engine, gap, settings.tol
        ):
            # The engine "auto" chose stopped short of tol (the Gram engine's rounding
            # floor on correlated columns): proximal Newton finishes from where it is.
            engine = registry.get("newton")
            run = _newton_finish(data, layouts, point, settings, (coef, intercept), device)
            coef, intercept = np.array(run.coef, dtype=np.float64), float(run.intercept)
            gap, n_iter = run.certificate.relative_gap, n_iter + run.n_iter
            correlation = _kept(run, engine)
        if not point.fit_intercept:
            intercept = 0.0
        out.set(
            k, coef, intercept, gap, n_iter, engine.name, p - len(keep) if keep is not None else 0
        )
    return out.result(alphas, alpha_max, classes, settings)


def _newton_finish(data: InMemory, layouts, point, settings: _Settings, start, device) -> Run:
    """Proximal Newton on ``point`` from ``start`` (θ, b), to the path's tol."""
    newton = registry.get("newton")
    return _run(newton, layouts, data, point, settings, settings.tol, start, device, NoOptions())


def _predicted(problem: obj.Problem, data: InMemory, last: tuple, trail: tuple | None):
    """The start of a point: the last point's (θ, b), or the secant through the last two
    points carried on to this alpha when its objective is lower (the lasso's path is
    linear in alpha while its signs hold, smooth for the other losses: a predictor
    step), a coefficient whose sign it would flip set to 0. ``last`` and ``trail`` are
    (θ, b, alpha, margins) of the last two points. Returns (θ, b, margins)."""
    coef, intercept, alpha_last, margins = last
    if problem.bounds is not None:  # the secant may leave the box: the last point (inside)
        return coef, intercept, margins
    if trail is None or trail[2] is None or not np.any(trail[0]) or trail[2] == alpha_last:
        return coef, intercept, margins
    ratio = (problem.alpha - alpha_last) / (alpha_last - trail[2])
    guess = coef + ratio * (coef - trail[0])
    clipped = (guess * coef <= 0.0) & (guess != 0.0)
    guess[clipped] = 0.0  # stays on the last point's support and signs
    guess_b = intercept + ratio * (intercept - trail[1]) if problem.fit_intercept else 0.0
    if not np.any(clipped):
        # the same secant of the margins, which are linear in (θ, b): no pass over X
        guess_margins = margins + ratio * (margins - trail[3])
    else:
        guess_margins = np.asarray(data.X @ guess).ravel() + guess_b
    if _objective(problem, data, guess, guess_margins) < _objective(problem, data, coef, margins):
        return guess, guess_b, guess_margins
    return coef, intercept, margins


def _objective(problem: obj.Problem, data: InMemory, coef, margins) -> float:
    losses = obj.loss_value(problem.loss, data.y, margins)
    return obj.weighted_sum(losses, data.weights) / data.n_samples + obj.penalty_value(
        problem, coef
    )


def _kept(run, engine) -> np.ndarray | None:
    """Xᵀa/n of the dual point a = −ℓ'(Xθ + b) at the run's θ, from its certificate on all
    of X (the primal engines'; None: the next point computes it)."""
    return run.certificate.correlation if engine.name in planner.WARM_ENGINES else None


def _certificate_at(
    problem: obj.Problem, data: InMemory, coef, intercept: float, margins, correlation
) -> obj.Certificate:
    """The certificate of θ at ``problem``'s alpha from its margins and, when known, the
    correlation Xᵀa/n of its dual point (which no alpha changes: a = −v∘ℓ'(Xθ + b),
    projected onto Σa = 0); the correlation costs a pass otherwise."""
    if correlation is not None and len(correlation) != data.n_features:
        correlation = None
    return obj.certificate(
        problem,
        data.X,
        data.y,
        coef,
        intercept,
        margins=margins,
        weights=data.weights,
        correlation=correlation,
    )


def _engine(settings: _Settings, problem: obj.Problem, data: InMemory, available: str, warm: bool):
    """The engine of a point and where it runs (:func:`planner.point_plan`)."""
    plan = planner.point_plan(
        settings.solver, problem, data, requested=settings.device, available=available, warm=warm
    )
    return plan.engine, plan.device


def _run(
    engine,
    layouts: _Layouts,
    sub: InMemory,
    problem: obj.Problem,
    settings: _Settings,
    tol: float,
    start: tuple,
    device: str,
    own: EngineOptions,
):
    """One point: the engine's run on ``sub`` (X or its screened columns) from ``start``
    (θ, b) with its options ``own``, in the layout it reads and with what it kept from
    the last run on the same data (``layouts``)."""
    data, memo = layouts.of(sub, engine.name), layouts.memo_of(sub, engine.name)
    with Progress(engine.name, tol, settings.max_iter, settings.verbose) as progress:
        options = Options(
            tol,
            settings.max_iter,
            settings.rng,
            progress,
            own,
            device,
            warm_start(problem, start[0], start[1], data.n_features),
            memo,
        )
        return engine.load()(data, problem, options)


class _Layouts:
    """All of X in the layout each engine reads, converted once for the whole path: CSR
    for Newton (rows), CSC for the coordinate engines (columns); a screened subset is
    used as it is."""

    _ROWS = ("newton", "sdca")

    def __init__(self, data: InMemory):
        self.data, self.copies, self.memos = data, {}, {}

    def memo_of(self, sub: InMemory, engine: str) -> dict | None:
        """What an engine keeps between the points it runs on all of X (a screened subset
        changes from point to point: none)."""
        if sub is not self.data:
            return None
        return self.memos.setdefault(engine, {})

    def of(self, sub: InMemory, engine: str) -> InMemory:
        X = sub.X
        if sub is not self.data or not sp.issparse(X):
            return sub
        fmt = "csr" if engine in self._ROWS else "csc"
        if X.format == fmt:
            return sub
        if fmt not in self.copies:
            copy = InMemory(X.asformat(fmt), sub.y, sub.weights)
            if "pure_blocks" in sub.__dict__:
                copy.pure_blocks = sub.pure_blocks
            self.copies[fmt] = copy
        return self.copies[fmt]


def _column_norms(X, weights=None) -> np.ndarray:
    """‖x_j‖_v = √(Σ v_i x_ij²) for every column (v = 1 without ``weights``)."""
    if sp.issparse(X):
        squares = X.multiply(X)
        if weights is not None:
            return np.sqrt(np.asarray(squares.T @ weights).ravel())
        return np.sqrt(np.asarray(squares.sum(axis=0)).ravel())
    if weights is not None:
        return np.sqrt(np.einsum("i,ij,ij->j", weights, X, X))
    return np.sqrt(np.einsum("ij,ij->j", X, X))


def _safe_features(problem: obj.Problem, cert: obj.Certificate, norms, n: int):
    """The features the gap-safe rule cannot prove zero at the optimum (indices)."""
    bound = _CURVATURE_BOUND.get(problem.loss)
    if bound is None or cert.correlation is None:
        return np.arange(len(norms))
    gap = max(cert.gap, 0.0)
    radius = np.sqrt(2.0 * bound * gap / n)
    return np.flatnonzero(np.abs(cert.correlation) + norms * radius >= problem.l1)


def _columns(data: InMemory, keep) -> InMemory:
    """The kept features of X as in-memory data of their own, with the pure blocks of
    all of X restricted to them (detecting them again on every subset cost Adult's
    100-point path 4 of its 21 s)."""
    X = data.X
    sub = InMemory(
        X[:, keep] if sp.issparse(X) else np.ascontiguousarray(X[:, keep]), data.y, data.weights
    )
    if sp.issparse(X) and data.pure_blocks is not None:  # detected once, for all of X
        position = np.full(data.n_features, -1)
        position[keep] = np.arange(len(keep))
        blocks = [position[b][position[b] >= 0] for b in data.pure_blocks]
        sub.pure_blocks = [b for b in blocks if len(b)]
    return sub


class _Points:
    """The path's results, filled point by point."""

    def __init__(self, n_alphas: int, n_features: int):
        self.coefs = np.zeros((n_features, n_alphas))
        self.intercepts = np.zeros(n_alphas)
        self.gaps = np.zeros(n_alphas)
        self.n_iter = np.zeros(n_alphas, dtype=np.int64)
        self.screened = np.zeros(n_alphas, dtype=np.int64)
        self.solvers = [""] * n_alphas

    def set(self, k, coef, intercept, gap, n_iter, solver, screened):
        self.coefs[:, k] = coef
        self.intercepts[k] = intercept
        self.gaps[k] = gap
        self.n_iter[k] = n_iter
        self.solvers[k] = solver
        self.screened[k] = screened

    def result(self, alphas, alpha_max, classes, settings: _Settings) -> PathResult:
        missed = np.flatnonzero(self.gaps > settings.tol)
        if len(missed):
            k = missed[0]
            warn(
                f"{len(missed)} of {len(alphas)} path points did not converge (the first at "
                f"alpha={alphas[k]:.3e}: relative duality gap {self.gaps[k]:.3e} > "
                f"tol={settings.tol:.1e}). Increase max_iter.",
                ConvergenceWarning,
            )
        return PathResult(
            np.asarray(alphas, dtype=np.float64),
            self.coefs,
            self.intercepts,
            self.gaps,
            self.n_iter,
            float(alpha_max),
            self.screened,
            self.solvers,
            classes,
            settings.problem.loss,
            settings.problem.l1_ratio,
        )


# ----------------------------------------------------------------- dask and grids


def _bound_arguments(problem: obj.Problem) -> dict:
    """The box of ``problem`` as :func:`dask_scd.fit`'s arguments (none without one)."""
    if problem.bounds is None:
        return {}
    return {"lower_bounds": problem.bounds.lower, "upper_bounds": problem.bounds.upper}


def _distributed_path(prepared, grid, settings: _Settings, options: dict) -> PathResult:
    """Each point a normal :func:`dask_scd.fit` of the dask array or grid, warm-started,
    with the caller's ``options``."""
    X, y, source, problem = prepared.X, prepared.y, prepared.data, settings.problem
    correlation, intercept = correlation_at_zero(source, problem)
    alpha_max = alpha_max_of(correlation, problem.l1_ratio)
    alphas = alphas_of(grid, alpha_max)
    p = source.n_features
    coef = np.zeros(p)
    out = _Points(len(alphas), p)
    labels = None if source.on_disk else y
    for k, alpha in enumerate(alphas):
        point = settings.at(alpha)
        if settings.zero_solves(alpha, alpha_max):
            out.set(k, np.zeros(p), intercept, zero_gap(source, point, intercept), 0, "zero", 0)
            coef = np.zeros(p)
            continue
        result = fit(
            X,
            labels,
            loss=problem.loss,
            penalty=settings.penalty,
            alpha=alpha,
            l1_ratio=problem.l1_ratio,
            fit_intercept=problem.fit_intercept,
            tol=settings.tol,
            max_iter=settings.max_iter,
            solver=settings.solver,
            random_state=settings.rng,
            verbose=settings.verbose,
            device=settings.device,
            coef_init=coef,
            intercept_init=intercept,
            sample_weight=source.sample_weight,
            **_bound_arguments(problem),
            **options,
        )
        coef, intercept = np.array(result.coef_, dtype=np.float64), float(result.intercept_)
        out.set(k, coef, intercept, result.dual_gap_, result.n_iter_, result.solver_, 0)
    return out.result(alphas, alpha_max, source.classes, settings)
