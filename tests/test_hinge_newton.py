"""The hinge SVM by the Newton engine (smoothed hinge, width driven to zero)."""

import warnings

import numpy as np
import pytest
from conftest import shared_dataset
from sklearn import svm
from sklearn.exceptions import ConvergenceWarning

import dask_scd


def _objective(X, y, coef, intercept, alpha):
    """P(θ, b) = mean hinge + α/2‖θ‖², from X itself."""
    margins = np.asarray(X @ coef).ravel() + intercept
    return float(np.maximum(0.0, 1.0 - y * margins).mean()) + 0.5 * alpha * float(coef @ coef)


def _ill_conditioned(rng, n=400, p=30):
    """Columns over 6 orders of magnitude (cond(X) ≈ 1e6), two nearly collinear, an offset."""
    X = rng.normal(size=(n, p))
    X[:, 1] = X[:, 0] + 1e-3 * rng.normal(size=n)
    X *= np.logspace(-3, 3, p)
    score = X @ (rng.normal(size=p) / np.logspace(-3, 3, p)) + 0.5
    return X, np.where(score + rng.normal(size=n) > 0, 1.0, -1.0)


def _libsvm(X, y, alpha):
    """libsvm's linear SVC: ½‖w‖² + C Σ hinge with an unpenalized intercept, C = 1/(αn)."""
    model = svm.SVC(kernel="linear", C=1.0 / (alpha * len(y)), tol=1e-10, max_iter=-1)
    model.fit(X, y)
    return model.coef_.ravel(), float(model.intercept_[0])


@pytest.mark.parametrize("C", [1.0, 10.0])
@pytest.mark.parametrize("solver", ["auto", "newton"])
def test_adult_reaches_1e9_with_the_default_max_iter(solver, C):
    X, y = shared_dataset("a9a.t")
    alpha = 1.0 / (C * len(y))
    fit = dask_scd.fit(X, y, loss="hinge", alpha=alpha, tol=1e-9, solver=solver)
    assert fit.solver_ == "newton"
    assert fit.converged_ and fit.dual_gap_ <= 1e-9
    # The reported objective is that of the returned (θ, b), read from X.
    primal = _objective(X, y, fit.coef_, fit.intercept_, alpha)
    assert abs(fit.primal_ - primal) <= 1e-12 * primal


@pytest.mark.parametrize("C", [1.0, 10.0])
def test_adult_subsample_matches_libsvm(C):
    X, y = shared_dataset("a9a.t")
    X, y = X[:1500], y[:1500]
    alpha = 1.0 / (C * len(y))
    fit = dask_scd.fit(X, y, loss="hinge", alpha=alpha, tol=1e-9, solver="newton")
    assert fit.converged_
    ours = _objective(X, y, fit.coef_, fit.intercept_, alpha)
    reference = _objective(X, y, *_libsvm(X.toarray(), y, alpha), alpha)
    # The certificate bounds our error by 1e-9; libsvm's own stopping rule is looser.
    assert ours <= reference * (1 + 1e-9)
    assert reference - ours <= 1e-7 * reference


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_certified_gap_never_below_the_true_error(fit_intercept):
    X, y = shared_dataset("a9a.t")
    X, y = X[:3000], y[:3000]
    alpha = 1.0 / (10.0 * len(y))
    tight = dask_scd.fit(
        X, y, loss="hinge", alpha=alpha, tol=3e-11, solver="newton", fit_intercept=fit_intercept
    )
    best = tight.primal_  # ≥ P*: the errors below are at most the true ones
    fit = dask_scd.fit(
        X, y, loss="hinge", alpha=alpha, tol=1e-10, solver="newton", fit_intercept=fit_intercept
    )
    gaps = np.array(fit.history_.relative_gap)
    errors = (np.array(fit.history_.primal) - best) / best
    assert len(gaps) > 10
    assert np.all(gaps >= errors - 1e-15)
    # A feasible dual point of the tight fit bounds P* from below: the gap is honest there.
    assert tight.primal_ - tight.dual_gap_ * tight.primal_ <= fit.primal_


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_ill_conditioned_reaches_1e9(rng, fit_intercept):
    X, y = _ill_conditioned(rng)
    alpha = 1e-3
    fit = dask_scd.fit(
        X, y, loss="hinge", alpha=alpha, tol=1e-9, solver="newton", fit_intercept=fit_intercept
    )
    assert fit.converged_ and fit.dual_gap_ <= 1e-9
    assert abs(fit.primal_ - _objective(X, y, fit.coef_, fit.intercept_, alpha)) <= 1e-12
    # Certified: no point has a smaller objective than the certificate's dual value.
    looser = dask_scd.fit(
        X, y, loss="hinge", alpha=alpha, tol=1e-4, solver="newton", fit_intercept=fit_intercept
    )
    assert fit.primal_ <= looser.primal_ * (1 + 1e-12)
    assert looser.primal_ - fit.primal_ <= looser.dual_gap_ * looser.primal_


def test_without_intercept_matches_linear_svc(rng):
    X = rng.normal(size=(300, 8))
    y = np.where(X @ rng.normal(size=8) + 0.3 * rng.normal(size=300) > 0, 1.0, -1.0)
    alpha = 0.1
    fit = dask_scd.fit(
        X, y, loss="hinge", alpha=alpha, fit_intercept=False, tol=1e-10, solver="newton"
    )
    model = svm.LinearSVC(
        loss="hinge",
        C=1.0 / (alpha * len(y)),
        fit_intercept=False,
        dual=True,
        tol=1e-12,
        max_iter=1_000_000,
        random_state=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    reference = model.coef_.ravel()
    assert fit.converged_ and fit.intercept_ == 0.0
    # liblinear's stopping rule is not a gap: on some draws it stops ~1e-6 above the optimum
    # (1e-4 of the coefficients' scale); its objective is never below ours by more than
    # our certified gap.
    np.testing.assert_allclose(fit.coef_, reference, rtol=0, atol=1e-3 * np.abs(reference).max())
    ours = _objective(X, y, fit.coef_, 0.0, alpha)
    assert ours <= _objective(X, y, reference, 0.0, alpha) + fit.dual_gap_ * ours
    tight = dask_scd.fit(
        X,
        y,
        loss="hinge",
        alpha=alpha,
        fit_intercept=False,
        tol=1e-12,
        solver="sdca",
        max_iter=100_000,
    )
    np.testing.assert_allclose(fit.coef_, tight.coef_, rtol=0, atol=1e-6)
