"""The proximal Newton engine (solver="newton").

Its kernels must equal their numpy reference; every smooth loss × penalty must reach a
certified gap of 1e-9 within the default max_iter and match scikit-learn's optimum, on
Adult and on an ill-conditioned generated problem; its certificate must never claim
less than the true objective error; every inner solver must find the same optimum.
"""

import warnings

import kernel_reference as reference
import numpy as np
import pytest
import scipy.sparse as sp
from conftest import shared_dataset
from sklearn import linear_model, svm
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.datasets import make_binary_features, make_onehot
from dask_scd.engines.base import Options
from dask_scd.engines.newton import design as design_module
from dask_scd.engines.newton import l1_model, newton, quadratic
from dask_scd.engines.newton.design import Design
from dask_scd.kernels import newton as kernels
from dask_scd.kernels import newton_shift

TOL = 1e-9
LOSSES = ("logistic", "squared_hinge", "squared")
PENALTIES = (("l2", 0.0), ("l1", 1.0), ("elasticnet", 0.5))


def _ill_conditioned(rng, n=400, p=30):
    """Dense data whose columns span 6 orders of magnitude (cond(X) ≈ 1e6), two of them
    nearly collinear, and a planted model with an offset (the intercept matters)."""
    X = rng.normal(size=(n, p))
    X[:, 1] = X[:, 0] + 1e-3 * rng.normal(size=n)
    X *= np.logspace(-3, 3, p)
    score = X @ (rng.normal(size=p) / np.logspace(-3, 3, p)) + 0.5
    return X, np.where(score + rng.normal(size=n) > 0, 1.0, -1.0), score + rng.normal(size=n)


def _adult():
    X, y = shared_dataset("a9a.t")
    return X, y, y


def _objective(problem, X, y, coef, intercept):
    return obj.certificate(problem, X, y, np.ravel(coef), float(intercept))


def _scikit_learn(loss, penalty, rho, alpha, X, y, fit_intercept):
    """scikit-learn's solution of the same objective, solved tightly (None: no solver)."""
    n = X.shape[0]
    C = 1.0 / (alpha * n)  # (1/n)Σℓ + α/2‖θ‖²  ⇔  C·Σℓ + ½‖θ‖²
    if loss == "squared":
        model = {
            "l2": lambda: linear_model.Ridge(
                alpha=alpha * n, tol=1e-12, fit_intercept=fit_intercept
            ),
            "l1": lambda: linear_model.Lasso(
                alpha=alpha, tol=1e-10, max_iter=100_000, fit_intercept=fit_intercept
            ),
            "elasticnet": lambda: linear_model.ElasticNet(
                alpha=alpha, l1_ratio=rho, tol=1e-10, max_iter=100_000, fit_intercept=fit_intercept
            ),
        }[penalty]()
    elif penalty == "elasticnet":
        return None  # no tight scikit-learn solver: the certificate is the proof
    elif loss == "logistic" and penalty == "l2":
        model = linear_model.LogisticRegression(
            C=C, solver="newton-cholesky", tol=1e-12, max_iter=1000, fit_intercept=fit_intercept
        )
    elif loss == "logistic":  # liblinear penalizes its intercept: compared without one
        model = linear_model.LogisticRegression(
            C=C,
            l1_ratio=1.0,
            solver="liblinear",
            tol=1e-8,
            max_iter=10_000,
            fit_intercept=False,
            random_state=0,
        )
    else:  # the squared hinge: squared loss (1/n)Σℓ scales to C = 1/(αn) too
        model = svm.LinearSVC(
            C=C,
            loss="squared_hinge",
            penalty=penalty,
            dual=False,
            tol=1e-8,
            max_iter=100_000,
            fit_intercept=False,
            random_state=0,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    intercept = np.ravel(model.intercept_)[0] if np.ndim(model.intercept_) else model.intercept_
    return np.ravel(model.coef_), float(intercept) if model.fit_intercept else 0.0


def _check_against_scikit_learn(loss, penalty, rho, alpha, X, y, fit_intercept):
    ours = dask_scd.fit(
        X,
        y,
        loss=loss,
        penalty=penalty,
        alpha=alpha,
        l1_ratio=rho,
        fit_intercept=fit_intercept,
        tol=TOL,
        solver="newton",
        random_state=0,
    )
    assert ours.converged_ and ours.dual_gap_ <= TOL
    assert ours.n_iter_ < 1000
    problem = obj.Problem(loss, alpha, rho, fit_intercept)
    mine = _objective(problem, X, y, ours.coef_, ours.intercept_)
    assert mine.primal == pytest.approx(ours.primal_, rel=1e-12)
    reference_fit = _scikit_learn(loss, penalty, rho, alpha, X, y, fit_intercept)
    if reference_fit is None:
        return ours
    theirs = _objective(problem, X, y, *reference_fit)
    # Ours is certified: never above scikit-learn's by more than 1e-7, and where they
    # differ by more, scikit-learn's own certificate shows it stopped short.
    assert mine.primal - theirs.primal <= 1e-7 * abs(theirs.primal)
    assert abs(mine.primal - theirs.primal) <= max(1e-7 * abs(theirs.primal), theirs.gap)
    return ours


def _intercept_for(loss, penalty):
    """scikit-learn fits the same unpenalized intercept for Ridge/Lasso and
    newton-cholesky; liblinear and LinearSVC penalize theirs, so those run without."""
    return loss == "squared" or (loss == "logistic" and penalty == "l2")


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("penalty,rho", PENALTIES)
def test_adult_matches_scikit_learn(loss, penalty, rho):
    X, labels, _ = _adult()
    # scikit-learn's coordinate descent needs thousands of epochs on Adult below α = 1e-2
    alpha = 1e-5 if penalty == "l2" else 1e-2 if loss == "squared" else 1e-3
    _check_against_scikit_learn(loss, penalty, rho, alpha, X, labels, _intercept_for(loss, penalty))


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("penalty,rho", PENALTIES)
def test_ill_conditioned_matches_scikit_learn(rng, loss, penalty, rho):
    X, labels, target = _ill_conditioned(rng)
    y = target if loss == "squared" else labels
    _check_against_scikit_learn(loss, penalty, rho, 1e-3, X, y, _intercept_for(loss, penalty))


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("penalty,rho", PENALTIES)
def test_with_intercept_matches_coordinate_descent(rng, loss, penalty, rho):
    """The unpenalized intercept with every loss × penalty: the same optimum as SCD's."""
    X, labels, target = _ill_conditioned(rng, n=300, p=8)
    X = X[:, :8] / np.logspace(-3, 3, 30)[:8] + 1.0  # non-centred columns
    y = target if loss == "squared" else labels
    kwargs = {"loss": loss, "penalty": penalty, "alpha": 1e-2, "l1_ratio": rho, "random_state": 0}
    ours = dask_scd.fit(X, y, tol=TOL, solver="newton", **kwargs)
    scd = dask_scd.fit(X, y, tol=1e-11, solver="scd", max_iter=100_000, **kwargs)
    assert ours.converged_ and scd.converged_
    assert ours.primal_ == pytest.approx(scd.primal_, rel=1e-8)


def _inner_solvers(monkeypatch, which):
    """Force the inner solver without a Gram matrix (CG for L2, columns for L1)."""
    if which != "gram":
        for module in (design_module, quadratic, l1_model):
            monkeypatch.setattr(module, "GRAM_MAX", 0)


@pytest.mark.parametrize("which", ["gram", "cg"])
@pytest.mark.parametrize("loss", ["logistic", "squared_hinge"])
def test_every_l2_inner_solver_finds_the_optimum(monkeypatch, loss, which):
    X, y, _ = _adult()
    _inner_solvers(monkeypatch, which)
    problem = obj.Problem(loss, 1e-5, 0.0, True)
    run = newton.fit_newton(InMemory(X, y), problem, Options(TOL, 1000, np.random.default_rng(0)))
    assert run.certificate.relative_gap <= TOL
    assert any(
        kind.endswith("cholesky" if which == "gram" else "cg") for kind in run.extras["passes"]
    )


@pytest.mark.parametrize("which", ["gram", "columns"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_every_l1_inner_solver_finds_the_optimum(rng, monkeypatch, which, fit_intercept):
    if fit_intercept:  # Adult's one-hot groups sum to the intercept: CD over columns crawls
        X = sp.random(2000, 60, density=0.2, random_state=0, format="csr") + 0.0
        y = np.where(X @ rng.normal(size=60) + 0.3 * rng.normal(size=2000) > 0.2, 1.0, -1.0)
    else:
        X, y, _ = _adult()
    _inner_solvers(monkeypatch, which)
    problem = obj.Problem("logistic", 1e-4, 0.8, fit_intercept)
    run = newton.fit_newton(InMemory(X, y), problem, Options(TOL, 1000, np.random.default_rng(0)))
    assert run.certificate.relative_gap <= TOL
    assert any(
        kind.endswith("gram_cd" if which == "gram" else "column_cd")
        for kind in run.extras["passes"]
    )


@pytest.mark.parametrize("fit_intercept", [False, True])
def test_dense_column_epochs_find_the_optimum(rng, monkeypatch, fit_intercept):
    """Column epochs over dense columns (r and D each contiguous) reach the optimum the
    Gram solver finds, elastic net and L1, with and without intercept."""
    X = rng.normal(size=(300, 80))
    X[:, 1] = X[:, 0] + 0.1 * rng.normal(size=300)  # correlated columns
    y = np.where(X @ rng.normal(size=80) + 0.5 * rng.normal(size=300) + 0.3 > 0, 1.0, -1.0)
    for l1_ratio in (1.0, 0.6):
        problem = obj.Problem("logistic", 2e-3, l1_ratio, fit_intercept)
        options = Options(TOL, 1000, np.random.default_rng(0))
        gram = newton.fit_newton(InMemory(X, y), problem, options)
        with monkeypatch.context() as patch:
            _inner_solvers(patch, "columns")
            columns = newton.fit_newton(InMemory(X, y), problem, options)
        assert any(kind.endswith("column_cd") for kind in columns.extras["passes"])
        assert columns.certificate.relative_gap <= TOL
        assert columns.certificate.primal == pytest.approx(gram.certificate.primal, rel=1e-8)
        np.testing.assert_allclose(columns.coef, gram.coef, atol=1e-3)  # gap 1e-9: θ to ~√gap


def test_weak_l1_on_one_hot_without_intercept_keeps_few_steps():
    """Adult's one-hot fields without an intercept: the support's columns are collinear
    (each field sums to the ones vector), its Hessian singular, and the orthant Newton
    step is not taken there; the Gram model's epochs run to their target as before
    (6 outer steps; with the singular steps tried and the epochs cut short, 15)."""
    X, y = shared_dataset("a8a")
    fit = dask_scd.fit(
        X, y, loss="logistic", penalty="l1", alpha=1.15e-5, fit_intercept=False, solver="newton"
    )
    assert fit.converged_ and fit.dual_gap_ <= 1e-6
    assert fit.n_iter_ <= 8


def test_large_sparse_one_hot_runs_conjugate_gradients():
    X, y, _ = make_onehot(3000, n_fields=5, cardinality=500, random_state=0)
    run = newton.fit_newton(
        InMemory(X, y),
        obj.Problem("logistic", 1e-4, 0.0, True),
        Options(TOL, 1000, np.random.default_rng(0)),
    )
    assert run.certificate.relative_gap <= TOL
    assert "solve:cg" in run.extras["passes"]
    sk = linear_model.LogisticRegression(C=1 / (1e-4 * 3000), tol=1e-12, max_iter=10_000)
    sk.fit(X, y)
    theirs = _objective(obj.Problem("logistic", 1e-4, 0.0, True), X, y, sk.coef_, sk.intercept_[0])
    assert run.certificate.primal - theirs.primal <= 1e-7 * theirs.primal


@pytest.mark.parametrize("fit_intercept", [False, True])
def test_heavy_rows_precondition_cg_to_the_same_optimum(monkeypatch, fit_intercept):
    """Weak L2 on nearly separable dense data: most rows' curvature vanishes near the fit.
    CG preconditioned by the heavy rows (from the step after one that cost more products
    than their Gram) reaches scikit-learn's optimum with fewer products than the diagonal
    alone takes."""
    rng = np.random.default_rng(0)
    n, p = 6000, 60
    X = rng.normal(size=(n, p))
    y = np.where(X @ rng.normal(size=p) + 0.3 * rng.normal(size=n) + 0.4 > 0, 1.0, -1.0)
    problem = obj.Problem("logistic", 1e-5, 0.0, fit_intercept)
    monkeypatch.setattr(quadratic, "GRAM_MAX", 0)  # CG, never Cholesky

    def fit():
        return newton.fit_newton(InMemory(X, y), problem, Options(TOL, 1000, rng))

    heavy = fit()
    monkeypatch.setattr(quadratic, "_HEAVY_GRAM_PASSES", np.inf)  # the diagonal only
    diagonal = fit()
    assert heavy.certificate.relative_gap <= TOL and diagonal.certificate.relative_gap <= TOL
    assert "solve:heavy_cg" in heavy.extras["passes"]
    assert "solve:heavy_cg" not in diagonal.extras["passes"]
    assert heavy.extras["total_passes"] < 0.8 * diagonal.extras["total_passes"]
    sk = linear_model.LogisticRegression(
        C=1 / (1e-5 * n), tol=1e-12, max_iter=10_000, fit_intercept=fit_intercept
    ).fit(X, y)
    b = sk.intercept_[0] if fit_intercept else 0.0
    theirs = _objective(problem, X, y, sk.coef_, b)
    assert heavy.certificate.primal - theirs.primal <= 1e-8 * theirs.primal


def test_certificate_never_below_the_true_error():
    """Every certified gap bounds P(θ_t) − P* from above (P* from a far tighter fit), and
    the last one is within 10x of it (dual extrapolation and the best dual value)."""
    X, y, _ = _adult()
    kwargs = {
        "loss": "logistic",
        "penalty": "l1",
        "alpha": 1e-5,
        "fit_intercept": False,
        "solver": "newton",
    }
    optimum = dask_scd.fit(X, y, tol=1e-13, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fits = [dask_scd.fit(X, y, tol=1e-3, max_iter=k, **kwargs) for k in (4, 8)]
    best = optimum.primal_ * (1 - optimum.dual_gap_)  # a lower bound of P*
    for fit in [optimum, *fits]:
        history = fit.history_
        for gap, primal in zip(history.relative_gap, history.primal):
            assert primal - best <= gap * abs(primal) + 1e-15
        # the pair (θ, certificate) that fit returns
        assert fit.primal_ - best <= fit.dual_gap_ * abs(fit.primal_) + 1e-15


def _tightness(fit, p_star, target):
    """(G/max(E, target/10) at the first iterate whose error E is ≤ target, iterates after)."""
    history = fit.history_
    errors = [(p - p_star) / abs(p_star) for p in history.primal]
    first = next(k for k, e in enumerate(errors) if e <= target)
    return (history.relative_gap[first] / max(errors[first], 0.1 * target), len(errors) - 1 - first)


@pytest.mark.parametrize("data", ["onehot", "ill_conditioned"])
@pytest.mark.parametrize(
    "loss,penalty,which",
    [
        ("logistic", "l2", "gram"),
        ("logistic", "l2", "cg"),
        ("logistic", "l1", "gram"),
        ("squared_hinge", "l2", "gram"),
    ],
)
def test_certificate_is_tight_where_the_error_reaches_tol(
    rng, monkeypatch, data, loss, penalty, which
):
    """The model's dual point (offer_linearized) makes the gap of a Newton iterate of the
    order of its true error: at the first iterate within tol of P*, the gap is within 10x
    of the error (or of tol/10), so the fit stops there or one step later."""
    if data == "onehot":
        X, y, _ = make_onehot(3000, n_fields=5, cardinality=50, random_state=0)
        alpha = 1.0 / 3000 if penalty == "l2" else 3e-3
    else:
        X, y, _ = _ill_conditioned(rng)
        alpha = 1e-4 if penalty == "l2" else 1e-3
    _inner_solvers(monkeypatch, which)
    kwargs = {"loss": loss, "penalty": penalty, "alpha": alpha, "solver": "newton"}
    optimum = dask_scd.fit(X, y, tol=1e-13, **kwargs)
    fit = dask_scd.fit(X, y, tol=1e-6, **kwargs)
    p_star = min(optimum.primal_, min(fit.history_.primal))
    ratio, after = _tightness(fit, p_star, 1e-6)
    assert ratio <= 10.0
    assert after <= 2  # one more Newton step at most, then the fresh-margins certificate
    if penalty == "l1":
        assert 0 < np.count_nonzero(fit.coef_) < X.shape[1]


def _many_rows(rng, n=40_000, p=40):
    """n ≫ p dense rows (AR(1)-correlated columns), where the Newton step takes its Hessian
    from a row sample."""
    X = rng.normal(size=(n, p))
    for j in range(1, p):
        X[:, j] = 0.5 * X[:, j - 1] + np.sqrt(0.75) * X[:, j]
    score = X @ rng.normal(size=p) / np.sqrt(p) + 0.3
    return X, np.where(score + rng.normal(size=n) > 0, 1.0, -1.0)


@pytest.mark.parametrize("loss", ["logistic", "squared_hinge"])
def test_sampled_hessian_reaches_the_optimum_with_a_tight_certificate(rng, loss):
    """Sampled-Hessian steps, then CG preconditioned by the sample for the step that ends
    the fit: the optimum of the full Hessian (scikit-learn's for the logistic), a gap
    never below the true error, and tight where the error reaches tol."""
    X, y = _many_rows(rng)
    n = X.shape[0]
    alpha = 1.0 / n  # scikit-learn's C = 1
    problem = obj.Problem(loss, alpha, 0.0, True)
    run = newton.fit_newton(InMemory(X, y), problem, Options(TOL, 1000, np.random.default_rng(0)))
    assert run.certificate.relative_gap <= TOL
    assert {"solve:sampled", "solve:sampled_cg"} <= set(run.extras["passes"])
    assert "solve:cholesky" not in run.extras["passes"]  # no Gram of all rows
    kwargs = {"loss": loss, "alpha": alpha, "solver": "newton", "random_state": 0}
    optimum = dask_scd.fit(X, y, tol=1e-13, **kwargs)
    mine = _objective(problem, X, y, run.coef, run.intercept)
    assert mine.primal - optimum.primal_ <= TOL * abs(optimum.primal_)
    if loss == "logistic":
        sk = linear_model.LogisticRegression(C=1.0, solver="newton-cholesky", tol=1e-12)
        sk.fit(X, y)
        theirs = _objective(problem, X, y, sk.coef_, sk.intercept_[0])
        assert abs(mine.primal - theirs.primal) <= 1e-7 * abs(theirs.primal)
    fit = dask_scd.fit(X, y, tol=1e-6, **kwargs)
    p_star = min(optimum.primal_, min(fit.history_.primal))
    lower = optimum.primal_ * (1 - optimum.dual_gap_)
    for gap, primal in zip(fit.history_.relative_gap, fit.history_.primal):
        assert primal - lower <= gap * abs(primal) + 1e-15
    ratio, after = _tightness(fit, p_star, 1e-6)
    assert ratio <= 10.0 and after <= 2


def test_sampled_hessian_hands_back_where_the_sample_misses_a_column(rng):
    """A column non-zero only in rows the sample does not hold: the sampled Hessian sees
    no curvature along it (only α), the sampled steps overshoot there, and the engine
    hands back to exact steps and still reaches the certified optimum."""
    X, y = _many_rows(rng)
    n, p = X.shape
    sample = quadratic.HessianSample.build(Design.from_array(X), p + 1, np.random.default_rng(0))
    outside = np.setdiff1d(np.arange(n), sample.rows)
    X[:, 0] = 0.0
    X[rng.choice(outside, 30, replace=False), 0] = 5.0
    problem = obj.Problem("logistic", 1.0 / n, 0.0, True)
    run = newton.fit_newton(InMemory(X, y), problem, Options(TOL, 1000, np.random.default_rng(0)))
    assert run.certificate.relative_gap <= TOL
    assert "solve:cholesky" in run.extras["passes"]  # exact steps took over
    sk = linear_model.LogisticRegression(C=1.0, solver="newton-cholesky", tol=1e-12)
    sk.fit(X, y)
    theirs = _objective(problem, X, y, sk.coef_, sk.intercept_[0])
    assert abs(run.certificate.primal - theirs.primal) <= 1e-7 * abs(theirs.primal)


# ------------------------------------------------------------------- invariances


def test_float32_x_and_inputs_untouched(rng):
    X, labels, _ = _ill_conditioned(rng, n=200, p=10)
    X = X / np.logspace(-3, 3, 30)[:10]
    X32 = X.astype(np.float32)
    for data in (X32, sp.csr_matrix(X32), sp.csc_matrix(X32)):
        before, y_before = data.copy(), labels.copy()
        r32 = dask_scd.fit(
            data,
            labels,
            loss="logistic",
            penalty="elasticnet",
            alpha=1e-3,
            tol=TOL,
            solver="newton",
        )
        r64 = dask_scd.fit(
            X32.astype(np.float64),
            labels,
            loss="logistic",
            penalty="elasticnet",
            alpha=1e-3,
            tol=TOL,
            solver="newton",
        )
        assert r32.converged_
        assert r32.primal_ == pytest.approx(r64.primal_, rel=1e-9)
        dense = data.toarray() if sp.issparse(data) else data
        np.testing.assert_array_equal(dense, before.toarray() if sp.issparse(before) else before)
        np.testing.assert_array_equal(labels, y_before)


def test_deterministic(rng):
    X, y, _ = _ill_conditioned(rng, n=200, p=10)
    first, second = (
        dask_scd.fit(
            X, y, loss="logistic", penalty="l1", alpha=1e-3, solver="newton", random_state=3
        )
        for _ in range(2)
    )
    np.testing.assert_array_equal(first.coef_, second.coef_)
    assert first.intercept_ == second.intercept_


def test_max_iter_counts_newton_steps(rng):
    X, y, _ = _ill_conditioned(rng, n=200, p=10)
    with pytest.warns(ConvergenceWarning, match="after 2 iterations of solver='newton'"):
        fit = dask_scd.fit(
            X, y, loss="logistic", alpha=1e-6, tol=1e-12, max_iter=2, solver="newton"
        )
    assert fit.n_iter_ == 2
    assert fit.history_.iteration == [0, 1, 2]


def _separable(n=200, p=500):
    """benchopt's logistic L2 shape: n < p Gaussian rows, labels of a planted model (the
    data are separable, so a weak L2 term leaves margins that saturate)."""
    rng = np.random.default_rng(42)
    X = rng.normal(size=(n, p))
    return X, np.sign(X @ rng.normal(size=p))


def test_extrapolation_takes_the_best_doubling():
    X, y = _separable()
    n, p = X.shape
    problem = obj.Problem("logistic", alpha=0.01 / n, l1_ratio=0.0, fit_intercept=False)
    delta = np.linalg.lstsq(X, y, rcond=None)[0]  # a step whose unit length stops short
    direction = X @ delta

    def value(t):
        return _objective(problem, X, y, t * delta, 0.0).primal

    t = newton.extrapolate(problem, y, np.zeros(n), direction, np.zeros(p), delta)
    doublings = 2.0 ** np.arange(7)
    assert t > 1.0
    assert value(t) == pytest.approx(min(value(s) for s in doublings), rel=1e-12)
    assert value(2 * t) >= value(t)


def test_separable_l2_logistic_steps_beyond_the_unit_step(monkeypatch):
    # From θ = 0 the unit Newton step stops short (the curvature at 0 overestimates the
    # curvature along the step): doubling it while F falls halves the steps, to the
    # same certified optimum.
    X, y = _separable()
    kwargs = dict(loss="logistic", alpha=0.01 / len(y), fit_intercept=False, tol=1e-10)
    kwargs["coef_init"] = np.zeros(X.shape[1])  # Newton's steps (not the kernel's epochs)
    fit = dask_scd.fit(X, y, solver="newton", **kwargs)
    monkeypatch.setattr(newton, "DOUBLINGS", ())
    unit = dask_scd.fit(X, y, solver="newton", **kwargs)
    assert fit.n_iter_ <= 7 < 10 <= unit.n_iter_
    assert max(fit.history_.relative_gap[-1], unit.history_.relative_gap[-1]) <= 1e-10
    assert fit.history_.primal[-1] == pytest.approx(unit.history_.primal[-1], rel=1e-10)


def test_refuses_the_hinge_with_an_l1_term():
    with pytest.raises(ValueError, match="loss='hinge' needs penalty='l2'"):
        dask_scd.fit(np.eye(3), [1, -1, 1], loss="hinge", penalty="l1", solver="newton")


# ------------------------------------------------------------------------ kernels


def _sparse(rng, n=60, p=12, dtype=np.float64):
    X = rng.normal(size=(n, p)) * (rng.random((n, p)) < 0.4)
    return X.astype(dtype), sp.csr_matrix(X.astype(dtype))


@pytest.mark.parametrize("loss", LOSSES)
def test_derivatives_and_loss_along_match_reference(rng, loss):
    y = np.where(rng.random(50) < 0.5, 1.0, -1.0)
    margins, direction = rng.normal(size=50) * 3, rng.normal(size=50)
    grad, curv = np.empty(50), np.empty(50)
    total = kernels.derivatives(obj.LOSS_CODES[loss], y, margins, grad, curv)
    ref_grad, ref_curv, ref_total = reference.newton_derivatives(
        obj.Problem(loss, 1, 0, 0), y, margins
    )
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(curv, ref_curv, rtol=1e-12, atol=1e-15)
    assert total == pytest.approx(ref_total, rel=1e-12)
    along = kernels.loss_along(obj.LOSS_CODES[loss], y, margins, direction, 0.3)
    assert along == pytest.approx(
        obj.loss_value(loss, y, margins + 0.3 * direction).sum(), rel=1e-12
    )


@pytest.mark.parametrize("layout", ["csr", "dense", "float32"])
def test_hessian_vector_and_gram_match_reference(rng, layout):
    dense, X = _sparse(rng, dtype=np.float32 if layout == "float32" else np.float64)
    if layout == "dense":
        X = dense
    weights = rng.random(60) * (rng.random(60) < 0.8)
    design = Design.from_array(X)
    rows = design.rows
    v, out, xv = rng.normal(size=12), np.empty(12), np.empty(60)
    args = (rows.data, rows.indices, rows.indptr, rows.dense, 60, 12, weights, v, 0.7, out)
    ref_out, ref_total = reference.newton_hessian_vector(dense, weights, v, 0.7)
    for image in (np.zeros(0), xv):  # without and with X v + v0 kept (every row's)
        total = kernels.hessian_vector(*args, image)
        np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-12)
        assert total == pytest.approx(ref_total, rel=1e-10)
    np.testing.assert_allclose(xv, dense.astype(np.float64) @ v + 0.7, rtol=1e-10, atol=1e-12)
    u = rng.normal(size=60) * (rng.random(60) < 0.8)
    for part, ref_part in zip(design.signed_scatter(u), reference.newton_signed_scatter(dense, u)):
        np.testing.assert_allclose(part, ref_part, rtol=1e-10, atol=1e-12)
    d = rng.random(60)
    neg, pos, squares, side = design.signed_scatter(u, d)  # the curvature sums too
    dense64 = dense.astype(np.float64)
    np.testing.assert_allclose(neg + pos, dense64.T @ u, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(squares, (dense64**2).T @ d, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(side, dense64.T @ d, rtol=1e-10, atol=1e-12)
    working = np.array([0, 3, 4, 9])
    for intercept in (True, False):
        gram = design.gram(working, weights, intercept)
        ref = reference.newton_weighted_gram(dense, weights, working, intercept) / 60
        np.testing.assert_allclose(gram, ref, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("intercept", [True, False])
def test_coordinate_descent_epochs_match_reference(rng, intercept):
    dense, _ = _sparse(rng)
    n, p = dense.shape
    problem = obj.Problem("logistic", 0.05, 0.7, intercept)
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    coef = np.where(rng.random(p) < 0.5, rng.normal(size=p), 0.0)
    margins = dense @ coef
    grad, curv, _ = reference.newton_derivatives(problem, y, margins)
    # on the Gram of all columns
    k = p + int(intercept)
    hessian = reference.newton_weighted_gram(dense, curv, np.arange(p), intercept) / n
    c = np.append(dense.T @ grad / n, grad.mean()) if intercept else dense.T @ grad / n
    coef_k = np.append(coef, 0.0) if intercept else coef
    q, delta, ref_q, ref_delta = c.copy(), np.zeros(k), c.copy(), np.zeros(k)
    for _ in range(3):
        order = rng.permutation(k)
        worst = kernels.gram_cd_epoch(
            hessian, q, coef_k, delta, order, problem.l1, problem.l2, intercept
        )
        ref_worst = reference.newton_gram_cd_epoch(
            hessian, ref_q, coef_k, ref_delta, order, problem.l1, problem.l2, intercept
        )
        np.testing.assert_allclose(delta, ref_delta, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(q, ref_q, rtol=1e-10, atol=1e-13)
        assert worst == pytest.approx(ref_worst, rel=1e-10)
    # over the columns, XΔ kept
    columns = Design.from_array(sp.csc_matrix(dense)).columns
    col_curv = (dense * dense).T @ curv / n
    order = np.append(rng.permutation(p), -1) if intercept else rng.permutation(p)
    delta, delta_b = np.zeros(p), np.zeros(1)
    packed = np.column_stack([grad, curv, np.zeros(n)])  # g, D, XΔ + Δb side by side
    direction = packed[:, 2]
    ref_delta, ref_direction, ref_b = np.zeros(p), np.zeros(n), np.zeros(1)
    for _ in range(3):
        worst = kernels.column_cd_epoch_packed(
            columns.data,
            columns.indices,
            columns.indptr,
            False,
            n,
            order,
            packed,
            col_curv,
            coef,
            delta,
            problem.l1,
            problem.l2,
            intercept,
            delta_b,
        )
        ref_worst = reference.newton_column_cd_epoch(
            dense, order, grad, curv, coef, ref_delta, ref_direction, problem.l1, problem.l2, ref_b
        )
        np.testing.assert_allclose(delta, ref_delta, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(direction, ref_direction, rtol=1e-10, atol=1e-12)
        assert delta_b[0] == pytest.approx(ref_b[0], rel=1e-10, abs=1e-14)
        assert worst == pytest.approx(ref_worst, rel=1e-10)


def test_block_shifts_solve_one_hot_l1_with_an_intercept(monkeypatch):
    """One-hot fields sum to the intercept's column: coordinate descent over columns alone
    crawls along the shifts of whole fields; the inner solver's block shifts take them, so
    the column path reaches a tight gap in a few Newton steps, at the Gram path's optimum."""
    from dask_scd.datasets import make_onehot

    cardinality = [int(c) for c in np.geomspace(5, 5000, 10)]
    X, y, _ = make_onehot(20_000, 10, cardinality, random_state=1)
    problem = obj.Problem("logistic", 5e-5, 1.0, True)  # 1,900 of 9,322 non-zeros
    runs = {}
    for which in ("gram", "columns"):
        with monkeypatch.context() as patch:
            _inner_solvers(patch, which)
            runs[which] = newton.fit_newton(
                InMemory(X, y), problem, Options(1e-10, 100, np.random.default_rng(0))
            )
    gram, columns = runs["gram"], runs["columns"]
    assert "solve:column_cd" in columns.extras["passes"]
    assert columns.certificate.relative_gap <= 1e-10
    assert columns.n_iter <= 12  # 6 here; 34 without the block shifts
    assert columns.certificate.primal == pytest.approx(gram.certificate.primal, rel=1e-9)


def test_block_shift_solve_is_exact_in_each_coordinate(rng):
    """One block and no coupling: shift_solve's answer minimizes
    q·c + ½h·c² + l1·Σ|c − t_j| (checked on a fine grid)."""
    kinks = np.sort(rng.normal(size=9))
    for q in (-3.0, -0.2, 0.0, 0.4, 5.0):
        shift = np.zeros(1)
        newton_shift.shift_solve(
            np.array([q]), np.array([[0.7]]), np.array([0, 9]), kinks, 0.3, 10, 0.0, shift
        )
        grid = np.linspace(-12, 12, 480_001)
        values = q * grid + 0.35 * grid**2 + 0.3 * np.abs(grid[:, None] - kinks).sum(1)
        best = grid[np.argmin(values)]
        value = q * shift[0] + 0.35 * shift[0] ** 2 + 0.3 * np.abs(shift[0] - kinks).sum()
        assert value <= values.min() + 1e-12
        assert shift[0] == pytest.approx(best, abs=1e-4)


def _liblinear_l1(X, y, alpha, tol):
    """scikit-learn's liblinear on our L1 logistic problem without intercept (C = 1/(αn))."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return linear_model.LogisticRegression(
            penalty="l1",
            C=1.0 / (alpha * X.shape[0]),
            solver="liblinear",
            fit_intercept=False,
            tol=tol,
            max_iter=100_000,
            random_state=0,
        ).fit(X, y)


def test_weak_l1_logistic_on_adult_is_superlinear_and_matches_liblinear():
    """L1 logistic without intercept at a weak alpha (110 of 123 features in): to gap 1e-10
    in at most 20 outer steps, at liblinear's optimum (run to its own tight tolerance) to
    1e-8 relative; every step's certified gap bounds its true suboptimality."""
    X, y, _ = _adult()
    alpha = 1e-5
    result = dask_scd.fit(
        X,
        y,
        loss="logistic",
        penalty="l1",
        alpha=alpha,
        solver="newton",
        tol=1e-10,
        fit_intercept=False,
        max_iter=200,
    )
    assert result.dual_gap_ <= 1e-10
    assert result.n_iter_ <= 20
    liblinear = _liblinear_l1(X, y, alpha, tol=1e-12)
    problem = obj.Problem("logistic", alpha, 1.0, False)
    best = min(result.primal_, _objective(problem, X, y, liblinear.coef_, 0.0).primal)
    assert result.primal_ == pytest.approx(best, rel=1e-8)
    assert _objective(problem, X, y, liblinear.coef_, 0.0).primal == pytest.approx(best, rel=1e-8)
    history = result.history_
    for gap, primal in zip(history.relative_gap, history.primal):
        assert gap * abs(primal) >= primal - best - 1e-14  # P − D ≥ P − P*


def test_weak_l1_on_nested_binary_features_is_superlinear():
    """Sparse binary features with nested columns, no intercept, a weak L1 penalty (~85 %
    of the features in): an ill-conditioned model that coordinate descent cannot solve in
    its epochs (300 outer steps did not reach gap 1e-6 by them alone). The Newton steps on
    the model's orthant solve it exactly: from gap 1e-6 to 1e-10 in at most 4 outer steps,
    at the optimum of a fit to 1e-12 within the gap, and at least as low as liblinear's
    objective (at its tol 1e-6; it takes minutes to 1e-10 here)."""
    X, y = make_binary_features(3000, 150, random_state=1)
    alpha = 1e-5
    kwargs = dict(loss="logistic", penalty="l1", alpha=alpha, fit_intercept=False)
    result = dask_scd.fit(X, y, solver="newton", tol=1e-10, max_iter=100, **kwargs)
    gaps = np.array(result.history_.relative_gap)
    assert gaps[-1] <= 1e-10
    assert np.count_nonzero(result.coef_) >= 0.75 * X.shape[1]
    first = int(np.argmax(gaps <= 1e-6))
    assert len(gaps) - 1 - first <= 4
    tight = dask_scd.fit(X, y, solver="newton", tol=1e-12, max_iter=100, **kwargs)
    dual = tight.primal_ * (1.0 - tight.dual_gap_)  # D ≤ P* (dual_gap_ is relative)
    assert result.primal_ - dual <= 1.1e-10 * abs(result.primal_)
    liblinear = _liblinear_l1(X, y, alpha, tol=1e-6)
    problem = obj.Problem("logistic", alpha, 1.0, False)
    theirs = _objective(problem, X, y, liblinear.coef_, 0.0).primal
    assert dual <= theirs <= result.primal_ * (1.0 + 1e-6)


def test_block_row_sums_equal_the_sparse_product(rng):
    """The coarse level's S = X Z, made in two passes over X's rows, equals the sparse
    product X @ Z column for column, bit for bit, in the same compact dtype, the ones
    columns dropped: one-hot counts (all ones: nothing stored), real values, signed and
    large integers, an incomplete field, and blocks of a random sparse X."""
    from dask_scd.engines.coarse_level import RowSums, block_index, row_sums_of_blocks

    def by_product(X, blocks):
        block_of = block_index(X, blocks)
        columns = np.concatenate(blocks)
        Z = sp.csr_matrix(
            (np.ones(len(columns)), (columns, block_of[columns])), shape=(X.shape[1], len(blocks))
        )
        S = sp.csc_matrix(X @ Z, dtype=np.float64)
        return RowSums.from_columns(S[:, [k]].toarray().ravel() for k in range(len(blocks)))

    X, _, _ = make_onehot(3000, 6, 50, random_state=0)
    X = X.tocsr()
    fields = [np.arange(50 * f, 50 * f + 50) for f in range(6)]
    real, signed, large = X.copy(), X.copy(), X.copy()
    real.data = rng.normal(size=X.nnz)
    signed.data = rng.integers(-3, 4, size=X.nnz).astype(float)
    large.data = np.full(X.nnz, 300.0)
    partial = X[:, 10:].tocsr()
    random = sp.random(2000, 200, density=0.02, random_state=1, format="csr")
    cases = [
        (X, fields, np.uint8),
        (real, fields, np.float64),
        (signed, fields, np.int16),
        (large, fields, np.int16),
        (partial, [np.arange(40)] + [f[10:] - 10 for f in fields[1:]], np.uint8),
        (random, [np.arange(100), np.arange(100, 150), np.array([150, 170, 199])], np.float64),
    ]
    for M, blocks, dtype in cases:
        want = by_product(M, blocks)
        got = row_sums_of_blocks(M, block_index(M, blocks), len(blocks))
        assert got.counts.dtype == want.counts.dtype == dtype
        assert np.array_equal(got.column_of, want.column_of)
        assert np.array_equal(got.counts, want.counts)
    assert row_sums_of_blocks(X, block_index(X, fields), 6).counts.shape == (3000, 0)


def test_newton_reads_a_csc_x_by_rows_once(rng, monkeypatch):
    """A CSC X is converted to rows once for the whole fit (the design, the pure-block
    detection and the coarse level share it), and the fit equals the CSR one."""
    X, y, _ = make_onehot(3000, 5, 40, random_state=0)
    conversions = []
    real = sp.csc_matrix.tocsr

    def counted(self, *args, **kwargs):
        conversions.append(self.shape)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(sp.csc_matrix, "tocsr", counted)
    by_columns = dask_scd.fit(X.tocsc(), y, loss="logistic", alpha=1e-3, solver="newton", tol=1e-9)
    assert conversions.count(X.shape) == 1
    by_rows = dask_scd.fit(X.tocsr(), y, loss="logistic", alpha=1e-3, solver="newton", tol=1e-9)
    np.testing.assert_array_equal(by_columns.coef_, by_rows.coef_)


@pytest.mark.parametrize("layout", ["sparse", "dense"])
@pytest.mark.parametrize("intercept", [True, False])
@pytest.mark.parametrize("kept", ["residual", "pair"])
def test_epochs_kept_on_the_residual_are_the_packed_epoch(rng, intercept, kept, layout):
    """The epoch kept on (r, D), r = g + D(XΔ + Δb), and, for a curvature of 1 (the
    squared loss without weights), the one kept on r alone, take the steps of the epoch
    kept on (g, D, XΔ + Δb), over sparse columns and over dense ones (the residual's
    epoch has its own loop for those)."""
    dense, _ = _sparse(rng)
    n, p = dense.shape
    unit = kept == "residual"
    problem = obj.Problem("squared" if unit else "logistic", 0.05, 0.7, intercept)
    grad = rng.normal(size=n) * 0.3
    curv = np.ones(n) if unit else rng.uniform(0.01, 0.25, size=n)
    coef = np.where(rng.random(p) < 0.5, rng.normal(size=p), 0.0)
    columns = Design.from_array(sp.csc_matrix(dense) if layout == "sparse" else dense).columns
    col_curv = (dense * dense).T @ curv / n
    order = np.append(rng.permutation(p), -1) if intercept else rng.permutation(p)
    packed = np.column_stack([grad, curv, np.zeros(n)])
    state = grad.copy() if unit else np.column_stack([grad, curv])
    epoch = kernels.column_cd_epoch_unit if unit else kernels.column_cd_epoch_pair
    delta, delta_b, kept_delta, kept_b = np.zeros(p), np.zeros(1), np.zeros(p), np.zeros(1)
    head = (columns.data, columns.indices, columns.indptr, columns.dense, n, order)
    for _ in range(4):
        worst = kernels.column_cd_epoch_packed(
            *head, packed, col_curv, coef, delta, problem.l1, problem.l2, intercept, delta_b
        )
        got = epoch(
            *head, state, col_curv, coef, kept_delta, problem.l1, problem.l2, intercept, kept_b
        )
        np.testing.assert_allclose(kept_delta, delta, rtol=1e-12, atol=1e-15)
        residual = state if unit else state[:, 0]
        np.testing.assert_allclose(residual, grad + curv * packed[:, 2], rtol=1e-10, atol=1e-13)
        assert kept_b[0] == pytest.approx(delta_b[0], rel=1e-12, abs=1e-15)
        assert got == pytest.approx(worst, rel=1e-12)


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_logistic_l1_by_column_epochs_on_the_pair_finds_the_optimum(monkeypatch, fit_intercept):
    """A one-hot logistic L1 fit by column epochs on (r, D) (as for long X), block shifts
    included, reaches the optimum of the fit by epochs on (g, D, XΔ)."""
    X, y, _ = make_onehot(4000, 6, 40, random_state=3)
    problem = obj.Problem("logistic", 1e-3, 1.0, fit_intercept)
    _inner_solvers(monkeypatch, "columns")
    runs = {}
    for rows in (0, 10**9):  # every X long, none
        with monkeypatch.context() as patch:
            patch.setattr(l1_model, "PAIR_ROWS", rows)
            runs[rows] = newton.fit_newton(
                InMemory(X, y), problem, Options(1e-10, 100, np.random.default_rng(0))
            )
    pair, packed = runs[0], runs[10**9]
    assert "solve:column_cd" in pair.extras["passes"]
    assert pair.certificate.relative_gap <= 1e-10 and packed.certificate.relative_gap <= 1e-10
    assert pair.certificate.primal == pytest.approx(packed.certificate.primal, rel=1e-10)
    np.testing.assert_allclose(pair.coef, packed.coef, atol=1e-5)


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_lasso_by_column_epochs_on_the_residual_finds_the_optimum(monkeypatch, fit_intercept):
    """A one-hot lasso solved by column epochs (block shifts included) on the residual
    alone, against the same fit by the epochs on (g, D, XΔ + Δb) and scikit-learn."""
    X, y, _ = make_onehot(4000, 6, 40, task="regression", random_state=3)
    problem = obj.Problem("squared", 2e-3, 1.0, fit_intercept)
    _inner_solvers(monkeypatch, "columns")
    runs = {}
    for which in ("unit", "packed"):
        with monkeypatch.context() as patch:
            if which == "packed":
                patch.setattr(l1_model, "_unit_curvature", lambda design, model: False)
            runs[which] = newton.fit_newton(
                InMemory(X, y), problem, Options(1e-10, 100, np.random.default_rng(0))
            )
    unit, packed = runs["unit"], runs["packed"]
    assert "solve:column_cd" in unit.extras["passes"]
    assert unit.certificate.relative_gap <= 1e-10 and packed.certificate.relative_gap <= 1e-10
    assert unit.certificate.primal == pytest.approx(packed.certificate.primal, rel=1e-10)
    ref = linear_model.Lasso(
        alpha=2e-3, fit_intercept=fit_intercept, tol=1e-12, max_iter=100_000
    ).fit(X.toarray(), y)
    ref_primal = obj.certificate(problem, X, y, ref.coef_, float(ref.intercept_)).primal
    assert unit.certificate.primal <= ref_primal * (1 + 1e-9)


@pytest.mark.parametrize("which", ["gram", "columns"])
@pytest.mark.parametrize(
    "loss,rho,fit_intercept",
    [
        ("logistic", 1.0, False),
        ("logistic", 0.5, True),
        ("logistic", 0.0, True),
        ("squared", 1.0, True),
        ("squared_hinge", 0.0, False),
    ],
)
def test_column_ordered_x_is_read_as_rows_without_a_copy(
    rng, monkeypatch, which, loss, rho, fit_intercept
):
    """Dense X in Fortran order: the passes by rows run on its columns (no row-ordered
    copy for an L1 model; CG by rows copies once), and the model is the one of the same X
    in C order, to the certificate's accuracy."""
    _inner_solvers(monkeypatch, which)
    X = rng.normal(size=(300, 40))
    X[:, :5] *= 3.0
    y = np.sign(X[:, :6] @ rng.normal(size=6) + 0.5 * rng.normal(size=300))
    if loss == "squared":
        y = X[:, :6] @ rng.normal(size=6) + rng.normal(size=300)
    problem = obj.Problem(loss, 0.02, rho, fit_intercept)
    weights = rng.uniform(0.5, 2.0, size=300)
    runs = {}
    for order in "CF":
        Xo = np.asarray(X, order=order)
        data = InMemory(Xo, y, weights=weights / weights.mean())
        runs[order] = newton.fit_newton(
            data, problem, Options(1e-10, 1000, np.random.default_rng(0))
        )
        assert runs[order].certificate.relative_gap <= 1e-10
    np.testing.assert_allclose(runs["F"].coef, runs["C"].coef, rtol=1e-6, atol=1e-8)
    assert abs(runs["F"].intercept - runs["C"].intercept) <= 1e-7
    design = Design.from_array(np.asfortranarray(X))
    assert isinstance(design.rows, design_module.RowsByColumns)
    assert design.rows.dot(np.ones(40)) == pytest.approx(X.sum(axis=1), rel=1e-12)
    assert design.rows.scatter(y) == pytest.approx(X.T @ y, rel=1e-10, abs=1e-10)
    np.testing.assert_allclose(design.rows.sq_norms(), (X * X).sum(axis=1), rtol=1e-12)
    assert design.rows._rows is None  # no copy yet
    assert design.rows.lines(0, 10).n_major == 10  # the rows' own layout, on first use


@pytest.mark.parametrize("loss", obj.LOSSES)
@pytest.mark.parametrize("project", [True, False])
def test_the_fused_dual_point_is_the_numpy_one(loss, project):
    """kernels.newton.projected_dual (the certificate of an unweighted Newton fit) gives
    the numpy path's projection onto Σa = 0 (with an intercept), dual loss and Σ a_i z_i to
    rounding, sums that give the dual loss of κa for κ in [0, 1] (the rescaled L1
    certificate), and −inf where a point leaves the dual's domain."""
    from dask_scd.engines.certificates import _rescaled_dual_mean
    from dask_scd.kernels.newton import projected_dual

    rng = np.random.default_rng(3)
    problem = obj.Problem(loss, 0.1, 1.0, project)
    for n in (1, 7, 200, 1001):
        y = rng.normal(size=n) if loss == "squared" else np.where(rng.random(n) < 0.3, 1.0, -1.0)
        z = rng.normal(size=n) * 3
        g = obj.loss_derivative(loss, y, z)
        a = np.empty(n)
        fused = projected_dual(obj.LOSS_CODES[loss], y, g, z, project, a)
        b = -g
        scales = obj.dual_scales(problem, {"pos": b[b > 0].sum(), "neg": b[b < 0].sum()})
        expected = np.where(b > 0, b * scales[0], b * scales[1])
        np.testing.assert_allclose(fused[:2], scales, rtol=1e-13)
        np.testing.assert_allclose(a, expected, rtol=1e-13, atol=1e-16)
        dual = obj.dual_loss(loss, y, expected).sum()
        assert fused[2] == pytest.approx(dual, rel=1e-12, abs=1e-12)
        assert fused[3] == pytest.approx(expected @ z, rel=1e-12, abs=1e-12)
        mean = _rescaled_dual_mean(loss, y, a, n, fused[4], fused[5])
        for kappa in (1.0, 0.37, 0.0):
            scaled = obj.dual_loss(loss, y, kappa * expected).sum() / n
            assert mean(kappa) == pytest.approx(scaled, rel=1e-12, abs=1e-14)
    if loss != "squared":  # β = a·y = −2 and 2: outside [0, 1] (β ≥ 0 for the squared hinge)
        y = np.array([1.0, -1.0])
        out = projected_dual(obj.LOSS_CODES[loss], y, np.array([2.0, 2.0]), np.zeros(2), False, a)
        assert out[2] == -np.inf
        if loss == "logistic":  # the rescaled point's sweep (kernels.logistic_dual_sum) too
            outside = _rescaled_dual_mean(loss, y, np.array([2.0, -2.0]), 2, 0.0, 0.0)
            assert outside(1.0) == -np.inf and outside(0.75) == -np.inf  # β = 2, 1.5
            assert outside(0.25) == pytest.approx(np.log(2.0), rel=1e-15)  # β = 1/2: H = ln 2


@pytest.mark.parametrize(
    "loss, penalty, fit_intercept",
    [
        ("squared", "l1", True),
        ("squared", "elasticnet", False),
        ("logistic", "l1", True),
        ("logistic", "l2", True),
        ("squared_hinge", "elasticnet", True),
    ],
)
def test_the_last_certificate_reads_p_on_fresh_margins_without_a_gradient_again(
    rng, loss, penalty, fit_intercept
):
    """A gap at tol on margins accumulated step by step is checked on margins recomputed
    from X with the same dual value: P is then the objective of (θ, b) read from X itself,
    the gap still bounds P − P*, and the gradient's pass is not taken a second time (one
    gradient per certificate: n_iter_ + 1)."""
    X = rng.normal(size=(300, 80))
    score = X[:, :10] @ rng.normal(size=10) + 0.3
    noisy = score + rng.normal(size=300)
    y = np.where(noisy > 0, 1.0, -1.0) if loss != "squared" else noisy
    kwargs = {"loss": loss, "penalty": penalty, "alpha": 0.02, "fit_intercept": fit_intercept}
    optimum = dask_scd.fit(X, y, tol=1e-13, solver="newton", **kwargs)
    fit = dask_scd.fit(X, y, tol=1e-6, solver="newton", **kwargs)
    assert fit.n_iter_ >= 2 and fit.converged_
    problem = obj.Problem(loss, 0.02, {"l1": 1.0, "l2": 0.0}.get(penalty, 0.5), fit_intercept)
    recomputed = _objective(problem, X, y, fit.coef_, fit.intercept_).primal
    assert fit.primal_ == pytest.approx(recomputed, rel=1e-13)
    assert fit.primal_ - optimum.primal_ <= fit.dual_gap_ * abs(fit.primal_) + 1e-14
    assert fit.dual_gap_ <= 1e-6
    assert fit.extras_["passes"]["gradient"] == fit.n_iter_ + 1
