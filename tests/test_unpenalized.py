"""penalty=None: no regularization, fitted by the Newton engine and stopped on the
gradient (there is no dual), against scikit-learn's unpenalized logistic regression."""

import dask.array as da
import numpy as np
import pytest
from sklearn import linear_model
from sklearn.datasets import load_breast_cancer
from sklearn.preprocessing import StandardScaler

import dask_scd
from dask_scd import LogisticRegression


@pytest.fixture(scope="module")
def cancer():
    """Breast cancer, its first ten features standardized: not separable (all thirty are
    nearly so, and the unpenalized optimum then runs off to infinity)."""
    X, y = load_breast_cancer(return_X_y=True)
    return StandardScaler().fit_transform(X[:, :10]), y


def logistic_objective(X, y, coef, intercept):
    signs = np.where(y == 1, 1.0, -1.0)
    return float(np.mean(np.logaddexp(0.0, -signs * (X @ np.ravel(coef) + intercept))))


def test_logistic_matches_sklearn_unpenalized(cancer):
    X, y = cancer
    ours = dask_scd.fit(X, y, loss="logistic", penalty=None, tol=1e-10)
    reference = linear_model.LogisticRegression(
        C=np.inf, solver="newton-cholesky", tol=1e-12, max_iter=1000
    ).fit(X, y)
    theirs = logistic_objective(X, y, reference.coef_, reference.intercept_[0])
    assert ours.solver_ == "newton" and ours.converged_
    assert ours.grad_norm_ <= 1e-10 and np.isnan(ours.dual_gap_)
    assert ours.primal_ == pytest.approx(theirs, rel=1e-8)
    assert logistic_objective(X, y, ours.coef_, ours.intercept_) == pytest.approx(theirs, rel=1e-8)


def test_estimator_without_penalty(cancer):
    X, y = cancer
    model = LogisticRegression(penalty=None, tol=1e-10).fit(X, y)
    reference = linear_model.LogisticRegression(
        C=np.inf, solver="newton-cholesky", tol=1e-12, max_iter=1000
    ).fit(X, y)
    np.testing.assert_allclose(model.coef_, reference.coef_, rtol=1e-6, atol=1e-6)
    assert model.grad_norm_ <= 1e-10 and np.isnan(model.dual_gap_)
    assert not hasattr(LogisticRegression().fit(X, y), "grad_norm_")


def test_least_squares_is_exact(cancer):
    X, _ = cancer
    truth = np.linspace(-1.0, 1.0, X.shape[1])
    result = dask_scd.fit(X, X @ truth + 2.0, penalty=None, tol=1e-12)
    np.testing.assert_allclose(result.coef_, truth, atol=1e-9)
    assert result.intercept_ == pytest.approx(2.0)


def test_small_dask_input_fits_in_memory(cancer):
    X, y = cancer
    result = dask_scd.fit(
        da.from_array(X, chunks=(200, 10)), y, loss="logistic", penalty=None, tol=1e-10
    )
    assert result.solver_ == "newton" and result.grad_norm_ <= 1e-10


@pytest.mark.parametrize("solver", ["scd", "sdca", "gram", "duhl"])
def test_other_solvers_refuse(cancer, solver):
    X, y = cancer
    loss = "squared" if solver == "gram" else "logistic"
    with pytest.raises(ValueError, match="penalty=None .* \\['newton'\\]"):
        dask_scd.fit(X, y, loss=loss, penalty=None, solver=solver)


def test_losses_without_a_penalty(cancer):
    X, y = cancer
    with pytest.raises(ValueError, match="penalty=None"):
        dask_scd.fit(X, y, loss="squared_hinge", penalty=None)


def test_max_iter_warns_with_the_gradient_norm(cancer):
    X, y = cancer
    with pytest.warns(Warning, match="relative gradient norm"):
        result = dask_scd.fit(X, y, loss="logistic", penalty=None, tol=1e-12, max_iter=1)
    assert not result.converged_ and result.grad_norm_ > 1e-12
