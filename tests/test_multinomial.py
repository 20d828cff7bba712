"""Multinomial (softmax) logistic regression: agreement with scikit-learn's multinomial
models on the same objective, the entropy dual's certificate, and the estimator's
multi_class choices (binary and one-vs-rest fits unchanged)."""

import warnings

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import softmax
from sklearn import linear_model
from sklearn.datasets import load_digits, load_iris
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import StandardScaler

import dask_scd
from dask_scd import LogisticRegression
from dask_scd.objectives import Problem
from dask_scd.objectives.multinomial import certificate

TOL = 1e-10


@pytest.fixture(autouse=True)
def one_blas_thread():
    """The products here are small (1797 × 64 by 64 × 10): BLAS threads waking on a busy
    machine cost more than the arithmetic (scikit-learn's lbfgs took 17 s for 0.4 s)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _problem(alpha, l1_ratio=0.0, fit_intercept=True):
    return Problem(loss="multinomial", alpha=alpha, l1_ratio=l1_ratio, fit_intercept=fit_intercept)


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return StandardScaler().fit_transform(X), y


@pytest.fixture(scope="module")
def iris():
    X, y = load_iris(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def _assert_certified(model, X, y, alpha, l1_ratio=0.0, tol=TOL):
    """The fit's gap is ≤ tol, non-negative at every certified step, and an independent
    certificate of the returned model says the same."""
    assert model.multi_class_ == "multinomial" and model.solver_ == "newton"
    assert model.dual_gap_.shape == (1,) and model.dual_gap_[0] <= tol
    assert len(model.history_) >= 2
    assert all(0.0 <= g for g in model.history_.relative_gap)
    codes = np.searchsorted(model.classes_, y)
    cert = certificate(_problem(alpha, l1_ratio), X, codes, model.coef_, model.intercept_)
    assert 0.0 <= cert.gap <= tol * abs(cert.primal)
    assert cert.primal == pytest.approx(model.history_.primal[-1], rel=1e-12)
    return cert


@pytest.mark.parametrize("dataset, C", [("digits", 0.1), ("iris", 1.0)])
def test_l2_matches_sklearn_lbfgs_objective_and_probabilities(dataset, C, request):
    X, y = request.getfixturevalue(dataset)
    n = len(y)
    model = LogisticRegression(C=C, tol=TOL).fit(X, y)
    reference = linear_model.LogisticRegression(C=C, tol=1e-12, max_iter=10_000).fit(X, y)
    assert model.coef_.shape == reference.coef_.shape == (len(np.unique(y)), X.shape[1])
    assert model.intercept_.shape == (len(np.unique(y)),)
    ours = _assert_certified(model, X, y, 1.0 / (C * n))
    theirs = certificate(_problem(1.0 / (C * n)), X, y, reference.coef_, reference.intercept_)
    assert abs(ours.primal - theirs.primal) <= 1e-7 * theirs.primal
    # weak duality: our dual value bounds scikit-learn's objective too
    assert ours.dual <= theirs.primal
    np.testing.assert_allclose(model.predict_proba(X), reference.predict_proba(X), atol=1e-6)
    np.testing.assert_array_equal(model.predict(X), reference.predict(X))
    np.testing.assert_allclose(model.intercept_.sum(), 0.0, atol=1e-12)


def test_every_recorded_step_has_a_non_negative_gap(digits):
    X, y = digits
    result = dask_scd.fit(X, y, loss="multinomial", alpha=1e-3, tol=1e-12)
    gaps = result.extras_["primal_minus_dual"]
    assert len(gaps) == len(result.history_) and min(gaps) >= 0.0
    assert result.dual_gap_ <= 1e-12
    # Newton: the gap falls superlinearly once close
    assert result.n_iter_ <= 15


@pytest.mark.parametrize(
    "dataset, C, l1_ratio",
    [
        ("digits", 0.1, 1.0),
        ("iris", 1.0, 1.0),
        ("iris", 0.5, 0.5),
    ],
)
def test_l1_and_elastic_net_match_sklearn_saga(dataset, C, l1_ratio, request):
    X, y = request.getfixturevalue(dataset)
    if dataset == "digits":  # saga at a tight tol: 500 rows keep it to a second
        X, y = load_digits(return_X_y=True)
        X, y = X[:500] / 16.0, y[:500]
    n = len(y)
    alpha = 1.0 / (C * n)
    penalty = "l1" if l1_ratio == 1.0 else "elasticnet"
    model = LogisticRegression(C=C, penalty=penalty, l1_ratio=l1_ratio, tol=TOL).fit(X, y)
    reference = linear_model.LogisticRegression(
        C=C, l1_ratio=l1_ratio, solver="saga", tol=1e-8, max_iter=100_000
    ).fit(X, y)
    ours = _assert_certified(model, X, y, alpha, l1_ratio)
    theirs = certificate(_problem(alpha, l1_ratio), X, y, reference.coef_, reference.intercept_)
    assert abs(ours.primal - theirs.primal) <= 1e-6 * theirs.primal
    assert ours.dual <= theirs.primal
    if l1_ratio == 1.0:
        # the same support (coefficients at zero exactly, not merely small)
        assert np.count_nonzero(model.coef_) < model.coef_.size
        np.testing.assert_array_equal(model.coef_ != 0, np.abs(reference.coef_) > 1e-4)


def test_without_intercept_matches_sklearn(iris):
    X, y = iris
    model = LogisticRegression(C=1.0, fit_intercept=False, tol=TOL).fit(X, y)
    reference = linear_model.LogisticRegression(
        C=1.0, fit_intercept=False, tol=1e-12, max_iter=10_000
    ).fit(X, y)
    np.testing.assert_array_equal(model.intercept_, 0.0)
    alpha = 1.0 / len(y)
    problem = _problem(alpha, fit_intercept=False)
    ours = certificate(problem, X, y, model.coef_, model.intercept_)
    theirs = certificate(problem, X, y, reference.coef_, reference.intercept_)
    assert model.dual_gap_[0] <= TOL and 0.0 <= ours.gap
    assert abs(ours.primal - theirs.primal) <= 1e-7 * theirs.primal
    np.testing.assert_allclose(model.predict_proba(X), reference.predict_proba(X), atol=1e-6)


def test_the_certificate_from_the_gradient_is_valid_away_from_the_optimum(iris):
    """At any (W, b) the mixed dual point is feasible: D ≤ P* ≤ P, for any penalty, and the
    gap's split over coefficients plus the intercept's remainder adds up."""
    X, y = iris
    rng = np.random.default_rng(0)
    for l1_ratio in (0.0, 0.5, 1.0):
        problem = _problem(0.02, l1_ratio)
        optimum = certificate(
            problem,
            X,
            y,
            *_coef(
                LogisticRegression(
                    alpha=0.02, tol=1e-12, penalty=_penalty(l1_ratio), l1_ratio=l1_ratio
                ).fit(X, y)
            ),
        )
        for _ in range(5):
            coef = rng.normal(size=(3, 4))
            intercept = rng.normal(size=3)
            cert = certificate(problem, X, y, coef, intercept)
            assert cert.dual <= optimum.primal + 1e-12
            assert cert.primal >= optimum.primal
            assert cert.coordinate_gaps.min() >= -1e-12
            assert cert.coordinate_gaps.sum() + cert.intercept_gap == pytest.approx(cert.gap)


def _coef(model):
    return model.coef_, model.intercept_


def _penalty(l1_ratio):
    return {0.0: "l2", 1.0: "l1"}.get(l1_ratio, "elasticnet")


def test_functional_api_and_sparse_input(digits):
    X, y = digits
    X = np.where(np.abs(X) < 0.5, 0.0, X)  # about half zeros
    result = dask_scd.fit(X, y, loss="multinomial", alpha=1e-3, tol=TOL)
    assert result.coef_.shape == (10, 64) and result.intercept_.shape == (10,)
    np.testing.assert_array_equal(result.classes_, np.arange(10))
    scores = result.decision_function(X)
    assert scores.shape == (len(y), 10)
    np.testing.assert_array_equal(result.predict(X), np.argmax(scores, axis=1))
    sparse = dask_scd.fit(sp.csr_matrix(X), y, loss="multinomial", alpha=1e-3, tol=TOL)
    assert sparse.dual_gap_ <= TOL
    # both within TOL of the optimum: strong convexity bounds ‖W − W*‖² ≤ 2·gap·P/α
    bound = np.sqrt(2 * 2 * TOL * result.primal_ / 1e-3)
    np.testing.assert_allclose(sparse.coef_, result.coef_, atol=bound)


def test_string_labels_and_dask_input(iris):
    X, y = iris
    labels = np.array(["setosa", "versicolor", "virginica"])[y]
    model = LogisticRegression(alpha=0.01, tol=TOL).fit(X, labels)
    np.testing.assert_array_equal(model.classes_, labels[[0, 50, 100]])
    dX, dy = da.from_array(X, chunks=(50, 2)), da.from_array(labels, chunks=50)
    lazy = LogisticRegression(alpha=0.01, tol=TOL).fit(dX, dy)
    assert lazy.multi_class_ == "multinomial"
    np.testing.assert_allclose(lazy.coef_, model.coef_, atol=1e-6)
    proba = lazy.predict_proba(dX)
    assert isinstance(proba, da.Array)
    np.testing.assert_allclose(proba.compute(), model.predict_proba(X), atol=1e-8)
    np.testing.assert_array_equal(lazy.predict(dX).compute(), model.predict(X))


@pytest.mark.parametrize("curvature", [True, False])
def test_dask_engine_reaches_the_in_memory_model(iris, curvature, monkeypatch):
    """Above in_memory_limit: Newton steps over row-chunk reductions (the Hessian formed,
    or conjugate gradients on its products), the same model to the certified gap."""
    from dask_scd.engines.newton import multinomial_dask

    if not curvature:
        monkeypatch.setattr(multinomial_dask, "MAX_CURVATURE", 1)
    X, y = iris
    expected = dask_scd.fit(X, y, loss="multinomial", alpha=0.01, tol=1e-12)
    dX, dy = da.from_array(X, chunks=(40, 2)), da.from_array(y, chunks=40)
    result = dask_scd.fit(dX, dy, loss="multinomial", alpha=0.01, tol=TOL, in_memory_limit=0)
    assert result.solver_ == "block_newton" and result.dual_gap_ <= TOL
    assert min(result.extras_["primal_minus_dual"]) >= 0.0
    assert ("solve:cholesky" in result.extras_["passes"]) == curvature
    # strong convexity in W: ‖W − W*‖² ≤ 2·gap·P/α for each
    bound = np.sqrt(2 * TOL * result.primal_ / 0.01) + np.sqrt(2e-12 * expected.primal_ / 0.01)
    np.testing.assert_allclose(result.coef_, expected.coef_, atol=bound)
    np.testing.assert_allclose(result.predict(dX).compute(), expected.predict(X))


def test_dask_input_above_the_memory_limit_with_l1_names_one_vs_rest(iris):
    X, y = iris
    dX, dy = da.from_array(X, chunks=(50, 4)), da.from_array(y, chunks=50)
    with pytest.raises(ValueError, match="multi_class='ovr'"):
        dask_scd.fit(dX, dy, loss="multinomial", penalty="l1", in_memory_limit=100)
    with pytest.raises(ValueError, match="solves loss in"):
        dask_scd.fit(X, y, loss="multinomial", solver="sdca")


def test_multi_class_choices(iris):
    X, y = iris
    with pytest.raises(ValueError, match="multi_class='both' is not one of"):
        LogisticRegression(multi_class="both").fit(X, y)
    ovr = LogisticRegression(alpha=0.01, tol=TOL, multi_class="ovr").fit(X, y)
    assert ovr.multi_class_ == "ovr" and ovr.dual_gap_.shape == (3,)
    for k in range(3):  # each row the binary model of its class against the rest
        binary = dask_scd.fit(X, np.where(y == k, 1, -1), loss="logistic", alpha=0.01, tol=TOL)
        np.testing.assert_allclose(ovr.coef_[k], binary.coef_, atol=np.sqrt(4 * TOL / 0.01))
    # an engine of binary problems named: "auto" stays one-vs-rest
    assert LogisticRegression(alpha=0.01, solver="sdca").fit(X, y).multi_class_ == "ovr"


def test_two_classes_are_unchanged_and_multinomial_of_two_is_half_the_penalty(iris):
    X, y = iris
    keep = y > 0
    X, y = X[keep], y[keep]
    model = LogisticRegression(alpha=0.01, tol=TOL).fit(X, y)
    direct = dask_scd.fit(X, y, loss="logistic", alpha=0.01, tol=TOL)
    assert model.multi_class_ == "ovr" and model.coef_.shape == (1, 4)
    np.testing.assert_array_equal(model.coef_[0], direct.coef_)
    assert model.intercept_[0] == direct.intercept_
    # softmax of two: θ = θ_1 − θ_0 with ½α(‖θ_0‖² + ‖θ_1‖²) = ¼α‖θ‖² at θ_0 = −θ_1,
    # i.e. the binary model of alpha/2
    two = LogisticRegression(alpha=0.01, tol=TOL, multi_class="multinomial").fit(X, y)
    half = dask_scd.fit(X, y, loss="logistic", alpha=0.005, tol=TOL)
    assert two.multi_class_ == "multinomial" and two.coef_.shape == (1, 4)
    np.testing.assert_allclose(two.coef_[0], half.coef_, atol=1e-4)
    np.testing.assert_allclose(
        two.predict_proba(X)[:, 1],
        softmax(np.column_stack([np.zeros(len(y)), X @ half.coef_ + half.intercept_]), axis=1)[
            :, 1
        ],
        atol=1e-5,
    )


def test_without_penalty_stops_on_the_gradient():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 5))
    y = np.argmax(X[:, :3] + rng.normal(size=(300, 3)), axis=1)  # overlapping classes
    model = LogisticRegression(penalty=None, tol=1e-9).fit(X, y)
    assert model.multi_class_ == "multinomial" and model.grad_norm_[0] <= 1e-9
    assert np.isnan(model.dual_gap_[0])
    reference = linear_model.LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(X, y)
    np.testing.assert_allclose(model.predict_proba(X), reference.predict_proba(X), atol=1e-5)


def test_max_iter_warns_with_the_gap(digits):
    X, y = digits
    with pytest.warns(ConvergenceWarning, match="relative duality gap"):
        model = LogisticRegression(alpha=1e-4, tol=1e-12, max_iter=2).fit(X, y)
    assert model.n_iter_[0] == 2 and model.dual_gap_[0] > 1e-12
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LogisticRegression(alpha=1e-2, tol=1e-8).fit(X, y)
