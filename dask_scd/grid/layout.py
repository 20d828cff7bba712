"""The on-disk layout of a grid store: its format name and versions, how rows are cut
into row chunks, and the error raised when a store does not match its layout.

Rows are cut into row chunks of ``row_chunk`` examples (the last one may be
smaller); columns are cut into blocks (a partition of the features).  One
cell = (row chunk r, block b) = one dask chunk of :attr:`Grid.X`.

On-disk layout (zarr v3 group at ``path``)::

    zarr.json                     root attributes (metadata, see docs/grid.md)
    y                             float64 (n_samples,), chunks (row_chunk,)
    cell_nnz                      int64 (n_row_chunks, n_blocks), one chunk
    cell_checksum                 int64 (n_row_chunks, n_blocks): CRC-32 of each cell
    label_checksum                int64 (n_row_chunks,): CRC-32 of each row chunk's labels
    X/block_{b}                   dense:  (n_samples, size_b), chunks (row_chunk, size_b)
    X/block_{b}/cell_{r}          sparse: uint8 (n_bytes,), one chunk: the packed
                                  CSC triplet of cell (r, b) (see codec.pack_csc)
"""

from __future__ import annotations

import numpy as np

__all__ = ["FORMAT", "FORMAT_VERSION", "READABLE_VERSIONS", "GridCorruptionError"]

FORMAT = "dask_scd.grid"
FORMAT_VERSION = 2
#: Versions open_grid reads: version 1 stores have no checksums (nothing to verify).
READABLE_VERSIONS = (1, 2)


class GridCorruptionError(ValueError):
    """A cell of a grid store is missing, unreadable or inconsistent."""


def _row_bounds(n: int, row_chunk: int) -> np.ndarray:
    return np.append(np.arange(0, n, row_chunk, dtype=np.int64), np.int64(n))
