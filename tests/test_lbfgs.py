"""The L-BFGS engine (solver="lbfgs"): smooth losses with an L2 penalty.

It must reach a certified gap on every smooth loss, dense and sparse, with and without
intercept and sample weights, at the optimum of the Newton engine (itself checked against
scikit-learn in test_newton.py); its certificate never claims less than the true error;
it refuses what it does not solve.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression

import dask_scd
from dask_scd import objectives as obj
from dask_scd.datasets import make_onehot


def _data(kind):
    if kind == "dense":
        X, y = load_breast_cancer(return_X_y=True)
        X = (X - X.mean(0)) / X.std(0)
        return X, 2.0 * y - 1.0
    X, y, _ = make_onehot(3000, 5, 40, random_state=0)
    return sp.csr_matrix(X), y


@pytest.mark.parametrize("kind", ["dense", "onehot"])
@pytest.mark.parametrize("loss", ["logistic", "squared_hinge", "squared"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_reaches_newton_s_optimum_with_a_certified_gap(kind, loss, fit_intercept):
    X, y = _data(kind)
    if loss == "squared":
        y = y + np.linspace(-0.5, 0.5, len(y))
    alpha = 1.0 / len(y)
    kw = dict(loss=loss, penalty="l2", alpha=alpha, fit_intercept=fit_intercept)
    ours = dask_scd.fit(X, y, solver="lbfgs", tol=1e-10, max_iter=5000, **kw)
    ref = dask_scd.fit(X, y, solver="newton", tol=1e-12, **kw)
    assert ours.solver_ == "lbfgs"
    assert ours.dual_gap_ <= 1e-10 and ours.converged_
    p_ours, p_ref = ours.primal_, ref.primal_
    assert abs(p_ours - p_ref) <= 1e-10 * abs(p_ref)
    # the certificate is honest: the true error (against the tighter fit) is within it
    problem = obj.Problem(loss, alpha, 0.0, fit_intercept)
    P = obj.certificate(problem, X, y, ours.coef_, ours.intercept_).primal
    assert P == pytest.approx(p_ours, rel=1e-13)
    assert P - min(p_ref, P) <= ours.dual_gap_ * abs(P) + 1e-15
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=0, atol=1e-4 * np.abs(ref.coef_).max())


def test_matches_scikit_learn_logistic_regression():
    X, y = _data("dense")
    ours = dask_scd.fit(
        X,
        y,
        loss="logistic",
        penalty="l2",
        alpha=1.0 / len(y),
        tol=1e-12,
        solver="lbfgs",
        max_iter=5000,
    )
    ref = LogisticRegression(C=1.0, tol=1e-12, max_iter=10_000).fit(X, y)
    problem = obj.Problem("logistic", 1.0 / len(y), 0.0, True)
    p_ref = obj.certificate(problem, X, y, ref.coef_.ravel(), ref.intercept_[0]).primal
    assert ours.primal_ <= p_ref * (1 + 1e-12)
    np.testing.assert_allclose(ours.coef_, ref.coef_.ravel(), atol=1e-4)


def test_integer_weights_equal_repeated_rows():
    X, y = _data("dense")
    rng = np.random.default_rng(0)
    w = rng.integers(0, 4, len(y)).astype(float)
    kw = dict(loss="logistic", penalty="l2", alpha=1e-3, tol=1e-12, solver="lbfgs", max_iter=5000)
    weighted = dask_scd.fit(X, y, sample_weight=w, **kw)
    rows = np.repeat(np.arange(len(y)), w.astype(int))
    repeated = dask_scd.fit(X[rows], y[rows], **kw)
    np.testing.assert_allclose(weighted.coef_, repeated.coef_, atol=1e-6)
    assert abs(weighted.intercept_ - repeated.intercept_) <= 1e-6


def test_history_counts_iterations_and_the_gap_falls():
    X, y = _data("onehot")
    r = dask_scd.fit(X, y, loss="logistic", penalty="l2", alpha=1e-3, tol=1e-8, solver="lbfgs")
    gaps = np.asarray(r.history_.relative_gap)
    assert r.history_.iteration[-1] == r.n_iter_
    assert gaps[-1] <= 1e-8 < gaps[0]


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"penalty": "l1"}, "L2"),
        ({"penalty": "elasticnet", "l1_ratio": 0.5}, "L2"),
        ({"loss": "hinge"}, "smooth"),
    ],
)
def test_refuses_what_it_does_not_solve(kw, match):
    X, y = _data("dense")
    args = dict(loss="logistic", penalty="l2", alpha=1e-2, solver="lbfgs") | kw
    with pytest.raises(ValueError, match=match):
        dask_scd.fit(X, y, **args)
