"""The runtime's strategies and tiers: block orders, residency policies under a budget,
the byte-bounded LRU, and the tiers' exact accounting of bytes moved."""

import numpy as np
import pytest
import scipy.sparse as sp

from dask_scd import objectives as obj
from dask_scd.data.cache import ByteLRU
from dask_scd.grid import open_grid, to_grid
from dask_scd.runtime import strategies
from dask_scd.runtime.tiers import GridStore, HostMemory, MatrixStore, Tier


def test_block_orders():
    rng = np.random.default_rng(0)
    assert strategies.block_order("cyclic", None).order(4, None, rng) == [0, 1, 2, 3]
    shuffled = strategies.block_order("shuffle", None).order(6, None, np.random.default_rng(1))
    assert sorted(shuffled) == list(range(6))
    assert shuffled == [int(b) for b in np.random.default_rng(1).permutation(6)]
    slices = [slice(0, 2), slice(2, 3), slice(3, 5)]
    cert = obj.Certificate(1.0, 0.0, np.array([0.1, 0.0, 0.5, 0.2, 0.2]), 0.0)
    assert strategies.block_order("gap", slices).order(3, cert, rng) == [1, 2, 0]


@pytest.mark.parametrize("name", strategies.RESIDENCIES)
def test_residency_fits_the_budget(name):
    rng = np.random.default_rng(0)
    sizes = np.array([30, 10, 20, 40, 10, 25])
    gaps = np.array([0.0, 5.0, 1.0, 2.0, 3.0, 0.5])
    policy = strategies.residency(name, weights=sizes.astype(float))
    seen = set()
    for _ in range(20):
        chosen = policy.choose(sizes, 60, gaps, rng)
        assert sizes[chosen].sum() <= 60 and len(set(chosen)) == len(chosen)
        seen.update(chosen.tolist())
    if name == "duhl":  # the largest gaps, greedily: 1, 4, 3 (60 bytes), then nothing fits
        assert policy.choose(sizes, 60, gaps, rng).tolist() == [1, 3, 4]
        assert policy.choose(sizes, 50, gaps, rng).tolist() == [1, 2, 4]  # 3 no longer fits
    else:  # over rounds, every chunk gets its turn
        assert seen == set(range(6))


def test_sequential_wraps_around():
    policy = strategies.residency("sequential")
    sizes = np.full(5, 10)
    rounds = [policy.choose(sizes, 20, None, None).tolist() for _ in range(4)]
    assert rounds == [[0, 1], [2, 3], [0, 4], [1, 2]]


def test_unknown_residency():
    with pytest.raises(ValueError, match="not one of"):
        strategies.residency("lifo")


def test_byte_lru_counts():
    lru = ByteLRU(100, lambda v: v.nbytes)
    for k in range(4):
        lru.insert(k, np.zeros(5), 40)  # zict evicts beyond 100 bytes
    assert list(lru.keys) == [2, 3] and lru.nbytes == 80
    assert lru.loads == 4 and lru.bytes_moved == 160 and lru.evictions == 2
    assert lru.lookup(2)[1] and list(lru.keys) == [3, 2]
    assert lru.evict_oldest() == 40 and list(lru.keys) == [2]


@pytest.mark.parametrize("sparse", [False, True])
def test_matrix_store_chunks_are_the_lines_of_x(sparse, rng):
    X = rng.normal(size=(30, 11))
    X[np.abs(X) < 0.8] = 0.0
    data = sp.csr_matrix(X) if sparse else X
    store = MatrixStore(data, "columns", 4)
    assert store.bounds.tolist() == [0, 4, 8, 11]
    piece = store.read(1)
    np.testing.assert_allclose(piece.dot(np.ones(30)), X[:, 4:8].sum(axis=0))
    v = rng.normal(size=30)
    np.testing.assert_allclose(store.line_dots(np.array([1, 9]), v), X[:, [1, 9]].T @ v)
    np.testing.assert_allclose(store.dot(v), X.T @ v)
    rows = MatrixStore(data, "rows", 7)
    w = rng.normal(size=11)
    np.testing.assert_allclose(rows.dot(w), X @ w)
    np.testing.assert_allclose(rows.scatter(v), X.T @ v)


def test_tier_accounting_is_exact(rng):
    X = rng.normal(size=(20, 10))
    store = MatrixStore(X, "columns", 2)  # 5 chunks of 2 columns, 320 bytes each
    tier = Tier(store, HostMemory(), 3 * 320)
    assert tier.make_resident([0, 1]) == 2
    assert tier.make_resident([1, 2, 3]) == 2  # 1 stays: no load
    assert (tier.bytes_moved, tier.swaps, tier.evictions) == (4 * 320, 4, 1)
    matrix, lines = tier.matrix()
    assert lines.tolist() == [2, 3, 4, 5, 6, 7]
    np.testing.assert_array_equal(matrix.data.reshape(6, 20), X[:, 2:8].T)
    assert tier.peak_bytes == 3 * 320
    with pytest.raises(ValueError, match="do not fit the budget"):
        tier.make_resident([0, 1, 2, 3])
    with pytest.raises(ValueError, match="smaller than one chunk"):
        Tier(store, HostMemory(), 319)


def test_grid_store_reads_the_cells(tmp_path, rng):
    X = rng.normal(size=(50, 12))
    y = rng.normal(size=50)
    to_grid(X, y, str(tmp_path / "g.zarr"), row_chunk=20, blocks=5)
    grid = open_grid(tmp_path / "g.zarr")
    store = GridStore(grid, "columns")
    assert store.bounds.tolist() == [0, 5, 10, 12]
    order = grid.feature_order
    np.testing.assert_allclose(store.read(1).data.reshape(5, 50), X[:, order[5:10]].T)
    v = rng.normal(size=50)
    np.testing.assert_allclose(store.dot(v), X[:, order].T @ v)
    assert store.bytes_read == X.nbytes
    np.testing.assert_allclose(store.labels(), y)
    rows = GridStore(grid, "rows")
    assert rows.bounds.tolist() == [0, 20, 40, 50]
    np.testing.assert_allclose(rows.scatter(v), X[:, order].T @ v)


def test_tune_malloc_only_under_dasks_trim_setting(monkeypatch):
    """The mmap threshold is raised only in a process started with dask's
    MALLOC_TRIM_THRESHOLD_ (a nanny's worker), once; elsewhere nothing changes."""
    import platform

    from dask_scd.runtime import collective

    monkeypatch.setattr(collective, "_malloc_tuned", False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    assert collective.tune_malloc() is False
    assert collective._malloc_tuned is False
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert collective.tune_malloc() is glibc
    assert collective._malloc_tuned is True
    assert collective.tune_malloc() is False  # once per process


def test_malloc_thresholds_shrink_with_the_memory_limit():
    """glibc's free memory kept by the raised thresholds is unmanaged memory: under a
    small memory limit they shrink with it (a 640 MiB worker out of core stalled above
    dask's pause threshold with 64 MiB kept), and below 4 MiB of limit nothing changes."""
    from dask_scd.runtime.collective import MMAP_THRESHOLD, TRIM_THRESHOLD, malloc_thresholds

    MiB = 2**20
    assert malloc_thresholds(None) == (TRIM_THRESHOLD, MMAP_THRESHOLD)
    assert malloc_thresholds(8 << 30) == (TRIM_THRESHOLD, MMAP_THRESHOLD)
    assert malloc_thresholds(640 * MiB) == (20 * MiB, 20 * MiB // 16)
    trim, mmap = malloc_thresholds(64 * MiB)
    assert trim == 2 * MiB and mmap == 128 * 2**10  # glibc's default: nothing to raise


@pytest.mark.parametrize("n_rows, slots", [(50, 2), (50, 3), (7, 4), (3, 2), (200, 1)])
def test_row_chunk_groups_are_dealt_evenly_to_the_worker_threads(n_rows, slots):
    """Groups of row chunks are a multiple of the worker threads (where there are that
    many row chunks), so each thread's run of groups holds as many row chunks as any
    other's to within one group: 13 groups of 50 row chunks on 2 workers gave one 27."""
    import types

    from dask_scd.runtime.cluster import ClusterRuntime

    stub = types.SimpleNamespace(
        n_row_chunks=n_rows,
        pin=True,
        row_counts=[262_144] * n_rows,
        GROUP_ROWS=1_048_576,
        _slots=lambda: [f"w{k}" for k in range(slots)],
    )
    groups = ClusterRuntime._make_groups(stub)
    assert [r for g in groups for r in g] == list(range(n_rows))
    G = len(groups)
    assert G == n_rows or G % slots == 0
    per_slot = [
        sum(len(groups[g]) for g in range(G) if g * slots // G == s) for s in range(min(slots, G))
    ]
    assert max(per_slot) - min(per_slot) <= max(len(g) for g in groups)
    if (n_rows, slots) == (50, 2):
        assert per_slot == [25, 25]


def test_aborted_exchanges_are_remembered_up_to_a_bound(monkeypatch):
    """abort() records the token for the members still waiting on it, the most recent
    ABORTED_KEPT tokens only: a long fit's many aborts do not grow the worker's memory."""
    from dask_scd.runtime import collective

    monkeypatch.setattr(collective, "_aborted", {})
    monkeypatch.setattr(collective, "_box", {("t-3", 0, 1): "part", ("other", 0, 1): "x"})
    for i in range(collective.ABORTED_KEPT + 10):
        assert collective.abort(f"t-{i}") is True
    assert len(collective._aborted) == collective.ABORTED_KEPT
    assert "t-9" not in collective._aborted and "t-10" in collective._aborted
    assert f"t-{collective.ABORTED_KEPT + 9}" in collective._aborted
    assert collective._box == {("other", 0, 1): "x"}  # the aborted exchange's parts dropped
    collective._deliver(("t-1000", 1, 0), "late")  # a part of an aborted exchange: dropped
    assert ("t-1000", 1, 0) not in collective._box
