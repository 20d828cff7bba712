"""Sample weights and class weights: a weighted fit is the fit of repeated rows, its duality
gap is the weighted problem's, the classifiers' class_weight is scikit-learn's, and bad
weights are refused."""

import json
import warnings

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from scipy.special import entr, expit
from sklearn import linear_model, svm
from sklearn.datasets import dump_svmlight_file, make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.estimator_checks import (
    check_sample_weight_equivalence_on_dense_data,
    check_sample_weight_equivalence_on_sparse_data,
)

import dask_scd
from dask_scd import (
    ElasticNet,
    GridCorruptionError,
    Lasso,
    LinearSVC,
    LogisticRegression,
    Ridge,
    open_grid,
    to_grid,
)
from dask_scd.cli import main
from dask_scd.engines import registry
from dask_scd.objectives import Problem
from dask_scd.objectives.multinomial import certificate as multinomial_certificate
from dask_scd.validation import check_sample_weight

TIGHT = 1e-12


def _data(n=40, p=5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    y = X @ rng.standard_normal(p) + 0.5 * rng.standard_normal(n)
    weights = rng.integers(0, 4, n)
    weights[:2] = (0, 3)  # a row that counts for nothing, a row counted three times
    return X, y, weights


def _labels(y, loss):
    return y if loss == "squared" else np.where(y > np.median(y), 1.0, -1.0)


def _cases():
    """(engine, loss, penalty) for every engine of the registry and every loss it solves
    with sample weights; an L1 case where the engine solves L1 penalties."""
    for name, engine in registry.ENGINES.items():
        for loss in engine.weighted:
            yield name, loss, "l2"
            # the multinomial loss over Dask is L2 only (an L1 term runs in memory)
            l1 = engine.l1 and not (engine.data == "dask" and loss == "multinomial")
            if l1 and loss != "hinge":
                yield name, loss, "elasticnet"


def _refused():
    for name, engine in registry.ENGINES.items():
        for loss in engine.losses:
            if loss not in engine.weighted:
                yield name, loss


@pytest.mark.parametrize("solver, loss, penalty", list(_cases()))
def test_integer_weights_are_repeated_rows(solver, loss, penalty, request):
    X, y, weights = _data()
    y = _labels(y, loss)
    given = weights.copy()
    rows = np.repeat(np.arange(len(y)), weights)
    options = dict(
        loss=loss, penalty=penalty, alpha=0.05, tol=TIGHT, max_iter=20000, random_state=0
    )
    if registry.get(solver).data == "dask":  # on a cluster, with weights as a dask vector
        request.getfixturevalue("client")
        weighted = dask_scd.fit(
            da.from_array(X, chunks=(15, 3)),
            da.from_array(y, chunks=15),
            sample_weight=da.from_array(weights, chunks=20),
            solver=solver,
            **options,
        )
        repeated = dask_scd.fit(X[rows], y[rows], solver="newton", **options)
    else:
        weighted = dask_scd.fit(X, y, sample_weight=weights, solver=solver, **options)
        repeated = dask_scd.fit(X[rows], y[rows], solver=solver, **options)
    assert weighted.solver_ == solver
    assert weighted.primal_ == pytest.approx(repeated.primal_, rel=1e-8)
    assert weighted.dual_gap_ <= TIGHT
    np.testing.assert_allclose(weighted.coef_, repeated.coef_, atol=1e-5)
    assert weighted.intercept_ == pytest.approx(repeated.intercept_, abs=1e-5)
    # The certificate of the weighted problem, recomputed from the returned model.
    problem = Problem(loss, 0.05, 0.0 if penalty == "l2" else 0.5, True)
    if loss == "multinomial":  # K coefficient vectors: the softmax loss's own certificate
        cert = multinomial_certificate(
            problem,
            X,
            np.searchsorted(weighted.classes_, y),
            weighted.coef_,
            weighted.intercept_,
            sample_weight=weights,
        )
    else:
        cert = dask_scd.certificate(
            problem,
            X,
            y,
            weighted.coef_,
            weighted.intercept_,
            weights=check_sample_weight(weights, len(y)),
        )
    assert cert.primal == pytest.approx(repeated.primal_, rel=1e-8)
    assert cert.gap >= -1e-15 * abs(cert.primal)  # rounding at the optimum
    if loss != "hinge":  # the hinge's dual point from the margins is loose (objectives.md)
        assert cert.relative_gap <= 1e-9
    np.testing.assert_array_equal(weights, given)  # the user's weights are untouched


@pytest.mark.parametrize("solver, loss", list(_refused()))
def test_engines_without_weights_refuse_them(solver, loss):
    X, y, weights = _data()
    with pytest.raises(ValueError, match="sample weights") as info:
        dask_scd.fit(
            X, _labels(y, loss), loss=loss, alpha=0.1, solver=solver, sample_weight=weights
        )
    for name in registry.weighted_engines(loss):  # the message names those that do
        assert repr(name) in str(info.value)


@pytest.mark.parametrize(
    "loss, penalty",
    [
        ("squared", "l2"),
        ("squared", "l1"),
        ("logistic", "l1"),
        ("hinge", "l2"),
        ("squared_hinge", "l2"),
        ("logistic", None),
    ],
)
def test_auto_picks_an_engine_that_takes_weights(loss, penalty):
    X, y, weights = _data()
    y = _labels(y, loss)
    result = dask_scd.fit(
        X,
        y,
        loss=loss,
        penalty=penalty,
        alpha=0.05,
        tol=1e-10,
        max_iter=5000,
        sample_weight=weights,
    )
    assert loss in registry.get(result.solver_).weighted
    rows = np.repeat(np.arange(len(y)), weights)
    repeated = dask_scd.fit(
        X[rows],
        y[rows],
        loss=loss,
        penalty=penalty,
        alpha=0.05,
        tol=1e-10,
        max_iter=5000,
        solver=result.solver_,
    )
    assert result.primal_ == pytest.approx(repeated.primal_, rel=1e-8, abs=1e-12)


def test_zero_weights_drop_rows_and_equal_weights_change_nothing():
    X, y, weights = _data()
    options = dict(loss="logistic", alpha=0.05, tol=TIGHT, solver="newton")
    y = _labels(y, "logistic")
    kept = weights > 0
    weighted = dask_scd.fit(X, y, sample_weight=kept.astype(float), **options)
    subset = dask_scd.fit(X[kept], y[kept], **options)
    np.testing.assert_allclose(weighted.coef_, subset.coef_, atol=1e-7)
    assert weighted.primal_ == pytest.approx(subset.primal_, rel=1e-10)
    plain = dask_scd.fit(X, y, **options)
    equal = dask_scd.fit(X, y, sample_weight=np.full(len(y), 2.5), **options)
    np.testing.assert_array_equal(equal.coef_, plain.coef_)


def test_a_number_is_every_rows_weight():
    """A scalar sample_weight (scikit-learn's) weighs every row alike: the unweighted
    problem for fit and the regressors; the classifiers' C maps to 1/(C·w·n), as
    scikit-learn's ``C Σ w loss`` is its C·w. One check takes it, everywhere."""
    X, y, _ = _data()
    labels = _labels(y, "logistic")
    options = dict(loss="logistic", alpha=0.05, tol=TIGHT, solver="newton")
    plain = dask_scd.fit(X, labels, **options)
    for weight in (2.0, 3, np.float32(0.5)):
        scaled = dask_scd.fit(X, labels, sample_weight=weight, **options)
        np.testing.assert_array_equal(scaled.coef_, plain.coef_)
    on_dask = dask_scd.fit(da.from_array(X, chunks=(20, 5)), labels, sample_weight=2.0, **options)
    np.testing.assert_allclose(on_dask.coef_, plain.coef_, atol=1e-10)
    lasso = Lasso(alpha=0.1, tol=TIGHT).fit(X, y, sample_weight=2.0)
    unweighted = Lasso(alpha=0.1, tol=TIGHT).fit(X, y)
    np.testing.assert_allclose(lasso.coef_, unweighted.coef_, atol=1e-12)
    doubled = LogisticRegression(C=1.0, tol=TIGHT).fit(X, labels, sample_weight=2.0)
    reference = linear_model.LogisticRegression(C=1.0, tol=1e-12, solver="newton-cholesky")
    reference.fit(X, labels, sample_weight=2.0)
    # a gap of 1e-12 bounds ‖θ − θ*‖ by ~1e-5 at this weak alpha (1/(2n))
    np.testing.assert_allclose(doubled.coef_, reference.coef_, atol=1e-5)
    np.testing.assert_allclose(
        doubled.coef_, LogisticRegression(C=2.0, tol=TIGHT).fit(X, labels).coef_, atol=1e-10
    )
    for bad, match in ((-1.0, "non-negative"), (0.0, "sums to zero"), (np.nan, "NaN")):
        with pytest.raises(ValueError, match=match):
            dask_scd.fit(X, y, sample_weight=bad)
        with pytest.raises(ValueError, match=match):
            Ridge().fit(X, y, sample_weight=bad)


@pytest.mark.parametrize(
    "solver, loss, penalty",
    [
        ("scd", "squared", "elasticnet"),
        ("scd", "logistic", "l1"),
        ("scd", "squared_hinge", "l2"),
        ("duhl", "squared", "l2"),
        ("duhl", "logistic", "elasticnet"),
        ("duhl", "hinge", "l2"),
    ],
)
def test_zero_weights_are_removed_rows(solver, loss, penalty):
    """The engines whose coordinate steps weigh each example: a row of weight 0 is gone."""
    X, y, weights = _data()
    y = _labels(y, loss)
    kept = weights > 0
    options = dict(
        loss=loss,
        penalty=penalty,
        alpha=0.05,
        tol=TIGHT,
        max_iter=20000,
        solver=solver,
        random_state=0,
    )
    weighted = dask_scd.fit(X, y, sample_weight=kept.astype(float), **options)
    subset = dask_scd.fit(X[kept], y[kept], **options)
    assert weighted.dual_gap_ <= TIGHT
    assert weighted.primal_ == pytest.approx(subset.primal_, rel=1e-10)
    np.testing.assert_allclose(weighted.coef_, subset.coef_, atol=1e-6)


@pytest.mark.parametrize(
    "loss, penalty", [("squared", "l2"), ("logistic", "l2"), ("squared", "l1")]
)
def test_scd_on_one_hot_fields_with_weights_is_repeated_rows(loss, penalty):
    """Sparse one-hot X: the centred squared epochs (weighted means), the coarse step on
    whole-field shifts (L2) and the flat shifts (L1) all weigh each example."""
    from dask_scd.datasets import make_onehot

    X, y, _ = make_onehot(400, 3, 6, random_state=1)
    if loss == "squared":
        y = y + 0.3 * np.random.default_rng(1).standard_normal(len(y))
    weights = np.random.default_rng(2).integers(0, 4, len(y))
    rows = np.repeat(np.arange(len(y)), weights)
    options = dict(
        loss=loss,
        penalty=penalty,
        alpha=0.01,
        tol=TIGHT,
        max_iter=5000,
        solver="scd",
        random_state=0,
    )
    weighted = dask_scd.fit(X, y, sample_weight=weights, **options)
    repeated = dask_scd.fit(X[rows], y[rows], **options)
    assert weighted.dual_gap_ <= TIGHT
    assert weighted.primal_ == pytest.approx(repeated.primal_, rel=1e-8)
    np.testing.assert_allclose(weighted.coef_, repeated.coef_, atol=1e-5)


def test_sparse_weighted_fit():
    X, y, weights = _data()
    X[np.abs(X) < 0.8] = 0.0
    y = _labels(y, "logistic")
    dense = dask_scd.fit(
        X, y, loss="logistic", alpha=0.05, tol=TIGHT, solver="sdca", sample_weight=weights
    )
    sparse = dask_scd.fit(
        sp.csr_matrix(X),
        y,
        loss="logistic",
        alpha=0.05,
        tol=TIGHT,
        solver="sdca",
        sample_weight=weights,
    )
    assert sparse.primal_ == pytest.approx(dense.primal_, rel=1e-10)


# ----------------------------------------------------------------------- certificate


def test_gap_is_primal_minus_dual_computed_here():
    """Logistic, L2, no intercept: P(θ) and D(a) at a = −v∘ℓ'(Xθ) written out here."""
    X, y, weights = _data()
    y = _labels(y, "logistic")
    alpha = 0.05
    v = len(y) * weights / weights.sum()
    problem = Problem("logistic", alpha, 0.0, False)
    rng = np.random.default_rng(3)
    for coef in (np.zeros(X.shape[1]), rng.standard_normal(X.shape[1])):
        z = X @ coef
        primal = (
            np.sum(weights * np.logaddexp(0.0, -y * z)) / weights.sum() + 0.5 * alpha * coef @ coef
        )
        beta = expit(-y * z)  # a_i = v_i β_i y_i, β_i in the unweighted box [0, 1]
        a = v * beta * y
        dual = np.sum(v * (entr(beta) + entr(1.0 - beta))) / len(y) - 0.5 / alpha * np.sum(
            (X.T @ a / len(y)) ** 2
        )
        cert = dask_scd.certificate(problem, X, y, coef, 0.0, weights=v)
        assert cert.primal == pytest.approx(primal, rel=1e-13)
        assert cert.dual == pytest.approx(dual, rel=1e-12)
        assert cert.gap == pytest.approx(primal - dual, rel=1e-12, abs=1e-14)
        assert cert.gap >= 0.0
        assert cert.coordinate_gaps.sum() + cert.intercept_gap == pytest.approx(cert.gap)


@pytest.mark.parametrize("loss", ["squared", "logistic", "hinge", "squared_hinge"])
def test_weighted_gap_bounds_and_vanishes(loss):
    """Every gap of a weighted fit is ≥ 0, its dual values stay below the optimum, and
    the history goes down to tol."""
    X, y, weights = _data(seed=1)
    y = _labels(y, loss)
    solver = "sdca" if loss == "hinge" else "newton"
    result = dask_scd.fit(
        X, y, loss=loss, alpha=0.02, tol=TIGHT, solver=solver, max_iter=20000, sample_weight=weights
    )
    gaps = np.asarray(result.history_.relative_gap)
    assert np.all(gaps >= 0.0) and gaps[-1] <= TIGHT and gaps[0] > 100 * TIGHT
    problem = Problem(loss, 0.02, 0.0, True)
    v = check_sample_weight(weights, len(y))
    optimum = result.primal_
    rng = np.random.default_rng(0)
    for _ in range(5):  # any model's dual point bounds the optimum from below
        coef = rng.standard_normal(X.shape[1])
        cert = dask_scd.certificate(problem, X, y, coef, 0.3, weights=v)
        assert cert.gap >= 0.0
        assert cert.dual <= optimum + 1e-12 * abs(optimum)
        assert cert.primal >= optimum - 1e-12 * abs(optimum)


# --------------------------------------------------------------- dask and grid input


def test_dask_weights_rechunked_like_y(client):
    X, y, weights = _data(n=60)
    rows = np.repeat(np.arange(len(y)), weights)
    Xd = da.from_array(X, chunks=(20, 5))
    yd = da.from_array(y, chunks=20)
    wd = da.from_array(weights.astype(float), chunks=25)  # not y's chunks
    options = dict(alpha=0.05, tol=TIGHT, solver="auto")
    weighted = dask_scd.fit(Xd, yd, sample_weight=wd, **options)
    repeated = dask_scd.fit(X[rows], y[rows], **options)
    assert weighted.primal_ == pytest.approx(repeated.primal_, rel=1e-8)
    np.testing.assert_allclose(weighted.coef_, repeated.coef_, atol=1e-5)
    with pytest.raises(ValueError, match="sample_weight has shape"):
        dask_scd.fit(Xd, yd, sample_weight=wd[:-1], **options)
    by_blocks = dask_scd.fit(Xd, yd, sample_weight=wd, alpha=0.05, tol=TIGHT, solver="block_scd")
    assert by_blocks.primal_ == pytest.approx(repeated.primal_, rel=1e-8)
    # Above the in-memory limit auto stays on the cluster with an engine that takes them.
    distributed = dask_scd.fit(Xd, yd, sample_weight=wd, in_memory_limit=0, **options)
    assert distributed.solver_ in registry.weighted_engines("squared")
    assert registry.get(distributed.solver_).data == "dask"
    assert distributed.primal_ == pytest.approx(repeated.primal_, rel=1e-8)
    # A wide lasso (block Newton stops at 2048 features) stays there with block SCD.
    from dask_scd.datasets import make_onehot

    wide = make_onehot(60, 3, 700, random_state=0)[0].tocsr()  # 2,100 one-hot columns
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "brought into memory" warning
        lasso = dask_scd.fit(
            da.from_array(wide, chunks=(20, 700)),
            yd,
            penalty="l1",
            alpha=0.1,
            sample_weight=wd,
            in_memory_limit=0,
            tol=1e-10,
            max_iter=5000,
        )
    assert lasso.solver_ == "block_scd"
    in_memory = dask_scd.fit(wide[rows], y[rows], penalty="l1", alpha=0.1, tol=TIGHT)
    assert lasso.primal_ == pytest.approx(in_memory.primal_, rel=1e-8)


def test_grid_stores_weights(client, tmp_path):
    X, y, weights = _data(n=60)
    y = _labels(y, "logistic")
    given = weights.copy()
    grid = to_grid(X, y, tmp_path / "g", row_chunk=16, sample_weight=weights)
    assert grid.has_weights and not to_grid(X, y, tmp_path / "h", row_chunk=16).has_weights
    np.testing.assert_array_equal(
        np.concatenate([grid.read_weights(r) for r in range(grid.n_row_chunks)]), weights
    )
    rows = np.repeat(np.arange(len(y)), weights)
    options = dict(loss="logistic", alpha=0.05, tol=TIGHT)
    repeated = dask_scd.fit(X[rows], y[rows], **options)
    from_grid = dask_scd.fit(open_grid(tmp_path / "g"), **options)
    assert from_grid.primal_ == pytest.approx(repeated.primal_, rel=1e-8)
    # auto may take SDCA: a gap of 1e-12 bounds |Δθ| by √(2·gap·P/α) ≈ 5e-6 here.
    np.testing.assert_allclose(from_grid.coef_, repeated.coef_, atol=1e-5)
    # Weights passed at fit time replace the stored ones.
    ones = dask_scd.fit(grid, sample_weight=np.ones(len(y)), **options)
    plain = dask_scd.fit(X, y, **options)
    assert ones.primal_ == pytest.approx(plain.primal_, rel=1e-10)
    # The cluster engines read them beside the labels.
    for solver in ("block_newton", "block_scd"):
        on_cluster = dask_scd.fit(grid, solver=solver, max_iter=5000, **options)
        assert on_cluster.primal_ == pytest.approx(repeated.primal_, rel=1e-8), solver
    # The classifier reads the stored weights too.
    model = LogisticRegression(alpha=0.05, tol=TIGHT).fit(grid)
    np.testing.assert_allclose(model.coef_.ravel(), repeated.coef_, atol=1e-5)
    np.testing.assert_array_equal(weights, given)


def test_grid_weight_checksum(tmp_path):
    X, y, weights = _data(n=30)
    grid = to_grid(X, y, tmp_path / "g", row_chunk=10, sample_weight=weights)
    array = zarr.open_group(str(tmp_path / "g"), mode="r+")["weight"]
    array[0] = 7.0  # a value changed behind the store's back
    with pytest.raises(GridCorruptionError, match="sample weights of row chunk 0"):
        open_grid(grid.path).read_weights(0)


# ------------------------------------------------------------------------ bad weights


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda w: -w, "must be non-negative"),
        (lambda w: np.where(np.arange(len(w)) == 3, np.nan, w), "NaN or infinity"),
        (lambda w: np.where(np.arange(len(w)) == 3, np.inf, w), "NaN or infinity"),
        (lambda w: np.zeros(len(w)), "sums to zero"),
        (lambda w: w[:-1], "has 39 entries but X has 40 rows"),
        (lambda w: np.ones((len(w), 2)), "must be 1-D"),
        (lambda w: np.array(["a"] * len(w)), "must be numeric"),
    ],
)
def test_bad_weights_are_refused(bad, match, tmp_path):
    X, y, weights = _data()
    weights = weights.astype(float) + 1.0
    with pytest.raises(ValueError, match=match):
        dask_scd.fit(X, y, sample_weight=bad(weights))
    with pytest.raises(ValueError, match=match):
        Ridge().fit(X, y, sample_weight=bad(weights))
    with pytest.raises(ValueError, match=match):
        to_grid(X, y, tmp_path / "g", row_chunk=10, sample_weight=bad(weights))
    assert not (tmp_path / "g").exists()


def test_weights_leaving_one_class_are_refused():
    X, y, _ = _data()
    y = _labels(y, "logistic")
    with pytest.raises(ValueError, match="single class"):
        dask_scd.fit(X, y, loss="logistic", sample_weight=(y > 0).astype(float))


# ----------------------------------------------------------------- the estimators


def _sklearn_objective(loss, C, X, y_pm, coef, intercept, weights):
    z = X @ coef + intercept
    margin = np.maximum(0.0, 1.0 - y_pm * z)
    losses = {
        "logistic": np.logaddexp(0.0, -y_pm * z),
        "hinge": margin,
        "squared_hinge": margin**2,
    }[loss]
    return C * np.sum(weights * losses) + 0.5 * coef @ coef


@pytest.fixture(scope="module")
def unbalanced():
    X, y = make_classification(n_samples=80, n_features=6, weights=[0.7], random_state=0)
    sample_weight = np.random.default_rng(1).uniform(0.2, 3.0, len(y))
    return X, y, sample_weight


@pytest.mark.parametrize("class_weight", ["balanced", {0: 0.5, 1: 3.0}])
@pytest.mark.parametrize("with_sample_weight", [False, True])
def test_logistic_class_weight_matches_sklearn(unbalanced, class_weight, with_sample_weight):
    X, y, sample_weight = unbalanced
    sample_weight = sample_weight if with_sample_weight else None
    theirs = linear_model.LogisticRegression(
        C=0.5, class_weight=class_weight, tol=1e-12, max_iter=10000
    ).fit(X, y, sample_weight=sample_weight)
    ours = LogisticRegression(C=0.5, class_weight=class_weight, tol=TIGHT).fit(
        X, y, sample_weight=sample_weight
    )
    per_class = compute_class_weight(
        class_weight, classes=np.array([0, 1]), y=y, sample_weight=sample_weight
    )
    weights = per_class[y] * (1.0 if sample_weight is None else sample_weight)
    y_pm = np.where(y == 1, 1.0, -1.0)
    mine = _sklearn_objective(
        "logistic", 0.5, X, y_pm, ours.coef_.ravel(), ours.intercept_[0], weights
    )
    reference = _sklearn_objective(
        "logistic", 0.5, X, y_pm, theirs.coef_.ravel(), theirs.intercept_[0], weights
    )
    assert mine == pytest.approx(reference, rel=1e-7)
    assert mine <= reference * (1 + 1e-12)
    assert ours.dual_gap_[0] <= TIGHT


@pytest.mark.parametrize("class_weight", ["balanced", {0: 0.5, 1: 3.0}])
@pytest.mark.parametrize("loss", ["squared_hinge", "hinge"])
def test_linear_svc_class_weight_matches_sklearn(unbalanced, class_weight, loss):
    """liblinear penalizes the intercept: both fit without one."""
    X, y, sample_weight = unbalanced
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        theirs = svm.LinearSVC(
            C=0.5,
            loss=loss,
            class_weight=class_weight,
            fit_intercept=False,
            tol=1e-12,
            max_iter=1_000_000,
            random_state=0,
        ).fit(X, y, sample_weight=sample_weight)
    ours = LinearSVC(
        C=0.5,
        loss=loss,
        class_weight=class_weight,
        fit_intercept=False,
        tol=TIGHT,
        max_iter=100_000,
    ).fit(X, y, sample_weight=sample_weight)
    per_class = compute_class_weight(
        class_weight, classes=np.array([0, 1]), y=y, sample_weight=sample_weight
    )
    weights = per_class[y] * sample_weight
    y_pm = np.where(y == 1, 1.0, -1.0)
    mine = _sklearn_objective(loss, 0.5, X, y_pm, ours.coef_.ravel(), 0.0, weights)
    reference = _sklearn_objective(loss, 0.5, X, y_pm, theirs.coef_.ravel(), 0.0, weights)
    # Ours is certified to 1e-12; liblinear may stop short of its optimum, never below it.
    assert mine <= reference * (1 + 1e-7)
    if loss == "squared_hinge":
        assert mine == pytest.approx(reference, rel=1e-7)


def test_class_weight_dict_is_sample_weight():
    X, y = make_classification(n_samples=60, n_features=4, random_state=2)
    by_class = LogisticRegression(alpha=0.01, class_weight={1: 4.0}, tol=TIGHT, random_state=0).fit(
        X, y
    )
    by_rows = LogisticRegression(alpha=0.01, tol=TIGHT, random_state=0).fit(
        X, y, sample_weight=np.where(y == 1, 4.0, 1.0)
    )
    np.testing.assert_allclose(by_class.coef_, by_rows.coef_, atol=1e-8)


@pytest.mark.parametrize(
    "estimator",
    [
        Ridge(tol=1e-13),
        Lasso(alpha=0.01, tol=1e-13),
        ElasticNet(alpha=0.1, tol=1e-14),
        LogisticRegression(tol=1e-13, multi_class="ovr"),
        LinearSVC(alpha=0.01, tol=1e-13, max_iter=100_000),
    ],
)
def test_sklearn_weight_equivalence_checks_at_tight_tol(estimator):
    """scikit-learn's own checks (repeated rows against integer weights, to rtol 1e-7).
    Their data has three classes: LogisticRegression here fits one-vs-rest (the weighted
    multinomial model has its checks in test_multinomial_weights.py)."""
    name = type(estimator).__name__
    check_sample_weight_equivalence_on_dense_data(name, estimator)
    check_sample_weight_equivalence_on_sparse_data(name, estimator)


def test_estimator_weights_are_fit_weights():
    X, y, weights = _data()
    given = weights.copy()
    model = Lasso(alpha=0.01, tol=TIGHT, random_state=0).fit(X, y, sample_weight=weights)
    result = dask_scd.fit(
        X, y, penalty="l1", alpha=0.01, tol=TIGHT, sample_weight=weights, random_state=0
    )
    np.testing.assert_allclose(model.coef_, result.coef_, atol=1e-9)
    np.testing.assert_array_equal(weights, given)


# ---------------------------------------------------------------------------- the CLI


def test_cli_weights_file(tmp_path, capsys):
    X, y, weights = _data(n=50)
    y = _labels(y, "logistic")
    dump_svmlight_file(X, y, str(tmp_path / "d.svm"), zero_based=False)
    np.savetxt(tmp_path / "w.txt", weights)
    grid = tmp_path / "d.zarr"
    assert (
        main(
            [
                "convert",
                str(tmp_path / "d.svm"),
                str(grid),
                "--row-chunk",
                "20",
                "--weights",
                str(tmp_path / "w.txt"),
            ]
        )
        == 0
    )
    assert main(["info", str(grid)]) == 0
    assert "weights     stored" in capsys.readouterr().out
    options = ["--loss", "logistic", "--alpha", "0.05", "--tol", "1e-12", "--quiet"]
    for extra, expected in (([], weights), (["--weights", str(tmp_path / "ones.txt")], None)):
        np.savetxt(tmp_path / "ones.txt", np.ones(len(y)))
        model = tmp_path / "m.json"
        assert main(["fit", str(grid), *options, "--out", str(model), *extra]) == 0
        coef = np.array(json.loads(model.read_text())["coef"])
        reference = dask_scd.fit(
            X, y, loss="logistic", alpha=0.05, tol=TIGHT, sample_weight=expected
        )
        np.testing.assert_allclose(coef, reference.coef_, atol=1e-5)  # both to a gap of 1e-12
    assert (
        main(
            [
                "convert",
                str(tmp_path / "d.svm"),
                str(tmp_path / "e.zarr"),
                "--weights",
                str(tmp_path / "absent.txt"),
            ]
        )
        != 0
    )
    assert "weights file not found" in capsys.readouterr().err


@pytest.mark.parametrize(
    "loss, penalty", [("logistic", "l2"), ("squared", "l2"), ("logistic", "l1")]
)
def test_block_scd_on_a_one_hot_grid_with_weights_is_repeated_rows(client, tmp_path, loss, penalty):
    """Pure blocks (one-hot fields): the per-coordinate line search, the coarse step and
    the certificate all weigh each example."""
    from dask_scd.datasets import make_onehot

    X, y, blocks = make_onehot(300, 3, 6, random_state=1)
    if loss == "squared":
        y = y + 0.3 * np.random.default_rng(1).standard_normal(len(y))
    weights = np.random.default_rng(2).integers(0, 4, len(y))
    rows = np.repeat(np.arange(len(y)), weights)
    grid = to_grid(X, y, tmp_path / "onehot", row_chunk=70, blocks=blocks, sample_weight=weights)
    options = dict(loss=loss, penalty=penalty, alpha=0.01, tol=TIGHT, max_iter=5000)
    weighted = dask_scd.fit(grid, solver="block_scd", **options)
    repeated = dask_scd.fit(X[rows], y[rows], solver="newton", **options)
    assert weighted.solver_ == "block_scd"
    assert weighted.dual_gap_ <= TIGHT
    assert weighted.primal_ == pytest.approx(repeated.primal_, rel=1e-8)
    np.testing.assert_allclose(weighted.coef_, repeated.coef_, atol=1e-4)


# ------------------------------------------------------------------------ cocoa


SPLITS = [
    ("features", "squared"),
    ("features", "logistic"),
    ("features", "squared_hinge"),
    ("examples", "squared"),
    ("examples", "logistic"),
    ("examples", "squared_hinge"),
    ("examples", "hinge"),
]


@pytest.mark.parametrize("split, loss", SPLITS)
def test_cocoa_weights_are_repeated_rows_and_zero_weights_removed_rows(split, loss):
    """Both splits (the registry test above runs cocoa's default one): the weighted local
    solvers, γ and the certificate; an example of weight 0 is gone."""
    X, y, weights = _data()
    y = _labels(y, loss)
    rows = np.repeat(np.arange(len(y)), weights)
    options = dict(
        loss=loss,
        alpha=0.05,
        tol=TIGHT,
        max_iter=20000,
        random_state=0,
        solver="cocoa",
        split=split,
    )
    weighted = dask_scd.fit(X, y, sample_weight=weights, **options)
    repeated = dask_scd.fit(X[rows], y[rows], **options)
    assert weighted.dual_gap_ <= TIGHT and weighted.extras_["split"] == split
    assert weighted.primal_ == pytest.approx(repeated.primal_, rel=1e-8)
    kept = weights > 0
    zero = dask_scd.fit(X, y, sample_weight=kept.astype(float), **options)
    subset = dask_scd.fit(X[kept], y[kept], **options)
    assert zero.primal_ == pytest.approx(subset.primal_, rel=1e-10)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_cocoa_weights_reach_the_parts_on_a_cluster(client, tmp_path):
    """A dask vector's weights and a grid's stored ones travel with the labels to every
    part: three rounds on the cluster are those in memory, bit for bit, by feature and by
    example for every loss (so is the optimum, above); and one fit to the optimum each."""
    X, y, weights = _data(n=60, p=6)
    options = dict(alpha=0.05, random_state=0, solver="cocoa", n_partitions=3)
    rounds = dict(tol=1e-14, max_iter=3, **options)  # the parts: 3 row chunks or blocks

    def same(on_cluster, in_memory):
        assert on_cluster.n_iter_ == in_memory.n_iter_ == 3
        assert on_cluster.history_.relative_gap == in_memory.history_.relative_gap
        np.testing.assert_array_equal(on_cluster.coef_, in_memory.coef_)
        assert on_cluster.intercept_ == in_memory.intercept_

    for split, loss in SPLITS:
        labels = _labels(y, loss)
        same(
            dask_scd.fit(
                da.from_array(X, chunks=(20, 2)),
                da.from_array(labels, chunks=20),
                sample_weight=da.from_array(weights, chunks=25),
                loss=loss,
                split=split,
                **rounds,
            ),
            dask_scd.fit(X, labels, sample_weight=weights, loss=loss, split=split, **rounds),
        )
    labels = _labels(y, "logistic")
    grid = to_grid(
        X,
        labels,
        tmp_path / "g",
        row_chunk=20,
        blocks=[[0, 1], [2, 3], [4, 5]],
        sample_weight=weights,
    )
    rows = np.repeat(np.arange(len(y)), weights)
    for split in ("features", "examples"):
        same(
            dask_scd.fit(grid, loss="logistic", split=split, **rounds),
            dask_scd.fit(X, labels, sample_weight=weights, loss="logistic", split=split, **rounds),
        )
        weighted = dask_scd.fit(grid, loss="logistic", split=split, tol=1e-11, **options)
        repeated = dask_scd.fit(
            X[rows], labels[rows], loss="logistic", split=split, tol=TIGHT, **options
        )
        assert weighted.primal_ == pytest.approx(repeated.primal_, rel=1e-8), split
