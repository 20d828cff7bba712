"""The L2 Newton step through the n × n kernel (fewer rows than columns): the step equals
the bordered Hessian's solve, the fits reach scikit-learn's optimum, and the planner's
rule sends it the shapes it is for."""

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
from dask_scd.engines.newton.kernel_step import kernel_direction


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


@pytest.mark.parametrize("fit_intercept", [False, True])
@pytest.mark.parametrize("alpha", [1e-2, 1e-5])
def test_wide_logistic_by_kernel_steps_matches_scikit_learn(rng, fit_intercept, alpha):
    X, y = _wide(rng, n=120, p=400)
    problem = obj.Problem("logistic", alpha, 0.0, fit_intercept)
    run = newton.fit_newton(InMemory(X, y), problem, Options(1e-12, 100, np.random.default_rng(0)))
    assert any(kind.endswith("kernel") for kind in run.extras["passes"])
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
