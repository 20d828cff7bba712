"""What a check of a cell's values finds, returned by a task rather than raised in it.

A task that raised on a NaN would make the worker log a "Compute Failed" traceback
before the client sees the error. The checks of the cells on the workers
(:func:`~dask_scd.data.cells.inspect_cell`, :func:`~dask_scd.data.cells.row_chunk_finding`,
CoCoA's parts) return a finding instead, :func:`value_finding`: the message, and the row
and column of the first NaN or infinity within the cell; the client raises
:func:`finding_error`, which names them in X.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dask_scd.validation import check_feature_magnitude, first_nonfinite


def value_finding(largest: float, where: str, matrix=lambda: None) -> dict | None:
    """What is wrong with the values of a cell whose max |x| is ``largest``: None where
    nothing is, else ``{"message", "row", "column", "value"}``: the error (``where``
    names the cell), and for a NaN or an infinity the row and column of the first one
    within the cell and "NaN", "inf" or "-inf", read from ``matrix()`` (the cell as an
    array or a scipy.sparse matrix; None for a device cell, and for a value too large)."""
    if np.isfinite(largest):
        try:
            check_feature_magnitude(largest, f" in {where}")
        except ValueError as error:
            return {"message": str(error), "row": None, "column": None, "value": None}
        return None
    values = matrix()
    row, column, which = (None, None, None) if values is None else first_nonfinite(values)
    message = f"X contains NaN or infinity in {where}"
    return {"message": message, "row": row, "column": column, "value": which}


def finding_error(finding: dict, r: int, b: int, row_bounds, blocks) -> ValueError:
    """The error of a :func:`value_finding` in the cell (row chunk ``r``, block ``b``):
    for a NaN or an infinity, its row and column in X (``row_bounds``: the row chunks'
    first rows; ``blocks``: the original feature indices of each block)."""
    if finding["row"] is None:
        return ValueError(finding["message"])
    row = int(row_bounds[r]) + finding["row"]
    column = int(blocks[b][finding["column"]])
    return ValueError(
        f"{finding['message']}: first at row {row}, column {column}, the value there is "
        f"{finding['value']}"
    )


def cell_values(view):
    """A CPU cell's values (a :class:`~dask_scd.data.cells.CellView`) as an array (dense:
    by rows) or a CSC matrix (sparse)."""
    m = view.matrix
    if m.dense:
        return m.data.reshape(view.n_rows, view.n_columns)
    return sp.csc_matrix((m.data, m.indices, m.indptr), shape=(view.n_rows, view.n_columns))
