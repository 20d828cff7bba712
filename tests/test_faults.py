"""Faults on a cluster, met through the README's pattern: ``with Client(LocalCluster(...))``
around ``fit`` without ``client=``. Each ends in the documented exception or the same
model, and the library never starts a cluster of its own beside the user's."""

import os
import shutil
import warnings

import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster, default_client
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd.datasets import make_onehot
from dask_scd.grid import GridCorruptionError, open_grid, to_grid

ALPHA = 0.03
FIT = dict(loss="logistic", alpha=ALPHA, tol=1e-15, solver="block_scd", random_state=0)


@pytest.fixture(scope="module")
def grid_dir(tmp_path_factory):
    X, y, blocks = make_onehot(1200, 3, 6, set_valued=1, set_size=3, random_state=1)
    root = tmp_path_factory.mktemp("faults")
    to_grid(X, y, root / "grid.zarr", row_chunk=400, blocks=blocks)
    return root / "grid.zarr"


@pytest.fixture
def close_later():
    """The README's pattern leaves the LocalCluster to the garbage collector: close it."""
    clusters = []
    yield clusters.append
    for cluster in clusters:
        cluster.close()


def _fixed_epochs(grid, epochs, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return dask_scd.fit(grid, max_iter=epochs, **FIT, **kwargs)


def _copy(grid_dir, tmp_path, name):
    shutil.copytree(grid_dir, tmp_path / name)
    return tmp_path / name


def test_corrupt_and_missing_data_raise_the_documented_errors(
    grid_dir, tmp_path, started, close_later
):
    garbled = _copy(grid_dir, tmp_path, "garbled.zarr")
    chunk = garbled / "X" / "block_2" / "cell_1" / "c" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0x5A
    chunk.write_bytes(bytes(raw))
    missing = _copy(grid_dir, tmp_path, "missing.zarr")
    (missing / "X" / "block_0" / "cell_2" / "c" / "0").unlink()
    no_labels = _copy(grid_dir, tmp_path, "no_labels.zarr")
    (no_labels / "y" / "c" / "1").unlink()
    X = np.random.default_rng(0).normal(size=(90, 4))
    X[50, 1] = np.inf
    with Client(
        LocalCluster(n_workers=2, processes=False, threads_per_worker=1, dashboard_address=":0")
    ) as client:
        close_later(client.cluster)
        started.clear()
        with pytest.raises(GridCorruptionError, match=r"cell \(row chunk 1, block 2\)"):
            dask_scd.fit(open_grid(garbled), max_iter=2, **FIT)
        with pytest.raises(
            GridCorruptionError, match=r"cell \(row chunk 2, block 0\).*chunk file .* is missing"
        ):
            dask_scd.fit(open_grid(missing), max_iter=2, **FIT)
        with pytest.raises(GridCorruptionError, match=r"labels of row chunk 1"):
            dask_scd.fit(open_grid(no_labels), max_iter=2, **FIT)
        with pytest.raises(ValueError, match=r"NaN or infinity in cell \(row chunk 1"):
            dask_scd.fit(da.from_array(X, chunks=(45, 2)), X[:, 0], solver="block_scd")
        with pytest.raises(ValueError, match="belongs to another fit"):
            checkpoint = tmp_path / "other.npz"
            _fixed_epochs(open_grid(grid_dir), 1, checkpoint=checkpoint)
            dask_scd.fit(
                open_grid(grid_dir),
                loss="squared",
                solver="block_scd",
                checkpoint=checkpoint,
                resume=True,
            )
        assert default_client() is client
    assert started == []


def test_worker_killed_mid_fit_gives_the_same_model(grid_dir, started, close_later):
    grid = open_grid(grid_dir)
    with Client(
        LocalCluster(
            n_workers=2,
            processes=True,
            threads_per_worker=1,
            dashboard_address=":0",
            memory_limit="1GiB",
        )
    ) as client:
        close_later(client.cluster)
        started.clear()
        undisturbed = _fixed_epochs(grid, 3)
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

        disturbed = _fixed_epochs(grid, 3, callback=callback)
    assert killed
    np.testing.assert_allclose(disturbed.coef_, undisturbed.coef_, rtol=0, atol=1e-12)
    assert disturbed.intercept_ == pytest.approx(undisturbed.intercept_, abs=1e-12)
    assert started == []


def test_interrupted_fit_resumes_to_the_same_model(grid_dir, tmp_path, started, close_later):
    grid = open_grid(grid_dir)
    checkpoint = tmp_path / "fit.npz"

    def interrupt(state):
        if state["epoch"] == 2:
            raise KeyboardInterrupt  # Ctrl-C in the client, after epoch 2's checkpoint

    with Client(
        LocalCluster(n_workers=2, processes=False, threads_per_worker=1, dashboard_address=":0")
    ) as client:
        close_later(client.cluster)
        started.clear()
        with pytest.raises(KeyboardInterrupt):
            _fixed_epochs(grid, 4, checkpoint=checkpoint, callback=interrupt)
        assert checkpoint.exists()
        resumed = _fixed_epochs(grid, 4, checkpoint=checkpoint, resume=True)
        straight = _fixed_epochs(grid, 4)
        assert default_client() is client
    assert started == []
    assert resumed.n_iter_ == straight.n_iter_ == 4
    assert resumed.history_.iteration == [1, 2, 3, 4]
    np.testing.assert_array_equal(resumed.coef_, straight.coef_)
    assert resumed.intercept_ == straight.intercept_
