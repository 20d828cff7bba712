"""The scale benchmark's pure helpers: its data generator, its time-to-error extraction from
a history, its L1 alpha rule and the mapping of our problems onto Spark's objectives.

No Spark, no cluster: Spark's objectives are written out in numpy from its documentation
(``bench_scale.spark_objective``) and checked against our objective on a tiny problem.
"""

import numpy as np
import pytest
from conftest import import_benchmark

import dask_scd
from dask_scd.result import History


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_scale")


def test_cardinalities_are_log_uniform_from_10_to_200k(bench):
    sizes = bench.cardinalities()
    assert len(sizes) == 26
    assert sizes[0] == 10 and sizes[-1] == 200_000
    assert sum(sizes) == 611_438
    ratios = np.diff(np.log(sizes))
    assert np.allclose(ratios, ratios.mean(), atol=0.02)


def test_data_is_one_hot_and_seeded(bench):
    X, y, blocks = bench.make_data(500)
    assert X.shape == (500, 611_438)
    assert X.nnz == 500 * 26  # one non-zero per field and row
    assert set(np.unique(X.data)) == {1.0}
    assert set(np.unique(y)) <= {-1.0, 1.0}
    assert len(blocks) == 26
    # every block is pure: exactly one non-zero per row in each field
    Xc = X.tocsc()
    for b in blocks[:5] + blocks[-2:]:
        assert np.all(np.diff(X[:, b].tocsr().indptr) == 1)
    assert Xc.shape == X.shape
    X2, y2, _ = bench.make_data(500)
    assert (X2 != X).nnz == 0 and np.array_equal(y, y2)


def test_pieces_of_the_3x_grid_share_one_model(bench):
    truth = np.random.default_rng(3).normal(size=611_438)
    Xa, ya = bench._piece(0, 300, 3, truth)
    Xb, yb = bench._piece(1, 300, 3, truth)
    assert Xa.shape == Xb.shape == (300, 611_438)
    assert (Xa != Xb).nnz > 0  # different rows per piece
    assert set(np.unique(np.concatenate([ya, yb]))) <= {-1.0, 1.0}


def test_time_to_error_from_a_history(bench):
    h = History()
    for it, (p, s) in enumerate(
        [(2.0, 0.5), (1.01, 1.0), (1.00005, 1.5), (1.0000005, 2.0), (1.0, 3.0)], start=1
    ):
        h.append(it, 0.0, p, s)
    assert bench.time_to_error(h.seconds, h.primal, 1.0, 1e-4) == (1.5, 2)
    assert bench.time_to_error(h.seconds, h.primal, 1.0, 1e-6) == (2.0, 3)
    assert bench.time_to_error(h.seconds, h.primal, 1.0, 1e-6, offset=0.25) == (2.25, 3)
    assert bench.time_to_error(h.seconds, h.primal, 0.5, 1e-6) is None
    assert bench.rel_error(1.1, 1.0) == pytest.approx(0.1)
    assert bench.rel_error(0.9, 1.0) == 0.0  # below P*: no error
    out = bench.Outcome("ours-mem", "m", points=list(zip(h.seconds, h.primal, h.iteration)))
    assert out.hit(1.0, 1e-4) == (1.5, 3)
    assert out.best() == 1.0


@pytest.fixture(scope="module")
def tiny():
    rng = np.random.default_rng(0)
    n, p = 200, 8
    X = rng.standard_normal((n, p))
    w = rng.standard_normal(p)
    y_cls = np.where(X @ w + 0.7 + rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y_cls


@pytest.mark.parametrize(
    "loss, penalty", [("logistic", "l2"), ("logistic", "l1"), ("squared", "l2"), ("squared", "l1")]
)
def test_objective_matches_our_certificate(bench, tiny, loss, penalty):
    X, y = tiny
    alpha, rho = 0.03, 1.0 if penalty == "l1" else 0.0
    r = dask_scd.fit(
        X, y, loss=loss, penalty=penalty, alpha=alpha, tol=1e-10, max_iter=10_000, random_state=0
    )
    P = bench.objective(loss, alpha, rho, X, y, r.coef_, r.intercept_)
    assert P == pytest.approx(r.primal_, rel=1e-12)
    cert = dask_scd.certificate(
        dask_scd.Problem(loss, alpha, rho, True), X, y, r.coef_, r.intercept_
    )
    assert P == pytest.approx(cert.primal, rel=1e-12)


@pytest.mark.parametrize(
    "loss, rho", [("logistic", 0.0), ("logistic", 1.0), ("squared", 0.0), ("squared", 1.0)]
)
def test_spark_objective_is_ours_with_the_mapped_reg_param(bench, tiny, loss, rho):
    """At any coefficients, Spark's objective (with regParam = spark_reg_param) in our
    units equals our objective: Spark's optimum is ours."""
    X, y = tiny
    alpha = 0.03
    rng = np.random.default_rng(1)
    reg = bench.spark_reg_param(loss, alpha, rho, y)
    for _ in range(3):
        coef, b = rng.standard_normal(X.shape[1]), float(rng.standard_normal())
        ours = bench.objective(loss, alpha, rho, X, y, coef, b)
        spark = bench.spark_objective(loss, reg, rho, X, y, coef, b)
        assert bench.spark_objective_ours(loss, y, spark) == pytest.approx(ours, rel=1e-12)


def test_spark_reg_param_scales_only_the_linear_l2(bench, tiny):
    _, y = tiny
    s = np.std(y, ddof=1)
    assert bench.spark_label_std(y) == pytest.approx(s)
    assert bench.spark_reg_param("logistic", 0.1, 0.0, y) == 0.1
    assert bench.spark_reg_param("logistic", 0.1, 1.0, y) == 0.1
    assert bench.spark_reg_param("squared", 0.1, 1.0, y) == 0.1
    assert bench.spark_reg_param("squared", 0.1, 0.0, y) == pytest.approx(0.1 * s)
    with pytest.raises(ValueError):
        bench.spark_reg_param("squared", 0.1, 0.5, y)


def test_alpha_max_zeroes_the_lasso(bench, tiny):
    X, y = tiny
    for loss in ("squared", "logistic"):
        amax = bench.alpha_max(X, y, loss)
        r = dask_scd.fit(
            X,
            y,
            loss=loss,
            penalty="l1",
            alpha=amax * 1.001,
            tol=1e-10,
            max_iter=10_000,
            random_state=0,
        )
        assert np.count_nonzero(r.coef_) == 0
        r = dask_scd.fit(
            X,
            y,
            loss=loss,
            penalty="l1",
            alpha=amax * 0.9,
            tol=1e-8,
            max_iter=10_000,
            random_state=0,
        )
        assert np.count_nonzero(r.coef_) > 0


def test_rows_and_columns_selection(bench):
    assert [r.key for r in bench.select_rows("logistic-l2")] == ["logistic-l2"]
    assert len(bench.select_rows(None)) == 5
    with pytest.raises(SystemExit):
        bench.select_rows("nope")
    args = bench.parse_args(
        ["--quick", "--only", "squared-l1", "--skip", "spark,ooc", "--no-save", "--rows", "1000"]
    )
    assert args.quick and args.no_save and args.rows == 1000 and args.skip == "spark,ooc"
