"""Numba kernels against the plain-numpy reference, update for update."""

import kernel_reference as reference
import numpy as np
import pytest
import scipy.sparse as sp

from dask_scd import objectives as obj
from dask_scd.kernels import cpu, sdca
from dask_scd.kernels.layout import MajorMatrix


def _data(rng, dtype, sparse, n=40, p=7):
    X = rng.normal(size=(n, p))
    X[rng.random(X.shape) < 0.5] = 0.0
    X = X.astype(dtype)
    y = np.sign(rng.normal(size=n))
    y[y == 0] = 1.0
    return (sp.csr_matrix(X) if sparse else X), X.astype(np.float64), y


LAYOUTS = [(np.float64, False), (np.float64, True), (np.float32, False), (np.float32, True)]


@pytest.mark.parametrize("dtype,sparse", LAYOUTS)
@pytest.mark.parametrize("loss", ["squared", "logistic", "squared_hinge"])
@pytest.mark.parametrize("rho", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_scd_epoch_matches_reference(rng, dtype, sparse, loss, rho, fit_intercept):
    X, dense, y = _data(rng, dtype, sparse)
    problem = obj.Problem(loss=loss, alpha=0.05, l1_ratio=rho, fit_intercept=fit_intercept)
    n, p = dense.shape
    coef0 = rng.normal(scale=0.2, size=p)
    order = rng.permutation(p + int(fit_intercept))
    m = MajorMatrix.from_array(X, "columns")
    coef, intercept = coef0.copy(), np.array([0.1])
    margins = dense @ coef + 0.1
    for _ in range(3):
        cpu.scd_epoch(
            m.data,
            m.indices,
            m.indptr,
            m.dense,
            n,
            y,
            margins,
            coef,
            intercept,
            order,
            problem.loss_code,
            problem.l1,
            problem.l2,
            m.sq_norms(),
            m.cube_sums(),
        )
    ref_coef, ref_intercept = coef0.copy(), np.array([0.1])
    ref_margins = dense @ ref_coef + 0.1
    for _ in range(3):
        reference.scd_epoch(problem, dense, y, ref_margins, ref_coef, ref_intercept, order)
    np.testing.assert_allclose(coef, ref_coef, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(intercept, ref_intercept, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(margins, ref_margins, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dtype,sparse", LAYOUTS)
@pytest.mark.parametrize("loss", obj.LOSSES)
@pytest.mark.parametrize("rho", [0.0, 0.7])
def test_sdca_epoch_matches_reference(rng, dtype, sparse, loss, rho):
    X, dense, y = _data(rng, dtype, sparse)
    problem = obj.Problem(loss=loss, alpha=0.05, l1_ratio=0.0, fit_intercept=rho > 0)
    n, p = dense.shape
    a0 = 0.3 * y  # feasible and interior: β = 0.3 for every example
    order = rng.permutation(n)
    intercept = 0.2 if rho else 0.0
    m = MajorMatrix.from_array(X, "rows")
    a, w = a0.copy(), dense.T @ a0 / (problem.alpha * n)
    for _ in range(3):
        total = np.array([a.sum()])
        cpu.sdca_epoch(
            m.data,
            m.indices,
            m.indptr,
            m.dense,
            p,
            y,
            a,
            w,
            order,
            problem.loss_code,
            problem.alpha * n,
            m.sq_norms(),
            intercept,
            rho,
            total,
        )
        assert total[0] == pytest.approx(a.sum(), abs=1e-12)
    ref_a, ref_w = a0.copy(), dense.T @ a0 / (problem.alpha * n)
    for _ in range(3):
        reference.sdca_epoch(problem, dense, y, ref_a, ref_w, order, intercept, rho)
    np.testing.assert_allclose(a, ref_a, rtol=1e-8, atol=1e-11)
    np.testing.assert_allclose(w, ref_w, rtol=1e-8, atol=1e-11)


@pytest.mark.parametrize("k,block", [(1, 4), (37, 4), (40, 8), (100, 32), (5, 32)])
def test_block_order_matches_reference(k, block):
    rows = np.sort(np.random.default_rng(1).choice(1000, size=k, replace=False))
    out = np.empty(k, dtype=np.int64)
    sdca.block_order(rows, block, np.random.default_rng(3), out)
    np.testing.assert_array_equal(out, reference.block_order(rows, block, np.random.default_rng(3)))
    np.testing.assert_array_equal(np.sort(out), rows)
    # The rows of each input block come out as one run.
    block_of = np.searchsorted(rows, out) // block
    assert np.count_nonzero(np.diff(block_of)) == -(-k // block) - 1


@pytest.mark.parametrize(
    "k,block,cuts",
    [(100, 8, [0, 37, 100]), (101, 32, [0, 5, 6, 64, 101]), (40, 8, [0, 40]), (7, 4, [0, 3, 3, 7])],
)
def test_block_order_made_by_shares_is_the_whole_order(k, block, cuts):
    """The threads of an epoch fill their shares of the order from one set of draws: the
    same order as made whole, however the shares cut the blocks."""
    rows = np.sort(np.random.default_rng(1).choice(1000, size=k, replace=False))
    whole = np.empty(k, dtype=np.int64)
    sdca.block_order(rows, block, np.random.default_rng(3), whole)
    perm, uniforms = sdca.block_order_draws(k, block, np.random.default_rng(3))
    shares = np.full(k, -1, dtype=np.int64)
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        sdca.block_order_fill(rows, block, perm, uniforms, shares, lo, hi)
    np.testing.assert_array_equal(shares, whole)


@pytest.mark.parametrize("dtype,sparse", LAYOUTS)
@pytest.mark.parametrize("loss", ["hinge", "squared_hinge"])
@pytest.mark.parametrize("rho", [0.0, 0.7])
def test_sdca_shrinking_epoch_matches_reference(rng, dtype, sparse, loss, rho):
    X, dense, _ = _data(rng, dtype, sparse, n=60)
    y = np.where(dense @ rng.normal(size=dense.shape[1]) > 0, 1.0, -1.0)  # separable-ish:
    y[:3] *= -1  # most rows end at β = 0, the flipped ones at the hinge's β = 1
    problem = obj.Problem(loss=loss, alpha=0.02, l1_ratio=0.0, fit_intercept=rho > 0)
    n, p = dense.shape
    a0 = np.where(rng.random(n) < 0.3, 0.0, rng.random(n)) * y  # some rows at β = 0
    a0[:5] = y[:5]  # and, for the hinge, some at β = 1
    intercept = 0.2 if rho else 0.0
    block, relative_eps, shrunk_work = 8, 0.1, 1.5
    m = MajorMatrix.from_array(X, "rows")
    a, w = a0.copy(), dense.T @ a0 / (problem.alpha * n)
    active, n_active = np.arange(n), np.array([n])
    bounds = np.array([np.inf, -np.inf, np.inf, 0.0])
    order, keep = np.empty(n, dtype=np.int64), np.ones(n, dtype=bool)
    ref_a, ref_w = a0.copy(), w.copy()
    state = {"active": np.arange(n), "bounds": bounds.copy()}
    rng_kernel, rng_ref = np.random.default_rng(5), np.random.default_rng(5)
    smallest = n
    for _ in range(6):
        total = np.array([a.sum()])
        _, settled = sdca.sdca_shrinking_epoch(
            m.data,
            m.indices,
            m.indptr,
            m.dense,
            p,
            y,
            a,
            w,
            problem.loss_code,
            problem.alpha * n,
            m.sq_norms(),
            intercept,
            rho,
            total,
            active,
            n_active,
            bounds,
            block,
            rng_kernel,
            order,
            keep,
            relative_eps,
            shrunk_work,
        )
        ref_settled = reference.sdca_shrinking_epoch(
            problem,
            dense,
            y,
            ref_a,
            ref_w,
            state,
            rng_ref,
            block,
            relative_eps,
            shrunk_work,
            intercept,
            rho,
        )
        assert settled == ref_settled
        assert total[0] == pytest.approx(a.sum(), abs=1e-12)
        np.testing.assert_array_equal(active[: n_active[0]], state["active"])
        np.testing.assert_allclose(bounds, state["bounds"], rtol=1e-9)
        np.testing.assert_allclose(a, ref_a, rtol=1e-8, atol=1e-11)
        np.testing.assert_allclose(w, ref_w, rtol=1e-8, atol=1e-11)
        smallest = min(smallest, n_active[0])
        beta = a * y
        assert np.all(beta >= 0) and (loss != "hinge" or np.all(beta <= 1))
    assert smallest < n  # the epochs did shrink


@pytest.mark.parametrize("dtype,sparse", LAYOUTS)
@pytest.mark.parametrize("axis", ["rows", "columns"])
def test_products_match_numpy(rng, dtype, sparse, axis):
    X, dense, _ = _data(rng, dtype, sparse)
    m = MajorMatrix.from_array(X, axis)
    A = dense if axis == "rows" else dense.T
    v = rng.normal(size=A.shape[1])
    u = rng.normal(size=A.shape[0])
    np.testing.assert_allclose(m.dot(v), A @ v, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(m.scatter(u), A.T @ u, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(m.sq_norms(), (A * A).sum(axis=1), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(1, 5), (5, 1), (130, 70)])
def test_minor_sq_norms_are_the_other_layouts_bits(rng, dtype, shape):
    """A dense matrix's column norms summed along its rows: the very bits of the column
    layout's own sums (the Newton design reads them from either)."""
    X = rng.normal(size=shape).astype(dtype)
    by_rows = MajorMatrix.from_array(X, "rows").minor_sq_norms()
    by_columns = MajorMatrix.from_array(X, "columns").sq_norms()
    np.testing.assert_array_equal(by_rows, by_columns)
    np.testing.assert_allclose(by_rows, (X.astype(np.float64) ** 2).sum(axis=0), rtol=1e-12)
    with pytest.raises(ValueError, match="dense lines"):
        MajorMatrix.from_array(sp.csr_matrix(X), "rows").minor_sq_norms()


def test_layout_never_modifies_caller_matrix(rng):
    # A CSC matrix with unsorted, duplicated entries must be copied, not canonicalized in place.
    X = sp.csc_matrix(
        (np.array([1.0, 2.0, 3.0]), np.array([2, 0, 2]), np.array([0, 3])), shape=(3, 1)
    )
    before = (X.data.copy(), X.indices.copy(), X.indptr.copy())
    m = MajorMatrix.from_array(X, "columns")
    for old, new in zip(before, (X.data, X.indices, X.indptr)):
        np.testing.assert_array_equal(old, new)
    np.testing.assert_allclose(m.sq_norms(), [4.0**2 + 2.0**2])


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(1, 5), (5, 1), (130, 70), (70, 200)])
def test_in_order_copies_the_values_into_either_order(monkeypatch, dtype, shape, tiled):
    """kernels.layout.in_order: the same values, contiguous in the order asked, the same
    array where it already is, from C, F and strided arrays (numpy's copy for small
    arrays, the tiled transposing copy for whole arrays of the other order above it)."""
    from dask_scd.kernels import layout
    from dask_scd.kernels.layout import in_order

    if tiled:
        monkeypatch.setattr(layout, "_NUMPY_COPY_BYTES", 0)

    A = np.random.default_rng(0).normal(size=shape).astype(dtype)
    for source in (np.ascontiguousarray(A), np.asfortranarray(A), A[::2], A[:, ::2]):
        for order in "CF":
            out = in_order(source, order)
            assert out.flags[f"{order}_CONTIGUOUS"]
            assert out.dtype == dtype
            np.testing.assert_array_equal(out, source)
            if source.flags[f"{order}_CONTIGUOUS"]:
                assert out is source


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_index_counts_are_bincount(rng, dtype):
    """kernels.lines.index_counts: np.bincount(indices, minlength) without its intp copy,
    on int32 and int64 indices, empty ones, and columns nothing indexes."""
    from dask_scd.kernels.lines import index_counts

    indices = rng.integers(0, 50, size=10_000).astype(dtype)
    counts = index_counts(indices, 60)
    assert counts.dtype == np.int64
    np.testing.assert_array_equal(counts, np.bincount(indices, minlength=60))
    np.testing.assert_array_equal(index_counts(indices[:0], 4), np.zeros(4))
