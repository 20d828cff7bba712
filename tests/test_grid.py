"""Tests of the zarr grid store (dask_scd.grid)."""

from __future__ import annotations

import os
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from dask.callbacks import Callback
from sklearn.datasets import dump_svmlight_file, load_svmlight_file

from dask_scd.grid import (
    GridCorruptionError,
    block_purity,
    blocks_from_names,
    detect_pure_blocks,
    open_grid,
    to_grid,
    validate_blocks,
)
from dask_scd.grid import write as grid_write

A9A_TEST = Path(__file__).resolve().parents[2] / "shared" / "data" / "a9a.t"


# ------------------------------------------------------------------ helpers


def dense_of(grid):
    """Compute grid.X as one numpy array (densifying sparse cells)."""
    X = grid.X
    if grid.is_sparse:
        X = X.map_blocks(lambda c: c.toarray(), meta=np.empty((0, 0), grid.dtype))
    return X.compute()


def to_dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X)


def one_hot(rng, n, group_sizes, missing=0.0):
    """One-hot design of len(group_sizes) categorical variables.

    Returns X (n, sum(group_sizes)) and the true groups.  With ``missing`` > 0
    a fraction of rows has no value for a variable (still pure).
    """
    cols, groups, offset = [], [], 0
    for size in group_sizes:
        values = rng.integers(0, size, n)
        M = np.zeros((n, size))
        keep = rng.random(n) >= missing
        M[np.flatnonzero(keep), values[keep]] = 1.0
        cols.append(M)
        groups.append(np.arange(offset, offset + size))
        offset += size
    return np.hstack(cols), groups


def check_round_trip(grid, X, y):
    Xd = to_dense(X)
    assert grid.shape == Xd.shape
    np.testing.assert_array_equal(np.sort(grid.feature_order), np.arange(Xd.shape[1]))
    np.testing.assert_array_equal(grid.feature_order, np.concatenate(grid.blocks))
    np.testing.assert_array_equal(dense_of(grid), Xd[:, grid.feature_order])
    np.testing.assert_array_equal(grid.y.compute(), np.asarray(y, dtype=np.float64))
    assert grid.y.dtype == np.float64
    assert grid.X.chunks == (grid.row_chunks, tuple(len(b) for b in grid.blocks))
    for b, block in enumerate(grid.blocks):
        s = grid.block_slices[b]
        assert s.stop - s.start == len(block)
        np.testing.assert_array_equal(grid.feature_order[s], block)


# --------------------------------------------------------------- round trips


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["dense", "csr", "csc_array", "coo"])
def test_round_trip_in_memory(tmp_path, kind, dtype):
    rng = np.random.default_rng(0)
    n, p = 53, 8
    Xs = sp.random(n, p, density=0.3, format="csr", random_state=1, dtype=dtype)
    X = {
        "dense": Xs.toarray(),
        "csr": Xs,
        "csc_array": sp.csc_array(Xs),
        "coo": Xs.tocoo(),
    }[kind]
    y = rng.normal(size=n)
    X_before = to_dense(X).copy()
    grid = to_grid(X, y, tmp_path / "g", row_chunk=20)
    assert grid.is_sparse == (kind != "dense")
    assert grid.dtype == dtype
    assert grid.row_chunks == (20, 20, 13)
    np.testing.assert_array_equal(grid.row_bounds, [0, 20, 40, 53])
    check_round_trip(grid, X, y)
    np.testing.assert_array_equal(to_dense(X), X_before)  # caller's data untouched
    assert grid.nnz == np.count_nonzero(X_before)
    assert grid.cell_nnz.sum() == grid.nnz

    # per-cell reads: shape, type and values
    Xd = X_before[:, grid.feature_order]
    for r in range(grid.n_row_chunks):
        lo, hi = grid.row_bounds[r], grid.row_bounds[r + 1]
        np.testing.assert_array_equal(grid.read_labels(r), y[lo:hi])
        for b in range(grid.n_blocks):
            cell = grid.read_cell(r, b)
            if grid.is_sparse:
                assert isinstance(cell, sp.csc_matrix)
                assert cell.indices.dtype == np.int32
                cell = cell.toarray()
            else:
                assert isinstance(cell, np.ndarray)
            assert cell.dtype == dtype
            np.testing.assert_array_equal(cell, Xd[lo:hi, grid.block_slices[b]])


def test_open_grid_matches_returned(tmp_path):
    X = np.arange(40.0).reshape(10, 4)
    y = np.arange(10.0)
    g1 = to_grid(X, y, tmp_path / "g", row_chunk=3, blocks=[[2, 0], [1], [3]])
    g2 = open_grid(str(tmp_path / "g"))
    assert g2.blocks[0].tolist() == [2, 0]  # user order kept
    np.testing.assert_array_equal(g2.feature_order, [2, 0, 1, 3])
    assert g2.block_slices == [slice(0, 2), slice(2, 3), slice(3, 4)]
    np.testing.assert_array_equal(g2.X.compute(), X[:, [2, 0, 1, 3]])
    assert g1.grid_id == g2.grid_id
    w_grid = np.array([20.0, 0.0, 1.0, 3.0])  # indexed like g2.X's columns
    np.testing.assert_array_equal(g2.to_original_order(w_grid), [0.0, 1.0, 20.0, 3.0])
    assert g2.X.chunks == ((3, 3, 3, 1), (2, 1, 1))
    assert isinstance(g2.X._meta, np.ndarray)


def test_sparse_meta_and_integer_input(tmp_path):
    X = sp.random(30, 6, density=0.4, format="csr", random_state=3)
    X.data = np.ceil(X.data * 5).astype(np.int64)
    X = sp.csr_matrix(X, dtype=np.int64)
    y = np.arange(30)  # integer labels are stored as float64
    grid = to_grid(X, y, tmp_path / "g", row_chunk=8)
    assert grid.dtype == np.float64
    assert isinstance(grid.X._meta, sp.csc_matrix)
    assert isinstance(grid.X.compute(), sp.spmatrix | sp.sparray)
    check_round_trip(grid, X, y)


def test_empty_cells_and_zero_features(tmp_path):
    X = np.zeros((30, 5))
    X[:10, 0] = 1.0  # rows 10:30 (two row chunks) are entirely empty
    X[5, 3] = -2.0  # features 1, 2, 4 are never non-zero
    y = np.arange(30.0)
    grid = to_grid(sp.csr_matrix(X), y, tmp_path / "g", row_chunk=10)
    check_round_trip(grid, X, y)
    assert all(grid.purity)
    assert grid.nnz == 11
    assert grid.read_cell(2, 0).nnz == 0
    grid = to_grid(X, y, tmp_path / "d", row_chunk=10, blocks=[[4, 2], [0, 1, 3]])
    check_round_trip(grid, X, y)
    assert grid.max_nnz_per_row == [0, 2]


# ------------------------------------------------------------------ dask


class ChunkRecorder(Callback):
    """Records the number of computations and the largest task result."""

    def __init__(self):
        super().__init__()
        self.n_computes = 0
        self.max_rows = 0

    def _start(self, dsk):
        self.n_computes += 1

    def _posttask(self, key, result, dsk, state, worker_id):
        shape = getattr(result, "shape", ())
        if len(shape) == 2:
            self.max_rows = max(self.max_rows, shape[0])


@pytest.mark.parametrize("chunk_kind", ["dense", "scipy", "pydata"])
def test_dask_input_streamed(tmp_path, chunk_kind):
    rng = np.random.default_rng(2)
    n, p, row_chunk = 120, 9, 25
    Xnp = sp.random(n, p, density=0.3, format="csr", random_state=5).toarray()
    y = rng.normal(size=n)
    X = da.from_array(Xnp, chunks=(10, 4))  # misaligned with row_chunk on purpose
    if chunk_kind == "scipy":
        X = X.map_blocks(sp.csr_matrix, meta=sp.csr_matrix((0, 0)))
    elif chunk_kind == "pydata":
        sparse = pytest.importorskip("sparse")
        X = X.map_blocks(sparse.COO.from_numpy, meta=sparse.COO.from_numpy(np.zeros((0, 0))))
    ydask = da.from_array(y, chunks=30)
    recorder = ChunkRecorder()
    with dask.config.set(scheduler="sync"), recorder:
        grid = to_grid(X, ydask, tmp_path / "g", row_chunk=row_chunk, blocks=3)
    # one computation per row chunk, each touching only rows of that chunk
    assert recorder.n_computes == -(-n // row_chunk)
    assert 0 < recorder.max_rows <= row_chunk
    assert grid.is_sparse == (chunk_kind != "dense")
    check_round_trip(grid, Xnp, y)


def test_dask_auto_blocks_detected_on_first_rows(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    Xnp, groups = one_hot(rng, 400, [3, 4, 5])
    # An impurity that only appears after the detection window: row 300
    # takes two values of the first variable.
    Xnp[300, :3] = [1.0, 1.0, 0.0]
    monkeypatch.setattr(grid_write, "DETECT_ROWS", 200)
    X = da.from_array(sp.csr_matrix(Xnp), chunks=(50, 12), asarray=False)
    grid = to_grid(X, np.zeros(400), tmp_path / "g", row_chunk=64)
    check_round_trip(grid, Xnp, np.zeros(400))
    # detected on the first 200 rows, where blocks were pure; purity is then
    # measured on every row while writing and reports the late conflict.
    pure, max_nnz = block_purity(Xnp, grid.blocks)
    assert grid.purity == pure
    assert grid.max_nnz_per_row == max_nnz
    assert not all(grid.purity)


def test_columns_unseen_in_the_detection_rows_get_a_block_of_their_own(tmp_path, monkeypatch):
    """A streamed input's columns without a value in the detection rows (a field's rare
    values) go to a last block of their own: in the colouring's first block, the most
    frequent field, the first of them to occur later made that block impure."""
    rng = np.random.default_rng(3)
    Xnp, groups = one_hot(rng, 400, [3, 4, 5])
    late = [2, 6, 11]  # one value of each field, taken only from row 250 on
    Xnp[:250] = 0.0
    for field in groups:  # the first 250 rows: every field's value among its others
        Xnp[np.arange(250), rng.choice([j for j in field if j not in late], 250)] = 1.0
    monkeypatch.setattr(grid_write, "DETECT_ROWS", 200)
    X = da.from_array(sp.csr_matrix(Xnp), chunks=(50, 12), asarray=False)
    grid = to_grid(X, np.zeros(400), tmp_path / "g", row_chunk=64)
    check_round_trip(grid, Xnp, np.zeros(400))
    assert sorted(grid.blocks[-1].tolist()) == late
    assert all(grid.purity[:-1])
    in_memory = to_grid(sp.csr_matrix(Xnp), np.zeros(400), tmp_path / "m", row_chunk=64)
    assert all(in_memory.purity)  # detected on every row: no block apart


def test_dask_unknown_chunks(tmp_path):
    X = da.from_array(np.ones((10, 3)), chunks=5)
    X = X[X[:, 0] > 0]  # unknown row chunk sizes
    with pytest.raises(ValueError, match=r"X has unknown chunk sizes .* X.compute_chunk_sizes"):
        to_grid(X, np.ones(10), tmp_path / "g", row_chunk=4)
    assert not (tmp_path / "g").exists()
    y = da.ones(20, chunks=5)
    y = y[y > 0]  # unknown chunk sizes, 20 values
    with pytest.raises(ValueError, match=r"y has unknown chunk sizes .* y.compute_chunk_sizes"):
        to_grid(np.ones((20, 3)), y, tmp_path / "g", row_chunk=4)
    assert not (tmp_path / "g").exists()


# ------------------------------------------------------------------ libsvm


def test_libsvm_round_trip(tmp_path):
    rng = np.random.default_rng(4)
    n, p = 97, 8
    X = sp.random(n, p, density=0.2, format="csr", random_state=6)
    D = X.toarray() * (np.arange(p) < p - 1)  # last feature never set
    D[3, p - 2] = 2.5
    X = sp.csr_matrix(D)
    y = rng.integers(0, 2, n) * 2.0 - 1
    f = tmp_path / "data.svm"
    dump_svmlight_file(X, y, str(f), zero_based=False, comment="generated")
    X_ref, y_ref = load_svmlight_file(str(f), zero_based=False)
    grid = to_grid(f, None, tmp_path / "g", row_chunk=25)
    assert grid.shape == X_ref.shape
    assert grid.is_sparse and grid.row_chunks == (25, 25, 25, 22)
    check_round_trip(grid, X_ref, y_ref)
    with pytest.raises(ValueError, match="y must be None"):
        to_grid(f, y, tmp_path / "g2", row_chunk=10)


def test_libsvm_a9a_detects_few_pure_blocks(tmp_path):
    if not A9A_TEST.exists():
        pytest.skip(f"{A9A_TEST} not available")
    grid = to_grid(A9A_TEST, None, tmp_path / "a9a", row_chunk=4096)
    X_ref, y_ref = load_svmlight_file(str(A9A_TEST), zero_based=False)
    assert grid.shape == X_ref.shape
    assert all(grid.purity)
    assert all(m == 1 for m in grid.max_nnz_per_row)
    assert len(grid.blocks) < 30
    np.testing.assert_array_equal(grid.y.compute(), y_ref)
    Xg = grid.X.compute()
    assert (abs(Xg - X_ref[:, grid.feature_order]) != 0).nnz == 0
    assert grid.nnz == X_ref.nnz


# -------------------------------------------------------------- partitions


def test_detect_pure_blocks_one_hot():
    rng = np.random.default_rng(5)
    sizes = [3, 4, 5, 6, 2]
    X, groups = one_hot(rng, 2000, sizes, missing=0.1)
    for data in (X, sp.csr_matrix(X), sp.csc_matrix(X)):
        blocks = detect_pure_blocks(data)
        validate_blocks(blocks, X.shape[1])
        pure, max_nnz = block_purity(data, blocks)
        assert all(pure) and max(max_nnz) == 1
        assert len(blocks) <= len(groups)
    # every cross-group pair co-occurs here, so the groups are recovered
    assert sorted(map(tuple, blocks)) == sorted(tuple(g) for g in groups)


def test_one_hot_fields_are_read_from_the_ranks_of_their_columns(monkeypatch):
    """A canonical CSR X whose every column holds one rank in its rows (one-hot fields, a
    value in each): its fields in one pass, in the greedy colouring's order, and the
    greedy colouring's own blocks where it separates the fields; where it puts a rare
    column in another field's block, the fields still. A missing value, an impure field
    or an explicit zero that shifts the ranks: the greedy colouring."""
    from dask_scd.datasets import make_onehot
    from dask_scd.grid import partition

    def greedy(X):
        with monkeypatch.context() as m:
            m.setattr(partition, "_fields_by_rank", lambda X: None)
            return detect_pure_blocks(X)

    X, _, fields = make_onehot(4000, 5, 20, random_state=0)  # frequent values: separated
    blocks = detect_pure_blocks(X)
    assert partition._fields_by_rank(X) is not None
    assert [b.tolist() for b in blocks] == [b.tolist() for b in greedy(X)]
    X, _, fields = make_onehot(2000, 4, [3, 1000, 1000, 4], random_state=1)
    blocks = detect_pure_blocks(X)
    used = np.bincount(X.indices, minlength=X.shape[1]) > 0
    assert sorted(tuple(b[used[b]]) for b in blocks) == sorted(tuple(f[used[f]]) for f in fields)
    coloured = sorted(tuple(b[used[b]]) for b in greedy(X))  # rare columns moved there
    assert coloured != sorted(tuple(f[used[f]]) for f in fields)
    assert all(block_purity(X, blocks)[0])
    validate_blocks(blocks, X.shape[1])
    # A row missing its first field's value: ranks shift, the colouring decides.
    lil = X.tolil()
    lil[0, int(fields[0][X[0].indices[0] - fields[0][0]])] = 0
    missing = sp.csr_matrix(lil)
    missing.eliminate_zeros()
    assert partition._fields_by_rank(missing) is None
    assert [b.tolist() for b in detect_pure_blocks(missing)] == [
        b.tolist() for b in greedy(missing)
    ]
    # An explicit zero is no value: the ranks skip it.
    explicit = X.copy()
    explicit.data[0] = 0.0
    assert partition._fields_by_rank(explicit) is None
    assert partition._fields_by_rank(sp.csc_matrix(X)) is None  # CSR only


def test_contiguous_pure_blocks_are_the_fewest_pure_ranges(rng):
    """Ranges of consecutive columns covering every column, each pure on every row, and
    no two neighbours mergeable (the fewest): one-hot fields with missing values are
    found exactly; explicit zeros do not count; any sparse format, X never modified."""
    from dask_scd.grid.partition import contiguous_pure_blocks

    sizes = [3, 4, 5, 6, 2]
    X, groups = one_hot(rng, 2000, sizes, missing=0.1)
    for data in (sp.csr_matrix(X), sp.csc_matrix(X), X):
        ranges = contiguous_pure_blocks(data)
        assert [r.tolist() for r in ranges] == [g.tolist() for g in groups]
    for seed in range(20):
        S = sp.random(60, 30, density=0.15, random_state=seed, format="csr")
        S.data[rng.random(S.nnz) < 0.2] = 0.0  # explicit zeros
        before = S.copy()
        ranges = contiguous_pure_blocks(S)
        assert np.array_equal(np.concatenate(ranges), np.arange(30))
        assert all(b.tolist() == list(range(b[0], b[-1] + 1)) for b in ranges)
        pure, _ = block_purity(S, ranges)
        assert all(pure)
        for left, right in zip(ranges[:-1], ranges[1:]):  # the fewest: no merge is pure
            assert not block_purity(S, [np.concatenate((left, right))])[0][0]
        assert (S != before).nnz == 0 and np.array_equal(S.data, before.data)


def test_detect_pure_blocks_dense_columns_and_limits():
    rng = np.random.default_rng(6)
    X, _ = one_hot(rng, 300, [4, 4])
    dense = rng.normal(size=(300, 2)) + 10.0  # never zero
    X = np.hstack([X, dense, np.zeros((300, 1))])
    blocks = detect_pure_blocks(X)
    singles = [b.tolist() for b in blocks if len(b) == 1]
    assert [8] in singles and [9] in singles  # dense columns stay alone
    assert all(block_purity(X, blocks)[0])
    blocks = detect_pure_blocks(X, max_block_size=2)
    assert max(len(b) for b in blocks) <= 2
    validate_blocks(blocks, X.shape[1])


def test_set_valued_group_impure_when_forced(tmp_path):
    rng = np.random.default_rng(7)
    X, groups = one_hot(rng, 200, [3, 4])
    tags = (rng.random((200, 3)) < 0.5).astype(float)  # multi-valued variable
    tags[0] = 1.0  # at least one row carries all three tags
    X = np.hstack([X, tags])
    user_blocks = groups + [np.arange(7, 10)]
    grid = to_grid(
        sp.csr_matrix(X), np.zeros(200), tmp_path / "g", row_chunk=64, blocks=user_blocks
    )
    assert grid.purity == [True, True, False]
    assert grid.max_nnz_per_row == [1, 1, 3]
    # automatic detection splits the tags into pure blocks instead
    auto = to_grid(sp.csr_matrix(X), np.zeros(200), tmp_path / "auto", row_chunk=64)
    assert all(auto.purity)


def test_validate_blocks_errors():
    with pytest.raises(ValueError, match="feature 2 is missing"):
        validate_blocks([[0, 1], [3]], 4)
    with pytest.raises(ValueError, match="feature 1 is repeated"):
        validate_blocks([[0, 1], [1, 2, 3]], 4)
    with pytest.raises(ValueError, match="feature 0 is repeated"):
        validate_blocks([[0, 0, 1, 2, 3]], 4)
    with pytest.raises(ValueError, match="feature 7 .* out of range"):
        validate_blocks([[0, 1, 2, 3, 7]], 4)
    out = validate_blocks([np.array([3, 1], dtype=np.int32), [0, 2]], 4)
    assert [b.dtype for b in out] == [np.int64, np.int64]


def test_to_grid_rejects_bad_user_blocks(tmp_path):
    X = np.ones((5, 4))
    with pytest.raises(ValueError, match="feature 3 is missing"):
        to_grid(X, np.ones(5), tmp_path / "g", row_chunk=2, blocks=[[0, 1], [2]])
    assert not (tmp_path / "g").exists()


def test_blocks_from_names(tmp_path):
    names = ["age", "color=red", "size=S", "color=blue", "size=M", "color=green", "income"]
    blocks = blocks_from_names(names)
    assert [b.tolist() for b in blocks] == [[0], [1, 3, 5], [2, 4], [6]]
    rng = np.random.default_rng(8)
    X = rng.normal(size=(10, 7))
    grid = to_grid(X, np.ones(10), tmp_path / "g", row_chunk=4, blocks="names", feature_names=names)
    assert [b.tolist() for b in grid.blocks] == [[0], [1, 3, 5], [2, 4], [6]]
    assert grid.feature_names == names
    with pytest.raises(ValueError, match="feature_names"):
        to_grid(X, np.ones(10), tmp_path / "h", row_chunk=4, blocks="names")


# ------------------------------------------------------------- validation


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_rejected(tmp_path, bad):
    X = np.ones((10, 3))
    X[7, 1] = bad
    with pytest.raises(ValueError, match=r"X contains NaN .* row chunk 2"):
        to_grid(X, np.ones(10), tmp_path / "g", row_chunk=3)
    y = np.ones(10)
    y[4] = bad
    with pytest.raises(ValueError, match=r"y contains NaN .* row chunk 1"):
        to_grid(sp.csr_matrix(np.ones((10, 3))), y, tmp_path / "g", row_chunk=3)
    assert os.listdir(tmp_path) == []


def test_non_finite_in_dask_stream_leaves_nothing(tmp_path):
    Xnp = np.ones((40, 3))
    Xnp[35, 0] = np.nan
    X = da.from_array(Xnp, chunks=10)
    with pytest.raises(ValueError, match=r"X contains NaN .* row chunk 3"):
        to_grid(X, np.ones(40), tmp_path / "g", row_chunk=10, blocks=1)
    assert os.listdir(tmp_path) == []


def test_input_validation(tmp_path):
    X = np.ones((6, 2))
    with pytest.raises(ValueError, match="6 rows but y has length 5"):
        to_grid(X, np.ones(5), tmp_path / "g", row_chunk=2)
    with pytest.raises(ValueError, match="2-D"):
        to_grid(np.ones(6), np.ones(6), tmp_path / "g", row_chunk=2)
    with pytest.raises(ValueError, match="numeric"):
        to_grid(np.array([["a", "b"]] * 6), np.ones(6), tmp_path / "g", row_chunk=2)
    for rc in (0, -3, 2.5, "4", True):
        with pytest.raises(ValueError, match="row_chunk"):
            to_grid(X, np.ones(6), tmp_path / "g", row_chunk=rc)
    with pytest.raises(ValueError, match="feature_names has 3"):
        to_grid(X, np.ones(6), tmp_path / "g", row_chunk=2, feature_names=["a", "b", "c"])
    assert os.listdir(tmp_path) == []


def test_exists_and_overwrite(tmp_path):
    X = np.ones((6, 2))
    to_grid(X, np.ones(6), tmp_path / "g", row_chunk=4)
    with pytest.raises(FileExistsError):
        to_grid(X, np.ones(6), tmp_path / "g", row_chunk=4)
    grid = to_grid(2 * X, np.zeros(6), tmp_path / "g", row_chunk=4, overwrite=True)
    np.testing.assert_array_equal(grid.X.compute(), 2 * X)
    assert sorted(os.listdir(tmp_path)) == ["g"]  # no leftover .old / .tmp dirs


# -------------------------------------------------------------- atomicity


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    calls = []
    original = grid_write._GridWriter.write_cell

    def failing(self, r, b, cell):
        if calls:
            raise RuntimeError("simulated crash")
        calls.append((r, b))
        original(self, r, b, cell)

    monkeypatch.setattr(grid_write._GridWriter, "write_cell", failing)
    X = sp.random(30, 6, density=0.5, format="csr", random_state=0)
    with pytest.raises(RuntimeError, match="simulated crash"):
        to_grid(X, np.ones(30), tmp_path / "g", row_chunk=10, blocks=2)
    assert calls == [(0, 0)]
    assert os.listdir(tmp_path) == []
    with pytest.raises(FileNotFoundError):
        open_grid(tmp_path / "g")


def test_interrupted_overwrite_keeps_old_grid(tmp_path, monkeypatch):
    to_grid(np.ones((6, 2)), np.ones(6), tmp_path / "g", row_chunk=4)

    def failing(self, attrs, cell_nnz):
        raise KeyboardInterrupt

    monkeypatch.setattr(grid_write._GridWriter, "write_attrs", failing)
    with pytest.raises(KeyboardInterrupt):
        to_grid(np.zeros((6, 2)), np.ones(6), tmp_path / "g", row_chunk=4, overwrite=True)
    assert os.listdir(tmp_path) == ["g"]
    np.testing.assert_array_equal(open_grid(tmp_path / "g").X.compute(), np.ones((6, 2)))


def test_open_grid_refuses_incomplete_or_unknown(tmp_path):
    import zarr

    to_grid(np.ones((6, 2)), np.ones(6), tmp_path / "g", row_chunk=4)
    group = zarr.open_group(tmp_path / "g", mode="r+")
    group.attrs["complete"] = False
    with pytest.raises(ValueError, match="incomplete"):
        open_grid(tmp_path / "g")
    group.attrs.update({"complete": True, "format_version": 99})
    with pytest.raises(ValueError, match="unsupported grid format version"):
        open_grid(tmp_path / "g")
    zarr.open_group(tmp_path / "other", mode="w")
    with pytest.raises(ValueError, match="not a dask_scd.grid store"):
        open_grid(tmp_path / "other")


# -------------------------------------------------------------- corruption


def _chunk_file(root: Path, grid, r, b):
    if grid.is_sparse:
        return root / "X" / f"block_{b}" / f"cell_{r}" / "c" / "0"
    return root / "X" / f"block_{b}" / "c" / str(r) / "0"


@pytest.mark.parametrize("sparse_input", [False, True])
@pytest.mark.parametrize("damage", ["delete", "garble"])
def test_corrupt_chunk_names_the_cell(tmp_path, sparse_input, damage):
    rng = np.random.default_rng(9)
    X = rng.normal(size=(40, 6))
    if sparse_input:
        X = sp.csr_matrix(np.where(rng.random((40, 6)) < 0.5, X, 0.0))
    root = tmp_path / "g"
    grid = to_grid(X, np.ones(40), root, row_chunk=10, blocks=2)
    chunk = _chunk_file(root, grid, 2, 1)
    assert chunk.is_file()
    if damage == "delete":
        chunk.unlink()
    else:
        raw = bytearray(chunk.read_bytes())
        for i in range(len(raw) // 3, len(raw)):
            raw[i] ^= 0x5A
        chunk.write_bytes(bytes(raw))
    pattern = rf"cell \(row chunk 2, block 1\) of grid {root}"
    with pytest.raises(GridCorruptionError, match=pattern):
        grid.read_cell(2, 1)
    with pytest.raises(GridCorruptionError, match=pattern):
        with dask.config.set(scheduler="threads"):
            dense_of(grid)
    grid.read_cell(1, 1)  # other cells remain readable
    grid.read_cell(2, 0)
    assert issubclass(GridCorruptionError, ValueError)


@pytest.mark.parametrize("damage", ["truncate", "garble", "swap"])
def test_damage_found_after_cells_were_decoded_directly(tmp_path, damage):
    """Sparse cells are decoded from their zstd frames once one was found stored so: a
    damaged cell read after that is still refused with its name, and an intact one gives
    zarr's bytes."""
    import zarr

    rng = np.random.default_rng(4)
    X = sp.csr_matrix(np.where(rng.random((60, 8)) < 0.4, rng.normal(size=(60, 8)), 0.0))
    root = tmp_path / "g"
    grid = to_grid(X, np.ones(60), root, row_chunk=10, blocks=2)
    first = grid.read_cell(0, 0)  # finds the frames; the next reads skip zarr
    through_zarr = np.asarray(zarr.open_array(root / "X" / "block_0" / "cell_0", mode="r")[:])
    assert first.nnz > 0 and through_zarr.size > 0
    np.testing.assert_array_equal(
        grid.read_cell(1, 0).toarray(), X[10:20][:, grid.blocks[0]].toarray()
    )
    chunk = _chunk_file(root, grid, 3, 1)
    raw = chunk.read_bytes()
    if damage == "truncate":
        chunk.write_bytes(raw[: len(raw) // 2])
    elif damage == "garble":
        chunk.write_bytes(raw[:8] + bytes(b ^ 0x5A for b in raw[8:]))
    else:  # another cell's intact frame in its place
        chunk.write_bytes(_chunk_file(root, grid, 4, 1).read_bytes())
    with pytest.raises(GridCorruptionError, match=r"cell \(row chunk 3, block 1\)"):
        grid.read_cell(3, 1)
    np.testing.assert_array_equal(
        grid.read_cell(5, 1).toarray(), X[50:60][:, grid.blocks[1]].toarray()
    )


@pytest.mark.parametrize("layout", ["dense", "sparse"])
@pytest.mark.parametrize("damage", ["swap", "garble", "truncate"])
def test_cell_damaged_after_it_was_checked(tmp_path, layout, damage):
    """A cell read again whose frame ends with the content checksum it had when it was
    checked is not checked again (out of core a cell is read every pass): one damaged
    after that read (another cell's intact frame in its place, garbled, truncated) is
    still refused with its name. The sparse cells are one-hot: another row chunk's
    cell holds as many entries, so only its checksum tells it."""
    root = tmp_path / "g"
    if layout == "dense":
        X = np.random.default_rng(5).normal(size=(60, 8))
        grid = to_grid(X, np.ones(60), root, row_chunk=10, blocks=2)
        want = X[30:40][:, grid.blocks[1]]
    else:
        from dask_scd.datasets import make_onehot

        X, y = make_onehot(60, 2, 4, random_state=3)[:2]
        grid = to_grid(X, y, root, row_chunk=10, blocks=[np.arange(4), np.arange(4, 8)])
        want = X[30:40][:, grid.blocks[1]].toarray()

    def read():
        cell = grid.read_cell(3, 1)
        return cell if layout == "dense" else cell.toarray()

    for _ in range(2):  # checked, then recognized
        np.testing.assert_array_equal(read(), want)
    chunk = _chunk_file(root, grid, 3, 1)
    raw = chunk.read_bytes()
    if damage == "swap":
        other = _chunk_file(root, grid, 4, 1).read_bytes()
        assert other != raw
        if layout == "sparse":
            assert grid.cell_nnz[3, 1] == grid.cell_nnz[4, 1]
        chunk.write_bytes(other)
    elif damage == "garble":
        chunk.write_bytes(raw[:8] + bytes(b ^ 0x5A for b in raw[8:]))
    else:
        chunk.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(GridCorruptionError, match=r"cell \(row chunk 3, block 1\)"):
        grid.read_cell(3, 1)
    chunk.write_bytes(raw)  # put back: recognized again
    np.testing.assert_array_equal(read(), want)


def test_missing_labels_chunk(tmp_path):
    grid = to_grid(np.ones((20, 2)), np.ones(20), tmp_path / "g", row_chunk=5)
    (tmp_path / "g" / "y" / "c" / "3").unlink()
    with pytest.raises(GridCorruptionError, match="labels of row chunk 3"):
        grid.y.compute()


def test_shape_mismatch_detected(tmp_path):
    import zarr

    grid = to_grid(np.ones((20, 4)), np.ones(20), tmp_path / "g", row_chunk=5, blocks=2)
    group = zarr.open_group(tmp_path / "g", mode="r+")
    group.create_array("X/block_1", shape=(20, 3), chunks=(5, 3), dtype="float64", overwrite=True)[
        :
    ] = 1.0
    reopened = open_grid(tmp_path / "g")
    with pytest.raises(GridCorruptionError, match=r"cell \(row chunk 0, block 1\).*shape"):
        reopened.read_cell(0, 1)
    assert grid.read_cell(0, 0).shape == (5, 2)


def test_pandas_feature_names(tmp_path):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": [1.0, 0.0, 2.0], "b=x": [0.0, 1.0, 0.0], "b=y": [1.0, 0.0, 1.0]})
    grid = to_grid(df, [1, 2, 3], tmp_path / "g", row_chunk=2, blocks="names")
    assert grid.feature_names == ["a", "b=x", "b=y"]
    assert [b.tolist() for b in grid.blocks] == [[0], [1, 2]]
    check_round_trip(grid, df.to_numpy(), [1, 2, 3])


# ------------------------------------------------------------------ xarray


def test_xarray_dataarray(tmp_path):
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(10)
    values = rng.normal(size=(25, 4))
    arr = xr.DataArray(values, dims=("sample", "feature"), coords={"feature": ["a", "b", "c", "d"]})
    y = rng.normal(size=25)
    grid = to_grid(arr, y, tmp_path / "g", row_chunk=10, blocks=2)
    assert grid.feature_names == ["a", "b", "c", "d"]
    check_round_trip(grid, values, y)
    # dask-backed DataArray goes through the streamed path
    grid2 = to_grid(
        arr.chunk({"sample": 7}),
        xr.DataArray(y, dims="sample"),
        tmp_path / "g2",
        row_chunk=10,
        blocks=2,
    )
    check_round_trip(grid2, values, y)


def test_a_zarr_store_written_by_xarray_points_to_open_zarr(tmp_path):
    """A path to xarray's zarr store is not a grid: the error says how to use it."""
    xr = pytest.importorskip("xarray")
    import dask_scd

    rng = np.random.default_rng(12)
    ds = xr.Dataset(
        {"X": (("row", "f"), rng.normal(size=(20, 3))), "y": ("row", rng.normal(size=20))}
    )
    ds.to_zarr(tmp_path / "s.zarr")
    with pytest.raises(ValueError, match=r"format=None\): .*xr\.open_zarr.*to_grid"):
        dask_scd.fit(str(tmp_path / "s.zarr"))
    opened = xr.open_zarr(tmp_path / "s.zarr")  # as the message says
    fitted = dask_scd.fit(opened, "y", alpha=0.1)
    assert fitted.coef_.shape == (3,) and np.isfinite(fitted.dual_gap_)


def test_xarray_dataset(tmp_path):
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(11)
    n = 30
    color = np.zeros((n, 3))
    color[np.arange(n), rng.integers(0, 3, n)] = 1.0
    ds = xr.Dataset(
        {
            "age": ("sample", rng.normal(size=n)),
            "color": (("sample", "color_value"), color),
            "target": ("sample", rng.normal(size=n)),
        },
        coords={"color_value": ["red", "green", "blue"]},
    )
    grid = to_grid(ds, "target", tmp_path / "g", row_chunk=8)
    assert [b.tolist() for b in grid.blocks] == [[0], [1, 2, 3]]
    assert grid.feature_names == ["age", "color=red", "color=green", "color=blue"]
    assert grid.purity == [True, True]
    X = np.column_stack([ds["age"].values, color])
    check_round_trip(grid, X, ds["target"].values)
    detected = to_grid(ds, "target", tmp_path / "d", row_chunk=8, blocks="detect")
    assert all(detected.purity)
    check_round_trip(detected, X, ds["target"].values)


def test_an_old_handle_after_the_store_is_rewritten(tmp_path):
    """A Grid opened before ``to_grid(..., overwrite=True)`` says the store changed, in a
    read, a fit or a dask computation (not an error about cell shapes); open it again."""
    import dask_scd

    rng = np.random.default_rng(0)
    path = tmp_path / "g.zarr"
    old = to_grid(rng.normal(size=(100, 4)), rng.normal(size=100), path, row_chunk=50)
    dask_scd.fit(old, alpha=0.1)  # its cells have been read in this process
    to_grid(rng.normal(size=(80, 6)), rng.normal(size=80), path, row_chunk=40, overwrite=True)
    for use in (
        lambda: old.read_cell(0, 0),
        lambda: dask_scd.fit(old, alpha=0.1),
        lambda: old.X.compute(),
    ):
        with pytest.raises(GridCorruptionError, match="changed since it was opened"):
            use()
    assert open_grid(path).shape == (80, 6)
    assert dask_scd.fit(open_grid(path), alpha=0.1).coef_.shape == (6,)


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_grid_source_materializes_the_original_columns(tmp_path, kind):
    """A grid fitted in memory is read back in the user's feature order (blocks that
    reorder the columns included), with its labels, without a cluster."""
    from dask_scd.data.sources import make_source

    rng = np.random.default_rng(0)
    X = rng.normal(size=(70, 9)) * (rng.random((70, 9)) < 0.4)
    y = np.where(rng.random(70) < 0.5, -1.0, 1.0)
    data = sp.csr_matrix(X) if kind == "sparse" else X
    blocks = [[4, 0, 7], [1, 8], [2, 3, 5, 6]]
    grid = to_grid(data, y, tmp_path / "g.zarr", row_chunk=16, blocks=blocks)
    Xm, ym = make_source(grid, None, "logistic", None).materialize()
    got = Xm.toarray() if sp.issparse(Xm) else Xm
    np.testing.assert_array_equal(got, X)
    np.testing.assert_array_equal(ym, y)


@pytest.mark.parametrize("into", [0, 1])
def test_dense_chunk_of_another_length_is_refused(tmp_path, into):
    # A dense chunk is decoded straight into the cell: a frame with more values than a
    # chunk, or fewer, is refused (not cut, not left partly unwritten).
    rng = np.random.default_rng(5)
    root = tmp_path / "g"
    grid = to_grid(
        rng.normal(size=(40, 5)), np.ones(40), root, row_chunk=10, blocks=[[0, 1, 2], [3, 4]]
    )
    wide, narrow = _chunk_file(root, grid, 1, 0), _chunk_file(root, grid, 1, 1)
    target, source = (wide, narrow) if into == 0 else (narrow, wide)
    target.write_bytes(source.read_bytes())
    with pytest.raises(GridCorruptionError, match=rf"cell \(row chunk 1, block {into}\)"):
        grid.read_cell(1, into)
    grid.read_cell(2, into)


def test_pure_block_pattern_from_csr_equals_the_general_one():
    """The counting-sort transpose of a canonical CSR matrix gives the CSC pattern of its
    non-zeros (explicit zeros left out) that the general conversion gives, and the same
    pure blocks as the dense array."""
    import scipy.sparse as sp

    from dask_scd.grid import partition

    rng = np.random.default_rng(0)
    for seed in range(10):
        X = sp.random(300, 40, density=0.1, random_state=seed, format="csr")
        X.data[rng.random(X.nnz) < 0.2] = 0.0  # explicit zeros do not count
        general = sp.csc_matrix(X != 0)
        general.sort_indices()
        indptr, indices, shape = partition._nonzero_pattern_csc(X)
        assert shape == X.shape
        np.testing.assert_array_equal(indptr, general.indptr)
        np.testing.assert_array_equal(indices, general.indices)
        blocks = partition.detect_pure_blocks(X)
        assert [b.tolist() for b in blocks] == [
            b.tolist() for b in partition.detect_pure_blocks(X.toarray())
        ]


def test_a_worker_s_reader_keeps_none_of_the_column_lists(tmp_path):
    """Every worker opens a store's reader: it keeps the blocks' sizes, not their column
    lists (a 600k-column store's held ~50 MiB in each worker), nor zarr's group; cells
    and labels read through it as through the grid."""
    from dask_scd.grid import read as grid_read

    rng = np.random.default_rng(0)
    X = sp.random(40, 30, density=0.2, random_state=1, format="csr")
    y = np.sign(rng.standard_normal(40))
    grid = to_grid(
        X,
        y,
        tmp_path / "g",
        row_chunk=16,
        blocks=[np.arange(k, min(k + 8, 30)) for k in range(0, 30, 8)],
    )
    reader = grid_read._reader(grid.path, grid.grid_id)
    assert not any(k in reader.attrs for k in ("blocks", "feature_names", "feature_order"))
    assert not hasattr(reader, "group")
    assert reader.sizes == [len(b) for b in grid.blocks]
    got = sp.hstack([reader.read_cell(1, b) for b in range(len(grid.blocks))]).toarray()
    np.testing.assert_array_equal(got, X[16:32][:, np.concatenate(grid.blocks)].toarray())
    np.testing.assert_array_equal(reader.read_labels(2), y[32:])


@pytest.mark.parametrize("sparse_", [True, False])
def test_a_cell_read_into_reused_buffers_equals_a_fresh_read(tmp_path, sparse_):
    """Cells read only to be made into something else (a pure cell's by-rows form) are
    decoded into one reused memory: the same values as a fresh read, checked the same
    (a frame that decodes short is refused, not read with stale bytes after it), and the
    by-rows form made from them owns its arrays."""
    from dask_scd.data import cells
    from dask_scd.grid import read as grid_read
    from dask_scd.grid.read import CellBuffers, SparseParts

    rng = np.random.default_rng(3)
    X = sp.random(60, 12, density=0.3, random_state=4, format="csr")
    if not sparse_:
        X = X.toarray()
    y = np.sign(rng.standard_normal(60))
    grid = to_grid(X, y, tmp_path / "g", row_chunk=25, blocks=[np.arange(6), np.arange(6, 12)])
    reader = grid_read._reader(grid.path, grid.grid_id)
    buffers = CellBuffers()
    for r in range(grid.n_row_chunks):
        for b in range(2):
            fresh = reader.read_cell(r, b)
            got = reader.read_cell(r, b, buffers, parts=True)
            if sparse_:
                assert isinstance(got, SparseParts)
                assert np.shares_memory(got.data, buffers._values)
                got = sp.csc_matrix(got[:3], shape=got.shape)
                np.testing.assert_array_equal(got.toarray(), fresh.toarray())
            else:
                np.testing.assert_array_equal(got, fresh)
    if sparse_:
        # a one-hot cell by rows, read through the reused memory, owns its arrays
        onehot = sp.csr_matrix((np.ones(60), rng.integers(0, 5, 60), np.arange(61)), shape=(60, 5))
        g2 = to_grid(onehot, y, tmp_path / "h", row_chunk=25, blocks=[np.arange(5)])
        found = cells.pure_rows(cells.CellRef(g2.path, g2.grid_id, 1, 0, g2.store_version))
        assert found.value.size == 0  # one-hot: no values kept
        np.testing.assert_array_equal(found.column, onehot[25:50].indices)
        assert not np.shares_memory(found.column, cells._read_buffers()._values)
        np.testing.assert_array_equal(found.cube, np.bincount(onehot[25:50].indices, minlength=5))
        # a frame decoding to fewer bytes than the cell's: refused
        short = grid_read._ZSTD.encode(np.zeros(10, np.uint8))
        path = reader._chunk_path("X/block_0/cell_0", "c/0")
        with open(path, "wb") as f:
            f.write(short)
        reader._verified_frames.clear()
        with pytest.raises(GridCorruptionError, match=r"row chunk 0, block 0"):
            reader.read_cell(0, 0, buffers, parts=True)
