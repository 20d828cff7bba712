"""The block engines' cell statistics on cells in device memory against the same
statistics on the host.

Every task function of :mod:`dask_scd.engines.block.block_ops` (and the row-chunk tasks of
``block_newton``) is called twice with the same labels, margins and directions: once on
a numpy / scipy.sparse cell (the CPU kernels) and once on the same cell in device memory
(a numba device array, or a :class:`~dask_scd.kernels.device.DeviceCSC`: the CUDA
kernels of :mod:`dask_scd.kernels.cuda_cells`). The results agree to 1e-12 relative.
Without a GPU this runs under numba's CUDA simulator (tests/conftest.py), on 12 × 5 cells
and 4 threads per block (a tree reduction over two levels, strided loops).
"""

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import nvvm_home

from dask_scd import objectives as obj
from dask_scd.data import cells as data_cells
from dask_scd.engines.block import block_coarse, block_newton
from dask_scd.engines.block import block_ops as ops
from dask_scd.kernels import device
from dask_scd.runtime import passes

pytestmark = pytest.mark.gpu

if not device.gpu_available():
    pytest.skip("numba.cuda finds no GPU and its simulator is off", allow_module_level=True)

from numba import config as numba_config
from numba import cuda as numba_cuda

from dask_scd.kernels import cuda

LOSSES = ["squared", "logistic", "squared_hinge", "hinge"]
LAYOUTS = ["dense", "dense_fortran", "csr", "csc"]
RTOL = 1e-12


@pytest.fixture(autouse=True, scope="module")
def simulator_speed():
    """4 threads per block and a short GIL switch interval (see tests/test_gpu.py)."""
    if not numba_config.ENABLE_CUDASIM:
        yield
        return
    interval, max_threads = sys.getswitchinterval(), cuda.MAX_THREADS
    sys.setswitchinterval(1e-4)
    cuda.MAX_THREADS = 4
    yield
    sys.setswitchinterval(interval)
    cuda.MAX_THREADS = max_threads


def _dense(rng, n=12, p=5):
    X = rng.normal(size=(n, p))
    X[rng.random(X.shape) < 0.4] = 0.0
    return X


def _pair(X, layout):
    """(host cell, device cell) holding the same X."""
    if layout == "dense":
        return X, numba_cuda.to_device(np.ascontiguousarray(X))
    if layout == "dense_fortran":
        return np.asfortranarray(X), numba_cuda.to_device(np.asfortranarray(X))
    host = sp.csr_matrix(X) if layout == "csr" else sp.csc_matrix(X)
    return host, device.DeviceCSC.from_scipy(host)


def _labels(rng, loss, n=12):
    if loss == "squared":
        return rng.normal(size=n)
    y = np.sign(rng.normal(size=n))
    y[y == 0] = 1.0
    return y


def _margins(rng, X, fit_intercept):
    """Xθ (+ b): about half the examples inside the hinge losses' margin."""
    return X @ (0.5 * rng.normal(size=X.shape[1])) + (0.7 if fit_intercept else 0.0)


def _assert_close(host, dev):
    host, dev = np.asarray(host, dtype=np.float64), np.asarray(dev, dtype=np.float64)
    assert host.shape == dev.shape
    scale = max(np.abs(host).max(initial=0.0), 1e-300)
    np.testing.assert_allclose(dev, host, rtol=RTOL, atol=RTOL * scale)


def _assert_dicts_close(host: dict, dev: dict):
    assert host.keys() == dev.keys()
    for key in host:
        _assert_close(host[key], dev[key])


# ------------------------------------------------------------------------- dispatch


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_device_cell_takes_the_cuda_kernels_and_a_host_cell_the_cpu(layout, rng):
    host, dev = _pair(_dense(rng), layout)
    assert type(data_cells.cell_view(host)) is data_cells.CellView
    view = data_cells.cell_view(dev)
    assert type(view) is data_cells.DeviceCellView and data_cells.cell_view(view) is view
    assert device.on_device(dev) and not device.on_device(host)
    _assert_close(
        data_cells.cell_view(host).rmatvec(np.arange(12.0)), view.rmatvec(np.arange(12.0))
    )


def test_the_cpu_path_imports_nothing_of_the_gpu():
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import scipy.sparse as sp
        from dask_scd.data import cells as data_cells
        from dask_scd.engines.block import block_ops as ops
        X = np.eye(4)
        for cell in (X, sp.csr_matrix(X)):
            ops.block_stats(cell, np.ones(4), np.zeros(4), "logistic", gram=True)
            data_cells.inspect_cell(cell, "cell")
        loaded = [m for m in ("numba.cuda", "dask_scd.kernels.cuda_cells", "cupy")
                  if m in sys.modules]
        assert not loaded, loaded
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


# -------------------------------------------------------------- block iteration


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("fit_intercept", [False, True])
def test_block_stats(layout, loss, fit_intercept, rng):
    X = _dense(rng)
    host, dev = _pair(X, layout)
    y, margins = _labels(rng, loss), _margins(rng, X, fit_intercept)
    for gram in (False, True):
        expected = ops.block_stats(host, y, margins, loss, gram)
        _assert_dicts_close(expected, ops.block_stats(dev, y, margins, loss, gram))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("fit_intercept", [False, True])
def test_block_trials(layout, loss, fit_intercept, rng):
    X = _dense(rng)
    host, dev = _pair(X, layout)
    y, margins = _labels(rng, loss), _margins(rng, X, fit_intercept)
    problem = obj.Problem(loss, 0.1, 0.5, fit_intercept)
    d = rng.normal(size=X.shape[1])
    d[1] = 0.0  # a coordinate that does not move: its trials stay zero
    for pure in (True, False):
        direction = {"direction": d}
        expected = ops.block_trials(host, y, margins, direction, problem, pure)
        _assert_dicts_close(expected, ops.block_trials(dev, y, margins, direction, problem, pure))
        assert np.any(next(iter(expected.values())))
    # The logistic product form on large steps (|d·x| past its bound: the plain difference).
    large = {"direction": 40.0 * d}
    _assert_dicts_close(
        ops.block_trials(host, y, margins, large, problem, True),
        ops.block_trials(dev, y, margins, large, problem, True),
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_step_and_refresh_margins(layout, rng):
    cells = [_pair(_dense(rng, p=p), layout) for p in (5, 3)]
    delta = rng.normal(size=5)
    margins = rng.normal(size=12)
    _assert_close(
        ops.apply_step(margins, cells[0][0], {"delta": delta}),
        ops.apply_step(margins, cells[0][1], {"delta": delta}),
    )
    state = {"coef": rng.normal(size=8), "intercept": 0.3}
    offsets = np.array([0, 5, 8])
    _assert_close(
        passes.refresh_margins([c[0] for c in cells], 12, state, offsets),
        passes.refresh_margins([c[1] for c in cells], 12, state, offsets),
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("fit_intercept", [False, True])
def test_certificate_stats(layout, loss, fit_intercept, rng):
    blocks = [_dense(rng, p=p) for p in (5, 3)]
    cells = [_pair(X, layout) for X in blocks]
    y = _labels(rng, loss)
    margins = _margins(rng, np.hstack(blocks), fit_intercept)
    problem = obj.Problem(loss, 0.1, 0.5, fit_intercept)
    expected = passes.certificate_stats([c[0] for c in cells], y, margins, problem)
    _assert_dicts_close(
        expected, passes.certificate_stats([c[1] for c in cells], y, margins, problem)
    )


# ------------------------------------------------------------------ coarse step


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fit_intercept", [False, True])
def test_block_row_sums_and_coarse_stats(layout, fit_intercept, rng):
    onehot = np.zeros((12, 4))
    onehot[np.arange(12), rng.integers(4, size=12)] = 1.0  # sums to the ones vector
    counts = (rng.random((12, 3)) < 0.5).astype(np.float64)  # small integer sums
    cells = [_pair(onehot, layout), _pair(counts, layout), _pair(_dense(rng), layout)]
    host = block_coarse.block_row_sums([c[0] for c in cells], fit_intercept)
    dev = block_coarse.block_row_sums([c[1] for c in cells], fit_intercept)
    np.testing.assert_array_equal(host.column_of, dev.column_of)
    assert host.counts.dtype == dev.counts.dtype == np.float64  # the real-valued block
    _assert_close(host.counts, dev.counts)
    y = _labels(rng, "logistic")
    margins = rng.normal(size=12)
    _assert_dicts_close(
        block_coarse.coarse_stats(host, y, margins, "logistic"),
        block_coarse.coarse_stats(dev, y, margins, "logistic"),
    )
    compact = block_coarse.block_row_sums([c[1] for c in cells[:2]], fit_intercept)
    assert compact.counts.dtype == np.uint8
    np.testing.assert_array_equal(
        compact.toarray(),
        block_coarse.block_row_sums([c[0] for c in cells[:2]], fit_intercept).toarray(),
    )


# ------------------------------------------------------------------- preflight


@pytest.mark.parametrize("layout", LAYOUTS)
def test_inspect_cell(layout, rng):
    X = _dense(rng)
    X[3] = 0.0  # an empty row
    host, dev = _pair(X, layout)
    expected = data_cells.inspect_cell(host, "cell")
    got = data_cells.inspect_cell(dev, "cell")
    # Which columns hold a value: the host's alone (a device cell's: None, all taken live).
    held = np.unpackbits(expected.pop("columns"), count=X.shape[1]).astype(bool)
    np.testing.assert_array_equal(held, np.any(X != 0, axis=0))
    assert got.pop("columns") is None
    assert got == expected
    assert expected["max_per_row"] == int(np.count_nonzero(X, axis=1).max())
    X[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"NaN or infinity in cell \(row chunk 0"):
        data_cells.inspect_cell(_pair(X, layout)[1], "cell (row chunk 0, block 0)")
    X[2, 1] = 1e300
    with pytest.raises(ValueError, match="too large"):
        data_cells.inspect_cell(_pair(X, layout)[1], "cell")


# ------------------------------------------------------------------ block_newton


@pytest.mark.parametrize("layout", ["dense", "csr"])
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("fit_intercept", [False, True])
def test_newton_row_and_trials(layout, loss, fit_intercept, rng):
    blocks = [_dense(rng, p=p) for p in (3, 2)]
    cells = [_pair(X, layout) for X in blocks]
    y = _labels(rng, loss)
    state = {"coef": 0.5 * rng.normal(size=5), "intercept": 0.7 if fit_intercept else 0.0}
    problem = obj.Problem(loss, 0.1, 0.5, fit_intercept)
    offsets = np.array([0, 3, 5])
    host_stats, host_margins = block_newton.newton_row(
        [c[0] for c in cells], y, state, offsets, problem
    )
    dev_stats, dev_margins = block_newton.newton_row(
        [c[1] for c in cells], y, state, offsets, problem
    )
    _assert_close(host_margins, dev_margins)
    _assert_dicts_close(host_stats, dev_stats)
    direction = {"d_coef": rng.normal(size=5), "d_b": 0.2}
    l2 = obj.Problem(loss, 0.1, 0.0, fit_intercept)  # its trials hold the doublings too
    for trial_problem in (problem, l2):
        _assert_dicts_close(
            block_newton.newton_trials(
                [c[0] for c in cells], y, host_margins, direction, trial_problem
            ),
            block_newton.newton_trials(
                [c[1] for c in cells], y, host_margins, direction, trial_problem
            ),
        )


# ------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def threaded_client():
    """One worker thread in this process: the simulator's device arrays cannot be pickled,
    so they stay in the process that made them (a GPU cluster moves cupy chunks with
    distributed's cupy serializers instead)."""
    import dask
    from distributed import Client, LocalCluster

    # Without the worker's statistical profiler: every 10 ms it walks the frames of every
    # thread of the process, and the simulator runs each CUDA thread as a Python thread
    # (one `make test` run saw a test here crawl for over 40 minutes, the profiler's
    # callback in the stacks; alone it takes seconds).
    with (
        dask.config.set({"distributed.worker.profile.enabled": False}),
        LocalCluster(
            processes=False, n_workers=1, threads_per_worker=1, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def _to_device(block):
    return numba_cuda.to_device(np.ascontiguousarray(block))


@pytest.mark.parametrize("solver, loss", [("block_scd", "squared"), ("block_newton", "logistic")])
def test_block_engines_on_a_dask_array_of_device_chunks(solver, loss, threaded_client, rng):
    import dask.array as da

    import dask_scd

    X = rng.normal(size=(16, 4))
    y = _labels(rng, loss, n=16) + (X @ rng.normal(size=4) if loss == "squared" else 0.0)
    host = da.from_array(X, chunks=(8, 2))
    # meta: dask learns the chunk type without calling to_device on an empty array.
    on_device = host.map_blocks(
        _to_device, dtype=np.float64, meta=numba_cuda.to_device(np.empty((0, 0)))
    )
    # Two epochs (iterations): the device changes the rounding of the sums, not the
    # iterates, so the models agree at any iteration (the simulator is slow).
    kwargs = dict(
        loss=loss,
        alpha=0.05,
        tol=1e-15,
        max_iter=2,
        solver=solver,
        random_state=0,
        client=threaded_client,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # not converged at 2 iterations
        expected = dask_scd.fit(host, y, **kwargs)
        result = dask_scd.fit(on_device, y, device="gpu", **kwargs)
        by_auto = dask_scd.fit(on_device, y, device="auto", **kwargs)
    np.testing.assert_array_equal(by_auto.coef_, result.coef_)
    # The device is where the chunks are: a mismatch is a clear error, not a silent move.
    with pytest.raises(ValueError, match="chunks of X are in device memory"):
        dask_scd.fit(on_device, y, device="cpu", **kwargs)
    with pytest.raises(ValueError, match="chunks in device memory"):
        dask_scd.fit(host, y, device="gpu", **kwargs)
    assert result.n_iter_ == expected.n_iter_ == 2
    np.testing.assert_allclose(result.coef_, expected.coef_, rtol=0, atol=1e-8)
    assert abs(result.intercept_ - expected.intercept_) <= 1e-8
    assert abs(result.dual_gap_ - expected.dual_gap_) <= 1e-8 * abs(expected.primal_)


# ------------------------------------------------------------------- compilation


# As in tests/test_gpu.py: the simulator runs device functions as Python, so only numba's
# real compiler tells whether every kernel lowers (no GPU needed, libNVVM only).
_COMPILE = """
import numba.cuda.dispatcher
from numba import cuda, types

class Device:
    compute_capability = (8, 0)

numba.cuda.dispatcher.get_current_device = Device
from dask_scd.kernels import cuda_cells as k

f64, i64, flag = types.float64, types.int64, types.boolean
vec, out2 = f64[::1], f64[:, ::1]
compiled = 0
for dtype in (types.float32, f64):
    for index in (types.int32, i64):
        dense = (dtype[:, :], f64[::1], types.int32[::1], types.int32[::1], flag)
        sparse = (f64[:, ::1], dtype[::1], index[::1], index[::1], flag)
        for cell in (dense, sparse):
            for kernel, signature, needs in (
                (k._column_sums_kernel, (*cell, i64, vec, vec, i64, i64, vec, vec), "bar.sync"),
                (k._gram_kernel, (*cell, *cell, i64, i64, vec, flag, out2), "bar.sync"),
                (k._gram_kernel, (*cell, *dense, i64, i64, vec, flag, out2), "bar.sync"),
                (k._trials_kernel, (*cell, i64, vec, vec, vec, vec, flag, i64, out2), "bar.sync"),
                (k._inspect_kernel, (*cell, i64, vec, i64[::1], i64[::1]), "atom"),
            ):
                ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(8, 0))
                assert needs in ptx, kernel
                compiled += 1
        ptx, _ = cuda.compile_ptx(k._dense_matvec_kernel.py_func, (dtype[:, :], vec, vec), cc=(8, 0))
        ptx, _ = cuda.compile_ptx(k._sparse_matvec_kernel.py_func,
                                  (dtype[::1], index[::1], index[::1], vec, vec), cc=(8, 0))
        assert "atom.global.add.f64" in ptx
        compiled += 2
print("compiled", compiled)
"""


def test_cell_kernels_compile_for_the_gpu(tmp_path):
    """Every cell kernel, dense (any strides) and CSC, float32 and float64 values, int32
    and int64 indices, compiles to PTX for sm_80 with its barriers and atomics."""
    home = nvvm_home()
    if home is None:
        pytest.skip("no libNVVM: pip install nvidia-cuda-nvcc-cu12 (or set CUDA_HOME)")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", CUDA_HOME=home)
    out = subprocess.run(
        [sys.executable, "-c", _COMPILE],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "compiled 48" in out.stdout
