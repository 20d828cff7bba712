"""SA-SDCA: ``solver="sdca"`` with ``n_threads`` threads sharing w (Hogwild) and a resync
of w from the duals every ``sync_every`` epochs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd.datasets import make_onehot

TOL = 1e-8


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return (X - X.mean(0)) / X.std(0), y


@pytest.fixture(scope="module")
def diabetes():
    return load_diabetes(return_X_y=True)


def _fit(X, y, **kwargs):
    return dask_scd.fit(X, y, solver="sdca", tol=TOL, max_iter=2000, random_state=0, **kwargs)


def _objective(result):
    return result.primal_


@pytest.mark.parametrize("case", [
    ("cancer", dict(loss="logistic", alpha=0.01)),
    ("diabetes", dict(loss="squared", alpha=0.01)),
    ("cancer", dict(loss="hinge", alpha=0.01)),
])
@pytest.mark.parametrize("sync_every", [1, 3])
def test_two_threads_reach_the_one_thread_optimum(case, sync_every, request):
    X, y = request.getfixturevalue(case[0])
    one = _fit(X, y, **case[1])
    two = _fit(X, y, n_threads=2, sync_every=sync_every, **case[1])
    assert one.dual_gap_ <= TOL and two.dual_gap_ <= TOL
    assert _objective(two) == pytest.approx(_objective(one), rel=1e-8)
    # P is α-strongly convex: each model lies within √(2·gap·P/α) of the optimum (θ and b
    # together), so the two within the sum of those radii.
    alpha = case[1]["alpha"]
    radius = sum(np.sqrt(2.0 * r.dual_gap_ * abs(_objective(r)) / alpha) for r in (one, two))
    assert np.linalg.norm(two.coef_ - one.coef_) <= radius + 1e-12


def test_sparse_rows_with_three_threads():
    X, y, _ = make_onehot(3000, 4, 10, random_state=0)
    one = _fit(X, y, loss="logistic", alpha=1e-3)
    three = _fit(X, y, loss="logistic", alpha=1e-3, n_threads=3)
    assert three.dual_gap_ <= TOL
    assert _objective(three) == pytest.approx(_objective(one), rel=1e-8)


def test_wild_runs_and_certifies_its_duals(cancer):
    """sync_every=0 never resyncs w; its certificate still reads w = Xᵀa/(αn), so the gap
    it reports is a true gap (it may stall above tol: no convergence is claimed)."""
    X, y = cancer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        wild = dask_scd.fit(X, y, loss="logistic", alpha=0.01, solver="sdca", n_threads=2,
                            sync_every=0, tol=TOL, max_iter=200, random_state=0)
    one = _fit(X, y, loss="logistic", alpha=0.01)
    assert np.isfinite(wild.dual_gap_) and wild.dual_gap_ >= 0
    # Both primal values lie above P* by at most their certified gaps, P − D = gap·|P|.
    slack = wild.dual_gap_ * abs(_objective(wild)) + one.dual_gap_ * abs(_objective(one))
    assert abs(_objective(wild) - _objective(one)) <= slack + 1e-12


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_one_thread_is_the_sequential_engine(cancer):
    X, y = cancer
    plain = dask_scd.fit(X, y, loss="logistic", alpha=0.01, solver="sdca", max_iter=5,
                         tol=1e-14, random_state=0)
    one = dask_scd.fit(X, y, loss="logistic", alpha=0.01, solver="sdca", max_iter=5,
                       tol=1e-14, random_state=0, n_threads=1, sync_every=7)
    np.testing.assert_array_equal(plain.coef_, one.coef_)
    assert plain.intercept_ == one.intercept_


@pytest.mark.parametrize("bad, message", [
    (dict(n_threads=0), "n_threads must be a positive integer, got 0"),
    (dict(n_threads=1.5), "n_threads must be a positive integer, got 1.5"),
    (dict(n_threads=True), "n_threads must be a positive integer, got True"),
    (dict(sync_every=-1), "sync_every must be a non-negative integer, got -1"),
    (dict(sync_every="2"), "sync_every must be a non-negative integer, got '2'"),
])
def test_bad_values_are_refused(cancer, bad, message):
    X, y = cancer
    with pytest.raises(ValueError, match=message):
        dask_scd.fit(X, y, loss="logistic", solver="sdca", **bad)


def test_other_engines_refuse_the_options(cancer):
    X, y = cancer
    with pytest.raises(TypeError, match="n_threads"):
        dask_scd.fit(X, y, loss="logistic", solver="scd", n_threads=2)
