"""Sample and class weights on the multinomial (softmax) loss: integer weights are
repeated rows, scikit-learn's weighted multinomial model is ours, the weighted entropy
dual certifies the gap, in memory and over Dask."""

import warnings

import dask.array as da
import numpy as np
import pytest
from sklearn import linear_model
from sklearn.datasets import load_digits, load_iris
from sklearn.preprocessing import StandardScaler

import dask_scd
from dask_scd import LogisticRegression
from dask_scd.objectives import Problem
from dask_scd.objectives.multinomial import certificate

TOL = 1e-10


@pytest.fixture(autouse=True)
def one_blas_thread():
    """Small products: BLAS threads waking on a busy machine cost more than the work."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _problem(alpha, l1_ratio=0.0, fit_intercept=True):
    return Problem(loss="multinomial", alpha=alpha, l1_ratio=l1_ratio, fit_intercept=fit_intercept)


def _load(name):
    X, y = (load_iris if name == "iris" else load_digits)(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def _integer_weights(n, seed=0):
    """0 to 3 copies of each row (a weight of 0 drops the row)."""
    return np.random.default_rng(seed).integers(0, 4, n).astype(np.float64)


def _certified(model, X, y, alpha, weights, l1_ratio=0.0, tol=TOL):
    """The fit's gap ≤ tol and ≥ 0 at every step; an independent weighted certificate of
    the returned model says the same. Returns that certificate."""
    assert model.multi_class_ == "multinomial" and model.solver_ == "newton"
    assert model.dual_gap_[0] <= tol
    assert all(0.0 <= g for g in model.history_.relative_gap)
    codes = np.searchsorted(model.classes_, y)
    cert = certificate(
        _problem(alpha, l1_ratio), X, codes, model.coef_, model.intercept_, sample_weight=weights
    )
    assert 0.0 <= cert.gap <= tol * abs(cert.primal)
    assert cert.primal == pytest.approx(model.history_.primal[-1], rel=1e-12)
    return cert


@pytest.mark.parametrize(
    "dataset, C, l1_ratio",
    [
        ("iris", 1.0, 0.0),
        ("digits", 0.1, 0.0),
        ("iris", 1.0, 1.0),
        ("digits", 0.1, 0.5),
    ],
)
def test_integer_weights_are_repeated_rows(dataset, C, l1_ratio):
    X, y = _load(dataset)
    w = _integer_weights(len(y))
    rows = np.repeat(np.arange(len(y)), w.astype(int))
    penalty = {0.0: "l2", 1.0: "l1"}.get(l1_ratio, "elasticnet")
    options = dict(C=C, penalty=penalty, l1_ratio=l1_ratio, tol=TOL)
    weighted = LogisticRegression(**options).fit(X, y, sample_weight=w)
    repeated = LogisticRegression(**options).fit(X[rows], y[rows])
    alpha = 1.0 / (C * w.sum())  # C·Σw: the repeated rows' C·n
    ours = _certified(weighted, X, y, alpha, w, l1_ratio)
    theirs = certificate(
        _problem(alpha, l1_ratio), X[rows], y[rows], repeated.coef_, repeated.intercept_
    )
    assert abs(ours.primal - theirs.primal) <= 1e-8 * theirs.primal
    # the same model: each certificate bounds the other's objective
    assert ours.dual <= theirs.primal and theirs.dual <= ours.primal


def test_zero_weights_drop_rows_and_equal_weights_change_nothing():
    X, y = _load("iris")
    w = np.where(np.arange(len(y)) % 5 == 0, 0.0, 1.0)
    kept = w > 0
    dropped = dask_scd.fit(X, y, loss="multinomial", alpha=0.01, tol=1e-12, sample_weight=w)
    subset = dask_scd.fit(X[kept], y[kept], loss="multinomial", alpha=0.01, tol=1e-12)
    assert dropped.primal_ == pytest.approx(subset.primal_, rel=1e-12)
    np.testing.assert_allclose(dropped.coef_, subset.coef_, atol=1e-6)
    equal = dask_scd.fit(
        X, y, loss="multinomial", alpha=0.01, tol=TOL, sample_weight=np.full(len(y), 2.5)
    )
    plain = dask_scd.fit(X, y, loss="multinomial", alpha=0.01, tol=TOL)
    np.testing.assert_array_equal(equal.coef_, plain.coef_)


@pytest.mark.parametrize("dataset, C", [("iris", 1.0), ("digits", 0.1)])
def test_sample_weight_matches_sklearn_lbfgs(dataset, C):
    X, y = _load(dataset)
    w = np.random.default_rng(1).uniform(0.0, 3.0, len(y))
    model = LogisticRegression(C=C, tol=TOL).fit(X, y, sample_weight=w)
    reference = linear_model.LogisticRegression(C=C, tol=1e-12, max_iter=10_000).fit(
        X, y, sample_weight=w
    )
    alpha = 1.0 / (C * w.sum())
    ours = _certified(model, X, y, alpha, w)
    theirs = certificate(
        _problem(alpha), X, y, reference.coef_, reference.intercept_, sample_weight=w
    )
    assert abs(ours.primal - theirs.primal) <= 1e-7 * theirs.primal
    assert ours.dual <= theirs.primal  # weak duality bounds scikit-learn's objective too
    np.testing.assert_allclose(model.predict_proba(X), reference.predict_proba(X), atol=1e-6)


@pytest.mark.parametrize("dataset, C", [("iris", 1.0), ("digits", 0.1)])
def test_balanced_class_weight_matches_sklearn_lbfgs(dataset, C):
    X, y = _load(dataset)
    keep = np.random.default_rng(2).uniform(size=len(y)) < np.where(y == 0, 0.3, 1.0)
    X, y = X[keep], y[keep]  # class 0 kept at about a third: the weights differ
    model = LogisticRegression(C=C, tol=TOL, class_weight="balanced").fit(X, y)
    reference = linear_model.LogisticRegression(
        C=C, tol=1e-12, max_iter=10_000, class_weight="balanced"
    ).fit(X, y)
    counts = np.bincount(y)
    w = (len(y) / (len(counts) * counts))[y]  # scikit-learn's "balanced"
    alpha = 1.0 / (C * w.sum())
    ours = _certified(model, X, y, alpha, w)
    theirs = certificate(
        _problem(alpha), X, y, reference.coef_, reference.intercept_, sample_weight=w
    )
    assert abs(ours.primal - theirs.primal) <= 1e-7 * theirs.primal
    np.testing.assert_allclose(model.predict_proba(X), reference.predict_proba(X), atol=1e-6)


def test_class_weight_dict_is_sample_weight():
    X, y = _load("iris")
    by_class = LogisticRegression(alpha=0.01, tol=TOL, class_weight={0: 3.0, 2: 0.5}).fit(X, y)
    by_rows = LogisticRegression(alpha=0.01, tol=TOL).fit(
        X, y, sample_weight=np.array([3.0, 1.0, 0.5])[y]
    )
    assert by_class.multi_class_ == by_rows.multi_class_ == "multinomial"
    np.testing.assert_array_equal(by_class.coef_, by_rows.coef_)


def test_the_weighted_certificate_is_valid_away_from_the_optimum():
    """At any (W, b) the weighted mixed dual point is feasible: D ≤ P* ≤ P."""
    X, y = _load("iris")
    w = _integer_weights(len(y), seed=3)
    rng = np.random.default_rng(0)
    for l1_ratio in (0.0, 0.5, 1.0):
        problem = _problem(0.02, l1_ratio)
        result = dask_scd.fit(
            X,
            y,
            loss="multinomial",
            alpha=0.02,
            l1_ratio=l1_ratio,
            penalty="l2" if l1_ratio == 0.0 else "elasticnet",
            tol=1e-13,
            sample_weight=w,
        )
        best = result.primal_
        for scale in (0.0, 0.3, 3.0):
            coef = scale * rng.standard_normal((3, X.shape[1]))
            intercept = rng.standard_normal(3)
            cert = certificate(problem, X, y, coef, intercept, sample_weight=w)
            assert cert.dual <= best * (1 + 1e-12) <= cert.primal * (1 + 1e-12)


@pytest.mark.parametrize("curvature", [True, False])
def test_dask_engine_takes_weights(curvature, monkeypatch):
    """Above in_memory_limit the row tasks weight every sum: the in-memory model to the
    certified gap (the Hessian formed, or conjugate gradients on its products)."""
    from dask_scd.engines.newton import multinomial_dask

    if not curvature:
        monkeypatch.setattr(multinomial_dask, "MAX_CURVATURE", 1)
    X, y = _load("iris")
    w = _integer_weights(len(y))
    expected = dask_scd.fit(X, y, loss="multinomial", alpha=0.01, tol=1e-12, sample_weight=w)
    dX, dy = da.from_array(X, chunks=(40, 2)), da.from_array(y, chunks=40)
    result = dask_scd.fit(
        dX,
        dy,
        loss="multinomial",
        alpha=0.01,
        tol=TOL,
        in_memory_limit=0,
        sample_weight=da.from_array(w, chunks=40),
    )
    assert result.solver_ == "block_newton" and result.dual_gap_ <= TOL
    assert min(result.extras_["primal_minus_dual"]) >= 0.0
    assert result.primal_ == pytest.approx(expected.primal_, rel=1e-9)
    # strong convexity in W: ‖W − W*‖² ≤ 2·gap·P/α for each
    bound = np.sqrt(2 * TOL * result.primal_ / 0.01) + np.sqrt(2e-12 * expected.primal_ / 0.01)
    np.testing.assert_allclose(result.coef_, expected.coef_, atol=bound)


def test_weighted_fits_are_multinomial_and_ovr_stays_ovr():
    X, y = _load("iris")
    w = np.arange(len(y)) % 3 + 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        auto = LogisticRegression(alpha=0.01, tol=TOL).fit(X, y, sample_weight=w)
        asked = LogisticRegression(alpha=0.01, tol=TOL, multi_class="multinomial").fit(
            X, y, sample_weight=w
        )
        balanced = LogisticRegression(alpha=0.01, tol=TOL, class_weight="balanced").fit(X, y)
    assert auto.multi_class_ == asked.multi_class_ == balanced.multi_class_ == "multinomial"
    np.testing.assert_array_equal(auto.coef_, asked.coef_)
    fit = dask_scd.fit(X, y, loss="multinomial", alpha=0.01, tol=TOL, sample_weight=w)
    np.testing.assert_array_equal(auto.coef_, fit.coef_)
    ovr = LogisticRegression(alpha=0.01, tol=TOL, multi_class="ovr").fit(X, y, sample_weight=w)
    assert ovr.multi_class_ == "ovr" and ovr.dual_gap_.shape == (3,)
    binary = dask_scd.fit(
        X, np.where(y == 0, 1, -1), loss="logistic", alpha=0.01, tol=TOL, sample_weight=w
    )
    np.testing.assert_allclose(ovr.coef_[0], binary.coef_, atol=1e-8)


def test_a_class_without_weight_is_refused_with_an_intercept():
    X, y = _load("iris")
    w = np.where(y == 2, 0.0, 1.0)
    with pytest.raises(ValueError, match="total weight of 0"):
        dask_scd.fit(X, y, loss="multinomial", alpha=0.01, sample_weight=w)
    result = dask_scd.fit(
        X, y, loss="multinomial", alpha=0.01, tol=TOL, sample_weight=w, fit_intercept=False
    )
    assert result.dual_gap_ <= TOL


def test_sklearn_weight_equivalence_checks():
    """scikit-learn's own checks (repeated rows against integer weights) on the
    multinomial model that a weighted fit of its three classes now is."""
    from sklearn.utils.estimator_checks import (
        check_sample_weight_equivalence_on_dense_data,
        check_sample_weight_equivalence_on_sparse_data,
    )

    estimator = LogisticRegression(tol=1e-12)
    check_sample_weight_equivalence_on_dense_data("LogisticRegression", estimator)
    check_sample_weight_equivalence_on_sparse_data("LogisticRegression", estimator)
