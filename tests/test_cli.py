"""The dask-scd command: convert → info → fit on a small libsvm file, and bad invocations
(one line on stderr, non-zero exit, no traceback)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import dump_svmlight_file

import dask_scd
from dask_scd.cli import main


@pytest.fixture(scope="module")
def svm_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 8))
    X[rng.random(X.shape) < 0.4] = 0.0
    y = np.where(X @ rng.normal(size=8) + 0.3 * rng.normal(size=300) > 0, 1.0, -1.0)
    path = tmp_path_factory.mktemp("cli") / "data.svm"
    dump_svmlight_file(X, y, str(path), zero_based=False)
    return path, X, y


def run(argv, capsys):
    status = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_round_trip_convert_info_fit(svm_file, tmp_path, capsys):
    path, X, y = svm_file
    grid_path = tmp_path / "data.zarr"
    status, out, err = run(
        ["convert", path, grid_path, "--row-chunk", 100, "--column-block", 3], capsys
    )
    assert status == 0 and err == "" and "wrote <Grid" in out
    grid = dask_scd.open_grid(grid_path)
    assert grid.shape == (300, 8) and grid.n_row_chunks == 3 and grid.n_blocks == 3

    status, out, err = run(["info", grid_path], capsys)
    assert status == 0 and err == ""
    assert "300 examples x 8 features" in out and "3 of 100 examples" in out

    model_path = tmp_path / "model.json"
    status, out, err = run(
        [
            "fit",
            grid_path,
            "--loss",
            "logistic",
            "--alpha",
            "0.01",
            "--tol",
            "1e-9",
            "--out",
            model_path,
        ],
        capsys,
    )
    assert status == 0 and err == ""
    epoch_lines = [
        line for line in out.splitlines() if "relative gap" in line and line.startswith("[")
    ]
    assert epoch_lines, out
    summary = [line for line in out.splitlines() if line.startswith("fitted")]
    assert len(summary) == 1 and summary[0].endswith("s")
    model = json.loads(model_path.read_text())
    expected = dask_scd.fit(X, y, loss="logistic", alpha=0.01, tol=1e-9, random_state=0)
    assert model["dual_gap"] <= 1e-9 and model["converged"]
    np.testing.assert_allclose(model["coef"], expected.coef_, atol=1e-4)
    assert model["classes"] == [-1.0, 1.0]
    assert len(model["history"]["relative_gap"]) >= 1
    assert not any(name.startswith("model.json.tmp") for name in os.listdir(tmp_path))


@pytest.fixture
def grid_path(svm_file, tmp_path, capsys):
    path = tmp_path / "grid.zarr"
    assert main(["convert", str(svm_file[0]), str(path), "--row-chunk", "100"]) == 0
    capsys.readouterr()
    return path


def corrupt(path: Path) -> Path:
    """Remove one cell's bytes: the store is then incomplete."""
    chunks = sorted(p for p in path.rglob("c/*") if p.is_file())
    if not chunks:
        chunks = sorted(p for p in path.rglob("*") if p.is_file() and p.name != "zarr.json")
    chunks[0].unlink()
    return path


def truncate_header(path: Path) -> Path:
    (path / "zarr.json").write_text("{not json")
    return path


BAD = {
    "no command": lambda tmp, grid: [],
    "unknown command": lambda tmp, grid: ["train", grid],
    "unknown option": lambda tmp, grid: ["fit", grid, "--learning-rate", "3"],
    "bad loss": lambda tmp, grid: ["fit", grid, "--loss", "huber"],
    "negative alpha": lambda tmp, grid: ["fit", grid, "--alpha", "-1"],
    "alpha not a number": lambda tmp, grid: ["fit", grid, "--alpha", "lots"],
    "l1-ratio out of range": lambda tmp, grid: ["fit", grid, "--l1-ratio", "2"],
    "zero row chunk": lambda tmp, grid: ["convert", "in.svm", tmp / "o.zarr", "--row-chunk", "0"],
    "missing input file": lambda tmp, grid: ["convert", tmp / "absent.svm", tmp / "o.zarr"],
    "missing grid (info)": lambda tmp, grid: ["info", tmp / "absent.zarr"],
    "missing grid (fit)": lambda tmp, grid: ["fit", tmp / "absent.zarr"],
    "a file is not a grid": lambda tmp, grid: ["info", _text_file(tmp)],
    "not a grid directory": lambda tmp, grid: ["fit", _empty_dir(tmp)],
    "corrupt header": lambda tmp, grid: ["info", truncate_header(grid)],
    "missing cell": lambda tmp, grid: ["fit", corrupt(grid), "--solver", "scd"],
    "output exists": lambda tmp, grid: ["convert", _svm(tmp), grid],
    "hinge on block engine": lambda tmp, grid: [
        "fit",
        grid,
        "--loss",
        "hinge",
        "--solver",
        "block_scd",
    ],
    "not a libsvm file": lambda tmp, grid: ["convert", _text_file(tmp), tmp / "o.zarr"],
}


def _text_file(tmp):
    path = tmp / "notes.txt"
    path.write_text("this is not libsvm: a b c\n")
    return path


def _empty_dir(tmp):
    path = tmp / "empty.zarr"
    path.mkdir()
    return path


def _svm(tmp):
    path = tmp / "small.svm"
    path.write_text("1 1:0.5 2:1.0\n-1 1:1.5\n")
    return path


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_invocations_print_one_line_and_exit_non_zero(case, grid_path, tmp_path, capsys):
    argv = [str(arg) for arg in BAD[case](tmp_path, grid_path)]
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse exits for a bad command line
        status = exit_.code
    out, err = capsys.readouterr()
    assert status not in (0, None), (case, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dask-scd: error: "), (case, err)
    assert "Traceback" not in err


def _run(*command):
    """``command`` in a subprocess, as a user's shell runs it (stdout and stderr kept)."""
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)


def test_console_script_in_a_subprocess(svm_file, tmp_path):
    """The installed ``dask-scd`` entry point, as a user runs it."""
    script = shutil.which("dask-scd", path=os.path.dirname(sys.executable))
    command = [script] if script else [sys.executable, "-m", "dask_scd.cli"]
    done = _run(*command, "info", str(tmp_path / "absent.zarr"))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"dask-scd: error: grid store not found: {tmp_path / 'absent.zarr'}"
    ]
    done = _run(*command, "convert", str(svm_file[0]), str(tmp_path / "g.zarr"))
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_python_dash_m_runs_the_command_line(tmp_path):
    """``python -m dask_scd`` is ``dask-scd``: the same version line, the same one-line
    error and exit status."""
    import dask_scd

    done = _run(sys.executable, "-m", "dask_scd", "--version")
    assert done.returncode == 0 and dask_scd.__version__ in done.stdout
    done = _run(sys.executable, "-m", "dask_scd", "info", str(tmp_path / "absent.zarr"))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"dask-scd: error: grid store not found: {tmp_path / 'absent.zarr'}"
    ]


@pytest.mark.parametrize("table", ["cell_checksum", "label_checksum", "cell_nnz"])
def test_a_grid_without_one_of_its_tables_is_refused_at_open(svm_file, tmp_path, capsys, table):
    path, X, y = svm_file
    grid_path = tmp_path / "data.zarr"
    dask_scd.to_grid(X, y, grid_path, row_chunk=100)
    shutil.rmtree(grid_path / table)
    with pytest.raises(dask_scd.GridCorruptionError, match=f"{grid_path}.*'{table}'"):
        dask_scd.open_grid(grid_path)
    with pytest.raises(dask_scd.GridCorruptionError, match=f"'{table}'"):
        dask_scd.fit(str(grid_path))
    status, out, err = run(["fit", grid_path], capsys)
    assert status == 1 and out == ""
    assert len(err.splitlines()) == 1 and f"'{table}'" in err and str(grid_path) in err


def test_convert_with_the_training_width(svm_file, tmp_path, capsys):
    """A test split whose last features never occur gets the training set's width."""
    path, X, y = svm_file
    narrow = tmp_path / "test.svm"
    dump_svmlight_file(X[:50, :5], y[:50], str(narrow), zero_based=False)
    status, out, err = run(["convert", narrow, tmp_path / "test.zarr", "--n-features", 8], capsys)
    assert status == 0 and err == ""
    grid = dask_scd.open_grid(tmp_path / "test.zarr")
    assert grid.shape == (50, 8)
    np.testing.assert_allclose(
        grid.X.compute().toarray()[:, grid.feature_order.argsort()],
        np.hstack([X[:50, :5], np.zeros((50, 3))]),
        rtol=1e-12,
    )
    assert dask_scd.to_grid(
        narrow, None, tmp_path / "api.zarr", row_chunk=20, n_features=8
    ).shape == (50, 8)
    status, out, err = run(["convert", narrow, tmp_path / "small.zarr", "--n-features", 4], capsys)
    assert status == 1 and "n_features=4 is too small" in err and "5 features" in err
    with pytest.raises(ValueError, match="libsvm file only"):
        dask_scd.to_grid(X, y, tmp_path / "array.zarr", row_chunk=20, n_features=8)


def test_a_malformed_libsvm_line_is_named_by_its_number(tmp_path, capsys):
    path = tmp_path / "bad.svm"
    path.write_text("# a comment\n1 1:0.5 2:1.0\n\n-1 1:0.25 2:oops\n1 2:1.0\n")
    status, out, err = run(["convert", path, tmp_path / "bad.zarr"], capsys)
    assert status == 1 and len(err.splitlines()) == 1
    assert "line 4" in err and "2:oops" in err
    with pytest.raises(ValueError, match="line 4"):
        dask_scd.fit(str(path))


@pytest.mark.parametrize("bad", ["-1 1:nan 2:1.0", "nan 1:0.25", "1 2:inf"])
def test_a_nan_in_a_libsvm_file_is_named_by_its_line(tmp_path, capsys, bad):
    """A NaN or infinite value or label: the line's number, before anything is written."""
    path = tmp_path / "nan.svm"
    path.write_text(f"# a comment\n1 1:0.5 2:1.0\n\n{bad}\n1 2:1.0\n")
    status, out, err = run(["convert", path, tmp_path / "nan.zarr"], capsys)
    assert status == 1 and len(err.splitlines()) == 1
    assert "line 4" in err and "NaN or infinite" in err and bad in err
    assert not (tmp_path / "nan.zarr").exists()
    with pytest.raises(ValueError, match=r"NaN or infinity \(first at (row|index) 1"):
        dask_scd.fit(str(path))  # read whole: its row (the second example)


def test_fit_checks_the_output_directory_before_fitting(grid_path, tmp_path, capsys):
    out_path = tmp_path / "missing_dir" / "m.json"
    status, out, err = run(["fit", grid_path, "--out", out_path], capsys)
    assert status == 1 and out == ""  # refused before any fit
    assert len(err.splitlines()) == 1 and "missing_dir" in err and "does not exist" in err
    assert not (tmp_path / "missing_dir").exists()
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]


def test_version_and_defaults_in_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"dask-scd {dask_scd.__version__}"
    for command, shown in (
        ("convert", "(default: 100000)"),
        ("fit", "(default: 1e-06)"),
        ("predict", "(default: None)"),
    ):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert shown in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_predict_with_a_fitted_model(svm_file, tmp_path, capsys, loss):
    path, X, y = svm_file
    grid_path = tmp_path / "data.zarr"
    assert run(["convert", path, grid_path, "--row-chunk", 100], capsys)[0] == 0
    model_path = tmp_path / "model.json"
    status, _, err = run(
        [
            "fit",
            grid_path,
            "--loss",
            loss,
            "--alpha",
            "0.01",
            "--tol",
            "1e-9",
            "--out",
            model_path,
            "--quiet",
        ],
        capsys,
    )
    assert status == 0, err
    model = json.loads(model_path.read_text())
    scores = X @ np.array(model["coef"]) + model["intercept"]
    expected = scores if loss == "squared" else np.where(scores > 0, 1.0, -1.0)

    out_path = tmp_path / "predictions.txt"
    status, out, err = run(["predict", model_path, grid_path, "--out", out_path], capsys)
    assert status == 0 and "wrote 300 predictions" in err
    np.testing.assert_allclose(np.loadtxt(out_path), expected, rtol=1e-12, atol=1e-12)
    status, out, err = run(["predict", model_path, path], capsys)  # a libsvm file, to stdout
    assert status == 0 and err == ""
    np.testing.assert_allclose(np.array(out.split(), dtype=float), expected, rtol=1e-12, atol=1e-12)
    status, out, err = run(["predict", path, path], capsys)
    assert status == 1 and "is not a model written by dask-scd fit" in err


@pytest.fixture(scope="module")
def model_file(svm_file, tmp_path_factory):
    """A logistic model of svm_file's 8 features, written by ``fit --out``."""
    directory = tmp_path_factory.mktemp("model")
    grid = directory / "grid.zarr"
    assert main(["convert", str(svm_file[0]), str(grid), "--row-chunk", "100"]) == 0
    path = directory / "model.json"
    assert (
        main(
            [
                "fit",
                str(grid),
                "--loss",
                "logistic",
                "--alpha",
                "0.01",
                "--out",
                str(path),
                "--quiet",
            ]
        )
        == 0
    )
    return path


def _columns(X, n):
    """X cut or widened (by a column of non-zeros: it occurs in a libsvm file) to n."""
    return np.hstack([X, np.ones((len(X), 1))])[:, :n]


def _grid_of(X, y, tmp_path):
    path = tmp_path / "other.zarr"
    dask_scd.to_grid(X, y, path, row_chunk=100)
    return path


def _svm_of(X, y, tmp_path):
    path = tmp_path / "other.svm"
    dump_svmlight_file(X, y, str(path), zero_based=False)
    return path


@pytest.mark.parametrize(
    "write, width",
    [(_grid_of, 9), (_grid_of, 7), (_svm_of, 9)],
    ids=["wider grid", "narrower grid", "wider libsvm file"],
)
def test_predict_refuses_data_of_another_width(
    svm_file, model_file, tmp_path, capsys, write, width
):
    _, X, y = svm_file
    data = write(_columns(X, width), y, tmp_path)
    out_path = tmp_path / "predictions.txt"
    status, out, err = run(["predict", model_file, data, "--out", out_path], capsys)
    assert status == 1 and out == ""
    hint = " (convert its libsvm file with --n-features 8)" if width < 8 else ""
    assert err == (
        f"dask-scd: error: the model has 8 features, the data at {data} has {width}{hint}\n"
    )
    assert not out_path.exists() and not list(tmp_path.glob("*.tmp-*"))
    status, out, err = run(["predict", model_file, data], capsys)  # to standard output
    assert status == 1 and out == "" and len(err.splitlines()) == 1


def test_predict_widens_a_narrower_libsvm_file(svm_file, model_file, tmp_path, capsys):
    """A test split whose last feature never occurs is read at the model's width."""
    _, X, y = svm_file
    model = json.loads(model_file.read_text())
    data = _svm_of(X[:, :7], y, tmp_path)
    status, out, err = run(["predict", model_file, data], capsys)
    assert status == 0 and err == ""
    scores = X[:, :7] @ np.array(model["coef"])[:7] + model["intercept"]
    np.testing.assert_array_equal(
        np.array(out.split(), dtype=float), np.where(scores > 0, 1.0, -1.0)
    )
