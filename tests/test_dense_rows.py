"""The passes over dense rows four at a time (:mod:`dask_scd.kernels.dense_rows`) give
every row the same bits on any split of the rows into ranges (threads), the bits of one
row at a time where they run one row at a time (rows narrower than ``WIDE``), and agree
with numpy and with one row at a time to rounding elsewhere."""

import numpy as np
import pytest
from numba import njit

from dask_scd.kernels import dense_rows
from dask_scd.kernels import newton as kernels
from dask_scd.kernels.layout import MajorMatrix
from dask_scd.kernels.lines import FAST

_NONE = np.zeros(0, dtype=np.int32)
WIDTHS = [*range(1, 20), 31, 32, 33, 63, 64, 65, 100, 255, 256, 257, 400]
HEIGHTS = [1, 3, 4, 5, 13, 130]


# One row at a time, as the kernels ran before. Four sums side by side and one sum alone
# are vectorized by LLVM each its own way, and whether they round alike depends on the CPU
# (alike on some, not on an AVX2 Zen 3): the four-row loops are held to these bits only
# where they run one row at a time, and to rounding elsewhere.


@njit(fastmath=FAST)
def _row_dots(data, n, m, v, start, out):
    for r in range(n):
        row = data[r * m : (r + 1) * m]
        s = start
        for k in range(row.shape[0]):
            s += row[k] * v[k]
        out[r] = s


@njit(fastmath=FAST)
def _row_adds(data, n, m, u, out):
    for r in range(n):
        scale = u[r]
        if scale != 0.0:
            row = data[r * m : (r + 1) * m]
            for k in range(row.shape[0]):
                out[k] += scale * row[k]


@njit(fastmath=FAST)
def _row_squares(data, n, m, u, out_side, out_sq):
    for r in range(n):
        scale = u[r]
        if scale != 0.0:
            row = data[r * m : (r + 1) * m]
            for k in range(row.shape[0]):
                x = np.float64(row[k])
                out_side[k] += scale * x
                out_sq[k] += scale * x * x


def _same(got, want, exact):
    """``got`` is ``want``'s bits where ``exact``, else equal to rounding."""
    if exact:
        assert np.array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _problem(n, m, dtype):
    rng = np.random.default_rng(1000 * m + n)
    X = rng.standard_normal((n, m)).astype(dtype)
    u = rng.standard_normal(n)
    u[rng.random(n) < 0.25] = 0.0
    weights = rng.random(n)
    weights[rng.random(n) < 0.3] = 0.0
    return X, rng.standard_normal(m), u, weights


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("m", WIDTHS)
def test_dot_and_scatter_give_every_row_one_result_on_any_split(m, dtype):
    for n in HEIGHTS:
        X, v, u, _ = _problem(n, m, dtype)
        data = X.ravel()
        want = np.empty(n)
        _row_dots(data, n, m, v, 0.0, want)
        got = np.empty(n)
        dense_rows.dot(data, 0, n, m, v, got)
        _same(got, want, exact=False)  # four rows at a time on any width
        split = np.empty(n)  # other splits into ranges (threads): the same bits
        for lo, hi in ((0, n // 3), (n // 3, n // 2 + 1), (n // 2 + 1, n)):
            dense_rows.dot(data, lo, hi, m, v, split)
        assert np.array_equal(split, got)
        for r in range(n):  # every row a range of its own
            dense_rows.dot(data, r, r + 1, m, v, split)
        assert np.array_equal(split, got)
        np.testing.assert_allclose(got, X.astype(np.float64) @ v, rtol=1e-12, atol=1e-12)
        want_t, got_t = np.zeros(m), np.zeros(m)
        _row_adds(data, n, m, u, want_t)
        dense_rows.scatter(data, n, m, u, got_t)
        _same(got_t, want_t, exact=m < dense_rows.WIDE)
        matrix = MajorMatrix.from_array(X, axis="rows")  # the seam every engine calls
        assert np.array_equal(matrix.dot(v), got)
        assert np.array_equal(matrix.scatter(u), got_t)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("m", WIDTHS)
def test_hessian_vector_and_signed_parts_match_one_row_at_a_time(m, dtype):
    v0 = 0.3
    for n in HEIGHTS:
        X, v, u, weights = _problem(n, m, dtype)
        data = X.ravel()
        xv_want = np.empty(n)
        _row_dots(data, n, m, v, v0, xv_want)
        scaled = xv_want * weights
        out_want = np.zeros(m)
        _row_adds(data, n, m, scaled, out_want)
        total_want = 0.0
        for s in scaled[weights != 0.0]:
            total_want += s
        for keep in (True, False):
            out, xv = np.empty(m), np.empty(n if keep else 0)
            total = kernels.hessian_vector(data, _NONE, _NONE, True, n, m, weights, v, v0, out, xv)
            _same(out, out_want, exact=m < dense_rows.WIDE)
            _same(np.array([total]), np.array([total_want]), exact=m < dense_rows.WIDE)
            if keep:
                _same(xv, xv_want, exact=m < dense_rows.WIDE)
        dense = X.astype(np.float64)
        reference = dense.T @ (weights * (dense @ v + v0))
        np.testing.assert_allclose(out, reference, rtol=1e-10, atol=1e-10)

        neg_want, pos_want = np.zeros(m), np.zeros(m)
        _row_adds(data, n, m, np.minimum(u, 0.0), neg_want)
        _row_adds(data, n, m, np.maximum(u, 0.0), pos_want)
        side_want, sq_want = np.zeros(m), np.zeros(m)
        _row_squares(data, n, m, weights, side_want, sq_want)
        parts = [np.empty(m) for _ in range(4)]
        kernels.signed_scatter(data, _NONE, _NONE, True, n, m, u, *parts[:2], weights, *parts[2:])
        for got, want in zip(parts, (neg_want, pos_want, sq_want, side_want)):
            _same(got, want, exact=m < dense_rows.WIDE)
        np.testing.assert_allclose(parts[0] + parts[1], dense.T @ u, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(parts[2], (dense * dense).T @ weights, rtol=1e-10, atol=1e-10)
