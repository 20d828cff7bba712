"""In-memory engine for the squared loss: coordinate descent on the Gram matrix.

When n ≫ p, one pass over X builds ``H = X_Wᵀ X_W / n`` and ``X_Wᵀy/n`` for a working set W of
columns (BLAS, float64 accumulation); after it every coordinate step costs O(|W|), and so
does the duality gap of the problem restricted to W, because for the squared loss every
quantity it needs is a quadratic form:

    ‖r‖²/n = ‖y‖²/n − 2θᵀXᵀy/n + θᵀHθ,   Xᵀr/n = Xᵀy/n − Hθ,   with r = y − Xθ.

The intercept is eliminated exactly by centring — H and Xᵀy are built from ``X − μ`` and
``y − ȳ`` (chunk by chunk for dense X, as ``XᵀX − nμμᵀ`` for sparse X, whose values are never
centred) and ``b = ȳ − μᵀθ``, which makes Σ r_i = 0, so the dual point ``a = r`` needs no
projection.

Ridge uses every column and is solved directly (Cholesky). With an L1 term, W starts as the
columns whose correlation with the residual at θ = 0 is near the threshold α·l1_ratio; after
each solve on W a certificate computed from X itself (one pass: margins, then Xᵀa) gives
the true duality gap and every column's correlation, and the columns outside W that violate
their optimality condition join W (the working-set strategy of glmnet's covariance mode and
of Blitz/Celer). Only that exact certificate is reported, so the rounding of the Gram
formulas can never certify a wrong model, and W decides only how the work is ordered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.engines import cholesky
from dask_scd.engines.base import Options, Run, Trace
from dask_scd.engines.certificates import primal_certificate
from dask_scd.kernels import newton as newton_kernels
from dask_scd.kernels.gram import gram_epoch
from dask_scd.kernels.layout import MajorMatrix

# Rows per chunk when building the centred Gram matrix of dense X: ~4 MiB float64 temporaries.
_CHUNK_BYTES = 4 << 20
# A column joins the working set when |x_jᵀr/n| ≥ this fraction of its L1 threshold.
_ADMIT = 0.9
# The restricted problem is solved to this fraction of tol before the exact certificate.
_INNER = 0.1
# Rounds without a new column nor a halved gap before the engine gives up (and warns).
_STALL_ROUNDS = 2
# ... counted only once the gap is below this share of the null model's loss.
_FLOOR = 1e-9
# Epochs without a new smallest p-space gap before the restricted solve stops.
_FLOOR_EPOCHS = 200
# Epochs with the same signs of θ before the exact step on that support is tried (once
# per sign pattern: a Cholesky of |S|³ against epochs of |W|²).
_STABLE_EPOCHS = 3


@dataclass
class GramSystem:
    """The squared-loss problem on the columns ``W``, reduced to |W|-space (centred if
    there is an intercept)."""

    columns: np.ndarray  # (k,), the working set W
    gram: np.ndarray  # (k, k) C order, Xcᵀ Xc / n
    xty: np.ndarray  # (k,), Xcᵀ yc / n
    yy: float  # ‖yc‖² / n
    x_mean: np.ndarray  # (k,), μ (zeros without intercept)
    y_mean: float  # ȳ (0 without intercept)
    n_samples: int

    @classmethod
    def from_array(cls, X, y, fit_intercept: bool, columns, weights=None) -> "GramSystem":
        """Build H, Xᵀy/n and ‖y‖²/n in float64 from dense or sparse X (never modified).

        With sample ``weights`` v (mean 1) every form is in the metric V = diag(v):
        H = XcᵀVXc/n, XcᵀVyc/n, ‖yc‖²_V/n, centred on the weighted means, so that
        Σ v_i r_i = 0 and the dual point a = v∘r needs no projection.
        """
        n, p = X.shape
        columns = np.asarray(columns, dtype=np.intp)
        every = len(columns) == p
        total = float(n) if weights is None else float(weights.sum())
        y_mean = obj.weighted_sum(y, weights) / total if fit_intercept else 0.0
        yc = y - y_mean
        vyc = yc if weights is None else weights * yc
        k = len(columns)
        if sp.issparse(X):
            # By rows, straight into a dense (k+1)²: Σ_i x_W,i x_W,iᵀ with the column sums
            # in the last row (scipy's sparse XᵀX and the format changes cost 3x more).
            rows = MajorMatrix.from_array(X, "rows")
            position = np.full(p, -1, dtype=np.int64)
            position[columns] = np.arange(k)
            out = np.zeros((k + 1, k + 1))
            newton_kernels.weighted_gram(
                rows.data,
                rows.indices,
                rows.indptr,
                n,
                position,
                np.ones(n) if weights is None else weights,
                True,
                out,
            )
            out += out.T - np.diag(out.diagonal())  # each pair landed in one triangle
            x_mean = out[:k, k] / total if fit_intercept else np.zeros(k)
            gram = out[:k, :k] - total * np.outer(x_mean, x_mean)  # (X − 1μᵀ)ᵀV(X − 1μᵀ)
            xty = rows.scatter(vyc)[columns]  # XcᵀVyc = XᵀVyc, since Σ v·yc = 0
        else:
            step = max(256, _CHUNK_BYTES // (8 * k))
            chunks = [slice(start, start + step) for start in range(0, n, step)]

            def chunk_of(rows):  # float64 rows of X_W (a view where they are), never all X_W
                return (X[rows] if every else X[rows, columns]).astype(np.float64, copy=False)

            x_mean = np.zeros(k)
            if fit_intercept and weights is None:
                x_mean = (
                    X.mean(axis=0, dtype=np.float64)
                    if every
                    else sum(chunk_of(rows).sum(axis=0) for rows in chunks) / n
                )
            elif fit_intercept:
                x_mean = (
                    weights @ X if every else sum(weights[rows] @ chunk_of(rows) for rows in chunks)
                ) / total
            roots = None if weights is None else np.sqrt(weights)
            gram = np.zeros((k, k))
            xty = np.zeros(k)
            # A gathered or converted chunk is a copy of its own: centred in place (or, with
            # x_mean all zeros, left as it is: x − 0 is x), the very values and layout of
            # ``chunk_of(rows) − x_mean`` without a second copy. A view of X is centred
            # into a copy.
            fresh = not every or X.dtype != np.float64
            for rows in chunks:
                chunk = chunk_of(rows)
                if not fresh:
                    chunk = chunk - x_mean
                elif fit_intercept:
                    chunk -= x_mean
                xty += chunk.T @ vyc[rows]
                if roots is not None:
                    chunk *= roots[rows, None]  # XcᵀVXc = (√v∘Xc)ᵀ(√v∘Xc)
                gram += chunk.T @ chunk  # symmetric rank-k update (BLAS syrk)
        scale = 1.0 / n
        gram = np.ascontiguousarray((gram + gram.T) * (0.5 * scale))  # exactly symmetric
        return cls(columns, gram, xty * scale, float(yc @ vyc) * scale, x_mean, y_mean, n)

    def intercept(self, coef) -> float:
        return self.y_mean - float(self.x_mean @ coef)

    def gradient(self, coef) -> np.ndarray:
        return self.gram @ coef - self.xty

    def certificate(self, problem: obj.Problem, coef, gradient) -> obj.Certificate:
        """Duality gap of (θ_W, b(θ_W)) on the columns W with the dual point a = r, in O(|W|)."""
        n = self.n_samples
        w_q = float(coef @ gradient)
        residual_sq = max(self.yy + w_q - float(coef @ self.xty), 0.0)  # ‖r‖²/n
        residual_dot_y = residual_sq - w_q  # rᵀy/n = rᵀyc/n = ‖r‖²/n + θᵀXcᵀr/n
        cert = obj.primal_certificate(
            problem,
            n,
            coef,
            loss_sum=0.5 * residual_sq * n,
            dual_loss_sum=(residual_dot_y - 0.5 * residual_sq) * n,  # Σ a_i y_i − a_i²/2
            correlation=-gradient,  # Xᵀr/n
            margin_dot_dual=-w_q * n,  # Σ r_i ŷ_i = rᵀyc − ‖r‖²
        )
        return obj.rescaled_lasso_from_dual(
            problem, cert, coef, lambda k: k * residual_dot_y - 0.5 * k * k * residual_sq
        )


def fit_gram(data: InMemory, problem: obj.Problem, options: Options) -> Run:
    """Squared loss, any penalty: coordinate descent on the Gram matrix of a working set."""
    X, y, weights = data.X, data.y, data.weights
    tol, max_iter, rng = options.tol, options.max_iter, options.rng
    # Building H is part of the solve: it is timed.
    trace = Trace(options.progress, options.callback)
    n_features = X.shape[1]
    exact = _ExactCertificate(X, y, problem, weights)
    coef = np.zeros(n_features)
    epoch = 0
    intercept = obj.zero_intercept(problem, y, weights)
    if options.start is not None:  # a warm start: its support enters the working set
        coef[:], intercept = options.start
    if problem.l1 > 0.0:
        cert, intercept = exact(coef, intercept)
        trace.record(0, cert.relative_gap, cert.primal, report=False)
        working = _admit(problem, cert, np.zeros(0, dtype=np.intp), coef)
    else:
        cert, working = None, np.arange(n_features)
    target = _INNER * tol
    system = None
    stalled = 0
    null_loss = 0.5 * float(
        np.average(
            (y - (np.average(y, weights=weights) if problem.fit_intercept else 0.0)) ** 2,
            weights=weights,
        )
    )
    while cert is None or cert.relative_gap > tol:
        if 2 * len(working) > n_features:
            working = np.arange(n_features)
        if system is None or not np.array_equal(system.columns, working):
            system = GramSystem.from_array(X, y, problem.fit_intercept, working, weights)
        sub, epoch = _solve(system, problem, coef[working], target, epoch, max_iter, rng)
        coef[:] = 0.0
        coef[working] = sub
        previous = cert
        cert, intercept = exact(coef, system.intercept(sub))
        if trace.certified(epoch, cert, tol) or epoch >= max_iter:
            break
        grown = _admit(problem, cert, working, coef)
        if len(grown) == len(working):  # W holds every violator: solve W more exactly
            # Twice no better than half the last gap: the certificate from X has reached
            # the rounding floor of this data (e.g. huge column means, a near-exact fit).
            # Far above that floor (the gap a large share of the null model's loss) the
            # inner solve is creeping, not stalled: it goes on, to max_iter at most.
            creeping = cert.gap > _FLOOR * null_loss
            stalled = (
                stalled + 1
                if (previous is not None and cert.gap > 0.5 * previous.gap and not creeping)
                else 0
            )
            if stalled >= _STALL_ROUNDS:
                break
            target = max(0.01 * target, 1e-16)
        working = grown
    return trace.ended(Run(coef, float(intercept), cert, epoch, trace.history))


def _solve(system: GramSystem, problem, coef, target, epoch, max_iter, rng):
    """Minimize on W until its Gram-space relative gap is ≤ target; returns θ_W and epochs."""
    coef = np.array(coef, dtype=np.float64)
    if problem.l1 == 0.0 and problem.l2 > 0.0:
        coef, solved = _ridge(system, problem)
        epoch += int(solved)
    gradient = system.gradient(coef)
    cert = system.certificate(problem, coef, gradient)
    order = np.arange(len(coef))
    best, since_best = cert.gap, 0
    pattern, stable, tried = None, 0, set()
    # Stop at the target, or when the gap has stopped improving: its rounding floor.
    while cert.relative_gap > target and epoch < max_iter and since_best < _FLOOR_EPOCHS:
        epoch += 1
        gram_epoch(system.gram, gradient, coef, rng.permutation(order), problem.l1, problem.l2)
        gradient = system.gradient(coef)  # exact again: no drift over many epochs
        cert = system.certificate(problem, coef, gradient)
        if problem.l1 > 0.0:
            signs = np.sign(coef)
            key = signs.tobytes()
            stable = stable + 1 if key == pattern else 0
            pattern = key
            # A step costs a factorization of |S|³/3 against |W|² per epoch: it waits for
            # a pattern stable that many epochs at least, so it stays cheap next to them.
            wait = max(_STABLE_EPOCHS, np.count_nonzero(signs) ** 3 // (3 * len(order) ** 2))
            if stable >= wait and key not in tried:
                stable, moved = 0, False
                jump = _support_step(system, problem, coef, signs)
                if jump is not None:
                    jump_gradient = system.gradient(jump)
                    jump_cert = system.certificate(problem, jump, jump_gradient)
                    if jump_cert.primal <= cert.primal:
                        coef, gradient, cert, moved = jump, jump_gradient, jump_cert, True
                if not moved:  # no progress from this pattern: not tried again
                    tried.add(key)
        best, since_best = (cert.gap, 0) if cert.gap < best else (best, since_best + 1)
    return coef, epoch


def _support_step(system: GramSystem, problem, coef, signs):
    """A step towards the exact minimizer on the support of θ with its signs.

    Coordinate descent finds the support and the signs of a lasso early, then creeps
    towards the optimum along correlated columns (one-hot fields without an intercept:
    2.1e-5 after 1000 epochs on Adult). With the signs s fixed on the support S the
    problem is quadratic: (H_SS + l2·I) θ_S = Xᵀy_S/n − l1·s. Its minimizer θ* is taken
    nearest to θ_S (where the columns are collinear it is not unique), and the step goes
    from θ_S towards θ* as far as the signs hold: the whole way if θ* keeps them (the
    optimum of the problem restricted to S), else up to the first coordinate that reaches
    zero, which leaves the support. Along that segment the quadratic only decreases, so
    the step never costs objective; the caller still keeps it only when its objective is
    no higher (rounding). None where the step does not move.
    """
    support = np.flatnonzero(signs)
    if len(support) == 0:
        return None
    start = coef[support]
    matrix = system.gram[np.ix_(support, support)] + problem.l2 * np.eye(len(support))
    rhs = system.xty[support] - problem.l1 * signs[support]
    residual = rhs - matrix @ start
    try:
        move = cholesky.solve(cholesky.factor(matrix), residual)
    except np.linalg.LinAlgError:
        move = None
    if (
        move is None
        or not np.all(np.isfinite(move))
        or np.linalg.norm(matrix @ move - residual) > 1e-9 * max(np.linalg.norm(rhs), 1e-300)
    ):
        # Collinear columns (one-hot fields that each sum to 1, no intercept): Cholesky
        # fails or returns noise; the least-norm correction instead, which keeps θ_S's
        # component along H's null space (the objective there changes by (l1·s − Xᵀy/n)ᵀv
        # only, which the caller's objective test weighs).
        move = scipy.linalg.lstsq(matrix, residual, cond=1e-12)[0]
    if not np.all(np.isfinite(move)):
        return None
    # The largest t ≤ 1 with sign(θ_S + t·move) = s: coordinates moving towards zero stop it.
    towards_zero = move * signs[support] < 0.0
    limits = -start[towards_zero] / move[towards_zero]
    step = min(1.0, float(limits.min())) if len(limits) else 1.0
    if step <= 0.0:
        return None
    theta = start + step * move
    if step < 1.0:  # the coordinate that reached zero leaves the support exactly
        theta[towards_zero] = np.where(limits <= step, 0.0, theta[towards_zero])
    theta[np.sign(theta) != signs[support]] = 0.0  # rounding across zero
    out = np.zeros_like(coef)
    out[support] = theta
    return out


def _ridge(system: GramSystem, problem: obj.Problem) -> tuple[np.ndarray, bool]:
    """The exact ridge solution of (H + αI)θ = Xᵀy/n (zeros if H is numerically singular)."""
    k = system.gram.shape[0]
    try:
        factor = cholesky.factor(system.gram + problem.l2 * np.eye(k))
    except np.linalg.LinAlgError:  # coordinate descent takes over
        return np.zeros(k), False
    return cholesky.solve(factor, system.xty), True


def _admit(problem, cert: obj.Certificate, working, coef) -> np.ndarray:
    """W ∪ {j : |x_jᵀr/n| ≥ _ADMIT·α·l1_ratio} ∪ {j : θ_j ≠ 0}, sorted."""
    near = np.abs(cert.correlation) >= _ADMIT * problem.l1
    return np.union1d(working, np.flatnonzero(near | (coef != 0.0)))


class _ExactCertificate:
    """The certificate of (θ, b) from X itself, in X's own layout (no copy of X)."""

    def __init__(self, X, y, problem, weights=None):
        by_rows = X.format != "csc" if sp.issparse(X) else not np.isfortran(np.asarray(X))
        self.by_rows = by_rows
        self.matrix = MajorMatrix.from_array(X, "rows" if by_rows else "columns")
        self.y, self.problem, self.weights = y, problem, weights

    def __call__(self, coef, intercept) -> tuple[obj.Certificate, float]:
        """The certificate of (θ, b'), with b' = b + mean(y − Xθ − b), and b'.

        b = ȳ − μᵀθ is exact in real arithmetic, but rounded it can be off by ε·|μᵀθ|,
        and that error adds up over n residuals (Σ r_i = n·ε, which the dual point must
        then project away). The residuals themselves are small numbers: their mean puts
        the intercept back where Σ r_i = 0 to the rounding of small numbers.
        """
        matrix = self.matrix
        if self.by_rows:
            transpose_dot = matrix.scatter
            # θ = 0 (the first certificate): Xθ is 0, no pass
            margins = matrix.dot(coef) if coef.any() else np.zeros(len(self.y))
        else:
            margins, transpose_dot = matrix.scatter(coef), matrix.dot  # skips θ_j = 0
        margins += intercept
        if self.problem.fit_intercept:
            shift = obj.optimal_intercept("squared", self.y, margins, weights=self.weights)
            margins += shift
            intercept += shift
        return primal_certificate(
            self.problem, transpose_dot, self.y, coef, margins, self.weights
        ), intercept
