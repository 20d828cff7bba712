"""The conformance matrix on dask arrays and grids, on one shared cluster
(tests/conformance_matrix.py says what is checked and how the rows are made)."""

from __future__ import annotations

import pytest
from conformance_matrix import (  # noqa: F401  (client, grids: fixtures)
    CALLBACK_ROWS,
    DECLARED,
    check_callback_stops,
    check_declared,
    client,
    grids,
)

pytestmark = pytest.mark.slow  # about two minutes on one core


@pytest.mark.parametrize(
    "row", [row for row in DECLARED if row.kind != "memory"], ids=lambda row: row.id
)
def test_declared_combination_solves_the_problem_asked(row, grids, client):  # noqa: F811
    check_declared(row, grids, client)


@pytest.mark.parametrize(
    "row", [row for row in CALLBACK_ROWS if row.kind != "memory"], ids=lambda row: row.id
)
def test_a_callback_stops_the_fit_at_a_certified_point(row, grids, client):  # noqa: F811
    check_callback_stops(row, grids, client)
