"""Regularization paths and the cross-validated estimators: the path against
scikit-learn's lasso_path / enet_path at every alpha, the exact alpha_max, warm starts,
gap-safe screening, the same alpha_ / C_ as scikit-learn's CV estimators on the same
folds and grid, the same path on a cluster as in this process, and the same CV choices
on a dask array or a grid as in memory."""

import warnings

import dask.array as da
import numpy as np
import pytest
from sklearn import linear_model
from sklearn.base import clone
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import KFold, StratifiedKFold
from sklearn.preprocessing import StandardScaler

import dask_scd
from dask_scd import ElasticNetCV, LassoCV, LogisticRegressionCV, RidgeCV
from dask_scd.objectives import Problem


@pytest.fixture(scope="module")
def diabetes():
    X, y = load_diabetes(return_X_y=True)
    return StandardScaler().fit_transform(X), y


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def objective(loss, alpha, l1_ratio, fit_intercept, X, y, coef, intercept):
    problem = Problem(loss=loss, alpha=alpha, l1_ratio=l1_ratio, fit_intercept=fit_intercept)
    return dask_scd.certificate(problem, X, y, np.ravel(coef), float(intercept)).primal


# ------------------------------------------------------------------------ path


@pytest.mark.parametrize("l1_ratio", [1.0, 0.5])
@pytest.mark.parametrize("fit_intercept", [False, True])
def test_path_matches_sklearn_at_every_alpha(diabetes, l1_ratio, fit_intercept):
    """scikit-learn's paths fit no intercept: with one, they run on centered data (the
    same objective)."""
    X, y = diabetes
    penalty = "l1" if l1_ratio == 1.0 else "elasticnet"
    ours = dask_scd.path(
        X,
        y,
        penalty=penalty,
        l1_ratio=l1_ratio,
        n_alphas=30,
        fit_intercept=fit_intercept,
        tol=1e-12,
        solver="newton",
    )
    Xs, ys = (X - X.mean(axis=0), y - y.mean()) if fit_intercept else (X, y)
    alphas, coefs, _ = linear_model.enet_path(
        Xs, ys, l1_ratio=l1_ratio, alphas=30, tol=1e-14, max_iter=100_000
    )
    np.testing.assert_allclose(ours.alphas, alphas, rtol=1e-12)
    assert ours.coefs.shape == (X.shape[1], 30)
    assert np.all(ours.dual_gaps <= 1e-12)
    for k, alpha in enumerate(ours.alphas):
        intercept = y.mean() - X.mean(axis=0) @ coefs[:, k] if fit_intercept else 0.0
        theirs = objective("squared", alpha, l1_ratio, fit_intercept, X, y, coefs[:, k], intercept)
        mine = objective(
            "squared", alpha, l1_ratio, fit_intercept, X, y, ours.coefs[:, k], ours.intercepts[k]
        )
        assert abs(mine - theirs) <= 1e-8 * abs(theirs), (k, mine, theirs)
        # diabetes' columns are correlated: the objective is flat in some directions,
        # where equal objectives still leave the coefficients ~1e-5 apart
        np.testing.assert_allclose(ours.coefs[:, k], coefs[:, k], atol=1e-3)


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_alpha_max_is_exact(diabetes, cancer, loss):
    X, y = diabetes if loss == "squared" else cancer
    result = dask_scd.path(X, y, loss=loss, penalty="l1", n_alphas=3, tol=1e-10)
    assert np.all(result.coefs[:, 0] == 0.0) and result.alphas[0] == result.alpha_max
    at_max = dask_scd.fit(X, y, loss=loss, penalty="l1", alpha=result.alpha_max, tol=1e-12)
    below = dask_scd.fit(
        X, y, loss=loss, penalty="l1", alpha=result.alpha_max * (1 - 1e-3), tol=1e-12
    )
    assert np.count_nonzero(at_max.coef_) == 0
    assert np.count_nonzero(below.coef_) >= 1
    # θ = 0 with the best intercept at alpha_max: certified optimal
    assert result.dual_gaps[0] <= 1e-12
    assert result.intercepts[0] == pytest.approx(at_max.intercept_, abs=1e-10)


def test_logistic_path_is_certified_and_screening_never_changes_it(cancer):
    X, y = cancer
    screened = dask_scd.path(
        X, y, loss="logistic", penalty="l1", n_alphas=15, eps=1e-2, tol=1e-10, random_state=0
    )
    plain = dask_scd.path(
        X,
        y,
        loss="logistic",
        penalty="l1",
        n_alphas=15,
        eps=1e-2,
        tol=1e-10,
        random_state=0,
        screening=False,
    )
    assert np.all(screened.dual_gaps <= 1e-10) and np.all(plain.dual_gaps <= 1e-10)
    assert screened.n_screened.sum() > 0
    np.testing.assert_allclose(screened.coefs, plain.coefs, atol=1e-4)
    for k, alpha in enumerate(screened.alphas):
        a = objective(
            "logistic",
            alpha,
            1.0,
            True,
            X,
            np.where(y == 1, 1.0, -1.0),
            screened.coefs[:, k],
            screened.intercepts[k],
        )
        b = objective(
            "logistic",
            alpha,
            1.0,
            True,
            X,
            np.where(y == 1, 1.0, -1.0),
            plain.coefs[:, k],
            plain.intercepts[k],
        )
        assert abs(a - b) <= 1e-9 * b
    # the support grows along the path
    assert np.count_nonzero(screened.coefs[:, -1]) > np.count_nonzero(screened.coefs[:, 1])


def test_given_alphas_are_sorted_and_checked(diabetes):
    X, y = diabetes
    result = dask_scd.path(X, y, alphas=[0.1, 10.0, 1.0], tol=1e-8)
    np.testing.assert_array_equal(result.alphas, [10.0, 1.0, 0.1])
    with pytest.raises(ValueError, match="alphas must be finite numbers > 0"):
        dask_scd.path(X, y, alphas=[1.0, -1.0])
    with pytest.raises(ValueError, match="eps"):
        dask_scd.path(X, y, eps=2.0)
    with pytest.raises(ValueError, match="needs a penalty"):
        dask_scd.path(X, y, penalty=None)


@pytest.mark.parametrize("solver", ["gram", "scd", "newton"])
def test_warm_start_gives_the_same_model_with_less_work(diabetes, solver):
    X, y = diabetes
    start = dask_scd.fit(X, y, penalty="l1", alpha=0.65, tol=1e-10, solver=solver, random_state=0)
    cold = dask_scd.fit(X, y, penalty="l1", alpha=0.5, tol=1e-10, solver=solver, random_state=0)
    warm = dask_scd.fit(
        X,
        y,
        penalty="l1",
        alpha=0.5,
        tol=1e-10,
        solver=solver,
        random_state=0,
        coef_init=start.coef_,
        intercept_init=start.intercept_,
    )
    assert warm.dual_gap_ <= 1e-10 and warm.n_iter_ <= cold.n_iter_
    assert abs(warm.primal_ - cold.primal_) <= 1e-9 * cold.primal_
    with pytest.raises(ValueError, match="coef_init has shape"):
        dask_scd.fit(X, y, penalty="l1", coef_init=np.zeros(3))


def test_path_under_a_local_cluster_equals_the_one_in_process(cancer):
    """A dask array's path runs each point as a block-engine fit on the cluster; it
    reaches the in-memory path's models (both certified to 1e-10)."""
    from distributed import Client, LocalCluster

    X, y = cancer
    X, y = X[:300, :10], y[:300]
    options = dict(loss="logistic", penalty="l1", n_alphas=3, eps=0.05, tol=1e-10, random_state=0)
    in_process = dask_scd.path(X, y, **options)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster),
    ):
        distributed = dask_scd.path(
            da.from_array(X, chunks=(150, 10)), y, solver="block_newton", **options
        )
    assert distributed.solvers[1:] == ["block_newton"] * 2
    assert distributed.alpha_max == pytest.approx(in_process.alpha_max, rel=1e-12)
    assert np.all(distributed.dual_gaps <= 1e-10)
    np.testing.assert_allclose(distributed.coefs, in_process.coefs, atol=1e-4)
    np.testing.assert_allclose(distributed.intercepts, in_process.intercepts, atol=1e-4)


# ---------------------------------------------------------------- CV estimators


def test_lasso_cv_picks_sklearns_alpha(diabetes):
    X, y = diabetes
    cv = KFold(5, shuffle=True, random_state=0)
    ours = LassoCV(cv=cv, n_alphas=40, tol=1e-10, solver="newton").fit(X, y)
    theirs = linear_model.LassoCV(cv=cv, alphas=40, tol=1e-12, max_iter=100_000).fit(X, y)
    np.testing.assert_allclose(ours.alphas_, theirs.alphas_, rtol=1e-12)
    np.testing.assert_allclose(ours.mse_path_, theirs.mse_path_, rtol=1e-7)
    assert ours.alpha_ == pytest.approx(theirs.alpha_, rel=1e-12)
    assert ours.coefs_paths_.shape == (5, 40, X.shape[1])
    np.testing.assert_allclose(ours.coef_, theirs.coef_, atol=1e-6)
    assert ours.dual_gap_ <= 1e-10


def test_elastic_net_cv_picks_sklearns_alpha_and_l1_ratio(diabetes):
    X, y = diabetes
    cv = KFold(4, shuffle=True, random_state=1)
    ratios = [0.1, 0.5, 0.9]
    ours = ElasticNetCV(l1_ratio=ratios, cv=cv, n_alphas=20, tol=1e-10, solver="newton").fit(X, y)
    theirs = linear_model.ElasticNetCV(
        l1_ratio=ratios, cv=cv, alphas=20, tol=1e-12, max_iter=100_000
    ).fit(X, y)
    assert ours.mse_path_.shape == (3, 20, 4) and ours.alphas_.shape == (3, 20)
    np.testing.assert_allclose(ours.mse_path_, theirs.mse_path_, rtol=1e-5)
    assert (ours.alpha_, ours.l1_ratio_) == (theirs.alpha_, theirs.l1_ratio_)


def test_ridge_cv_agrees_with_sklearn(diabetes):
    """scikit-learn's RidgeCV(alphas=a) fits each fold with alpha = a / n_train in
    Ridge's per-example terms: 440 rows in 5 folds train on 352 each."""
    X, y = diabetes
    X, y = X[:440], y[:440]
    cv = KFold(5, shuffle=True, random_state=0)
    grid = np.array([0.1, 1.0, 10.0, 30.0, 100.0, 300.0])
    theirs = linear_model.RidgeCV(alphas=grid, cv=cv).fit(X, y)
    ours = RidgeCV(alphas=grid / 352, cv=cv, tol=1e-12).fit(X, y)
    assert ours.alpha_ == pytest.approx(theirs.alpha_ / 352, rel=1e-12)
    assert ours.best_score_ == pytest.approx(theirs.best_score_, rel=1e-9)
    mse = RidgeCV(alphas=grid / 352, cv=cv, tol=1e-12, scoring="neg_mean_squared_error")
    reference = linear_model.RidgeCV(alphas=grid, cv=cv, scoring="neg_mean_squared_error")
    assert mse.fit(X, y).alpha_ * 352 == pytest.approx(reference.fit(X, y).alpha_)
    assert mse.scores_.shape == (5, 6)


@pytest.mark.parametrize("scoring", [None, "neg_log_loss"])
def test_logistic_regression_cv_picks_sklearns_C(cancer, scoring):
    X, y = cancer
    cv = StratifiedKFold(5, shuffle=True, random_state=0)
    Cs = np.logspace(-3, 2, 10)
    ours = LogisticRegressionCV(Cs=Cs, cv=cv, tol=1e-10, scoring=scoring).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        theirs = linear_model.LogisticRegressionCV(
            Cs=Cs,
            cv=cv,
            solver="newton-cholesky",
            tol=1e-10,
            max_iter=1000,
            scoring=scoring or "accuracy",
            l1_ratios=(0.0,),
            use_legacy_attributes=True,
        ).fit(X, y)
    np.testing.assert_allclose(ours.scores_[1], theirs.scores_[1][..., 0], atol=1e-5)
    np.testing.assert_array_equal(ours.C_, theirs.C_)
    assert ours.coefs_paths_[1].shape == (5, 10, X.shape[1] + 1)
    n = X.shape[0]
    mine = objective(
        "logistic",
        1 / (ours.C_[0] * n),
        0.0,
        True,
        X,
        np.where(y == 1, 1, -1),
        ours.coef_,
        ours.intercept_[0],
    )
    reference = objective(
        "logistic",
        1 / (ours.C_[0] * n),
        0.0,
        True,
        X,
        np.where(y == 1, 1, -1),
        theirs.coef_,
        theirs.intercept_[0],
    )
    assert abs(mine - reference) <= 1e-8 * reference


def test_cv_on_adult_picks_sklearns_choices():
    from conftest import shared_dataset

    X, y = shared_dataset("a8a")
    rows = np.random.default_rng(0).choice(X.shape[0], 2000, replace=False)
    X, y = X[np.sort(rows)], y[np.sort(rows)]
    cv = StratifiedKFold(3, shuffle=True, random_state=0)
    Cs = np.logspace(-2, 1, 5)
    ours = LogisticRegressionCV(Cs=Cs, cv=cv, tol=1e-10, scoring="neg_log_loss").fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        theirs = linear_model.LogisticRegressionCV(
            Cs=Cs,
            cv=cv,
            solver="newton-cholesky",
            tol=1e-10,
            max_iter=1000,
            scoring="neg_log_loss",
            l1_ratios=(0.0,),
            use_legacy_attributes=True,
        ).fit(X, y)
    np.testing.assert_allclose(ours.scores_[1.0], theirs.scores_[1.0][..., 0], atol=1e-6)
    np.testing.assert_array_equal(ours.C_, theirs.C_)
    folds = KFold(3, shuffle=True, random_state=0)
    lasso = LassoCV(cv=folds, n_alphas=10, tol=1e-10).fit(X, y)
    reference = linear_model.LassoCV(cv=folds, alphas=10, tol=1e-12, max_iter=100_000).fit(X, y)
    # one-hot columns leave flat directions at the smallest alphas: equal objectives,
    # held-out errors ~1e-5 apart there
    np.testing.assert_allclose(lasso.mse_path_, reference.mse_path_, rtol=1e-4)
    assert lasso.alpha_ == pytest.approx(reference.alpha_, rel=1e-12)  # the same grid point


def test_multiclass_logistic_cv_fits_one_model_per_class(cancer):
    X, y = cancer
    labels = np.where(X[:, 0] > 0.5, 2, y)  # three classes
    model = LogisticRegressionCV(Cs=[0.1, 1.0], cv=3, tol=1e-8).fit(X, labels)
    assert model.coef_.shape == (3, X.shape[1]) and model.C_.shape == (3,)
    assert set(model.scores_) == {0, 1, 2}
    assert model.score(X, labels) > 0.8
    # one-vs-rest probabilities: each class's sigmoid, normalized; their argmax predicts
    proba = model.predict_proba(X)
    sigmoids = 1.0 / (1.0 + np.exp(-model.decision_function(X)))
    np.testing.assert_allclose(proba, sigmoids / sigmoids.sum(axis=1, keepdims=True), rtol=1e-14)
    np.testing.assert_array_equal(model.classes_[proba.argmax(axis=1)], model.predict(X))
    np.testing.assert_allclose(model.predict_log_proba(X), np.log(proba), rtol=1e-14)


def test_binary_logistic_cv_probabilities_are_the_sigmoid(cancer):
    X, y = cancer
    model = LogisticRegressionCV(Cs=[0.1, 1.0], cv=3, tol=1e-8).fit(X, y)
    proba = model.predict_proba(X)
    expected = 1.0 / (1.0 + np.exp(-model.decision_function(X)))
    np.testing.assert_allclose(proba[:, 1], expected, rtol=1e-14)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-15)


def test_l1_and_elasticnet_logistic_cv(cancer):
    X, y = cancer
    l1 = LogisticRegressionCV(Cs=[0.01, 0.1, 1.0], penalty="l1", cv=3, tol=1e-8).fit(X, y)
    assert np.count_nonzero(l1.coef_) < X.shape[1]
    enet = LogisticRegressionCV(
        Cs=[0.01, 0.1, 1.0], penalty="elasticnet", l1_ratios=[0.2, 0.8], cv=3, tol=1e-8
    ).fit(X, y)
    assert enet.scores_[1].shape == (3, 3, 2)
    assert enet.l1_ratio_[0] in (0.2, 0.8)
    unrefit = LogisticRegressionCV(Cs=[0.01, 0.1, 1.0], cv=3, tol=1e-8, refit=False).fit(X, y)
    assert unrefit.coef_.shape == (1, X.shape[1])
    with pytest.raises(ValueError, match="needs l1_ratios"):
        LogisticRegressionCV(penalty="elasticnet").fit(X, y)


def test_cv_folds_are_tasks_on_the_current_client(diabetes):
    from distributed import Client, LocalCluster, get_task_stream

    X, y = diabetes
    cv = KFold(3, shuffle=True, random_state=0)
    here = LassoCV(cv=cv, n_alphas=10, tol=1e-10, random_state=0).fit(X, y)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        with get_task_stream(client) as stream:
            there = LassoCV(cv=cv, n_alphas=10, tol=1e-10, random_state=0).fit(X, y)
    assert len([t for t in stream.data if "_fold_task" in str(t["key"])]) == 3
    np.testing.assert_array_equal(there.mse_path_, here.mse_path_)
    assert there.alpha_ == here.alpha_


# ------------------------------------------------------- dask arrays and grids


def _same_choice(there, here, rtol=1e-6):
    assert there.alpha_ == pytest.approx(here.alpha_, rel=1e-12)
    np.testing.assert_allclose(there.alphas_, here.alphas_, rtol=1e-12)
    np.testing.assert_allclose(there.mse_path_, here.mse_path_, rtol=rtol)
    np.testing.assert_allclose(there.coef_, here.coef_, atol=1e-6)


def test_lasso_cv_on_a_dask_array_and_a_grid_is_the_one_in_memory(diabetes, tmp_path):
    """A fold of a dask array or a grid is the weighted path of all of X with weight 0 on
    the held-out rows, its points fitted in memory ("auto" below in_memory_limit) or on
    the cluster ("block_newton"): the same folds, grid, held-out errors and alpha_."""
    from distributed import Client, LocalCluster

    X, y = diabetes
    options = dict(cv=KFold(3, shuffle=True, random_state=0), n_alphas=6, eps=1e-2, tol=1e-10)
    here = LassoCV(**options).fit(X, y)
    X_dask = da.from_array(X, chunks=(150, 5))
    _same_choice(LassoCV(**options).fit(X_dask, da.from_array(y, chunks=150)), here)
    grid = dask_scd.to_grid(X, y, tmp_path / "g", row_chunk=150)
    _same_choice(LassoCV(**options).fit(grid), here)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster),
    ):
        for data in ((X_dask, y), (grid,)):
            on_cluster = LassoCV(solver="block_newton", **options).fit(*data)
            assert on_cluster.solver_ == "block_newton"
            _same_choice(on_cluster, here)
    # A scikit-learn scorer reads the held-out rows of the dask array lazily.
    ridge = dict(cv=options["cv"], scoring="neg_mean_squared_error", tol=1e-10)
    np.testing.assert_allclose(
        RidgeCV(**ridge).fit(X_dask, y).scores_, RidgeCV(**ridge).fit(X, y).scores_, rtol=1e-6
    )


def test_logistic_regression_cv_on_a_dask_array_is_the_one_in_memory(cancer, tmp_path):
    X, y = cancer
    X, y = X[:300, :10], y[:300]
    options = dict(Cs=6, tol=1e-10)
    here = LogisticRegressionCV(**options).fit(X, y)
    there = LogisticRegressionCV(**options).fit(
        da.from_array(X, chunks=(100, 10)), da.from_array(y, chunks=100)
    )
    np.testing.assert_array_equal(there.C_, here.C_)
    np.testing.assert_allclose(there.scores_[1], here.scores_[1], atol=1e-12)
    np.testing.assert_allclose(there.coefs_paths_[1], here.coefs_paths_[1], atol=1e-6)
    # The refits may be SDCA's: a gap of 1e-10 bounds |Δθ| by √(2·gap·P/α) ≈ 5e-5 here.
    np.testing.assert_allclose(there.coef_, here.coef_, atol=1e-4)
    # Three classes on a grid: one path per class against the rest, on its cells.
    labels = np.digitize(X[:, 0], [-0.5, 0.5]).astype(float)
    here = LogisticRegressionCV(Cs=4, tol=1e-10).fit(X, labels)
    grid = dask_scd.to_grid(X, labels, tmp_path / "g", row_chunk=100)
    there = LogisticRegressionCV(Cs=4, tol=1e-10).fit(grid)
    np.testing.assert_array_equal(there.C_, here.C_)
    for label in here.classes_:
        np.testing.assert_allclose(there.scores_[label], here.scores_[label], atol=1e-12)
    np.testing.assert_allclose(there.coef_, here.coef_, atol=1e-4)


def test_path_points_that_miss_tol_warn(diabetes):
    X, y = diabetes
    with pytest.warns(ConvergenceWarning, match="path points did not converge"):
        dask_scd.path(X, y, n_alphas=5, tol=1e-14, max_iter=1, solver="scd")


# ---------------------------------------------------------------- sample weights


def _repeated(X, y, counts, splits):
    """The rows repeated ``counts`` times (0: removed) and the folds on them: each
    (train, test) pair's rows mapped to their copies."""
    copies = np.split(np.arange(counts.sum()), np.cumsum(counts)[:-1])
    rows = np.repeat(np.arange(len(counts)), counts)
    mapped = [
        tuple(np.concatenate([copies[i] for i in part]).astype(np.intp) for part in (train, test))
        for train, test in splits
    ]
    return X[rows], y[rows], mapped


def test_lasso_cv_with_sample_weight_is_sklearns(diabetes):
    """scikit-learn's weighted LassoCV: the grid from the weighted alpha_max, each fold's
    path on its weighted training rows, mse_path_ the weighted held-out errors."""
    X, y = diabetes
    weights = np.random.default_rng(0).uniform(0.2, 3.0, len(y))
    cv = list(KFold(4, shuffle=True, random_state=0).split(X))
    ours = LassoCV(cv=cv, n_alphas=15, tol=1e-10, solver="newton").fit(X, y, weights)
    theirs = linear_model.LassoCV(cv=cv, alphas=15, tol=1e-12, max_iter=100_000)
    theirs.fit(X, y, sample_weight=weights)
    np.testing.assert_allclose(ours.alphas_, theirs.alphas_, rtol=1e-12)
    np.testing.assert_allclose(ours.mse_path_, theirs.mse_path_, rtol=1e-7)
    assert ours.alpha_ == pytest.approx(theirs.alpha_, rel=1e-12)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, atol=1e-6)
    unweighted = LassoCV(cv=cv, n_alphas=15, tol=1e-10, solver="newton").fit(X, y)
    assert not np.allclose(unweighted.mse_path_, ours.mse_path_)


def _sklearn_logistic_cv(X, y, weights, Cs, cv, **kwargs):
    """scikit-learn's weighted L2 LogisticRegressionCV at a tight tolerance (the reference)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return linear_model.LogisticRegressionCV(
            Cs=Cs,
            cv=cv,
            solver="newton-cholesky",
            tol=1e-10,
            max_iter=1000,
            l1_ratios=(0.0,),
            use_legacy_attributes=True,
            **kwargs,
        ).fit(X, y, sample_weight=weights)


@pytest.mark.parametrize("scoring", [None, "neg_log_loss"])
def test_logistic_regression_cv_with_sample_weight_is_sklearns(cancer, scoring):
    """C maps to alpha = 1/(C·Σw_train) on each fold (1/(C·Σw) for the refit), the
    held-out scores weighted: scikit-learn's weighted LogisticRegressionCV."""
    X, y = cancer
    weights = np.random.default_rng(0).uniform(0.2, 3.0, len(y))
    cv = list(StratifiedKFold(4, shuffle=True, random_state=0).split(X, y))
    Cs = np.logspace(-3, 2, 8)
    ours = LogisticRegressionCV(Cs=Cs, cv=cv, tol=1e-10, scoring=scoring)
    ours.fit(X, y, sample_weight=weights)
    theirs = _sklearn_logistic_cv(X, y, weights, Cs, cv, scoring=scoring or "accuracy")
    np.testing.assert_allclose(ours.scores_[1], theirs.scores_[1][..., 0], atol=1e-5)
    np.testing.assert_array_equal(ours.C_, theirs.C_)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, atol=1e-4)


@pytest.mark.parametrize("class_weight", ["balanced", {0: 3.0, 1: 0.5}])
def test_logistic_regression_cv_with_class_weight_is_sklearns(cancer, class_weight):
    """class_weight weighs the folds' paths and the refit, as LogisticRegression's does;
    the held-out scores keep sample_weight alone: scikit-learn's choice and model."""
    X, y = cancer
    weights = np.random.default_rng(1).uniform(0.2, 3.0, len(y))
    cv = list(StratifiedKFold(4, shuffle=True, random_state=0).split(X, y))
    Cs = np.logspace(-3, 2, 8)
    ours = LogisticRegressionCV(Cs=Cs, cv=cv, tol=1e-10, class_weight=class_weight)
    ours.fit(X, y, sample_weight=weights)
    theirs = _sklearn_logistic_cv(X, y, weights, Cs, cv, class_weight=class_weight)
    np.testing.assert_allclose(ours.scores_[1], theirs.scores_[1][..., 0], atol=1e-5)
    np.testing.assert_array_equal(ours.C_, theirs.C_)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, atol=1e-4)
    unweighted = LogisticRegressionCV(Cs=Cs, cv=cv, tol=1e-10).fit(X, y, sample_weight=weights)
    assert not np.allclose(unweighted.coef_, ours.coef_, atol=1e-3)


@pytest.mark.parametrize(
    "model", [LassoCV(n_alphas=5), ElasticNetCV(n_alphas=5), RidgeCV(), LogisticRegressionCV(Cs=3)]
)
def test_cv_estimators_take_n_jobs_and_it_changes_nothing(diabetes, model):
    """scikit-learn's n_jobs is accepted (a parameter: get_params, clone) and the folds run
    as without it."""
    X, y = diabetes
    X, y = X[:150], y[:150]
    if isinstance(model, LogisticRegressionCV):
        y = y > np.median(y)
    assert model.get_params()["n_jobs"] is None
    plain = clone(model).set_params(tol=1e-10, random_state=0).fit(X, y)
    parallel = clone(model).set_params(tol=1e-10, random_state=0, n_jobs=-1).fit(X, y)
    assert clone(parallel).n_jobs == -1
    np.testing.assert_array_equal(parallel.coef_, plain.coef_)


# (estimator, its held-out errors or scores): the regressors' repeated-rows cases
_REGRESSORS_CV = [
    (LassoCV(n_alphas=8, tol=1e-10), "mse_path_"),
    (ElasticNetCV(l1_ratio=[0.3, 0.9], n_alphas=6, tol=1e-13), "mse_path_"),
    (RidgeCV(alphas=[1e-3, 1e-2, 0.1, 1.0], tol=1e-12), "scores_"),
    (RidgeCV(alphas=[1e-3, 0.1, 1.0], tol=1e-12, scoring="neg_mean_absolute_error"), "scores_"),
]


@pytest.mark.parametrize("case", range(len(_REGRESSORS_CV)))
def test_integer_weights_are_repeated_rows_for_the_regressors(diabetes, case):
    """Integer weights (zeros included) give the model, the held-out errors or scores
    and the choice of the rows repeated that many times (0: removed), on the same folds
    expressed on the repeated rows; a row twice in a training part weighs twice."""
    X, y = diabetes
    X, y = X[:200], y[:200]
    counts = np.random.default_rng(case).integers(0, 4, len(y))
    model, attribute = _REGRESSORS_CV[case]
    kfold = list(KFold(3, shuffle=True, random_state=0).split(X))
    twice = [(np.concatenate([train, train[:20]]), test) for train, test in kfold]
    for splits in (kfold, twice):
        X_rep, y_rep, splits_rep = _repeated(X, y, counts, splits)
        weighted = clone(model).set_params(cv=splits).fit(X, y, sample_weight=counts)
        repeated = clone(model).set_params(cv=splits_rep).fit(X_rep, y_rep)
        np.testing.assert_allclose(
            getattr(weighted, attribute), getattr(repeated, attribute), rtol=1e-6, atol=1e-9
        )
        assert weighted.alpha_ == pytest.approx(repeated.alpha_, rel=1e-12)
        np.testing.assert_allclose(weighted.coef_, repeated.coef_, atol=1e-6)


@pytest.mark.parametrize("scoring", [None, "neg_log_loss"])
def test_integer_weights_are_repeated_rows_for_logistic_regression_cv(cancer, scoring):
    X, y = cancer
    X, y = X[:240, :12], y[:240]
    counts = np.random.default_rng(1).integers(0, 4, len(y))
    splits = list(StratifiedKFold(3, shuffle=True, random_state=0).split(X, y))
    X_rep, y_rep, splits_rep = _repeated(X, y, counts, splits)
    # tol: the strongest penalty is flat, a gap of 1e-12 leaves its θ 2e-7 apart
    options = dict(Cs=[1e-2, 0.1, 1.0, 10.0], tol=1e-14, scoring=scoring)
    weighted = LogisticRegressionCV(cv=splits, **options).fit(X, y, sample_weight=counts)
    repeated = LogisticRegressionCV(cv=splits_rep, **options).fit(X_rep, y_rep)
    np.testing.assert_allclose(weighted.scores_[1], repeated.scores_[1], atol=1e-6)
    np.testing.assert_allclose(weighted.coefs_paths_[1], repeated.coefs_paths_[1], atol=1e-5)
    if scoring is not None:  # accuracies tie: compare the choice on the log loss
        np.testing.assert_array_equal(weighted.C_, repeated.C_)
        np.testing.assert_allclose(weighted.coef_, repeated.coef_, atol=1e-5)
    # Three classes, one-vs-rest: each class's paths and refit weigh the rows alike.
    labels = np.digitize(X[:, 0], [-0.5, 0.5])
    options["scoring"] = "neg_log_loss"
    splits = list(KFold(3, shuffle=True, random_state=0).split(X))
    X_rep, labels_rep, splits_rep = _repeated(X, labels, counts, splits)
    weighted = LogisticRegressionCV(cv=splits, **options).fit(X, labels, sample_weight=counts)
    repeated = LogisticRegressionCV(cv=splits_rep, **options).fit(X_rep, labels_rep)
    np.testing.assert_array_equal(weighted.C_, repeated.C_)
    for label in weighted.classes_:
        np.testing.assert_allclose(weighted.scores_[label], repeated.scores_[label], atol=1e-6)
    np.testing.assert_allclose(weighted.coef_, repeated.coef_, atol=1e-5)


def test_sample_weight_forms_and_zero_weight_folds(diabetes):
    X, y = diabetes
    X, y = X[:120], y[:120]
    splits = list(KFold(3).split(X))
    options = dict(n_alphas=5, tol=1e-10)
    plain = LassoCV(cv=splits, **options).fit(X, y)
    # a number, or equal weights, is the unweighted problem (only ratios matter)
    for weights in (2.5, np.full(len(y), 0.5), list(np.ones(len(y)))):
        same = LassoCV(cv=splits, **options).fit(X, y, sample_weight=weights)
        np.testing.assert_allclose(same.mse_path_, plain.mse_path_, rtol=1e-9)
        assert same.alpha_ == plain.alpha_
    zero_test = np.ones(len(y))
    zero_test[splits[1][1]] = 0.0
    with pytest.raises(ValueError, match="fold 1: the sample weights of its held-out rows"):
        LassoCV(cv=splits, **options).fit(X, y, sample_weight=zero_test)
    with pytest.raises(ValueError, match="non-negative"):
        RidgeCV(cv=splits).fit(X, y, sample_weight=-np.ones(len(y)))
    with pytest.raises(ValueError, match="entries but X has"):
        LogisticRegressionCV(cv=3).fit(X, y > 150, sample_weight=np.ones(5))


def test_weighted_cv_on_a_dask_array_and_a_grid_is_the_one_in_memory(diabetes, cancer, tmp_path):
    """A dask vector of weights chunked like y, or a grid's stored weights (used when
    none are given), weigh the folds' paths, the held-out errors and the refit as the
    same weights in memory."""
    X, y = diabetes
    weights = np.random.default_rng(2).integers(0, 4, len(y)).astype(float)
    options = dict(cv=KFold(3, shuffle=True, random_state=0), n_alphas=6, eps=1e-2, tol=1e-10)
    here = LassoCV(**options).fit(X, y, sample_weight=weights)
    X_dask = da.from_array(X, chunks=(150, 5))
    there = LassoCV(**options).fit(
        X_dask, da.from_array(y, chunks=150), sample_weight=da.from_array(weights, chunks=150)
    )
    _same_choice(there, here)
    grid = dask_scd.to_grid(X, y, tmp_path / "g", row_chunk=150, sample_weight=weights)
    _same_choice(LassoCV(**options).fit(grid), here)
    ridge = dict(cv=options["cv"], scoring="neg_mean_squared_error", tol=1e-10)
    np.testing.assert_allclose(
        RidgeCV(**ridge).fit(X_dask, y, sample_weight=weights).scores_,
        RidgeCV(**ridge).fit(X, y, sample_weight=weights).scores_,
        rtol=1e-6,
    )
    X, y = cancer
    X, y = X[:300, :10], y[:300]
    weights = np.random.default_rng(3).uniform(0.0, 2.0, len(y))
    here = LogisticRegressionCV(Cs=5, tol=1e-10).fit(X, y, sample_weight=weights)
    there = LogisticRegressionCV(Cs=5, tol=1e-10).fit(
        da.from_array(X, chunks=(100, 10)),
        da.from_array(y, chunks=100),
        sample_weight=da.from_array(weights, chunks=100),
    )
    np.testing.assert_array_equal(there.C_, here.C_)
    np.testing.assert_allclose(there.scores_[1], here.scores_[1], atol=1e-12)
    np.testing.assert_allclose(there.coef_, here.coef_, atol=1e-4)
    # Three classes on a grid with stored weights: each class's paths on its cells.
    labels = np.digitize(X[:, 0], [-0.5, 0.5]).astype(float)
    here = LogisticRegressionCV(Cs=4, tol=1e-10).fit(X, labels, sample_weight=weights)
    grid = dask_scd.to_grid(X, labels, tmp_path / "c", row_chunk=100, sample_weight=weights)
    there = LogisticRegressionCV(Cs=4, tol=1e-10).fit(grid)
    np.testing.assert_array_equal(there.C_, here.C_)
    for label in here.classes_:
        np.testing.assert_allclose(there.scores_[label], here.scores_[label], atol=1e-12)
    np.testing.assert_allclose(there.coef_, here.coef_, atol=1e-4)


def test_fold_paths_side_by_side_on_a_cluster_are_those_run_in_turn(
    diabetes, tmp_path, monkeypatch
):
    """With a client, a dask array's or a grid's fold paths run from threads at once: each
    fold's fits are the ones it would make alone (the same bits), its warnings reach the
    caller, and the folds do run side by side."""
    import threading

    from distributed import Client, LocalCluster

    from dask_scd.estimators import path_cv

    X, y = diabetes
    options = dict(
        cv=KFold(3, shuffle=True, random_state=0),
        n_alphas=4,
        eps=1e-2,
        tol=1e-8,
        solver="block_newton",
    )
    grid = dask_scd.to_grid(X, y, tmp_path / "g", row_chunk=150)
    threads = set()
    fold_task = path_cv._fold_task

    def spy(X, job):
        threads.add(threading.current_thread().name)
        return fold_task(X, job)

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster),
    ):
        monkeypatch.setattr(path_cv, "_fold_task", spy)
        monkeypatch.setattr(path_cv, "FOLDS_AT_ONCE", 1)
        in_turn = LassoCV(**options).fit(grid)
        assert len(threads) == 1
        threads.clear()
        monkeypatch.setattr(path_cv, "FOLDS_AT_ONCE", 3)
        at_once = LassoCV(**options).fit(grid)
        assert len(threads) == 3  # one thread a fold
        # the folds' warnings reach the caller, the same as when run in turn
        caught = {}
        for at_a_time in (1, 3):
            monkeypatch.setattr(path_cv, "FOLDS_AT_ONCE", at_a_time)
            with warnings.catch_warnings(record=True) as got:
                warnings.simplefilter("always")
                LassoCV(
                    **(
                        options
                        | {"solver": "block_scd", "max_iter": 1, "tol": 1e-14, "random_state": 0}
                    )
                ).fit(grid)
            caught[at_a_time] = sorted(
                str(w.message) for w in got if issubclass(w.category, ConvergenceWarning)
            )
        assert caught[1] and caught[3] == caught[1]
    np.testing.assert_array_equal(at_once.mse_path_, in_turn.mse_path_)
    np.testing.assert_array_equal(at_once.coef_, in_turn.coef_)
    assert at_once.alpha_ == in_turn.alpha_


def test_collective_fits_of_folds_side_by_side_take_turns(diabetes, tmp_path, monkeypatch):
    """Block SCD's collective iterations hold a worker's thread while their members wait
    for each other: the folds' fits run from threads of this process take turns, so no
    fit's members wait for another's on workers of one thread (they would until
    MEMBER_TIMEOUT, then run the epoch as a task graph). Same bits as the folds in turn."""
    from distributed import Client, LocalCluster

    from dask_scd.engines.block import block_scd
    from dask_scd.estimators import path_cv

    X, y = diabetes
    # Room for a loaded machine (CI runs two test processes on two cores beside the
    # cluster's workers) while the members of one fit wait for each other (5 s was passed,
    # and 20 s once, in a full `make test` on a fresh clone); fits that did not take turns
    # fail ``most[0] == 1`` below (after this wait).
    monkeypatch.setattr(block_scd._BlockSCD, "MEMBER_TIMEOUT", 60.0)
    graphs = []
    graph_epoch = block_scd._BlockSCD._graph_epoch

    def counting(self, *args, **kwargs):
        graphs.append(1)
        return graph_epoch(self, *args, **kwargs)

    monkeypatch.setattr(block_scd._BlockSCD, "_graph_epoch", counting)
    active, most = [0], [0]
    members_iteration = block_scd._BlockSCD._members_iteration

    def watched(self, *args, **kwargs):
        active[0] += 1
        most[0] = max(most[0], active[0])
        try:
            return members_iteration(self, *args, **kwargs)
        finally:
            active[0] -= 1

    monkeypatch.setattr(block_scd._BlockSCD, "_members_iteration", watched)
    options = dict(
        cv=KFold(5, shuffle=True, random_state=0),
        n_alphas=4,
        eps=1e-1,
        tol=1e-6,
        solver="block_scd",
        random_state=0,
        max_iter=30,
    )
    grid = dask_scd.to_grid(X, y, tmp_path / "g", row_chunk=150)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster),
    ):
        monkeypatch.setattr(path_cv, "FOLDS_AT_ONCE", 3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            at_once = LassoCV(**options).fit(grid)
            assert not graphs  # every iteration ran collectively: no member gave up
            assert most[0] == 1  # one fit's members in flight at a time
            monkeypatch.setattr(path_cv, "FOLDS_AT_ONCE", 1)
            in_turn = LassoCV(**options).fit(grid)
    np.testing.assert_array_equal(at_once.mse_path_, in_turn.mse_path_)
    assert at_once.alpha_ == in_turn.alpha_
