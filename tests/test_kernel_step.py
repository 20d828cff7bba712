"""The L2 Newton step through the n × n kernel (fewer rows than columns): the step equals
the bordered Hessian's solve, the fits reach scikit-learn's optimum, and the planner's
rule sends it the shapes it is for. SDCA's epochs in the kernel's form, the start of such
fits: an epoch is the row-form epoch's, a fit they end is certified from X and reaches
scikit-learn's optimum, and a fit they do not end is Newton's from θ = 0, bit for bit."""

import kernel_reference as reference
import numpy as np
import pytest
import scipy.sparse as sp
from test_newton import _scikit_learn

import dask_scd
from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.engines.base import Options
from dask_scd.engines.newton import newton, quadratic
from dask_scd.engines.newton.design import Design
from dask_scd.engines.newton.kernel_step import dual_start, kernel_direction
from dask_scd.kernels.sdca import kernel_dual_epoch


def _wide(rng, n=60, p=150, sparse=False):
    X = rng.normal(size=(n, p))
    if sparse:
        X = sp.random(n, p, density=0.1, random_state=1, format="csr") + 0.0
    score = X @ rng.normal(size=p) + 0.3
    return X, np.where(score + rng.normal(size=n) > 0, 1.0, -1.0)


def _model(rng, X, l2, fit_intercept, zeros=0):
    """A model at a random point: curvatures with ``zeros`` exact zeros (weight 0)."""
    n, p = X.shape
    problem = obj.Problem("logistic", l2, 0.0, fit_intercept)
    curv = rng.uniform(0.01, 0.25, size=n)
    curv[:zeros] = 0.0
    coef, grad_rows = rng.normal(size=p), rng.normal(size=n)
    grad = np.asarray(X.T @ grad_rows).ravel() / n
    model = quadratic.Model(problem, coef, 0.2, grad, grad_rows.sum() / n, grad_rows, curv)
    return problem, model


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("fit_intercept", [False, True])
def test_kernel_step_solves_the_bordered_hessian(rng, sparse, fit_intercept):
    X, _ = _wide(rng, sparse=sparse)
    n, p = X.shape
    problem, model = _model(rng, X, 1e-2, fit_intercept, zeros=5)
    design = Design.from_array(X)
    delta, delta_b, direction = kernel_direction(design, model)
    # the Hessian (XᵀDX/n + αI, bordered by the intercept) formed and solved directly
    hessian = design.gram(np.arange(p), model.curv, fit_intercept)
    hessian[np.arange(p), np.arange(p)] += problem.l2
    rhs = -(model.grad + problem.l2 * model.coef)
    if fit_intercept:
        rhs = np.append(rhs, -model.grad_b)
    expected = np.linalg.solve(hessian, rhs)
    np.testing.assert_allclose(delta, expected[:p], rtol=1e-9, atol=1e-11)
    assert delta_b == pytest.approx(expected[p] if fit_intercept else 0.0, rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(direction, X @ delta + delta_b, rtol=1e-9, atol=1e-11)


def test_kernel_step_hands_back_when_alpha_is_below_the_rounding(rng):
    X, _ = _wide(rng)
    _, model = _model(rng, X, 1e-14, False)
    assert kernel_direction(Design.from_array(X), model) is None


def test_solver_rule_takes_the_kernel_for_wide_dense_rows_only(rng):
    problem = obj.Problem("logistic", 1e-3, 0.0, False)
    wide = Design.from_array(rng.normal(size=(200, 500)))
    tall = Design.from_array(rng.normal(size=(5000, 20)))
    text = Design.from_array(sp.random(1000, 20000, density=0.005, random_state=0, format="csr"))
    assert quadratic.l2_solver(wide, problem) == "kernel"
    assert quadratic.l2_solver(tall, problem) == "cholesky"
    assert quadratic.l2_solver(text, problem) == "cg"  # n³ beside 100k stored entries
    assert quadratic.l2_solver(wide, obj.Problem("logistic", 0.0, 0.0, False)) != "kernel"


def test_the_squared_hinge_takes_an_exact_step_where_cg_would_need_many_more(rng):
    """Inexact (CG) Newton steps on the squared hinge lose the finite termination of exact
    ones, whose step lands on the minimizer of the current piece: on sparse binary rows
    with n < p and a small α, the kernel's exact steps are chosen where the logistic
    keeps CG, and the fit takes a handful of steps (47 by CG before) at the same gap."""
    from dask_scd.datasets import make_binary_features

    X, y = make_binary_features(300, 2000, random_state=0)
    X = sp.csr_matrix(X)
    design = Design.from_array(X)
    alpha = 0.01 / 300
    assert quadratic.l2_solver(design, obj.Problem("squared_hinge", alpha, 0.0, True)) == "kernel"
    assert quadratic.l2_solver(design, obj.Problem("logistic", alpha, 0.0, True)) == "cg"
    fit = dask_scd.fit(X, y, loss="squared_hinge", alpha=alpha, tol=1e-8, solver="newton")
    assert fit.converged_ and fit.dual_gap_ <= 1e-8
    assert fit.n_iter_ <= 12 and "solve:cg" not in fit.extras_["passes"]


@pytest.mark.parametrize("sparse", [False, True])
def test_cg_step_with_no_curvature_leaves_the_intercept_alone(rng, sparse):
    """The squared hinge with every margin past 1 has no curvature on any row: the model
    is α‖θ‖²/2 plus a linear term in θ, flat in b. CG then solves αΔ = −(∇f + αθ) on θ's
    block alone (it read the intercept's entry of the right-hand side against a p-vector
    preconditioner, and stopped the fit with a shape error) and leaves b (Δb = 0)."""
    X, _ = _wide(rng, sparse=sparse)
    n, p = X.shape
    problem = obj.Problem("squared_hinge", 1e-2, 0.0, True)
    coef, grad_rows = rng.normal(size=p), np.zeros(n)
    grad = rng.normal(size=p) * 1e-3
    model = quadratic.Model(problem, coef, 0.2, grad, 0.0, grad_rows, np.zeros(n))
    rhs = np.append(-(grad + problem.l2 * coef), 0.0)
    solution, iterations, image = quadratic.hessian_cg(Design.from_array(X), model, rhs)
    assert solution.shape == (p + 1,) and solution[p] == 0.0 and iterations >= 1
    np.testing.assert_allclose(solution[:p], rhs[:p] / problem.l2, rtol=1e-8)
    np.testing.assert_allclose(image, X @ solution[:p], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("fit_intercept", [False, True])
@pytest.mark.parametrize("alpha", [1e-2, 1e-5])
def test_wide_logistic_by_kernel_steps_matches_scikit_learn(rng, fit_intercept, alpha):
    X, y = _wide(rng, n=120, p=400)
    problem = obj.Problem("logistic", alpha, 0.0, fit_intercept)
    run = newton.fit_newton(InMemory(X, y), problem, Options(1e-12, 100, np.random.default_rng(0)))
    # kernel steps, or (no intercept) SDCA's epochs on the kernel and maybe kernel steps
    assert any(kind in ("solve:kernel", "dual_start") for kind in run.extras["passes"])
    assert run.certificate.relative_gap <= 1e-12
    coef, intercept = _scikit_learn("logistic", "l2", 0.0, alpha, X, y, fit_intercept)
    theirs = obj.certificate(problem, X, y, coef, intercept).primal
    assert run.certificate.primal <= theirs * (1 + 1e-12)
    np.testing.assert_allclose(run.coef, coef, rtol=1e-5, atol=1e-7)


def test_weighted_wide_fit_equals_the_fit_of_repeated_rows(rng):
    X, y = _wide(rng, n=50, p=200)
    weights = rng.integers(0, 3, size=50).astype(float)
    kw = dict(loss="logistic", alpha=1e-3, tol=1e-12, solver="newton")
    weighted = dask_scd.fit(X, y, sample_weight=weights, **kw)
    rows = np.repeat(np.arange(50), weights.astype(int))
    repeated = dask_scd.fit(X[rows], y[rows], **kw)
    assert weighted.primal_ == pytest.approx(repeated.primal_, rel=1e-10)
    np.testing.assert_allclose(weighted.coef_, repeated.coef_, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("lower", [False, True])
def test_cholesky_is_scipys_to_the_bit(lower):
    """engines.cholesky calls LAPACK as scipy.linalg.cho_factor / cho_solve do: the same
    factor and solution, bit for bit, and the same errors."""
    import scipy.linalg

    from dask_scd.engines import cholesky

    rng = np.random.default_rng(3)
    A = rng.normal(size=(40, 12))
    H = A.T @ A + 0.1 * np.eye(12)
    b = rng.normal(size=12)
    mine = cholesky.factor(H, lower=lower)
    theirs = scipy.linalg.cho_factor(H, lower=lower)
    half = np.tril if lower else np.triu
    assert np.array_equal(half(mine[0]), half(theirs[0]))
    assert np.array_equal(cholesky.solve(mine, b), scipy.linalg.cho_solve(theirs, b))
    with pytest.raises(scipy.linalg.LinAlgError):
        cholesky.factor(-H)
    bad = H.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        cholesky.factor(bad)


@pytest.mark.parametrize("loss", ["logistic", "squared_hinge"])
def test_kernel_dual_epoch_is_the_row_form_epoch(rng, loss):
    """Epochs on K = XXᵀ with the margins m = Ka/(αn) take the steps of SDCA's epochs on
    the rows in the same order: the same dual point, and m = X·(Xᵀa/(αn))."""
    X, y = _wide(rng, n=40, p=90)
    n = len(y)
    problem = obj.Problem(loss, 0.05, 0.0, False)
    alpha_n = problem.alpha * n
    a0 = 0.3 * y
    a, margins = a0.copy(), (X @ X.T) @ a0 / alpha_n
    ref_a, ref_w = a0.copy(), X.T @ a0 / alpha_n
    for _ in range(3):
        kernel_dual_epoch(X @ X.T, y, a, margins, problem.loss_code, alpha_n)
        reference.sdca_epoch(problem, X, y, ref_a, ref_w, np.arange(n))
    np.testing.assert_allclose(a, ref_a, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(margins, X @ ref_w, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("loss", ["logistic", "squared_hinge"])
@pytest.mark.parametrize("sparse", [False, True])
def test_fit_ended_by_kernel_epochs_is_certified_and_optimal(rng, loss, sparse):
    """On rows far from collinear the epochs reach tol/2 and Newton's first certificate,
    computed from X with their dual point offered, ends the fit: no step, a gap ≤ tol,
    scikit-learn's optimum."""
    X, y = _wide(rng, n=80, p=400)
    if sparse:  # the same rows in CSR: K from the sparse product
        X = sp.csr_matrix(X)
    n = len(y)
    tol = 1e-10
    fit = dask_scd.fit(X, y, loss=loss, alpha=1.0 / n, fit_intercept=False, tol=tol)
    assert fit.extras_["plan"]["engine"] == "newton"
    assert fit.n_iter_ == 0 and fit.extras_["passes"]["dual_start"] > 0
    assert 0.0 <= fit.dual_gap_ <= tol
    problem = obj.Problem(loss, 1.0 / n, 0.0, False)
    exact = obj.certificate(problem, X, y, fit.coef_, 0.0)
    assert exact.primal == pytest.approx(fit.primal_, rel=1e-12)
    # α-strong convexity: ‖θ − θ*‖² ≤ 2(P − P*)/α ≤ 2·gap/α, θ* from Newton's steps alone
    tight = dask_scd.fit(
        X, y, loss=loss, alpha=1.0 / n, fit_intercept=False, tol=1e-14, coef_init=np.zeros(400)
    )
    gap = fit.dual_gap_ * fit.primal_
    assert np.linalg.norm(fit.coef_ - tight.coef_) <= np.sqrt(2.0 * gap * n) * 1.01 + 1e-12
    if loss == "logistic":
        coef, _ = _scikit_learn("logistic", "l2", 0.0, 1.0 / n, X, y, False)
        assert fit.primal_ <= obj.certificate(problem, X, y, coef, 0.0).primal * (1 + 1e-9)


def test_kernel_epochs_stop_on_collinear_rows_and_newton_starts_from_zero(rng):
    """Rows sharing one large common factor: SDCA's gap falls by ~5 % an epoch, so the
    epochs stop within a few; the fit is then Newton's from θ = 0, the same bits as a
    fit given θ = 0 as its start (which skips the epochs)."""
    n, p = 100, 300
    X = rng.normal(size=(n, p)) + 3.0 * rng.normal(size=(n, 1))
    y = np.where(rng.normal(size=n) > 0, 1.0, -1.0)
    problem = obj.Problem("logistic", 1.0 / n, 0.0, False)
    start, dual, correlation, epochs = dual_start(Design.from_array(X), problem, y, 1e-8)
    assert start is None and dual is None and correlation is None and 1 <= epochs <= 5
    options = Options(1e-8, 100, np.random.default_rng(0))
    cold = newton.fit_newton(InMemory(X, y), problem, options)
    zero = Options(1e-8, 100, np.random.default_rng(0), start=(np.zeros(p), 0.0))
    given = newton.fit_newton(InMemory(X, y), problem, zero)
    assert cold.extras["passes"]["dual_start"] > 0 and "dual_start" not in given.extras["passes"]
    assert np.array_equal(cold.coef, given.coef) and cold.n_iter == given.n_iter
    assert cold.certificate.relative_gap <= 1e-8


@pytest.mark.parametrize(
    "kw",
    [
        dict(loss="squared"),  # its Newton step is exact
        dict(fit_intercept=True),  # the dual constraint Σa = 0
        dict(sample_weight=True),
    ],
)
def test_kernel_epochs_run_only_where_they_apply(rng, kw):
    X, y = _wide(rng, n=60, p=300)
    args = dict(loss="logistic", alpha=1.0 / 60, fit_intercept=False, tol=1e-8)
    args.update(kw)
    if args.pop("sample_weight", None):
        args["sample_weight"] = rng.uniform(0.5, 2.0, size=60)
    fit = dask_scd.fit(X, y, **args)
    assert "dual_start" not in fit.extras_["passes"]
    assert fit.dual_gap_ <= 1e-8


@pytest.mark.parametrize("alpha", [1.0, 0.01])
def test_a_loose_tol_returns_no_point_worse_than_zero(alpha):
    """After one epoch P(w) can be 20x P(0) (w = Xᵀa/(αn) from a far dual point): a tol
    that such a gap meets still returns a point no worse than Newton's start θ = 0."""
    rng = np.random.RandomState(42)
    X = rng.randn(200, 500)
    y = np.sign(X @ rng.randn(500))
    for tol in (10.0, 1.0, 0.1):
        fit = dask_scd.fit(X, y, loss="logistic", alpha=alpha / 200, fit_intercept=False, tol=tol)
        assert fit.primal_ <= np.log(2.0)
        assert np.all(np.isfinite(X @ fit.coef_)) and fit.dual_gap_ <= tol


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("scale", [1.0, 0.01])
def test_kernel_epochs_certify_no_wrong_answer(seed, scale):
    """The gap a fit ended by the epochs reports bounds its true suboptimality (P* from
    Newton's steps alone to 1e-13), on long rows (q = ‖x‖²/(αn) up to 1e5, where the
    primal points of early epochs can be worse than the last's)."""
    rng = np.random.default_rng(seed)
    n, p = 120, 1500
    X = rng.normal(size=(n, p))
    y = np.where(X @ rng.normal(size=p) + rng.normal(size=n) > 0, 1.0, -1.0)
    kw = dict(loss="logistic", alpha=scale / n, fit_intercept=False)
    fit = dask_scd.fit(X, y, tol=1e-6, **kw)
    best = dask_scd.fit(X, y, tol=1e-13, coef_init=np.zeros(p), **kw)
    assert fit.primal_ - best.primal_ <= fit.dual_gap_ * fit.primal_ * (1 + 1e-9) + 1e-15
    assert fit.dual_gap_ <= 1e-6
