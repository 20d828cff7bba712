"""Out-of-core SDCA on a grid (``solver="sdca"`` given a Grid): the in-memory optimum,
reproducibility, the order of the row chunks, and at most two row chunks in memory."""

import threading
import weakref

import numpy as np
import pytest
import scipy.sparse as sp

import dask_scd
from dask_scd import objectives as obj
from dask_scd.engines.local import sdca_grid
from dask_scd.grid import to_grid

ALPHA = 0.05
N_SAMPLES, N_FEATURES, ROW_CHUNK = 230, 12, 50  # five row chunks, the last one of 30 rows
TOL = 1e-10


def _data(loss, seed=0, sparse=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N_SAMPLES, N_FEATURES))
    if sparse:
        X[rng.random(X.shape) < 0.6] = 0.0
        X = sp.csr_matrix(X)
    theta = rng.normal(size=N_FEATURES)
    z = X @ theta + 0.5 + 0.5 * rng.normal(size=N_SAMPLES)
    y = z if loss == "squared" else np.where(z > 0, 1.0, -1.0)
    return X, y


def _permuting_blocks(seed=1):
    """Three blocks that reorder the features (the grid's columns are not X's)."""
    order = np.random.default_rng(seed).permutation(N_FEATURES)
    return [order[:5], order[5:9], order[9:]]


def _grid(tmp_path, X, y, name="g.zarr"):
    grid = to_grid(X, y, tmp_path / name, row_chunk=ROW_CHUNK, blocks=_permuting_blocks())
    assert not np.array_equal(grid.feature_order, np.arange(N_FEATURES))
    assert grid.n_row_chunks == 5
    return grid


def _objective(problem, X, y, result):
    return obj.certificate(problem, X, y, result.coef_, result.intercept_).primal


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("loss", ["logistic", "squared_hinge", "hinge", "squared"])
def test_reaches_the_in_memory_optimum(tmp_path, loss, fit_intercept):
    X, y = _data(loss)
    grid = _grid(tmp_path, X, y)
    # Plain SDCA (no shrinking out of core) on the hinge with an intercept: 250 epochs at
    # alpha = 0.05, 60 at 0.25.
    alpha = 0.25 if loss == "hinge" else ALPHA
    kw = dict(loss=loss, alpha=alpha, fit_intercept=fit_intercept, random_state=0)
    result = dask_scd.fit(grid, solver="sdca", tol=TOL, max_iter=2000, **kw)
    reference = dask_scd.fit(
        X, y, solver="newton" if loss != "hinge" else "sdca", tol=1e-13, max_iter=5000, **kw
    )
    assert result.solver_ == "sdca" and result.converged_
    assert result.dual_gap_ <= TOL
    assert result.extras_["row_chunks"] == 5  # out of core, not read into memory
    problem = obj.Problem(loss, alpha, 0.0, fit_intercept)
    ours, theirs = _objective(problem, X, y, result), _objective(problem, X, y, reference)
    assert abs(ours - theirs) <= 1e-8 * abs(theirs)
    # P is α-strongly convex in θ: ‖θ − θ*‖² ≤ 2(P(θ) − P*)/α for both fits.
    radius = sum(np.sqrt(2 * gap * abs(theirs) / alpha) for gap in (TOL, 1e-13))
    assert np.linalg.norm(result.coef_ - reference.coef_) <= radius + 1e-12
    if not fit_intercept:
        assert result.intercept_ == 0.0


def test_sparse_grid_matches_in_memory_sdca(tmp_path):
    X, y = _data("logistic", sparse=True)
    grid = _grid(tmp_path, X, y)
    assert grid.is_sparse
    kw = dict(loss="logistic", alpha=ALPHA, tol=TOL, random_state=3)
    result = dask_scd.fit(grid, solver="sdca", **kw)
    reference = dask_scd.fit(X, y, solver="sdca", **kw)
    problem = obj.Problem("logistic", ALPHA, 0.0, True)
    ours, theirs = _objective(problem, X, y, result), _objective(problem, X, y, reference)
    assert result.dual_gap_ <= TOL
    assert abs(ours - theirs) <= 1e-8 * abs(theirs)


def test_labels_of_any_two_classes(tmp_path):
    X, y = _data("logistic")
    labels = np.where(y > 0, "yes", "no")
    grid = to_grid(
        X, (labels == "yes").astype(float) * 7.0, tmp_path / "g.zarr", row_chunk=ROW_CHUNK, blocks=4
    )
    result = dask_scd.fit(grid, loss="logistic", alpha=ALPHA, solver="sdca", tol=TOL)
    reference = dask_scd.fit(X, y, loss="logistic", alpha=ALPHA, solver="newton", tol=1e-13)
    assert list(result.classes_) == [0.0, 7.0]
    problem = obj.Problem("logistic", ALPHA, 0.0, True)
    assert abs(
        _objective(problem, X, y, result) - _objective(problem, X, y, reference)
    ) <= 1e-8 * abs(reference.primal_)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_deterministic_given_random_state(tmp_path):
    X, y = _data("squared_hinge")
    grid = _grid(tmp_path, X, y)
    kw = dict(loss="squared_hinge", alpha=ALPHA, tol=1e-6, max_iter=6)
    first = dask_scd.fit(grid, solver="sdca", random_state=7, **kw)
    again = dask_scd.fit(grid, solver="sdca", random_state=7, **kw)
    other = dask_scd.fit(grid, solver="sdca", random_state=8, **kw)
    np.testing.assert_array_equal(first.coef_, again.coef_)
    assert first.intercept_ == again.intercept_
    assert first.history_.relative_gap == again.history_.relative_gap
    assert first.extras_["chunk_orders"] == again.extras_["chunk_orders"]
    assert first.extras_["chunk_orders"] != other.extras_["chunk_orders"]


def test_chunk_order_is_a_fresh_permutation_each_epoch(tmp_path):
    X, y = _data("logistic")
    grid = _grid(tmp_path, X, y)
    kw = dict(loss="logistic", alpha=ALPHA, tol=1e-15, max_iter=8, random_state=0)
    with pytest.warns(UserWarning, match="Did not converge"):
        result = dask_scd.fit(grid, solver="sdca", check_every=4, **kw)
    orders = result.extras_["chunk_orders"]
    assert len(orders) == result.n_iter_ == 8
    assert all(sorted(order) == list(range(5)) for order in orders)
    assert len({tuple(order) for order in orders}) > 1
    assert result.history_.iteration == [4, 8]  # check_every=4
    # start + 8 epochs + the last certificate (epoch 4's is summed in epoch 5's pass)
    assert result.extras_["read_passes"] == 10
    with pytest.warns(UserWarning, match="Did not converge"):
        in_order = dask_scd.fit(grid, solver="sdca", chunk_order="sequential", **kw)
    assert in_order.extras_["chunk_orders"] == [list(range(5))] * 8


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_certificate_summed_in_the_next_epoch_is_the_point_s(tmp_path, fit_intercept):
    # A certificate that stops the fit is summed during the next epoch's pass; the fit
    # returns the certified epoch's w, as a fit ending there with a pass of its own does.
    X, y = _data("logistic")
    grid = _grid(tmp_path, X, y)
    kw = dict(
        loss="logistic", alpha=ALPHA, fit_intercept=fit_intercept, random_state=3, check_every=1
    )
    gaps = dask_scd.fit(grid, solver="sdca", tol=1e-15, max_iter=6, **kw).history_.relative_gap
    assert all(earlier > gaps[3] for earlier in gaps[:3])
    stopped = dask_scd.fit(grid, solver="sdca", tol=gaps[3] * (1 + 1e-9), max_iter=50, **kw)
    ended = dask_scd.fit(grid, solver="sdca", tol=1e-15, max_iter=4, **kw)
    assert stopped.n_iter_ == ended.n_iter_ == 4
    assert stopped.extras_["read_passes"] == 1 + 5  # the start, epochs 1–5
    assert len(stopped.extras_["chunk_orders"]) == 4
    np.testing.assert_array_equal(stopped.coef_, ended.coef_)
    assert stopped.intercept_ == pytest.approx(ended.intercept_, rel=1e-12, abs=1e-14)
    assert stopped.dual_gap_ == pytest.approx(ended.dual_gap_, rel=1e-8)
    problem = obj.Problem("logistic", ALPHA, 0.0, fit_intercept)
    assert stopped.history_.primal[-1] == pytest.approx(
        _objective(problem, X, y, stopped), rel=1e-12
    )


def test_at_most_two_row_chunks_in_memory(tmp_path, monkeypatch):
    X, y = _data("logistic")
    grid = _grid(tmp_path, X, y)
    read = sdca_grid.read_row_chunk
    live, peak, reads = [0], [0], [0]

    def counted(grid, r, *memory):
        chunk = read(grid, r, *memory)
        live[0] += 1
        reads[0] += 1
        peak[0] = max(peak[0], live[0])
        weakref.finalize(chunk, lambda: live.__setitem__(0, live[0] - 1))
        return chunk

    monkeypatch.setattr(sdca_grid, "read_row_chunk", counted)
    result = dask_scd.fit(
        grid, loss="logistic", alpha=ALPHA, solver="sdca", tol=1e-8, random_state=0
    )
    assert result.dual_gap_ <= 1e-8
    assert reads[0] == 5 * result.extras_["read_passes"]
    assert 1 <= peak[0] <= 2  # the chunk being stepped on and the one being read
    assert live[0] == 0


def test_next_chunk_is_read_while_one_is_processed(tmp_path, monkeypatch):
    X, y = _data("squared")
    grid = _grid(tmp_path, X, y)
    read = sdca_grid.read_row_chunk
    done = {r: threading.Event() for r in range(grid.n_row_chunks)}
    live, seen = [0], []

    def counted(grid, r, *memory):
        chunk = read(grid, r, *memory)
        live[0] += 1
        weakref.finalize(chunk, lambda: live.__setitem__(0, live[0] - 1))
        done[r].set()
        return chunk

    order = [3, 0, 4, 1, 2]

    def work(chunk):
        # The next chunk is read (in the background) while this one is held: wait for
        # it, then both are in memory, and no third.
        k = order.index(chunk.r)
        if k + 1 < len(order):
            assert done[order[k + 1]].wait(timeout=60)
        seen.append((chunk.r, live[0]))
        # its rows, in grid column order
        probe = np.arange(1.0, N_FEATURES + 1)
        np.testing.assert_allclose(
            chunk.matrix.dot(probe),
            X[chunk.start : chunk.stop, grid.feature_order] @ probe,
            rtol=1e-13,
        )

    monkeypatch.setattr(sdca_grid, "read_row_chunk", counted)
    stream = sdca_grid.ChunkStream(grid)
    try:
        stream.each(order, work)
    finally:
        stream.close()
    assert seen == [(3, 2), (0, 2), (4, 2), (1, 2), (2, 1)]
    assert live[0] == 0


@pytest.mark.parametrize("blocks", [1, 3])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_dense_row_chunks_read_into_two_buffers(tmp_path, blocks, dtype):
    # The cells side by side in grid column order, as np.hstack of the cells, each read
    # into the buffer the read before last used.
    X, y = _data("logistic")
    grid = to_grid(X.astype(dtype), y, tmp_path / "g.zarr", row_chunk=ROW_CHUNK, blocks=blocks)
    memory = sdca_grid.ChunkMemory(grid)
    seen = []
    for r in [4, 0, 3, 3, 1, 2]:
        chunk = sdca_grid.read_row_chunk(grid, r, memory)
        expected = np.hstack([grid.read_cell(r, b) for b in range(grid.n_blocks)])
        values = chunk.matrix.data.reshape(chunk.stop - chunk.start, N_FEATURES)
        np.testing.assert_array_equal(values, expected)
        assert values.dtype == dtype
        seen.append(
            next(k for k, buf in enumerate(memory.buffers) if np.shares_memory(buf, values))
        )
    assert seen == [1, 0, 1, 0, 1, 0]


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_spilled_row_chunks_give_the_same_fit(tmp_path, monkeypatch):
    # spill: the grid's cells are decoded once (the first pass), later passes read the
    # decoded rows back; the iterates are the same bit for bit.
    X, y = _data("logistic")
    grid = _grid(tmp_path, X, y)
    kw = dict(loss="logistic", alpha=ALPHA, tol=1e-15, max_iter=4, random_state=2, solver="sdca")
    plain = dask_scd.fit(grid, **kw)
    decode = sdca_grid.read_dense_row_chunk
    decoded = []

    def counted(path, grid_id, r, *args):
        decoded.append(r)
        return decode(path, grid_id, r, *args)

    monkeypatch.setattr(sdca_grid, "read_dense_row_chunk", counted)
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    for spill in (True, spill_dir):
        decoded.clear()
        spilled = dask_scd.fit(grid, spill=spill, **kw)
        assert sorted(decoded) == list(range(5))  # the first pass only
        assert spilled.extras_["read_passes"] == plain.extras_["read_passes"] == 6
        np.testing.assert_array_equal(spilled.coef_, plain.coef_)
        assert spilled.intercept_ == plain.intercept_
        assert spilled.history_.relative_gap == plain.history_.relative_gap
    assert list(spill_dir.iterdir()) == []  # unlinked from the start


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_a_spill_that_fails_falls_back_to_the_grid(tmp_path, monkeypatch):
    X, y = _data("logistic")
    grid = _grid(tmp_path, X, y)
    kw = dict(loss="logistic", alpha=ALPHA, tol=1e-15, max_iter=3, random_state=2, solver="sdca")
    plain = dask_scd.fit(grid, **kw)

    def full(fd, data, offset):
        raise OSError(28, "No space left on device")

    from dask_scd.data import spill

    monkeypatch.setattr(spill.os, "pwrite", full)
    with pytest.warns(RuntimeWarning, match="spilling decoded row chunks.*No space left"):
        spilled = dask_scd.fit(grid, spill=True, **kw)
    np.testing.assert_array_equal(spilled.coef_, plain.coef_)


def test_estimator_on_a_grid(tmp_path):
    X, y = _data("squared_hinge")
    grid = _grid(tmp_path, X, y)
    model = dask_scd.LinearSVC(alpha=ALPHA, solver="sdca", tol=1e-6, random_state=0).fit(grid)
    result = dask_scd.fit(
        grid, loss="squared_hinge", alpha=ALPHA, solver="sdca", tol=1e-6, random_state=0
    )
    assert result.extras_["row_chunks"] == 5
    np.testing.assert_array_equal(model.coef_.ravel(), result.coef_)
    assert model.dual_gap_ <= 1e-6


def test_refusals(tmp_path):
    X, y = _data("logistic")
    grid = _grid(tmp_path, X, y)
    kw = dict(loss="logistic", alpha=ALPHA, solver="sdca")
    with pytest.raises(ValueError, match="n_threads=2: solver='sdca' on a Grid"):
        dask_scd.fit(grid, n_threads=2, **kw)
    with pytest.raises(ValueError, match="check_every must be a positive integer"):
        dask_scd.fit(grid, check_every=0, **kw)
    with pytest.raises(ValueError, match="chunk_order=.backwards. is not one of"):
        dask_scd.fit(grid, chunk_order="backwards", **kw)
    with pytest.raises(ValueError, match="spill must be True, False or a directory"):
        dask_scd.fit(grid, spill=3, **kw)
    with pytest.raises(ValueError, match="is not a directory"):
        dask_scd.fit(grid, spill=str(tmp_path / "nowhere"), **kw)
    with pytest.raises(ValueError, match="apply to solver='sdca' on a Grid"):
        dask_scd.fit(X, y, spill=True, **kw)
    sparse = to_grid(sp.csr_matrix(X), y, tmp_path / "s.zarr", row_chunk=ROW_CHUNK)
    with pytest.raises(ValueError, match="spill keeps a dense grid's row chunks"):
        dask_scd.fit(sparse, spill=True, **kw)
    with pytest.raises(ValueError, match="apply to solver='sdca' on a Grid"):
        dask_scd.fit(X, y, check_every=2, **kw)
    with pytest.raises(ValueError, match="with an L2 penalty only"):
        dask_scd.fit(grid, loss="logistic", penalty="l1", solver="sdca")


def test_values_too_large_are_refused(tmp_path):
    X, y = _data("squared")
    big_y = to_grid(X, y * 1e200, tmp_path / "y.zarr", row_chunk=ROW_CHUNK, blocks=4)
    with pytest.raises(ValueError, match=r"y is too large.*rescale"):
        dask_scd.fit(big_y, solver="sdca")
    X_big = X.copy()
    X_big[120, 3] = 1e160
    big_x = to_grid(X_big, y, tmp_path / "x.zarr", row_chunk=ROW_CHUNK, blocks=4)
    with pytest.raises(ValueError, match=r"X is too large in row chunk 2.*rescale"):
        dask_scd.fit(big_x, solver="sdca")
