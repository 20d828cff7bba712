"""Edges of the input and of the cluster: every bad input ends in one clear error."""

import os
import shutil
import warnings
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd.grid import GridCorruptionError, open_grid, to_grid


@pytest.fixture(scope="module")
def threaded_client():
    """One small in-process cluster (cheap) for the tests that need the dask engine."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        yield c


def _regression(rng, n=120, p=6):
    X = rng.normal(size=(n, p))
    return X, X @ rng.normal(size=p) + 0.1 * rng.normal(size=n)


# ----------------------------------------------- 1. errors inside `with Client(...)`


def test_error_inside_the_readme_cluster_pattern_reaches_the_user(rng, started):
    from distributed import Client, LocalCluster

    X, y = _regression(rng)
    X[70, 2] = np.nan
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster:
        started.clear()
        with Client(cluster):
            with pytest.raises(ValueError, match=r"NaN or infinity in cell \(row chunk 1"):
                dask_scd.fit(da.from_array(X, chunks=(60, 3)), y, solver="block_scd")
    assert started == []  # the user's cluster was used, no second one started


# ---------------------------------------------------- 2. pydata sparse dask chunks


def test_pydata_sparse_chunks_fit_in_memory_like_scipy(rng):
    sparse = pytest.importorskip("sparse")
    X = sp.random(200, 8, density=0.3, random_state=1, format="csr")
    y = np.where(rng.random(200) < 0.5, -1.0, 1.0)
    dX = da.from_array(sparse.COO.from_scipy_sparse(X), chunks=(100, 8), asarray=False)
    result = dask_scd.fit(dX, y, loss="logistic", alpha=0.05, tol=1e-10, random_state=0)
    reference = dask_scd.fit(X, y, loss="logistic", alpha=0.05, tol=1e-10, random_state=0)
    assert result.solver_ in ("scd", "sdca", "newton")  # in memory, as for scipy
    np.testing.assert_allclose(result.coef_, reference.coef_, atol=1e-6)


# ------------------------------------------------------ 3. other scipy.sparse formats


@pytest.mark.parametrize("fmt", ["lil", "dok", "bsr", "dia", "coo"])
@pytest.mark.parametrize("kind", ["matrix", "array"])
def test_every_scipy_sparse_format_fits_like_csr(rng, fmt, kind):
    X = sp.random(150, 7, density=0.4, random_state=2, format="csr")
    y = X @ rng.normal(size=7) + 0.1 * rng.normal(size=150)
    other = X.asformat(fmt) if kind == "matrix" else sp.csr_array(X).asformat(fmt)
    before = other.copy()
    for solver in ("scd", "sdca", "gram"):
        reference = dask_scd.fit(X, y, alpha=0.1, tol=1e-10, solver=solver, random_state=0)
        result = dask_scd.fit(other, y, alpha=0.1, tol=1e-10, solver=solver, random_state=0)
        np.testing.assert_allclose(result.coef_, reference.coef_, atol=1e-7)
    assert other.format == fmt and (other != before).nnz == 0  # the user's object untouched


# ------------------------------------------------------------ 4. the cell cache's key


def test_copied_grid_is_not_served_the_original_cells(tmp_path, threaded_client):
    rng = np.random.default_rng(3)
    X, y = _regression(rng, n=90, p=4)
    to_grid(X, y, tmp_path / "a.zarr", row_chunk=30, blocks=2)
    kwargs = dict(
        alpha=0.1,
        tol=1e-8,
        solver="block_scd",
        client=threaded_client,
        random_state=0,
        max_iter=300,
    )
    first = dask_scd.fit(open_grid(tmp_path / "a.zarr"), **kwargs)
    shutil.copytree(tmp_path / "a.zarr", tmp_path / "b.zarr")  # the same grid_id
    shutil.copytree(tmp_path / "a.zarr", tmp_path / "c.zarr")
    chunk = tmp_path / "b.zarr" / "X" / "block_1" / "c" / "1" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    copy = dask_scd.fit(open_grid(tmp_path / "c.zarr"), **kwargs)
    np.testing.assert_array_equal(copy.coef_, first.coef_)
    with pytest.raises(GridCorruptionError, match=r"row chunk 1, block 1\) of grid .*b\.zarr"):
        dask_scd.fit(open_grid(tmp_path / "b.zarr"), **kwargs)


# ---------------------------------------------------------- 5. row_chunk beyond n


def test_row_chunk_is_capped_to_the_number_of_rows(tmp_path):
    X = np.arange(400.0).reshape(100, 4)
    grid = to_grid(X, np.ones(100), tmp_path / "g", row_chunk=50_000_000)
    assert grid.row_chunk == 100 and grid.row_chunks == (100,)
    import zarr

    for name in ("y", *(f"X/block_{b}" for b in range(grid.n_blocks))):
        assert zarr.open_array(tmp_path / "g" / name, mode="r").chunks[0] == 100
    np.testing.assert_array_equal(grid.X.compute(), X[:, grid.feature_order])


# ------------------------------------------------------------------- 6. xarray dims


def test_xarray_dims_are_read_by_name(tmp_path):
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(4)
    values = rng.normal(size=(25, 4))
    y = rng.normal(size=25)
    transposed = xr.DataArray(
        values.T, dims=("feature", "sample"), coords={"feature": list("abcd")}
    )
    grid = to_grid(transposed, y, tmp_path / "g", row_chunk=10, blocks=2)
    assert grid.shape == (25, 4) and grid.feature_names == list("abcd")
    np.testing.assert_array_equal(grid.X.compute(), values[:, grid.feature_order])
    # Names that say nothing: the first dim is the sample dim, unless told otherwise.
    plain = xr.DataArray(values.T, dims=("u", "v"))
    told = to_grid(plain, y, tmp_path / "h", row_chunk=10, blocks=2, sample_dim="v")
    np.testing.assert_array_equal(told.X.compute(), values[:, told.feature_order])
    # A labels DataArray names the sample dim too.
    by_y = to_grid(plain, xr.DataArray(y, dims="v"), tmp_path / "k", row_chunk=10, blocks=2)
    np.testing.assert_array_equal(by_y.X.compute(), values[:, by_y.feature_order])
    with pytest.raises(ValueError, match="sample_dim='w'"):
        to_grid(plain, y, tmp_path / "m", row_chunk=10, sample_dim="w")
    assert not (tmp_path / "m").exists()


# -------------------------------------------------------------- 7. empty dask input


@pytest.mark.parametrize("shape", [(0, 3), (40, 0)])
def test_empty_dask_input_is_refused(shape):
    X = da.zeros(shape, chunks=(20, 3))
    with pytest.raises(ValueError, match=r"X is empty"):
        dask_scd.fit(X, np.zeros(shape[0]), solver="block_scd")
    with pytest.raises(ValueError, match=r"X is empty"):
        dask_scd.fit(X, np.zeros(shape[0]))


# ---------------------------------------------------- 8. overwrite only replaces grids


def test_overwrite_replaces_only_a_grid(tmp_path):
    X = np.ones((6, 2))
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "table.csv").write_text("a,b\n1,2\n")
    with pytest.raises(FileExistsError, match="not a dask_scd grid"):
        to_grid(X, np.ones(6), folder, row_chunk=4, overwrite=True)
    assert (folder / "table.csv").read_text() == "a,b\n1,2\n"
    note = tmp_path / "note.txt"
    note.write_text("keep me")
    with pytest.raises(FileExistsError, match="not a dask_scd grid"):
        to_grid(X, np.ones(6), note, row_chunk=4, overwrite=True)
    assert note.read_text() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["note.txt", "results"]
    # An empty directory holds nothing to lose; a grid is replaced.
    (tmp_path / "empty").mkdir()
    to_grid(X, np.ones(6), tmp_path / "empty", row_chunk=4, overwrite=True)
    grid = to_grid(2 * X, np.ones(6), tmp_path / "empty", row_chunk=4, overwrite=True)
    np.testing.assert_array_equal(grid.X.compute(), 2 * X)


# ------------------------------------------------------------------ smaller items


def test_libsvm_zero_based_files_are_read(tmp_path):
    from sklearn.datasets import dump_svmlight_file

    rng = np.random.default_rng(5)
    X = sp.random(40, 5, density=0.5, random_state=5, format="csr")
    X = X.tolil()
    X[:, 0] = 1.0  # feature 0 present: its index 0 marks the file zero-based
    X = X.tocsr()
    y = np.where(rng.random(40) < 0.5, -1.0, 1.0)
    dump_svmlight_file(X, y, str(tmp_path / "zero.svm"))  # zero_based=True by default
    grid = to_grid(tmp_path / "zero.svm", None, tmp_path / "z", row_chunk=15)
    assert grid.shape == (40, 5)
    np.testing.assert_allclose(
        grid.X.compute().toarray(), X.toarray()[:, grid.feature_order], rtol=1e-15
    )
    dump_svmlight_file(X, y, str(tmp_path / "one.svm"), zero_based=False)
    one = to_grid(tmp_path / "one.svm", None, tmp_path / "o", row_chunk=15)
    np.testing.assert_allclose(
        one.X.compute().toarray(), X.toarray()[:, one.feature_order], rtol=1e-15
    )
    forced = to_grid(tmp_path / "one.svm", None, tmp_path / "f", row_chunk=15, zero_based=True)
    assert forced.shape == (40, 6)  # column 0 empty: the file was told to be zero-based
    with pytest.raises(ValueError, match="zero_based"):
        to_grid(tmp_path / "one.svm", None, tmp_path / "x", row_chunk=15, zero_based="yes")


def _swap(a: Path, b: Path):
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)


def test_swapped_dense_cells_are_detected(tmp_path):
    rng = np.random.default_rng(6)
    root = tmp_path / "g"
    grid = to_grid(rng.normal(size=(30, 4)), rng.normal(size=30), root, row_chunk=10, blocks=2)
    _swap(root / "X" / "block_0" / "c" / "0" / "0", root / "X" / "block_0" / "c" / "2" / "0")
    with pytest.raises(GridCorruptionError, match=r"row chunk 0, block 0.*checksum"):
        grid.read_cell(0, 0)
    grid.read_cell(1, 0)


def test_swapped_label_chunks_are_detected(tmp_path):
    rng = np.random.default_rng(7)
    root = tmp_path / "g"
    grid = to_grid(rng.normal(size=(30, 2)), rng.normal(size=30), root, row_chunk=10)
    _swap(root / "y" / "c" / "0", root / "y" / "c" / "1")
    with pytest.raises(GridCorruptionError, match=r"labels of row chunk 0.*checksum"):
        grid.read_labels(0)
    grid.read_labels(2)


def test_swapped_sparse_cells_are_detected(tmp_path):
    top = sp.random(10, 4, density=0.5, random_state=8, format="csr")
    X = sp.vstack([top, 2 * top, 3 * top], format="csr")  # same pattern, other values
    grid = to_grid(X, np.ones(30), tmp_path / "g", row_chunk=10, blocks=1)
    assert grid.cell_nnz[1, 0] == grid.cell_nnz[2, 0]  # the lengths cannot tell them apart
    cells = tmp_path / "g" / "X" / "block_0"
    _swap(cells / "cell_1" / "c" / "0", cells / "cell_2" / "c" / "0")
    with pytest.raises(GridCorruptionError, match=r"row chunk 1, block 0.*checksum"):
        grid.read_cell(1, 0)
    grid.read_cell(0, 0)


def test_version_1_grids_stay_readable(tmp_path):
    import zarr

    rng = np.random.default_rng(9)
    X = rng.normal(size=(20, 3))
    to_grid(X, np.ones(20), tmp_path / "g", row_chunk=10)
    group = zarr.open_group(tmp_path / "g", mode="r+")
    group.attrs["format_version"] = 1  # what version-1 writers left: no checksums
    for name in ("cell_checksum", "label_checksum"):
        del group[name]
    shutil.copytree(tmp_path / "g", tmp_path / "old")  # a store this process never read
    old = open_grid(tmp_path / "old")
    np.testing.assert_array_equal(old.X.compute(), X[:, old.feature_order])


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_labels_holding_none_are_a_value_error(rng, loss):
    X = rng.normal(size=(6, 2))
    y = [1, -1, None, 1, -1, 1]
    with pytest.raises(ValueError, match=r"y contains None or NaN \(first at index 2\)"):
        dask_scd.fit(X, y, loss=loss)
    with pytest.raises(ValueError, match=r"y contains None or NaN \(first at index 2\)"):
        dask_scd.fit(da.from_array(X, chunks=3), y, loss=loss, solver="block_scd")


def test_nullable_pandas_columns_are_numbers(rng):
    pd = pytest.importorskip("pandas")
    X, y = _regression(rng, n=50, p=3)
    frame = pd.DataFrame(X, columns=list("abc")).astype("Float64")
    labels = pd.Series(y, dtype="Float64")
    result = dask_scd.fit(frame, labels, alpha=0.1, tol=1e-10, random_state=0)
    reference = dask_scd.fit(X, y, alpha=0.1, tol=1e-10, random_state=0)
    np.testing.assert_allclose(result.coef_, reference.coef_, atol=1e-9)
    frame.iloc[4, 1] = pd.NA
    with pytest.raises(ValueError, match=r"X contains NaN or infinity \(first at row 4, column 1"):
        dask_scd.fit(frame, labels)


def test_grid_from_nullable_pandas_columns(tmp_path, rng):
    pd = pytest.importorskip("pandas")
    X, y = _regression(rng, n=20, p=3)
    frame = pd.DataFrame(X, columns=list("abc")).astype("Float64")
    grid = to_grid(frame, pd.Series(y, dtype="Float64"), tmp_path / "g", row_chunk=8, blocks=1)
    np.testing.assert_array_equal(grid.X.compute(), X)
    assert grid.feature_names == list("abc")


@pytest.mark.parametrize("value", ["no", 1, None, np.float64(1.0)])
def test_fit_intercept_must_be_a_bool(rng, value):
    X, y = _regression(rng, n=20, p=2)
    with pytest.raises(ValueError, match=r"fit_intercept=.* must be True or False"):
        dask_scd.fit(X, y, fit_intercept=value)
    assert dask_scd.fit(X, y, fit_intercept=np.bool_(False)).intercept_ == 0.0


def test_labels_too_large_for_the_gap_are_refused(rng):
    X, y = _regression(rng, n=40, p=3)
    with pytest.raises(ValueError, match=r"y is too large.*rescale"):
        dask_scd.fit(X, y * 1e200)
    with pytest.raises(ValueError, match=r"y is too large.*rescale"):
        dask_scd.fit(da.from_array(X, chunks=20), y * 1e200, solver="block_scd")
    # classification labels are only names: any two values are fine
    result = dask_scd.fit(X, np.where(y > 0, 1e200, -1e200), loss="logistic")
    assert np.isfinite(result.dual_gap_)


def test_features_too_large_for_the_gap_are_refused(rng, threaded_client):
    X, y = _regression(rng, n=40, p=3)
    for solver in ("auto", "scd", "sdca", "newton", "gram"):
        with pytest.raises(ValueError, match=r"X is too large.*rescale"):
            dask_scd.fit(X * 1e150, y, solver=solver)
    with pytest.raises(ValueError, match=r"X is too large in .*rescale"):
        dask_scd.fit(
            da.from_array(X * 1e150, chunks=20), y, solver="block_scd", client=threaded_client
        )
    # large but safe values fit: X·s with alpha·s² is the same problem, θ scaled by 1/s
    for solver in ("gram", "scd", "newton"):
        result = dask_scd.fit(X * 1e20, y, alpha=0.1 * 1e40, tol=1e-10, solver=solver)
        reference = dask_scd.fit(X, y, alpha=0.1, tol=1e-10, solver=solver)
        np.testing.assert_allclose(result.coef_ * 1e20, reference.coef_, atol=1e-5)
        assert result.primal_ == pytest.approx(reference.primal_, rel=1e-9)
        assert result.dual_gap_ <= 1e-10


def test_labels_too_large_in_a_grid_are_refused(tmp_path, rng, threaded_client):
    X, y = _regression(rng, n=40, p=3)
    grid = to_grid(X, y * 1e200, tmp_path / "g", row_chunk=20)
    with pytest.raises(ValueError, match=r"y is too large.*rescale"):
        dask_scd.fit(grid, solver="block_scd", client=threaded_client)


def test_convergence_warning_points_at_the_caller(rng, threaded_client):
    X = rng.normal(size=(400, 60))
    X[:, 1:] += 3 * X[:, :1]  # correlated columns: one epoch is far from the optimum
    y = X @ rng.normal(size=60)
    dX = da.from_array(X, chunks=(200, 30))
    cases = [
        dict(X=X, solver="scd"),
        dict(X=X, solver="sdca", penalty="l2"),
        dict(X=X, solver="gram"),
        dict(X=dX, solver="block_scd", client=threaded_client),
        dict(X=dX, solver="auto"),
    ]
    for case in cases:
        case.setdefault("penalty", "l1")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dask_scd.fit(case.pop("X"), y, alpha=1e-4, tol=1e-15, max_iter=1, **case)
        found = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
        assert found, case
        assert all(w.filename == __file__ for w in found), (case, [w.filename for w in found])


@pytest.mark.parametrize("content", [b"", b"not a checkpoint", b"PK\x03\x04 truncated"])
def test_unreadable_checkpoint_is_named(tmp_path, content):
    from dask_scd.runtime.checkpoint import load_checkpoint

    path = tmp_path / "fit.npz"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"checkpoint .*fit\.npz is unreadable.*resume=False"):
        load_checkpoint(path, {"shape": [3, 2]}, np.random.default_rng(0))
    np.savez(path, coef=np.zeros(2), meta=np.array('{"version": 1, "signature": {}}'))
    with pytest.raises(ValueError, match=r"belongs to another fit"):
        load_checkpoint(path, {"shape": [3, 2]}, np.random.default_rng(0))


def test_fit_reads_paths_and_xarray_as_the_estimators_do(tmp_path):
    """A grid store's path, a libsvm file and an xarray DataArray give numpy's model."""
    from sklearn.datasets import dump_svmlight_file

    rng = np.random.default_rng(3)
    X = rng.normal(size=(120, 6))
    y = np.where(X @ rng.normal(size=6) > 0, 1.0, -1.0)
    options = dict(loss="logistic", alpha=0.01, tol=1e-10, random_state=0)
    reference = dask_scd.fit(X, y, **options)
    to_grid(X, y, str(tmp_path / "g.zarr"), row_chunk=50)
    dump_svmlight_file(X, y, str(tmp_path / "d.svm"))
    fits = [
        dask_scd.fit(str(tmp_path / "g.zarr"), **options),
        dask_scd.fit(tmp_path / "d.svm", **options),
    ]
    xr = pytest.importorskip("xarray")
    fits.append(dask_scd.fit(xr.DataArray(X, dims=("sample", "feature")), y, **options))
    for result in fits:
        np.testing.assert_allclose(result.coef_, reference.coef_, atol=1e-7)
        assert result.dual_gap_ <= 1e-10
    with pytest.raises(ValueError, match="y must be None"):
        dask_scd.fit(tmp_path / "d.svm", y, **options)


def test_a_memory_budget_routes_auto_to_the_block_engine(tmp_path, threaded_client):
    """ "auto" would run block Newton on few features; a residency budget is the block
    engine's, so it runs block SCD; below in_memory_limit the budget is moot and dropped."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(400, 8))
    y = X @ rng.normal(size=8)
    to_grid(X, y, str(tmp_path / "g.zarr"), row_chunk=100, blocks=2)
    grid = open_grid(tmp_path / "g.zarr")
    budgeted = dask_scd.fit(
        grid,
        alpha=0.1,
        tol=1e-8,
        in_memory_limit=0,
        residency="duhl",
        memory_budget=X.nbytes // 2,
        client=threaded_client,
        max_iter=500,
    )
    assert budgeted.solver_ == "block_scd" and budgeted.converged_
    small = dask_scd.fit(grid, alpha=0.1, tol=1e-8, residency="duhl", memory_budget=10**6)
    assert small.solver_ in ("gram", "scd", "sdca", "newton")
    assert abs(budgeted.primal_ - small.primal_) <= 2e-8 * small.primal_


def test_fit_takes_xarray_dims_by_name():
    """A DataArray with dims ("feature", "sample") is the transpose of its values."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(5)
    X = rng.normal(size=(60, 4))
    y = X @ rng.normal(size=4)
    reference = dask_scd.fit(X, y, alpha=0.1, tol=1e-10)
    flipped = dask_scd.fit(xr.DataArray(X.T, dims=("feature", "sample")), y, alpha=0.1, tol=1e-10)
    np.testing.assert_allclose(flipped.coef_, reference.coef_, atol=1e-8)
