import glob
import importlib
import importlib.util
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

# The tests marked gpu run the CUDA kernels under numba's simulator, unless told otherwise
# (NUMBA_ENABLE_CUDASIM=0 on a machine with a GPU). numba reads it when numba.cuda is first
# imported (nothing above imports numba); it changes nothing on the CPU.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


def _thread_safe_simulator():
    """Mend two races of numba's CUDA simulator that the kernels' tests meet.

    The simulator runs the threads of a block as Python threads, and the tests shorten the
    GIL switch interval to make them fast, which makes the races frequent:

    - ``FakeCUDAShared.array`` keys a block's shared arrays by the calling line and creates
      one on the first thread to ask, with a lookup and an insert that are not atomic: two
      threads of a launch's first block can each get their own array, and a tree reduction
      then sums only part of the block (seen: one column sum in ~50 launches of 4 threads).
    - ``swapped_cuda_module`` replaces ``numba.cuda`` by the fake module in a device
      function's globals on entry and puts it back on exit, per thread: a device function in
      another module than its kernel (``kernels.cuda._block_sums``, called from
      ``kernels.cuda_cells``) can have the real module put back by a thread that leaves
      while another is still inside (AttributeError on ``cuda.syncthreads``).

    On a GPU neither can happen. Here the allocation is done under a lock, and the swap is
    counted per module: the first to enter swaps, the last to leave restores.
    """
    from contextlib import contextmanager

    from numba import config

    if not config.ENABLE_CUDASIM:
        return
    from numba.core import types
    from numba.cuda.simulator import kernel, kernelapi
    from numba.np import numpy_support

    if getattr(kernelapi.FakeCUDAShared.array, "thread_safe", False):
        return
    original = kernelapi.FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype):
        if shape == 0:  # dynamic shared memory: one buffer, no race
            return original(self, shape, dtype)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                if isinstance(dtype, types.Type):
                    dtype = numpy_support.as_dtype(dtype)
                res = self._allocations[caller] = np.empty(shape, dtype)
        return res

    swaps = {}  # id(globals) -> [threads inside, the names that held numba.cuda]

    @contextmanager
    def swapped_cuda_module(fn, fake_cuda_module):
        from numba import cuda

        names = fn.__globals__
        with lock:
            entry = swaps.get(id(names))
            if entry is None:
                orig = {k: v for k, v in names.items() if v is cuda}
                names.update(dict.fromkeys(orig, fake_cuda_module))
                entry = swaps[id(names)] = [0, orig]
            entry[0] += 1
        try:
            yield
        finally:
            with lock:
                entry[0] -= 1
                if entry[0] == 0:
                    names.update(entry[1])
                    del swaps[id(names)]

    array.thread_safe = True
    kernelapi.FakeCUDAShared.array = array
    kernel.swapped_cuda_module = swapped_cuda_module


_thread_safe_simulator()

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def import_benchmark(name: str):
    """The script benchmarks/``name``.py as a module. The scripts pin their thread counts
    in os.environ at import: the environment is restored after it, so that neither the
    test session nor the dask workers it starts later inherit them."""
    saved = dict(os.environ)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
        os.environ.clear()
        os.environ.update(saved)


def shared_dataset(name: str):
    """A LIBSVM data set from ../shared/data, or a clean skip where it is absent."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} not present (only on the project's machines)")
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(str(path), n_features=123)
    # The loader may hand out int64 indices, which some scikit-learn solvers refuse.
    X = sp.csr_matrix(
        (X.data, X.indices.astype(np.int32), X.indptr.astype(np.int32)), shape=X.shape
    )
    return X, y


@pytest.fixture(scope="module")
def client():
    """A 2-worker in-process LocalCluster's client, shared by a module's tests (a module
    that needs another cluster defines its own ``client``)."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def started(monkeypatch):
    """Every LocalCluster started from now on (a test's own is started before it clears
    this list): the library must start none."""
    import distributed

    calls = []
    original = distributed.LocalCluster

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(distributed, "LocalCluster", spy)
    return calls


def nvvm_home():
    """CUDA_HOME, a toolkit in /usr/local/cuda*, or the pip wheel nvidia-cuda-nvcc-cu12
    (libNVVM and libdevice): what the PTX-compile tests of the GPU kernels need; None when
    none is there."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    for home in sorted(glob.glob("/usr/local/cuda*"), reverse=True):
        for lib in ("nvvm/lib64", "lib", "lib64"):
            if os.path.exists(os.path.join(home, lib, "libnvvm.so")):
                return home
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec else []:
        home = os.path.join(root, "cuda_nvcc")
        if os.path.exists(os.path.join(home, "nvvm", "lib64", "libnvvm.so")):
            return home
    return None
