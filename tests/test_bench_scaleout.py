"""The scale-out benchmark's counting and its cost model, on a tiny grid.

One LocalCluster of 1 and one of 2 worker processes: an epoch of block SCD counted
epoch by epoch (collectively and as a task graph), the structure of the counts (what
does not depend on the workers, what only moves between workers when there are two),
and the cost model's fit, which must give back the inputs it was fitted to.
"""

import numpy as np
import pytest
from conftest import import_benchmark

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_scaleout")


@pytest.fixture(scope="module")
def model():
    return import_benchmark("_scaleout_model")


@pytest.fixture(scope="module")
def grid(bench, tmp_path_factory):
    import dask_scd

    path = tmp_path_factory.mktemp("scaleout") / "grid"
    bench.write_grid_pieces(path, 2_000, 500)
    return dask_scd.open_grid(path)


@pytest.fixture(scope="module")
def counted(bench, grid):
    """{W: {config: steady epoch}} for W = 1, 2 and block SCD run collectively and as a
    task graph."""
    report = import_benchmark("_scaleout_report")
    out = {}
    for W in (1, 2):
        cluster, client, recorder, pids = bench.start_cluster(W, memory_limit="1GiB")
        try:
            out[W] = {
                config: report.steady(
                    bench.count_fit(client, recorder, pids, grid, config, 3)["epochs"]
                )
                for config in ("block_scd", "graph")
            }
        finally:
            client.close()
            cluster.close()
    return out


def test_every_epoch_runs_tasks_and_waits_a_few_times(counted):
    for W in (1, 2):
        for config in ("block_scd", "graph"):
            epoch = counted[W][config]
            assert epoch["tasks"] > 0
            assert epoch["worker_cpu"] > 0
            # the client waits a fixed handful of times per epoch, not once per block
            assert 1 <= epoch["round_trips"] <= 2 + W


def test_a_collective_epoch_is_one_task_per_member(counted):
    """One member per worker, the same exchange stages for one worker as for two (the
    stages follow the blocks, not the workers)."""
    assert counted[1]["block_scd"]["tasks"] == 1
    assert counted[2]["block_scd"]["tasks"] == 2
    assert counted[1]["block_scd"]["stages"] == counted[2]["block_scd"]["stages"] > 26
    assert counted[2]["block_scd"]["depth"] == 1


def test_a_task_graph_epoch_has_the_same_depth_on_one_and_two_workers(counted):
    """The graph's stages follow the blocks (26 fields and the intercept), so its depth
    is the same for any number of workers; its tasks grow with the groups of row
    chunks."""
    one, two = counted[1]["graph"], counted[2]["graph"]
    assert one["depth"] == two["depth"] >= 27
    assert two["tasks"] > one["tasks"]


def test_bytes_move_between_workers_only_when_there_are_two(counted):
    for config in ("block_scd", "graph"):
        assert counted[1][config]["w2w"] == 0
        assert counted[1][config]["max_in"] == 0
        assert counted[2][config]["w2w"] > 0
        assert 0 < counted[2][config]["max_in"] <= counted[2][config]["w2w"]
        for W in (1, 2):
            # θ and the certificate travel between the client and the cluster (8 B a
            # feature at least, once each way)
            assert counted[W][config]["to_client"] > 8 * 611_438
            assert counted[W][config]["from_client"] > 0


def test_the_cost_model_gives_back_the_inputs_it_was_fitted_to(model):
    truth = model.CostModel(3.0, 0.25, 40.0, 30.0, 0.1, 0.02, 3.0, 37.0, 5e6, 1e5)
    rows = [
        {
            "workers": W,
            "worker_cpu": truth.c0 + truth.c1 * W,
            "main_cpu": truth.s0 + truth.s1 * W,
            "tasks": truth.t0 + truth.t1 * W,
            "round_trips": truth.round_trips,
            "hops": truth.hops,
            "max_in": truth.bytes_in(W),
        }
        for W in (1, 2, 4, 8, 16)
    ]
    fitted = model.fit_model(rows)
    for name in ("c0", "c1", "t0", "t1", "s0", "s1", "round_trips", "hops", "b0", "b1"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-9, abs=1e-6)
    # one worker receives nothing of the others' statistics, only its per-worker term
    assert fitted.bytes_in(1) == pytest.approx(truth.b1)
    T = fitted.epoch_seconds(4, latency=0.01, hop_latency=0.001, bandwidth=1e9)
    expected = 3.0 / 4 + 0.25 + (0.1 + 0.02 * 4) + (3 * 0.01 + 37 * 0.001)
    assert T == pytest.approx(expected + truth.bytes_in(4) / 1e9)


def test_the_projection_scales_by_non_zeros_and_features(model):
    m = model.CostModel(2.0, 0.1, 10.0, 5.0, 0.1, 0.01, 3.0, 30.0, 1e6, 1e4)
    grid = {"n": 1000, "p": 100, "nnz": 26_000, "row_chunks": 4}
    cards = [10, 90]
    target = model.Target("t", 10_000, 200, 2, 4, 1e9, 1000)
    scaled = model.project(m, grid, cards, target, extra_hops=5)
    assert scaled.c0 == pytest.approx(20.0)  # 10x the rows, 10x the non-zeros
    # the statistics' sums and bytes by their entries: distinct columns per row chunk
    stats = (10 * model.distinct_columns([20, 180], 1000)) / (
        4 * model.distinct_columns(cards, 250)
    )
    assert scaled.c1 == pytest.approx(0.1 * stats) and scaled.b0 == pytest.approx(1e6 * stats)
    assert scaled.s0 == pytest.approx(0.2) and scaled.b1 == pytest.approx(2e4)  # 2x p
    assert scaled.hops == 35.0 and scaled.round_trips == 3.0
    assert target.row_chunks == 10 and target.groups == 8


def test_distinct_columns_of_a_zipf_field(model):
    # one row sees one value of each field; many rows see every value of a small field
    assert model.distinct_columns([10, 1000], 1) == pytest.approx(2.0)
    assert model.distinct_columns([10], 100_000) == pytest.approx(10.0)
    rng = np.random.default_rng(0)
    w = 1.0 / np.arange(1, 501)
    seen = [len(np.unique(rng.choice(500, 300, p=w / w.sum()))) for _ in range(200)]
    assert model.distinct_columns([500], 300) == pytest.approx(np.mean(seen), rel=0.02)
    assert model.tree_levels(1) == 0 and model.tree_levels(4) == 1
    assert model.tree_levels(16) == 2 and model.tree_levels(1000) == 5
