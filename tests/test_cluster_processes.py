"""A real cluster of separate processes: ``dask scheduler`` and two ``dask worker`` started
from the command line, reached only through ``Client(scheduler_file=...)``."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import dask_scd

STARTUP_TIMEOUT = 90  # seconds for the scheduler file and both workers to appear


def _dask_command(*args):
    return [sys.executable, "-m", "dask", *args]


def _stop(processes):
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)


@pytest.fixture
def scheduler_file(tmp_path):
    path = tmp_path / "scheduler.json"
    with open(tmp_path / "cluster.log", "w") as log:
        processes = []
        try:
            yield _start(path, log, processes, tmp_path)
        finally:
            _stop(processes)


def _start(path, log, processes, tmp_path):
    """Start the scheduler, wait for its file, then start two workers."""
    common = {"stdout": log, "stderr": subprocess.STDOUT, "cwd": tmp_path}
    processes.append(
        subprocess.Popen(
            _dask_command(
                "scheduler", "--scheduler-file", str(path), "--port", "0", "--no-dashboard"
            ),
            **common,
        )
    )
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not path.exists():
        if time.monotonic() > deadline or processes[0].poll() is not None:
            log.flush()
            pytest.fail(f"the scheduler did not start: {(tmp_path / 'cluster.log').read_text()}")
        time.sleep(0.2)
    for _ in range(2):
        processes.append(
            subprocess.Popen(
                _dask_command(
                    "worker",
                    "--scheduler-file",
                    str(path),
                    "--nthreads",
                    "1",
                    "--memory-limit",
                    "1GiB",
                    "--no-dashboard",
                    "--local-directory",
                    str(tmp_path),
                ),
                **common,
            )
        )
    return path


def test_fit_through_a_scheduler_file(scheduler_file, tmp_path):
    from distributed import Client

    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 9))
    y = X @ rng.normal(size=9) + 0.1 * rng.normal(size=600)
    grid = dask_scd.to_grid(X, y, tmp_path / "data.zarr", row_chunk=200, blocks=3)
    expected = dask_scd.fit(X, y, alpha=0.1, tol=1e-10, random_state=0)
    with Client(scheduler_file=str(scheduler_file), timeout=STARTUP_TIMEOUT) as client:
        client.wait_for_workers(2, timeout=STARTUP_TIMEOUT)
        worker_pids = set(client.run(os.getpid).values())
        assert len(worker_pids) == 2 and os.getpid() not in worker_pids
        result = dask_scd.fit(grid, alpha=0.1, tol=1e-8, solver="block_scd", random_state=0)
    assert result.solver_ == "block_scd" and result.dual_gap_ <= 1e-8
    atol = np.sqrt(4e-8 * abs(expected.primal_) / 0.1)  # ‖θ − θ*‖² ≤ 2·gap/alpha
    np.testing.assert_allclose(result.coef_, expected.coef_, atol=atol)
