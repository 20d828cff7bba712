"""dask_scd.save / dask_scd.load: every estimator and a FitResult come back as saved (the
same parameters, fitted attributes and predictions, bit for bit), in a process that never
imports ``distributed``; files of other formats or newer versions are refused by name;
a save never leaves half a file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import make_classification
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import KFold

import dask_scd
from dask_scd.result import FitResult, Histories, History

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("predict", "decision_function", "predict_proba", "predict_log_proba")


@pytest.fixture(scope="module")
def data():
    X, y3 = make_classification(
        120, 5, n_informative=3, n_redundant=0, n_classes=3, flip_y=0.1, random_state=0
    )
    rng = np.random.default_rng(0)
    return {
        "X": X,
        "y3": y3,
        "y2": (y3 == 1).astype(np.int64),
        "reg": X @ rng.normal(size=5) + 0.1 * rng.normal(size=120),
        "w": rng.uniform(0.2, 2.0, size=120),
    }


def _fit(name: str, d: dict):
    """The model ``name`` fitted on ``d`` (warnings of short CV grids silenced)."""
    X, y2, y3, reg, w = d["X"], d["y2"], d["y3"], d["reg"], d["w"]
    frame = pd.DataFrame(X, columns=[f"f{j}" for j in range(X.shape[1])])
    labels = np.array(["ant", "bee", "cat"], dtype=object)[y3]
    fits = {
        "logistic_binary": lambda: dask_scd.LogisticRegression(alpha=1e-2).fit(X, y2),
        "logistic_multinomial": lambda: dask_scd.LogisticRegression(alpha=1e-2).fit(X, y3),
        "logistic_ovr": lambda: dask_scd.LogisticRegression(alpha=1e-2, multi_class="ovr").fit(
            X, y3
        ),
        "logistic_weighted": lambda: dask_scd.LogisticRegression(
            C=1.0, class_weight="balanced"
        ).fit(X, y3, sample_weight=w),
        "logistic_class_dict": lambda: dask_scd.LogisticRegression(
            alpha=1e-2, class_weight={0: 1.0, 1: 3.0, 2: 0.5}, multi_class="ovr"
        ).fit(X, y3),
        "logistic_unpenalized": lambda: dask_scd.LogisticRegression(penalty=None).fit(X, y2),
        "logistic_frame_objects": lambda: dask_scd.LogisticRegression(alpha=1e-2).fit(
            frame, labels
        ),
        "svc_binary_bool": lambda: dask_scd.LinearSVC(alpha=1e-2).fit(X, y2 == 1),
        "svc_ovr_strings": lambda: dask_scd.LinearSVC(alpha=1e-2, loss="hinge").fit(
            X, labels.astype(str)
        ),
        "ridge": lambda: dask_scd.Ridge(alpha=0.1).fit(X, reg),
        "ridge_two_targets": lambda: dask_scd.Ridge(alpha=0.1).fit(X, np.column_stack([reg, -reg])),
        "lasso": lambda: dask_scd.Lasso(alpha=0.05).fit(X, reg),
        "elasticnet_weighted": lambda: dask_scd.ElasticNet(alpha=0.05, l1_ratio=0.3).fit(
            X, reg, sample_weight=w
        ),
        "lasso_cv": lambda: dask_scd.LassoCV(n_alphas=5, cv=3).fit(X, reg),
        "elasticnet_cv": lambda: dask_scd.ElasticNetCV(l1_ratio=[0.5, 0.9], n_alphas=4, cv=3).fit(
            X, reg
        ),
        "ridge_cv": lambda: dask_scd.RidgeCV(alphas=(0.01, 0.1, 1.0), cv=3).fit(X, reg),
        "logistic_cv": lambda: dask_scd.LogisticRegressionCV(Cs=3, cv=3).fit(X, y3),
        "logistic_cv_no_refit": lambda: dask_scd.LogisticRegressionCV(
            Cs=[0.1, 1.0], cv=3, refit=False
        ).fit(X, y2),
        "fit_squared": lambda: dask_scd.fit(X, reg, alpha=0.1, penalty="elasticnet"),
        "fit_logistic_strings": lambda: dask_scd.fit(
            X, np.where(y2 == 1, "yes", "no"), loss="logistic", alpha=1e-2
        ),
        "fit_multinomial": lambda: dask_scd.fit(X, y3, loss="multinomial", alpha=1e-2),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fits[name]()


NAMES = [
    "logistic_binary",
    "logistic_multinomial",
    "logistic_ovr",
    "logistic_weighted",
    "logistic_class_dict",
    "logistic_unpenalized",
    "logistic_frame_objects",
    "svc_binary_bool",
    "svc_ovr_strings",
    "ridge",
    "ridge_two_targets",
    "lasso",
    "elasticnet_weighted",
    "lasso_cv",
    "elasticnet_cv",
    "ridge_cv",
    "logistic_cv",
    "logistic_cv_no_refit",
    "fit_squared",
    "fit_logistic_strings",
    "fit_multinomial",
]


@pytest.fixture(scope="module")
def fitted(data):
    return {name: _fit(name, data) for name in NAMES}


def _outputs(model, X) -> dict:
    """What the model computes of X: every prediction method it has."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a frame-fitted model given an array
        return {m: np.asarray(getattr(model, m)(X)) for m in METHODS if hasattr(model, m)}


def _assert_identical(a, b, where="") -> None:
    """Same type, dtype, shape and bits (NaN where NaN), recursively."""
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, where
        if a.dtype.kind == "f":
            np.testing.assert_array_equal(a, b, err_msg=where, strict=True)
        else:
            assert a.tolist() == b.tolist(), where
    elif isinstance(a, History):
        _assert_identical(a.as_dict(), b.as_dict(), where)
    elif isinstance(a, Histories):  # one-vs-rest: its labels, then as the list it is
        assert isinstance(b, Histories) and (a.labels, a.name) == (b.labels, b.name), where
        _assert_identical(list(a), list(b), where)
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            _assert_identical(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for k, (u, v) in enumerate(zip(a, b)):
            _assert_identical(u, v, f"{where}[{k}]")
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b), where
    else:
        assert a == b and type(a) is type(b) or (a == b and isinstance(a, np.generic)), where


def _public_state(model) -> dict:
    if isinstance(model, FitResult):
        return {f: getattr(model, f) for f in model.__dataclass_fields__}
    return {k: v for k, v in vars(model).items() if not k.startswith("_")}


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_predicts_bit_for_bit(name, fitted, data, tmp_path):
    model = fitted[name]
    path = tmp_path / f"{name}.model"
    dask_scd.save(model, path)
    loaded = dask_scd.load(path)
    assert type(loaded) is type(model)
    expected, got = _outputs(model, data["X"]), _outputs(loaded, data["X"])
    assert set(got) == set(expected) and "predict" in got
    for method in expected:
        _assert_identical(expected[method], got[method], method)
    _assert_identical(_public_state(model), _public_state(loaded))
    if not isinstance(model, FitResult):
        assert loaded.get_params() == model.get_params()
        target = data["reg"] if name.startswith(("ridge", "lasso", "elastic")) else None
        if target is not None and name != "ridge_two_targets":
            assert loaded.score(data["X"], target) == model.score(data["X"], target)


def test_the_metadata_says_what_the_model_is(fitted, tmp_path):
    path = tmp_path / "model.npz"
    dask_scd.save(fitted["logistic_ovr"], path)
    with np.load(path, allow_pickle=False) as archive:
        metadata = json.loads(str(archive["metadata"][()]))
        assert {"coef_", "intercept_", "classes_"} <= set(archive.files)
        np.testing.assert_array_equal(archive["classes_"], [0, 1, 2])
    assert metadata["format"] == "dask_scd.model" and metadata["format_version"] == 1
    assert metadata["library_version"] == dask_scd.__version__
    assert metadata["model"] == "LogisticRegression"
    assert metadata["params"]["multi_class"] == "ovr" and metadata["params"]["alpha"] == 1e-2
    assert metadata["problem"] == {
        "loss": "logistic",
        "penalty": "l2",
        "alpha": 1e-2,
        "C": None,
        "l1_ratio": 0.5,
        "fit_intercept": True,
    }
    assert metadata["classes"] == {"dtype": "int64", "values": [0, 1, 2]}
    certificate = metadata["certificate"]
    model = fitted["logistic_ovr"]
    assert certificate["relative_gap"] == model.dual_gap_.tolist()
    assert certificate["n_iter"] == model.n_iter_.tolist()
    assert certificate["solver"] == model.solver_
    primal = np.array(certificate["primal"])
    np.testing.assert_allclose(
        (primal - np.array(certificate["dual"])) / np.abs(primal), model.dual_gap_
    )


def test_a_fit_result_records_its_problem_and_certificate(fitted, tmp_path):
    result = fitted["fit_squared"]
    path = tmp_path / "result"
    dask_scd.save(result, path)
    assert os.listdir(tmp_path) == ["result"]  # the path as given: no ".npz" added
    with np.load(path, allow_pickle=False) as archive:
        metadata = json.loads(str(archive["metadata"][()]))
    assert metadata["model"] == "FitResult"
    assert metadata["problem"] == {
        "loss": "squared",
        "penalty": "elasticnet",
        "alpha": 0.1,
        "l1_ratio": 0.5,
        "fit_intercept": True,
    }
    assert metadata["certificate"]["primal"] == result.primal_
    assert metadata["certificate"]["relative_gap"] == result.dual_gap_
    assert metadata["certificate"]["converged"] is True
    assert metadata["classes"] is None


def test_cross_validated_choices_survive(fitted, tmp_path):
    for name, chosen in (("lasso_cv", "alpha_"), ("elasticnet_cv", "l1_ratio_")):
        dask_scd.save(fitted[name], tmp_path / name)
        loaded = dask_scd.load(tmp_path / name)
        assert getattr(loaded, chosen) == getattr(fitted[name], chosen)
        np.testing.assert_array_equal(loaded.mse_path_, fitted[name].mse_path_)
    dask_scd.save(fitted["logistic_cv"], tmp_path / "lcv")
    loaded = dask_scd.load(tmp_path / "lcv")
    np.testing.assert_array_equal(loaded.C_, fitted["logistic_cv"].C_)
    assert sorted(loaded.scores_) == [0, 1, 2]  # keyed by class label, as fitted


# ------------------------------------------------------------ a fresh process

_FRESH = textwrap.dedent(
    """
    import sys, warnings
    import numpy as np
    warnings.simplefilter("ignore")
    import dask_scd
    assert "distributed" not in sys.modules, "import dask_scd imported distributed"
    X = np.load(sys.argv[1])
    out = {}
    for path in sys.argv[3:]:
        model = dask_scd.load(path)
        name = path.rsplit("/", 1)[-1]
        for method in %r:
            if hasattr(model, method):
                out[name + "." + method] = np.asarray(getattr(model, method)(X))
    np.savez(sys.argv[2], **out)
    print("distributed imported:", "distributed" in sys.modules)
    """
    % (METHODS,)
)


def _outputs_in_a_fresh_process(paths: list, X, tmp_path) -> dict:
    """Each model's outputs of X computed by a new Python process that loads the files
    (and asserts it never imports distributed)."""
    np.save(tmp_path / "X.npy", X)
    out = tmp_path / "outputs.npz"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _FRESH, str(tmp_path / "X.npy"), str(out), *map(str, paths)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "distributed imported: False" in done.stdout
    with np.load(out, allow_pickle=True) as archive:  # object labels: our own file
        return {key: archive[key] for key in archive.files}


def test_a_fresh_process_without_distributed_predicts_the_same(fitted, data, tmp_path):
    paths = []
    for name, model in fitted.items():
        paths.append(tmp_path / name)
        dask_scd.save(model, paths[-1])
    got = _outputs_in_a_fresh_process(paths, data["X"], tmp_path)
    for name, model in fitted.items():
        for method, expected in _outputs(model, data["X"]).items():
            _assert_identical(expected, got[f"{name}.{method}"], f"{name}.{method}")


def test_a_model_fitted_on_a_grid_on_a_cluster(client, data, tmp_path):
    X, y = data["X"], data["y2"]
    grid = dask_scd.to_grid(X, y, tmp_path / "data.zarr", row_chunk=40, blocks=2)
    model = dask_scd.LogisticRegression(
        alpha=1e-2, tol=1e-6, solver="block_scd", random_state=0
    ).fit(grid)
    assert model.solver_ == "block_scd"
    assert model.classes_.dtype == np.int64  # the grid's labels in their own dtype
    dask_scd.save(model, tmp_path / "grid_model")
    got = _outputs_in_a_fresh_process([tmp_path / "grid_model"], X, tmp_path)
    for method, expected in _outputs(model, X).items():
        _assert_identical(expected, got[f"grid_model.{method}"], method)
    assert got["grid_model.predict"].dtype == np.int64
    loaded = dask_scd.load(tmp_path / "grid_model")
    assert loaded.score(grid) == model.score(grid)  # the grid's own labels


# ------------------------------------------------------------------ refusals


def _rewrite_metadata(path, change) -> None:
    with np.load(path, allow_pickle=False) as archive:
        entries = {key: archive[key] for key in archive.files}
    metadata = json.loads(str(entries.pop("metadata")[()]))
    change(metadata)
    with open(path, "wb") as handle:
        np.savez(handle, metadata=np.array(json.dumps(metadata)), **entries)


def test_a_newer_format_version_is_refused_by_name(fitted, tmp_path):
    path = tmp_path / "future.model"
    dask_scd.save(fitted["ridge"], path)
    _rewrite_metadata(path, lambda m: m.update(format_version=7, library_version="9.0"))
    with pytest.raises(ValueError) as raised:
        dask_scd.load(path)
    message = str(raised.value)
    assert str(path) in message
    assert "format version 7" in message and "reads format version 1" in message
    assert "dask_scd 9.0" in message


@pytest.mark.parametrize(
    "write",
    [
        lambda p: p.write_text("a plain text file\n"),
        lambda p: p.write_bytes(b"PK\x03\x04 a broken zip"),
        lambda p: np.save(open(p, "wb"), np.arange(3)),
        lambda p: np.savez(open(p, "wb"), coef_=np.arange(3)),
        lambda p: np.savez(open(p, "wb"), metadata=np.array('{"format": "other"}')),
        lambda p: np.savez(open(p, "wb"), metadata=np.array("not json")),
        lambda p: np.savez(open(p, "wb"), metadata=np.array([1, 2])),
        lambda p: np.savez(open(p, "wb"), metadata=np.array(["a"], dtype=object)),
        lambda p: p.write_text('{"something": "else"}'),
    ],
    ids=[
        "text",
        "broken-zip",
        "npy",
        "npz-without-metadata",
        "other-format",
        "metadata-not-json",
        "metadata-not-a-string",
        "pickled-metadata",
        "other-json",
    ],
)
def test_a_file_that_is_not_a_model_is_refused(write, tmp_path):
    path = tmp_path / "not_a_model"
    write(path)
    with pytest.raises(ValueError, match="is not a dask_scd model file") as raised:
        dask_scd.load(path)
    assert str(path) in str(raised.value)


def test_a_damaged_model_file_is_refused(fitted, tmp_path):
    path = tmp_path / "damaged"
    dask_scd.save(fitted["lasso"], path)
    _rewrite_metadata(path, lambda m: m["attributes"].update(coef_={"__array__": "missing"}))
    with pytest.raises(ValueError, match="damaged dask_scd model file"):
        dask_scd.load(path)
    _rewrite_metadata(path, lambda m: m.update(model="os.system"))
    with pytest.raises(ValueError, match="unknown model 'os.system'"):
        dask_scd.load(path)


def test_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        dask_scd.load(tmp_path / "nothing")


def test_what_cannot_be_saved(fitted, data, tmp_path):
    with pytest.raises(NotFittedError):
        dask_scd.save(dask_scd.Ridge(), tmp_path / "unfitted")
    with pytest.raises(ValueError, match="not KFold"):
        dask_scd.save(KFold(3), tmp_path / "kfold")
    model = dask_scd.RidgeCV(alphas=(0.1, 1.0), cv=KFold(3)).fit(data["X"], data["reg"])
    with pytest.raises(ValueError, match=r"parameter cv=KFold\("):
        dask_scd.save(model, tmp_path / "cv")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        dask_scd.save(fitted["ridge"], tmp_path / "no" / "such" / "dir" / "m")
    assert sorted(os.listdir(tmp_path)) == []  # nothing written by any refusal


def test_a_failed_save_leaves_the_old_file_whole(fitted, tmp_path, monkeypatch):
    path = tmp_path / "model"
    dask_scd.save(fitted["ridge"], path)
    before = path.read_bytes()

    def half_then_fail(handle, **entries):
        handle.write(b"PK\x03\x04 half")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        dask_scd.save(fitted["lasso"], path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model"]  # the temporary file removed
    monkeypatch.undo()
    dask_scd.save(fitted["lasso"], path)  # replaces the old file
    assert type(dask_scd.load(path)) is dask_scd.Lasso
    assert os.listdir(tmp_path) == ["model"]


def test_the_command_line_model_loads_as_a_fit_result(tmp_path, data):
    from dask_scd.cli import main

    X, y = data["X"], np.where(data["y2"] == 1, 1.0, -1.0)
    dask_scd.to_grid(X, y, tmp_path / "g.zarr", row_chunk=60)
    out = tmp_path / "model.json"
    assert main(["fit", str(tmp_path / "g.zarr"), "--loss", "logistic", "--out", str(out)]) == 0
    assert main(["predict", str(out), str(tmp_path / "g.zarr"), "--out", str(tmp_path / "p")]) == 0
    result = dask_scd.load(out)
    assert isinstance(result, FitResult) and result.loss == "logistic"
    model = json.loads(out.read_text())
    np.testing.assert_array_equal(result.coef_, model["coef"])
    assert result.fit_intercept is None  # not recorded by the command line
    printed = np.loadtxt(tmp_path / "p")
    np.testing.assert_array_equal(result.predict(X), printed)


def test_the_command_line_writes_and_reads_the_saved_format(tmp_path, data):
    from dask_scd.cli import main

    X, y = data["X"], data["y2"]
    grid = tmp_path / "g.zarr"
    dask_scd.to_grid(X, y, grid, row_chunk=60)
    for name in ("model.json", "model.npz"):
        fit = ["fit", str(grid), "--loss", "logistic", "--quiet", "--out", str(tmp_path / name)]
        assert main(fit) == 0
        predict = ["predict", str(tmp_path / name), str(grid), "--out", str(tmp_path / f"{name}.p")]
        assert main(predict) == 0
    assert (tmp_path / "model.json.p").read_text() == (tmp_path / "model.npz.p").read_text()
    result = dask_scd.load(tmp_path / "model.npz")
    assert isinstance(result, FitResult) and result.fit_intercept is True
    assert result.classes_.dtype == np.int64
    np.testing.assert_array_equal(result.predict(X), np.loadtxt(tmp_path / "model.npz.p"))
    dask_scd.save(dask_scd.fit(X, y, loss="multinomial", alpha=1e-2), tmp_path / "multi.npz")
    assert main(["predict", str(tmp_path / "multi.npz"), str(grid)]) == 1  # one line, refused
