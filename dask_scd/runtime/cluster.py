"""The cluster runtime of the dask engines: where tasks run, how they are named, how
partial results are summed, the certificate, checkpoints and callbacks.

Everything here is independent of *which* block an engine updates and of what stays in
fast memory (those are strategies, :mod:`dask_scd.runtime.strategies`). It keeps the
engines' three invariants:

- every task of row chunk r runs on r's *home* worker (loosely: a lost worker's chunks
  run elsewhere), so margins never move between workers;
- every sum over row chunks runs in row-chunk order, in groups fixed by the number of
  row chunks alone, so the model is the same bits whatever the workers;
- tasks are named cheaply and uniquely (no tokenizing of large arguments).
"""

from __future__ import annotations

import contextlib
import os
import uuid

from dask_scd.runtime import passes
from dask_scd.runtime.checkpoint import load_checkpoint, save_checkpoint


@contextlib.contextmanager
def fit_client(client):
    """The given client, else the current one, else an in-process threaded cluster."""
    if client is not None:
        yield client
        return
    from distributed import Client, LocalCluster, default_client

    # Found before the yield: an error of the fit (a ValueError too) must reach the caller
    # as it is, not be taken for "no current client" and start a cluster of its own.
    try:
        current = default_client()
    except ValueError:
        current = None
    if current is not None:
        yield current
        return
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=os.cpu_count() or 1,
                      dashboard_address=":0") as cluster, Client(cluster) as local:
        yield local


class ClusterRuntime:
    """Submitting a fit's tasks to a ``distributed.Client``.

    Parameters
    ----------
    client : distributed.Client
    n_row_chunks : int
    pin : bool
        Place row chunks on home workers (a grid); a dask array's chunks already live
        where dask persisted them.
    """

    def __init__(self, client, n_row_chunks: int, pin: bool):
        self.client = client
        self.n_row_chunks = n_row_chunks
        self.pin = pin
        self._fit_token, self._n_submitted = uuid.uuid4().hex, 0
        self.homes = [None] * n_row_chunks
        self.assign_homes()

    def assign_homes(self):
        """Row chunk r → one worker (its "home"), in contiguous runs weighted by threads.

        Every task of row chunk r asks for its home (``allow_other_workers=True``: a lost
        worker's row chunks go elsewhere until the next call reassigns them), so the
        stages of a block iteration are balanced, the margins never move between workers
        and each worker caches only its own cells. Placement never changes the model
        (every task is deterministic).
        """
        R = self.n_row_chunks
        self.homes = [None] * R
        if not self.pin:
            return
        workers = self.client.scheduler_info()["workers"]
        slots = [address for address in sorted(workers)
                 for _ in range(max(1, int(workers[address].get("nthreads", 1))))]
        if len(slots) > 1:
            self.homes = [slots[r * len(slots) // R] for r in range(R)]

    def submit(self, func, *args, **kwargs):
        """Submit a task under a cheap unique key.

        ``client.submit`` would otherwise tokenize every argument (problem, θ, cell
        references) to name the task: ~600 times per epoch, on the cores the scheduler
        needs.
        """
        self._n_submitted += 1
        key = f"{func.__name__}-{self._fit_token}-{self._n_submitted}"
        return self.client.submit(func, *args, key=key, **kwargs)

    def submit_row(self, r, func, *args):
        """Submit a task of row chunk r on its home worker."""
        if self.homes[r] is None:
            return self.submit(func, *args)
        return self.submit(func, *args, workers=[self.homes[r]], allow_other_workers=True)

    def gather(self, futures):
        return self.client.gather(futures)

    def tree_sum(self, partials, split_every=4):
        """Sum partials in groups of consecutive row chunks (:func:`passes.sum_partials`).

        One task receiving all R partials at once would hold all of them (R Gram
        matrices of |B|² can exceed a small worker). The groups depend on R only, so the
        sums keep the same bits whatever the workers; each group is summed on the home of
        its first row chunk, where most of its parts already are.
        """
        first = list(range(len(partials)))
        while len(partials) > split_every:
            groups = range(0, len(partials), split_every)
            partials = [self.submit_row(first[i], passes.sum_partials, *partials[i:i + split_every])
                        for i in groups]
            first = [first[i] for i in groups]
        return partials

    def certify(self, problem, n_samples, cells, labels, rows, offsets, state):
        """Fresh margins from the state (θ, b) and the duality-gap certificate on them.

        ``cells[r]`` are row chunk r's cells (all blocks), ``state`` a dict {"coef",
        "intercept"} or a future of one: the whole chain is submitted at once and the
        client waits once, for (θ, b) and the certificate together. Returns (margins
        futures, (coef, intercept, certificate)).
        """
        R = len(rows)
        margins = [self.submit_row(r, passes.refresh_margins, cells[r], state, offsets,
                                   int(rows[r])) for r in range(R)]
        stats = [self.submit_row(r, passes.certificate_stats, cells[r], labels[r], margins[r],
                                 problem) for r in range(R)]
        total = self.submit(passes.sum_partials, *stats)
        dual = [self.submit_row(r, passes.dual_loss_sum, labels[r], margins[r], problem, total)
                for r in range(R)]
        result = self.submit(passes.certificate, problem, n_samples, state, total, *dual).result()
        return margins, (result["coef"], float(result["intercept"]), result["certificate"])

    def run_on_rows(self, func, *args) -> list:
        """``func(r, *args)`` on the home of every row chunk; the results in row order."""
        return self.gather([self.submit_row(r, func, r, *args)
                            for r in range(self.n_row_chunks)])


class EpochHooks:
    """What runs after every epoch: the checkpoint and the user's callback.

    ``checkpoint`` (a path) is written atomically every ``every`` epochs and at
    convergence, with the RNG state and a ``signature`` of the fit that a resume must
    match; ``callback(info) -> True`` stops the fit.
    """

    def __init__(self, checkpoint=None, every=1, resume=False, callback=None, signature=None):
        self.checkpoint, self.every, self.resume = checkpoint, every, resume
        self.callback, self.signature = callback, signature

    def load(self, rng):
        """The saved state (coef, intercept, epoch, history) to resume from, or None."""
        if not (self.resume and self.checkpoint):
            return None
        return load_checkpoint(self.checkpoint, self.signature, rng)

    def after_epoch(self, epoch, coef, intercept, cert, history, rng, tol,
                    original_order) -> bool:
        """Checkpoint if due; call the callback. Returns True to stop."""
        if self.checkpoint and (epoch % self.every == 0 or cert.relative_gap <= tol):
            save_checkpoint(self.checkpoint, coef=coef, intercept=intercept, epoch=epoch,
                            rng=rng, history=history, signature=self.signature)
        return bool(self.callback is not None and self.callback({
            "epoch": epoch, "coef": original_order(coef), "intercept": intercept,
            "relative_gap": cert.relative_gap,
        }))
