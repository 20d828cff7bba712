"""Coefficient bounds: ``lower_bounds`` / ``upper_bounds`` on fit and path, ``positive=True``
on the estimators, the box's conjugate in the certificate, and the engines that take them
(the conformance matrix fits every declared engine × loss with a box; these are the
scikit-learn comparisons, the certificate's honesty, the refusals and the cluster)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from box_reference import bounded_optimum
from sklearn import linear_model
from sklearn.datasets import load_diabetes

import dask_scd
from dask_scd import objectives as obj
from dask_scd.objectives import bounds as box

X_DIABETES, Y_DIABETES = load_diabetes(return_X_y=True)


def _least_squares(X, y, coef, intercept, alpha, l1_ratio):
    residual = y - X @ coef - intercept
    penalty = l1_ratio * np.abs(coef).sum() + (1 - l1_ratio) / 2 * coef @ coef
    return residual @ residual / (2 * len(y)) + alpha * penalty


@pytest.mark.parametrize(
    "ours, theirs, alpha, l1_ratio",
    [
        (
            dask_scd.Lasso(alpha=0.05, positive=True, tol=1e-14, random_state=0),
            linear_model.Lasso(alpha=0.05, positive=True, tol=1e-14, max_iter=10**6),
            0.05,
            1.0,
        ),
        (
            dask_scd.ElasticNet(alpha=0.01, l1_ratio=0.3, positive=True, tol=1e-14, random_state=0),
            linear_model.ElasticNet(
                alpha=0.01, l1_ratio=0.3, positive=True, tol=1e-14, max_iter=10**6
            ),
            0.01,
            0.3,
        ),
        (  # scikit-learn's Ridge(alpha=a) is alpha = a/n here; positive runs its lbfgs
            dask_scd.Ridge(alpha=1.0 / len(Y_DIABETES), positive=True, tol=1e-12, random_state=0),
            linear_model.Ridge(alpha=1.0, positive=True, solver="lbfgs", tol=1e-14, max_iter=10**6),
            1.0 / len(Y_DIABETES),
            0.0,
        ),
    ],
    ids=["lasso", "elasticnet", "ridge"],
)
def test_positive_matches_scikit_learn(ours, theirs, alpha, l1_ratio):
    X, y = X_DIABETES, Y_DIABETES
    ours.fit(X, y)
    theirs.fit(X, y)
    assert ours.get_params()["positive"] is True
    assert ours.dual_gap_ <= ours.tol
    assert np.all(ours.coef_ >= 0.0)
    mine = _least_squares(X, y, ours.coef_, ours.intercept_, alpha, l1_ratio)
    best = _least_squares(X, y, theirs.coef_, theirs.intercept_, alpha, l1_ratio)
    assert (mine - best) / best <= 1e-7
    if l1_ratio > 0:  # strongly determined by the L1 term: the coefficients agree too
        scale = np.abs(theirs.coef_).max()
        np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=0, atol=1e-7 * scale)


def _logistic_data():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 8))
    y = np.where(X @ rng.normal(size=8) + rng.logistic(size=200) > 0, 1.0, -1.0)
    lower = np.array([0.0, 0.0, -np.inf, -0.2, 0.1, -1.0, -np.inf, -0.05])
    upper = np.array([np.inf, 0.3, 0.0, 0.2, np.inf, -0.1, np.inf, 0.05])
    return X, y, lower, upper


@pytest.mark.parametrize("penalty, l1_ratio", [("l2", 0.0), ("l1", 1.0), ("elasticnet", 0.5)])
@pytest.mark.parametrize("solver", ["scd", "block_scd", "auto"])
def test_logistic_bounds_match_l_bfgs_b(penalty, l1_ratio, solver):
    """The optimum of scipy's L-BFGS-B on the same objective and box; the gap certifies
    it (P − P* ≤ gap) and is below tol; the model lies in the box."""
    X, y, lower, upper = _logistic_data()
    alpha = 0.02
    result = dask_scd.fit(
        X,
        y,
        loss="logistic",
        penalty=penalty,
        alpha=alpha,
        l1_ratio=l1_ratio,
        lower_bounds=lower,
        upper_bounds=upper,
        solver=solver,
        tol=1e-10,
        max_iter=10_000,
        random_state=0,
    )
    if solver == "auto":
        assert result.solver_ in ("scd", "block_scd")
    coef, _, best = bounded_optimum(X, y, "logistic", alpha, l1_ratio, True, lower, upper)
    assert np.all((lower <= result.coef_) & (result.coef_ <= upper))
    assert result.dual_gap_ <= 1e-10
    assert result.primal_ - best <= result.dual_gap_ * result.primal_ + 1e-12  # honest
    assert result.primal_ - best >= -1e-10 * best  # the reference is the optimum
    np.testing.assert_allclose(result.coef_, coef, atol=1e-5)
    assert np.any(result.coef_ == upper) and np.any(result.coef_ == lower)  # active sides


@pytest.mark.parametrize("max_iter", [1, 2, 4])
def test_gap_bounds_the_suboptimality_before_convergence(max_iter):
    """An early certificate of a box is honest: P − P* ≤ gap, with its coordinate gaps
    non-negative and adding up to it."""
    X, y, lower, upper = _logistic_data()
    problem = obj.Problem("logistic", 0.02, 1.0, True, obj.Bounds(lower, upper))
    _, _, best = bounded_optimum(X, y, "logistic", 0.02, 1.0, True, lower, upper)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = dask_scd.fit(
            X,
            y,
            loss="logistic",
            penalty="l1",
            alpha=0.02,
            lower_bounds=lower,
            upper_bounds=upper,
            solver="scd",
            max_iter=max_iter,
            random_state=0,
        )
    cert = obj.certificate(problem, X, y, result.coef_, result.intercept_)
    assert cert.primal - best <= cert.gap + 1e-12
    assert np.all(cert.coordinate_gaps >= -1e-12)
    assert cert.coordinate_gaps.sum() + cert.intercept_gap == pytest.approx(cert.gap, abs=1e-12)


@pytest.mark.parametrize("l2", [0.0, 0.3])
def test_box_conjugate_is_the_supremum(l2):
    """g*(s) = sup over the box of s·t − g(t), against a fine grid of t (ρ = 1: the box
    cut at B), at the clip of the unconstrained maximizer."""
    rng = np.random.default_rng(0)
    lower = np.array([0.0, -np.inf, -0.5, 0.2, -2.0, -np.inf])
    upper = np.array([np.inf, 0.0, 0.5, 1.0, -0.3, np.inf])
    bounds, bound = obj.Bounds(lower, upper), 3.0
    s = rng.normal(scale=2.0, size=(50, len(lower)))
    got = box.conjugate(0.7, l2, bounds, s, bound)
    reach = bound if l2 == 0.0 else 50.0  # B cuts the box where ρ = 1 only
    t = np.linspace(-reach, reach, 200_001)
    for j in range(len(lower)):
        ends = np.clip([lower[j], upper[j]], -reach, reach)  # the grid holds the ends
        inside = np.concatenate([t[(t >= lower[j]) & (t <= upper[j])], ends])
        values = s[:, j, None] * inside - 0.7 * np.abs(inside) - 0.5 * l2 * inside**2
        np.testing.assert_allclose(got[:, j], values.max(axis=1), atol=1e-3)
    # Fenchel–Young: g(θ) + g*(s) − sθ ≥ 0 for θ in the box
    theta = bounds.clip(rng.normal(size=len(lower)))
    gaps = box.penalty_terms(0.7, l2, bounds, theta) + got - s * theta
    assert np.all(gaps >= -1e-12)


def test_open_box_is_the_unbounded_fit():
    """Bounds open on every side are no bounds: the same model, bit for bit."""
    X, y, _, _ = _logistic_data()
    args = dict(loss="logistic", penalty="elasticnet", alpha=0.02, solver="scd", random_state=0)
    plain = dask_scd.fit(X, y, **args)
    open_box = dask_scd.fit(X, y, lower_bounds=-np.inf, upper_bounds=np.inf, **args)
    np.testing.assert_array_equal(plain.coef_, open_box.coef_)
    assert plain.intercept_ == open_box.intercept_


def test_a_warm_start_outside_the_box_is_clipped():
    X, y, lower, upper = _logistic_data()
    result = dask_scd.fit(
        X,
        y,
        loss="logistic",
        alpha=0.02,
        lower_bounds=lower,
        upper_bounds=upper,
        coef_init=np.full(X.shape[1], 5.0),
        solver="scd",
        tol=1e-10,
    )
    assert np.all((lower <= result.coef_) & (result.coef_ <= upper))
    assert result.dual_gap_ <= 1e-10


@pytest.mark.parametrize(
    "lower, upper, message",
    [
        ([0, 0, 2, 0, 0, 0, 0, 0], 1.0, r"at feature 2, lower_bounds\[2\] = 2.0 > upper_bounds"),
        ([0.0, 1.0], None, r"lower_bounds has shape \(2,\), expected"),
        (np.nan, None, "lower_bounds contains NaN"),
        (np.inf, None, "lower_bounds cannot be \\+inf"),
        ("a", None, "lower_bounds must be a number or an array"),
    ],
)
def test_bad_bounds_are_refused(lower, upper, message):
    X, y, _, _ = _logistic_data()
    with pytest.raises(ValueError, match=message):
        dask_scd.fit(X, y, loss="logistic", lower_bounds=lower, upper_bounds=upper)


@pytest.mark.parametrize("solver", ["newton", "sdca", "gram", "lbfgs", "duhl", "cocoa"])
def test_engines_without_bounds_refuse_them_naming_those_with(solver):
    X, y, _, _ = _logistic_data()
    loss = "squared" if solver == "gram" else "logistic"
    with pytest.raises(ValueError) as raised:
        dask_scd.fit(X, y, loss=loss, lower_bounds=0.0, solver=solver)
    message = str(raised.value)
    assert "coefficient bounds" in message
    assert "'scd'" in message and "'block_scd'" in message


def test_bounds_without_an_engine_are_refused():
    X, y, _, _ = _logistic_data()
    with pytest.raises(ValueError, match="no engine solves it"):
        dask_scd.fit(X, y, loss="hinge", lower_bounds=0.0)
    with pytest.raises(ValueError, match="no engine solves it"):
        dask_scd.fit(X, y, loss="logistic", penalty=None, lower_bounds=0.0)


def test_positive_and_lower_bounds_together_are_refused():
    with pytest.raises(ValueError, match="give positive or lower_bounds"):
        dask_scd.Lasso(positive=True, lower_bounds=-1.0).fit(X_DIABETES, Y_DIABETES)


def test_estimator_bounds_per_feature():
    lower = np.full(X_DIABETES.shape[1], -50.0)
    upper = np.full(X_DIABETES.shape[1], 200.0)
    model = dask_scd.ElasticNet(
        alpha=1e-3, lower_bounds=lower, upper_bounds=upper, tol=1e-10, max_iter=10_000
    )
    model.fit(X_DIABETES, Y_DIABETES)
    assert model.dual_gap_ <= 1e-10
    assert np.all((lower <= model.coef_) & (model.coef_ <= upper))
    assert np.any(model.coef_ == upper) and np.any(model.coef_ == lower)


def test_cross_validated_positive_models():
    """LassoCV, ElasticNetCV and RidgeCV: every fold's path and the refit in the box."""
    X, y = X_DIABETES, Y_DIABETES
    for model in (
        dask_scd.LassoCV(positive=True, cv=3, n_alphas=8, tol=1e-8),
        dask_scd.ElasticNetCV(positive=True, cv=3, n_alphas=8, tol=1e-8),
        dask_scd.RidgeCV(positive=True, cv=3, tol=1e-8),
    ):
        model.fit(X, y)
        assert np.all(model.coef_ >= 0.0)
        assert model.dual_gap_ <= 1e-8
        if hasattr(model, "coefs_paths_"):
            assert np.all(model.coefs_paths_ >= 0.0)


def test_a_path_stays_in_the_box():
    lower, upper = 0.0, 60.0
    result = dask_scd.path(
        X_DIABETES, Y_DIABETES, n_alphas=6, lower_bounds=lower, upper_bounds=upper, tol=1e-9
    )
    assert np.all((lower <= result.coefs) & (result.coefs <= upper))
    assert np.all(result.dual_gaps <= 1e-9)


def test_a_bounded_grid_on_two_workers_is_the_in_memory_fit(client, tmp_path):
    """Block SCD on a grid on a cluster of 2 workers reaches the in-memory bounded
    model: the clipped block steps, with the coarse step off, solve the same box."""
    X, y, lower, upper = _logistic_data()
    dask_scd.to_grid(X, y, tmp_path / "g", row_chunk=50, blocks=[[5, 0, 2], [3, 4, 1, 6, 7]])
    args = dict(
        loss="logistic",
        penalty="elasticnet",
        alpha=0.05,
        lower_bounds=lower,
        upper_bounds=upper,
        tol=1e-13,
        max_iter=2000,
        random_state=0,
    )
    memory = dask_scd.fit(X, y, solver="scd", **args)
    grid = dask_scd.fit(
        dask_scd.open_grid(tmp_path / "g"), solver="block_scd", client=client, **args
    )
    assert grid.solver_ == "block_scd"
    assert grid.dual_gap_ <= 1e-13
    np.testing.assert_allclose(grid.coef_, memory.coef_, rtol=0, atol=1e-7)
    assert grid.intercept_ == pytest.approx(memory.intercept_, abs=1e-6)
    assert grid.primal_ == pytest.approx(memory.primal_, rel=1e-12)


def test_the_estimators_page_example_runs():
    """The python blocks of docs/estimators.md's "Coefficient bounds" section (the page's
    other sections need classes and clusters; tests/test_docs_examples.py runs the user
    guide's)."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "estimators.md").read_text()
    section = page.split("## Coefficient bounds\n")[1].split("\n## ")[0]
    blocks = re.findall(r"^```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert blocks
    namespace = {"__name__": "docs"}
    for block in blocks:
        exec(compile(block, "docs/estimators.md", "exec"), namespace)


def test_logistic_regression_bounds_one_vs_rest():
    """LogisticRegression takes lower_bounds / upper_bounds; with three classes "auto" fits
    one-vs-rest models (the softmax model takes no bounds), each in the box."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(150, 4))
    labels = np.digitize(X @ rng.normal(size=4) + rng.logistic(size=150), [-1.0, 1.0])
    model = dask_scd.LogisticRegression(alpha=0.01, lower_bounds=-0.5, upper_bounds=0.5, tol=1e-9)
    model.fit(X, labels)
    assert model.multi_class_ == "ovr" and model.coef_.shape == (3, 4)
    assert np.all(np.abs(model.coef_) <= 0.5) and np.all(model.dual_gap_ <= 1e-9)
    assert np.any(np.abs(model.coef_) == 0.5)
