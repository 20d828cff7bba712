"""The encoding of a grid's chunks: the zstd compressor, the CRC-32 checksums and the
packed CSC sparse cell (``pack_csc`` / ``unpack_csc``), and how a cell is cut out of a
row chunk."""

from __future__ import annotations

import zlib

import numpy as np
import scipy.sparse as sp
from zarr.codecs import ZstdCodec

from .layout import GridCorruptionError

__all__ = ["checksum", "pack_csc", "packed_size", "unpack_csc"]

_ZSTD_LEVEL = 3


def _compressors():
    # checksum=True: a garbled chunk fails loudly instead of decoding to junk.
    return ZstdCodec(level=_ZSTD_LEVEL, checksum=True)


# A sparse cell is one uint8 zarr array (one chunk): MAGIC, then the bytes of
# data (grid dtype, nnz), indptr (int32, or int64 from 2**31 non-zeros;
# size_b + 1) and indices (int32 row within the row chunk, nnz).  One array
# per cell keeps the number of files low and a cell read to one chunk.
_MAGIC = b"CSCcell1"


def checksum(values: np.ndarray) -> int:
    """CRC-32 of a C-contiguous array's bytes.

    zarr's own checksum (in the zstd frame) proves a chunk file is intact, not that it is
    the file of this cell: two cells or label chunks swapped on disk decode fine. The
    CRC of each cell's contents, kept apart from the cells, tells them apart.
    """
    return zlib.crc32(np.ascontiguousarray(values))


def _indptr_dtype(nnz: int) -> np.dtype:
    return np.dtype(np.int32 if nnz < 2**31 else np.int64)


def packed_size(nnz: int, size: int, dtype) -> int:
    """Bytes of a packed sparse cell with ``nnz`` non-zeros and ``size`` columns."""
    dtype = np.dtype(dtype)
    return len(_MAGIC) + nnz * dtype.itemsize + (size + 1) * _indptr_dtype(nnz).itemsize + nnz * 4


def pack_csc(cell: sp.csc_matrix, dtype) -> np.ndarray:
    """Serialise a CSC cell into one uint8 array (see ``_MAGIC``)."""
    parts = (
        np.frombuffer(_MAGIC, dtype=np.uint8),
        cell.data.astype(dtype, copy=False),
        cell.indptr.astype(_indptr_dtype(cell.nnz), copy=False),
        cell.indices.astype(np.int32, copy=False),
    )
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8) for p in parts])


def unpack_csc(buf: np.ndarray, nnz: int, size: int, dtype, where: str = "cell", copy: bool = True):
    """Inverse of :func:`pack_csc`: (data, indices, indptr) as fresh arrays, or views of
    ``buf`` (``copy=False``; aligned where ``buf`` is)."""
    dtype = np.dtype(dtype)
    if buf.size != packed_size(nnz, size, dtype) or buf[: len(_MAGIC)].tobytes() != _MAGIC:
        raise GridCorruptionError(f"{where}: packed sparse cell has a bad header or length")
    raw = np.ascontiguousarray(buf)  # each part is copied out of it below
    offset = len(_MAGIC)
    out = []
    for part_dtype, count in ((dtype, nnz), (_indptr_dtype(nnz), size + 1), (np.int32, nnz)):
        part = np.frombuffer(raw, dtype=part_dtype, count=count, offset=offset)
        out.append(part.copy() if copy or not part.flags.aligned else part)
        offset += count * np.dtype(part_dtype).itemsize
    data, indptr, indices = out
    return data, indices, indptr


def _extract_cell(Xc, cols: np.ndarray, dtype, is_sparse: bool):
    """Cell columns ``cols`` of a row chunk, as a fresh array we may modify."""
    if is_sparse:
        cell = sp.csc_matrix(Xc[:, cols], dtype=dtype, copy=True)
        cell.eliminate_zeros()  # explicit zeros would distort purity and nnz
        cell.sort_indices()
        return cell
    return np.take(Xc, cols, axis=1).astype(dtype, copy=False)
