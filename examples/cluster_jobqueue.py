"""For cluster users: a grid on a shared filesystem, fitted by block SCD on an HPC cluster
started with dask-jobqueue (SLURM), or on a local cluster of processes elsewhere.

1. Start the cluster: a ``SLURMCluster`` when ``DASK_SCD_SLURM_QUEUE`` names a partition
   (and dask-jobqueue is installed: ``pip install dask-scd[jobqueue]``), scaled to
   ``DASK_SCD_JOBS`` jobs (default 2) of 2 worker processes each, with ``adapt`` up to
   twice that; else a ``LocalCluster`` of 2 worker processes.
2. Write a one-hot (Criteo-like) data set as a grid store under ``DASK_SCD_SHARED_DIR``
   (default: a temporary directory, fine for a local cluster only: on a real cluster
   it must be a filesystem every node mounts at the same path).
3. Fit logistic regression with ``solver="block_scd"`` through the current client,
   printing the relative gap of every epoch, and predict lazily on the grid.

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

from distributed import Client, LocalCluster

import dask_scd
from dask_scd.datasets import make_onehot

SMALL = "--small" in sys.argv or os.environ.get("DASK_SCD_EXAMPLE_SIZE") == "small"
N_SAMPLES = 8_000 if SMALL else 1_000_000
N_FIELDS = 4 if SMALL else 8  # one column block per field
ROW_CHUNK = N_SAMPLES // (2 if SMALL else 8)  # at least one row chunk per worker thread
ALPHA = 1e-5
TOL = 1e-6


def start_cluster():
    """A SLURMCluster when a partition is given, else a LocalCluster of processes."""
    queue = os.environ.get("DASK_SCD_SLURM_QUEUE")
    if queue is None:
        print("cluster: LocalCluster, 2 worker processes x 1 thread")
        return LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0")
    from dask_jobqueue import SLURMCluster

    jobs = int(os.environ.get("DASK_SCD_JOBS", "2"))
    cluster = SLURMCluster(
        queue=queue,
        cores=4,             # per job: 2 processes x 2 threads
        processes=2,
        memory="16GB",
        walltime="01:00:00",
        local_directory=os.environ.get("TMPDIR", "/tmp"),  # spill space, node-local
    )
    print(cluster.job_script())
    cluster.scale(jobs=jobs)
    cluster.adapt(minimum_jobs=jobs, maximum_jobs=2 * jobs)
    return cluster


@contextlib.contextmanager
def shared_directory():
    shared = os.environ.get("DASK_SCD_SHARED_DIR")
    if shared is not None:
        yield shared
        return
    with tempfile.TemporaryDirectory() as directory:
        yield directory


def main():
    with shared_directory() as directory, start_cluster() as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(2, timeout=600)
        X, y, fields = make_onehot(N_SAMPLES, n_fields=N_FIELDS, cardinality=200, random_state=0)
        start = time.perf_counter()
        grid = dask_scd.to_grid(X, y, os.path.join(directory, "clicks.zarr"),
                                row_chunk=ROW_CHUNK, blocks=fields, overwrite=True)
        print(f"wrote {grid} in {time.perf_counter() - start:.1f}s")

        # No client= argument: the engine finds the current client.
        start = time.perf_counter()
        result = dask_scd.fit(grid, loss="logistic", alpha=ALPHA, tol=TOL,
                              solver="block_scd", random_state=0, verbose=2)
        print(f"{result!r}\nfitted in {time.perf_counter() - start:.1f}s on "
              f"{len(client.scheduler_info()['workers'])} workers")

        model = dask_scd.LogisticRegression(alpha=ALPHA, tol=TOL, solver="block_scd",
                                            random_state=0).fit(grid)
        accuracy = model.score(grid)  # predictions computed chunk by chunk on the workers
        print(f"LogisticRegression on the grid: relative gap {model.dual_gap_[0]:.1e}, "
              f"training accuracy {accuracy:.4f}")


if __name__ == "__main__":  # worker processes import this file: keep the work in main()
    main()
