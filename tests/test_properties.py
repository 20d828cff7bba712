"""The contract of the public entry points over generated inputs, good and bad.

fit, to_grid and open_grid either give a correct result or raise one exception of a
documented type whose message names the faulty argument; they never raise another type,
and never touch a file outside the target path.
"""

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd.grid import GridCorruptionError, open_grid, to_grid
from dask_scd.objectives import CLASSIFICATION_LOSSES

# Bounded so the three stay well under a minute; PROPERTY_EXAMPLES=1000 explores further.
PROPERTY = settings(
    max_examples=int(os.environ.get("PROPERTY_EXAMPLES", 60)),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

CONTAINERS = [
    "numpy",
    "list",
    "csr",
    "csc",
    "coo",
    "lil",
    "dok",
    "bsr",
    "dia",
    "csr_array",
    "pydata",
    "pandas",
    "pandas_nullable",
    "xarray",
    "xarray_transposed",
    "dask",
]

# defect → (how it is made, the words the error must name)
X_DEFECTS = {
    "X_nan": "X",
    "X_inf": "X",
    "X_no_rows": "X",
    "X_no_columns": "X",
    "X_1d": "X",
    "X_3d": "X",
    "X_object": "X",
    "X_complex": "X",
    "X_strings": "X",
}
Y_DEFECTS = {
    "y_short": "y",
    "y_none_value": "y",
    "y_nan": "y",
    "y_2d": "y",
    "y_missing": "y",
    "y_one_class": "y",
    "y_three_classes": "y",
    "y_huge": "y",
}
ARG_DEFECTS = {
    "alpha": ("alpha", [0.0, -1.0, np.nan, np.inf, "1", None]),
    "l1_ratio": ("l1_ratio", [-0.1, 1.5, "a", None]),
    "tol": ("tol", [0.0, -1e-3, "x", None]),
    "max_iter": ("max_iter", [0, -5, 2.5, "10", None]),
    "fit_intercept": ("fit_intercept", ["no", 1, None, "True"]),
    "loss": ("loss", ["ridge", "", None, 3]),
    "penalty": ("penalty", ["l3", None, "L1"]),
    "solver": ("solver", ["newtonian", None, "block_scd"]),
}


def _container(X, kind):
    """X (a float64 numpy array) in another container; the float64 array stays the truth."""
    if kind == "numpy":
        return X
    if kind == "list":
        return X.tolist()
    if kind in ("csr", "csc", "coo", "lil", "dok", "bsr", "dia"):
        return sp.csr_matrix(X).asformat(kind)
    if kind == "csr_array":
        return sp.csr_array(X)
    if kind == "pydata":
        sparse = pytest.importorskip("sparse")
        return sparse.COO.from_numpy(X)
    if kind in ("pandas", "pandas_nullable"):
        pd = pytest.importorskip("pandas")
        frame = pd.DataFrame(X, columns=[f"f{j}" for j in range(X.shape[1])])
        return frame.astype("Float64") if kind == "pandas_nullable" else frame
    if kind == "xarray":
        xr = pytest.importorskip("xarray")
        return xr.DataArray(X, dims=("sample", "feature"))
    if kind == "xarray_transposed":
        xr = pytest.importorskip("xarray")
        return xr.DataArray(X.T, dims=("feature", "sample"))
    if kind == "dask":
        return da.from_array(X, chunks=(max(1, X.shape[0] // 2), max(1, X.shape[1])))
    raise AssertionError(kind)


@st.composite
def fit_cases(draw):
    n = draw(st.integers(3, 14))
    p = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    loss = draw(st.sampled_from(["squared", "logistic", "hinge", "squared_hinge"]))
    penalty = "l2" if loss == "hinge" else draw(st.sampled_from(["l2", "l1", "elasticnet"]))
    X = rng.normal(size=(n, p))
    if loss in CLASSIFICATION_LOSSES:
        labels = draw(st.sampled_from([(-1, 1), (0, 1), ("cat", "dog"), (2.5, 7.0)]))
        y = np.array(
            [labels[i % 2] for i in range(n)], dtype=object if isinstance(labels[0], str) else None
        )
        rng.shuffle(y)
    else:
        y = X @ rng.normal(size=p) + 0.1 * rng.normal(size=n)
    defect = draw(st.sampled_from([None, None, None, *X_DEFECTS, *Y_DEFECTS, *ARG_DEFECTS]))
    container = draw(st.sampled_from(CONTAINERS))
    kwargs = dict(loss=loss, penalty=penalty, alpha=0.1, tol=1e-9, max_iter=5000, random_state=0)
    if defect in ARG_DEFECTS:
        name, values = ARG_DEFECTS[defect]
        kwargs[name] = draw(st.sampled_from(values))
    return X, y, container, defect, kwargs, rng


def _spoil_X(X, defect, rng):
    n, p = X.shape
    X = X.copy()
    if defect == "X_nan":
        X[rng.integers(n), rng.integers(p)] = np.nan
    elif defect == "X_inf":
        X[rng.integers(n), rng.integers(p)] = -np.inf
    elif defect == "X_no_rows":
        X = X[:0]
    elif defect == "X_no_columns":
        X = X[:, :0]
    return X


def _spoil_X_late(Xc, defect):
    """Defects that replace the container itself."""
    if defect == "X_1d":
        return np.zeros(5)
    if defect == "X_3d":
        return np.zeros((4, 2, 2))
    if defect == "X_object":
        out = np.empty((4, 2), dtype=object)
        out[:] = None
        return out
    if defect == "X_complex":
        return np.ones((4, 2)) * 1j
    if defect == "X_strings":
        return np.array([["a", "b"]] * 4)
    return Xc


def _spoil_y(y, defect, loss):
    n = len(y)
    if defect == "y_short":
        return y[:-1]
    if defect == "y_none_value":
        y = y.astype(object)
        y[n // 2] = None
        return y
    if defect == "y_nan":
        y = y.astype(object) if y.dtype == object else y.astype(float)
        y[0] = np.nan
        return y
    if defect == "y_2d":
        return np.column_stack([y, y])
    if defect == "y_missing":
        return None
    if defect == "y_one_class":
        return np.full(n, y[0]) if loss in CLASSIFICATION_LOSSES else np.full(n, "a")
    if defect == "y_three_classes":
        if loss not in CLASSIFICATION_LOSSES:
            return np.array(["a", "b", "c"] * n)[:n]
        return np.arange(n) % 3
    if defect == "y_huge":
        if loss not in CLASSIFICATION_LOSSES:
            return np.asarray(y, dtype=float) * 1e200
        return np.array([1e200, -1e200] * n)[:n]  # harmless for a classifier: only names
    return y


def _expected_words(defect, kwargs):
    if defect in X_DEFECTS:
        return ["X"]
    if defect in Y_DEFECTS:
        if defect == "y_huge" and kwargs["loss"] in CLASSIFICATION_LOSSES:
            return None
        return ["y"]
    if defect in ARG_DEFECTS:
        name = ARG_DEFECTS[defect][0]
        value = kwargs[name]
        if name == "solver" and value == "block_scd":
            return ["block_scd"]
        if name == "l1_ratio" and kwargs["penalty"] != "elasticnet":
            return ["l1_ratio"]  # checked whatever the penalty: a bad value is refused
        if name == "penalty" and value in ("l3", "L1", None):
            return ["penalty"]
        return [name]
    return None


@PROPERTY
@given(fit_cases())
def test_fit_gives_a_certified_model_or_names_the_bad_argument(case):
    X, y, container, defect, kwargs, rng = case
    X_numeric = _spoil_X(X, defect, rng)
    if defect in ("X_no_rows",):
        y = y[:0]
    Xc = _container(X_numeric, container) if X_numeric.size else X_numeric
    Xc = _spoil_X_late(Xc, defect)
    yc = _spoil_y(y, defect, kwargs["loss"])
    expected = _expected_words(defect, kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        try:
            result = dask_scd.fit(Xc, yc, **kwargs)
        except (ValueError, TypeError) as exc:
            assert expected is not None, f"{container}/{defect}: unexpected {exc!r}"
            message = str(exc)
            assert any(word in message for word in expected), (defect, message)
            return
    assert expected is None, f"{container}/{defect}: no error raised"
    # The model is certified: its gap, recomputed here from the data, is ≤ tol.
    assert result.coef_.shape == (X.shape[1],)
    problem = dask_scd.Problem(
        loss=kwargs["loss"], alpha=0.1, l1_ratio=result.l1_ratio, fit_intercept=True
    )
    labels = np.asarray(yc)
    if result.classes_ is not None:
        labels = np.where(labels == result.classes_[1], 1.0, -1.0)
    cert = dask_scd.certificate(problem, X, labels.astype(float), result.coef_, result.intercept_)
    assert result.converged_
    assert cert.primal == pytest.approx(result.primal_, rel=1e-9)
    if kwargs["loss"] != "hinge":
        assert cert.relative_gap <= 1e-8
    else:  # the hinge's certificate needs SDCA's dual variables: compare with numpy X
        reference = dask_scd.fit(X, labels.astype(float), **kwargs)
        assert result.primal_ == pytest.approx(reference.primal_, rel=1e-8)


# ------------------------------------------------------------------ to_grid


def _tree(root: Path) -> dict:
    """Every file and directory under root with its size and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            stat = full.lstat()
            out[str(full.relative_to(root))] = (stat.st_size, stat.st_mtime_ns, full.is_dir())
    return out


def _outside(tree: dict, target: str) -> dict:
    return {
        k: v
        for k, v in tree.items()
        if not (
            k == target
            or k.startswith(target + os.sep)
            or k.startswith(target + ".tmp-")
            or k.startswith(target + ".old-")
        )
    }


PLACES = [
    "absent",
    "grid",
    "grid_overwrite",
    "folder_with_file",
    "folder_overwrite",
    "file",
    "file_overwrite",
    "empty_folder",
    "parent_is_file",
]


@st.composite
def grid_cases(draw):
    n = draw(st.integers(1, 12))
    p = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    X = rng.normal(size=(n, p)) * (rng.random((n, p)) < 0.6)
    y = rng.normal(size=n)
    container = draw(st.sampled_from([c for c in CONTAINERS if c != "list"] + ["libsvm"]))
    defect = draw(
        st.sampled_from(
            [
                None,
                None,
                None,
                "X_nan",
                "X_inf",
                "X_no_rows",
                "X_1d",
                "X_strings",
                "y_short",
                "y_nan",
                "y_missing",
                "y_strings",
                "row_chunk",
                "blocks",
                "sample_dim",
                "feature_names",
            ]
        )
    )
    place = draw(st.sampled_from(PLACES))
    row_chunk = draw(st.sampled_from([1, 2, 5, 10**9]))
    bad_row_chunk = draw(st.sampled_from([0, -1, 2.5, "4", True, None]))
    bad_blocks = draw(st.sampled_from(["colours", [[0]] if p > 1 else [[0, 0]], [[0, p]], 0, [[]]]))
    return X, y, container, defect, place, row_chunk, bad_row_chunk, bad_blocks


def _prepare_place(root: Path, place: str) -> Path:
    target = root / "target.zarr"
    if place.startswith("grid"):
        to_grid(np.ones((3, 2)), np.zeros(3), target, row_chunk=2)
    elif place.startswith("folder"):
        target.mkdir()
        (target / "notes.csv").write_text("a,b\n")
    elif place.startswith("file"):
        target.write_text("not a grid")
    elif place == "empty_folder":
        target.mkdir()
    elif place == "parent_is_file":
        (root / "parent").write_text("a file")
        target = root / "parent" / "target.zarr"
    return target


GRID_DEFECT_WORDS = {
    "X_nan": ["X"],
    "X_inf": ["X"],
    "X_no_rows": ["X"],
    "X_1d": ["X"],
    "X_strings": ["X"],
    "y_short": ["y"],
    "y_nan": ["y"],
    "y_missing": ["y"],
    "y_strings": ["y"],
    "row_chunk": ["row_chunk"],
    "blocks": ["block", "feature"],
    "sample_dim": ["sample_dim"],
    "feature_names": ["feature_names"],
}
PLACE_WORDS = {
    "grid": ["exists"],
    "folder_with_file": ["exists"],
    "file": ["exists"],
    "folder_overwrite": ["not a dask_scd grid"],
    "file_overwrite": ["not a dask_scd grid"],
    "parent_is_file": ["not a directory"],
}


def _libsvm_input(root, X, y, defect):
    """A libsvm file of X (made finite), the labels to pass, the defect that remains."""
    from sklearn.datasets import dump_svmlight_file

    source = root / "data.svm"
    X = np.nan_to_num(X, nan=0.0, posinf=0.0, neginf=0.0)
    if defect in ("X_nan", "X_inf", "X_1d", "X_strings", "y_missing"):
        defect = None  # the file holds finite 2-D data, and carries its labels
    if len(X) == 0 or not X.any():
        defect = "X_no_rows"  # no feature index at all: a file without data
    if defect == "X_no_rows":
        source.write_text("")
    else:
        dump_svmlight_file(
            X, np.zeros(len(X)) if len(y) != len(X) else y, str(source), zero_based=False
        )
    labels = np.zeros(len(X)) if defect in ("y_short", "y_nan", "y_strings") else None
    return source, X, labels, defect


@PROPERTY
@given(grid_cases())
def test_to_grid_writes_the_data_or_names_the_bad_argument(case):
    X, y, container, defect, place, row_chunk, bad_row_chunk, bad_blocks = case
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "bystander.txt").write_text("untouched")
        target = _prepare_place(root, place)
        X = _spoil_X(X, defect, np.random.default_rng(0))
        y = y[: len(X)]
        kwargs = dict(
            row_chunk=row_chunk, overwrite=place.endswith("overwrite") or place == "empty_folder"
        )
        if container == "libsvm":
            Xc, X, yc, defect = _libsvm_input(root, X, y, defect)
            if defect == "sample_dim":
                kwargs["sample_dim"] = "sample"
        else:
            Xc = _spoil_X_late(_container(X, container) if X.size else X, defect)
            yc = {"y_short": y[:-1], "y_missing": None, "y_strings": np.array(["a"] * len(y))}.get(
                defect, y
            )
            if defect == "y_nan":
                yc = np.where(np.arange(len(y)) == 0, np.nan, y)
            if defect == "sample_dim":
                kwargs["sample_dim"] = "nonsense"
        if defect == "row_chunk":
            kwargs["row_chunk"] = bad_row_chunk
        elif defect == "blocks":
            kwargs["blocks"] = bad_blocks
        elif defect == "feature_names":
            kwargs["feature_names"] = ["a"] * (X.shape[1] + 1)
        expected = GRID_DEFECT_WORDS.get(defect, []) + PLACE_WORDS.get(place, [])
        if defect == "X_no_rows" and container == "libsvm":
            expected = ["no data"] + PLACE_WORDS.get(place, [])
        before = _outside(_tree(root), "target.zarr")
        target_before = (
            _tree(target) if target.is_dir() else (target.read_text() if target.exists() else None)
        )
        try:
            grid = to_grid(Xc, yc, target, **kwargs)
        except (
            ValueError,
            TypeError,
            FileExistsError,
            FileNotFoundError,
            NotADirectoryError,
        ) as exc:
            assert expected, f"{container}/{defect}/{place}: {exc!r}"
            assert any(w in str(exc) for w in expected), (defect, place, str(exc))
            after = (
                _tree(target)
                if target.is_dir()
                else (target.read_text() if target.exists() else None)
            )
            assert after == target_before  # nothing written half-way
        else:
            assert not expected, f"{container}/{defect}/{place}: no error"
            reopened = open_grid(target)
            dense = reopened.X.compute()
            dense = dense.toarray() if sp.issparse(dense) else np.asarray(dense)
            p = reopened.shape[1]  # a libsvm file ends at its last non-zero feature
            assert not X[:, p:].any()
            np.testing.assert_array_equal(dense, X[:, :p][:, reopened.feature_order])
            np.testing.assert_array_equal(reopened.y.compute(), y)
            assert grid.shape == (X.shape[0], p)
        assert _outside(_tree(root), "target.zarr") == before


# ------------------------------------------------------------------ open_grid


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    rng = np.random.default_rng(12)
    root = tmp_path_factory.mktemp("pristine")
    dense = rng.normal(size=(12, 4))
    sparse_X = sp.random(12, 4, density=0.5, random_state=3, format="csr")
    y = rng.normal(size=12)
    to_grid(dense, y, root / "dense", row_chunk=5, blocks=2)
    to_grid(sparse_X, y, root / "sparse", row_chunk=5, blocks=2)
    return root, {"dense": dense, "sparse": sparse_X.toarray()}, y


MUTATIONS = [
    "delete",
    "garble",
    "truncate",
    "empty",
    "swap",
    "attr_delete",
    "attr_garbage",
    "attr_wrong_type",
    "json_garbage",
    "none",
]
GARBAGE = [None, -1, 0, "x", [], [1, 2, 3], {"a": 1}, 1.5, [[0, 1], [1]], [-3, 99]]


@PROPERTY
@given(st.sampled_from(["dense", "sparse"]), st.sampled_from(MUTATIONS), st.data())
def test_open_grid_reads_the_data_or_raises_a_documented_error(pristine, layout, mutation, data):
    root, truth, y = pristine
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "g"
        shutil.copytree(root / layout, store)
        files = sorted(str(f.relative_to(store)) for f in store.rglob("*") if f.is_file())
        first = store / data.draw(st.sampled_from(files))
        second = store / data.draw(st.sampled_from(files))
        if mutation == "delete":
            first.unlink()
        elif mutation == "garble":
            raw = bytearray(first.read_bytes())
            at = data.draw(st.integers(0, len(raw) - 1))
            raw[at] ^= data.draw(st.integers(1, 255))
            first.write_bytes(bytes(raw))
        elif mutation == "truncate":
            first.write_bytes(first.read_bytes()[: len(first.read_bytes()) // 2])
        elif mutation == "empty":
            first.write_bytes(b"")
        elif mutation == "swap":
            a, b = first.read_bytes(), second.read_bytes()
            first.write_bytes(b)
            second.write_bytes(a)
        elif mutation.startswith("attr") or mutation == "json_garbage":
            import json

            header = store / "zarr.json"
            meta = json.loads(header.read_text())
            key = data.draw(st.sampled_from(sorted(meta["attributes"])))
            if mutation == "attr_delete":
                del meta["attributes"][key]
            elif mutation == "attr_garbage":
                meta["attributes"][key] = data.draw(st.sampled_from(GARBAGE))
            elif mutation == "attr_wrong_type":
                value = meta["attributes"][key]
                meta["attributes"][key] = str(value) if not isinstance(value, str) else 7
            text = json.dumps(meta)
            if mutation == "json_garbage":
                text = text[: data.draw(st.integers(0, len(text) - 1))]
            header.write_text(text)
        try:
            grid = open_grid(store)
            with __import__("dask").config.set(scheduler="sync"):
                X = grid.X.compute()
                labels = grid.y.compute()
        except (ValueError, FileNotFoundError) as exc:  # GridCorruptionError is a ValueError
            assert str(store) in str(exc), (mutation, str(exc))
            if not isinstance(exc, GridCorruptionError | FileNotFoundError):
                assert "grid" in str(exc)
            return
        X = X.toarray() if sp.issparse(X) else np.asarray(X)
        # Read without error: then it is the data that was written.
        np.testing.assert_array_equal(X, truth[layout][:, grid.feature_order])
        np.testing.assert_array_equal(labels, y)
        assert grid.shape == truth[layout].shape
