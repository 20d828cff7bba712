"""Files written whole or not at all: the model files, the CLI's outputs, checkpoints."""

from __future__ import annotations

import os
import uuid


def write_atomically(path: str, write, text: bool = False) -> None:
    """``write(handle)`` into a new temporary file beside ``path`` (``text``: opened for
    text, else binary), flushed to the disk, then renamed onto ``path``: a reader sees
    the old file or the whole new one, never half of one, and the temporary file is
    removed whatever fails (an interruption included)."""
    temporary = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(temporary, "x" if text else "xb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.remove(temporary)
