"""Block SCD on a zarr grid with a local Dask cluster, checked against the in-memory fit.

1. Generate a one-hot (Criteo-like) design: 200,000 examples, 10 categorical fields.
2. Write it as two grid stores (regression and ±1 labels) in a temporary directory:
   two row chunks, one pure column block per field.
3. Start a LocalCluster of 2 worker processes with 1 thread each and fit ridge and
   logistic regression with ``solver="block_scd"`` to a relative duality gap of 1e-6,
   printing the gap and the time of every epoch.
4. Fit the same problems in memory to 1e-10 and compare: coefficients and objective.

Run:  .venv/bin/python examples/fit_grid_localcluster.py
"""

import os
import tempfile
import time

import numpy as np
from distributed import Client, LocalCluster

import dask_scd
from dask_scd.datasets import make_onehot
from dask_scd.grid import to_grid

N_SAMPLES = 200_000
ROW_CHUNK = 100_000  # few, large row chunks: every task has real work to do
ALPHA = 1e-4
TOL = 1e-6


def write_grids(directory):
    """The same one-hot X with a real-valued target and with ±1 labels, as two grids."""
    grids, data = {}, {}
    for loss, task in (("squared", "regression"), ("logistic", "classification")):
        X, y, fields = make_onehot(
            N_SAMPLES, n_fields=10, cardinality=1000, task=task, random_state=0
        )
        start = time.perf_counter()
        grids[loss] = to_grid(
            X, y, os.path.join(directory, f"{task}.zarr"), row_chunk=ROW_CHUNK, blocks=fields
        )
        print(f"wrote {grids[loss]} in {time.perf_counter() - start:.1f}s")
        data[loss] = (X, y)
    return grids, data


def report(name, result, seconds):
    print(
        f"\n{name}: solver={result.solver_}, {result.n_iter_} epochs, "
        f"relative gap {result.dual_gap_:.2e}, {seconds:.1f}s in fit()"
    )
    history = result.history_
    for epoch, gap, at in zip(history.iteration, history.relative_gap, history.seconds):
        print(f"  epoch {epoch:3d}   relative gap {gap:.3e}   at {at:6.2f}s")


def compare(block, memory):
    """How far the block-SCD model is from a tighter in-memory solution."""
    bound = block.dual_gap_ * abs(block.primal_)  # P(block) − P* ≤ the certified gap
    print(f"  in memory ({memory.solver_}, tol=1e-10): relative gap {memory.dual_gap_:.1e}")
    print(f"  max |coef difference|      {np.abs(block.coef_ - memory.coef_).max():.2e}")
    print(f"  intercept difference       {abs(block.intercept_ - memory.intercept_):.2e}")
    print(
        f"  objective difference       {block.primal_ - memory.primal_:.2e}"
        f"   (certified bound {bound:.2e})"
    )


def main():
    with tempfile.TemporaryDirectory() as directory:
        grids, data = write_grids(directory)
        with (
            LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
            Client(cluster) as client,
        ):
            print(f"cluster: {len(cluster.workers)} worker processes, 1 thread each")
            for loss, name in (("squared", "ridge"), ("logistic", "logistic regression")):
                start = time.perf_counter()
                block = dask_scd.fit(
                    grids[loss],
                    loss=loss,
                    alpha=ALPHA,
                    tol=TOL,
                    solver="block_scd",
                    random_state=0,
                    client=client,
                )
                report(f"{name} on the grid", block, time.perf_counter() - start)

                X, y = data[loss]
                memory = dask_scd.fit(X, y, loss=loss, alpha=ALPHA, tol=1e-10, random_state=0)
                compare(block, memory)
    # Leaving the with-blocks closed the cluster and removed the grid stores.


if __name__ == "__main__":  # worker processes import this file: keep the work in main()
    main()
