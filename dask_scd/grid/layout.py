"""The on-disk layout of a grid store: its format name and versions, how rows are cut
into row chunks, the checks of a store's header and metadata against the layout, and the
error raised when a store does not match it.

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

import contextlib
import os

import numpy as np
import zarr

from .partition import validate_blocks

__all__ = ["FORMAT", "FORMAT_VERSION", "READABLE_VERSIONS", "GridCorruptionError"]

FORMAT = "dask_scd.grid"
FORMAT_VERSION = 2
#: Versions open_grid reads: version 1 stores have no checksums (nothing to verify).
READABLE_VERSIONS = (1, 2)


class GridCorruptionError(ValueError):
    """A cell of a grid store is missing, unreadable or inconsistent."""


@contextlib.contextmanager
def reading(what: str):
    """Any error but a GridCorruptionError raised while reading ``what`` (decompression, a
    missing node, bad metadata...) becomes one that names it."""
    try:
        yield
    except GridCorruptionError:
        raise
    except Exception as exc:
        raise GridCorruptionError(f"cannot read {what}: {exc}") from exc


def _row_bounds(n: int, row_chunk: int) -> np.ndarray:
    return np.append(np.arange(0, n, row_chunk, dtype=np.int64), np.int64(n))


def _check_header(path: str):
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(f"{path} is a file, not a grid store (a directory)")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no grid store at {path}")
    try:
        group = zarr.open_group(path, mode="r")
        attrs = dict(group.attrs)
    except Exception as exc:
        raise ValueError(f"{path} is not a readable zarr grid store: {exc}") from exc
    if attrs.get("format") != FORMAT:
        hint = ""
        if attrs.get("format") is None and any(True for _ in group.array_keys()):
            # a zarr store of someone else's arrays (xarray's to_zarr writes these)
            hint = (
                ": a zarr store of other arrays (e.g. written by xarray) is opened with "
                "xr.open_zarr(path) and passed to fit as an xarray Dataset (y= its label "
                "variable), or written once as a grid by dask_scd.grid.to_grid"
            )
        raise ValueError(f"{path} is not a {FORMAT} store (format={attrs.get('format')!r}){hint}")
    if attrs.get("format_version") not in READABLE_VERSIONS:
        raise ValueError(
            f"unsupported grid format version {attrs.get('format_version')!r} at {path} "
            f"(this library reads versions {', '.join(map(str, READABLE_VERSIONS))})"
        )
    if attrs.get("complete") is not True:
        raise ValueError(f"grid store {path} is incomplete (interrupted write?)")
    _check_attrs(path, attrs)
    _check_arrays(path, attrs)
    if attrs.get("layout") == "sparse" and attrs.get("sparse_cell_encoding") != "packed-csc-1":
        raise GridCorruptionError(
            f"grid store {path}: unsupported sparse cell encoding "
            f"{attrs.get('sparse_cell_encoding')!r}"
        )
    return attrs


def _missing(path: str, name: str) -> GridCorruptionError:
    return GridCorruptionError(
        f"grid store {path} has no {name!r} array (removed or never written: write the grid "
        "again with to_grid or dask-scd convert)"
    )


def _check_arrays(path: str, attrs: dict) -> None:
    """Every array besides the cells (the labels and the tables) is in the store: checked
    on disk, where a removed array shows at once (a reader of the store may be cached)."""
    names = ["y", "cell_nnz"]
    if attrs["format_version"] != 1:
        names += ["cell_checksum", "label_checksum"]
    if attrs.get("has_weights", False):
        names += ["weight", "weight_checksum"]
    for name in names:
        if not os.path.isfile(os.path.join(path, name, "zarr.json")):
            raise _missing(path, name)


def _is_int(value, low=0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_label_dtype(name) -> bool:
    """The name of a bool, integer or float numpy dtype (labels' dtypes; grids written
    before ``label_dtype`` was recorded have none: float64)."""
    try:
        return isinstance(name, str) and np.dtype(name).kind in "biuf"
    except TypeError:
        return False


def _check_attrs(path: str, attrs: dict) -> None:
    """Check the metadata every reader relies on, once: a damaged zarr.json is reported
    as such (naming the key), never as a KeyError or TypeError deep in a read."""

    def bad(key, why):
        shown = repr(attrs.get(key))
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return GridCorruptionError(f"grid store {path} has invalid metadata: {key}={shown} {why}")

    def int_list(key, length=None, low=0):
        value = attrs.get(key)
        if (
            not isinstance(value, list)
            or not all(_is_int(v, low) for v in value)
            or (length is not None and len(value) != length)
        ):
            count = "" if length is None else f"{length} "
            raise bad(key, f"is not a list of {count}integers >= {low}")
        return value

    n, p = int_list("shape", 2, low=1)
    if not _is_int(attrs.get("row_chunk"), 1):
        raise bad("row_chunk", "is not a positive integer")
    if int_list("row_bounds") != _row_bounds(n, attrs["row_chunk"]).tolist():
        raise bad("row_bounds", f"do not cut {n} rows in row chunks of {attrs['row_chunk']}")
    blocks = attrs.get("blocks")
    try:
        if not isinstance(blocks, list) or not all(isinstance(b, list) for b in blocks):
            raise ValueError("blocks must be a list of lists")
        validate_blocks(blocks, p)
    except ValueError as exc:
        raise bad("blocks", f"is not a partition of the {p} features ({exc})") from None
    if attrs.get("dtype") not in ("float32", "float64"):
        raise bad("dtype", "is not 'float32' or 'float64'")
    if attrs.get("layout") not in ("dense", "sparse"):
        raise bad("layout", "is not 'dense' or 'sparse'")
    purity = attrs.get("purity")
    if (
        not isinstance(purity, list)
        or len(purity) != len(blocks)
        or not all(isinstance(v, bool) for v in purity)
    ):
        raise bad("purity", f"is not a list of {len(blocks)} booleans")
    int_list("max_nnz_per_row", len(blocks))
    int_list("block_nnz", len(blocks))
    if not _is_int(attrs.get("nnz")):
        raise bad("nnz", "is not an integer >= 0")
    if not isinstance(attrs.get("grid_id"), str) or not attrs["grid_id"]:
        raise bad("grid_id", "is not a non-empty string")
    if not _is_label_dtype(attrs.get("label_dtype", "float64")):
        raise bad("label_dtype", "is not the name of a bool, integer or float dtype")
    names = attrs.get("feature_names")
    if names is not None and (
        not isinstance(names, list) or len(names) != p or not all(isinstance(v, str) for v in names)
    ):
        raise bad("feature_names", f"is neither null nor a list of {p} strings")
