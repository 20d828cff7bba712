"""Strategies: which block runs next, and which chunks of data stay in fast memory.

Two small families, each a class with one deciding method, so that engines swap them by
name and count what they cost the same way:

- *block orders* (:class:`BlockOrder`) give the order of the blocks in one epoch of the
  block-SCD engine: a fresh permutation, the grid order, or by decreasing block gap;
- *residency policies* (:class:`Residency`) choose the chunks that fast memory holds for
  the next round under a byte budget: DuHL's gap memory, sequential, random, importance
  sampling. The other kind of residency, a least-recently-used cache bounded in bytes for
  engines that read whatever they need and keep what fits, is the data layer's
  (:class:`dask_scd.data.cache.ByteLRU`).

Every residency counts the bytes it loads and the loads it makes ("swaps"), so policies
compare on the same figures. Randomness comes only from the ``rng`` passed in.
"""

from __future__ import annotations

import numpy as np

# ------------------------------------------------------------------------ block orders


class BlockOrder:
    """Order of the blocks in one epoch."""

    name = ""
    uses_gaps = False  # whether order() reads the certificate's coordinate gaps

    def order(self, n_blocks: int, cert, rng) -> list[int]:
        raise NotImplementedError


class ShuffleOrder(BlockOrder):
    """A fresh uniform permutation every epoch."""

    name = "shuffle"

    def order(self, n_blocks, cert, rng):
        return [int(b) for b in rng.permutation(n_blocks)]


class CyclicOrder(BlockOrder):
    """The grid's column order."""

    name = "cyclic"

    def order(self, n_blocks, cert, rng):
        return list(range(n_blocks))


class GapOrder(BlockOrder):
    """Decreasing block duality gap, from the last certificate's coordinate gaps."""

    name = "gap"
    uses_gaps = True

    def __init__(self, slices):
        self.slices = slices

    def order(self, n_blocks, cert, rng):
        block_gaps = [cert.coordinate_gaps[s].sum() for s in self.slices]
        return [int(b) for b in np.argsort(block_gaps, kind="stable")[::-1]]


BLOCK_ORDERS = ("shuffle", "cyclic", "gap")


def block_order(name: str, slices) -> BlockOrder:
    """The block order called ``name`` ("shuffle", "cyclic" or "gap")."""
    orders = {"shuffle": ShuffleOrder, "cyclic": CyclicOrder}
    if name == "gap":
        return GapOrder(slices)
    return orders[name]()


# -------------------------------------------------------------- resident set policies


class Residency:
    """Chooses the chunks fast memory holds next round, within ``budget`` bytes.

    ``sizes[c]`` is the bytes of chunk c in fast memory. Chunks are taken in the policy's
    order of preference while they fit; the result is sorted (the order of work within
    a round is the solver's business, not the residency's).
    """

    name = ""

    def choose(self, sizes, budget: int, gap_memory, rng) -> np.ndarray:
        return _fill(self.preference(sizes, gap_memory, rng), sizes, budget)

    def preference(self, sizes, gap_memory, rng) -> np.ndarray:
        raise NotImplementedError


def _fill(preference, sizes, budget) -> np.ndarray:
    """The chunks of ``preference``, in turn, that still fit the budget (greedy)."""
    chosen, used = [], 0
    for c in preference:
        if used + sizes[c] <= budget:
            chosen.append(int(c))
            used += int(sizes[c])
    return np.sort(np.array(chosen, dtype=np.int64))


class GapResidency(Residency):
    """DuHL (eq. 13): the chunks with the largest summed gap memory z."""

    name = "duhl"

    def preference(self, sizes, gap_memory, rng):
        return np.argsort(-np.asarray(gap_memory), kind="stable")


class SequentialResidency(Residency):
    """The chunks in storage order, as many as fit, wrapping around: each round the next
    run of chunks (the classical out-of-core block scheme)."""

    name = "sequential"

    def __init__(self):
        self.next = 0

    def choose(self, sizes, budget, gap_memory, rng):
        chosen, used, c = [], 0, self.next
        for _ in range(len(sizes)):  # a contiguous run from `next`, as far as it fits
            if used + sizes[c] > budget:
                break
            chosen.append(c)
            used += int(sizes[c])
            c = (c + 1) % len(sizes)
        self.next = c
        return np.sort(np.array(chosen, dtype=np.int64))


class RandomResidency(Residency):
    """A uniform random set of chunks every round."""

    name = "random"

    def preference(self, sizes, gap_memory, rng):
        return rng.permutation(len(sizes))


class ImportanceResidency(Residency):
    """Chunks sampled without replacement with probability ∝ a static weight (the summed
    squared norms of their lines: importance sampling, which ignores the iterate)."""

    name = "importance"

    def __init__(self, weights):
        weights = np.asarray(weights, dtype=np.float64)
        self.p = weights / weights.sum() if weights.sum() > 0 else None

    def preference(self, sizes, gap_memory, rng):
        n = len(sizes)
        return rng.choice(n, size=n, replace=False, p=self.p)


RESIDENCIES = ("duhl", "sequential", "random", "importance")


def residency(name: str, weights=None) -> Residency:
    """The residency policy called ``name`` (``weights``: the importance weights)."""
    if name == "importance":
        return ImportanceResidency(weights)
    policies = {"duhl": GapResidency, "sequential": SequentialResidency, "random": RandomResidency}
    if name not in policies:
        raise ValueError(f"residency={name!r} is not one of {RESIDENCIES}")
    return policies[name]()
