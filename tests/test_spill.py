"""The cell cache's second tier (dask_scd.data.spill): out of core, a cell the cache has
no room for is decoded from the store once and read back from a local file after that,
the same bits."""

import os
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from distributed import Client
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd.data import cache as cell_cache
from dask_scd.data import cells
from dask_scd.data.cells import CellRef, CellView, LabelRef, PureRows
from dask_scd.data.spill import Spill, from_environment
from dask_scd.datasets import make_onehot
from dask_scd.grid import to_grid


def _assert_same(got, want):
    assert type(got) is type(want)
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, PureRows):
        for name in ("column", "value", "cube"):
            _assert_same(getattr(got, name), getattr(want, name))
        assert (got.stored is None) == (want.stored is None)
        if want.stored is not None:
            _assert_same(got.stored, want.stored)
        assert (got.width, got.n_columns) == (want.width, want.n_columns)
    else:  # CellView
        assert (got.n_rows, got.n_columns, got.by_columns) == (
            want.n_rows,
            want.n_columns,
            want.by_columns,
        )
        for name in ("data", "indices", "indptr"):
            _assert_same(getattr(got.matrix, name), getattr(want.matrix, name))
        assert (got.matrix.dense, got.matrix.n_major, got.matrix.n_minor) == (
            want.matrix.dense,
            want.matrix.n_major,
            want.matrix.n_minor,
        )


def _values():
    rng = np.random.default_rng(0)

    def pure(values):  # one entry in each of 200 of 300 rows
        rows = rng.choice(300, 200, replace=False)
        return sp.csc_matrix((values, (rows, rng.integers(0, 4, 200))), shape=(300, 4))

    one_hot = cells._by_rows(CellView(pure(np.ones(200))))
    valued = cells._by_rows(CellView(pure(rng.normal(size=200))))
    wide = sp.csc_matrix((np.ones(30), (np.arange(30), rng.integers(0, 500, 30))), shape=(300, 500))
    view = CellView(wide)
    assert view.stored_columns is not None  # stored at few of its columns
    stored = cells._by_rows(view)
    return {
        "one-hot by rows": one_hot,
        "valued by rows": valued,
        "stored by rows": stored,
        "sparse view": CellView(sp.random(50, 7, density=0.4, random_state=2, format="csc")),
        "dense view": CellView(rng.normal(size=(20, 3))),
        "labels": np.where(rng.random(40) < 0.5, 1, -1).astype(np.int8),
    }


def test_a_spilled_value_reads_back_with_the_same_bits(tmp_path):
    values = _values()
    assert values["one-hot by rows"].value.size == 0 and values["valued by rows"].value.size
    assert values["stored by rows"].stored is not None
    spill = Spill(str(tmp_path))
    for key, value in values.items():
        assert spill.get(key) is None
        assert spill.put(key, value)
    assert spill.writes == len(values)
    size = spill.nbytes
    for key, value in values.items():
        _assert_same(spill.get(key), value)
        assert spill.put(key, value)  # held: not written again
    assert spill.nbytes == size and spill.hits == len(values)
    assert not spill.put("other", object())  # not a value the spill knows
    assert not os.listdir(tmp_path)  # the file is unlinked
    spill.close()
    assert spill.get("labels") is None


def test_a_full_or_failing_spill_leaves_the_reads_to_the_store(tmp_path, monkeypatch):
    labels = np.arange(100, dtype=np.float64)
    spill = Spill(str(tmp_path), max_bytes=labels.nbytes)
    assert spill.put("a", labels)
    assert not spill.put("b", labels)  # past its bound: not spilled
    assert spill.get("b") is None
    _assert_same(spill.get("a"), labels)

    failing = Spill(str(tmp_path))

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full_disk)
    assert not failing.put("a", labels)
    assert failing.disabled and failing.get("a") is None
    assert not failing.put("b", labels)  # not tried again


def test_the_environment_turns_the_spill_off_or_moves_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DASK_SCD_SPILL", "0")
    assert from_environment() is None
    monkeypatch.setenv("DASK_SCD_SPILL", str(tmp_path))
    spill = from_environment()
    assert spill.put("k", np.ones(3))
    assert spill.directory == str(tmp_path)
    monkeypatch.delenv("DASK_SCD_SPILL")
    assert from_environment().directory is None  # the worker's local directory


def _out_of_core_cache(monkeypatch, directory):
    """A cell cache with room for nothing (as a worker far above its memory limit would
    size it), whose spill file goes to ``directory``."""
    monkeypatch.setattr(cell_cache, "_resident_bytes", lambda: 1000)
    cache = cell_cache.CellCache(0, ceiling=1000)
    cache.pause_at = 1 << 40
    cache.spill = Spill(str(directory))
    monkeypatch.setattr(cells, "CACHE", cache)
    return cache


def test_out_of_core_cells_are_decoded_once_then_read_from_the_spill(tmp_path, monkeypatch):
    """Two passes over a grid's pure cells (by rows), impure cells and labels with no room
    in the cache: the store is read once for each, the second pass from the spill, with
    the values of an in-core cache."""
    X, y = make_onehot(400, 3, 6, random_state=0)[:2]
    X = sp.hstack([X, sp.random(400, 3, density=0.9, random_state=0)]).tocsr()  # impure
    fields = [np.arange(6 * k, 6 * k + 6) for k in range(3)] + [np.arange(18, 21)]
    grid = to_grid(X, y, tmp_path / "g", row_chunk=100, blocks=fields)
    refs = [
        [CellRef(grid.path, grid.grid_id, r, b, grid.store_version) for b in range(grid.n_blocks)]
        for r in range(grid.n_row_chunks)
    ]
    labels = [
        LabelRef(grid.path, grid.grid_id, r, (-1.0, 1.0), grid.store_version)
        for r in range(grid.n_row_chunks)
    ]

    def one_pass():
        out = []
        for r, row in enumerate(refs):
            for ref in row:
                found = cells.pure_rows(ref)
                out.append(found if found is not None else cells.cell_view(ref))
            out.append(cells.labels(labels[r]))
        return out

    monkeypatch.setattr(cells, "CACHE", cell_cache.CellCache(1 << 30))
    in_core = one_pass()
    cache = _out_of_core_cache(monkeypatch, tmp_path / "spill")
    os.mkdir(tmp_path / "spill")
    first = one_pass()
    reads, hits = cache.counts["reads"], cache.counts["spill_hits"]
    assert reads == grid.n_row_chunks * (grid.n_blocks + 1)  # each cell and labels once
    second = one_pass()
    assert cache.counts["reads"] == reads  # nothing read from the store again
    assert cache.counts["spill_hits"] - hits == grid.n_row_chunks * (grid.n_blocks + 1)
    assert not cache._recent  # a spilled value is not kept in memory as well
    for got, again, want in zip(first, second, in_core):
        if isinstance(want, np.ndarray) and want.dtype == np.float64:  # labels as read
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(again, want)
        else:
            _assert_same(got, want)
            _assert_same(again, want)


def test_a_cell_the_cache_evicts_goes_to_the_spill(tmp_path, monkeypatch):
    """A fit's first cells fill the cache, then make room for the others: the ones it
    drops are spilled, not read from the store again."""
    X, y = make_onehot(400, 3, 6, random_state=0)[:2]
    grid = to_grid(
        X, y, tmp_path / "g", row_chunk=400, blocks=[np.arange(6 * k, 6 * k + 6) for k in range(3)]
    )
    refs = [CellRef(grid.path, grid.grid_id, 0, b, grid.store_version) for b in range(3)]
    monkeypatch.setattr(cell_cache, "_resident_bytes", lambda: 1000)
    cache = cell_cache.CellCache(2000, ceiling=None)  # room for one cell by rows (1.6 kB)
    cache.spill = Spill(str(tmp_path))
    monkeypatch.setattr(cells, "CACHE", cache)
    first = [cells.pure_rows(ref) for ref in refs]
    assert cache.counts["evictions"] == 2 and cache.counts["reads"] == 3
    again = [cells.pure_rows(ref) for ref in refs]
    assert cache.counts["reads"] == 3 and cache.counts["spill_hits"] >= 1
    for got, want in zip(again, first):
        _assert_same(got, want)


def test_an_out_of_core_fit_through_the_spill_is_the_in_core_fit(tmp_path, monkeypatch):
    """block_scd on a grid whose cells never fit the cache: the same bits with the spill,
    without it, and in core; with the spill the store is read once a cell."""
    X, y, _ = make_onehot(3000, 5, 12, random_state=3)
    grid = to_grid(X, y, str(tmp_path / "g.zarr"), row_chunk=1000)
    kw = dict(
        loss="logistic", alpha=1.0 / 3000, tol=1e-15, max_iter=4, solver="block_scd", random_state=0
    )

    def fit():
        with (
            Client(
                processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0"
            ) as client,
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore", ConvergenceWarning)
            return dask_scd.fit(grid, client=client, **kw)

    monkeypatch.setattr(cells, "CACHE", cell_cache.CellCache(1 << 30))
    in_core = fit()
    os.mkdir(tmp_path / "spill")
    spilled_cache = _out_of_core_cache(monkeypatch, tmp_path / "spill")
    spilled = fit()
    cells_and_labels = grid.n_row_chunks * (grid.n_blocks + 1)
    assert spilled_cache.counts["spill_hits"] >= 2 * cells_and_labels
    assert spilled_cache.counts["reads"] <= 2 * cells_and_labels  # check, then by rows
    without = _out_of_core_cache(monkeypatch, tmp_path / "spill")
    without.spill = None
    unspilled = fit()
    assert without.counts["reads"] > 4 * cells_and_labels
    for result in (spilled, unspilled):
        np.testing.assert_array_equal(result.coef_, in_core.coef_)
        assert result.intercept_ == in_core.intercept_
        assert result.history_.relative_gap == in_core.history_.relative_gap


@pytest.mark.parametrize("value", ["one-hot by rows", "sparse view"])
def test_a_spilled_cell_is_not_shared_with_a_new_version(tmp_path, value):
    """A key names one version of one cell: another key is another entry."""
    spill = Spill(str(tmp_path))
    v = _values()[value]
    spill.put(("cell", "p", "g", "v1", 0, 0), v)
    assert spill.get(("cell", "p", "g", "v2", 0, 0)) is None
