"""The conformance matrix on a GPU, under numba's CUDA simulator where there is none
(tests/conformance_matrix.py says what is checked and how the rows are made): every
problem an engine's ``gpu`` declaration takes, fitted on a few rows; every other problem
it solves on the CPU refused on the GPU, naming the engines that solve it there."""

from __future__ import annotations

import pytest
from conformance_matrix import (  # noqa: F401  (client, grids: fixtures)
    DEVICE_DECLARED,
    DEVICE_REFUSED,
    _problem,
    check_declared,
    client,
    fit_row,
    grids,
)

from dask_scd.engines import registry

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.mark.parametrize("row", DEVICE_DECLARED, ids=lambda row: row.id)
def test_declared_combination_solves_the_problem_asked_on_a_gpu(row, grids, client):  # noqa: F811
    check_declared(row, grids, client)


@pytest.mark.parametrize("row", DEVICE_REFUSED, ids=lambda row: row.id)
def test_undeclared_combination_is_refused_on_a_gpu(row, grids, client):  # noqa: F811
    others = registry.engines_solving(
        _problem(row.loss, row.penalty), "memory", row.weighted, device="gpu"
    )
    with pytest.raises(ValueError, match="device='gpu'") as raised:
        fit_row(row, grids, client, tol=1e-6, max_iter=5)
    message = str(raised.value)
    assert repr(row.engine) in message
    for name in others:
        assert repr(name) in message
