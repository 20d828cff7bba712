"""Decoded arrays in a local file of this process, read back instead of decoded again.

Two readers of a grid keep what they decoded this way: the worker cell cache's second
tier, and the out-of-core SDCA engine's row chunks
(:mod:`dask_scd.engines.local.sdca_grid`, ``spill=True``).

Out of core, the cell cache (:mod:`dask_scd.data.cache`) cannot keep a grid's cells, and
every pass read each one from the store again: its zstd frame decoded (~2 ms for a 3 MB
one-hot cell of 262k rows) and, for a pure cell, its by-rows form made (~0.7 ms). A
cell the cache has no room for is instead written once, in the form the passes read, to
an unlinked temporary file of the process (:class:`Spill`), and read back from it
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
it is (and read back, where asked, into the leading rows of a buffer of the caller's).
Anything else is not spilled.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import warnings

import numpy as np

logger = logging.getLogger(__name__)

ENVIRONMENT = "DASK_SCD_SPILL"


class Spill:
    """Values by key, their arrays' bytes in one append-only temporary file.

    ``directory``: where the file goes (None: the worker's local directory, else the
    system's temporary directory); ``max_bytes``: the most the file may hold (None: half
    of the free space of its file system when it is created). A file that cannot be made
    or written is dropped and nothing more is spilled, with a warning that names
    ``what`` is spilled: in this process's log, or a ``RuntimeWarning`` where ``warn``.
    Thread-safe."""

    def __init__(
        self, directory=None, max_bytes: int | None = None, what: str = "cells", warn=False
    ):
        self.directory, self.max_bytes = directory, max_bytes
        self.what, self.warn = what, warn
        self._file = None
        self._end = 0
        self._index: dict = {}  # key -> (rebuild, meta, [(offset, dtype, shape)])
        self._lock = threading.Lock()
        self.disabled = False
        self.writes = self.hits = 0

    def get(self, key, out: np.ndarray | None = None):
        """The value spilled under ``key``, read back; None where there is none.
        ``out``: for an array spilled as it is, a buffer of its dtype and row width whose
        leading rows receive it (the value is then a view of ``out``)."""
        entry, file = self._index.get(key), self._file
        if entry is None or file is None:
            return None
        rebuild, meta, specs = entry
        arrays = []
        for offset, dtype, shape in specs:
            array = np.empty(shape, dtype=dtype) if out is None else out[: shape[0]]
            if array.nbytes:
                got = os.preadv(file.fileno(), [memoryview(array).cast("B")], offset)
                if got != array.nbytes:
                    raise OSError(f"spill file of {key!r}: {got} of {array.nbytes} bytes read")
            arrays.append(array)
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
            self._fail(exc)
            return False
        self._index[key] = (rebuild, meta, specs)
        self.writes += 1
        return True

    def _open(self) -> bool:
        self.directory = self.directory or _local_directory()
        try:
            self._file = tempfile.TemporaryFile(dir=self.directory)
            if self.max_bytes is None:
                self.max_bytes = shutil.disk_usage(self.directory).free // 2
        except OSError as exc:
            self._fail(exc)
            return False
        return True

    def _fail(self, exc: OSError):
        """Drop the file and spill nothing more: the values are decoded again."""
        self.close()
        self.disabled = True
        message = (
            f"spilling decoded {self.what} to {self.directory} failed ({exc}); "
            f"the {self.what} are decoded at every pass"
        )
        if self.warn:
            warnings.warn(message, RuntimeWarning, stacklevel=4)
        else:
            logger.warning(message)

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


def from_environment() -> Spill | None:
    """The spill ``DASK_SCD_SPILL`` asks for: unset or empty, the default one; ``0``,
    ``off`` or ``false``, none; else a directory for its file."""
    setting = os.environ.get(ENVIRONMENT, "").strip()
    if setting.lower() in ("0", "off", "false", "no"):
        return None
    return Spill(setting or None)
