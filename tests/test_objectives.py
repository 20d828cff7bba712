"""The certificate: exact splits, signs, conjugates, the 1-D intercept problem."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize_scalar

from dask_scd import objectives as obj

LOSS_PENALTY = [
    (loss, rho)
    for loss in obj.LOSSES
    for rho in (0.0, 0.5, 1.0)
    if not (loss == "hinge" and rho > 0)
]


def _problem(loss, rho, fit_intercept, alpha=0.1):
    return obj.Problem(loss=loss, alpha=alpha, l1_ratio=rho, fit_intercept=fit_intercept)


def _data(rng, n=60, p=8, sparse=False):
    X = rng.normal(size=(n, p))
    if sparse:
        X[rng.random(X.shape) < 0.6] = 0.0
        X = sp.csr_matrix(X)
    y = np.sign(rng.normal(size=n))
    return X, y


@pytest.mark.parametrize("loss,rho", LOSS_PENALTY)
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("sparse", [False, True])
def test_coordinate_gaps_sum_to_total_gap(rng, loss, rho, fit_intercept, sparse):
    X, y = _data(rng, sparse=sparse)
    problem = _problem(loss, rho, fit_intercept)
    coef = rng.normal(scale=0.3, size=X.shape[1])
    cert = obj.certificate(problem, X, y, coef, 0.2 if fit_intercept else 0.0)
    assert np.all(cert.coordinate_gaps >= -1e-12)
    assert cert.intercept_gap >= -1e-12
    assert cert.coordinate_gaps.sum() + cert.intercept_gap == pytest.approx(cert.gap, rel=1e-10)
    assert cert.gap > 0
    # The primal value is the objective written out directly.
    z = np.asarray(X @ coef).ravel() + (0.2 if fit_intercept else 0.0)
    direct = obj.loss_value(loss, y, z).mean() + problem.alpha * (
        rho * np.abs(coef).sum() + 0.5 * (1 - rho) * coef @ coef
    )
    assert cert.primal == pytest.approx(direct, rel=1e-12)


@pytest.mark.parametrize("loss", obj.LOSSES)
def test_dual_loss_is_the_conjugate(loss):
    """−ℓ*(−a) = inf_z ℓ(z) + a z, checked by numerical minimization over z."""
    for y in (1.0, -1.0):
        z0 = np.linspace(-3, 3, 7)
        a = -obj.loss_derivative(loss, y, z0)
        for ai, zi in zip(a, z0):
            inf = minimize_scalar(
                lambda z: obj.loss_value(loss, y, z) + ai * z,
                bounds=(-50, 50),
                method="bounded",
                options={"xatol": 1e-12},
            )
            assert obj.dual_loss(loss, y, ai) == pytest.approx(inf.fun, abs=1e-7)
            # Fenchel–Young equality at a = −ℓ'(z).
            assert obj.loss_value(loss, y, zi) - obj.dual_loss(
                loss, y, ai
            ) + ai * zi == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("loss", obj.LOSSES)
def test_dual_loss_outside_domain_is_minus_infinity(loss):
    if loss == "squared":
        return
    assert obj.dual_loss(loss, 1.0, -0.5) == -np.inf
    assert obj.dual_loss(loss, -1.0, 0.5) == -np.inf


@pytest.mark.parametrize("loss", obj.LOSSES)
def test_optimal_intercept_minimizes(rng, loss):
    margins = rng.normal(size=200)
    y = np.sign(rng.normal(size=200) + 0.3)
    b = obj.optimal_intercept(loss, y, margins)
    f = lambda c: obj.loss_value(loss, y, margins + c).mean()  # noqa: E731
    ref = minimize_scalar(f, bounds=(-20, 20), method="bounded", options={"xatol": 1e-12})
    assert f(b) <= ref.fun + 1e-12


def test_projection_makes_dual_feasible(rng):
    X, y = _data(rng)
    for loss in obj.LOSSES:
        problem = _problem(loss, 0.0, True)
        margins = rng.normal(size=len(y)) + 1.0
        sums = obj.margin_sums(problem, y, margins)
        a = obj.dual_point(problem, y, margins, obj.dual_scales(problem, sums))
        assert abs(a.sum()) < 1e-10
        assert np.isfinite(obj.dual_loss(loss, y, a)).all()


def test_sdca_certificate_splits_per_example(rng):
    X, y = _data(rng)
    problem = _problem("logistic", 0.0, True)
    a = y * rng.uniform(0.1, 0.9, size=len(y))
    pos, neg = a[a > 0].sum(), -a[a < 0].sum()
    a[a > 0] *= min(1.0, neg / pos)
    a[a < 0] *= min(1.0, pos / neg)  # now Σ a_i = 0: the intercept's dual constraint
    assert abs(a.sum()) < 1e-12
    coef = X.T @ a / (problem.alpha * len(y))
    margins = X @ coef + 0.3
    cert = obj.sdca_certificate(problem, y, a, coef, margins)
    assert cert.gap > 0
    assert cert.coordinate_gaps.sum() == pytest.approx(cert.gap, rel=1e-10)
    # The same point certified from its primal side is no better than an exact split.
    assert np.all(cert.coordinate_gaps >= -1e-15)


def test_rescaled_lasso_certificate_is_valid_and_tighter(rng):
    X, _ = _data(rng, n=80, p=10)
    y = X @ rng.normal(size=10) + rng.normal(size=80)
    problem = _problem("squared", 1.0, True, alpha=0.2)
    coef = rng.normal(scale=0.3, size=10)
    cert = obj.certificate(problem, X, y, coef, 0.1)
    margins = X @ coef + 0.1
    sums = obj.margin_sums(problem, y, margins)
    a = obj.dual_point(problem, y, margins, obj.dual_scales(problem, sums))
    lipschitz = obj.primal_certificate(
        problem,
        len(y),
        coef,
        sums["loss"],
        float(obj.dual_loss("squared", y, a).sum()),
        X.T @ a / len(y),
        float(a @ margins),
    )
    assert cert.gap <= lipschitz.gap
    assert cert.coordinate_gaps.sum() + cert.intercept_gap == pytest.approx(cert.gap, rel=1e-10)
    assert np.all(cert.coordinate_gaps >= -1e-12) and cert.intercept_gap >= -1e-12
    # Weak duality: no dual value exceeds the optimum (sklearn's Lasso, solved tightly).
    from sklearn.linear_model import Lasso

    best = Lasso(alpha=0.2, tol=1e-14, max_iter=100_000).fit(X, y)
    optimum = obj.certificate(problem, X, y, best.coef_, best.intercept_).primal
    assert cert.dual <= optimum + 1e-12


@pytest.mark.parametrize("loss", ["logistic", "squared_hinge"])
def test_the_optimal_intercept_takes_a_few_passes(loss, monkeypatch):
    """Newton stops at the rounding floor of the derivative's sum: a handful of passes
    over the examples (it once bisected the noise for ~40), and the root is exact."""
    from scipy.optimize import brentq

    from dask_scd import objectives as obj

    rng = np.random.default_rng(0)
    y = np.where(rng.random(200_000) < 0.3, 1.0, -1.0)
    margins = rng.normal(size=len(y))
    calls = []
    derivative = obj.loss_derivative
    monkeypatch.setattr(obj, "loss_derivative", lambda *a: calls.append(1) or derivative(*a))
    b = obj.optimal_intercept(loss, y, margins)
    assert len(calls) <= 10
    root = brentq(lambda t: derivative(loss, y, margins + t).sum(), -20, 20, xtol=1e-15)
    assert b == pytest.approx(root, abs=1e-12)


@pytest.mark.parametrize("loss", ["squared", "logistic", "squared_hinge"])
@pytest.mark.parametrize("weighted", [False, True])
def test_gradient_certificate_is_the_dual_certificate(rng, loss, weighted):
    """Without an intercept, an L2 term's certificate of a = −v∘ℓ'(ŷ) is ‖∇P‖²/(2·l2),
    coordinate by coordinate, and bounds P − P* (P minimized by scipy)."""
    from scipy.optimize import minimize

    X, y = _data(rng)
    problem = _problem(loss, 0.0, False, alpha=0.05)
    assert obj.gradient_certifies(problem)
    weights = rng.uniform(0.0, 2.0, size=len(y)) if weighted else None
    coef = rng.normal(scale=0.3, size=X.shape[1])
    margins = X @ coef
    n = len(y)

    def primal(w):
        terms = obj.loss_value(loss, y, X @ w)
        return obj.weighted_sum(terms, weights) / n + obj.penalty_value(problem, w)

    a = -obj.loss_derivative(loss, y, margins) * (1.0 if weights is None else weights)
    loss_sum = obj.weighted_sum(obj.loss_value(loss, y, margins), weights)
    cert = obj.gradient_certificate(problem, n, coef, loss_sum, X.T @ a / n)
    dual_sum = float(obj.dual_loss(loss, y, a, weights).sum())
    full = obj.primal_certificate(
        problem, n, coef, loss_sum, dual_sum, X.T @ a / n, float(a @ margins)
    )
    assert cert.primal == full.primal
    np.testing.assert_allclose(cert.coordinate_gaps, full.coordinate_gaps, rtol=1e-10)
    np.testing.assert_allclose(cert.gap, full.gap, rtol=1e-10)
    best = minimize(primal, coef, method="BFGS", options={"gtol": 1e-12}).fun
    assert cert.gap >= primal(coef) - best - 1e-12
    assert cert.gap > 0.0


def test_gradient_certificate_applies_to_l2_without_intercept_only():
    def problem(**kw):
        args = dict(loss="logistic", alpha=0.1, l1_ratio=0.0, fit_intercept=False) | kw
        return obj.Problem(**args)

    assert obj.gradient_certifies(problem())
    assert not obj.gradient_certifies(problem(fit_intercept=True))
    assert not obj.gradient_certifies(problem(l1_ratio=0.5))
    assert not obj.gradient_certifies(problem(loss="hinge"))


@pytest.mark.parametrize("loss,rho", LOSS_PENALTY)
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_the_fused_certificate_is_the_numpy_one(rng, loss, rho, fit_intercept):
    """engines.certificates.primal_certificate without weights runs two numba sweeps
    (derivatives, projected dual); with unit weights it runs the numpy path. Same P, D,
    coordinate gaps and correlation, to rounding; the rescaled lasso dual included."""
    from dask_scd.engines.certificates import primal_certificate

    X, y = _data(rng, n=200)
    problem = _problem(loss, rho, fit_intercept, alpha=0.05)
    coef = rng.normal(scale=0.3, size=X.shape[1])
    margins = X @ coef + (0.2 if fit_intercept else 0.0)
    fused = primal_certificate(problem, lambda a: X.T @ a, y, coef, margins)
    numpy = primal_certificate(problem, lambda a: X.T @ a, y, coef, margins, np.ones(len(y)))
    assert np.isfinite(fused.gap) and fused.gap >= 0.0
    assert fused.primal == pytest.approx(numpy.primal, rel=1e-13)
    assert fused.dual == pytest.approx(numpy.dual, rel=1e-12, abs=1e-13)
    np.testing.assert_allclose(fused.correlation, numpy.correlation, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(fused.coordinate_gaps, numpy.coordinate_gaps, rtol=1e-10, atol=1e-13)
