import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

# The tests marked gpu run the CUDA kernels under numba's simulator, unless told otherwise
# (NUMBA_ENABLE_CUDASIM=0 on a machine with a GPU). numba reads it when numba.cuda is first
# imported (nothing above imports numba); it changes nothing on the CPU.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def shared_dataset(name: str):
    """A LIBSVM data set from ../shared/data, or a clean skip where it is absent."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} not present (only on the project's machines)")
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(str(path), n_features=123)
    # The loader may hand out int64 indices, which some scikit-learn solvers refuse.
    X = sp.csr_matrix((X.data, X.indices.astype(np.int32), X.indptr.astype(np.int32)), shape=X.shape)
    return X, y


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
    """CUDA_HOME, or the pip wheel nvidia-cuda-nvcc-cu12 (libNVVM and libdevice): what
    the PTX-compile tests of the GPU kernels need; None when neither is there."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations if spec else []):
        home = os.path.join(root, "cuda_nvcc")
        if os.path.exists(os.path.join(home, "nvvm", "lib64", "libnvvm.so")):
            return home
    return None
