"""Grid store: a design matrix stored as zarr v3 cells (row chunk x column block).

See ``docs/grid.md`` for the layout, and :class:`Grid` for its column order.
"""

from .handle import Grid, open_grid
from .layout import FORMAT, FORMAT_VERSION, GridCorruptionError
from .partition import (
    block_purity,
    blocks_from_names,
    contiguous_blocks,
    detect_pure_blocks,
    validate_blocks,
)
from .read import read_cell, read_labels
from .write import to_grid

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "Grid",
    "GridCorruptionError",
    "block_purity",
    "blocks_from_names",
    "contiguous_blocks",
    "detect_pure_blocks",
    "open_grid",
    "read_cell",
    "read_labels",
    "to_grid",
    "validate_blocks",
]
