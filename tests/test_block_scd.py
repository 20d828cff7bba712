"""The block-SCD engine on dask: optimum, invariances, faults, checkpoints, bad input."""

import dataclasses
import os
import subprocess
import sys
import textwrap
import warnings

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from distributed import Client, LocalCluster
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd.datasets import make_onehot
from dask_scd.engines.block import block_coarse
from dask_scd.grid import GridCorruptionError, open_grid, to_grid

ALPHA = 0.03


@pytest.fixture(scope="module")
def onehot(tmp_path_factory):
    """Criteo-like: 3 pure one-hot fields and one impure set-valued field, two chunkings."""
    X, y, blocks = make_onehot(2400, 3, 8, set_valued=1, set_size=3, random_state=0)
    base = tmp_path_factory.mktemp("grids")
    to_grid(X, y, str(base / "a.zarr"), row_chunk=800, blocks=blocks)
    to_grid(X, y, str(base / "b.zarr"), row_chunk=500, blocks=blocks)
    return X, y, blocks, open_grid(base / "a.zarr"), open_grid(base / "b.zarr")


@pytest.fixture(scope="module")
def clients():
    """Process-based LocalClusters with 1, 2 and 4 workers, started on first use."""
    started = {}

    def get(n_workers):
        if n_workers not in started:
            cluster = LocalCluster(
                n_workers=n_workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=":0",
                memory_limit="2GiB",
            )
            started[n_workers] = (cluster, Client(cluster, set_as_default=False))
        return started[n_workers][1]

    yield get
    for cluster, client in started.values():
        client.close()
        cluster.close()


def _fixed_epochs(grid, client, loss, epochs=3, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return dask_scd.fit(
            grid,
            loss=loss,
            alpha=ALPHA,
            tol=1e-15,
            max_iter=epochs,
            solver="block_scd",
            client=client,
            random_state=0,
            **kwargs,
        )


def test_grid_is_pure_but_one_block(onehot):
    *_, grid, _ = onehot
    assert grid.purity == [True, True, True, False]


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_reaches_the_optimum_on_two_workers(onehot, clients, loss):
    X, y, _, grid, _ = onehot
    result = dask_scd.fit(
        grid,
        loss=loss,
        alpha=ALPHA,
        tol=1e-9,
        solver="block_scd",
        client=clients(2),
        random_state=0,
        max_iter=200,
    )
    # An independent reference: the in-memory dual solver (SDCA), far more precise.
    reference = dask_scd.fit(
        X, y, loss=loss, alpha=ALPHA, tol=1e-13, solver="sdca", random_state=0, max_iter=100_000
    )
    assert result.solver_ == "block_scd"
    assert result.converged_ and result.dual_gap_ <= 1e-9
    assert abs(result.primal_ - reference.primal_) <= 1e-7 * abs(reference.primal_)
    # Strong convexity bounds the distance to the optimum: ½α‖θ − θ*‖² ≤ gap.
    gap = result.dual_gap_ * result.primal_ + reference.dual_gap_ * reference.primal_
    assert np.linalg.norm(result.coef_ - reference.coef_) <= 2 * np.sqrt(2 * gap / ALPHA)
    # The 1-worker fit is the same model.
    single = dask_scd.fit(
        grid,
        loss=loss,
        alpha=ALPHA,
        tol=1e-9,
        solver="block_scd",
        client=clients(1),
        random_state=0,
        max_iter=200,
    )
    np.testing.assert_allclose(single.coef_, result.coef_, rtol=0, atol=1e-10)
    assert single.intercept_ == pytest.approx(result.intercept_, abs=1e-10)
    assert single.n_iter_ == result.n_iter_


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_model_does_not_depend_on_worker_count(onehot, clients, loss):
    *_, grid = onehot  # 5 row chunks: the Gram matrices of the impure block are tree-summed
    fits = [_fixed_epochs(grid, clients(k), loss) for k in (1, 2, 4)]
    for other in fits[1:]:  # bit for bit: every sum runs in a fixed order
        np.testing.assert_array_equal(other.coef_, fits[0].coef_)
        assert other.intercept_ == fits[0].intercept_


def test_model_does_not_depend_on_row_chunking(onehot, clients):
    *_, grid_a, grid_b = onehot
    a = _fixed_epochs(grid_a, clients(2), "logistic")
    b = _fixed_epochs(grid_b, clients(2), "logistic")
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=0, atol=1e-9)
    assert a.intercept_ == pytest.approx(b.intercept_, abs=1e-9)


def test_worker_killed_mid_fit(onehot, clients):
    *_, grid, _ = onehot
    client = clients(2)
    undisturbed = _fixed_epochs(grid, client, "logistic", epochs=10)
    killed = []

    def kill_one_worker():
        address = sorted(client.scheduler_info()["workers"])[0]
        try:
            client.run(os._exit, 1, workers=[address])
        except Exception:  # the worker dies before it can answer
            pass
        killed.append(address)

    def callback(state):
        if state["epoch"] == 1:  # after epoch 1, before epoch 2 can end: the fit waits
            kill_one_worker()  # for this callback, so the kill cannot miss the fit

    disturbed = _fixed_epochs(grid, client, "logistic", epochs=10, callback=callback)
    assert killed
    np.testing.assert_allclose(disturbed.coef_, undisturbed.coef_, rtol=0, atol=1e-12)
    assert disturbed.intercept_ == pytest.approx(undisturbed.intercept_, abs=1e-12)
    client.wait_for_workers(2, timeout=60)  # the nanny restarts it for the next tests


def test_checkpoint_resume_after_driver_is_killed(onehot, tmp_path):
    *_, grid, _ = onehot
    checkpoint = tmp_path / "fit.npz"
    script = textwrap.dedent(f"""
        import os
        import dask_scd
        from dask_scd.grid import open_grid
        grid = open_grid({str(grid.path)!r})
        def die(state):
            if state["epoch"] == 2:
                os._exit(3)  # the driver dies right after epoch 2's checkpoint
        dask_scd.fit(grid, loss="logistic", alpha={ALPHA}, tol=1e-15, max_iter=4,
                     solver="block_scd", random_state=0, checkpoint={str(checkpoint)!r},
                     callback=die)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=300)
    assert done.returncode == 3, done.stderr.decode()[-2000:]
    assert checkpoint.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        resumed = dask_scd.fit(
            grid,
            loss="logistic",
            alpha=ALPHA,
            tol=1e-15,
            max_iter=4,
            solver="block_scd",
            random_state=0,
            checkpoint=checkpoint,
            resume=True,
        )
        straight = dask_scd.fit(
            grid,
            loss="logistic",
            alpha=ALPHA,
            tol=1e-15,
            max_iter=4,
            solver="block_scd",
            random_state=0,
        )
    assert resumed.n_iter_ == straight.n_iter_ == 4
    assert resumed.history_.iteration == [1, 2, 3, 4]
    np.testing.assert_allclose(resumed.coef_, straight.coef_, rtol=0, atol=1e-12)
    assert resumed.intercept_ == pytest.approx(straight.intercept_, abs=1e-12)
    # A checkpoint of another problem is refused.
    with pytest.raises(ValueError, match="belongs to another fit"):
        dask_scd.fit(
            grid,
            loss="squared",
            alpha=ALPHA,
            max_iter=4,
            solver="block_scd",
            checkpoint=checkpoint,
            resume=True,
        )


def test_dask_array_input_matches_in_memory(rng):
    X = rng.normal(size=(600, 12))
    y = X @ rng.normal(size=12) + 0.3 * rng.normal(size=600) + 2.0
    dX = da.from_array(X, chunks=(200, 4))
    result = dask_scd.fit(
        dX, y, alpha=0.05, penalty="elasticnet", tol=1e-9, solver="block_scd", random_state=0
    )
    reference = dask_scd.fit(X, y, alpha=0.05, penalty="elasticnet", tol=1e-12, random_state=0)
    assert result.solver_ == "block_scd" and result.dual_gap_ <= 1e-9
    assert abs(result.primal_ - reference.primal_) <= 1e-8 * reference.primal_
    # User blocks reorder the columns; coefficients come back in the original order.
    blocked = dask_scd.fit(
        dX,
        y,
        alpha=0.05,
        penalty="elasticnet",
        tol=1e-9,
        solver="block_scd",
        random_state=0,
        blocks=[np.array([0, 5, 7]), np.arange(1, 5), np.array([6, 8, 9, 10, 11])],
    )
    np.testing.assert_allclose(blocked.coef_, reference.coef_, atol=1e-3)
    assert abs(blocked.primal_ - reference.primal_) <= 1e-8 * reference.primal_


@pytest.mark.parametrize("selection", ["cyclic", "gap"])
def test_block_selection_rules_converge(onehot, selection):
    X, y, _, grid, _ = onehot
    result = dask_scd.fit(
        grid,
        loss="squared",
        alpha=ALPHA,
        tol=1e-8,
        solver="block_scd",
        selection=selection,
        random_state=0,
        max_iter=200,
    )
    reference = dask_scd.fit(X, y, loss="squared", alpha=ALPHA, tol=1e-12, random_state=0)
    assert result.dual_gap_ <= 1e-8
    assert abs(result.primal_ - reference.primal_) <= 1e-7 * reference.primal_


def test_auto_uses_memory_for_small_data(onehot):
    X, y, _, grid, _ = onehot
    result = dask_scd.fit(grid, loss="logistic", alpha=ALPHA, tol=1e-9, random_state=0)
    assert result.solver_ in ("scd", "sdca", "newton")  # an in-memory engine
    reference = dask_scd.fit(X, y, loss="logistic", alpha=ALPHA, tol=1e-9, random_state=0)
    np.testing.assert_allclose(result.coef_, reference.coef_, atol=1e-6)
    forced = dask_scd.fit(
        grid, loss="logistic", alpha=ALPHA, tol=1e-9, random_state=0, in_memory_limit=0
    )
    assert forced.solver_ == "block_newton"  # few features: Newton over the grid
    # Newton ends far below tol; a gap of 1e-9 leaves SDCA's coefficients ~1e-4 off, so the
    # forced fit is compared with a tight reference.
    tight = dask_scd.fit(
        X, y, loss="logistic", alpha=ALPHA, tol=1e-14, random_state=0, max_iter=100_000
    )
    np.testing.assert_allclose(forced.coef_, tight.coef_, atol=1e-6)
    assert abs(forced.intercept_ - tight.intercept_) <= 1e-6


def test_bad_inputs(onehot, tmp_path):
    X, y, _, grid, _ = onehot
    dX = da.from_array(X.toarray(), chunks=(800, 10))
    with pytest.raises(ValueError, match="y has 10 labels but X has 2400 rows"):
        dask_scd.fit(dX, y[:10], solver="block_scd")
    with pytest.raises(ValueError, match="compute_chunk_sizes"):
        dask_scd.fit(dX[dX[:, 0] >= 0], y, solver="block_scd")
    with pytest.raises(ValueError, match="missing"):
        dask_scd.fit(dX, y, solver="block_scd", blocks=[np.arange(5)])
    with pytest.raises(ValueError, match="more than once|repeated|twice"):
        dask_scd.fit(dX, y, solver="block_scd", blocks=[np.arange(20), np.arange(19, X.shape[1])])
    with pytest.raises(ValueError, match="carries its own labels"):
        dask_scd.fit(grid, y)
    bad = X.toarray()
    bad[1500, 3] = np.nan
    with pytest.raises(ValueError, match=r"NaN or infinity in cell \(row chunk 1, block 0\)"):
        dask_scd.fit(da.from_array(bad, chunks=(800, 10)), y, solver="block_scd")
    with pytest.raises(ValueError, match="hinge"):
        dask_scd.fit(grid, loss="hinge", solver="block_scd")


def test_corrupt_cell_is_named(onehot, tmp_path):
    X, y, blocks, _, _ = onehot
    grid = to_grid(X, y, str(tmp_path / "c.zarr"), row_chunk=800, blocks=blocks)
    cell_files = sorted((tmp_path / "c.zarr" / "X" / "block_1").rglob("c/*"))
    assert cell_files
    os.remove(cell_files[0])
    with pytest.raises(GridCorruptionError, match=r"block 1"):
        dask_scd.fit(open_grid(grid.path), solver="block_scd", alpha=ALPHA, max_iter=2)


def test_sparse_dask_chunks(onehot):
    X, y, blocks, _, _ = onehot
    dX = da.from_array(sp.csr_matrix(X), chunks=(1200, X.shape[1]), asarray=False)
    result = dask_scd.fit(
        dX,
        y,
        loss="logistic",
        alpha=ALPHA,
        tol=1e-9,
        solver="block_scd",
        random_state=0,
        max_iter=300,
    )
    reference = dask_scd.fit(X, y, loss="logistic", alpha=ALPHA, tol=1e-12, random_state=0)
    assert abs(result.primal_ - reference.primal_) <= 1e-8 * reference.primal_


# ------------------------------------------------------------- task functions and placement


def test_compact_row_sums_equal_the_float_ones(onehot):
    X, _, blocks, *_ = onehot

    X = sp.csr_matrix(X)
    cells = [X[:800][:, b] for b in blocks]
    row_sums = block_coarse.block_row_sums(cells, with_intercept=True)
    dense = np.column_stack([np.asarray(c.sum(axis=1)).ravel() for c in cells] + [np.ones(800)])
    np.testing.assert_array_equal(row_sums.toarray(), dense)
    # Complete one-hot blocks and the intercept are the ones vector, stored once (not at all).
    assert list(row_sums.column_of) == [-1, -1, -1, 0, -1]
    assert row_sums.counts.dtype == np.uint8 and row_sums.counts.shape == (800, 1)
    # Non-integer sums stay float64, and the statistics match the dense formulas.
    rng = np.random.default_rng(0)
    scaled = [c * 0.5 for c in cells[:2]] + [cells[3]]
    row_sums = block_coarse.block_row_sums(scaled, with_intercept=True)
    assert row_sums.counts.dtype == np.float64
    S = np.column_stack([np.asarray(c.sum(axis=1)).ravel() for c in scaled] + [np.ones(800)])
    np.testing.assert_array_equal(row_sums.toarray(), S)
    y, margins = np.sign(rng.normal(size=800)), rng.normal(size=800)
    stats = block_coarse.coarse_stats(row_sums, y, margins, "logistic")
    d1 = dask_scd.objectives.loss_derivative("logistic", y, margins)
    d2 = dask_scd.objectives.loss_second_derivative("logistic", y, margins)
    np.testing.assert_allclose(stats["g"], S.T @ d1, rtol=1e-12)
    np.testing.assert_allclose(stats["h"], S.T @ (S * d2[:, None]), rtol=1e-12)
    assert np.array_equal(stats["h"], stats["h"].T)
    shift = rng.normal(size=S.shape[1])
    from dask_scd.kernels.block import coarse_matvec

    np.testing.assert_allclose(
        coarse_matvec(row_sums.counts, row_sums.column_of, shift), S @ shift, rtol=1e-12
    )


@pytest.mark.parametrize("loss", ["squared", "logistic", "squared_hinge", "hinge"])
def test_intercept_at_zero_from_counts(loss):
    from dask_scd.engines.block import block_ops as ops

    y = np.where(np.arange(1000) % 7 < 2, 1.0, -1.0)
    if loss == "squared":
        y = y * 3.0 + 0.25
    expected = dask_scd.objectives.optimal_intercept(loss, y, np.zeros(len(y)))
    got = ops.intercept_at_zero(loss, float(len(y)), float(y.sum()), float((y > 0).sum()))
    assert got == pytest.approx(expected, abs=1e-12)


def test_cell_cache_stays_under_its_bound_and_the_memory_ceiling(monkeypatch):
    from dask_scd.data import cache as cell_cache

    resident = [1000]
    monkeypatch.setattr(cell_cache, "_resident_bytes", lambda: resident[0])
    cache = cell_cache.CellCache(300, ceiling=1300)
    for k in range(5):
        cache.get(k, lambda: np.zeros(10))  # 80 bytes each
    assert cache.nbytes == 240 and list(cache._items) == [2, 3, 4]  # bound: LRU dropped
    resident[0] = 1250  # the tasks' own arrays grew: an old cell makes room under the ceiling
    cache.get("new", lambda: np.zeros(10))
    assert list(cache._items) == [3, 4, "new"]
    resident[0] = 5000  # no room at all: nothing is kept, the value is still returned
    assert cache.get("x", lambda: np.ones(3))[0] == 1.0
    assert "x" not in cache._items and cache.nbytes == 0


def test_a_cell_the_cache_has_no_room_for_is_read_once_per_block_iteration(monkeypatch):
    """Out of core (no room in the LRU), the statistics, line search and apply of one
    block read its cell once: the last cell of each row chunk is kept until the next."""
    from dask_scd.data import cache as cell_cache

    resident = [1000]
    monkeypatch.setattr(cell_cache, "_resident_bytes", lambda: resident[0])
    cache = cell_cache.CellCache(0, ceiling=1000)
    cache.pause_at = 2000
    loads = []

    def load(key):
        def run():
            loads.append(key)
            return np.zeros(10)

        return run

    cell = ("cell", "store", "id", "v1")
    for b in (0, 1):
        for r in (0, 1):
            for _stage in range(3):
                cache.get((*cell, r, b), load((r, b)))
    assert loads == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert cache.nbytes == 0 and cache.counts["reads"] == 4
    # Near the pause threshold the row chunks' last reads are still kept while they take
    # at most an eighth of it (250 bytes here: out of core a worker sits there, and a
    # cell read twice a pass costs more than one cell per row chunk), not beyond.
    resident[0] = 1900
    cache.get((*cell, 0, 2), load((0, 2)))
    cache.get((*cell, 0, 2), load((0, 2)))
    assert loads[-1:] == [(0, 2)]

    def big(key):
        return lambda: loads.append(key) or np.zeros(30)  # 240 bytes

    cache.get((*cell, 0, 3), big((0, 3)))
    cache.get((*cell, 0, 3), big((0, 3)))
    assert loads[-2:] == [(0, 3), (0, 3)]  # 80 + 240 bytes held would pass 250


def test_a_task_keeps_a_row_chunk_s_cells_for_its_second_pass_near_the_threshold(monkeypatch):
    """The certificate's margins and statistics read a row chunk's cells once even where
    the process sits above 80 % of its pause threshold (out of core it does most of the
    time): a task keeps up to an eighth of the threshold of cells for its second pass."""
    from dask_scd.data import cache as cell_cache

    monkeypatch.setattr(cell_cache, "_resident_bytes", lambda: 1900)
    cache = cell_cache.CellCache(0, ceiling=1000)
    assert cache.has_room(10**12)  # no pause threshold known: always
    cache.pause_at = 2000
    assert cache.has_room(0) and cache.has_room(250)
    assert not cache.has_room(251)
    monkeypatch.setattr(cell_cache, "_resident_bytes", lambda: 1000)
    assert cache.has_room(10**6)  # well below the threshold: any amount


def test_a_paused_worker_s_cache_gives_memory_back(monkeypatch):
    """Above the pause threshold a worker runs no task, so nothing else frees memory (a
    13M-row fit on 640 MiB workers waited for ever at 521 MiB): the cache drops its
    least recently used cells until the process is 10 % below the threshold, and keeps
    its bound and ceiling there."""
    from dask_scd.data import cache as cell_cache

    resident = [1000]
    monkeypatch.setattr(cell_cache, "_resident_bytes", lambda: resident[0])
    freed = []
    monkeypatch.setattr(cell_cache, "release_free_memory", lambda: freed.append(1))
    cache = cell_cache.CellCache(10_000, ceiling=None)
    cache.pause_at = 2000
    assert cache.relieve() == 0 and not freed  # below the threshold: nothing to do
    for k in range(10):
        cache.get(k, lambda: np.zeros(10))  # 80 bytes each
    resident[0] = 2100  # paused
    assert cache.relieve() == 320  # 2100 − 0.9·2000 = 300 bytes: four cells
    assert list(cache._items) == [4, 5, 6, 7, 8, 9] and freed == [1]
    assert cache.max_bytes == 480 and cache.ceiling == 1800
    # The next fit starts from what the worker has left then, not from this fit's low.
    budgets = []
    monkeypatch.setattr(
        cell_cache, "_cache_budget", lambda held=0: budgets.append(held) or (5000, 9000, 2000)
    )
    assert cache.renew() and budgets == [480]  # the cells it holds are not counted as used
    assert cache.max_bytes == 5000 and cache.ceiling == 9000
    assert not cache.renew()  # once per relief


def test_paused_workers_get_the_cache_relief(client):
    from dask_scd.runtime.cluster import CACHE_RELIEF, relieve_paused_workers

    assert relieve_paused_workers(client)
    assert all(
        client.run(lambda dask_worker: CACHE_RELIEF in dask_worker.periodic_callbacks).values()
    )


def test_spilling_is_held_off_only_where_it_cannot_reach_the_target():
    """dask spills a worker's results until its process is below the target: where the
    cells a fit holds (outside dask's data) keep it above whatever is spilled, spilling
    only writes and reads back every result, and is held off; with room to gain, or no
    cell held, dask's own setting stands."""
    from types import SimpleNamespace

    from dask_scd.runtime.cluster import spill_helps

    def worker(process, managed, target=0.6):
        return SimpleNamespace(
            memory_manager=SimpleNamespace(memory_limit=1000, memory_target_fraction=target),
            data=SimpleNamespace(fast=SimpleNamespace(total_weight=managed)),
            monitor=SimpleNamespace(get_process_memory=lambda: process),
        )

    holding, empty = SimpleNamespace(holds_cells=True), SimpleNamespace(holds_cells=False)
    assert not spill_helps(worker(900, 100), holding, 0.7)  # 800 outside dask > 600
    assert spill_helps(worker(900, 400), holding, 0.7)  # spilling 300 reaches 600
    assert spill_helps(worker(900, 100), empty, 0.7)  # not the fit's cells: dask decides
    assert not spill_helps(worker(750, 10, target=False), holding, 0.7)  # target: spill's
    plain = SimpleNamespace(
        memory_manager=SimpleNamespace(memory_limit=1000, memory_target_fraction=0.6),
        data={},
        monitor=None,
    )
    assert spill_helps(plain, holding, 0.7)  # no spill buffer: nothing to decide


def test_cache_is_sized_from_what_the_worker_has_left(clients):
    from dask_scd.data import cache as cell_cache

    def budget():
        from distributed import get_worker

        bound, ceiling, pause = cell_cache._cache_budget()
        return (
            bound,
            ceiling,
            pause,
            cell_cache._resident_bytes(),
            get_worker().memory_manager.memory_limit,
        )

    bound, ceiling, pause, resident, limit = clients(1).submit(budget, pure=False).result()
    assert limit == 2 * 2**30 and pause == int(0.8 * limit)
    assert 0 < bound <= 0.5 * (0.8 * limit - resident) + 50 * 2**20  # resident moved a bit
    assert ceiling - bound < 0.8 * limit
    assert ceiling >= int(0.85 * pause)  # tasks' arrays beyond half the headroom: not all cells go


def test_no_vector_of_examples_reaches_the_client(onehot, clients, monkeypatch):
    """The client receives block-sized vectors only, never labels or margins."""
    from distributed import Client, Future

    *_, grid, _ = onehot
    largest = []

    def sizes(value):
        if isinstance(value, np.ndarray):
            largest.append(value.size)
        elif isinstance(value, dict):
            for v in value.values():
                sizes(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                sizes(v)
        elif hasattr(value, "__dataclass_fields__"):
            for name in value.__dataclass_fields__:
                sizes(getattr(value, name))
        return value

    gather, result = Client.gather, Future.result
    monkeypatch.setattr(Client, "gather", lambda self, *a, **k: sizes(gather(self, *a, **k)))
    monkeypatch.setattr(Future, "result", lambda self, *a, **k: sizes(result(self, *a, **k)))

    class Tripwire:
        def __getattr__(self, name):
            raise AssertionError(f"the engine used the whole of X or y (.{name})")

    grid = dataclasses.replace(grid, X=Tripwire(), y=Tripwire())
    for loss in ("squared", "logistic"):
        _fixed_epochs(grid, clients(2), loss, epochs=2)
    assert largest and max(largest) <= grid.shape[1] < min(np.diff(grid.row_bounds))


def test_row_chunks_stay_on_their_worker(onehot, clients):
    """Each worker reads (and caches) only the cells of its own row chunks."""
    from dask_scd.data import cache as cell_cache  # a module: pickled by reference

    *_, grid, _ = onehot
    client = clients(2)

    def cached_row_chunks():
        return sorted(
            {key[4] for key in cell_cache.CACHE._items if key[0] == "cell"}
        )  # CellRef.key

    def clear():
        cell_cache.CACHE.clear()

    client.run(clear)
    _fixed_epochs(grid, client, "logistic", epochs=2)
    per_worker = list(client.run(cached_row_chunks).values())
    assert sorted(r for rows in per_worker for r in rows) == list(range(grid.n_row_chunks))


@pytest.mark.parametrize("loss", ["squared", "logistic", "squared_hinge"])
def test_trial_kernels_match_the_loss_differences(loss, rng):
    """The product form of the logistic trials equals ℓ(ŷ + a·d·x) − ℓ(ŷ) (numpy oracle)."""
    from dask_scd import objectives as obj
    from dask_scd.engines.coarse import LINE_SEARCH_STEPS as steps
    from dask_scd.kernels import block as kernels
    from dask_scd.kernels.layout import MajorMatrix

    n, p = 3000, 40
    X = sp.csc_matrix(
        (rng.uniform(0.5, 2.0, n), (np.arange(n), rng.integers(0, p, n))), shape=(n, p)
    )
    y, margins = np.sign(rng.normal(size=n)), 4.0 * rng.normal(size=n)
    d = 3.0 * rng.normal(size=p)
    d[:3] = [0.0, 30.0, -30.0]  # no change; beyond the product form's range
    code = obj.LOSS_CODES[loss]
    m = MajorMatrix.from_array(X, "columns")
    got = kernels.coordinate_trials(
        m.data,
        m.indices,
        m.indptr,
        m.dense,
        m.n_major,
        m.n_minor,
        True,
        y,
        margins,
        d,
        steps,
        True,
        code,
    )
    base = obj.loss_value(loss, y, margins)
    dense = X.toarray()
    expected = np.array(
        [
            [
                (obj.loss_value(loss, y, margins + a * d[j] * dense[:, j]) - base).sum()
                for j in range(p)
            ]
            for a in steps
        ]
    )
    np.testing.assert_allclose(got, expected, rtol=1e-11, atol=1e-11)
    u = X @ d
    np.testing.assert_allclose(
        kernels.line_trials(y, margins, u, steps, True, code),
        [(obj.loss_value(loss, y, margins + a * u) - base).sum() for a in steps],
        rtol=1e-11,
    )
    d1, d2 = kernels.derivatives(code, y, margins)
    np.testing.assert_allclose(d1, obj.loss_derivative(loss, y, margins), rtol=1e-14, atol=1e-300)
    # numpy's σ(yz)(1 − σ(yz)) cancels where σ ≈ 1: compare in absolute terms (ℓ'' ≤ 2)
    np.testing.assert_allclose(d2, obj.loss_second_derivative(loss, y, margins), rtol=0, atol=1e-15)


def test_proven_coordinates_skip_the_trials_with_the_same_step(rng):
    """Logistic, pure block: the cubic bound only skips trials whose answer it knows."""
    from dask_scd import objectives as obj
    from dask_scd.engines.block import block_ops as ops

    n, p = 4000, 30
    weights = np.r_[np.ones(p - 10), np.full(10, 1e-3)]  # rare columns take long steps
    cells = [
        sp.csc_matrix(
            (
                np.ones(n // 2),
                (np.arange(n // 2), rng.choice(p, n // 2, p=weights / weights.sum())),
            ),
            shape=(n // 2, p),
        )
        for _ in range(2)
    ]
    y = [np.sign(rng.normal(size=n // 2)) for _ in range(2)]
    margins = [3.0 * rng.normal(size=n // 2) for _ in range(2)]
    problem = obj.Problem("logistic", 1e-8, 0.0, True)
    theta = 0.3 * rng.normal(size=p)
    stats = [ops.block_stats(c, yr, m, "logistic") for c, yr, m in zip(cells, y, margins)]
    direction = ops.block_direction(problem, n, theta, False, *stats)
    assert 0 < direction["proven"].sum() < p  # some proven, some not
    unproven = {k: v for k, v in direction.items() if k != "proven"}
    steps = []
    for d in (direction, unproven):
        trials = [
            ops.block_trials(c, yr, m, d, problem, True) for c, yr, m in zip(cells, y, margins)
        ]
        steps.append(ops.block_choose(d, n, 1e-13, *trials))
    np.testing.assert_array_equal(steps[0]["delta"], steps[1]["delta"])


def test_l1_coarse_step_shifts_the_nonzero_coefficients(clients, tmp_path):
    """With an L1 term the coarse step moves each field's non-zero coefficients together
    (its zeros stay): one-hot logistic L1 with an intercept reaches a tight gap in a few
    dozen epochs, at the in-memory optimum (without it: 200 epochs left gap 5.4 on the
    40k-row version of this problem)."""
    cardinality = [int(c) for c in np.geomspace(5, 1000, 8)]
    X, y, blocks = make_onehot(6000, 8, cardinality, random_state=1)
    grid = to_grid(X, y, str(tmp_path / "l1.zarr"), row_chunk=2000, blocks=blocks)
    reference = dask_scd.fit(
        X, y, loss="logistic", penalty="l1", alpha=2e-4, tol=1e-12, solver="newton"
    )
    result = dask_scd.fit(
        grid,
        loss="logistic",
        penalty="l1",
        alpha=2e-4,
        tol=1e-8,
        max_iter=60,
        solver="block_scd",
        client=clients(2),
        random_state=0,
    )
    assert result.dual_gap_ <= 1e-8
    assert result.primal_ == pytest.approx(reference.primal_, rel=1e-8)
    assert 0 < np.count_nonzero(result.coef_) < X.shape[1]


@pytest.mark.parametrize("loss, penalty", [("logistic", "l2"), ("squared", "l1")])
def test_sums_over_stored_columns_give_the_same_bits(tmp_path, monkeypatch, loss, penalty):
    """Row chunks that meet few of a block's columns send their sums over those columns
    alone (CellView.stored_columns): the model is the same, bit for bit, as with
    block-wide vectors."""
    from dask_scd.data import cells as cell_module

    X, y, blocks = make_onehot(600, 3, 400, random_state=1)
    grid = to_grid(X, y, str(tmp_path / "wide.zarr"), row_chunk=100, blocks=blocks)
    view = cell_module.CellView(grid.read_cell(0, 0))
    assert view.stored_columns is not None and len(view.stored_columns) < 100

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return dask_scd.fit(
                grid,
                loss=loss,
                penalty=penalty,
                alpha=1e-3,
                tol=1e-15,
                max_iter=4,
                solver="block_scd",
                random_state=0,
            )

    compact = run()
    cell_module.CACHE.clear()
    monkeypatch.setattr(cell_module.CellView, "stored_columns", property(lambda self: None))
    wide = run()
    cell_module.CACHE.clear()
    assert np.array_equal(compact.coef_, wide.coef_)
    assert compact.intercept_ == wide.intercept_
    assert compact.history_.relative_gap == wide.history_.relative_gap


def test_wide_blocks_over_many_row_chunks_are_summed_in_a_tree(tmp_path, clients, monkeypatch):
    """Past INLINE_GROUPS row chunks, a block whose statistics would weigh more than
    TREE_BYTES in one task is summed in a tree of tasks (what keeps a small worker alive on
    a 200k-column block): the same model on 1 and 2 workers, bit for bit, the flat sum's
    model to rounding, and the optimum."""
    from dask_scd.engines.block.block_scd import _BlockSCD

    X, y, blocks = make_onehot(1200, 3, 60, set_valued=1, set_size=3, random_state=2)
    grid = to_grid(X, y, str(tmp_path / "tall.zarr"), row_chunk=100, blocks=blocks)
    assert grid.n_row_chunks == 12
    flat = _fixed_epochs(grid, clients(2), "logistic")
    monkeypatch.setattr(_BlockSCD, "TREE_BYTES", 0)
    trees = [_fixed_epochs(grid, clients(k), "logistic") for k in (1, 2)]
    np.testing.assert_array_equal(trees[1].coef_, trees[0].coef_)
    assert trees[1].intercept_ == trees[0].intercept_
    np.testing.assert_allclose(trees[0].coef_, flat.coef_, rtol=0, atol=1e-12)
    result = dask_scd.fit(
        grid,
        loss="logistic",
        alpha=ALPHA,
        tol=1e-9,
        solver="block_scd",
        client=clients(2),
        random_state=0,
        max_iter=200,
    )
    reference = dask_scd.fit(X, y, loss="logistic", alpha=ALPHA, tol=1e-12, solver="newton")
    assert result.dual_gap_ <= 1e-9
    assert result.primal_ == pytest.approx(reference.primal_, rel=1e-8)


def test_l1_certificate_is_the_in_memory_one(onehot, clients):
    """The grid's L1 certificate takes the rescaled lasso dual point κa as the in-memory
    engines do (objectives.certificate): without it, a few correlations above α priced
    every violating feature at the Lipschitz bound, and on a 500k-row Criteo-like grid the
    relative gap stayed above 10 while the objective had converged to 1e-12."""
    from dask_scd import objectives as obj

    X, y, _, grid, _ = onehot
    result = _fixed_epochs(grid, clients(2), "logistic", epochs=2, penalty="l1")
    problem = obj.Problem("logistic", ALPHA, 1.0, True)
    reference = obj.certificate(problem, X, y, result.coef_, result.intercept_)
    assert result.dual_gap_ == pytest.approx(reference.relative_gap, rel=1e-8, abs=1e-14)


def test_provable_steps_are_certain_decreases(rng):
    """Logistic, pure block, no line search: every coordinate's step is one of 4^-k of
    its Newton step (or 0), its true objective change is below the Armijo line, and the
    coordinates whose bound could not prove the full step are counted as unsure."""
    from dask_scd import objectives as obj
    from dask_scd.engines.block import block_ops as ops
    from dask_scd.kernels.scalar import ARMIJO

    n, p = 4000, 30
    weights = np.r_[np.ones(p - 10), np.full(10, 1e-3)]  # rare columns take long steps
    cols = rng.choice(p, n, p=weights / weights.sum())
    X = sp.csc_matrix((np.ones(n), (np.arange(n), cols)), shape=(n, p))
    y = np.sign(rng.normal(size=n))
    margins = 3.0 * rng.normal(size=n)
    problem = obj.Problem("logistic", 1e-7, 0.5, True)
    theta = 0.3 * rng.normal(size=p)
    stats = [
        ops.block_stats(X[: n // 2], y[: n // 2], margins[: n // 2], "logistic"),
        ops.block_stats(X[n // 2 :], y[n // 2 :], margins[n // 2 :], "logistic"),
    ]
    full = ops.block_direction(problem, n, theta, False, *stats)
    step = ops.block_direction(problem, n, theta, False, *stats, provable=True)
    moving = full["direction"] != 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(moving, step["delta"] / full["direction"], 0.0)
    assert np.all(np.isin(ratio[moving], np.r_[ops.PROVABLE_STEPS, 0.0]))
    assert step["unsure"] == np.count_nonzero(ratio[moving] < 1.0) > 0
    assert np.count_nonzero(ratio == 1.0) > p // 2
    np.testing.assert_array_equal(step["theta"], theta + step["delta"])
    # Each coordinate's true change (its examples are its own) is below the Armijo line.
    base = obj.loss_value("logistic", y, margins)
    moved = obj.loss_value("logistic", y, margins + X @ step["delta"])
    change = (
        np.bincount(cols, moved - base, minlength=p) / n
        + obj.penalty_terms(problem, theta + step["delta"])
        - obj.penalty_terms(problem, theta)
    )
    g = sum(s["g"] for s in stats) / n
    model = (
        g * step["delta"]
        + obj.penalty_terms(problem, theta + step["delta"])
        - obj.penalty_terms(problem, theta)
    )
    assert np.all(change[moving] <= ARMIJO * model[moving] + 1e-15)
    assert np.all(model[ratio > 0] < 0)


def test_unsure_blocks_run_the_trials_and_resume_alike(clients, tmp_path):
    """Rare one-hot values at a weak alpha: some blocks' provable steps are cut, so they
    run the line search in the next epoch; the set is saved with the checkpoint and a
    resumed fit takes the same steps as one that never stopped."""
    import json

    X, y, blocks = make_onehot(4000, 4, [5, 50, 500, 2000], random_state=0)
    grid = to_grid(X, y, str(tmp_path / "rare.zarr"), row_chunk=1000, blocks=blocks)
    client = clients(2)
    checkpoint = tmp_path / "fit.npz"
    kw = dict(
        loss="logistic", alpha=1e-6, tol=1e-15, solver="block_scd", random_state=0, client=client
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        dask_scd.fit(grid, max_iter=2, checkpoint=checkpoint, **kw)
        meta = json.loads(str(np.load(checkpoint)["meta"]))
        assert meta["engine"]["unsure"]  # some block runs the trials in epoch 3
        resumed = dask_scd.fit(grid, max_iter=5, checkpoint=checkpoint, resume=True, **kw)
        straight = dask_scd.fit(grid, max_iter=5, **kw)
    np.testing.assert_array_equal(resumed.coef_, straight.coef_)
    assert resumed.intercept_ == straight.intercept_
    assert straight.history_.primal == sorted(straight.history_.primal, reverse=True)


# ------------------------------------------------------------ collective iterations


@pytest.mark.parametrize(
    "loss,penalty", [("logistic", "l2"), ("logistic", "l1"), ("squared", "elasticnet")]
)
def test_collective_iterations_are_the_task_graphs_bits(
    onehot, clients, monkeypatch, loss, penalty
):
    """One task per worker exchanging statistics directly gives the same iterates as the
    task graph, bit for bit (pure blocks, the Gram block, the intercept, the coarse step
    over all or over the non-zero coefficients), on 2 and 4 workers."""
    from dask_scd.engines.block.block_scd import _BlockSCD

    *_, grid, _ = onehot
    monkeypatch.setattr(_BlockSCD, "collective", False)
    graph = _fixed_epochs(grid, clients(2), loss, epochs=4, penalty=penalty)
    monkeypatch.setattr(_BlockSCD, "collective", True)

    class Moved(AssertionError):
        """A member ran on a worker other than the one keeping its margins."""

    def no_graph(self, *args, **kwargs):
        reasons = self.fallbacks
        if reasons and all("are not kept here" in reason for reason in reasons):
            raise Moved(reasons)
        raise AssertionError(f"a collective iteration fell back to the task graph: {reasons}")

    def collective_fit(workers):
        # A member's placement is a preference (allow_other_workers: a lost worker must
        # not hang the fit); on a machine loaded by the parallel test run the scheduler
        # once put a member elsewhere, which aborts it and redoes the iteration as a task
        # graph, as designed. Such a fit is run again; any other fallback fails the test.
        for attempt in range(3):
            try:
                return _fixed_epochs(grid, clients(workers), loss, epochs=4, penalty=penalty)
            except Moved:
                if attempt == 2:
                    raise

    monkeypatch.setattr(_BlockSCD, "_graph_epoch", no_graph)
    for workers in (1, 2, 4):  # one worker of one thread: a single member, anywhere
        together = collective_fit(workers)
        np.testing.assert_array_equal(together.coef_, graph.coef_)
        assert together.intercept_ == graph.intercept_
        np.testing.assert_array_equal(together.history_.primal, graph.history_.primal)
        np.testing.assert_array_equal(together.history_.relative_gap, graph.history_.relative_gap)
        seconds = together.extras_["member_seconds"]
        assert len(seconds) == together.n_iter_
        assert all(
            s["epoch_and_coarse"] > 0 and s["certificate"] > 0 and s["waiting"] >= 0
            for s in seconds
        )
    assert "member_seconds" not in graph.extras_
    if penalty == "l1":
        assert 0 < np.count_nonzero(graph.coef_) < graph.coef_.size


def test_a_lost_member_falls_back_to_the_task_graph(onehot, monkeypatch):
    """A member that cannot meet the others (here: its exchange fails in the second
    iteration) makes the engine redo that iteration as a task graph from the same
    margins: the same model as an undisturbed fit, and the fit goes on collectively."""
    from dask_scd.engines.block.block_scd import _BlockSCD
    from dask_scd.runtime import collective

    *_, grid, _ = onehot
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        undisturbed = _fixed_epochs(grid, c, "logistic", epochs=4, penalty="l1")
        graph_epochs = []
        real_graph = _BlockSCD._graph_epoch

        def counted(self, *args, **kwargs):
            graph_epochs.append(1)
            return real_graph(self, *args, **kwargs)

        real_exchange = collective.Member.exchange
        exchanges = []

        def failing(self, part):
            exchanges.append(self.token)
            if len(set(exchanges)) == 2 and self.stage == 3:  # iteration 2, mid-epoch
                raise collective.Aborted("lost")
            return real_exchange(self, part)

        monkeypatch.setattr(_BlockSCD, "_graph_epoch", counted)
        monkeypatch.setattr(collective.Member, "exchange", failing)
        disturbed = _fixed_epochs(grid, c, "logistic", epochs=4, penalty="l1")
    assert len(graph_epochs) == 1  # iteration 2 alone, then collective again
    assert len(set(exchanges)) == disturbed.n_iter_ >= 3  # each iteration tried collectively
    np.testing.assert_array_equal(disturbed.coef_, undisturbed.coef_)
    assert disturbed.intercept_ == undisturbed.intercept_
    # The result says which iteration gave way, and why.
    assert len(disturbed.extras_["collective_fallbacks"]) == 1
    assert "lost" in disturbed.extras_["collective_fallbacks"][0]
    assert "collective_fallbacks" not in undisturbed.extras_


def _disturbed_fit(grid, monkeypatch, loss, forget):
    """4 epochs on 2 in-process workers, undisturbed and with ``forget(state)`` as the
    callback: (undisturbed, disturbed, how many iterations ran as the task graph)."""
    from dask_scd.engines.block.block_scd import _BlockSCD

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        undisturbed = _fixed_epochs(grid, c, loss, epochs=4)
        graph_epochs = []
        real_graph = _BlockSCD._graph_epoch

        def counted(self, *args, **kwargs):
            graph_epochs.append(1)
            return real_graph(self, *args, **kwargs)

        monkeypatch.setattr(_BlockSCD, "_graph_epoch", counted)
        disturbed = _fixed_epochs(grid, c, loss, epochs=4, callback=forget)
    return undisturbed, disturbed, len(graph_epochs)


def test_margins_not_kept_are_recomputed(onehot, monkeypatch):
    """Margins the members should have kept but did not find (their worker process was
    replaced between iterations) are recomputed from (θ, b) by ordinary tasks, and that
    iteration runs as the task graph: the same model."""
    from dask_scd.engines.block import block_collective

    *_, grid, _ = onehot

    def forget(state):
        if state["epoch"] == 2:
            with block_collective._kept_lock:
                block_collective._kept.clear()

    undisturbed, disturbed, graph_epochs = _disturbed_fit(grid, monkeypatch, "squared", forget)
    assert graph_epochs == 1
    np.testing.assert_array_equal(disturbed.coef_, undisturbed.coef_)
    assert disturbed.intercept_ == undisturbed.intercept_
    np.testing.assert_array_equal(
        disturbed.history_.relative_gap, undisturbed.history_.relative_gap
    )


def test_fixed_parts_not_kept_end_the_iteration_alike(onehot, monkeypatch):
    """The members send the parts of a block's statistics that do not change between
    epochs once per fit; where the others no longer hold them (a replaced worker), that
    iteration runs as the task graph: the same model."""
    from dask_scd.engines.block import block_collective

    *_, grid, _ = onehot
    held = []

    def forget(state):
        with block_collective._static_lock:
            held.append(len(block_collective._static))
            if state["epoch"] == 2:
                block_collective._static.clear()

    undisturbed, disturbed, graph_epochs = _disturbed_fit(grid, monkeypatch, "logistic", forget)
    assert held[0] > 0  # the others' cells' fixed parts, kept after the first iteration
    assert graph_epochs == 1
    np.testing.assert_array_equal(disturbed.coef_, undisturbed.coef_)
    assert disturbed.intercept_ == undisturbed.intercept_


def test_a_certificate_that_ends_the_fit_is_whole():
    """Iterations that do not end a fit send the client their certificate without the
    correlation Xᵀa/n (and the coordinate gaps, where nothing reads them); one at or
    below the tolerance is sent whole."""
    from dask_scd import objectives as obj
    from dask_scd.engines.block.block_collective import _slimmed

    gaps, corr = np.ones(3), np.arange(3.0)
    far = {"coef": gaps, "certificate": obj.Certificate(1.0, 0.5, gaps, 0.0, corr)}
    near = {"coef": gaps, "certificate": obj.Certificate(1.0, 1.0 - 1e-9, gaps, 0.0, corr)}
    slim = _slimmed(far, 1e-6)["certificate"]
    assert slim.correlation is None and slim.coordinate_gaps is None
    assert slim.relative_gap == far["certificate"].relative_gap
    assert _slimmed(far, -1e-6)["certificate"].coordinate_gaps is gaps
    assert _slimmed(near, 1e-6) is near


def test_a_member_runs_its_groups_on_its_workers_threads(onehot, monkeypatch):
    """One worker of two threads: its member runs its two groups of row chunks on both
    threads at once, the same bits as the task graph."""
    from dask_scd.engines.block.block_scd import _BlockSCD

    *_, grid, _ = onehot
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        monkeypatch.setattr(_BlockSCD, "collective", False)
        graph = _fixed_epochs(grid, c, "logistic", epochs=3, penalty="l1")
        monkeypatch.setattr(_BlockSCD, "collective", True)
        pools = []
        from dask_scd.engines.block import block_collective

        real = block_collective._GroupPool.__init__

        def counted(self, worker, n_groups):
            real(self, worker, n_groups)
            pools.append(self.pool is not None)

        monkeypatch.setattr(block_collective._GroupPool, "__init__", counted)
        together = _fixed_epochs(grid, c, "logistic", epochs=3, penalty="l1")
    assert pools and all(pools)
    np.testing.assert_array_equal(together.coef_, graph.coef_)
    assert together.intercept_ == graph.intercept_
    np.testing.assert_array_equal(together.history_.relative_gap, graph.history_.relative_gap)


@pytest.mark.parametrize("one_hot", [False, True])
def test_pure_cells_read_by_rows_give_the_column_sums(one_hot):
    """A pure cell's statistics and margins through its by-rows form (the fused pass)
    equal those of the column-major kernels (a one-hot cell keeps no values); an impure
    cell has no by-rows form."""
    from dask_scd.data.cells import CellView, pure_rows
    from dask_scd.engines.block import block_ops as ops

    rng = np.random.default_rng(0)
    n, width = 500, 40
    rows = rng.choice(n, 300, replace=False)  # 200 rows without an entry
    cols = np.r_[rng.integers(0, 8, 150), rng.integers(30, 40, 150)]  # 22 empty columns
    values = np.ones(300) if one_hot else rng.normal(size=300)
    cell = sp.csc_matrix((values, (rows, cols)), shape=(n, width))
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    margins = rng.normal(size=n)
    step = {"delta": rng.normal(size=width)}
    assert len(pure_rows(CellView(cell)).value) == (0 if one_hot else n)
    for loss in ("logistic", "squared"):
        view = CellView(cell)
        assert pure_rows(view) is not None and view.stored_columns is not None
        fused_margins, fused = ops.apply_then_stats(margins, view, view, y, step, loss)
        expected_margins = margins + CellView(cell).matvec(step["delta"])
        np.testing.assert_allclose(fused_margins, expected_margins, rtol=1e-15)
        expected = ops.block_stats(CellView(cell.toarray()), y, expected_margins, loss)
        for key in ("g", "h"):
            full = np.zeros(width)
            full[fused["cols"]] = fused[key]
            np.testing.assert_allclose(full, expected[key], rtol=1e-12, atol=1e-15)
    assert ops.block_stats(view, y, margins, "logistic")["cube"].shape == (18,)
    impure = sp.csc_matrix(np.ones((4, 2)))
    assert pure_rows(CellView(impure)) is None
    before = margins.copy()  # the task's input is not modified
    ops.block_stats(view, y, margins, "logistic")
    np.testing.assert_array_equal(margins, before)


def test_a_pure_grid_cell_is_cached_by_rows_only(tmp_path, monkeypatch):
    """The passes read a pure grid cell by rows: its column-major form is read to make
    that form, once, and not cached beside it (out of core the two shared the cache and
    both were read again each pass); an impure cell's column-major form is cached, and
    read once too."""
    from dask_scd.data import cache as cell_cache
    from dask_scd.data import cells
    from dask_scd.data.cells import CellRef

    X, y = make_onehot(200, 3, 6, random_state=0)[:2]
    X = sp.hstack([X, sp.random(200, 3, density=0.9, random_state=0)]).tocsr()  # impure
    fields = [np.arange(6 * k, 6 * k + 6) for k in range(3)] + [np.arange(18, 21)]
    grid = to_grid(X, y, tmp_path / "g", row_chunk=100, blocks=fields)
    cache = cell_cache.CellCache(1 << 30)
    monkeypatch.setattr(cells, "CACHE", cache)
    pure = [b for b in range(grid.n_blocks) if grid.purity[b]]
    impure = [b for b in range(grid.n_blocks) if not grid.purity[b]]
    assert pure and impure
    for _pass in range(2):
        for r in range(grid.n_row_chunks):
            for b in range(grid.n_blocks):
                ref = CellRef(grid.path, grid.grid_id, r, b, grid.store_version)
                rows = cells.pure_rows(ref)
                assert (rows is not None) == (b in pure)
                if rows is None:
                    assert cells.cell_view(ref).n_columns == len(fields[b])
    cells_read = grid.n_row_chunks * grid.n_blocks
    assert cache.counts["reads"] == cells_read  # each cell once, over both passes
    # The coarse step's row sums read a pure cell by rows too: the same bits, no read.
    from dask_scd.engines.block import block_coarse

    for b in range(grid.n_blocks):
        ref = CellRef(grid.path, grid.grid_id, 1, b, grid.store_version)
        live = (np.arange(len(fields[b])) % 2).astype(np.float64)
        column_major = cells.CellView(grid.read_cell(1, b))
        np.testing.assert_array_equal(
            block_coarse._cell_matvec(ref, lambda k: live), column_major.matvec(live)
        )
    assert cache.counts["reads"] == cells_read
    held = {key[-1] if key[-1] != "rows" else key[-2:] for key in cache._items}
    for b in pure:
        assert (b, "rows") in held and b not in held
    for b in impure:
        assert b in held and (b, "rows") in held  # (the "not pure" mark)


def test_out_of_core_block_iterations_read_each_pure_cell_once(tmp_path, monkeypatch):
    """With no room in the cache, the block iterations of one row chunk (the last step's
    apply fused with the next block's statistics, then its line search) read each cell
    once: the last block's cell is read before the next one's, which the row chunk keeps
    for its line search and the next apply (the other way round, three reads a cell)."""
    from dask_scd.data import cache as cell_cache
    from dask_scd.data import cells
    from dask_scd.data.cells import CellRef
    from dask_scd.engines.block import block_ops as ops

    X, y = make_onehot(200, 4, 6, random_state=0)[:2]
    fields = [np.arange(6 * k, 6 * k + 6) for k in range(4)]
    grid = to_grid(X, y, tmp_path / "g", row_chunk=200, blocks=fields)
    monkeypatch.setattr(cell_cache, "_resident_bytes", lambda: 1000)
    cache = cell_cache.CellCache(0, ceiling=1000)
    cache.pause_at = 1 << 40
    monkeypatch.setattr(cells, "CACHE", cache)
    refs = [CellRef(grid.path, grid.grid_id, 0, b, grid.store_version) for b in range(4)]
    labels = np.asarray(grid.read_labels(0), dtype=np.float64)
    margins = np.zeros(len(labels))
    for b in range(3):
        step = {"delta": np.full(6, 0.1)}
        margins, _ = ops.apply_then_stats(margins, refs[b], refs[b + 1], labels, step, "logistic")
        assert cells.pure_rows(refs[b + 1]) is not None  # the line search's read
    assert cache.counts["reads"] == 4


@pytest.mark.parametrize("loss", ["logistic", "squared_hinge"])
def test_pure_cells_line_search_by_rows_gives_the_column_trials(loss):
    """A pure cell's per-coordinate line-search trials read by rows equal the
    column-major kernel's, at its stored columns."""
    from dask_scd import objectives as obj
    from dask_scd.data.cells import CellView
    from dask_scd.engines.block import block_ops as ops

    rng = np.random.default_rng(1)
    n, width = 400, 30
    rows = rng.choice(n, 250, replace=False)
    cols = np.r_[rng.integers(0, 5, 125), rng.integers(20, 30, 125)]
    cell = sp.csc_matrix((rng.normal(size=250), (rows, cols)), shape=(n, width))
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    margins = rng.normal(size=n)
    problem = obj.Problem(loss, 0.1, 0.0, True)
    direction = {"direction": rng.normal(size=width)}
    by_rows = ops.block_trials(CellView(cell), y, margins, direction, problem, True)
    dense = ops.block_trials(CellView(cell.toarray()), y, margins, direction, problem, True)
    full = np.zeros_like(dense["trials"])
    full[:, by_rows["cols"]] = by_rows["trials"]
    np.testing.assert_allclose(full, dense["trials"], rtol=1e-12, atol=1e-15)


def test_columns_without_a_value_do_not_hold_back_the_coarse_step(tmp_path, clients):
    """to_grid's colouring puts the columns that never occur into its first block; the
    coarse step shifts only the columns that hold a value, so block SCD converges as it
    does without them (it stalled: the empty columns' penalty held the block's shift
    back) and their coefficients stay 0."""
    X, y, _ = make_onehot(3000, 4, 10, random_state=0)
    X = sp.hstack([X, sp.csr_matrix((3000, 20_000))], format="csr")
    grid = to_grid(X, y, str(tmp_path / "g.zarr"), row_chunk=1000)
    assert len(grid.blocks[0]) > 20_000  # a value block holding the empty columns
    alpha = 1.0 / 3000
    kw = dict(loss="logistic", alpha=alpha, tol=1e-9, solver="block_scd", random_state=0)
    memory = dask_scd.fit(X, y, **kw)
    on_grid = dask_scd.fit(grid, client=clients(2), max_iter=3 * memory.n_iter_, **kw)
    assert on_grid.dual_gap_ <= 1e-9 * abs(on_grid.history_.primal[-1]) * 1.0001
    assert not np.any(on_grid.coef_[-20_000:])
    np.testing.assert_allclose(on_grid.history_.primal[-1], memory.history_.primal[-1], rtol=1e-9)


def test_the_preflight_reads_a_cell_once_for_its_check_and_row_sums(tmp_path, monkeypatch):
    """One task per row chunk checks its cells and makes the coarse step's row sums: the
    same reports and sums as the two apart, each cell read from the store once (out of
    core a task per cell and one per row chunk read every cell twice)."""
    from dask_scd.data import cache as cell_cache
    from dask_scd.data import cells
    from dask_scd.data.cells import CellRef

    X, y = make_onehot(300, 4, 6, random_state=1)[:2]
    X = sp.hstack([X, sp.random(300, 5, density=0.5, random_state=2, format="csr")]).tocsr()
    fields = [np.arange(6 * k, 6 * k + 6) for k in range(4)] + [np.arange(24, 29)]
    grid = to_grid(X, y, tmp_path / "g", row_chunk=300, blocks=fields)
    refs = [CellRef(grid.path, grid.grid_id, 0, b, grid.store_version) for b in range(5)]
    apart_reports = [
        cells.inspect_cell(ref, f"cell (row chunk 0, block {b})") for b, ref in enumerate(refs)
    ]
    apart = block_coarse.block_row_sums(refs, True)

    monkeypatch.setattr(cell_cache, "_resident_bytes", lambda: 1000)
    cache = cell_cache.CellCache(0, ceiling=1000)  # nothing fits: out of core
    cache.pause_at = 1 << 40
    monkeypatch.setattr(cells, "CACHE", cache)
    reads = []
    read_view = cells._read_view
    monkeypatch.setattr(cells, "_read_view", lambda cell: reads.append(cell.b) or read_view(cell))
    reports, sums = block_coarse.inspect_row_chunk(refs, "row chunk 0", True, True)
    assert reads == [0, 1, 2, 3, 4]
    for got, want in zip(reports, apart_reports):
        assert got["max_per_row"] == want["max_per_row"] and got["nbytes"] == want["nbytes"]
        np.testing.assert_array_equal(got["columns"], want["columns"])
    np.testing.assert_array_equal(sums.counts, apart.counts)
    np.testing.assert_array_equal(sums.column_of, apart.column_of)
    assert block_coarse.inspect_row_chunk(refs, "row chunk 0", False, True)[1] is None


def test_a_pure_cell_is_cached_once_by_rows_after_its_check(tmp_path, monkeypatch):
    """The preflight's check reads a cell's column-major form; once its by-rows form is
    made, that form alone stays in the cache for a pure cell (in core both took a
    cell's bytes, and a grid that fitted its workers' caches was read again each pass);
    an impure cell keeps its column-major form."""
    from dask_scd.data import cache as cell_cache
    from dask_scd.data import cells
    from dask_scd.data.cells import CellRef

    X, y = make_onehot(300, 3, 6, random_state=1)[:2]
    X = sp.hstack([X, sp.random(300, 5, density=0.5, random_state=2, format="csr")]).tocsr()
    fields = [np.arange(6 * k, 6 * k + 6) for k in range(3)] + [np.arange(18, 23)]
    grid = to_grid(X, y, tmp_path / "g", row_chunk=300, blocks=fields)
    refs = [CellRef(grid.path, grid.grid_id, 0, b, grid.store_version) for b in range(4)]
    cache = cell_cache.CellCache(1 << 30)
    monkeypatch.setattr(cells, "CACHE", cache)
    block_coarse.inspect_row_chunk(refs, "row chunk 0", True, True)
    kinds = sorted(
        (key[-2], key[-1]) if key[-1] == "rows" else (key[-1], "columns") for key in cache._items
    )
    assert kinds == [(0, "rows"), (1, "rows"), (2, "rows"), (3, "columns"), (3, "rows")]
    assert (
        cache.nbytes
        == sum(cells.pure_rows(ref).nbytes for ref in refs[:3]) + cells.cell_view(refs[3]).nbytes
    )


def test_a_classified_grid_s_labels_are_cached_at_one_byte_a_row(tmp_path, monkeypatch):
    """Every task of a row chunk reads its labels: the cache keeps ±1 labels as int8 (out
    of core, float64 labels took most of what a worker may keep beyond its cache) and
    the tasks get the same float64 ±1; regression labels stay float64."""
    from dask_scd.data import cache as cell_cache
    from dask_scd.data import cells
    from dask_scd.data.cells import LabelRef

    X, y = make_onehot(50, 2, 3, random_state=0)[:2]
    y = np.where(y > 0, "yes", "no")
    grid = to_grid(X, np.where(y == "yes", 7.0, 3.0), tmp_path / "g", row_chunk=20)
    cache = cell_cache.CellCache(1 << 30)
    monkeypatch.setattr(cells, "CACHE", cache)
    ref = LabelRef(grid.path, grid.grid_id, 1, (3.0, 7.0), grid.store_version)
    got = cells.labels(ref)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.where(y[20:40] == "yes", 1.0, -1.0))
    assert cache.nbytes == 20  # one byte a row
    raw = cells.labels(LabelRef(grid.path, grid.grid_id, 2, None, grid.store_version))
    assert raw.dtype == np.float64 and set(np.unique(raw)) <= {3.0, 7.0}
