"""The parts of the CoCoA engine (:mod:`dask_scd.engines.cocoa.cocoa`): X split by
columns (the primal) or by rows (the dual), each as its local solver reads it, built in
memory or, from a grid's or a dask array's cells, on the worker that solves it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dask_scd.data.cells import CellRef, WeightedLabels, labels, row_weights
from dask_scd.data.findings import value_finding
from dask_scd.kernels.layout import MajorMatrix
from dask_scd.validation import (
    is_pydata_sparse,
    largest_magnitude,
    to_scipy,
)


@dataclass
class Part:
    """One part of X as its local solver reads it.

    ``matrix`` holds the part's columns (primal: n_samples × its features, by columns) or
    its rows (dual: its examples × n_features, by rows); ``y`` the labels of its rows
    (the dual only: a primal part sees every row) and ``weights`` their sample weights v
    (None: every row weighs 1). A primal part's ``sq_norms`` and ``cube_sums`` are the
    weighted Σ_i v_i x_ij² and Σ_i v_i |x_ij|³ (its tasks read v from the labels); a dual
    part's ``sq_norms`` are the plain ‖x_i‖² (the weighted epoch scales them by v_i).
    """

    matrix: MajorMatrix
    sq_norms: np.ndarray
    cube_sums: np.ndarray
    y: np.ndarray | None = None
    weights: np.ndarray | None = None


def make_part(X, axis: str, y=None, logistic: bool = False, weights=None) -> Part:
    """A part from an in-memory matrix (numpy or scipy.sparse); ``weights`` the sample
    weights of X's rows, or None."""
    matrix = MajorMatrix.from_array(X, axis)
    if axis == "columns":
        cubes = matrix.cube_sums(weights) if logistic else np.zeros(0)
        return Part(matrix, matrix.sq_norms(weights), cubes)
    return Part(matrix, matrix.sq_norms(), np.zeros(0), None if y is None else labels(y), weights)


def _cell_array(cell):
    """A cell of a grid or a dask array as numpy or scipy.sparse (read once, not cached:
    the part keeps its own copy)."""
    if isinstance(cell, CellRef):
        from dask_scd.grid import read_cell

        cell = read_cell(cell.path, cell.grid_id, cell.r, cell.b)
    if sp.issparse(cell):
        return cell
    if is_pydata_sparse(cell):
        return to_scipy(cell)
    return np.asarray(cell)


def assemble_part(
    cells: list, axis: str, where: str, row_labels=None, logistic: bool = False
) -> Part:
    """(task) A part from its cells, ``cells[r][b]`` over its row chunks and blocks, on the
    worker that will solve it; ``row_labels`` (one per row chunk) for a dual part, and for
    a weighted primal part (its column norms read every row's weight). The values are
    checked here, once: a bad one is not raised (the worker would log the failed task)
    but returned, ``{"finding", "cell"}`` (:func:`~dask_scd.data.cells.value_finding`, and
    the cell's place (i, j) in ``cells``), for the client to raise (``where`` names the
    part)."""
    grid = [[_cell_array(cell) for cell in row] for row in cells]
    for i, row in enumerate(grid):
        for j, cell in enumerate(row):
            largest = largest_magnitude(cell.data if sp.issparse(cell) else cell)
            finding = value_finding(largest, where, lambda cell=cell: cell)
            if finding is not None:
                return {"finding": finding, "cell": (i, j)}
    if any(sp.issparse(cell) for row in grid for cell in row):
        X = sp.bmat(
            [[sp.csr_matrix(cell) for cell in row] for row in grid],
            format="csc" if axis == "columns" else "csr",
        )
    else:
        X = np.block(grid)
    joined = None if row_labels is None else join_labels(*row_labels)
    y = labels(joined) if joined is not None and axis == "rows" else None
    return make_part(X, axis, y, logistic, row_weights(joined))


def part_summary(part: Part) -> dict:
    """(task) What the client needs to know of a part: its lines and Σ‖line‖² (or what
    :func:`assemble_part` found wrong with its values)."""
    if isinstance(part, dict):
        return part
    return {
        "lines": int(part.matrix.n_major),
        "sq_norm_sum": float(part.sq_norms.sum()),
        "n_minor": int(part.matrix.n_minor),
    }


def join_labels(*row_labels):
    """(task) The labels of every row chunk, in row order; with their sample weights (a
    :class:`~dask_scd.data.cells.WeightedLabels`) when the chunks carry weights."""
    y = np.concatenate([labels(value) for value in row_labels])
    if row_weights(row_labels[0]) is None:
        return y
    return WeightedLabels(y, np.concatenate([row_weights(value) for value in row_labels]))
