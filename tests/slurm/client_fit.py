"""A client that fits on SLURM jobs and prints each epoch: tests/slurm kills it mid-fit.

    python client_fit.py GRID SHARED_DIR JOB_NAME PARTITION

No checkpoint is named: on a jobqueue cluster the fit writes its default one every
5 epochs in SHARED_DIR, which a fit on new jobs resumes from.
"""

import sys
import warnings

from distributed import Client

import dask_scd
from dask_scd.runtime import jobqueue as jq

FIT = dict(loss="logistic", alpha=1e-4, tol=1e-12, solver="block_scd", random_state=0)


def slurm_resources(partition, jobs=2):
    """Jobs of one core and one worker: two of them fill the test node's two CPUs."""
    return jq.job_resources(
        "slurm",
        queue=partition,
        jobs=jobs,
        cores=1,
        processes=1,
        memory="2GiB",
        walltime="00:10:00",
        limits=jq.partition_limits(partition),
        environ={},
    )


def main(grid, shared, job_name, partition):
    resources = slurm_resources(partition)
    with jq.make_cluster(resources, shared_directory=shared, job_name=job_name) as cluster:
        cluster.adapt(minimum_jobs=resources.jobs, maximum_jobs=resources.jobs)
        with Client(cluster) as client:
            jq.wait_for_workers(client, cluster, resources.n_workers, timeout=180)

            def report(state):
                print(f"epoch {state['epoch']}", flush=True)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dask_scd.fit(dask_scd.open_grid(grid), callback=report, **FIT)
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
