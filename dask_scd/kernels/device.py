"""Where an epoch runs: the CPU kernels or the CUDA kernels, chosen by where X lives.

``device=`` of :func:`dask_scd.fit` is resolved here once (:func:`resolve`); the engine
then places its matrix (:func:`place`) and takes the kernels that match the array type
(:func:`kernels_for`): numpy arrays → :mod:`dask_scd.kernels.cpu`, device arrays (numba
or cupy) → :mod:`dask_scd.kernels.cuda`. ``numba.cuda`` is imported only when a GPU is
asked for, never by ``import dask_scd``.
"""

from __future__ import annotations

import dataclasses

DEVICES = ("cpu", "gpu", "auto")
# Engines over dask whose cell kernels follow the cells (device memory or host).
DASK_ENGINES = ("block_scd", "block_newton")


def resolve(device: str) -> str:
    """``"cpu"`` or ``"gpu"`` for the user's ``device=``.

    ``"auto"`` is ``"gpu"`` when numba.cuda finds a usable GPU (or runs its simulator,
    ``NUMBA_ENABLE_CUDASIM=1``), else ``"cpu"``; ``"gpu"`` without one is an error.
    """
    if device not in DEVICES:
        raise ValueError(f"device={device!r} is not one of {', '.join(map(repr, DEVICES))}")
    if device == "cpu":
        return "cpu"
    if gpu_available():
        return "gpu"
    if device == "auto":
        return "cpu"
    raise RuntimeError(
        "device='gpu' needs a CUDA GPU, and numba.cuda finds none here (no NVIDIA driver "
        "or device); use device='cpu', or device='auto' to take a GPU when there is one"
    )


def gpu_available() -> bool:
    """Whether numba.cuda can launch kernels: a GPU with its driver, or the simulator."""
    try:
        from numba import cuda
    except ImportError:  # pragma: no cover - numba without its CUDA target
        return False
    return bool(cuda.is_available())


def place(matrix, device: str):
    """The copy of a :class:`~dask_scd.kernels.layout.MajorMatrix` that epochs read: itself
    on the CPU; on the GPU its triple copied to device memory once, for the whole fit."""
    if device != "gpu":
        return matrix
    from dask_scd.kernels import cuda

    return dataclasses.replace(
        matrix,
        data=cuda.to_device(matrix.data),
        indices=cuda.to_device(matrix.indices),
        indptr=cuda.to_device(matrix.indptr),
    )


def join(joined, pieces: list):
    """The device copy of ``joined``, a MajorMatrix of the lines of ``pieces`` end to end,
    made from the pieces' device copies (:func:`place`): values and indices are copied on
    the device, only the line pointers (O(lines) numbers) come from the host."""
    if not pieces:
        return place(joined, "gpu")
    from dask_scd.kernels import cuda

    data = _concatenate([m.data for m in pieces])
    indices = (
        cuda.to_device(joined.indices)
        if joined.dense
        else _concatenate([m.indices for m in pieces])
    )
    return dataclasses.replace(
        joined, data=data, indices=indices, indptr=cuda.to_device(joined.indptr)
    )


def _concatenate(arrays: list):
    """One device array of the device ``arrays`` end to end, copied device to device."""
    from numba import cuda

    out = cuda.device_array(sum(int(a.shape[0]) for a in arrays), dtype=arrays[0].dtype)
    start = 0
    for a in arrays:
        stop = start + int(a.shape[0])
        if stop > start:
            out[start:stop].copy_to_device(a)
        start = stop
    return out


def is_device_array(array) -> bool:
    """A numba device array or any array exporting ``__cuda_array_interface__`` (cupy)."""
    return bool(getattr(array, "__cuda_ndarray__", False)) or hasattr(
        array, "__cuda_array_interface__"
    )


def on_device(cell) -> bool:
    """Whether a cell's values live in device memory: a device array, or a sparse matrix
    whose ``data`` is one (``cupyx.scipy.sparse``, :class:`DeviceCSC`)."""
    return is_device_array(cell) or is_device_array(getattr(cell, "data", None))


@dataclasses.dataclass(frozen=True)
class DeviceCSC:
    """A sparse (n_rows, n_columns) matrix in CSC form whose triple is in device memory
    (numba device arrays or cupy arrays), row indices sorted and distinct in each column:
    a sparse cell on the GPU where ``cupyx.scipy.sparse`` is not installed."""

    data: object
    indices: object
    indptr: object
    shape: tuple

    format = "csc"
    has_canonical_format = True

    @classmethod
    def from_scipy(cls, matrix) -> "DeviceCSC":
        """The device copy of a scipy.sparse matrix (any format, duplicates summed)."""
        import scipy.sparse as sp
        from numba import cuda

        csc = sp.csc_matrix(matrix, copy=True)
        csc.sum_duplicates()
        return cls(
            cuda.to_device(csc.data),
            cuda.to_device(csc.indices),
            cuda.to_device(csc.indptr),
            tuple(int(s) for s in csc.shape),
        )

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + self.indices.nbytes + self.indptr.nbytes)


def kernels_for(array):
    """The kernel module for data held in ``array``: ``kernels.cuda`` for device arrays,
    ``kernels.cpu`` for numpy (both expose ``scd_epoch`` and ``sdca_epoch``)."""
    if is_device_array(array):
        from dask_scd.kernels import cuda

        return cuda
    from dask_scd.kernels import cpu

    return cpu


def dual_concurrency(matrix, n_rows: int) -> int:
    """How many rows a dual (SDCA) epoch over ``matrix`` steps at once where it lives: 1
    on the CPU (one thread's rows, one at a time), the grid's blocks on the GPU
    (:func:`dask_scd.kernels.cuda.dual_blocks`). The engines divide the method of
    multipliers' ρ by it: the B rows' steps on the shared Σa then add up to one step of ρ,
    as one row's does on the CPU."""
    if not is_device_array(matrix.data):
        return 1
    from dask_scd.kernels import cuda

    return cuda.dual_blocks(
        n_rows, cuda.mean_line_length(matrix.data, matrix.dense, matrix.n_minor, n_rows)
    )
