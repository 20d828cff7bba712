"""The cell cache's second tier: decoded cells in a local file of this process.

Out of core, the cell cache (:mod:`dask_scd.data.cache`) cannot keep a grid's cells, and
every pass read each one from the store again: its zstd frame decoded (~2 ms for a 3 MB
one-hot cell of 262k rows) and, for a pure cell, its by-rows form made (~0.7 ms). A
cell the cache has no room for is instead written once, in the form the passes read, to
an unlinked temporary file of the process (:class:`CellSpill`), and read back from it
with one ``preadv`` per array (~0.07 ms for that cell's 1 MB by-rows form in the page
cache). The same bits: the file holds the arrays' bytes.

The file lives in the dask worker's local directory (else the system's temporary
directory; ``DASK_SCD_SPILL`` names another, or ``0`` turns the spill off), is unlinked
when created (no other process opens it by name), and grows to at most half of the free
space its file system had then; past that, or after a failed write (a warning in the
worker's log), cells are read from the store as before. Nothing is evicted: a key names
one version of one cell (:attr:`~dask_scd.data.cells.CellRef.key`), whose bytes never
change.

A value is spilled where it says how: ``value.to_spill()`` → (arrays, meta) and
``type(value).from_spill(meta, arrays)`` → an equal value; a numpy array is spilled as
it is. Anything else is not spilled.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading

import numpy as np

logger = logging.getLogger(__name__)

ENVIRONMENT = "DASK_SCD_SPILL"


class CellSpill:
    """Values by key, their arrays' bytes in one append-only temporary file.

    ``directory``: where the file goes (None: the worker's local directory, else the
    system's temporary directory); ``max_bytes``: the most the file may hold (None: half
    of the free space of its file system when it is created). Thread-safe."""

    def __init__(self, directory: str | None = None, max_bytes: int | None = None):
        self.directory, self.max_bytes = directory, max_bytes
        self._file = None
        self._end = 0
        self._index: dict = {}  # key -> (rebuild, meta, [(offset, dtype, shape)])
        self._lock = threading.Lock()
        self.disabled = False
        self.writes = self.hits = self.bytes_written = 0

    def get(self, key):
        """The value spilled under ``key``, read back; None where there is none."""
        entry, file = self._index.get(key), self._file
        if entry is None or file is None:
            return None
        rebuild, meta, specs = entry
        arrays = []
        for offset, dtype, shape in specs:
            out = np.empty(shape, dtype=dtype)
            if out.nbytes:
                got = os.preadv(file.fileno(), [memoryview(out).cast("B")], offset)
                if got != out.nbytes:
                    raise OSError(f"cell spill file: {got} of {out.nbytes} bytes read back")
            arrays.append(out)
        self.hits += 1
        return arrays[0] if rebuild is None else rebuild(meta, arrays)

    def put(self, key, value) -> bool:
        """Write ``value`` under ``key`` (once: a key held already is left as it is).
        Returns whether ``key`` is spilled now."""
        if self.disabled or key in self._index:
            return not self.disabled
        parts = _parts(value)
        if parts is None:
            return False
        rebuild, meta, arrays = parts
        size = sum(a.nbytes for a in arrays)
        with self._lock:
            if key in self._index:
                return True
            if self._file is None and not self._open():
                return False
            if self._end + size > self.max_bytes:
                return False
            offset, self._end = self._end, self._end + size
        specs = []
        try:
            for a in arrays:
                a = np.ascontiguousarray(a)
                view, at = memoryview(a).cast("B"), offset
                while view:  # pwrite may write less than asked
                    done = os.pwrite(self._file.fileno(), view, at)
                    view, at = view[done:], at + done
                specs.append((offset, a.dtype, a.shape))
                offset += a.nbytes
        except OSError as exc:
            logger.warning(
                "spilling decoded cells to %s failed (%s); cells are read from "
                "the store at every pass",
                self.directory,
                exc,
            )
            self.close()
            self.disabled = True
            return False
        self._index[key] = (rebuild, meta, specs)
        self.writes += 1
        self.bytes_written += size
        return True

    def _open(self) -> bool:
        directory = self.directory or _local_directory()
        try:
            self._file = tempfile.TemporaryFile(dir=directory)
            if self.max_bytes is None:
                self.max_bytes = shutil.disk_usage(directory).free // 2
        except OSError as exc:
            logger.warning("no spill file for decoded cells in %s (%s)", directory, exc)
            self.disabled = True
            return False
        self.directory = directory
        return True

    @property
    def nbytes(self) -> int:
        """Bytes the file holds."""
        return self._end

    def close(self):
        """Drop the file and everything spilled."""
        with self._lock:
            if self._file is not None:
                self._file.close()
            self._file, self._end, self._index = None, 0, {}


def _parts(value):
    """(rebuild, meta, arrays) of a value that can be spilled, else None."""
    if isinstance(value, np.ndarray):
        return None, None, [value]
    to_spill = getattr(value, "to_spill", None)
    if to_spill is None:
        return None
    arrays, meta = to_spill()
    return type(value).from_spill, meta, list(arrays)


def _local_directory() -> str:
    try:
        from distributed import get_worker

        return get_worker().local_directory
    except (ImportError, ValueError, AttributeError):
        return tempfile.gettempdir()


def from_environment() -> CellSpill | None:
    """The spill ``DASK_SCD_SPILL`` asks for: unset or empty, the default one; ``0``,
    ``off`` or ``false``, none; else a directory for its file."""
    setting = os.environ.get(ENVIRONMENT, "").strip()
    if setting.lower() in ("0", "off", "false", "no"):
        return None
    return CellSpill(setting or None)
