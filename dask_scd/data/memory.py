"""In-memory data: a validated numpy or scipy.sparse X with its labels.

What the in-memory engines receive, built by :func:`in_memory` (the checks run once,
here); it carries the statistics the cost model of ``solver="auto"`` reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from dask_scd.kernels import lines
from dask_scd.validation import (
    check_labels,
    check_matrix,
    check_sample_weight,
    check_weighted_classes,
)

# Pure blocks are detected on the first rows holding this many non-zeros (any partition
# serves the Newton engine's coarse levels, but a field whose rare values are left out of
# its block leaves its shift to the fine level): all rows of a 500k-row Criteo-like set
# (13M non-zeros) took 0.8 s, about 3 passes, once per fit.
_DETECTION_NNZ = 20_000_000
# The most pure blocks any engine uses (more, and the coarse level's k × k solve is no
# longer cheap next to a product; block SCD takes runs of columns instead).
MAX_BLOCKS = 256


def in_memory(X, y, loss: str, sample_weight=None):
    """(:class:`InMemory`, classes): X checked (numpy, CSR or CSC; the caller's object is
    never modified), y checked, mapped to ±1 for a classification loss, and the sample
    weights checked and scaled to mean 1 (a copy)."""
    X = check_matrix(X)
    y, classes = check_labels(y, X.shape[0], loss)
    weights = check_sample_weight(sample_weight, X.shape[0])
    if classes is not None:
        check_weighted_classes(y, weights)
    return InMemory(X, y, weights), classes


@dataclass
class InMemory:
    """Validated in-memory data: X (numpy or scipy.sparse CSR/CSC), y (±1 for classifiers)
    and the sample weights v, scaled to mean 1 (None: every example weighs 1)."""

    X: object
    y: np.ndarray
    weights: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.X.shape

    @property
    def weighted(self) -> bool:
        """Whether the examples carry sample weights (only some engines solve them)."""
        return self.weights is not None

    @property
    def n_samples(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]

    @cached_property
    def nbytes(self) -> int:
        """Bytes of X as stored (values, and indices for a sparse matrix)."""
        X = self.X
        if sp.issparse(X):
            return int(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes)
        return int(X.nbytes)

    @cached_property
    def nnz(self) -> int:
        n, p = self.X.shape
        return int(self.X.nnz) if sp.issparse(self.X) else n * p

    @cached_property
    def gram_flops(self) -> float:
        """Multiply-adds of XᵀDX: Σ_i nnz(x_i)² (n·p² when dense)."""
        X = self.X
        if sp.issparse(X):
            if X.format == "csr":
                per_row = np.diff(X.indptr)
            elif X.format == "csc":
                per_row = np.bincount(X.indices, minlength=X.shape[0])
            else:
                per_row = np.diff(X.tocsr().indptr)
            return float(np.dot(per_row.astype(np.float64), per_row))
        return float(X.shape[0]) * X.shape[1] ** 2

    @cached_property
    def mean_row_sq_norm(self) -> float:
        """mean ‖x_i‖², the scale of the dual's conditioning (one pass over the values)."""
        X = self.X
        if sp.issparse(X):
            return float(np.dot(X.data, X.data)) / X.shape[0]
        if not (X.flags.c_contiguous or X.flags.f_contiguous):  # a strided view
            return float(np.einsum("ij,ij->", X, X)) / X.shape[0]  # no n×p temporary
        values = X.ravel(order="K")  # a view: no n×p temporary
        return float(np.dot(values, values)) / X.shape[0]

    @cached_property
    def by_rows(self):
        """X as CSR where it is sparse (X itself when it is CSR; another format converted
        once, here, for every engine that reads rows), else X."""
        return _as_csr(self.X) if sp.issparse(self.X) else self.X

    @cached_property
    def column_counts(self) -> np.ndarray | None:
        """The stored values of each column of sparse X (None for dense X), counted once
        for the planner, the pure blocks and the Newton engine's design."""
        X = self.X
        if not sp.issparse(X):
            return None
        if X.format == "csc":
            return np.diff(X.indptr)
        return lines.index_counts(self.by_rows.indices, X.shape[1])

    @cached_property
    def median_column_count(self) -> float:
        """The median number of stored values of X's columns that hold any (inf for dense
        X), counted once: ``auto`` asks at every point of a path."""
        if self.column_counts is None:
            return float("inf")
        counts = self.column_counts[self.column_counts > 0]
        return float(np.median(counts)) if len(counts) else float("inf")

    @cached_property
    def pure_blocks(self) -> list | None:
        """:func:`pure_blocks` of X, detected once."""
        if self.column_counts is None:
            return None
        return pure_blocks(self.by_rows, self.column_counts > 0)

    @cached_property
    def contiguous_blocks(self) -> list | None:
        """:func:`pure_blocks` among ranges of consecutive columns (one pass, no colouring:
        :func:`dask_scd.grid.partition.contiguous_pure_blocks`), found once; what the cost
        model asks first."""
        if self.column_counts is None:
            return None
        return pure_blocks(self.by_rows, self.column_counts > 0, contiguous=True)


def pure_blocks(X, used=None, contiguous: bool = False) -> list | None:
    """The pure blocks of a sparse X (columns no row has two of: a one-hot field), among
    the columns that hold a value (``used``, where the caller has counted them), detected
    on the first rows; None for dense X. ``contiguous``: the fewest pure ranges of
    consecutive columns instead of the greedy colouring's blocks."""
    if not sp.issparse(X):
        return None
    from dask_scd.grid.partition import contiguous_pure_blocks, detect_pure_blocks

    n, p = X.shape
    X = _as_csr(X)
    if used is None:
        used = lines.index_counts(X.indices, p) > 0
    rows = max(int(np.searchsorted(X.indptr, _DETECTION_NNZ, side="right")) - 1, min(n, 1000))
    # A row of k stored values needs k blocks: above MAX_BLOCKS, no engine would use them
    # (and colouring text-like rows of hundreds of values is slow). Not detected.
    if int(np.diff(X.indptr).max(initial=0)) > MAX_BLOCKS:
        return None
    # All rows: X itself (a slice of every row would copy it, 0.2 s on 20M non-zeros).
    detect = contiguous_pure_blocks if contiguous else detect_pure_blocks
    blocks = [b[used[b]] for b in detect(X if rows >= n else X[:rows])]
    return [b for b in blocks if len(b)]


def _as_csr(X):
    """Sparse X as a CSR matrix: X itself when it is one (its cached canonical-format flag
    kept: a wrapper would check the whole of X again), else converted."""
    return X if isinstance(X, sp.csr_matrix) else sp.csr_matrix(X)
