"""The scale-out cost model of a block-SCD epoch, fitted to the counts of
``bench_scaleout.py`` and projected to a larger grid and cluster.

    T(W) = C(W)/W + S·τ·tasks(W) + R·L + D·L_hop + B(W)/bandwidth

with, per epoch: C(W) = c₀ + c₁·W the CPU seconds of all workers (c₀ the work on the
non-zeros, divided among the workers; c₁·W what every worker does once, whatever its
share: the replicated block steps of a collective epoch, a worker's own overhead);
τ the scheduler's CPU seconds per task and tasks(W) = t₀ + t₁·W (one task per group of
row chunks and stage, so the count grows with the groups); R the client's blocking
round trips and L their latency; D the sequential hops between the client's waits (the
depth of the task graph, or a collective epoch's exchange stages) and L_hop their
latency; B(W) = b₀ + b₁·W the bytes the busiest worker receives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def fit_nonnegative(basis, y) -> tuple[float, float]:
    """Non-negative least squares (a, b) of y ≈ a·basis[0] + b·basis[1]."""
    from scipy.optimize import nnls

    A = np.column_stack([np.asarray(v, dtype=float) for v in basis])
    coef, _ = nnls(A, np.asarray(y, dtype=float))
    return float(coef[0]), float(coef[1])


def fit_line(x, y) -> tuple[float, float]:
    """(a, b) ≥ 0 of y ≈ a + b·x."""
    x = np.asarray(x, dtype=float)
    return fit_nonnegative([np.ones_like(x), x], y)


def fit_bytes(W, y) -> tuple[float, float]:
    """(b₀, b₁) ≥ 0 of y ≈ b₀·(1 − 1/W) + b₁·W: a worker receives the share of the
    others' parts (none with one worker) and a per-worker term."""
    W = np.asarray(W, dtype=float)
    return fit_nonnegative([1.0 - 1.0 / W, W], y)


@dataclass(frozen=True)
class CostModel:
    """The fitted inputs of one engine's epoch (per epoch, at the measured grid)."""

    c0: float  # worker CPU s on the non-zeros (divided among workers)
    c1: float  # worker CPU s per worker (the statistics' sums every worker repeats)
    t0: float  # tasks per epoch, fixed
    t1: float  # tasks per epoch per worker (per group of row chunks)
    s0: float  # scheduler + client CPU s, fixed
    s1: float  # scheduler + client CPU s per worker (per group of row chunks)
    round_trips: float  # R: the client's blocking waits
    hops: float  # D: sequential hops between them (graph depth or exchange stages)
    b0: float  # bytes into the busiest worker, times (1 − 1/W)
    b1: float  # bytes into the busiest worker, per worker

    def terms(
        self, W, latency, hop_latency, bandwidth, cores=None, groups=None, replicated=True
    ) -> dict:
        """The model's terms in seconds for W workers of ``cores`` cores in all (default
        W: one thread each) running ``groups`` groups of row chunks (default W).
        ``replicated``: c₁ is work every worker repeats (a collective epoch's sums, a
        task graph's inline reductions), else work done once and spread over the cores
        (a task graph's reducing tasks and trees)."""
        cores = W if cores is None else cores
        groups = W if groups is None else groups
        return {
            "compute": (self.c0 / cores + self.c1) if replicated else (self.c0 + self.c1) / cores,
            "scheduler": self.s0 + self.s1 * groups,
            "latency": self.round_trips * latency + self.hops * hop_latency,
            "bytes": self.bytes_in(W) / bandwidth,
        }

    def bytes_in(self, W) -> float:
        """B(W): the bytes the busiest worker receives."""
        return self.b0 * (1.0 - 1.0 / W) + self.b1 * W

    def epoch_seconds(self, W, latency, hop_latency, bandwidth, **kw) -> float:
        """T(W): the sum of :meth:`terms`."""
        return sum(self.terms(W, latency, hop_latency, bandwidth, **kw).values())


def fit_model(rows: list) -> CostModel:
    """The model from per-W measurements: dicts with "workers", "worker_cpu",
    "main_cpu", "tasks", "round_trips", "hops" and "max_in" (per epoch)."""
    W = [r["workers"] for r in rows]
    c0, c1 = fit_line(W, [r["worker_cpu"] for r in rows])
    t0, t1 = fit_line(W, [r["tasks"] for r in rows])
    b0, b1 = fit_bytes(W, [r["max_in"] for r in rows])
    s0, s1 = fit_line(W, [r["main_cpu"] for r in rows])
    return CostModel(
        c0,
        c1,
        t0,
        t1,
        s0,
        s1,
        float(np.mean([r["round_trips"] for r in rows])),
        float(max(r["hops"] for r in rows)),
        b0,
        b1,
    )


# ----------------------------------------------------------------- the data's statistics


def distinct_columns(cardinalities, rows: int) -> float:
    """Expected distinct columns of ``rows`` rows of ``make_onehot``'s fields (value k of
    a field of V values drawn with probability ∝ 1/(k+1)): Σ_fields Σ_k 1 − (1 − p_k)^rows.
    A row chunk's block statistics hold one entry per such column."""
    total = 0.0
    for size in cardinalities:
        w = 1.0 / np.arange(1, size + 1)
        p = w / w.sum()
        total += float(np.sum(-np.expm1(rows * np.log1p(-p))))
    return total


def tree_levels(n_parts: int, split_every: int = 4) -> int:
    """Levels of a tree sum of ``n_parts`` parts (:func:`dask_scd.runtime.passes.tree_sum`)."""
    return 0 if n_parts <= 1 else math.ceil(math.log(n_parts, split_every))


# --------------------------------------------------------------------- the projection


@dataclass(frozen=True)
class Target:
    """A grid and a cluster to project to."""

    label: str
    rows: int
    features: int
    nodes: int  # worker processes, one per node
    cores: int  # threads per worker
    bandwidth: float  # bytes/s of a node's link
    chunk_rows: int  # rows per row chunk

    @property
    def row_chunks(self) -> int:
        return -(-self.rows // self.chunk_rows)

    @property
    def groups(self) -> int:
        """Groups of row chunks (one per worker thread, at most one per row chunk)."""
        return min(self.row_chunks, self.nodes * self.cores)


def scaled_cardinalities(cardinalities, features: int) -> list:
    """The fields' vocabularies scaled to ``features`` columns in all."""
    f = features / sum(cardinalities)
    return [max(2, int(round(c * f))) for c in cardinalities]


def project(m: CostModel, grid: dict, cardinalities, target: Target, extra_hops: int = 0):
    """``m`` (fitted on ``grid``: n, p, nnz, row_chunks) scaled to ``target``: c₀ by the
    non-zeros; c₁ (summing the row chunks' block statistics) and b₀ (receiving them) by
    the statistics' entries (distinct columns per row chunk, over the row chunks); s₀
    and b₁ (vectors of the model's width) by the features; ``extra_hops`` more
    sequential hops (tree sums over more row chunks). Returns the scaled
    :class:`CostModel`."""
    nnz_ratio = target.rows * (grid["nnz"] / grid["n"]) / grid["nnz"]
    p_ratio = target.features / grid["p"]
    cards = scaled_cardinalities(cardinalities, target.features)
    stats_0 = grid["row_chunks"] * distinct_columns(cardinalities, grid["n"] // grid["row_chunks"])
    stats_1 = target.row_chunks * distinct_columns(cards, target.chunk_rows)
    return CostModel(
        m.c0 * nnz_ratio,
        m.c1 * stats_1 / stats_0,
        m.t0,
        m.t1,
        m.s0 * p_ratio,
        m.s1,
        m.round_trips,
        m.hops + extra_hops,
        m.b0 * stats_1 / stats_0,
        m.b1 * p_ratio,
    )
