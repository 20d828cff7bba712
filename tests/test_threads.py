"""Threaded passes of the in-memory kernels give the bits of one thread.

``dask_scd.kernels.threads`` cuts only passes whose ranges are independent (each line's
result written by one range), so a fit on several threads must equal the fit on one,
bit for bit. The size threshold is lowered so that small data takes the threaded paths.
"""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import scipy.sparse as sp

import dask_scd
from dask_scd.datasets import make_onehot
from dask_scd.kernels import threads
from dask_scd.kernels.layout import MajorMatrix


@pytest.fixture
def threaded(monkeypatch):
    monkeypatch.setattr(threads, "MIN_ENTRIES", 1)

    def use(n):
        monkeypatch.setattr(threads, "THREADS", n)

    return use


def test_line_ranges_cover_the_lines_in_order():
    indptr = np.array([0, 5, 5, 6, 20, 21, 40])
    for parts in (1, 2, 3, 6, 10):
        ranges = threads.line_ranges(indptr, 6, parts)
        assert ranges[0][0] == 0 and ranges[-1][1] == 6
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert all(hi > lo for lo, hi in ranges)
    assert threads.line_ranges(None, 10, 3) == [(0, 3), (3, 6), (6, 10)]


def test_line_ranges_cut_where_numpy_linspace_cuts(rng):
    """The ranges' cuts are np.linspace's floats, bit for bit (the ranges fix the rounding
    of every threaded pass: the pinned iterates depend on them)."""
    for _ in range(300):
        start = float(rng.integers(0, 1000))
        stop = start + float(rng.integers(0, 10**7))
        parts = int(rng.integers(1, 40))
        np.testing.assert_array_equal(
            threads._even_cuts(start, stop, parts), np.linspace(start, stop, parts + 1)
        )
    for n_lines in range(1, 60):
        for parts in range(1, 9):
            cuts = np.linspace(0, n_lines, min(parts, n_lines) + 1).astype(np.int64)
            expected = [(int(lo), int(hi)) for lo, hi in zip(cuts[:-1], cuts[1:]) if hi > lo]
            assert threads.line_ranges(None, n_lines, parts) == expected


@pytest.mark.parametrize("dense", [False, True])
def test_dot_on_threads_is_the_one_thread_dot(threaded, dense, rng):
    X = sp.random(301, 40, density=0.2, format="csr", random_state=0)
    X = X.toarray() if dense else X
    v = rng.normal(size=40)
    m = MajorMatrix.from_array(X, "rows")
    threaded(1)
    want = m.dot(v), m.dot(v, squared=True)
    threaded(3)
    got = m.dot(v), m.dot(v, squared=True)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], X @ v, rtol=1e-12, atol=1e-12)


def test_run_all_shares_the_calls_evenly_among_the_threads(threaded):
    threaded(2)
    names = threads.run_all([lambda k=k: (k, threading.current_thread().name) for k in range(4)])
    assert [k for k, _ in names] == [0, 1, 2, 3]  # results in the calls' order
    here = threading.current_thread().name
    # Two consecutive calls on this thread, two on the pool: not one here and three there.
    assert [name == here for _, name in names] == [True, True, False, False]
    threaded(3)
    names = threads.run_all([lambda: threading.current_thread().name for _ in range(7)])
    assert names.count(here) == 2 and len(set(names)) <= 3


def test_a_thread_other_than_the_main_one_runs_passes_on_itself(threaded):
    threaded(4)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(threads.usable(10**9)))
    worker.start()
    worker.join()
    assert seen == [1] and threads.usable(10**9) == 4


@pytest.mark.parametrize("loss", ["logistic", "squared"])
def test_l1_newton_on_pure_blocks_is_the_same_on_any_number_of_threads(threaded, loss):
    """Column epochs split within pure blocks, block-shift statistics in fixed row ranges
    and row-range products: 1, 2 and 3 threads give the same model, bit for bit."""
    X, y = make_onehot(
        3000, 6, 20, task="classification" if loss == "logistic" else "regression", random_state=0
    )[:2]
    fits = []
    for n in (1, 2, 3):
        threaded(n)
        fits.append(
            dask_scd.fit(X, y, loss=loss, penalty="l1", alpha=2e-4, tol=1e-10, solver="newton")
        )
    for fit in fits[1:]:
        assert np.array_equal(fit.coef_, fits[0].coef_)
        assert fit.intercept_ == fits[0].intercept_ and fit.n_iter_ == fits[0].n_iter_
    assert fits[0].dual_gap_ <= 1e-10 and np.count_nonzero(fits[0].coef_) > 10


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_runs_threaded_passes(threaded):
    """A child forked after the pool started gets a pool of its own (the parent's threads
    do not exist in it): its threaded pass finishes, with the parent's bits."""
    import os

    threaded(3)
    X = sp.random(500, 30, density=0.3, format="csr", random_state=1)
    m = MajorMatrix.from_array(X, "rows")
    v = np.arange(30, dtype=np.float64)
    want = m.dot(v)  # starts the pool in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its pass gives the parent's bits
        os.close(read)
        ok = np.array_equal(m.dot(v), want)
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    import select
    import signal

    ready, _, _ = select.select([read], [], [], 120)
    answer = os.read(read, 1) if ready else b"hung"
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert answer == b"1"


def test_l2_newton_by_conjugate_gradients_is_the_same_on_any_number_of_threads(threaded):
    """Wider than the Cholesky path (p = 3000): Hessian-vector products and the gradient's
    scatter summed over fixed row ranges give one model on 1, 2 and 3 threads."""
    X, y = make_onehot(3000, 6, 500, random_state=2)[:2]
    fits = []
    for n in (1, 2, 3):
        threaded(n)
        fits.append(
            dask_scd.fit(X, y, loss="logistic", alpha=1.0 / 3000, tol=1e-10, solver="newton")
        )
    assert fits[0].extras_.get("cg_products") or fits[0].n_iter_ > 0
    for fit in fits[1:]:
        assert np.array_equal(fit.coef_, fits[0].coef_) and fit.intercept_ == fits[0].intercept_
    assert fits[0].dual_gap_ <= 1e-10


def test_the_environment_caps_the_threads(monkeypatch):
    """DASK_SCD_NUM_THREADS and NUMBA_NUM_THREADS cap the process's threads (the smaller
    wins; what is not a positive integer is ignored): a process that limits its libraries
    to one thread (make bench-peers) runs its passes on one."""
    for name in threads.THREAD_LIMITS:
        monkeypatch.delenv(name, raising=False)
    cores = threads._threads()
    monkeypatch.setenv("NUMBA_NUM_THREADS", "1")
    assert threads._threads() == 1
    monkeypatch.setenv("NUMBA_NUM_THREADS", "64")
    monkeypatch.setenv("DASK_SCD_NUM_THREADS", "1")
    assert threads._threads() == 1
    monkeypatch.setenv("DASK_SCD_NUM_THREADS", "zero")
    monkeypatch.setenv("NUMBA_NUM_THREADS", "0")
    assert threads._threads() == cores
    script = "from dask_scd.kernels import threads; print(threads.THREADS)"
    env = dict(os.environ, NUMBA_NUM_THREADS="1", DASK_SCD_NUM_THREADS="")
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "1"
