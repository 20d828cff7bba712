"""SA-SDCA's threads (Tran et al. 2015): epochs of dual coordinate ascent on disjoint rows
run at once, sharing w.

Each thread runs :func:`sdca_thread_epoch` (or :func:`sdca_thread_epoch_local` on dense
rows) on its share of the rows: w is shared, the features most rows hold are updated by
atomic adds (:func:`atomic_add`), and each thread publishes its Σa changes in its own slot
of a shared array every few visits. The engine is :mod:`dask_scd.engines.local.sdca`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from dask_scd.kernels.cpu import dual_row_step
from dask_scd.kernels.lines import FAST, row_axpy
from dask_scd.kernels.prefetch import AHEAD, prefetch_line

SLOT = 16  # float64s between two threads' slots: 128 bytes, never one cache line


@intrinsic
def atomic_add(typingctx, array, index, value):
    """``array[index] += value`` as one atomic read-modify-write (LLVM ``atomicrmw fadd``,
    relaxed order); returns the old value. Two threads adding to one entry both count."""
    signature = types.float64(array, index, value)

    def codegen(context, builder, sig, args):
        values, i, v = args
        pointer = cgutils.get_item_pointer(
            context,
            builder,
            sig.args[0],
            context.make_array(sig.args[0])(context, builder, values),
            [i],
            wraparound=False,
        )
        return builder.atomic_rmw("fadd", pointer, v, "monotonic")

    return signature, codegen


@njit(inline="always")
def _row_axpy_shared(data, indices, dense, start, end, scale, w, hot):
    """w += scale·x_row on a w other threads write too: atomic adds on the ``hot``
    features, plain ones elsewhere. A plain ``+=`` (read, add, write) loses the update
    of a thread that wrote in between; on a feature most rows hold that happens
    thousands of times an epoch, on a rare one almost never, and an atomic add costs
    several plain ones."""
    if dense:
        for k in range(end - start):
            if hot[k]:
                atomic_add(w, k, scale * data[start + k])
            else:
                w[k] += scale * data[start + k]
    else:
        values = data[start:end]  # slices: see lines.minor_at
        minors = indices[start:end]
        for k in range(values.shape[0]):
            j = minors[k]
            if hot[j]:
                atomic_add(w, j, scale * values[k])
            else:
                w[j] += scale * values[k]


@njit(inline="always")
def _publish(slots, thread, own):
    """Publish this thread's Σa changes in its slot; returns the others' published sum."""
    slots[thread, 0] = own
    others = 0.0
    for j in range(slots.shape[0]):
        if j != thread:
            others += slots[j, 0]
    return others


@njit(inline="always")
def _merge_local(coef, local, snapshot):
    """Add this thread's changes since its last merge (local − snapshot) to the shared w,
    atomically, and take the shared w (everyone's merged changes) as its new copy."""
    for j in range(coef.shape[0]):
        change = local[j] - snapshot[j]
        if change != 0.0:
            atomic_add(coef, j, change)
        value = coef[j]
        local[j] = value
        snapshot[j] = value


@njit(nogil=True, cache=True, fastmath=FAST)
def sdca_thread_epoch(
    data,
    indices,
    indptr,
    dense,
    n_features,
    y,
    unit_dual,
    coef,
    order,
    loss,
    alpha_n,
    row_sq_norms,
    weights,
    intercept,
    rho,
    base_sum,
    slots,
    thread,
    publish,
    hot,
):
    """One thread's share of an SA-SDCA epoch (:func:`dask_scd.kernels.cpu.sdca_epoch`, or
    :func:`~dask_scd.kernels.cpu.sdca_weighted_epoch` with non-empty ``weights``), with
    Σ a_i kept without a shared scalar.

    The intercept's multiplier needs Σ a_i at every step. Written by every thread at
    every step, one shared scalar would bounce its cache line between the cores and lose
    updates; here each thread adds its own changes privately and publishes them in its
    row of ``slots`` (``slots[thread, 0]``, one writer each, rows ``SLOT`` floats apart)
    every ``publish`` visits, reading the others' published sums at the same moment:
    Σa = ``base_sum`` + others' (at most ``publish`` visits old) + its own (exact).
    w is shared with the other threads: atomic adds on the ``hot`` features
    (:func:`_row_axpy_shared`). Returns max |Δa_i|; ``slots[thread, 0]`` holds the
    thread's whole change at the end.
    """
    return _thread_epoch(
        data,
        indices,
        indptr,
        dense,
        n_features,
        y,
        unit_dual,
        coef,
        order,
        loss,
        alpha_n,
        row_sq_norms,
        weights,
        intercept,
        rho,
        base_sum,
        slots,
        thread,
        publish,
        hot,
        coef,
        coef,
        False,
    )


@njit(nogil=True, cache=True, fastmath=FAST)
def sdca_thread_epoch_local(
    data,
    indices,
    indptr,
    dense,
    n_features,
    y,
    unit_dual,
    coef,
    order,
    loss,
    alpha_n,
    row_sq_norms,
    weights,
    intercept,
    rho,
    base_sum,
    slots,
    thread,
    publish,
    local,
    snapshot,
):
    """:func:`sdca_thread_epoch` for dense rows, on a private copy of w.

    On dense rows every step writes every entry of w: shared by the threads, each write
    takes the cache line from the other core, and every add must be atomic (two threads
    ran slower than one). Here a thread reads and writes its own copy ``local`` and
    merges it every ``publish`` visits (:func:`_merge_local`: its changes added
    atomically to the shared w, which it then copies), so the cores exchange w once per
    ``publish`` steps instead of at every one. No change is lost: after the epoch's last
    merge the shared w holds every thread's steps; a thread sees the others' up to
    ``publish`` of their visits late (the bounded delay of asynchronous SDCA). Σa is
    published at the same moments, as in :func:`sdca_thread_epoch`.

    Not for sparse rows: on one-hot data at a weak alpha a step moves a frequent
    feature's weight by O(1), and the same delay on those features (tried: private
    copies of the hot features, merged every 8–64 visits) left two threads at a relative
    gap of 0.14–0.6 after 8 epochs where one thread reached 0.068, for no faster epoch.
    """
    return _thread_epoch(
        data,
        indices,
        indptr,
        dense,
        n_features,
        y,
        unit_dual,
        coef,
        order,
        loss,
        alpha_n,
        row_sq_norms,
        weights,
        intercept,
        rho,
        base_sum,
        slots,
        thread,
        publish,
        _NOT_HOT,
        local,
        snapshot,
        True,
    )


_NOT_HOT = np.zeros(0, dtype=np.bool_)


@njit(inline="always")
def _thread_epoch(
    data,
    indices,
    indptr,
    dense,
    n_features,
    y,
    unit_dual,
    coef,
    order,
    loss,
    alpha_n,
    row_sq_norms,
    weights,
    intercept,
    rho,
    base_sum,
    slots,
    thread,
    publish,
    hot,
    local,
    snapshot,
    private,
):
    """The epoch of :func:`sdca_thread_epoch` (``private`` False: steps on the shared w,
    ``local`` and ``snapshot`` unused) and of :func:`sdca_thread_epoch_local` (True);
    ``private`` is a constant of each, its branches fold away."""
    max_delta = 0.0
    own = 0.0
    others = 0.0
    n_visits = order.shape[0]
    if private:
        for j in range(n_features):
            local[j] = coef[j]
            snapshot[j] = local[j]
    for k in range(n_visits):
        if k % publish == 0:
            if private and k > 0:
                _merge_local(coef, local, snapshot)
            others = _publish(slots, thread, own)
        if not private and k + AHEAD < n_visits:
            prefetch_line(data, indices, indptr, dense, n_features, order[k + AHEAD])
        scaled, start, end = dual_row_step(
            data,
            indices,
            indptr,
            dense,
            n_features,
            y,
            unit_dual,
            local if private else coef,
            order[k],
            loss,
            alpha_n,
            row_sq_norms,
            weights,
            intercept,
            rho,
            base_sum + others + own,
        )
        if scaled == 0.0:
            continue
        own += scaled
        if private:
            row_axpy(data, indices, dense, start, end, scaled / alpha_n, local)
        else:
            _row_axpy_shared(data, indices, dense, start, end, scaled / alpha_n, coef, hot)
        max_delta = max(max_delta, abs(scaled))
    if private:
        _merge_local(coef, local, snapshot)
    slots[thread, 0] = own
    return max_delta
