"""CUDA epoch kernels: TPA-SCD (twice parallel, asynchronous SCD; Algorithm 2 of the TPA-SCD
paper) for primal SCD over columns and dual SDCA over rows.

One thread block per coordinate of the epoch's ``order``, all launched at once: the blocks
run concurrently on the streaming multiprocessors, so an epoch is *asynchronous* (a block
may read margins, or w, that another block is updating). Inside a block the threads stride
over the coordinate's non-zeros, sum their partial products in a shared-memory tree
reduction, every thread derives the same step from the sums, and the threads write the
step into the shared vector (margins Xθ + b, or w) with atomic adds. The update math is
:mod:`dask_scd.kernels.scalar`, compiled here as device functions.

The host wrappers :func:`scd_epoch` and :func:`sdca_epoch` take the arguments of their
namesakes in :mod:`dask_scd.kernels.cpu`, in place as they are: the matrix triple lives on
the device (see :func:`dask_scd.kernels.device.place`); any vector given as a numpy array
is copied to the device and, when the kernel writes it, back into the same array.

This module imports ``numba.cuda``: import it only through :mod:`dask_scd.kernels.device`.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

# numba-cuda 0.30 registers an overload of np.row_stack, an alias of np.vstack that numpy
# 2.5 removed: its first kernel compilation then fails with an AttributeError (seen on an
# H100 with numpy 2.5.2). The alias restores what it expects; nothing else reads it.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

from numba import cuda, float64  # noqa: E402

from dask_scd.kernels import lines, scalar  # noqa: E402

# Threads of a block's tree reduction in shared memory: the most a launch may use.
_SHARED = 256
# Launches use a power of two of threads per block between these two: at least a warp
# (fewer would leave lanes of the warp idle), at most MAX_THREADS (≤ _SHARED).
MIN_THREADS = 32
MAX_THREADS = _SHARED


def threads_per_block(mean_line_length: float) -> int:
    """About one thread per non-zero of a mean line (column or row), a power of two between
    MIN_THREADS and MAX_THREADS: long lines get a full block, short ones no idle warps."""
    limit = min(MAX_THREADS, _SHARED)
    threads = min(MIN_THREADS, limit)
    while threads < limit and threads < mean_line_length:
        threads *= 2
    return threads


# ------------------------------------------------------------------ block helpers


@cuda.jit(device=True)
def _block_sums(cache, a, b):
    """Σ over the block's threads of a and of b (tree reduction in shared memory).

    Every thread of the block must call it; every thread gets the same two sums.
    """
    tid = cuda.threadIdx.x
    cache[0, tid] = a
    cache[1, tid] = b
    cuda.syncthreads()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        if tid < stride:
            cache[0, tid] += cache[0, tid + stride]
            cache[1, tid] += cache[1, tid + stride]
        cuda.syncthreads()
        stride //= 2
    total_a = cache[0, 0]
    total_b = cache[1, 0]
    cuda.syncthreads()  # every thread has read the sums before the cache is reused
    return total_a, total_b


# kernels.lines.line compiled as a device function: under the simulator a device function
# cannot pass arrays to a CPU-compiled one.
_line = cuda.jit(device=True)(lines.line.py_func)


@cuda.jit(device=True)
def _stride(start, end):
    """(first, end, step): the entries of [start, end) that this thread of the block reads."""
    return start + cuda.threadIdx.x, end, cuda.blockDim.x


@cuda.jit(device=True)
def _entry(data, indices, dense, ones, start, idx):
    """(minor index, value) of the idx-th stored entry; ``ones``: the intercept's column."""
    if ones:
        return np.int64(idx), 1.0
    if dense:
        return np.int64(idx - start), np.float64(data[idx])
    return np.int64(indices[idx]), np.float64(data[idx])


# --------------------------------------------------------------------- primal SCD


@cuda.jit
def _scd_kernel(
    data,
    indices,
    indptr,
    dense,
    n_samples,
    y,
    margins,
    coef,
    intercept,
    order,
    loss,
    l1,
    l2,
    col_sq_norms,
    col_cube_sums,
    cubic,
    stats,
):
    """Block b updates coordinate order[b]; stats[0], stats[1] ← max |Δθ_j|, max |θ_j|."""
    cache = cuda.shared.array((2, _SHARED), float64)
    tid = cuda.threadIdx.x
    n_features = coef.shape[0]
    inv_n = 1.0 / n_samples
    j = order[cuda.blockIdx.x]
    ones = j == n_features  # the intercept: an unpenalized all-ones column
    if ones:
        start, end = 0, n_samples
        old = intercept[0]
        pen_l1, pen_l2, cube_mean = 0.0, 0.0, 1.0 if cubic else -1.0
    else:
        start, end = _line(dense, indptr, j, n_samples)
        old = coef[j]
        pen_l1, pen_l2 = l1, l2
        cube_mean = col_cube_sums[j] * inv_n if cubic else -1.0

    g_part = 0.0
    h_part = 0.0
    for idx in range(*_stride(start, end)):
        i, x = _entry(data, indices, dense, ones, start, idx)
        d1, d2 = scalar.loss_d1_d2(loss, y[i], margins[i])
        g_part += d1 * x
        h_part += d2 * x * x
    g, h = _block_sums(cache, g_part, h_part)
    g *= inv_n
    h *= inv_n
    if loss == scalar.SQUARED and not ones:
        h = col_sq_norms[j] * inv_n  # the exact curvature, as on the CPU
    if ones:
        delta = -g / h if h > 0.0 else 0.0
    else:
        delta = scalar.prox_newton(old, g, h, pen_l1, pen_l2) - old
    # g, h and old are the same in every thread, so is delta: the branches below are
    # taken by the whole block, as its reductions require.
    if (
        delta != 0.0
        and loss != scalar.SQUARED
        and not scalar.cubic_accepts(g, h, 0.0 if ones else old, delta, pen_l1, pen_l2, cube_mean)
    ):
        delta *= _line_search(
            cache,
            data,
            indices,
            dense,
            ones,
            start,
            end,
            y,
            margins,
            loss,
            old,
            delta,
            g,
            pen_l1,
            pen_l2,
            inv_n,
        )
    if tid == 0:
        cuda.atomic.max(stats, 0, abs(delta))
        if not ones:
            cuda.atomic.max(stats, 1, abs(old + delta))
    if delta == 0.0:
        return
    for idx in range(*_stride(start, end)):
        i, x = _entry(data, indices, dense, ones, start, idx)
        cuda.atomic.add(margins, i, delta * x)  # ŷ += Δθ_j X[:, j], raced by other blocks
    if tid == 0:  # every thread read old before the first reduction
        if ones:
            intercept[0] = old + delta
        else:
            coef[j] = old + delta


@cuda.jit(device=True)
def _line_search(
    cache, data, indices, dense, ones, start, end, y, margins, loss, old, delta, g, l1, l2, inv_n
):
    """The CPU kernel's Armijo backtracking, one block reduction per trial step.

    A trial sums ℓ(ŷ_i + tΔx_i) − ℓ(ŷ_i) reading each margin once, so that a margin moved
    by another block between two reductions shifts both terms alike.
    """
    model = g * delta + scalar.penalty(l1, l2, old + delta) - scalar.penalty(l1, l2, old)
    base_part = 0.0
    for idx in range(*_stride(start, end)):
        i, x = _entry(data, indices, dense, ones, start, idx)
        base_part += scalar.loss(loss, y[i], margins[i])
    base, _ = _block_sums(cache, base_part, 0.0)
    # Below this, a change of objective is rounding noise: accept rather than stall.
    noise = 1e-13 * (base * inv_n + scalar.penalty(l1, l2, old))
    t = 1.0
    for _ in range(scalar.MAX_BACKTRACK):
        step = t * delta
        part = 0.0
        for idx in range(*_stride(start, end)):
            i, x = _entry(data, indices, dense, ones, start, idx)
            m = margins[i]
            part += scalar.loss(loss, y[i], m + step * x) - scalar.loss(loss, y[i], m)
        change, _ = _block_sums(cache, part, 0.0)
        change = change * inv_n + scalar.penalty(l1, l2, old + step) - scalar.penalty(l1, l2, old)
        if change <= scalar.ARMIJO * t * model + noise:
            return t
        t *= scalar.BACKTRACK
    return 0.0


def scd_epoch(
    data,
    indices,
    indptr,
    dense,
    n_samples,
    y,
    margins,
    coef,
    intercept,
    order,
    loss,
    l1,
    l2,
    col_sq_norms,
    col_cube_sums,
):
    """One asynchronous epoch of primal SCD on the GPU; see :func:`cpu.scd_epoch`.

    ``order`` holds distinct coordinates (a block owns its θ_j for the launch). Returns
    max |Δθ_j| and max |θ_j| over the epoch.
    """
    n_coordinates = len(order)
    if n_coordinates == 0:
        return 0.0, 0.0
    cubic = loss == scalar.LOGISTIC and col_cube_sums.shape[0] == coef.shape[0]
    threads = threads_per_block(mean_line_length(data, dense, n_samples, coef.shape[0]))
    written = margins, coef, intercept
    d_margins, d_coef, d_intercept = map(_device, written)
    stats = cuda.to_device(np.zeros(2))
    _scd_kernel[n_coordinates, threads](
        data,
        indices,
        indptr,
        dense,
        n_samples,
        _device(y),
        d_margins,
        d_coef,
        d_intercept,
        _device(order),
        loss,
        l1,
        l2,
        _device(col_sq_norms),
        _device(col_cube_sums),
        cubic,
        stats,
    )
    _copy_back(written, (d_margins, d_coef, d_intercept))
    max_delta, max_coef = stats.copy_to_host()
    return float(max_delta), float(max_coef)


# ----------------------------------------------------------------------- dual SDCA


# The parameters of sdca_epoch, then the ESO constants: a launch passes each array itself.
@cuda.jit
def _sdca_kernel(
    data,
    indices,
    indptr,
    dense,
    n_features,
    y,
    dual_coef,
    coef,
    order,
    loss,
    alpha_n,
    row_sq_norms,
    intercept,
    rho,
    dual_sum,
    stats,
    beta,
    shared,
    spread,
    rho_beta,
):
    """Block b takes the dual steps of rows order[b], order[b + B], … (B blocks in the
    grid), one after another; stats[0] ← max |Δa_i|. The curvature of row i is
    min(beta‖x_i‖², (1 − shared)‖x_i‖² + spread)/(αn) + rho_beta·rho: the ESO bounds
    for B rows stepping at once (:func:`sdca_epoch`)."""
    cache = cuda.shared.array((2, _SHARED), float64)
    step = cuda.shared.array(1, float64)
    tid = cuda.threadIdx.x
    for r in range(cuda.blockIdx.x, order.shape[0], cuda.gridDim.x):
        i = order[r]
        start, end = _line(dense, indptr, i, n_features)
        part = 0.0
        for idx in range(*_stride(start, end)):
            k, x = _entry(data, indices, dense, False, start, idx)
            part += x * coef[k]
        margin, _ = _block_sums(cache, part, 0.0)
        if tid == 0:
            # Σ a_i is raced by the other blocks: one thread reads it and decides the step.
            sq = row_sq_norms[i]
            by_sparsity, by_spectrum = beta * sq, (1.0 - shared) * sq + spread
            # The smaller by a comparison: numba.cuda does not lower min of floats.
            smaller = by_spectrum if by_spectrum < by_sparsity else by_sparsity
            q = smaller / alpha_n + rho_beta * rho
            shifted = margin + intercept + rho * dual_sum[0]
            t = scalar.dual_step(loss, y[i], dual_coef[i], shifted, q)
            step[0] = t
            if t != 0.0:
                dual_coef[i] += t
                cuda.atomic.add(dual_sum, 0, t)
                cuda.atomic.max(stats, 0, abs(t))
        cuda.syncthreads()
        # Every thread reads the step before any passes the next row's first barrier,
        # after which thread 0 may write the next one.
        t = step[0]
        if t != 0.0:
            scale = t / alpha_n
            for idx in range(*_stride(start, end)):
                k, x = _entry(data, indices, dense, False, start, idx)
                cuda.atomic.add(coef, k, scale * x)  # w += t x_i/(αn), raced by other blocks
        # The block's own adds are done before any of its threads reads w for the next row.
        cuda.syncthreads()


@cuda.jit
def _count_minor(indices, counts):
    """counts[k] ← how many stored entries have minor index k (rows sharing feature k)."""
    for idx in range(cuda.grid(1), indices.shape[0], cuda.gridsize(1)):
        cuda.atomic.add(counts, indices[idx], 1)


def sdca_epoch(
    data,
    indices,
    indptr,
    dense,
    n_features,
    y,
    dual_coef,
    coef,
    order,
    loss,
    alpha_n,
    row_sq_norms,
    intercept,
    rho,
    dual_sum,
):
    """One asynchronous epoch of SDCA on the GPU; see :func:`cpu.sdca_epoch`.

    ``order`` holds distinct rows (a block owns its a_i while it steps on it). The grid
    holds :func:`dual_blocks` blocks, so B rows step at once, each from a w that the
    others are changing. Their steps are made safe together by an expected separable
    overapproximation (ESO) of parallel coordinate descent (Richtárik and Takáč; Qu and
    Richtárik 2016), for B rows at once out of n, the smaller of two:

    - by sparsity: ‖x_i‖² scaled by β = 1 + (B − 1)(ω − 1)/(n − 1), ω the most rows that
      share a feature (n for dense rows);
    - by spectrum: (1 − β′)‖x_i‖² + β′λ, β′ = (B − 1)/(n − 1) and λ the largest
      eigenvalue of XᵀX (:func:`_spectral_norm`), small when rows are nearly orthogonal
      even if dense.

    The intercept's multiplier term, which every row shares, is scaled by B; the caller's
    ``rho`` is the method of multipliers' ρ (see
    :func:`dask_scd.kernels.device.dual_concurrency`). ``dual_coef``,
    ``coef`` and ``dual_sum`` are updated in place. Returns max |Δa_i|.
    """
    n_rows = len(order)
    if n_rows == 0:
        return 0.0
    n_lines = len(dual_coef)
    mean_line = mean_line_length(data, dense, n_features, n_lines)
    threads = threads_per_block(mean_line)
    blocks = dual_blocks(n_rows, mean_line)
    omega, lam = _eso_constants(data, indices, indptr, dense, n_features, n_lines)
    shared = (blocks - 1) / max(n_lines - 1, 1)
    beta = 1.0 + shared * (omega - 1)
    written = dual_coef, coef, dual_sum
    d_dual_coef, d_coef, d_dual_sum = map(_device, written)
    stats = cuda.to_device(np.zeros(1))
    _sdca_kernel[blocks, threads](
        data,
        indices,
        indptr,
        dense,
        n_features,
        _device(y),
        d_dual_coef,
        d_coef,
        _device(order),
        loss,
        alpha_n,
        _device(row_sq_norms),
        intercept,
        rho,
        d_dual_sum,
        stats,
        beta,
        shared,
        shared * lam,
        float(blocks),
    )
    _copy_back(written, (d_dual_coef, d_coef, d_dual_sum))
    return float(stats.copy_to_host()[0])


# Thread blocks a multiprocessor holds at once (compute capability 7 to 9: at most 32
# blocks and 2048 threads), and the blocks of a dual epoch under numba's simulator, which
# runs blocks one after another (a small number still exercises the strided loop).
_BLOCKS_PER_SM = 32
_THREADS_PER_SM = 2048
SIMULATOR_BLOCKS = 2


def dual_blocks(n_rows: int, mean_line: float) -> int:
    """Blocks of a dual epoch's grid: as many as the GPU runs at once, at most n_rows."""
    try:
        sms = int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
        per_sm = min(_BLOCKS_PER_SM, _THREADS_PER_SM // threads_per_block(mean_line))
        capacity = sms * per_sm
    except AttributeError:  # the simulator has no device to ask
        capacity = SIMULATOR_BLOCKS
    return max(1, min(int(n_rows), capacity))


# The ESO constants (ω, λ) of the matrices seen lately, by the identity of their indices
# array: computed once per matrix, not per epoch (the array is held so that its identity
# is not reused).
_ESO: dict = {}
_ESO_KEPT = 8
# λ is estimated on a sample of about this many stored entries, by this many power steps.
_SPECTRAL_ENTRIES = 1 << 20
_SPECTRAL_STEPS = 30


def _eso_constants(data, indices, indptr, dense, n_features, n_rows) -> tuple[int, float]:
    """(ω, λ) of the device matrix: the most rows that share a feature, and the largest
    eigenvalue of XᵀX (estimated; :func:`_spectral_norm`)."""
    hit = _ESO.get(id(indices))
    if hit is not None and hit[0] is indices:
        return hit[1]
    if dense or n_rows <= 1:
        omega = max(int(n_rows), 1)
    else:
        counts = cuda.to_device(np.zeros(max(int(n_features), 1), dtype=np.int32))
        if indices.shape[0] > 0:
            _count_minor[min(1024, (indices.shape[0] + 255) // 256), 256](indices, counts)
        omega = max(int(counts.copy_to_host().max()), 1)
    constants = omega, _spectral_norm(data, indices, indptr, dense, n_features, n_rows)
    if len(_ESO) >= _ESO_KEPT:
        _ESO.pop(next(iter(_ESO)))
    _ESO[id(indices)] = (indices, constants)
    return constants


def _spectral_norm(data, indices, indptr, dense, n_features, n_rows) -> float:
    """λ_max(XᵀX), estimated as n/m·λ_max(X_mᵀX_m) on m rows in 8 evenly spaced runs
    (about :data:`_SPECTRAL_ENTRIES` stored entries copied to the host), by power steps.
    A sample overestimates the spectrum of nearly orthogonal rows, and the ESO is then
    only more careful; all rows are used when they are few."""
    n_rows, n_features = int(n_rows), int(n_features)
    stored = n_rows * n_features if dense else int(indices.shape[0])
    per_row = max(stored / max(n_rows, 1), 1.0)
    m = min(n_rows, max(1024, int(_SPECTRAL_ENTRIES / per_row)))
    runs = 8 if m < n_rows else 1
    length = m // runs
    starts = np.linspace(0, n_rows - length, runs).astype(np.int64)
    pieces = []
    pointers = None if dense else _host(indptr)
    for lo in starts:
        hi = lo + length
        if dense:
            block = _host(data[lo * n_features : hi * n_features])
            pieces.append(sp.csr_matrix(block.reshape(length, n_features), dtype=np.float64))
        else:
            a, b = int(pointers[lo]), int(pointers[hi])
            values, columns = _host(data[a:b]), _host(indices[a:b])
            pieces.append(
                sp.csr_matrix(
                    (values.astype(np.float64), columns, pointers[lo : hi + 1] - a),
                    shape=(length, n_features),
                )
            )
    sample = sp.vstack(pieces, format="csr")
    if sample.nnz == 0:
        return 0.0
    v = np.random.default_rng(0).normal(size=n_features)
    lam = 0.0
    for _ in range(_SPECTRAL_STEPS):
        v = sample.T @ (sample @ v)
        lam = float(np.linalg.norm(v))
        if lam == 0.0:
            return 0.0
        v /= lam
    return lam * n_rows / sample.shape[0]


# ------------------------------------------------------------------------ transfers


def mean_line_length(data, dense, n_minor, n_major):
    return n_minor if dense else data.shape[0] / max(n_major, 1)


def _device(array):
    """The device copy of a host vector; a device array passes through."""
    return cuda.to_device(array) if isinstance(array, np.ndarray) else array


def _host(array) -> np.ndarray:
    """A host copy of a device array (a host array as it is)."""
    return array.copy_to_host() if hasattr(array, "copy_to_host") else np.asarray(array)


def _copy_back(hosts, devices):
    """Write what a kernel changed back into the caller's host arrays (the CPU kernels
    work in place: so do these, seen from the host)."""
    for host, dev in zip(hosts, devices):
        if dev is not host:
            dev.copy_to_host(host)


def to_device(array):
    """A device copy of a host array (numpy), for the matrix triple read every epoch."""
    return cuda.to_device(np.ascontiguousarray(array))
