"""The multinomial (softmax) logistic loss, its dual and its duality-gap certificate.

With K classes, coefficients W of shape (n_features, K) (one column per class; the
estimators show its transpose as ``coef_``) and intercepts b of shape (K,), the primal
problem in scikit-learn's scaling is::

    P(W, b) = (1/n) Σ_i [log Σ_k exp(z_ik) − z_{i,c_i}] + Σ_jk g(W_jk),   z_i = x_iᵀW + b

for labels c_i ∈ {0, ..., K−1} and the penalty g(t) = α(ρ|t| + (1−ρ)/2 t²) of every
other problem (:mod:`dask_scd.objectives`): scikit-learn's ``C`` maps to α = 1/(C·n).

The conjugate of log-sum-exp is the negative entropy on the simplex, so the Fenchel dual
has one K-vector ``a_i`` per example, with ``q_i = e_{c_i} − a_i`` a probability vector::

    D(A) = (1/n) Σ_i H(q_i) − Σ_jk g*((XᵀA)_jk / n),   H(q) = −Σ_k q_k log q_k,
    subject to Σ_i a_i = 0 (one constraint per class) when b is fitted.

The dual point of (W, b) is read off the gradient of the loss: a_i = −∇ℓ_i(z_i) =
e_{c_i} − p_i, i.e. q_i = p_i, the softmax probabilities. Away from the optimum their
column sums s_k = Σ_i p_ik miss the class counts n_k = Σ_i [c_i = k]; the certificate
mixes every row with one distribution π::

    q_i ← (1 − t) p_i + t π,   t = max(0, 1 − min_k n_k / s_k),   π = (n − (1 − t) s) / (t n)

the smallest t for which π ≥ 0; then Σ_i q_i = n (the counts), every q_i stays on the
simplex, and XᵀQ = (1 − t) XᵀP + t (Xᵀ1) πᵀ needs no pass over X beyond the gradient's.
For a pure L1 penalty g* is an indicator: the Lipschitzing bound B = P/α gives the
finite g*(s) = B·max(0, |s| − α), and the rescaled point κA, κ = min(1, α/‖XᵀA/n‖∞)
(q_i ← (1 − κ) e_{c_i} + κ q_i, still on the simplex), is feasible for the constrained
dual; the higher of the two dual values is kept. Every dual value is lowered by its
rounding (a relative 1e-14), so the gap P − D stays ≥ 0 at the optimum.

With sample weights v (scaled to mean 1, :func:`dask_scd.objectives.check_sample_weight`:
the objective (1/Σw) Σ w_i ℓ_i is (1/n) Σ v_i ℓ_i) the loss of example i is v_i·ℓ_i,
whose conjugate scales its dual variable: a_i = v_i(e_{c_i} − q_i) with q_i on the
simplex, and the dual term is v_i·H(q_i)::

    D(A) = (1/n) Σ_i v_i H(q_i) − Σ_jk g*((XᵀA)_jk / n),   Σ_i v_i q_i = Σ_i v_i e_{c_i}

(an example of weight 0 has a_i = 0 and no term). The dual point is again q_i = p_i, and
everything above holds with weighted sums: s_k = Σ_i v_i p_ik, n_k = Σ_i v_i [c_i = k]
(both summing to Σ_i v_i = n), XᵀVP, XᵀVY and Xᵀv in place of XᵀP, XᵀY and Xᵀ1.
"""

from __future__ import annotations

import numpy as np
from scipy.special import entr, logsumexp

from dask_scd import objectives as obj


def softmax_rows(margins):
    """(probabilities, log-sum-exp of each row) of margins of shape (n_samples, K)."""
    top = margins.max(axis=1, keepdims=True)
    shifted = np.exp(margins - top)
    total = shifted.sum(axis=1, keepdims=True)
    return shifted / total, (np.log(total) + top)[:, 0]


def loss_sum(margins, codes, weights=None) -> float:
    """Σ_i v_i [log Σ_k exp(z_ik) − z_{i,c_i}] (v_i = 1 without ``weights``)."""
    rows = np.arange(len(codes))
    return obj.weighted_sum(logsumexp(margins, axis=1) - margins[rows, codes], weights)


def weighted_rows(M, weights):
    """diag(v)·M for M of shape (n_samples, K); M itself without ``weights``."""
    return M if weights is None else M * weights[:, None]


def class_counts(codes, n_classes: int, weights=None):
    """n_k = Σ_i v_i [c_i = k] of shape (K,), float64 (the class counts without weights)."""
    return np.bincount(codes, weights=weights, minlength=n_classes).astype(np.float64)


def check_class_weights(counts, fit_intercept: bool) -> None:
    """Refuse a class of zero total weight with an intercept: its b_k would go to −∞
    (the loss falls as b_k does, and nothing pulls it back)."""
    if fit_intercept and not (counts > 0.0).all():
        empty = np.flatnonzero(~(counts > 0.0)).tolist()
        raise ValueError(
            f"sample_weight gives the classes at indices {empty} a total weight "
            "of 0: with fit_intercept=True their intercepts have no finite "
            "optimum (drop those classes, or give them weight)"
        )


def one_hot(codes, n_classes: int):
    """Y of shape (n_samples, K), Y_ik = [c_i = k] (float64)."""
    Y = np.zeros((len(codes), n_classes))
    Y[np.arange(len(codes)), codes] = 1.0
    return Y


def mixing(column_sums, counts) -> tuple[float, np.ndarray]:
    """(t, π) that make Σ_i q_i equal the class counts (see the module's docstring).

    ``column_sums`` s_k = Σ_i p_ik, ``counts`` n_k; both of shape (K,), both summing to n.
    """
    n = float(counts.sum())
    with np.errstate(divide="ignore"):
        ratios = counts / column_sums
    k = int(np.argmin(ratios))
    t = 1.0 - float(ratios[k])
    if not t > 0.0:
        return 0.0, counts / n
    # t·n·π = n − (1 − t)s, written so that π_k = 0 exactly where the ratio is smallest
    # (the difference cancels there) and no entry goes below 0 by rounding.
    share = np.maximum(counts - ratios[k] * column_sums, 0.0)
    share[k] = 0.0
    total = float(share.sum())
    if not total > 0.0:  # s = n up to rounding: P itself is feasible
        return 0.0, counts / n
    return t, share / total


def entropy_sum(Q, weights=None) -> float:
    """Σ_i v_i H(q_i) = −Σ_ik v_i q_ik log q_ik (0 log 0 = 0; v_i = 1 without ``weights``)."""
    if weights is None:
        return float(entr(Q).sum())
    return obj.weighted_sum(entr(Q).sum(axis=1), weights)


def penalty_value(problem: obj.Problem, W) -> float:
    return obj.penalty_value(problem, W.ravel())


def certify(
    problem: obj.Problem,
    W,
    codes,
    probabilities,
    loss_total: float,
    xt_prob,
    xt_onehot,
    column_sums_x,
    counts,
    weights=None,
) -> tuple[obj.Certificate, dict]:
    """Certificate of (W, b) from the gradient's own sums: no pass over X.

    With sample ``weights`` v the sums are the weighted ones (see the module's
    docstring): Σ_i v_i ℓ_i, XᵀVP, XᵀVY, Xᵀv and the weighted class counts.

    Parameters
    ----------
    W : array of shape (n_features, K)
    codes : array of shape (n_samples,), class indices
    probabilities : array of shape (n_samples, K), the softmax p_i at (W, b)
    loss_total : Σ_i v_i ℓ_i(z_i)
    xt_prob : array of shape (n_features, K), XᵀVP
    xt_onehot : array of shape (n_features, K), XᵀVY
    column_sums_x : array of shape (n_features,), Xᵀv
    counts : array of shape (K,), the (weighted) class counts n_k
    weights : array of shape (n_samples,), optional
        The sample weights v scaled to mean 1; None: every example weighs 1.

    Returns
    -------
    (Certificate, parts): ``coordinate_gaps`` and ``correlation`` of shape (n_features, K);
    ``parts`` holds the mixing ``t`` and the rescaling ``kappa`` used.
    """
    n = len(codes)
    t, pi = 0.0, None
    if problem.fit_intercept:
        t, pi = mixing(weighted_rows(probabilities, weights).sum(axis=0), counts)
    # XᵀA/n with A = V(Y − Q), Q = (1 − t)P + t·1πᵀ
    xt_q = (1.0 - t) * xt_prob
    if t > 0.0:
        xt_q = xt_q + t * np.outer(column_sums_x, pi)
    correlation = (xt_onehot - xt_q) / n
    primal = loss_total / n + penalty_value(problem, W)
    bound = obj.lipschitz_bound(problem, primal)
    Q = probabilities if t == 0.0 else (1.0 - t) * probabilities + t * pi
    entropy = entropy_sum(Q, weights) / n
    g = obj.penalty_terms(problem, W)
    g_star = obj.penalty_conjugate(problem, correlation, bound)
    with np.errstate(invalid="ignore"):
        coordinate_gaps = g + g_star - correlation * W
    dual = _rounded_down(entropy - float(g_star.sum()))
    kappa = 1.0
    if problem.l1 > 0.0 and problem.l2 == 0.0:
        top = float(np.abs(correlation).max(initial=0.0))
        kappa = min(1.0, problem.l1 / top) if top > 0 else 1.0
        # q_i ← (1 − κ) e_{c_i} + κ q_i: on the simplex, column sums still the counts.
        scaled = kappa * Q
        scaled[np.arange(n), codes] += 1.0 - kappa
        rescaled = _rounded_down(entropy_sum(scaled, weights) / n)
        if rescaled > dual:
            dual = rescaled
            coordinate_gaps = problem.l1 * np.abs(W) - kappa * correlation * W
    intercept_gap = primal - dual - float(coordinate_gaps.sum())
    cert = obj.Certificate(primal, dual, coordinate_gaps, intercept_gap, correlation)
    return cert, {"t": t, "kappa": kappa}


def _rounded_down(dual: float) -> float:
    """D lowered by the rounding of its n·K terms (``objectives.DUAL_ROUNDING``): at the
    optimum P and D agree to that rounding, and the certified gap stays a bound."""
    return dual - obj.DUAL_ROUNDING * abs(dual)


def certificate(
    problem: obj.Problem, X, codes, coef, intercept, sample_weight=None
) -> obj.Certificate:
    """Duality-gap certificate of a multinomial model (ours or another library's).

    Parameters
    ----------
    X : array or scipy.sparse matrix of shape (n_samples, n_features)
    codes : array of shape (n_samples,), class indices 0..K−1
    coef : array of shape (K, n_features)
    intercept : array of shape (K,) (zeros without an intercept)
    sample_weight : array of shape (n_samples,), optional
        Non-negative weights w of the examples: the certificate is of the weighted
        objective (1/Σw) Σ w_i ℓ_i + penalty.

    Returns
    -------
    Certificate
        ``coordinate_gaps`` and ``correlation`` of shape (K, n_features).
    """
    coef = np.asarray(coef, dtype=np.float64)
    W = coef.T
    K = W.shape[1]
    codes = np.asarray(codes, dtype=np.intp)
    v = obj.check_sample_weight(sample_weight, len(codes))
    margins = np.asarray(X @ W) + np.asarray(intercept, dtype=np.float64)
    probabilities, _ = softmax_rows(margins)
    Y = one_hot(codes, K)
    xt = lambda M: np.asarray(X.T @ weighted_rows(M, v))  # noqa: E731
    column_sums_x = (
        np.asarray(X.sum(axis=0)).ravel()
        if v is None
        else np.asarray(X.T @ v, dtype=np.float64).ravel()
    )
    cert = certify(
        problem,
        W,
        codes,
        probabilities,
        loss_sum(margins, codes, v),
        xt(probabilities),
        xt(Y),
        column_sums_x,
        class_counts(codes, K, v),
        v,
    )[0]
    return transposed(cert)


def transposed(cert: obj.Certificate) -> obj.Certificate:
    """``cert`` with its per-coefficient arrays of shape (K, n_features), as ``coef``."""
    return obj.Certificate(
        cert.primal,
        cert.dual,
        cert.coordinate_gaps.T.copy(),
        cert.intercept_gap,
        cert.correlation.T.copy(),
    )
