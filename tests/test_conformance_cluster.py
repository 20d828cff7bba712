"""The conformance matrix on dask arrays and grids, on one shared cluster
(tests/conformance_matrix.py says what is checked and how the rows are made)."""

from __future__ import annotations

import pytest
from conformance_matrix import DECLARED, check_declared, client, grids  # noqa: F401

pytestmark = pytest.mark.slow  # about two minutes on one core


@pytest.mark.parametrize(
    "row", [row for row in DECLARED if row.kind != "memory"], ids=lambda row: row.id
)
def test_declared_combination_solves_the_problem_asked(row, grids, client):  # noqa: F811
    check_declared(row, grids, client)
