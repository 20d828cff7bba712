"""The conformance matrix on in-memory X, and every refusal (tests/conformance_matrix.py
says what is checked and how the rows are made)."""

from __future__ import annotations

import numpy as np
import pytest
from conformance_matrix import (  # noqa: F401  (client, grids: fixtures)
    CALLBACK_ROWS,
    CONTAINERS,
    DECLARED,
    DTYPES,
    REFUSED,
    WEIGHT_SOURCES,
    Row,
    _problem,
    check_callback_stops,
    check_declared,
    client,
    fit_row,
    grids,
)

from dask_scd.engines import registry


def test_the_matrix_covers_every_engine_and_axis():
    """Every engine has declared rows; every container, dtype, weight source and intercept
    setting is met; and something is refused (the declarations are not all-accepting)."""
    assert {row.engine for row in DECLARED} == set(registry.ENGINES)
    assert {row.container for row in DECLARED} == {c for cs in CONTAINERS.values() for c in cs}
    assert {np.dtype(row.dtype) for row in DECLARED} == {np.dtype(d) for d in DTYPES}
    assert {row.weights_from for row in DECLARED if row.weighted} == set(WEIGHT_SOURCES)
    assert {row.fit_intercept for row in DECLARED} == {True, False}
    assert {row.bounded for row in DECLARED} == {True, False}
    assert {row.bounded for row in REFUSED} == {True, False}


@pytest.mark.parametrize(
    "row", [row for row in DECLARED if row.kind == "memory"], ids=lambda row: row.id
)
def test_declared_combination_solves_the_problem_asked(row, grids, client):  # noqa: F811
    check_declared(row, grids, client)


def test_every_engine_takes_a_callback():
    """Every engine declares the ``callback`` option, and the matrix checks each of the
    functions that run it (below, and on the cluster in test_conformance_cluster.py)."""
    assert all("callback" in engine.options.names() for engine in registry.ENGINES.values())
    assert {row.engine for row in CALLBACK_ROWS} == set(registry.ENGINES)


@pytest.mark.parametrize(
    "row", [row for row in CALLBACK_ROWS if row.kind == "memory"], ids=lambda row: row.id
)
def test_a_callback_stops_the_fit_at_a_certified_point(row, grids, client):  # noqa: F811
    check_callback_stops(row, grids, client)


@pytest.mark.parametrize("row", REFUSED, ids=lambda row: row.id)
def test_undeclared_combination_is_refused_naming_the_engines(row, grids, client):  # noqa: F811
    row = Row(
        row.engine,
        row.loss,
        row.penalty,
        row.kind,
        row.weighted,
        CONTAINERS[row.kind][0],
        np.float64,
        True,
        "given" if row.weighted else "",
        bounded=row.bounded,
    )
    problem = _problem(row.loss, row.penalty, row.bounded)
    others = registry.engines_solving(problem, row.kind, row.weighted)
    with pytest.raises(ValueError) as raised:
        fit_row(row, grids, client, tol=1e-6, max_iter=5)
    message = str(raised.value)
    assert repr(row.engine) in message
    for name in others:
        assert repr(name) in message


def test_the_capability_page_is_the_registry():
    """docs/capabilities.md is generated from the declarations this matrix checks
    (rewrite it with ``python -c "from dask_scd.engines import registry;
    print(registry.capability_table(), end='')" > docs/capabilities.md``)."""
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "capabilities.md"
    assert page.read_text() == registry.capability_table()
