"""Reading a grid store: the per-process cell and label reader (``read_cell`` /
``read_labels``, checked against the checksums), and the lazy dask arrays built on them.
The header and metadata checks are the layout's (:mod:`dask_scd.grid.layout`)."""

from __future__ import annotations

import json
import os
from typing import NamedTuple

import numcodecs
import numpy as np
import scipy.sparse as sp
import zarr
from zarr.codecs import BytesCodec, ZstdCodec

from .codec import checksum, packed_size, unpack_csc
from .layout import GridCorruptionError, _check_attrs, _missing, reading

__all__ = ["CellBuffers", "read_cell", "read_dense_row_chunk", "read_labels"]


class CellBuffers:
    """Memory reused from one dense cell's read to the next (one reading thread's own):
    the compressed frame and, where the caller decodes into no array of its own, the
    decoded values. A fresh 1.3 MB array per cell costs its page faults at every read:
    decoding a 4,096 x 40 float64 cell takes ~5 ms into new memory, ~3 into reused."""

    def __init__(self):
        self._frame = np.empty(0, dtype=np.uint8)
        self._values = np.empty(0, dtype=np.uint8)

    def frame(self, nbytes: int) -> np.ndarray:
        if self._frame.size < nbytes:
            self._frame = np.empty(nbytes, dtype=np.uint8)
        return self._frame[:nbytes]

    def values(self, shape: tuple, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if self._values.size < nbytes:
            self._values = np.empty(nbytes, dtype=np.uint8)
        return self._values[:nbytes].view(dtype).reshape(shape)


class SparseParts(NamedTuple):
    """A sparse cell's CSC arrays and shape, as read (checked, not wrapped)."""

    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    shape: tuple


class _Reader:
    """Per-process handle on one store version, shared by all cell reads."""

    def __init__(self, path: str, grid_id: str):
        self.path = path
        self.identity = _identity(path)
        if self.identity is None:
            raise GridCorruptionError(_changed(path))
        attrs = _store_attrs(path)
        if attrs.get("grid_id") != grid_id:
            raise GridCorruptionError(_changed(path))
        _check_attrs(path, attrs)
        self.bounds = np.asarray(attrs["row_bounds"], dtype=np.int64)
        self.sizes = [len(b) for b in attrs["blocks"]]
        # The blocks' column lists (and names) are what a reader needs least and what
        # weighs most: a 600k-column store's, parsed, held ~50 MiB in every worker
        # (with zarr's group, which is not kept either: arrays open by their path).
        self.attrs = {k: v for k, v in attrs.items() if k not in _LARGE_ATTRS}
        self.is_sparse = attrs["layout"] == "sparse"
        self.dtype = np.dtype(attrs["dtype"])
        self._arrays: dict[str, object] = {}
        self._cell_nnz = None
        self._checksums = None
        # (r, b) -> the last 4 bytes of a dense cell's zstd frame whose decoded values
        # passed the checks (finite, CRC): see _read_dense.
        self._verified_frames: dict = {}

    def _array(self, name: str, cache: bool = True):
        arr = self._arrays.get(name)
        if arr is None:
            arr = zarr.open_array(store=self.path, path=name, mode="r")
            if cache:
                self._arrays[name] = arr
        return arr

    def _chunk_path(self, name: str, key: str) -> str:
        """The file of chunk ``key`` (e.g. "c/0") of array ``name``."""
        return os.path.join(self.path, *name.split("/"), *key.split("/"))

    def _require_chunk_file(self, name: str, key: str, where: str) -> None:
        # Zarr silently serves the fill value for a missing chunk: check.
        chunk = self._chunk_path(name, key)
        if not os.path.isfile(chunk):
            raise GridCorruptionError(f"{where}: chunk file {chunk} is missing")

    def _required(self, name: str):
        try:
            return self._array(name)
        except (KeyError, FileNotFoundError):
            raise _missing(self.path, name) from None

    def _table(self, name: str, shape: tuple) -> np.ndarray:
        """A small int64 table of the store (cell_nnz, checksums), its shape checked."""
        values = np.asarray(self._required(name)[:])
        if values.shape != shape or values.dtype != np.int64:
            raise GridCorruptionError(
                f"grid store {self.path}: {name} has shape {values.shape} and dtype "
                f"{values.dtype}, expected {shape} and int64"
            )
        return values

    def cell_nnz(self) -> np.ndarray:
        if self._cell_nnz is None:
            shape = (len(self.bounds) - 1, len(self.sizes))
            self._cell_nnz = self._table("cell_nnz", shape)
            if (self._cell_nnz < 0).any():
                raise GridCorruptionError(f"grid store {self.path}: cell_nnz holds negatives")
        return self._cell_nnz

    def checksums(self):
        """(cell_checksum, label_checksum) arrays, or None for a version-1 store."""
        if self._checksums is None:
            if self.attrs.get("format_version", 1) < 2:
                self._checksums = ()
            else:
                n_rc = len(self.bounds) - 1
                self._checksums = (
                    self._table("cell_checksum", (n_rc, len(self.sizes))),
                    self._table("label_checksum", (n_rc,)),
                )
        return self._checksums or None

    def _verify(self, values, expected_at, where: str) -> None:
        sums = self.checksums()
        if sums is not None and checksum(values) != int(sums[expected_at[0]][expected_at[1:]]):
            raise GridCorruptionError(f"{where}: {_MISMATCH}")

    def read_cell(
        self, r: int, b: int, buffers: CellBuffers | None = None, into=None, parts: bool = False
    ):
        """Cell (r, b); a dense one decoded into ``into`` (an array of at least a chunk's
        values, C order) or ``buffers``' memory when given, a sparse one's arrays views
        of ``buffers``' memory when given (either cell valid until the next read into
        the same memory). ``parts``: a sparse cell as its :class:`SparseParts`, not
        wrapped in a scipy matrix (whose constructor copies views of a larger buffer and
        checks what the cell's checks already proved)."""
        n_rc = len(self.bounds) - 1
        if not (0 <= r < n_rc and 0 <= b < len(self.sizes)):
            raise IndexError(f"no cell ({r}, {b}) in a {n_rc} x {len(self.sizes)} grid")
        where = f"cell (row chunk {r}, block {b}) of grid {self.path}"
        with reading(where):
            if self.is_sparse:
                found = self._read_sparse(r, b, where, buffers)
                return found if parts else sp.csc_matrix(found[:3], shape=found.shape)
            return self._read_dense(r, b, where, buffers, into)

    def _read_dense(self, r: int, b: int, where: str, buffers=None, into=None) -> np.ndarray:
        """The dense cell, checked: finite values and the CRC of the table.

        A cell read again whose zstd frame ends with the same content checksum as when it
        passed those checks (the frame's last 4 bytes: XXH64 of the decoded values, which
        zstd itself compares while decoding) holds the values checked then: the checks
        are not repeated (the CRC costs half a decode: 1.1 of 3 ms for a 4,096 x 40 float64
        cell). A cell swapped with another, moved or modified ends with another checksum
        and is checked again."""
        name = f"X/block_{b}"
        arr = self._array(name)
        n, size = int(self.bounds[-1]), self.sizes[b]
        row_chunk = int(self.attrs["row_chunk"])
        if arr.shape != (n, size) or arr.chunks != (row_chunk, size):
            raise GridCorruptionError(
                f"{where}: array {name} has shape {arr.shape} / chunks {arr.chunks}, "
                f"expected {(n, size)} / {(row_chunk, size)}"
            )
        self._require_chunk_file(name, f"c/{r}/0", where)
        trailer = None
        if _one_zstd_frame(arr):
            cell, trailer = self._decode_dense(
                name, r, arr.dtype, (row_chunk, size), where, buffers, into
            )
            if trailer is not None and self._verified_frames.get((r, b)) == trailer:
                return cell
        else:
            cell = np.asarray(arr[self.bounds[r] : self.bounds[r + 1]])
        if not np.isfinite(cell).all():
            raise GridCorruptionError(f"{where}: cell holds missing or non-finite values")
        self._verify(cell, (0, r, b), where)
        if trailer is not None and self.checksums() is not None:
            self._verified_frames[(r, b)] = trailer
        return cell

    def _decode_dense(
        self, name: str, r: int, dtype, shape: tuple, where: str, buffers=None, into=None
    ):
        """Rows ``bounds[r]:bounds[r + 1]`` of dense chunk ``r`` of array ``name``, its one
        zstd frame decoded straight into the cell (zarr's path costs a third more: its
        event loop, a decoded copy, a copy into the selection), and the frame's content
        checksum (its last 4 bytes; None where the frame has none)."""
        buffers = buffers or CellBuffers()
        frame = self._read_frame(name, f"c/{r}/0", where, buffers)
        dtype = np.dtype(dtype).newbyteorder("<")
        if into is None:
            chunk = buffers.values(shape, dtype)
        else:
            chunk = into.reshape(-1)[: shape[0] * shape[1]].view(dtype).reshape(shape)
        # The last value of a chunk is finite, or zarr's fill NaN in the padding of the last
        # row chunk, never these bytes: still there after decoding, the frame was short.
        last = chunk.reshape(-1)[-1:].view(np.uint8)
        last[:] = 0xFF
        _ZSTD.decode(frame, out=chunk)  # refuses a frame longer than the chunk
        if (last == 0xFF).all():
            raise GridCorruptionError(f"{where}: chunk file holds fewer values than a chunk")
        trailer = bytes(frame[-4:]) if _frame_has_checksum(frame) else None
        return chunk[: self.bounds[r + 1] - self.bounds[r]], trailer

    def _read_sparse(self, r: int, b: int, where: str, buffers=None) -> SparseParts:
        rows, size = int(self.bounds[r + 1] - self.bounds[r]), self.sizes[b]
        nnz = int(self.cell_nnz()[r, b])
        name = f"X/block_{b}/cell_{r}"
        expected = packed_size(nnz, size, self.dtype)
        self._require_chunk_file(name, "c/0", where)
        # Once one cell of this grid was found stored as to_grid stores them (one zstd
        # frame of bytes), the others are decoded without opening their zarr arrays; any
        # cell whose frame does not decode to its length goes through zarr.
        packed, trailer = (
            self._packed_frame(name, expected, where, buffers) if self._frames else (None, None)
        )
        if packed is None:
            arr = self._array(name, cache=False)
            if arr.shape != (expected,):
                raise GridCorruptionError(
                    f"{where}: {name} has shape {arr.shape}, expected {(expected,)}"
                )
            if _one_zstd_frame(arr) and arr.dtype == np.uint8:
                packed, trailer = self._packed_frame(name, expected, where, buffers)
                self._frames = packed is not None
            if packed is None:
                packed = np.asarray(arr[:])
        # A cell read again whose frame ends with the content checksum it had when it
        # passed the checks holds the bytes checked then (zstd compares that checksum
        # while decoding; see _read_dense): out of core a cell is read every pass, and
        # the CRC and the checks were a third of a read (1.1 of 3.3 ms a 3 MB cell).
        checked = trailer is not None and self._verified_frames.get(("sparse", r, b)) == trailer
        if not checked:
            self._verify(packed, (0, r, b), where)
        data, indices, indptr = unpack_csc(
            packed, nnz, size, self.dtype, where, copy=buffers is None
        )
        if not checked:
            if (
                indptr[0] != 0
                or indptr[-1] != nnz
                or (np.diff(indptr) < 0).any()
                or (nnz and (indices.min() < 0 or indices.max() >= rows))
                or not np.isfinite(data).all()
            ):
                raise GridCorruptionError(f"{where}: inconsistent sparse cell contents")
            if trailer is not None and self.checksums() is not None:
                self._verified_frames[("sparse", r, b)] = trailer
        return SparseParts(data, indices, indptr, (rows, size))

    _frames = None  # are this grid's sparse cells one zstd frame each (see _read_sparse)?

    def _packed_frame(self, name: str, expected: int, where: str, buffers=None) -> tuple:
        """(packed sparse cell (uint8) decoded straight from its one zstd frame, the
        frame's content checksum or None): zarr's path costs opening the array, its
        event loop and two copies (7.5 ms of a 3 MB cell's read become ~3). (None, None)
        where the frame does not decode to ``expected`` bytes (zarr's path then reads it
        and reports what is wrong). With ``buffers`` the frame is read into and decoded
        into their memory: under a memory limit fresh arrays of a few MB are fresh mmaps,
        and their page faults cost as much as the decoding."""
        frame = self._read_frame(name, "c/0", where, buffers)
        try:
            if buffers is None:
                raw = _ZSTD.decode(frame)
            else:
                raw = buffers.values((expected,), np.uint8)
                # A packed cell never ends with 0xFF (its last byte is the high byte of
                # a non-negative int32 row index, or of indptr's last, nnz): still there
                # after decoding, the frame was short.
                raw[-1:] = 0xFF
                _ZSTD.decode(frame, out=raw)  # refuses a frame longer than ``expected``
                if expected and raw[-1] == 0xFF:
                    return None, None
        except Exception:  # not a frame zstd reads: zarr's path says what it is
            return None, None
        if len(raw) != expected:
            return None, None
        trailer = bytes(frame[-4:]) if _frame_has_checksum(frame) else None
        return np.frombuffer(raw, dtype=np.uint8), trailer

    def _read_frame(self, name: str, chunk: str, where: str, buffers=None):
        """The bytes of chunk file ``chunk`` of array ``name``: into ``buffers``' frame
        memory when given, else fresh."""
        with open(self._chunk_path(name, chunk), "rb") as f:
            if buffers is None:
                return f.read()
            nbytes = os.fstat(f.fileno()).st_size
            frame = buffers.frame(nbytes)
            if f.readinto(frame) != nbytes:
                raise GridCorruptionError(f"{where}: chunk file changed while read")
            return frame

    def _vector(self, name: str, r: int, where: str) -> np.ndarray:
        """Row chunk r of the per-row array ``name`` (the labels or the weights), unchecked."""
        with reading(where):
            self._require_chunk_file(name, f"c/{r}", where)
            return np.asarray(self._array(name)[self.bounds[r] : self.bounds[r + 1]])

    def read_weights(self, r: int) -> np.ndarray:
        """Sample weights of row chunk r (stores written with ``sample_weight``)."""
        if not self.attrs.get("has_weights", False):
            raise ValueError(f"grid {self.path} stores no sample weights")
        where = f"sample weights of row chunk {r} of grid {self.path}"
        w = self._vector("weight", r, where)
        with reading(where):
            expected = self._table("weight_checksum", (len(self.bounds) - 1,))
        if not np.isfinite(w).all() or (w < 0).any():
            raise GridCorruptionError(f"{where}: missing, negative or non-finite values")
        if checksum(w) != int(expected[r]):
            raise GridCorruptionError(f"{where}: {_MISMATCH}")
        return w

    def read_labels(self, r: int) -> np.ndarray:
        where = f"labels of row chunk {r} of grid {self.path}"
        y = self._vector("y", r, where)
        if not np.isfinite(y).all():
            raise GridCorruptionError(f"{where}: missing or non-finite values")
        self._verify(y, (1, r), where)
        return y


_ZSTD = numcodecs.Zstd()  # zarr's own zstd decoder (numcodecs is zarr's dependency)
_MISMATCH = (
    "checksum mismatch (the bytes on disk are not the ones written there: a chunk file "
    "moved, swapped or modified)"
)


def _frame_has_checksum(frame: np.ndarray) -> bool:
    """Does a zstd frame (magic number 0xFD2FB528, then the frame header descriptor) end
    with the checksum of its content (the descriptor's bit 2)?"""
    return len(frame) >= 9 and bytes(frame[:4]) == b"\x28\xb5\x2f\xfd" and bool(frame[4] & 0x04)


def _one_zstd_frame(arr) -> bool:
    """Are the array's chunks stored as ``to_grid`` writes them: little-endian bytes in
    one zstd frame per chunk file?"""
    codecs = arr.metadata.codecs
    return (
        len(codecs) == 2
        and isinstance(codecs[0], BytesCodec)
        and getattr(codecs[0].endian, "value", codecs[0].endian) in (None, "little")
        and isinstance(codecs[1], ZstdCodec)
    )


_READERS: dict = {}  # (path, grid_id) -> _Reader, the most recent MAX_READERS
MAX_READERS = 64


_LARGE_ATTRS = ("blocks", "feature_names", "feature_order")


def _store_attrs(path: str) -> dict:
    """The store's attributes, read from its ``zarr.json`` (nothing else of zarr's group
    is kept); a store without one, through zarr."""
    try:
        with open(os.path.join(path, "zarr.json"), "rb") as f:
            meta = json.load(f)
    except FileNotFoundError:
        meta = None
    except (OSError, ValueError) as exc:
        raise GridCorruptionError(f"grid store {path}: cannot read zarr.json: {exc}") from exc
    if isinstance(meta, dict) and isinstance(meta.get("attributes"), dict):
        return meta["attributes"]
    return dict(zarr.open_group(path, mode="r").attrs)


def _reader(path: str, grid_id: str) -> _Reader:
    """The store's reader, opened again when the directory at ``path`` is not the one it
    opened: ``to_grid(..., overwrite=True)`` puts a new directory in its place, which an
    old handle must not read with the old metadata (the new one's ``grid_id`` differs,
    and :class:`_Reader` says the store changed)."""
    key = (path, grid_id)
    reader = _READERS.get(key)
    if reader is None or reader.identity != _identity(path):
        reader = _Reader(path, grid_id)
        if len(_READERS) >= MAX_READERS:
            _READERS.pop(next(iter(_READERS)), None)
        _READERS[key] = reader
    return reader


def _identity(path: str):
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _changed(path: str) -> str:
    return (
        f"grid store {path} changed since it was opened (rewritten or removed): open it "
        "again with open_grid"
    )


def read_cell(
    path: str, grid_id: str, r: int, b: int, buffers: CellBuffers | None = None, parts: bool = False
):
    """Cell (row chunk r, block b) of the store at ``path``, checked against its checksum:
    a task function of Grid.X's graph and of the data layer (top-level so it pickles).
    With ``buffers`` the cell is a view of their memory, valid until their next read;
    ``parts``: a sparse cell as its :class:`SparseParts`."""
    return _reader(path, grid_id).read_cell(r, b, buffers, parts=parts)


def read_dense_row_chunk(
    path: str, grid_id: str, r: int, out: np.ndarray, buffers: CellBuffers
) -> np.ndarray:
    """Row chunk r of a dense grid, its cells side by side in grid column order (as
    ``np.hstack`` of its cells), decoded into ``out`` (C order, at least the row chunk's
    rows and the grid's columns, the grid's dtype); returns ``out[:rows]``.

    One cell is decoded straight into ``out``; more are decoded into ``buffers``, each
    copied into its columns. Every cell is checked as :func:`read_cell` checks it."""
    reader = _reader(path, grid_id)
    if out.dtype != reader.dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-ordered {reader.dtype} array, got {out.dtype}")
    rows = int(reader.bounds[r + 1] - reader.bounds[r])
    if len(reader.sizes) == 1:
        cell = reader.read_cell(r, 0, buffers, into=out)
        if not np.shares_memory(cell, out):  # read through zarr
            out[:rows] = cell
        return out[:rows]
    lo = 0
    for b, size in enumerate(reader.sizes):
        out[:rows, lo : lo + size] = reader.read_cell(r, b, buffers)
        lo += size
    return out[:rows]


def read_labels(path: str, grid_id: str, r: int) -> np.ndarray:
    """Labels of row chunk r: a task function of Grid.y's graph and of the data layer."""
    return _reader(path, grid_id).read_labels(r)


def read_weights(path: str, grid_id: str, r: int) -> np.ndarray:
    """Sample weights of row chunk r, checked against their checksum."""
    return _reader(path, grid_id).read_weights(r)


def _build_arrays(path: str, attrs: dict, row_chunks: tuple, sizes: tuple):
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    grid_id = attrs["grid_id"]
    dtype = np.dtype(attrs["dtype"])
    token = tokenize(path, grid_id)
    x_name, y_name = f"grid-X-{token}", f"grid-y-{token}"
    x_dsk = {
        (x_name, r, b): (read_cell, path, grid_id, r, b)
        for r in range(len(row_chunks))
        for b in range(len(sizes))
    }
    y_dsk = {(y_name, r): (read_labels, path, grid_id, r) for r in range(len(row_chunks))}
    if attrs["layout"] == "sparse":
        meta = sp.csc_matrix((0, 0), dtype=dtype)
    else:
        meta = np.empty((0, 0), dtype=dtype)
    X = da.Array(
        HighLevelGraph.from_collections(x_name, x_dsk, dependencies=()),
        x_name,
        (row_chunks, sizes),
        meta=meta,
    )
    y = da.Array(
        HighLevelGraph.from_collections(y_name, y_dsk, dependencies=()),
        y_name,
        (row_chunks,),
        meta=np.empty((0,), dtype=np.float64),
    )
    return X, y


def _store_version(path: str, grid_id: str) -> str:
    """The store's directory (device, inode) and its write's id, as one string."""
    stat = os.stat(path)
    return f"{stat.st_dev}:{stat.st_ino}:{grid_id}"
