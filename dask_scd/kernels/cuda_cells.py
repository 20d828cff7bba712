"""CUDA kernels of the block engines' cell statistics, for a cell held in device memory.

The same reductions as the CPU path of :class:`dask_scd.engines.block.block_ops.CellView` and
:func:`dask_scd.kernels.block.coordinate_trials`, batched over the columns of a cell in
the manner of TPA-SCD (:mod:`dask_scd.kernels.cuda`): one thread block per column (per
pair of columns for the Gram matrix), its threads striding over the column's stored
entries, their partial sums combined by the shared-memory tree reduction
:func:`~dask_scd.kernels.cuda._block_sums`, and thread 0 writing the column's result.
Each of those results is written by one block only, in a fixed order of summation for a
given number of threads, so they do not depend on how the blocks are scheduled. Two
outputs are raced: X d of a sparse cell (the columns scatter into shared rows: atomic
adds, whose order of arrival rounds differently from run to run) and the counts of
:func:`inspect` (atomic integer adds and maxima, exact in any order).

A cell is a dense 2-D device array (any strides: it is indexed, never flattened) or a CSC
triple in device memory with sorted, distinct row indices (:class:`Columns`). The host
wrappers take host vectors (labels, margins, directions), copy them to the device, and
return host numpy arrays: per-column sums, or X d with one value per row of the cell.

This module imports ``numba.cuda``: import it only when a cell is on the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, float64

from dask_scd.kernels import block as block_kernels
from dask_scd.kernels import cuda as tpa
from dask_scd.kernels.cuda import _SHARED, _block_sums

# Step sizes a trial kernel holds per thread (in registers): the engines try 4.
MAX_STEPS = 8
# Threads per block of the one-thread-per-row kernel (X d of a dense cell).
_ROW_THREADS = 128


# --------------------------------------------------------------------- the cell


@dataclass(frozen=True)
class Columns:
    """A cell in device memory read by columns: ``X`` (n_rows, n_columns) when ``dense``,
    else the CSC triple (``data``, ``indices``, ``indptr``). The unused arrays are one
    element long (a kernel takes all of them; only ``dense`` tells which it reads)."""

    X: object
    data: object
    indices: object
    indptr: object
    dense: bool
    n_rows: int
    n_columns: int

    def args(self):
        return self.X, self.data, self.indices, self.indptr, self.dense

    @property
    def nbytes(self) -> int:
        if self.dense:
            return int(self.X.nbytes)
        return int(self.data.nbytes + self.indices.nbytes + self.indptr.nbytes)


def columns(cell) -> Columns:
    """The :class:`Columns` of a cell on the device: a 2-D device array (numba or cupy),
    or a sparse matrix whose triple is on the device (``cupyx.scipy.sparse`` in any
    format, converted to CSC there; :class:`dask_scd.kernels.device.DeviceCSC`)."""
    n_rows, n_columns = (int(s) for s in cell.shape)
    if not (hasattr(cell, "indptr") or hasattr(cell, "tocsc")):  # a dense array
        return Columns(
            cell, _dummy(np.float64), _dummy(np.int32), _dummy(np.int32), True, n_rows, n_columns
        )
    if getattr(cell, "format", "csc") != "csc":
        cell = cell.tocsc()
    if not getattr(cell, "has_canonical_format", True):
        cell = cell.copy()
        cell.sum_duplicates()  # the Gram kernel's search needs sorted, distinct rows
    return Columns(
        _dummy(np.float64, 2), cell.data, cell.indices, cell.indptr, False, n_rows, n_columns
    )


def _dummy(dtype, ndim=1):
    return cuda.device_array((1,) * ndim, dtype=dtype)


def _to_device(vector):
    return cuda.to_device(np.ascontiguousarray(vector, dtype=np.float64))


def _threads(cols: Columns) -> int:
    """Threads per block for the stored entries of a mean column."""
    return tpa.threads_per_block(
        tpa.mean_line_length(cols.data, cols.dense, cols.n_rows, cols.n_columns)
    )


# ------------------------------------------------------------------ device helpers


@cuda.jit(device=True)
def _span(dense, indptr, j, n_rows):
    """[start, end) of column j's stored entries."""
    if dense:
        return np.int64(0), np.int64(n_rows)
    return np.int64(indptr[j]), np.int64(indptr[j + 1])


@cuda.jit(device=True)
def _stride(dense, indptr, j, n_rows):
    """(first, end, step): the range of column j's stored entries that this thread reads."""
    start, end = _span(dense, indptr, j, n_rows)
    return tpa._stride(start, end)


@cuda.jit(device=True)
def _entry(X, data, indices, dense, j, idx):
    """(row, value) of column j's entry idx."""
    if dense:
        return idx, np.float64(X[idx, j])
    return np.int64(indices[idx]), np.float64(data[idx])


@cuda.jit(device=True)
def _value_at(X, data, indices, dense, k, lo, hi, i):
    """X[i, k]: read for a dense cell, searched in column k's sorted rows [lo, hi) else."""
    if dense:
        return np.float64(X[i, k])
    while lo < hi:
        mid = (lo + hi) // 2
        row = np.int64(indices[mid])
        if row == i:
            return np.float64(data[mid])
        if row < i:
            lo = mid + 1
        else:
            hi = mid
    return 0.0


@cuda.jit(device=True)
def _power(x, p):
    """x, x² or |x|³ (the linear, curvature and cubic sums of a column)."""
    if p == 1:
        return x
    if p == 2:
        return x * x
    return abs(x) * x * x


# kernels.block's CPU function compiled as a device function, on this thread's own
# ``changes`` (K, 1): a device function may not pass arrays to a CPU-compiled one.
_add_changes = cuda.jit(device=True)(block_kernels._add_changes.py_func)


# --------------------------------------------------------------------- kernels


@cuda.jit
def _column_sums_kernel(
    X, data, indices, indptr, dense, n_rows, a, b, power_a, power_b, out_a, out_b
):
    """Block j: out_a[j] = Σ_i a_i x_ij^power_a and out_b[j] = Σ_i b_i x_ij^power_b."""
    cache = cuda.shared.array((2, _SHARED), float64)
    j = cuda.blockIdx.x
    part_a = 0.0
    part_b = 0.0
    for idx in range(*_stride(dense, indptr, j, n_rows)):
        i, x = _entry(X, data, indices, dense, j, idx)
        part_a += a[i] * _power(x, power_a)
        part_b += b[i] * _power(x, power_b)
    sum_a, sum_b = _block_sums(cache, part_a, part_b)
    if cuda.threadIdx.x == 0:
        out_a[j] = sum_a
        out_b[j] = sum_b


@cuda.jit
def _dense_matvec_kernel(X, d, out):
    """Thread i: out[i] = Σ_j X[i, j] d[j], the columns in order (as the CPU's row dot)."""
    i = cuda.grid(1)
    if i < X.shape[0]:
        s = 0.0
        for j in range(X.shape[1]):
            s += np.float64(X[i, j]) * d[j]
        out[i] = s


@cuda.jit
def _sparse_matvec_kernel(data, indices, indptr, d, out):
    """Block j: out += d_j X[:, j]; out starts at zero."""
    j = cuda.blockIdx.x
    dj = d[j]
    if dj == 0.0:
        return
    for idx in range(*_stride(False, indptr, j, 0)):
        # Columns share rows: blocks race for out[i].
        cuda.atomic.add(out, indices[idx], dj * np.float64(data[idx]))


@cuda.jit
def _gram_kernel(
    X,
    data,
    indices,
    indptr,
    dense,
    X2,
    data2,
    indices2,
    indptr2,
    dense2,
    n_rows,
    n_other,
    weights,
    symmetric,
    out,
):
    """Block (j, k): out[j, k] = Σ_i w_i X[i, j] X2[i, k], over column j's stored entries.

    ``symmetric`` (X2 is X): only blocks with k ≥ j run, and write out[k, j] too.
    """
    cache = cuda.shared.array((2, _SHARED), float64)
    j = cuda.blockIdx.x // n_other
    k = cuda.blockIdx.x % n_other
    if symmetric and k < j:
        return  # the whole block returns: no barrier is left waiting
    lo, hi = _span(dense2, indptr2, k, n_rows)
    part = 0.0
    for idx in range(*_stride(dense, indptr, j, n_rows)):
        i, x = _entry(X, data, indices, dense, j, idx)
        if x != 0.0:
            part += weights[i] * x * _value_at(X2, data2, indices2, dense2, k, lo, hi, i)
    total, _ = _block_sums(cache, part, 0.0)
    if cuda.threadIdx.x == 0:
        out[j, k] = total
        if symmetric:
            out[k, j] = total


@cuda.jit
def _trials_kernel(
    X, data, indices, indptr, dense, n_rows, y, margins, direction, steps, quarters, loss, out
):
    """Block j: out[k, j] = Σ_i ℓ(ŷ_i + steps[k]·d_j·x_ij) − ℓ(ŷ_i) over column j's
    non-zeros (:func:`dask_scd.kernels.block.coordinate_trials`, one column per block)."""
    cache = cuda.shared.array((2, _SHARED), float64)
    changes = cuda.local.array((MAX_STEPS, 1), float64)
    j = cuda.blockIdx.x
    dj = direction[j]
    if dj == 0.0:
        return  # out is zero there; the whole block returns
    n_steps = steps.shape[0]
    for k in range(n_steps):
        changes[k, 0] = 0.0
    for idx in range(*_stride(dense, indptr, j, n_rows)):
        i, x = _entry(X, data, indices, dense, j, idx)
        if x != 0.0:
            _add_changes(loss, y[i], margins[i], dj * x, steps, quarters, changes, 0)
    for k in range(0, n_steps, 2):
        second = changes[k + 1, 0] if k + 1 < n_steps else 0.0
        first_sum, second_sum = _block_sums(cache, changes[k, 0], second)
        if cuda.threadIdx.x == 0:
            out[k, j] = first_sum
            if k + 1 < n_steps:
                out[k + 1, j] = second_sum


@cuda.jit
def _inspect_kernel(X, data, indices, indptr, dense, n_rows, largest, bad, row_counts):
    """Block j: largest[0] ← max finite |x_ij|, bad[0] += non-finite entries, and
    row_counts[i] += 1 per non-zero (dense) or stored entry (sparse), as on the CPU."""
    j = cuda.blockIdx.x
    top = 0.0
    n_bad = 0
    for idx in range(*_stride(dense, indptr, j, n_rows)):
        i, x = _entry(X, data, indices, dense, j, idx)
        if math.isfinite(x):
            if abs(x) > top:  # not max(): numba.cuda does not lower max of floats
                top = abs(x)
        else:
            n_bad += 1
        if not dense or x != 0.0:
            cuda.atomic.add(row_counts, i, 1)  # columns share rows: blocks race
    cuda.atomic.max(largest, 0, top)
    if n_bad:
        cuda.atomic.add(bad, 0, n_bad)


# ------------------------------------------------------------------ host wrappers


def column_sums(cols: Columns, a, power_a: int, b=None, power_b: int = 1):
    """(Σ_i a_i x_ij^power_a, Σ_i b_i x_ij^power_b) for every column j, on the host.

    Powers are 1 (Xᵀa), 2 ((X∘X)ᵀa) or 3 (|X|³ᵀa). Without ``b`` the second is None.
    """
    n = cols.n_columns
    if n == 0 or cols.n_rows == 0:
        return np.zeros(n), (None if b is None else np.zeros(n))
    d_a = _to_device(a)
    d_b = d_a if b is None else _to_device(b)
    out_a, out_b = cuda.device_array(n), cuda.device_array(n)
    _column_sums_kernel[n, _threads(cols)](
        *cols.args(),
        cols.n_rows,
        d_a,
        d_b,
        power_a,
        power_a if b is None else power_b,
        out_a,
        out_b,
    )
    return out_a.copy_to_host(), (None if b is None else out_b.copy_to_host())


def matvec(cols: Columns, d) -> np.ndarray:
    """X d, shape (n_rows,), on the host."""
    if cols.n_rows == 0 or cols.n_columns == 0:
        return np.zeros(cols.n_rows)
    d_d = _to_device(d)
    if cols.dense:
        out = cuda.device_array(cols.n_rows)
        blocks = (cols.n_rows + _ROW_THREADS - 1) // _ROW_THREADS
        _dense_matvec_kernel[blocks, _ROW_THREADS](cols.X, d_d, out)
    else:
        out = cuda.to_device(np.zeros(cols.n_rows))
        _sparse_matvec_kernel[cols.n_columns, _threads(cols)](
            cols.data, cols.indices, cols.indptr, d_d, out
        )
    return out.copy_to_host()


def gram(cols: Columns, weights, other: Columns | None = None) -> np.ndarray:
    """Xᵀ diag(weights) X2 as a dense (n_columns, other.n_columns) host array; X2 = X
    (computed once per pair j ≤ k, mirrored) when ``other`` is None."""
    symmetric = other is None
    other = cols if symmetric else other
    n, m = cols.n_columns, other.n_columns
    if n == 0 or m == 0 or cols.n_rows == 0:
        return np.zeros((n, m))
    out = cuda.device_array((n, m))
    _gram_kernel[n * m, _threads(cols)](
        *cols.args(), *other.args(), cols.n_rows, m, _to_device(weights), symmetric, out
    )
    return out.copy_to_host()


def trials(cols: Columns, loss: int, y, margins, direction, steps) -> np.ndarray:
    """(K, n_columns) loss changes per step size and column; see
    :func:`dask_scd.kernels.block.coordinate_trials`."""
    steps = np.ascontiguousarray(steps, dtype=np.float64)
    if len(steps) > MAX_STEPS:
        raise ValueError(f"{len(steps)} trial steps; the kernel holds at most {MAX_STEPS}")
    if cols.n_rows == 0 or cols.n_columns == 0:
        return np.zeros((len(steps), cols.n_columns))
    out = cuda.to_device(np.zeros((len(steps), cols.n_columns)))
    _trials_kernel[cols.n_columns, _threads(cols)](
        *cols.args(),
        cols.n_rows,
        _to_device(y),
        _to_device(margins),
        _to_device(direction),
        cuda.to_device(steps),
        block_kernels.are_quarters(steps),
        loss,
        out,
    )
    return out.copy_to_host()


def inspect(cols: Columns) -> tuple[float, np.ndarray]:
    """(max |x|, NaN when an entry is not finite; entries per row) of a cell."""
    row_counts = cuda.to_device(np.zeros(cols.n_rows, dtype=np.int64))
    if cols.n_rows == 0 or cols.n_columns == 0:
        return 0.0, row_counts.copy_to_host()
    largest = cuda.to_device(np.zeros(1))
    bad = cuda.to_device(np.zeros(1, dtype=np.int64))
    _inspect_kernel[cols.n_columns, _threads(cols)](
        *cols.args(), cols.n_rows, largest, bad, row_counts
    )
    top = float(largest.copy_to_host()[0]) if bad.copy_to_host()[0] == 0 else math.nan
    return top, row_counts.copy_to_host()
