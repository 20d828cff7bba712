"""The SLURM tests run only where a SLURM partition answers (``make test-slurm`` starts a
one-node cluster): elsewhere, and in ``make test``, they are skipped at once."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

PARTITION = os.environ.get("DASK_SCD_SLURM_PARTITION", "debug")


def _partition_answers() -> str | None:
    """None when the partition answers, else why not."""
    if shutil.which("sinfo") is None:
        return "sinfo is not installed"
    try:
        done = subprocess.run(["sinfo", "-h", "-p", PARTITION, "-o", "%t"], capture_output=True,
                              text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"sinfo did not answer ({error})"
    if done.returncode != 0 or not done.stdout.strip():
        return f"no SLURM partition {PARTITION!r} answers (make test-slurm starts one)"
    try:
        import dask_jobqueue  # noqa: F401
    except ImportError:
        return "dask-jobqueue is not installed (the jobqueue extra)"
    return None


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    ours = [item for item in items if here in Path(str(item.fspath)).parents]
    if not ours:
        return
    reason = _partition_answers()
    for item in ours:
        item.add_marker(pytest.mark.slurm)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
