"""Warnings that point at the user's line, however deep in the library they are raised."""

from __future__ import annotations

import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_user(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` with the stack level of the first frame outside dask_scd.

    A fixed ``stacklevel`` is right for one call path only: the same warning is raised
    under ``fit``, under the dask engine's in-memory fallback (``fit`` again) and under
    the Gram engine, at three different depths.
    """
    frame, level = sys._getframe(1), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
