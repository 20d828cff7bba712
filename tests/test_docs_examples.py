"""The documentation builds without a warning, the code of its pages runs as a reader
pastes it (top to bottom), and the examples run at small size."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 900  # seconds: a bound for a loaded 2-core machine, not a speed claim


def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx", reason="the docs extra: pip install -e .[docs]")
    pytest.importorskip("myst_parser", reason="the docs extra: pip install -e .[docs]")
    pytest.importorskip("numpydoc", reason="the docs extra: pip install -e .[docs]")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-d",
            str(tmp_path / "doctrees"),
            str(ROOT / "docs"),
            str(tmp_path / "html"),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    for page in (
        "index",
        "estimators",
        "cli",
        "clusters",
        "reference",
        "generated/dask_scd.LogisticRegression",
        "generated/dask_scd.fit",
    ):
        assert (tmp_path / "html" / f"{page}.html").exists(), page


# page: the heading its code is run up to (None: all of it), or (from, up to) headings:
# the code of one section. The user guide's sections from "Fitting with Dask" on build a
# 100,000-row grid and clusters: its in-memory part.
PAGES = {
    "user_guide.md": "## Fitting with Dask",
    "estimators.md": ("## Saving and loading", "## More than two classes"),
    "engines/cocoa.md": None,
    "engines/duhl.md": None,
}


def python_blocks(page: str, before=None) -> list:
    """The fenced ``python`` blocks of a docs page, in order (up to the heading
    ``before``, or between the two headings of a pair)."""
    text = (ROOT / "docs" / page).read_text()
    if isinstance(before, tuple):
        after, before = before
        text = text.split(after, 1)[1]
    if before is not None:
        text = text.split(before)[0]
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_code_runs_top_to_bottom(page, tmp_path, monkeypatch, capsys):
    """Every block in one namespace, in the page's order, in an empty directory; the
    data a page leaves to the reader (X, y) is a small in-memory regression."""
    from sklearn.datasets import make_regression

    blocks = python_blocks(page, PAGES[page])
    assert blocks, page
    monkeypatch.chdir(tmp_path)
    X, y = make_regression(200, 20, noise=1.0, random_state=0)
    namespace = {"X": X, "y": y, "__name__": "docs"}
    for k, block in enumerate(blocks):
        exec(compile(block, f"docs/{page}, block {k}", "exec"), namespace)


EXAMPLES = {
    # script: lines its output must contain (a number is checked where the claim is one)
    "sklearn_pipeline.py": [r"certified relative gap per class: max (\S+) \(tol=1e-08\)"],
    "xarray_zarr.py": [
        r"certified relative gap (\S+)\n",
        r"same Dataset in memory: max \|coef difference\| (\S+),",
    ],
    "cluster_jobqueue.py": [r"LogisticRegression on the grid: relative gap (\S+),"],
}
BOUNDS = {
    "sklearn_pipeline.py": [1e-8],
    "xarray_zarr.py": [1e-8, 1e-3],
    "cluster_jobqueue.py": [1e-6],
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_runs_at_small_size(script, tmp_path):
    env = {**os.environ, "DASK_SCD_EXAMPLE_SIZE": "small", "MPLBACKEND": "Agg"}
    env.pop("DASK_SCD_SLURM_QUEUE", None)
    env.pop("DASK_SCD_SHARED_DIR", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script)],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for pattern, bound in zip(EXAMPLES[script], BOUNDS[script]):
        match = re.search(pattern, done.stdout)
        assert match, (pattern, done.stdout[-3000:])
        assert float(match.group(1)) <= bound, match.group(0)
