"""solver="auto" in memory: the engine with the fewest predicted passes over X."""

import numpy as np
import pytest
import scipy.sparse as sp

import dask_scd
from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.solvers import registry


def _onehot(n, fields, levels, rng):
    rows = np.repeat(np.arange(n), fields)
    cols = (rng.integers(0, levels, size=(n, fields)) + levels * np.arange(fields)).ravel()
    return sp.csr_matrix((np.ones(n * fields), (rows, cols)), shape=(n, fields * levels))


def _choice(loss, penalty, alpha, X):
    rho = {"l2": 0.0, "l1": 1.0, "elasticnet": 0.5}[penalty]
    problem = obj.Problem(loss, alpha, rho, True)
    return registry.resolve("auto", problem, InMemory(X, np.ones(X.shape[0]))).name


@pytest.mark.parametrize("loss,penalty,alpha,expected", [
    ("squared", "l2", 1e-3, "gram"),            # n ≥ 4p, p ≤ 512: one pass, then O(p)
    ("squared", "l1", 1e-3, "gram"),
    ("hinge", "l2", 1e-3, "newton"),            # smoothed Newton: p small, band Cholesky
    ("hinge", "l2", 1.0, "sdca"),               # strongly regularized: a few SDCA epochs
    ("logistic", "l2", 1.0, "sdca"),            # well-conditioned dual: a few epochs
    ("logistic", "l2", 1e-6, "newton"),         # ill-conditioned: Newton steps
    ("logistic", "l1", 1e-4, "newton"),         # working-set Gram fits
    ("squared_hinge", "l2", 1e-6, "newton"),
])
def test_dense_choices(rng, loss, penalty, alpha, expected):
    assert _choice(loss, penalty, alpha, rng.normal(size=(2000, 20))) == expected


def test_sparse_one_hot_choices(rng):
    X = _onehot(4000, 20, 500, rng)  # p = 10000 > 2000: no Gram, no Cholesky
    assert _choice("squared", "l2", 1.0 / 4000, X) == "newton"   # κ = 20/(αn) = 20: one CG solve
    assert _choice("squared", "l2", 1.0, X) == "sdca"            # κ tiny: a few epochs
    assert _choice("logistic", "l2", 1.0 / 4000, X) == "newton"
    assert _choice("hinge", "l2", 1.0 / 4000, X) == "sdca"         # p + 1 > 2000: no band Cholesky
    assert _choice("squared", "l1", 1e-4, X) == "scd"            # working sets, extrapolation
    assert _choice("logistic", "l1", 1e-4, X) == "scd"


def test_auto_fit_reports_the_engine_and_converges(rng):
    X = _onehot(3000, 20, 200, rng)  # p = 4000: no Gram
    y = np.asarray(X @ rng.normal(size=X.shape[1])).ravel() + rng.normal(size=3000)
    result = dask_scd.fit(X, y, alpha=1.0 / 3000, tol=1e-9)
    assert result.solver_ == "newton" and result.dual_gap_ <= 1e-9
    reference = dask_scd.fit(X, y, alpha=1.0 / 3000, tol=1e-11, solver="sdca", max_iter=100_000)
    assert abs(result.primal_ - reference.primal_) <= 1e-8 * reference.primal_
