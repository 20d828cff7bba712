"""Losses, penalties, their conjugates and the duality-gap certificate.

One module shared by every engine. The primal problem is (scikit-learn's scaling)::

    P(θ, b) = (1/n) Σ_i ℓ(y_i, x_iᵀθ + b) + α (ρ‖θ‖₁ + (1−ρ)/2 ‖θ‖²)

and its Fenchel dual, with one dual variable ``a_i`` per example
(``a_i = −ℓ'(y_i, ŷ_i)`` at the optimum, so for squared loss ``a`` is the residual)::

    D(a) = (1/n) Σ_i −ℓ*(−a_i) − Σ_j g*_j(x_jᵀa / n),   subject to Σ_i a_i = 0 if b is fitted

where ``g_j(t) = α(ρ|t| + (1−ρ)/2 t²)``. For the lasso (ρ = 1) ``g*`` is an indicator;
the Lipschitzing trick of the DuHL paper bounds the support of ``g`` by
``B ≥ P(θ)/α ≥ ‖θ*‖₁`` which turns ``g*`` into ``B·max(0, |s| − α)``.

The gap splits per coordinate (DuHL eq. 4): for a feature ``j`` with ``s_j = x_jᵀa/n``,
``gap_j = g_j(θ_j) + g*_j(s_j) − s_j θ_j ≥ 0``; the remainder
``(1/n) Σ_i [ℓ_i(ŷ_i) + ℓ*_i(−a_i) + a_i ŷ_i] ≥ 0`` is zero when ``a = −ℓ'(ŷ)`` and is
charged to the intercept, whose dual constraint ``Σ a_i = 0`` forces a projection.

Everything here is plain array code on ``numpy`` arrays, so the same functions serve the
in-memory engine on whole vectors and the dask engine on row chunks (partial sums).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import entr, expit

from dask_scd.objectives import bounds as box
from dask_scd.objectives.bounds import Bounds
from dask_scd.objectives.intercept import hinge_intercept, weighted_hinge_intercept
from dask_scd.objectives.shift import best_shift as best_shift
from dask_scd.objectives.weights import check_sample_weight as check_sample_weight

LOSSES = ("squared", "logistic", "hinge", "squared_hinge")
PENALTIES = ("l2", "l1", "elasticnet")
CLASSIFICATION_LOSSES = ("logistic", "hinge", "squared_hinge")
# The softmax loss of K classes (dask_scd.objectives.multinomial): K coefficient vectors, labels
# mapped to class indices; no numba loss code (its kernels are dask_scd.kernels.softmax).
MULTINOMIAL = "multinomial"
# penalty=None: no regularization, no dual (the Newton engine stops on the gradient).
UNPENALIZED_LOSSES = ("squared", "logistic", MULTINOMIAL)

# Integer codes used by the numba kernels (they cannot take strings cheaply).
LOSS_CODES = {name: code for code, name in enumerate(LOSSES)}

# Relative allowance for the rounding of a dual value computed from sums that a pass over
# X did not give directly (a Newton model's dual point, its Xᵀa'/n read off the Hessian):
# such a point is tight enough for the gap to reach the rounding of P, so the value it
# certifies is lowered by this fraction to stay a bound (the Newton engines).
DUAL_ROUNDING = 1e-14


@dataclass(frozen=True)
class Problem:
    """A regularized linear problem: loss, penalty and their weights.

    Parameters
    ----------
    loss : str
        One of :data:`LOSSES`.
    alpha : float
        The penalty's weight α ≥ 0.
    l1_ratio : float
        The effective ρ of α(ρ‖θ‖₁ + (1 − ρ)/2‖θ‖²): 0 for ``"l2"``, 1 for ``"l1"``.
    fit_intercept : bool
        Whether an unpenalized intercept b is fitted.
    bounds : Bounds or None
        The box l ≤ θ ≤ u of the coefficients (:mod:`dask_scd.objectives.bounds`), in the
        column order of the data the engine reads; None: no constraint.
    """

    loss: str
    alpha: float
    l1_ratio: float
    fit_intercept: bool
    bounds: Bounds | None = None

    def __repr__(self) -> str:  # names a default checkpoint: unchanged without bounds
        bounds = "" if self.bounds is None else f", bounds={self.bounds!r}"
        return (
            f"Problem(loss={self.loss!r}, alpha={self.alpha!r}, l1_ratio={self.l1_ratio!r}, "
            f"fit_intercept={self.fit_intercept!r}{bounds})"
        )

    @property
    def unpenalized(self) -> bool:
        """No regularization (``penalty=None``): no dual, so no duality gap."""
        return self.alpha == 0.0

    @property
    def loss_code(self) -> int:
        return LOSS_CODES[self.loss]

    @property
    def l1(self) -> float:
        """Weight of ‖θ‖₁ in the objective: αρ."""
        return self.alpha * self.l1_ratio

    @property
    def l2(self) -> float:
        """Weight of ½‖θ‖² in the objective: α(1−ρ)."""
        return self.alpha * (1.0 - self.l1_ratio)


# --------------------------------------------------------------------------- losses


def loss_value(loss: str, y, z):
    """ℓ(y, z) elementwise."""
    if loss == "squared":
        return 0.5 * (y - z) ** 2
    if loss == "logistic":
        return np.logaddexp(0.0, -y * z)
    if loss == "hinge":
        return np.maximum(0.0, 1.0 - y * z)
    if loss == "squared_hinge":
        return np.maximum(0.0, 1.0 - y * z) ** 2
    raise ValueError(f"unknown loss {loss!r}")


def loss_derivative(loss: str, y, z):
    """∂ℓ/∂z elementwise (a subgradient for the hinge: 0 at the kink)."""
    if loss == "squared":
        return z - y
    if loss == "logistic":
        return -y * expit(-y * z)
    if loss == "hinge":
        return np.where(y * z < 1.0, -y, 0.0)
    if loss == "squared_hinge":
        return -2.0 * y * np.maximum(0.0, 1.0 - y * z)
    raise ValueError(f"unknown loss {loss!r}")


def loss_second_derivative(loss: str, y, z):
    """∂²ℓ/∂z² elementwise (generalized Hessian for the squared hinge, 0 for the hinge)."""
    if loss == "squared":
        return np.ones_like(z)
    if loss == "logistic":
        s = expit(y * z)
        return s * (1.0 - s)
    if loss == "hinge":
        return np.zeros_like(z)
    if loss == "squared_hinge":
        return np.where(y * z < 1.0, 2.0, 0.0)
    raise ValueError(f"unknown loss {loss!r}")


def dual_loss(loss: str, y, a, weights=None):
    """−ℓ*(−a) elementwise: the dual's per-example term; −inf outside its domain.

    With sample ``weights`` v (the loss of example i is v_i·ℓ_i) the term is that of
    v_i·ℓ_i, ``−(v_iℓ_i)*(−a_i) = v_i·(−ℓ*(−a_i/v_i))``: the domain of a_i scales with v_i
    (β = a·y ∈ [0, v_i] for the logistic and the hinge), and an example of weight 0 admits
    a_i = 0 alone (term 0).

    With ``β = a·y`` the domains are: squared, all of ℝ; logistic and hinge, β ∈ [0, 1];
    squared hinge, β ≥ 0. A relative slack of 1e-12 absorbs rounding at the boundary.
    """
    if weights is not None:
        return _weighted_dual_loss(loss, y, a, weights)
    if loss == "squared":
        return a * y - 0.5 * a * a
    beta = a * y
    eps = 1e-12
    if loss == "logistic":
        inside = (beta >= -eps) & (beta <= 1.0 + eps)
        b = np.minimum(np.maximum(beta, 0.0), 1.0)  # np.clip, cheaper
        return np.where(inside, entr(b) + entr(1.0 - b), -np.inf)
    if loss == "hinge":
        inside = (beta >= -eps) & (beta <= 1.0 + eps)
        return np.where(inside, np.minimum(np.maximum(beta, 0.0), 1.0), -np.inf)
    if loss == "squared_hinge":
        b = np.maximum(beta, 0.0)
        return np.where(beta >= -eps, b - 0.25 * b * b, -np.inf)
    raise ValueError(f"unknown loss {loss!r}")


def _weighted_dual_loss(loss: str, y, a, weights):
    """v·(−ℓ*(−a/v)), and for v = 0: 0 at a = 0, −inf elsewhere (the conjugate of 0·ℓ)."""
    positive = weights > 0.0
    scale = np.where(positive, weights, 1.0)
    with np.errstate(invalid="ignore"):
        terms = weights * dual_loss(loss, y, a / scale)
    return np.where(positive, terms, np.where(a == 0.0, 0.0, -np.inf))


def weighted_sum(values, weights) -> float:
    """Σ v_i·values_i (Σ values_i without weights)."""
    if weights is None:
        return float(values.sum())
    return vdot(values, weights)


# ------------------------------------------------------------------------- penalties


def vdot(u, v) -> float:
    """Σ u_k v_k without BLAS: a threaded BLAS dot on a mid-sized vector can cost
    milliseconds of thread wake-up on a busy machine, more than a whole epoch."""
    return float(np.multiply(u, v).sum())


def penalty_terms(problem: Problem, coef):
    """g_j(θ_j) = α(ρ|θ_j| + (1−ρ)/2 θ_j²) elementwise (the independent numpy formula that
    the tests hold :func:`dask_scd.kernels.scalar.penalty` to); +inf outside the bounds."""
    if problem.bounds is not None:
        return box.penalty_terms(problem.l1, problem.l2, problem.bounds, coef)
    return problem.l1 * np.abs(coef) + 0.5 * problem.l2 * coef * coef


def penalty_value(problem: Problem, coef) -> float:
    """α(ρ‖θ‖₁ + (1−ρ)/2 ‖θ‖²)."""
    # A zero weight's term is 0 (θ is finite) and adding it changes no bit: not computed.
    l1 = problem.l1 * np.abs(coef).sum() if problem.l1 != 0.0 else 0.0
    l2 = 0.5 * problem.l2 * vdot(coef, coef) if problem.l2 != 0.0 else 0.0
    return float(l1 + l2)


def penalty_conjugate(problem: Problem, s, bound: float):
    """g*_j(s_j) elementwise; ``bound`` is the Lipschitzing support bound B (used when ρ = 1).
    With bounds, the conjugate of the penalty restricted to the box."""
    if problem.bounds is not None:
        return box.conjugate(problem.l1, problem.l2, problem.bounds, s, bound)
    excess = np.maximum(np.abs(s) - problem.l1, 0.0)
    if problem.l2 > 0.0:
        return excess * excess / (2.0 * problem.l2)
    return bound * excess


def lipschitz_bound(problem: Problem, primal: float) -> float:
    """B with ‖θ*‖₁ ≤ P*/α ≤ P(θ)/α (only the L1 part of the penalty bounds θ*)."""
    if problem.l1 <= 0.0:
        return np.inf
    return primal / problem.l1


# ------------------------------------------------------------------ dual from margins


def margin_sums(problem: Problem, y, margins, weights=None) -> dict:
    """Partial sums over examples that the certificate needs (one pass over margins).

    Returns ``loss`` = Σ ℓ(y_i, ŷ_i), and ``pos`` / ``neg`` = the sums of the positive and
    negative entries of ``a = −ℓ'(ŷ)``; they decide the projection onto Σ a_i = 0.
    Associative: partial dicts from row chunks are added key by key. With sample
    ``weights`` v: Σ v_i ℓ(y_i, ŷ_i) and a = −v∘ℓ'(ŷ).
    """
    a = dual_direction(problem, y, margins, weights)
    return {
        "loss": weighted_sum(loss_value(problem.loss, y, margins), weights),
        "pos": float(a[a > 0].sum()),
        "neg": float(a[a < 0].sum()),
    }


def dual_scales(problem: Problem, sums: dict) -> tuple[float, float]:
    """Factors for the positive and negative parts of ``a`` so that Σ a_i = 0.

    Shrinking one sign's entries towards zero keeps every ``a_i`` in its domain for all four
    losses (each domain contains the segment from 0 to a_i). Without an intercept the dual
    has no constraint and ``a = −ℓ'(ŷ)`` is used as it is.
    """
    if not problem.fit_intercept:
        return 1.0, 1.0
    total = sums["pos"] + sums["neg"]
    if total > 0.0:
        return 1.0 - total / sums["pos"], 1.0
    if total < 0.0:
        return 1.0, 1.0 - total / sums["neg"]
    return 1.0, 1.0


def project_sum_zero(a):
    """Shrink the positive or the negative entries of ``a`` so that Σ a_i = 0.

    Every dual domain contains the segment from 0 to a_i, so the result stays feasible.
    """
    sums = {"pos": float(a[a > 0].sum()), "neg": float(a[a < 0].sum())}
    scales = dual_scales(Problem("squared", 1.0, 0.0, True), sums)
    return np.where(a > 0, a * scales[0], a * scales[1])


def dual_point(problem: Problem, y, margins, scales: tuple[float, float], weights=None):
    """The feasible dual vector ``a`` built from the margins (a = −ℓ'(ŷ), projected;
    a = −v∘ℓ'(ŷ) with sample weights v)."""
    a = dual_direction(problem, y, margins, weights)
    return np.where(a > 0, a * scales[0], a * scales[1])


def dual_direction(problem: Problem, y, margins, weights=None):
    """a = −ℓ'(ŷ), or −v∘ℓ'(ŷ) with sample ``weights`` v: the dual point before its
    projection onto Σ a_i = 0."""
    a = -loss_derivative(problem.loss, y, margins)
    return a if weights is None else a * weights


# ---------------------------------------------------------------------- certificate


@dataclass(frozen=True)
class Certificate:
    """Primal and dual objectives, the duality gap and its split over coordinates.

    Attributes
    ----------
    primal : float
        The primal objective P(θ, b).
    dual : float
        The dual objective D of the dual point built from (θ, b); P − D ≥ 0 is the gap.
    coordinate_gaps : ndarray
        One entry per feature (or per example for a dual certificate).
    intercept_gap : float
        The rest: ``coordinate_gaps.sum() + intercept_gap == gap``.
    correlation : ndarray or None
        Xᵀa/n of the dual point a (primal certificates), for the working sets.
    """

    primal: float
    dual: float
    coordinate_gaps: np.ndarray
    intercept_gap: float
    correlation: np.ndarray | None = None  # Xᵀa/n, a = −ℓ'(ŷ) projected (primal certificates)

    @property
    def gap(self) -> float:
        return self.primal - self.dual

    @property
    def relative_gap(self) -> float:
        return relative_gap(self.primal, self.dual)


def relative_gap(primal: float, dual: float) -> float:
    """``(P − D) / |P|``, the stopping criterion (0/0 is taken as 0)."""
    gap = max(primal - dual, 0.0)
    if gap == 0.0:
        return 0.0
    return gap / abs(primal) if primal != 0.0 else np.inf


def primal_certificate(
    problem: Problem,
    n_samples: int,
    coef,
    loss_sum: float,
    dual_loss_sum: float,
    correlation,
    margin_dot_dual: float,
) -> Certificate:
    """Certificate for (θ, b) from reduced statistics of the dual point ``a``.

    Parameters
    ----------
    loss_sum : Σ_i ℓ(y_i, ŷ_i).
    dual_loss_sum : Σ_i −ℓ*(−a_i).
    correlation : array of shape (n_features,), ``Xᵀa / n``.
    margin_dot_dual : Σ_i a_i ŷ_i.
    """
    n = float(n_samples)
    coef = np.asarray(coef, dtype=np.float64)
    primal = loss_sum / n + penalty_value(problem, coef)
    bound = lipschitz_bound(problem, primal)
    g = penalty_terms(problem, coef)
    g_star = penalty_conjugate(problem, correlation, bound)
    if np.isfinite(bound) and problem.bounds is None:  # every term finite
        coordinate_gaps = g + g_star - correlation * coef
    else:
        with np.errstate(invalid="ignore"):
            coordinate_gaps = g + g_star - correlation * coef
    dual = dual_loss_sum / n - float(g_star.sum())
    # Fenchel–Young remainder of the loss; zero when a = −ℓ'(ŷ) exactly.
    intercept_gap = (loss_sum - dual_loss_sum + margin_dot_dual) / n
    return Certificate(primal, dual, coordinate_gaps, intercept_gap, correlation)


def gradient_certificate(problem: Problem, n_samples: int, coef, loss_sum: float, correlation):
    """The certificate of the dual point a = −v∘ℓ'(ŷ), unprojected, of a smooth L2 problem
    without an intercept or bounds, from the gradient alone: no pass over the losses' duals.

    There the Fenchel–Young remainder of the loss is zero and the gap is, coordinate by
    coordinate, g(θ_j) + g*(c_j) − c_jθ_j = (l2·θ_j − c_j)²/(2·l2) with c = Xᵀa/n = −∇f:
    ‖∇P‖²/(2·l2), also the strong-convexity bound on P − P*. Written as that sum of squares
    it does not cancel, as P − D does below ~1e-13·P.
    """
    coef = np.asarray(coef, dtype=np.float64)
    primal = loss_sum / float(n_samples) + penalty_value(problem, coef)
    slope = problem.l2 * coef - correlation
    coordinate_gaps = slope * slope / (2.0 * problem.l2)
    dual = primal - float(coordinate_gaps.sum())
    return Certificate(primal, dual, coordinate_gaps, 0.0, correlation)


def gradient_certifies(problem: Problem) -> bool:
    """Whether :func:`gradient_certificate` applies: a smooth loss, an L2 term alone, no
    intercept, no bounds."""
    return (
        problem.loss != "hinge"
        and problem.l1 == 0.0
        and problem.l2 > 0.0
        and not problem.fit_intercept
        and problem.bounds is None
    )


def rescaled_lasso_certificate(
    problem: Problem, cert: Certificate, y, a, coef, weights=None
) -> Certificate:
    """For a pure L1 penalty, also try the rescaled dual point κa, κ = min(1, α/‖Xᵀa/n‖∞).

    κa is feasible for the lasso's constrained dual (no Lipschitzing term), which is the
    tighter certificate while a few correlations still exceed α; the better of the two
    valid certificates is returned. Scaling keeps Σ a_i = 0 and every a_i in its domain.
    """
    n = len(y)
    return rescaled_lasso_from_dual(
        problem,
        cert,
        coef,
        lambda kappa: float(dual_loss(problem.loss, y, kappa * a, weights).sum()) / n,
    )


def rescaled_lasso_from_dual(
    problem: Problem, cert: Certificate, coef, dual_loss_mean
) -> Certificate:
    """:func:`rescaled_lasso_certificate` given ``dual_loss_mean(κ) = Σ_i −ℓ*(−κa_i) / n``."""
    if problem.l1 <= 0.0 or problem.l2 > 0.0 or cert.correlation is None:
        return cert
    if problem.bounds is not None:  # κ for the open sides, the box's g*(κs) charged
        bound = lipschitz_bound(problem, cert.primal)
        kappa, g_star, coordinate_gaps = box.rescaled(problem, cert.correlation, coef, bound)
        dual = dual_loss_mean(kappa) - g_star
    else:
        top = float(np.abs(cert.correlation).max(initial=0.0))
        kappa = min(1.0, problem.l1 / top) if top > 0 else 1.0
        if kappa == 1.0:  # κa = a, whose conjugate term is then 0: the dual of ``cert``
            return cert
        dual = dual_loss_mean(kappa)
        coordinate_gaps = problem.l1 * np.abs(coef) - kappa * cert.correlation * coef  # g*(κs) = 0
    if not dual > cert.dual:
        return cert
    intercept_gap = cert.primal - dual - float(coordinate_gaps.sum())
    # ``correlation`` stays that of a = −ℓ'(ŷ): working sets read the true violations.
    return Certificate(cert.primal, dual, coordinate_gaps, intercept_gap, cert.correlation)


def certificate(
    problem: Problem, X, y, coef, intercept: float, margins=None, weights=None, correlation=None
) -> Certificate:
    """Duality-gap certificate of (θ, b) for in-memory X (numpy or scipy.sparse).

    Parameters
    ----------
    problem : Problem
    X : array of shape (n_samples, n_features)
    y : array of shape (n_samples,), labels (±1 for classification losses)
    coef : array of shape (n_features,)
    intercept : float
    margins : array of shape (n_samples,), optional; ``X @ coef + intercept`` if given.
    weights : array of shape (n_samples,), optional
        Sample weights v scaled to mean 1 (:func:`dask_scd.validation.check_sample_weight`):
        the objective's loss term is then ``(1/n) Σ v_i ℓ(y_i, ŷ_i)``.
    correlation : array of shape (n_features,), optional; Xᵀa/n of the dual point these
        margins give, if known (it costs a pass over X otherwise).

    Returns
    -------
    Certificate
        P, D, the gap's split over the coordinates and the intercept.

    The multinomial loss has its own: :func:`dask_scd.objectives.multinomial.certificate`.
    """
    if problem.loss == MULTINOMIAL:
        raise ValueError(
            "loss='multinomial' has K coefficient vectors: certify it with "
            "dask_scd.objectives.multinomial.certificate(problem, X, codes, coef, intercept)"
        )
    if margins is None:
        margins = np.asarray(X @ coef).ravel() + intercept
    sums = margin_sums(problem, y, margins, weights)
    a = dual_point(problem, y, margins, dual_scales(problem, sums), weights)
    if correlation is None:
        correlation = np.asarray(X.T @ a).ravel() / len(y)
    cert = primal_certificate(
        problem,
        len(y),
        coef,
        sums["loss"],
        float(dual_loss(problem.loss, y, a, weights).sum()),
        correlation,
        vdot(a, margins),
    )
    return rescaled_lasso_certificate(
        problem, cert, y, a, np.asarray(coef, dtype=np.float64), weights
    )


def sdca_certificate(problem: Problem, y, dual_coef, coef, margins, weights=None) -> Certificate:
    """Certificate from an SDCA dual iterate ``a`` with ``w = Xᵀa/(αn)`` (L2 problems).

    ``margins`` are ``X w + b`` with any b (Σ a_i = 0 makes b drop out of the dual). The gap
    splits per example: ``gap_i = (ℓ_i(ŷ_i) + ℓ*_i(−a_i) + a_i ŷ_i)/n`` (DuHL eq. 4).
    """
    n = len(y)
    losses = loss_value(problem.loss, y, margins)
    if weights is not None:
        losses = losses * weights
    duals = dual_loss(problem.loss, y, dual_coef, weights)
    half_sq = 0.5 * problem.alpha * vdot(coef, coef)
    primal = float(losses.sum()) / n + half_sq
    dual = float(duals.sum()) / n - half_sq
    # Σ a_i ŷ_i / n = α‖w‖² + b Σ a_i / n, so the per-example terms add up to P − D.
    coordinate_gaps = (losses - duals + dual_coef * margins) / n
    return Certificate(primal, dual, coordinate_gaps, 0.0)


# ------------------------------------------------------------------ intercept alone


def optimal_intercept(loss: str, y, margins, start: float = 0.0, weights=None) -> float:
    """argmin_b (1/n) Σ v_i ℓ(y_i, m_i + b) for fixed margins ``m`` (1-D convex problem;
    v = 1 without sample ``weights``)."""
    if loss == "squared":
        if weights is not None:
            return vdot(weights, y - margins) / float(weights.sum())
        return float(np.mean(y - margins))
    if loss == "hinge":
        if weights is not None:
            return weighted_hinge_intercept(y, margins, weights)
        return hinge_intercept(y, margins)
    # Newton on the derivative, safeguarded by a bracket (the derivative is monotone).
    # Newton converges quadratically down to the rounding of the sum of the derivatives;
    # there it stops, instead of bisecting the noise for tens of passes over n examples.
    b, lo, hi = float(start), -np.inf, np.inf
    for _ in range(100):
        z = margins + b
        d1 = loss_derivative(loss, y, z)
        grad = weighted_sum(d1, weights)
        floor = 16 * np.finfo(float).eps * weighted_sum(np.abs(d1), weights)
        if abs(grad) <= floor:
            return b
        hess = weighted_sum(loss_second_derivative(loss, y, z), weights)
        if grad > 0:
            hi = b
        else:
            lo = b
        step = b - grad / hess if hess > 0 else np.nan
        if not (lo < step < hi):
            if np.isfinite(lo) and np.isfinite(hi):
                step = 0.5 * (lo + hi)
            else:
                step = b - np.sign(grad) * max(1.0, abs(b))
        if abs(step - b) <= 1e-15 * max(1.0, abs(b)):
            return step
        b = step
    return b


def zero_intercept(problem: Problem, y, weights=None) -> float:
    """b₀, the best intercept at θ = 0 (0 without an intercept): where an engine, a path's
    alpha_max and the Newton engines start."""
    if not problem.fit_intercept:
        return 0.0
    return optimal_intercept(problem.loss, y, np.zeros(len(y)), weights=weights)
