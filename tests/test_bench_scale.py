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


def test_the_heavy_data_has_more_fields_and_a_steeper_zipf_law(bench, monkeypatch):
    """--data heavy: 39 one-hot fields, values drawn with probability ∝ 1/(k+1)^1.2, so
    each field's most frequent value takes more of the rows than in the default data."""
    X, _, blocks = bench.make_data(20_000, seed=1)
    monkeypatch.setattr(bench, "DATASET", "heavy")
    Xh, yh, blocks_h = bench.make_data(20_000, seed=1)
    assert len(blocks_h) == 39 and Xh.shape[1] == sum(bench.cardinalities(39))
    assert np.all(np.diff(Xh.indptr) == 39) and set(np.unique(yh)) == {-1.0, 1.0}
    top = np.asarray(X[:, blocks[-1]].sum(axis=0)).max() / X.shape[0]
    top_h = np.asarray(Xh[:, blocks_h[-1]].sum(axis=0)).max() / Xh.shape[0]
    # the law's mass at its first value, 1/H(200000, s): s = 1 → 0.078, s = 1.2 → 0.186
    assert 0.06 < top < 0.1 and 0.16 < top_h < 0.21
    assert "zipf=1.2" in bench.data_description()
    with pytest.raises(ValueError, match="zipf"):
        dask_scd.datasets.make_onehot(10, 2, 5, zipf=0.0)


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


# --- out of core under a memory cgroup (benchmarks/bench_ooc_cgroup.py, _cgroup.py): the
# pure parts; no cgroup is made here.


@pytest.fixture(scope="module")
def ooc():
    return import_benchmark("bench_ooc_cgroup")


@pytest.fixture(scope="module")
def cg():
    return import_benchmark("_cgroup")


def test_cgroup_detection_and_its_skip_line(cg, tmp_path):
    refused = cg.detect(tmp_path, euid=1000)
    assert refused.version == 0 and "not root" in refused.reason
    assert cg.skip_message(refused) == (
        "out of core under a memory cgroup: skipped (not root (euid 1000): no cgroup can be made)"
    )
    assert "\n" not in cg.skip_message(refused)
    none = cg.detect(tmp_path, euid=0)
    assert none.version == 0 and "no cgroup memory controller" in none.reason
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    v1 = cg.detect(tmp_path, euid=0)
    assert (v1.version, v1.memory, v1.io) == (1, tmp_path / "memory", None)
    (tmp_path / "blkio").mkdir()
    (tmp_path / "blkio" / "blkio.throttle.io_service_bytes").write_text("Total 0\n")
    assert cg.detect(tmp_path, euid=0).io == tmp_path / "blkio"
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io pids\n")
    assert "no memory controller" in cg.detect(v2, euid=0).reason
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert cg.detect(v2, euid=0) == cg.CgroupSupport(2, v2, v2)


def test_cgroup_files_are_named_by_version(cg, tmp_path):
    v1 = cg.MemoryCgroup(cg.CgroupSupport(1, tmp_path / "m", tmp_path / "b"), "fit", 2**30)
    assert v1.memory == tmp_path / "m" / "fit" and v1.io == tmp_path / "b" / "fit"
    assert v1._dirs() == [v1.memory, v1.io]
    v2 = cg.MemoryCgroup(cg.CgroupSupport(2, tmp_path, tmp_path), "fit", 2**30)
    assert v2._dirs() == [tmp_path / "fit"]  # one hierarchy: one cgroup.procs


DISKSTATS = """\
   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
 254       0 vda 843156 116842 53273778 983920 274705 1396206 64032320 373092 0 222644 1471564
 254       1 vda1 100 0 2048 10 5 0 16 1 0 5 11
"""


def test_diskstats_bytes_are_sectors_of_512(cg):
    stats = cg.parse_diskstats(DISKSTATS)
    assert stats[(254, 0)] == ("vda", 53273778 * 512, 64032320 * 512)
    assert stats[(254, 1)] == ("vda1", 2048 * 512, 16 * 512)
    assert stats[(7, 0)] == ("loop0", 0, 0)
    assert cg.parse_diskstats("garbage\n") == {}


def test_cgroup_io_counters_v1_and_v2(cg):
    v1 = "254:0 Read 2961661952\n254:0 Write 7\n254:0 Total 2961661959\n8:0 Read 5\nTotal 9\n"
    assert cg.parse_io_read(v1, 1) == 2961661952 + 5
    v2 = "254:0 rbytes=1000 wbytes=20 rios=3 wios=1\n8:16 rbytes=24 wbytes=0 rios=1 wios=0\n"
    assert cg.parse_io_read(v2, 2) == 1024
    assert cg.parse_io_read("", 1) == 0
    flat = cg.parse_flat_keyed("cache 4096\nrss 8192\noom_kill_disable 0\nunder_oom 0\nx y\n")
    assert flat == {"cache": 4096, "rss": 8192, "oom_kill_disable": 0, "under_oom": 0}


def test_bytes_and_seconds_per_pass(ooc, cg):
    samples = [
        {"epoch": -1, "t": 10.0, "disk": 1_000, "io": 0},
        {"epoch": 1, "t": 40.0, "disk": 9_001_000, "io": 8_000_000},
        {"epoch": 2, "t": 52.0, "disk": 4_001_000, "io": None},
        {"epoch": 3, "t": 66.0, "disk": 8_001_000, "io": 3_000_000},
    ]
    disk = cg.per_pass(samples, "disk")
    assert disk == [(1, 30.0, 9_000_000), (2, 12.0, -5_000_000), (3, 14.0, 4_000_000)]
    assert cg.per_pass(samples, "io") == [(1, 30.0, 8_000_000), (2, 12.0, None), (3, 14.0, None)]
    assert cg.per_pass(samples[:1]) == []
    assert cg.floor_seconds(4_000_000, 1e6) == 4.0
    assert cg.floor_seconds(None, 1e6) is None and cg.floor_seconds(10, 0) is None
    figures = ooc.pass_figures({"result": {"probe": samples}})
    # epochs 2 on are the passes; epoch 1 holds the setup
    assert figures["seconds"] == 13.0 and figures["disk"] == -500_000 and figures["io"] is None


def test_same_bits_compares_the_saved_fits(ooc, tmp_path):
    class Fit:
        coef_ = np.array([1.0, -0.0, 3.0])
        intercept_ = 0.5

    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    ooc.save_fit(tmp_path / "a", Fit)
    ooc.save_fit(tmp_path / "b", Fit)
    Fit.coef_ = np.array([1.0, 0.0, 3.0])  # equal as numbers, not as bytes
    ooc.save_fit(tmp_path / "c", Fit)
    assert ooc.same_bits(tmp_path / "a", tmp_path / "b") is True
    assert ooc.same_bits(tmp_path / "a", tmp_path / "c") is False
    assert ooc.same_bits(tmp_path / "a", tmp_path / "missing") is None


def test_cgroup_mode_is_an_option(bench):
    args = bench.parse_args(["--cgroup-memory", "1536MiB", "--ooc-rows", "1000", "--no-save"])
    assert args.cgroup_memory == "1536MiB" and args.cgroup_epochs == 3 and not args.cgroup_warm


def test_cgroup_mode_without_a_cgroup_says_so_in_one_line(ooc, cg, monkeypatch, capsys):
    refused = cg.CgroupSupport(0, reason="not root (euid 1000): no cgroup can be made")
    monkeypatch.setattr(ooc, "detect", lambda: refused)
    assert ooc.main_cgroup(scale=None, args=None) is None  # nothing else is touched
    out = capsys.readouterr().out
    assert out == cg.skip_message(refused) + "\n"
