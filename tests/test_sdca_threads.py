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


@pytest.mark.parametrize(
    "case",
    [
        ("cancer", dict(loss="logistic", alpha=0.01)),
        ("diabetes", dict(loss="squared", alpha=0.01)),
        ("cancer", dict(loss="hinge", alpha=0.01)),
    ],
)
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
        wild = dask_scd.fit(
            X,
            y,
            loss="logistic",
            alpha=0.01,
            solver="sdca",
            n_threads=2,
            sync_every=0,
            tol=TOL,
            max_iter=200,
            random_state=0,
        )
    one = _fit(X, y, loss="logistic", alpha=0.01)
    assert np.isfinite(wild.dual_gap_) and wild.dual_gap_ >= 0
    # Both primal values lie above P* by at most their certified gaps, P − D = gap·|P|.
    slack = wild.dual_gap_ * abs(_objective(wild)) + one.dual_gap_ * abs(_objective(one))
    assert abs(_objective(wild) - _objective(one)) <= slack + 1e-12


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_one_thread_is_the_sequential_engine(cancer):
    X, y = cancer
    plain = dask_scd.fit(
        X, y, loss="logistic", alpha=0.01, solver="sdca", max_iter=5, tol=1e-14, random_state=0
    )
    one = dask_scd.fit(
        X,
        y,
        loss="logistic",
        alpha=0.01,
        solver="sdca",
        max_iter=5,
        tol=1e-14,
        random_state=0,
        n_threads=1,
        sync_every=7,
    )
    np.testing.assert_array_equal(plain.coef_, one.coef_)
    assert plain.intercept_ == one.intercept_


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(n_threads=0), "n_threads must be a positive integer, got 0"),
        (dict(n_threads=1.5), "n_threads must be a positive integer, got 1.5"),
        (dict(n_threads=True), "n_threads must be a positive integer, got True"),
        (dict(sync_every=-1), "sync_every must be a non-negative integer, got -1"),
        (dict(sync_every="2"), "sync_every must be a non-negative integer, got '2'"),
    ],
)
def test_bad_values_are_refused(cancer, bad, message):
    X, y = cancer
    with pytest.raises(ValueError, match=message):
        dask_scd.fit(X, y, loss="logistic", solver="sdca", **bad)


def test_other_engines_refuse_the_options(cancer):
    X, y = cancer
    with pytest.raises(TypeError, match="n_threads"):
        dask_scd.fit(X, y, loss="logistic", solver="scd", n_threads=2)


def test_weighted_rows_on_two_threads_reach_the_weighted_optimum(cancer):
    X, y = cancer
    weights = np.random.default_rng(0).integers(0, 4, size=len(y)).astype(float)
    one = _fit(X, y, loss="logistic", alpha=0.01, sample_weight=weights)
    two = _fit(X, y, loss="logistic", alpha=0.01, sample_weight=weights, n_threads=2)
    assert one.dual_gap_ <= TOL and two.dual_gap_ <= TOL
    assert _objective(two) == pytest.approx(_objective(one), rel=1e-8)


def test_atomic_adds_from_two_threads_are_never_lost():
    """Two threads adding to the same entries of w: every add counts (a plain += would
    lose some to the other thread's read-modify-write)."""
    import threading

    from numba import njit

    from dask_scd.kernels.sdca_threads import atomic_add

    @njit(nogil=True)
    def add_many(w, n):
        for k in range(n):
            atomic_add(w, k % 2, 1.0)

    w = np.zeros(2)
    add_many(w, 2)  # compile
    w[:] = 0.0
    threads = [threading.Thread(target=add_many, args=(w, 2_000_000)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert w.tolist() == [2_000_000.0, 2_000_000.0]


def test_hot_features_are_those_most_rows_hold():
    import scipy.sparse as sp

    from dask_scd.engines.local.sdca import HOT, hot_features
    from dask_scd.kernels.layout import MajorMatrix

    n = 5000
    rows = np.arange(n)
    cols = np.where(rows % 2 == 0, 0, 1 + rows % 7)  # feature 0 in half the rows
    cols[:3] = 8  # feature 8 in 3 rows, below HOT·n = 5
    X = sp.csr_matrix((np.ones(n), (rows, cols)), shape=(n, 9))
    hot = hot_features(MajorMatrix.from_array(X, "rows"), n)
    counts = np.bincount(cols, minlength=9)
    assert hot.tolist() == (counts > HOT * n).tolist()
    assert hot[0] and not hot[8]


def test_private_copies_of_w_lose_no_step():
    """Dense rows: each thread steps on its own copy of w and merges it every few visits;
    after the epoch the shared w is Xᵀa/(αn) of the duals the threads moved (every step
    of both threads counted), up to rounding."""
    import threading

    from dask_scd.kernels import sdca_threads
    from dask_scd.objectives import LOSS_CODES

    rng = np.random.default_rng(0)
    n, p = 20_000, 30
    X = rng.normal(size=(n, p))
    y = np.where(X @ rng.normal(size=p) + rng.logistic(size=n) > 0, 1.0, -1.0)
    alpha_n = 1e-3 * n
    dual = 0.5 * y  # a feasible logistic dual point (y·a in (0, 1))
    coef = X.T @ dual / alpha_n
    order = rng.permutation(n)
    slots = np.zeros((2, sdca_threads.SLOT))
    copies = np.empty((4, p))
    norms = np.einsum("ij,ij->i", X, X)
    data = np.ascontiguousarray(X).ravel()

    def run(k, part):
        sdca_threads.sdca_thread_epoch_local(
            data,
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            True,
            p,
            y,
            dual,
            coef,
            part,
            LOSS_CODES["logistic"],
            alpha_n,
            norms,
            np.ones(0),
            0.0,
            0.0,
            0.0,
            slots,
            k,
            16,
            copies[2 * k],
            copies[2 * k + 1],
        )

    run(0, order[:10])  # compile
    coef[:] = X.T @ dual / alpha_n
    before = dual.copy()
    threads = [
        threading.Thread(target=run, args=(k, part))
        for k, part in enumerate(np.array_split(order, 2))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    moved = dual - before
    assert np.count_nonzero(moved) > n // 2  # the threads moved the duals
    # One lost step would leave an error of |Δa_i|·|x_ij|/(αn) in w; the rounding of
    # 20,000 additions stays a million times below the smallest step that mattered.
    step = np.median(np.abs(moved[moved != 0])) / alpha_n
    np.testing.assert_allclose(coef, X.T @ dual / alpha_n, rtol=0, atol=1e-6 * step)
