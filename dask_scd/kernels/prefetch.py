"""Software prefetch of a line of X for the row kernels (LLVM's ``llvm.prefetch``).

A dual epoch visits rows in shuffled order, so the hardware prefetcher cannot guess the
next row; asking for the row a few visits ahead overlaps its memory latency with the
current row's work. On the kernel benchmark data (1M rows, block-shuffled order, a busy
machine) an SDCA epoch took about 185 instead of 212 ns per row (sparse one-hot, 20
non-zeros per row) and 188 instead of 241 (dense 1M x 100).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from dask_scd.kernels.lines import line

# Rows ahead of the current one; 2 to 8 did equally well, 1 less so.
AHEAD = 4
# At most this many cache lines of a row: past them the hardware prefetcher streams.
_MAX_LINES = 32


@intrinsic
def _prefetch(typingctx, array, index):
    """Hint that ``array[index]`` will be read soon (no fault if out of bounds)."""
    sig = types.void(array, index)

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        ary = context.make_array(array_type)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(
            context, builder, array_type, ary, [args[1]], wraparound=False
        )
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
            "llvm.prefetch.p0i8",
        )
        # read, high temporal locality, data cache
        builder.call(fn, [builder.bitcast(ptr, byte_ptr), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always")
def prefetch_line(data, indices, indptr, dense, n_minor, major):
    """Prefetch the values (and, when sparse, the indices) of line ``major``."""
    start, end = line(dense, indptr, major, n_minor)
    step = max(64 // data.itemsize, 1)
    end = min(end, start + _MAX_LINES * step)
    for idx in range(start, end, step):
        _prefetch(data, idx)
    if not dense:
        step = max(64 // indices.itemsize, 1)
        for idx in range(start, end, step):
            _prefetch(indices, idx)
