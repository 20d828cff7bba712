"""For cluster users: a grid on a shared filesystem, fitted by block SCD on an HPC cluster
started with dask-jobqueue (SLURM), or on a local cluster of processes elsewhere.

1. Start the cluster: a ``SLURMCluster`` when ``DASK_SCD_SLURM_QUEUE`` names a partition
   (and dask-jobqueue is installed: ``pip install dask-scd[jobqueue]``), its jobs' resources
   from ``DASK_SCD_JOBS``, ``DASK_SCD_CORES``, ``DASK_SCD_PROCESSES``, ``DASK_SCD_MEMORY``,
   ``DASK_SCD_WALLTIME``, ``DASK_SCD_ACCOUNT``, else what fits the partition's nodes,
   kept at that many jobs by ``adapt`` (workers retire before the walltime and are
   replaced). While the jobs wait, the scheduler's pending reason is printed every few
   seconds; a request no node can hold fails at once. Else a ``LocalCluster`` of 2 worker
   processes.
2. Write a one-hot (Criteo-like) data set as a grid store under ``DASK_SCD_SHARED_DIR``
   (default: a temporary directory, fine for a local cluster only: on a real cluster
   it must be a filesystem every node mounts at the same path).
3. Fit logistic regression with ``solver="block_scd"`` through the current client,
   printing the relative gap of every epoch (on SLURM, checkpointed every 5 epochs in the
   shared directory: run it again with ``DASK_SCD_RESUME=1`` after the client died), save
   the model beside the grid, and predict lazily on the grid.

Run:  .venv/bin/python examples/cluster_jobqueue.py            (1,000,000 examples)
      .venv/bin/python examples/cluster_jobqueue.py --small    (8,000; also
      DASK_SCD_EXAMPLE_SIZE=small)
      DASK_SCD_SLURM_QUEUE=compute DASK_SCD_SHARED_DIR=/scratch/$USER \\
          python examples/cluster_jobqueue.py                 (on a SLURM login node)
"""

import contextlib
import os
import sys
import tempfile
import time

import numpy as np
from distributed import Client, LocalCluster

import dask_scd
from dask_scd.datasets import make_onehot
from dask_scd.runtime import jobqueue

SMALL = "--small" in sys.argv or os.environ.get("DASK_SCD_EXAMPLE_SIZE") == "small"
N_SAMPLES = 8_000 if SMALL else 1_000_000
N_FIELDS = 4 if SMALL else 8  # one column block per field
ROW_CHUNK = N_SAMPLES // (2 if SMALL else 8)  # at least one row chunk per worker thread
ALPHA = 1e-5
TOL = 1e-6


def start_cluster(directory):
    """A SLURMCluster when a partition is given, else a LocalCluster of processes; and the
    number of workers to wait for."""
    queue = os.environ.get("DASK_SCD_SLURM_QUEUE")
    if queue is None:
        print("cluster: LocalCluster, 2 worker processes x 1 thread")
        return LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0"), 2
    limits = jobqueue.partition_limits(queue)  # None where sinfo does not answer
    resources = jobqueue.job_resources("slurm", queue=queue, limits=limits)
    cluster = jobqueue.make_cluster(
        resources,
        shared_directory=directory,  # the workers' logs and the checkpoint
        local_directory=os.environ.get("TMPDIR", "/tmp"),  # spill space, node-local
    )
    print(cluster.job_script())
    cluster.adapt(minimum_jobs=resources.jobs, maximum_jobs=resources.jobs)
    return cluster, resources.n_workers


@contextlib.contextmanager
def shared_directory():
    shared = os.environ.get("DASK_SCD_SHARED_DIR")
    if shared is not None:
        yield shared
        return
    with tempfile.TemporaryDirectory() as directory:
        yield directory


def main():
    with shared_directory() as directory:
        cluster, n_workers = start_cluster(directory)
        with cluster, Client(cluster) as client:
            if isinstance(cluster, LocalCluster):
                client.wait_for_workers(n_workers, timeout=600)
            else:  # prints each job's pending reason; fails fast if it can never run
                jobqueue.wait_for_workers(client, cluster, n_workers, timeout=600)
            fit_and_predict(client, directory)


def fit_and_predict(client, directory):
    """Write the grid, fit it, save the model, predict on the grid."""
    X, y, fields = make_onehot(N_SAMPLES, n_fields=N_FIELDS, cardinality=200, random_state=0)
    start = time.perf_counter()
    grid = dask_scd.to_grid(
        X,
        y,
        os.path.join(directory, "clicks.zarr"),
        row_chunk=ROW_CHUNK,
        blocks=fields,
        overwrite=True,
    )
    print(f"wrote {grid} in {time.perf_counter() - start:.1f}s")

    # No client= argument: the engine finds the current client.
    start = time.perf_counter()
    result = dask_scd.fit(
        grid,
        loss="logistic",
        alpha=ALPHA,
        tol=TOL,
        solver="block_scd",
        random_state=0,
        verbose=2,
        resume=os.environ.get("DASK_SCD_RESUME") == "1",
    )
    print(
        f"{result!r}\nfitted in {time.perf_counter() - start:.1f}s on "
        f"{len(client.scheduler_info()['workers'])} workers"
    )
    model = os.path.join(directory, "clicks.model.npz")
    np.savez(
        model,
        coef=result.coef_,
        intercept=result.intercept_,
        dual_gap=result.dual_gap_,
        n_iter=result.n_iter_,
    )
    print(f"saved {model}")

    model = dask_scd.LogisticRegression(
        alpha=ALPHA, tol=TOL, solver="block_scd", random_state=0
    ).fit(grid)
    accuracy = model.score(grid)  # predictions computed chunk by chunk on the workers
    print(
        f"LogisticRegression on the grid: relative gap {model.dual_gap_[0]:.1e}, "
        f"training accuracy {accuracy:.4f}"
    )


if __name__ == "__main__":  # worker processes import this file: keep the work in main()
    main()
