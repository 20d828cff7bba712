"""What a fit on the cluster tells its user: one warning where the scheduler's tasks
will dominate a named Dask engine's epochs, and a NaN in a dask array raised on the
client, naming its row and column, with no failed task in the workers' logs."""

from __future__ import annotations

import logging
import warnings

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp

import dask_scd
from dask_scd import TaskOverheadWarning


def _stop(info):  # the first certified epoch is enough: the warning comes before it
    return True


def _data(n, p, rng):
    X = rng.normal(size=(n, p))
    return X, np.where(X @ rng.normal(size=p) > 0, 1.0, -1.0)


def _overhead_warnings(fit):
    """The TaskOverheadWarnings of ``fit()``, every one recorded."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit()
    return [w for w in caught if issubclass(w.category, TaskOverheadWarning)]


@pytest.mark.parametrize("solver", ["block_scd", "block_newton"])
def test_small_finely_chunked_data_on_a_named_dask_engine_warns_once(rng, client, solver):
    """569 × 30 in chunks of 100 × 10 (the breast-cancer size, 8–19 s of block SCD): one
    warning, at the caller's line, with the rows, chunks, cells and estimated overhead
    it found and what to do."""
    X, y = _data(569, 30, rng)
    dX = da.from_array(X, chunks=(100, 10))
    found = _overhead_warnings(
        lambda: dask_scd.fit(dX, y, loss="logistic", solver=solver, client=client, callback=_stop)
    )
    assert len(found) == 1
    message = str(found[0].message)
    for part in (
        f"solver={solver!r}",
        "569 rows × 30 columns",
        "6 row chunks × 3 column blocks (18 cells",
        "ms of task overhead against",
        "17070 stored values",
        "larger chunks",
        "solver='auto'",
    ):
        assert part in message, (part, message)
    assert found[0].filename == __file__


def test_reasonable_chunks_or_auto_give_no_warning(rng, client):
    """20,000 × 10 in two row chunks (an epoch's arithmetic within 10x its tasks); the
    small array under solver="auto" (fitted in memory); a named engine in memory."""
    X, y = _data(20_000, 10, rng)
    chunky = da.from_array(X, chunks=(10_000, 10))
    for solver in ("block_scd", "block_newton"):
        assert not _overhead_warnings(
            lambda: dask_scd.fit(chunky, y, solver=solver, client=client, callback=_stop)
        )
    small, labels = _data(569, 30, rng)
    fine = da.from_array(small, chunks=(100, 10))
    assert not _overhead_warnings(lambda: dask_scd.fit(fine, labels, loss="logistic"))
    assert not _overhead_warnings(
        lambda: dask_scd.fit(small, labels, loss="logistic", solver="block_scd", callback=_stop)
    )


@pytest.fixture
def worker_logs():
    """The records of the 'distributed' loggers (which do not propagate to the root
    logger: the handler is on them), warnings and errors; the cluster is in-process, so
    its workers log here."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep(level=logging.WARNING)
    loggers = [logging.getLogger(name) for name in ("distributed", "distributed.worker")]
    for logger in loggers:
        logger.addHandler(handler)
    yield records
    for logger in loggers:
        logger.removeHandler(handler)


@pytest.mark.filterwarnings("ignore::dask_scd.TaskOverheadWarning")
@pytest.mark.parametrize(
    "solver,loss,sparse",
    [
        ("block_scd", "logistic", False),
        ("block_scd", "logistic", True),
        ("block_newton", "logistic", False),
        ("block_newton", "multinomial", False),
        ("cocoa", "logistic", False),
    ],
)
def test_a_nan_is_raised_on_the_client_and_no_task_fails(
    rng, client, worker_logs, solver, loss, sparse
):
    X, y = _data(569, 30, rng)
    if loss == "multinomial":
        y = np.digitize(X[:, 0], [-0.5, 0.5])
    X[250, 13] = np.nan
    dX = da.from_array(X, chunks=(100, 10))
    if sparse:
        dX = dX.map_blocks(sp.csr_matrix)
    cell = "cell \\(row chunk 2, block 1\\)" if solver != "cocoa" else "part \\d"
    with pytest.raises(
        ValueError,
        match=f"X contains NaN or infinity in {cell}.*: first at row 250, column 13, the "
        "value there is NaN",
    ):
        dask_scd.fit(dX, y, loss=loss, solver=solver, client=client)
    logged = [record.getMessage() for record in worker_logs]
    assert not [text for text in logged if "Compute Failed" in text], logged
    assert not [record for record in worker_logs if record.levelno >= logging.ERROR], logged
