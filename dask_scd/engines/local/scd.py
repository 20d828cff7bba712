"""In-memory engine: primal SCD over columns (``solver="scd"``).

The solver is one loop that reads top to bottom — permute, run an epoch kernel, certify,
check — with every numerical step in :mod:`dask_scd.kernels.cpu` and every objective in
:mod:`dask_scd.objectives`; problems with an L1 part run it over growing working sets,
with Anderson extrapolation of the iterates and celer's dual extrapolation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.engines.base import CertificateSchedule, Options, Run, Trace
from dask_scd.engines.certificates import best_certificate
from dask_scd.engines.coarse import LocalCoarse
from dask_scd.engines.local.epochs import EMPTY, box_arrays, check_cpu_weights, scd_epoch
from dask_scd.kernels import cpu, device
from dask_scd.kernels.layout import MajorMatrix
from dask_scd.objectives import bounds as box


def fit_scd(data: InMemory, problem: obj.Problem, options: Options) -> Run:
    """Primal stochastic coordinate descent with prox-Newton coordinate steps.

    L2 problems run plain epochs over all coordinates; problems with an L1 part run the
    working-set solver (:func:`_working_set_scd`). With sample weights every coordinate's
    gradient and curvature are weighted sums (:func:`dask_scd.kernels.cpu.scd_weighted_epoch`,
    and the squared loss's :func:`~dask_scd.kernels.cpu.scd_epoch_squared`), on the CPU.
    """
    check_cpu_weights(data.weights, options.device, "scd")
    primal = _Primal.start(data.X, data.y, problem, options.device, options.start, data.weights)
    # No coarse step with a box (its whole-field shifts ignore it), nor with an L1 part on
    # centered columns: its flat shifts are against the intercept, which is then exact at
    # every step (one-hot 1M × 100k lasso: the same epochs without them, and 1.5 s less).
    centered = primal.col_means is not None and len(primal.col_means) > 0
    coarse = None
    if problem.bounds is None and not (problem.l1 > 0 and centered):
        coarse = LocalCoarse.build(data.X, problem, data.weights)
    run = _working_set_scd if problem.l1 > 0 else _plain_scd
    return run(primal, problem, options, coarse)


def _plain_scd(primal, problem, options, coarse) -> Run:
    """Epochs over every coordinate, each followed by the coarse step when it is due."""
    tol, max_iter, rng = options.tol, options.max_iter, options.rng
    trace = Trace(options.progress, options.callback)
    epoch = 0
    all_coordinates = np.arange(primal.n_coordinates)
    schedule = CertificateSchedule(first=3)
    for epoch in range(1, max_iter + 1):
        max_delta, max_coef, _ = primal.epoch(problem, rng.permutation(all_coordinates))
        if coarse is not None and coarse.due(epoch):
            primal.intercept[0] = coarse.step(
                problem, primal.y, primal.margins, primal.coef, primal.intercept[0]
            )
        if not schedule.due(epoch, max_delta, max_coef, epoch == max_iter):
            continue
        if trace.certified(epoch, primal.certify(problem), tol):
            break
    return trace.ended(primal.finish(problem, epoch, trace.history))


def _working_set_scd(primal, problem, options, coarse) -> Run:
    """SCD with an L1 part: working sets grown geometrically, as in celer and skglm.

    Each outer iteration certifies (θ, b) on all of X, ranks the coordinates by how far
    they are from their L1 threshold, and solves the problem restricted to the best
    ranked ones (:func:`_grow_working_set`) with inner epochs that read only those
    columns, extrapolated every few epochs (:class:`_Anderson`), until their largest
    violation falls to a fraction of the whole problem's. Coordinates outside the set
    stay at zero; the next certificate covers them all, and any that violates its
    threshold ranks high in the next set. So the set orders the work, never the answer.
    """
    tol, max_iter, rng = options.tol, options.max_iter, options.rng
    trace = Trace(options.progress, options.callback)
    memory = _MarginMemory(primal)
    cert = primal.certify(problem)
    epoch, size, extrapolated = 0, 0, None
    certificate_work = primal.cost(np.arange(primal.n_coordinates))  # a pass over X
    inner_work = 0.0
    while epoch < max_iter:
        if coarse is not None:  # exact shifts along flat directions: margins unchanged
            primal.intercept[0] = coarse.step(
                problem, primal.y, primal.margins, primal.coef, primal.intercept[0]
            )
        violation = _violations(problem, primal.coef, cert.correlation)
        # Cost guard: a subproblem that cost less than the certificate it ends with
        # (small sets of cheap epochs) gets a set grown faster, so that fewer
        # certificates are spent on the way to the support.
        growth = _FAST_GROWTH if inner_work < certificate_work else 2
        working_set, size = _grow_working_set(
            problem, primal, cert.correlation, violation, size, growth
        )
        target = _INNER_FRACTION * max(
            violation.max(initial=0.0), primal.intercept_violation(problem)
        )
        last = _last_target(problem, cert, primal.coef, tol)
        if last > 0.0 and _few_violators_left(primal.coef, working_set, violation):
            target = min(target, last)
        first = epoch
        epoch = _solve_working_set(
            primal, problem, working_set, target, epoch, max_iter, rng, memory
        )
        inner_work = (epoch - first) * primal.epoch_work
        extrapolated = memory.extrapolate(primal)
        cert = primal.certify(problem, extrapolated)
        if trace.certified(epoch, cert, tol):
            break
    return trace.ended(primal.finish(problem, epoch, trace.history, extrapolated))


# Working sets (celer, skglm): at least this many zeros beside the support (their first
# set holds 10 features). The subproblem is solved until its largest violation is this
# fraction of the whole problem's at the last certificate.
_MIN_WORKING_SET = 10
_FAST_GROWTH = 8
_INNER_FRACTION = 0.1
_TARGET_FLOOR = 1e-10
# Anderson extrapolation from the last K + 1 iterates (skglm: K = 5), with a ridge of
# this size relative to the largest diagonal entry of the K x K system.
_ANDERSON_K = 5
_ANDERSON_RIDGE = 1e-10
# An auxiliary step (extrapolation, margins memory) costs at most this fraction of the
# epochs it serves, by a count of operations: it is spaced out when it would cost more.
_AUX_BUDGET = 0.25
# Operations per example of a loss value or derivative, against one per stored entry of
# X read by a kernel (a gather and a multiply-add; the exponential of the logistic costs
# several), and per element of a streaming vector operation (numpy or BLAS on contiguous
# vectors runs several times faster than the kernels' indexed reads).
_LOSS_COST = {"squared": 1.0, "logistic": 4.0, "squared_hinge": 1.5}
_VECTOR_COST = 0.25


def _solve_working_set(primal, problem, working_set, target, epoch, max_iter, rng, memory) -> int:
    """Inner epochs on ``working_set`` until the largest violation met in an epoch is at
    most ``target`` (or nothing moves, or ``max_iter``); returns the last epoch."""
    anderson = _Anderson(primal, problem, working_set, memory)
    primal.epoch_work = primal.cost(working_set)
    # One order for all the subproblem's epochs: extrapolation needs the iterates of one
    # fixed map (cyclic CD, as in celer and skglm); a fresh order each epoch breaks it.
    order = rng.permutation(working_set)
    for epoch in range(epoch + 1, max_iter + 1):
        max_delta, _, violation = primal.epoch(problem, order)
        memory.push(primal)
        if violation <= target or max_delta == 0.0:
            break
        anderson.push(primal)
    return epoch


def _few_violators_left(coef, working_set, violation) -> bool:
    """Whether the set holds every feature that violates its optimality condition, and
    those off the support are few (at most :data:`_MIN_WORKING_SET`, or 1 % of the
    support): the sign that the set's solution is the whole problem's."""
    violating = np.flatnonzero(violation > 0)
    outside = int(np.count_nonzero(coef[violating] == 0))
    if outside > max(_MIN_WORKING_SET, 0.01 * np.count_nonzero(coef)):
        return False
    return bool(np.isin(violating, working_set).all())


def _last_target(problem, cert, coef, tol) -> float:
    """The inner violation at which a pure L1 subproblem that holds every violator is
    certified to ``tol`` without another outer iteration (0 for other penalties).

    Once few violators are left off the support, the set's solution is usually the whole
    problem's (:func:`_few_violators_left`), and its certificate rescales the
    dual point by κ = α/(α + ε), ε the largest violation left on the support: D falls by
    about (1 − κ)·α‖θ‖₁ ≈ ε‖θ‖₁, first order in ε while P's error is of second order. The
    subproblem is solved until ε‖θ‖₁ ≤ tol·P/2 instead of to a tenth of the last
    violation, which would leave one more certificate pass and subproblem to reach
    ``tol``. The target is floored at
    :data:`_TARGET_FLOOR` times α, where the epochs' running margins meet rounding.
    """
    if problem.l1 <= 0.0 or problem.l2 > 0.0:
        return 0.0
    norm = float(np.abs(coef).sum())
    if norm == 0.0:
        return 0.0
    return max(0.5 * tol * abs(cert.primal) / norm, _TARGET_FLOOR * problem.l1)


def _violations(problem, coef, correlation) -> np.ndarray:
    """dist(x_jᵀa/n, ∂g(θ_j)) for every feature (the kernels' ``_violation``)."""
    if problem.bounds is not None:
        return box.violations(problem.l1, problem.l2, problem.bounds, coef, correlation)
    g = -correlation
    l1, l2 = problem.l1, problem.l2
    on_support = np.abs(g + l2 * coef + l1 * np.sign(coef))
    return np.where(coef != 0, on_support, np.maximum(np.abs(g) - l1, 0.0))


def _grow_working_set(problem, primal, correlation, violation, previous, growth=2):
    """The next working set (sorted, + the intercept) and its number of features.

    The support, and as many zeros as violate their threshold, up to ``growth − 1``
    times the size of the previous set or of the support (so the set doubles, with
    ``growth = 2``, while violators remain), at least :data:`_MIN_WORKING_SET`. The zeros are ranked as celer ranks them, by
    (|x_jᵀa/n| − αρ)/‖x_j‖, the distance of the dual point to their constraint: those
    nearest their threshold come first even when none violates it. Unlike celer's and
    skglm's 2 x the support, a set holds no more zeros than violate, plus the minimum:
    on one-hot data the support holds the long columns, and an inner epoch over twice
    the support cost 3/4 of a full epoch instead of 1/2.
    """
    coef = primal.coef
    support = coef != 0
    n_support = int(support.sum())
    n_violating = int(np.count_nonzero(violation[~support] > 0))
    extra = max(_MIN_WORKING_SET, min(n_violating, (growth - 1) * max(previous, n_support)))
    size = min(n_support + extra, len(coef))
    norms = np.sqrt(primal.col_sq_norms)
    pull = np.abs(correlation)
    if problem.bounds is not None:  # towards a side the box leaves open at 0
        pull = box.reachable(problem.bounds, correlation)
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.where(norms > 0, (pull - problem.l1) / norms, -np.inf)
    score[support] = np.inf
    chosen = (
        np.sort(np.argpartition(-score, size - 1)[:size])
        if size < len(coef)
        else np.arange(len(coef))
    )
    if primal.fit_intercept:
        chosen = np.append(chosen, len(coef))
    return chosen, size


@dataclass
class _Primal:
    """The SCD iterate (θ, b) with its margins ŷ = Xθ + b and per-column constants."""

    matrix: MajorMatrix
    y: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray  # length 1, updated in place by the kernels
    margins: np.ndarray
    col_sq_norms: np.ndarray
    col_cube_sums: np.ndarray
    col_nnz: np.ndarray
    fit_intercept: bool
    loss_cost: float
    epoch_work: float = 0.0  # operations of the current epochs (see ``cost``)
    kept: tuple | None = None  # the best dual point seen and its correlations Xᵀa/n
    epoch_matrix: MajorMatrix | None = None  # ``matrix``, or its copy in GPU memory
    kernels: object = cpu  # the epoch kernels for ``epoch_matrix`` (dask_scd.kernels.device)
    # The squared loss's constants for :func:`dask_scd.kernels.cpu.scd_epoch_squared`
    # (CPU epochs only, else None): Xᵀy, and mean(x_j) per column when its intercept is
    # solved by centering (else empty).
    col_xty: np.ndarray | None = None
    col_means: np.ndarray | None = None
    weights: np.ndarray | None = None  # the sample weights v (mean 1), or None

    @classmethod
    def start(cls, X, y, problem, where="cpu", warm=None, weights=None):
        matrix = MajorMatrix.from_array(X, "columns")
        epoch_matrix = device.place(matrix, where)  # what the epochs read: host or GPU
        n_samples, n_features = X.shape
        coef = np.zeros(n_features) if problem.bounds is None else problem.bounds.start()
        intercept = np.array([0.0])
        if warm is not None:  # a warm start (θ, b)
            coef[:], intercept[0] = warm
        elif problem.fit_intercept:
            intercept[0] = obj.optimal_intercept(
                problem.loss,
                y,
                np.zeros(n_samples) if problem.bounds is None else matrix.scatter(coef),
                weights=weights,
            )
        margins = matrix.scatter(coef) + intercept[0]
        cubes = matrix.cube_sums(weights) if problem.loss == "logistic" else np.zeros(0)
        kernels = device.kernels_for(epoch_matrix.data)
        xty = means = None
        if problem.loss == "squared" and kernels is cpu:
            xty, means = _squared_constants(matrix, y, problem.fit_intercept, weights)
        return cls(
            matrix,
            y,
            coef,
            intercept,
            margins,
            _column_sq_norms(X, matrix, weights),
            cubes,
            matrix.line_nnz(),
            problem.fit_intercept,
            _LOSS_COST[problem.loss],
            epoch_matrix=epoch_matrix,
            kernels=kernels,
            col_xty=xty,
            col_means=means,
            weights=weights,
        )

    @property
    def n_coordinates(self) -> int:
        return len(self.coef) + int(self.fit_intercept)

    def cost(self, coordinates) -> float:
        """Operations of an epoch over ``coordinates``: a loss derivative per stored entry
        of their columns, one per example for the intercept."""
        p = len(self.coef)
        columns = coordinates[coordinates < p]
        entries = float(self.col_nnz[columns].sum())
        return self.loss_cost * (entries + len(self.y) * (len(coordinates) - len(columns)))

    def epoch(self, problem, order):
        """One kernel epoch; (max |Δθ_j|, max |θ_j|, largest violation met)."""
        m = self.epoch_matrix
        if self.col_xty is not None:
            return cpu.scd_epoch_squared(
                m.data,
                m.indices,
                m.indptr,
                m.dense,
                len(self.y),
                self.y,
                self.margins,
                self.coef,
                self.intercept,
                order,
                problem.l1,
                problem.l2,
                self.col_sq_norms,
                self.col_xty,
                self.col_means,
                EMPTY if self.weights is None else self.weights,
                *box_arrays(problem.bounds),
            )
        kernel = cpu.scd_epoch_violation if self.kernels is cpu else self.kernels.scd_epoch
        result = scd_epoch(
            kernel,
            m,
            self.y,
            self.margins,
            self.coef,
            self.intercept,
            order,
            problem,
            problem.l2,
            self.col_sq_norms,
            self.col_cube_sums,
            self.weights,
            problem.bounds,
        )
        if self.weights is not None or self.kernels is cpu:
            return result
        # The GPU epoch returns no violation: the cheap movement test stands in for it
        # (an epoch that nearly stopped moving ends the subproblem; certificates decide).
        max_delta, max_coef = result
        # max_delta counts the intercept's step: with every θ_j at 0, the intercept's
        # rounding jitter (atomic adds in any order) must not read as movement.
        scale = max(max_coef, abs(float(self.intercept[0])))
        moving = max_delta > CertificateSchedule().gate * scale
        return max_delta, max_coef, np.inf if moving else 0.0

    def objective(self, problem, margins, coef) -> float:
        losses = obj.loss_value(problem.loss, self.y, margins)
        return obj.weighted_sum(losses, self.weights) / len(self.y) + obj.penalty_value(
            problem, coef
        )

    def intercept_violation(self, problem) -> float:
        """|∂P/∂b| = |mean v∘ℓ'(ŷ)| (0 without an intercept)."""
        if not self.fit_intercept:
            return 0.0
        derivatives = obj.loss_derivative(problem.loss, self.y, self.margins)
        return abs(obj.weighted_sum(derivatives, self.weights) / len(self.y))

    def certify(self, problem, extrapolated=None) -> obj.Certificate:
        """The certificate of (θ, b) (:func:`best_certificate`); the best dual point
        seen is kept for the next ones."""
        cert, self.kept = best_certificate(
            problem,
            self.matrix,
            self.y,
            self.coef,
            self.margins,
            extrapolated,
            self.kept,
            self.weights,
        )
        return cert

    def finish(self, problem, epoch, history, extrapolated=None) -> Run:
        """Certify on margins recomputed from scratch, free of accumulated rounding (with
        the last certificate's extrapolated dual point, if any)."""
        self.margins = self.matrix.scatter(self.coef) + self.intercept[0]
        cert = self.certify(problem, extrapolated)
        return Run(self.coef, float(self.intercept[0]), cert, epoch, history)


def _squared_constants(matrix, y, fit_intercept, weights):
    """(Xᵀ(v∘y), the columns' means weighted by v, or empty without an intercept) for
    :func:`dask_scd.kernels.cpu.scd_epoch_squared` (v = 1 without ``weights``)."""
    weighted_y = y if weights is None else weights * y
    if not fit_intercept:
        return matrix.dot(weighted_y), np.zeros(0)
    n_samples = len(y)
    means = (
        np.full(n_samples, 1.0 / n_samples) if weights is None else weights / float(weights.sum())
    )
    return matrix.dot_pair(weighted_y, means)


def _column_sq_norms(X, matrix, weights) -> np.ndarray:
    """‖x_j‖² (Σ_i v_i x_ij² with weights): from a C-ordered dense X in one sweep along its
    rows, which vectorizes across the columns and gives the bits of the column pass over
    its transposed copy (10,000 x 100: 0.80 -> 0.31 ms; 500 x 600: 0.25 -> 0.11 ms), else
    by that pass."""
    if weights is None and isinstance(X, np.ndarray) and X.flags.c_contiguous and X.ndim == 2:
        return MajorMatrix.from_array(X, "rows").minor_sq_norms()
    return matrix.sq_norms(weights)


def _affine_weights(iterates) -> np.ndarray | None:
    """Anderson's weights c (Σ c = 1) of the last K iterates from the K + 1 rows of
    ``iterates`` (oldest first): c ∝ (UUᵀ + εI)⁻¹1 with U the K successive differences,
    the combination of the iterates with the smallest combined difference."""
    # Called every few epochs on tiny sets: numpy's diff and diag_indices_from cost more
    # than the K x K arithmetic, the slices and the flat stride do the same sums.
    U = iterates[1:] - iterates[:-1]
    gram = U @ U.T
    gram.flat[:: len(gram) + 1] += _ANDERSON_RIDGE * max(float(gram.diagonal().max()), 1e-300)
    try:
        z = np.linalg.solve(gram, np.ones(len(gram)))
    except np.linalg.LinAlgError:
        return None
    total = z.sum()
    if not np.isfinite(total) or total == 0.0:
        return None
    return z / total


class _Anderson:
    """Anderson extrapolation of the iterates restricted to a working set (skglm).

    Every K epochs the K + 1 last (θ_W, b) give an extrapolated point; its margins are
    recomputed from the columns of W (X_W θ_W + b, a pass over those columns) and it
    replaces the iterate only if the objective is lower. When that costs more than
    ``_AUX_BUDGET`` of the K epochs (tiny working sets of short columns, without an
    intercept to make every epoch cost n anyway) extrapolations are spaced out.
    """

    def __init__(self, primal, problem, working_set, memory):
        self.memory = memory
        self.columns = working_set[working_set < len(primal.coef)]
        self.problem = problem
        self.iterates = np.empty((_ANDERSON_K + 1, len(self.columns) + 1))
        n = len(primal.y)
        step = (
            float(primal.col_nnz[self.columns].sum())
            + 2 * primal.loss_cost * n
            + _ANDERSON_K**2 * len(self.columns)
        )
        budget = _AUX_BUDGET * primal.cost(working_set)
        self.wait = max(0, int(np.ceil(step / max(budget, 1e-300))) - _ANDERSON_K)
        self.margins = np.empty(n)
        self.count, self.skipped = 0, 0
        self.push(primal)

    def push(self, primal) -> None:
        """Record the iterate after an epoch; extrapolate when K + 1 are recorded."""
        if self.count == 0 and self.skipped < self.wait:
            self.skipped += 1
            return
        self.iterates[self.count, :-1] = primal.coef[self.columns]
        self.iterates[self.count, -1] = primal.intercept[0]
        self.count += 1
        if self.count == _ANDERSON_K + 1:
            self._extrapolate(primal)
            self.count, self.skipped = 0, 0
            self.push(primal)

    def _extrapolate(self, primal) -> None:
        weights = _affine_weights(self.iterates)
        if weights is None:
            return
        point = weights @ self.iterates[1:]
        coef, intercept = point[:-1], float(point[-1])
        if self.problem.bounds is not None:  # the extrapolated point projected on the box
            coef = self.problem.bounds.clip(coef, self.columns)
        margins = primal.matrix.lines_scatter(self.columns, coef, intercept, self.margins)
        # Outside W every θ_j is zero: the objectives differ only through W.
        now = primal.objective(self.problem, primal.margins, primal.coef[self.columns])
        if primal.objective(self.problem, margins, coef) < now:
            primal.coef[self.columns] = coef
            primal.intercept[0] = intercept
            primal.margins, self.margins = margins, primal.margins
            self.memory.restart()  # the margins before the jump follow another path


class _MarginMemory:
    """The margins after the last K + 1 epochs, for the dual extrapolation of celer.

    At a certificate their Anderson combination gives extrapolated margins, whose dual
    point a = −ℓ'(ŷ) is certified beside the plain one (:func:`_extrapolated_certificate`);
    it tracks the optimal dual point much more closely late in a fit. A copy of the
    margins is recorded only when it costs at most ``_AUX_BUDGET`` of the epochs since
    the previous one, and the extrapolation only when it costs at most the plain
    certificate (so a certificate costs at most twice its pass; the pass is shared).
    """

    def __init__(self, primal):
        n = len(primal.y)
        self.n_entries = float(primal.col_nnz.sum())
        self.enabled = (_ANDERSON_K + 1) * n <= max(self.n_entries, 1.0)  # memory ≤ X's
        self.snapshots = np.empty((_ANDERSON_K + 1, n)) if self.enabled else None
        self.certificate_cost = self.n_entries + 3 * primal.loss_cost * n
        self.count, self.since_copy = 0, 0.0

    def push(self, primal) -> None:
        if not self.enabled:
            return
        n = len(primal.y)
        self.since_copy += primal.epoch_work
        if _VECTOR_COST * n > _AUX_BUDGET * self.since_copy:
            return
        self.since_copy = 0.0
        self.snapshots[self.count % (_ANDERSON_K + 1)] = primal.margins
        self.count += 1

    def restart(self) -> None:
        self.count = 0

    def extrapolate(self, primal) -> np.ndarray | None:
        """Extrapolated margins, or None (too few recorded, or over budget)."""
        if not self.enabled or self.count < _ANDERSON_K + 1:
            return None
        # The K x K system of differences and the combination stream K²/2 + K + 1
        # vectors, the dual point takes a few loss evaluations, and the second vector of
        # the certificate's pass adds a multiply-add per stored entry to the same read.
        n = len(primal.y)
        vectors = _ANDERSON_K**2 / 2 + _ANDERSON_K + 1 + 3 * primal.loss_cost
        cost = _VECTOR_COST * vectors * n + 0.5 * self.n_entries
        if cost > self.certificate_cost:
            return None
        oldest = self.count % (_ANDERSON_K + 1)
        ordered = np.roll(self.snapshots, -oldest, axis=0)
        weights = _affine_weights(ordered)
        return None if weights is None else weights @ ordered[1:]
