"""The CUDA kernels (TPA-SCD) against the CPU kernels and the numpy reference, and
``fit(..., device="gpu")`` against ``device="cpu"``.

Without a GPU these run under numba's CUDA simulator (tests/conftest.py sets
``NUMBA_ENABLE_CUDASIM=1``), which runs the thread blocks of a launch one after another:
an epoch is then sequential CD in the launch order, and matches the CPU kernel update for
update. On a GPU the blocks run concurrently (asynchronous SCD) and only the converged
answers agree, which is what the fit tests check.
"""

import os
import subprocess
import sys
import textwrap

import kernel_reference as reference
import numpy as np
import pytest
import scipy.sparse as sp
from conftest import nvvm_home

import dask_scd
from dask_scd import objectives as obj
from dask_scd.kernels import cpu, device, scalar
from dask_scd.kernels.layout import MajorMatrix

pytestmark = pytest.mark.gpu

if not device.gpu_available():
    pytest.skip("numba.cuda finds no GPU and its simulator is off", allow_module_level=True)

from numba import config as numba_config

from dask_scd.kernels import cuda


@pytest.fixture(autouse=True, scope="module")
def simulator_speed():
    """The simulator runs each thread of a block as a Python thread and hands the GIL
    around at every barrier: 4 threads per block (still a tree reduction and a strided
    loop over 20 rows) and a short switch interval make an epoch ~10x faster."""
    if not numba_config.ENABLE_CUDASIM:
        yield
        return
    interval, max_threads = sys.getswitchinterval(), cuda.MAX_THREADS
    sys.setswitchinterval(1e-4)
    cuda.MAX_THREADS = 4
    yield
    sys.setswitchinterval(interval)
    cuda.MAX_THREADS = max_threads


def _data(rng, dtype=np.float64, sparse=False, n=20, p=6):
    X = rng.normal(size=(n, p))
    X[rng.random(X.shape) < 0.4] = 0.0
    X = X.astype(dtype)
    y = np.sign(rng.normal(size=n))
    y[y == 0] = 1.0
    return (sp.csr_matrix(X) if sparse else X), X.astype(np.float64), y


def _on_device(matrix):
    return device.place(matrix, "gpu")


LAYOUTS = [(np.float64, False), (np.float64, True), (np.float32, True)]


# ------------------------------------------------------------------ kernels, one epoch


@pytest.mark.parametrize("dtype,sparse", LAYOUTS)
@pytest.mark.parametrize(
    "loss,l1_ratio,cubic",
    [
        ("squared", 0.0, False),
        ("squared", 0.7, False),
        ("logistic", 0.0, True),
        ("logistic", 0.5, False),
        ("squared_hinge", 0.3, False),
    ],
)
def test_scd_epoch_matches_cpu_and_reference(rng, dtype, sparse, loss, l1_ratio, cubic):
    X, dense, y = _data(rng, dtype, sparse)
    problem = obj.Problem(loss=loss, alpha=0.05, l1_ratio=l1_ratio, fit_intercept=True)
    n, p = dense.shape
    coef0 = rng.normal(scale=0.5, size=p)
    order = rng.permutation(p + 1)  # with the intercept
    m = MajorMatrix.from_array(X, "columns")
    # Without cube sums the logistic takes the line search on every coordinate.
    cubes = m.cube_sums() if cubic else np.zeros(0)
    results = []
    for kernels, matrix in ((cpu, m), (cuda, _on_device(m))):
        coef, intercept = coef0.copy(), np.array([0.1])
        margins = dense @ coef + 0.1
        stats = kernels.scd_epoch(
            matrix.data,
            matrix.indices,
            matrix.indptr,
            matrix.dense,
            n,
            y,
            margins,
            coef,
            intercept,
            order,
            problem.loss_code,
            problem.l1,
            problem.l2,
            m.sq_norms(),
            cubes,
        )
        results.append((coef, intercept, margins, stats))
    (coef, intercept, margins, stats), (gcoef, gintercept, gmargins, gstats) = results
    np.testing.assert_allclose(gcoef, coef, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(gintercept, intercept, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(gmargins, margins, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(gstats, stats, rtol=1e-10, atol=1e-13)
    assert not np.allclose(gcoef, coef0)  # the epoch moved

    ref_coef, ref_intercept = coef0.copy(), np.array([0.1])
    ref_margins = dense @ ref_coef + 0.1
    reference.scd_epoch(problem, dense, y, ref_margins, ref_coef, ref_intercept, order)
    np.testing.assert_allclose(gcoef, ref_coef, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(gintercept, ref_intercept, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dtype,sparse", LAYOUTS)
@pytest.mark.parametrize("loss", ["squared", "hinge", "logistic", "squared_hinge"])
@pytest.mark.parametrize("rho", [0.0, 0.7])
def test_sdca_epoch_matches_cpu_and_reference(rng, dtype, sparse, loss, rho, monkeypatch):
    """With one block in the grid the GPU epoch is the CPU's, step for step."""
    monkeypatch.setattr(cuda, "SIMULATOR_BLOCKS", 1)
    X, dense, y = _data(rng, dtype, sparse)
    problem = obj.Problem(loss=loss, alpha=0.05, l1_ratio=0.0, fit_intercept=rho > 0)
    n, p = dense.shape
    alpha_n = problem.alpha * n
    a0 = 0.3 * y  # feasible and interior: β = 0.3 for every example
    order = rng.permutation(n)
    intercept = 0.2 if rho else 0.0
    m = MajorMatrix.from_array(X, "rows")
    results = []
    for kernels, matrix in ((cpu, m), (cuda, _on_device(m))):
        a, w = a0.copy(), dense.T @ a0 / alpha_n
        total = np.array([a.sum()])
        max_delta = kernels.sdca_epoch(
            matrix.data,
            matrix.indices,
            matrix.indptr,
            matrix.dense,
            p,
            y,
            a,
            w,
            order,
            problem.loss_code,
            alpha_n,
            m.sq_norms(),
            intercept,
            rho,
            total,
        )
        assert total[0] == pytest.approx(a.sum(), abs=1e-12)
        results.append((a, w, max_delta))
    (a, w, max_delta), (ga, gw, gmax_delta) = results
    np.testing.assert_allclose(ga, a, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(gw, w, rtol=1e-10, atol=1e-13)
    assert gmax_delta == pytest.approx(max_delta, rel=1e-10, abs=1e-13)
    assert gmax_delta > 0

    ref_a, ref_w = a0.copy(), dense.T @ a0 / alpha_n
    reference.sdca_epoch(problem, dense, y, ref_a, ref_w, order, intercept, rho)
    np.testing.assert_allclose(ga, ref_a, rtol=1e-8, atol=1e-11)
    np.testing.assert_allclose(gw, ref_w, rtol=1e-8, atol=1e-11)


def test_disjoint_columns_epoch_is_order_free(rng):
    """Columns with disjoint rows never race (no shared margin): the asynchronous epoch
    equals the sequential one whatever the schedule of the blocks, on any hardware."""
    n, p = 24, 6
    X = np.zeros((n, p))
    for j in range(p):
        X[4 * j : 4 * j + 4, j] = rng.normal(size=4)
    y = rng.normal(size=n)
    m = MajorMatrix.from_array(sp.csc_matrix(X), "columns")
    problem = obj.Problem(loss="squared", alpha=0.1, l1_ratio=0.5, fit_intercept=False)
    order = rng.permutation(p)
    coef, margins = np.zeros(p), np.zeros(n)
    g = _on_device(m)
    cuda.scd_epoch(
        g.data,
        g.indices,
        g.indptr,
        False,
        n,
        y,
        margins,
        coef,
        np.zeros(1),
        order,
        problem.loss_code,
        problem.l1,
        problem.l2,
        m.sq_norms(),
        np.zeros(0),
    )
    # Each coordinate's exact minimizer, column by column.
    expected = np.array(
        [
            scalar.prox_newton(
                0.0, -(X[:, j] @ y) / n, X[:, j] @ X[:, j] / n, problem.l1, problem.l2
            )
            for j in range(p)
        ]
    )
    np.testing.assert_allclose(coef, expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(margins, X @ expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("loss", ["squared", "hinge", "logistic"])
def test_sdca_epoch_of_concurrent_blocks_takes_eso_steps(rng, sparse, loss, monkeypatch):
    """B blocks stride over the order (block b: rows order[b], order[b + B], ...), and each
    row's curvature is the smaller ESO bound: ‖x_i‖² scaled by β = 1 + (B − 1)(ω − 1)/(n − 1),
    ω the most rows sharing a feature, or (1 − β′)‖x_i‖² + β′λ_max(XᵀX), β′ = (B − 1)/(n − 1).
    The simulator runs the blocks one after another: the CPU epoch over that visiting
    order with ‖x_i‖² replaced by that bound."""
    blocks = 3
    monkeypatch.setattr(cuda, "SIMULATOR_BLOCKS", blocks)
    X, dense, y = _data(rng, np.float64, sparse)
    n, p = dense.shape
    alpha_n = 0.05 * n
    code = obj.LOSS_CODES[loss]
    omega = int((dense != 0).sum(axis=0).max()) if sparse else n
    shared = (blocks - 1) / (n - 1)
    beta = 1.0 + shared * (omega - 1)
    lam = np.linalg.eigvalsh(dense.T @ dense).max()
    sq = (dense**2).sum(axis=1)
    bound = np.minimum(beta * sq, (1 - shared) * sq + shared * lam)
    assert (bound > sq).all()
    order = rng.permutation(n)
    m = MajorMatrix.from_array(X, "rows")
    a0 = 0.3 * y
    ga, gw, gtotal = a0.copy(), dense.T @ a0 / alpha_n, np.array([a0.sum()])
    g = _on_device(m)
    omega_used, lam_used = cuda._eso_constants(g.data, g.indices, g.indptr, g.dense, p, n)
    assert omega_used == omega and lam_used == pytest.approx(lam, rel=1e-6)
    cuda.sdca_epoch(
        g.data,
        g.indices,
        g.indptr,
        g.dense,
        p,
        y,
        ga,
        gw,
        order,
        code,
        alpha_n,
        m.sq_norms(),
        0.0,
        0.0,
        gtotal,
    )
    visits = np.concatenate([order[b::blocks] for b in range(blocks)])
    a, w, total = a0.copy(), dense.T @ a0 / alpha_n, np.array([a0.sum()])
    cpu.sdca_epoch(
        m.data,
        m.indices,
        m.indptr,
        m.dense,
        p,
        y,
        a,
        w,
        visits,
        code,
        alpha_n,
        np.minimum(beta * sq, (1 - shared) * sq + shared * lam_used),
        0.0,
        0.0,
        total,
    )
    np.testing.assert_allclose(ga, a, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(gw, w, rtol=1e-10, atol=1e-13)
    assert not np.allclose(ga, a0)
    assert device.dual_concurrency(g, n) == blocks
    assert device.dual_concurrency(m, n) == 1


def test_device_arrays_stay_on_device(rng):
    """Vectors given as device arrays are updated there (nothing copied back)."""
    X, dense, y = _data(rng)
    n, p = dense.shape
    m = MajorMatrix.from_array(X, "rows")
    g = _on_device(m)
    a, w, total = (cuda.to_device(v) for v in (np.zeros(n), np.zeros(p), np.zeros(1)))
    code = obj.LOSS_CODES["squared"]
    cuda.sdca_epoch(
        g.data,
        g.indices,
        g.indptr,
        True,
        p,
        cuda.to_device(y),
        a,
        w,
        cuda.to_device(np.arange(n)),
        code,
        0.05 * n,
        cuda.to_device(m.sq_norms()),
        0.0,
        0.0,
        total,
    )
    a, w = a.copy_to_host(), w.copy_to_host()
    assert np.abs(a).max() > 0
    np.testing.assert_allclose(w, dense.T @ a / (0.05 * n), rtol=1e-10, atol=1e-13)
    assert total.copy_to_host()[0] == pytest.approx(a.sum(), abs=1e-12)


def test_threads_per_block_is_a_power_of_two_in_bounds():
    for length in (0, 1, 20, 33, 1000, 10**6):
        threads = cuda.threads_per_block(length)
        assert threads & (threads - 1) == 0
        assert min(cuda.MIN_THREADS, cuda.MAX_THREADS) <= threads <= cuda.MAX_THREADS
        assert threads >= min(length, cuda.MAX_THREADS) or threads == cuda.MAX_THREADS


def test_kernels_chosen_by_array_type(rng):
    x = rng.normal(size=5)
    assert device.kernels_for(x) is cpu
    assert device.kernels_for(cuda.to_device(x)) is cuda
    m = MajorMatrix.from_array(rng.normal(size=(4, 3)), "columns")
    assert device.place(m, "cpu") is m
    assert device.kernels_for(device.place(m, "gpu").data) is cuda


# --------------------------------------------------------------------------- fit


def _problem_data(rng, sparse, classification, n=20, p=8):
    X = rng.normal(size=(n, p))
    X[rng.random(X.shape) < 0.4] = 0.0
    y = X @ rng.normal(size=p) + 0.1 * rng.normal(size=n)
    if classification:
        y = np.where(y + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return (sp.csr_matrix(X) if sparse else X), y


FITS = [  # (loss, penalty, solver): the primal and the dual kernels
    ("squared", "l2", "scd"),
    ("squared", "l1", "scd"),
    ("logistic", "l2", "scd"),
    ("squared", "l2", "sdca"),
    ("hinge", "l2", "sdca"),
    ("logistic", "l2", "sdca"),
]


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("loss,penalty,solver", FITS)
def test_fit_on_gpu_equals_cpu(rng, sparse, loss, penalty, solver):
    X, y = _problem_data(rng, sparse, loss != "squared")
    # The lasso's objective is flat along its support's weakest direction here: a gap of
    # 1e-8 pins its coefficients to ~1e-5 only, so both devices go to 1e-10 for 1e-6.
    tol = 1e-10 if penalty == "l1" else 1e-8
    kwargs = {
        "loss": loss,
        "penalty": penalty,
        "alpha": 0.1,
        "tol": tol,
        "solver": solver,
        "random_state": 0,
    }
    on_cpu = dask_scd.fit(X, y, device="cpu", **kwargs)
    on_gpu = dask_scd.fit(X, y, device="gpu", **kwargs)
    assert on_gpu.converged_ and on_gpu.dual_gap_ <= tol
    assert on_gpu.solver_ == solver
    # The devices may run different kernels (the CPU centers the squared loss's columns):
    # each is within √(2G/α) of the optimum in θ, P being α-strongly convex in θ; the
    # intercept moves with θ through the mean row, ‖x̄‖ ≤ 1 here.
    atol = 1e-6
    if penalty == "l2":
        gaps = [f.dual_gap_ * abs(f.primal_) for f in (on_cpu, on_gpu)]
        atol = max(atol, sum(np.sqrt(2 * g / kwargs["alpha"]) for g in gaps))
    np.testing.assert_allclose(on_gpu.coef_, on_cpu.coef_, atol=atol)
    assert on_gpu.intercept_ == pytest.approx(on_cpu.intercept_, abs=2 * atol)


def test_fit_never_modifies_data_on_gpu(rng):
    X, y = _problem_data(rng, False, False)
    X0, y0 = X.copy(), y.copy()
    dask_scd.fit(X, y, alpha=0.1, solver="sdca", device="gpu", tol=1e-4)
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(y, y0)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("loss,alpha,l1_ratio", [("squared", 0.1, 1.0), ("hinge", 0.05, 0.0)])
def test_duhl_with_device_memory_equals_host_memory(rng, sparse, loss, alpha, l1_ratio):
    """DuHL with the GPU as fast memory: chunks loaded into device memory, epochs by the
    CUDA kernels; the same model as with RAM as fast memory, the same budget kept."""
    from dask_scd.data.memory import InMemory
    from dask_scd.engines.base import Options
    from dask_scd.engines.local.duhl import fit_duhl
    from dask_scd.engines.options import DuHLOptions

    X, dense, y = _data(rng, sparse=sparse, n=24, p=8)
    if loss == "squared":
        y = dense @ rng.normal(size=8) + 0.1 * rng.normal(size=24)
    problem = obj.Problem(loss=loss, alpha=alpha, l1_ratio=l1_ratio, fit_intercept=True)
    engine = {"chunk_size": 2, "local_epochs": 2, "memory_budget": dense.nbytes // 2}
    runs = [
        fit_duhl(
            InMemory(X, y),
            problem,
            Options(1e-8, 300, np.random.default_rng(0), engine=DuHLOptions(**engine), device=d),
        )
        for d in ("cpu", "gpu")
    ]
    on_cpu, on_gpu = runs
    assert on_cpu.converged(1e-8) and on_gpu.converged(1e-8)
    np.testing.assert_allclose(on_gpu.coef, on_cpu.coef, rtol=0, atol=1e-6)
    assert on_gpu.intercept == pytest.approx(on_cpu.intercept, abs=1e-6)
    counts = on_gpu.extras
    assert 0 < counts["peak_bytes"] <= counts["memory_budget"]
    assert counts["bytes_moved"] > 0


def test_gpu_auto_solver_takes_an_engine_with_gpu_kernels(rng):
    X, y = _problem_data(rng, False, False, n=40, p=4)  # a tiny ridge: exact on the CPU
    assert dask_scd.fit(X, y, alpha=0.1, tol=1e-4).solver_ == "newton"
    on_gpu = dask_scd.fit(X, y, alpha=0.1, tol=1e-4, device="gpu")
    assert on_gpu.solver_ in ("scd", "sdca") and on_gpu.converged_  # kernels on the GPU
    with pytest.raises(
        ValueError,
        match=r"device='gpu': solver='gram' runs .* on the CPU "
        r"only; .* on a GPU: \['scd', 'sdca'\]",
    ):
        dask_scd.fit(X, y, alpha=0.1, solver="gram", device="gpu")
    # "auto" never refuses: the Gram engine runs on the CPU.
    assert dask_scd.fit(X, y, alpha=0.1, tol=1e-4, solver="gram", device="auto").converged_


def test_dask_engines_on_host_chunks_refuse_the_gpu(rng):
    """The Dask engines run where the chunks are: host chunks with device="gpu" is a clear
    error (tests/test_gpu_cells.py runs them on device chunks)."""
    da = pytest.importorskip("dask.array")
    X, y = _problem_data(rng, False, False)
    with pytest.raises(ValueError, match="runs on chunks in device memory"):
        dask_scd.fit(da.from_array(X, chunks=(10, 8)), y, solver="block_scd", device="gpu")


def test_device_auto_takes_the_gpu_when_there_is_one(rng, monkeypatch):
    X, y = _problem_data(rng, False, True)
    launches = []

    def counted(*args):
        launches.append(1)
        return epoch(*args)

    epoch = cuda.sdca_epoch
    monkeypatch.setattr(cuda, "sdca_epoch", counted)
    fit = dask_scd.fit(X, y, loss="logistic", alpha=0.05, tol=1e-6, solver="sdca", device="auto")
    assert fit.converged_ and len(launches) == fit.n_iter_


def test_unknown_device_is_refused(rng):
    X, y = _problem_data(rng, False, False)
    with pytest.raises(ValueError, match="device='tpu' is not one of 'cpu', 'gpu', 'auto'"):
        dask_scd.fit(X, y, device="tpu")


def test_without_a_gpu(tmp_path):
    """In a fresh process with CUDA disabled: importing dask_scd and fitting on the CPU
    import no numba.cuda, "auto" falls back to the CPU, and "gpu" is one clear error."""
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import dask_scd
        X = np.random.default_rng(0).normal(size=(20, 3))
        y = X @ np.ones(3)
        dask_scd.fit(X, y, solver="scd", tol=1e-6)
        assert "numba.cuda" not in sys.modules, "numba.cuda imported by a CPU fit"
        assert dask_scd.fit(X, y, solver="scd", tol=1e-6, device="auto").converged_
        try:
            dask_scd.fit(X, y, solver="scd", device="gpu")
        except RuntimeError as error:
            print(error)
        else:
            raise AssertionError("device='gpu' ran without a GPU")
    """)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", NUMBA_DISABLE_CUDA="1")
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "device='gpu' needs a CUDA GPU" in out.stdout


# Compiled for sm_80 as numba.cuda compiles for a real GPU: the simulator runs the scalar
# functions as CPU code, so a NumPy function or builtin that numba.cuda cannot lower (np.abs,
# min/max of floats) passes there and fails only on hardware. numba compiles device
# functions for the current device's compute capability, so the script names one.
_COMPILE = """
import numba.cuda.dispatcher
from numba import cuda, types

class Device:
    compute_capability = (8, 0)

numba.cuda.dispatcher.get_current_device = Device
from dask_scd.kernels import cuda as kernels

f64, i64, flag = types.float64, types.int64, types.boolean
vec = f64[::1]
for dtype in (types.float32, f64):
    for index in (types.int32, i64):
        matrix = (dtype[::1], index[::1], index[::1], flag, i64)
        primal = (*matrix, vec, vec, vec, vec, i64[::1], i64, f64, f64, vec, vec, flag, vec)
        eso = (f64, f64, f64, f64)
        dual = (*matrix, vec, vec, vec, i64[::1], i64, f64, vec, f64, f64, vec, vec, *eso)
        for kernel, signature in ((kernels._scd_kernel, primal), (kernels._sdca_kernel, dual)):
            ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(8, 0))
            assert "bar.sync" in ptx and "atom.global.add.f64" in ptx
print("compiled")
"""


def test_kernels_compile_for_the_gpu(tmp_path):
    """Both kernels, every dtype and index type, compile to PTX with barriers and atomic
    adds (needs libNVVM only, no GPU: ``pip install nvidia-cuda-nvcc-cu12``)."""
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
    assert "compiled" in out.stdout
