"""The documentation builds without a warning, the code of its pages runs as a reader
pastes it (top to bottom), and the examples run at small size."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 900  # seconds: a bound for a loaded 2-core machine, not a speed claim
# the pages run against this checkout's dask_scd, whatever the working directory
PYTHONPATH = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


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


# Every page with ``python`` blocks, and the data it leaves to the reader: X, y of 200
# rows, "regression" or "classification" (binary labels), and the files it reads by name.
PAGES = {
    "README.md": ("classification", ()),
    "docs/api.md": ("regression", ()),
    "docs/engines/adding.md": ("regression", ()),
    "docs/engines/cocoa.md": ("regression", ()),
    "docs/engines/duhl.md": ("regression", ()),
    "docs/estimators.md": ("classification", ()),
    "docs/grid.md": ("regression", ("a9a.t",)),
    "docs/index.md": ("classification", ()),
    "docs/user_guide.md": ("regression", ()),
}
# Pages whose code needs what a test cannot have, and why.
NOT_RUN = {
    "docs/clusters.md": "a SLURM partition (sinfo, sbatch), a cluster's shared filesystem "
    "at /shared/project (make_cluster creates its log directory there) and a scheduler "
    "started by hand; its SLURM recipe is what tests/slurm runs (make test-slurm)",
}

# The page's blocks in one namespace, top to bottom, as pasted into a fresh interpreter
# (python -c: worker processes of a LocalCluster do not re-run the main module, as in a
# notebook or a terminal session).
RUNNER = """
import json, sys
from sklearn.datasets import make_classification, make_regression
page, data, blocks = json.loads(open(sys.argv[1]).read())
if data == "classification":
    X, y = make_classification(200, 20, random_state=0)
else:
    X, y = make_regression(200, 20, noise=1.0, random_state=0)
namespace = {"__name__": "__main__", "X": X, "y": y}
for k, block in enumerate(blocks):
    exec(compile(block, f"{page}, block {k}", "exec"), namespace)
"""


def python_blocks(page: str) -> list:
    """The fenced ``python`` blocks of a page (a path from the repository root), in order."""
    text = (ROOT / page).read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def write_reader_file(name: str, directory: Path) -> None:
    """A small stand-in for a file a page reads but leaves to the reader."""
    from sklearn.datasets import dump_svmlight_file, make_classification

    assert name == "a9a.t", name  # LIBSVM's a9a test file: 123 binary features, ±1 labels
    X, y = make_classification(300, 123, random_state=0)
    dump_svmlight_file((X > 0).astype(float), 2 * y - 1, str(directory / name), zero_based=False)


def test_every_page_with_code_is_run():
    docs = ROOT / "docs"
    pages = [ROOT / "README.md", *docs.glob("*.md"), *docs.glob("engines/*.md")]
    with_code = {str(p.relative_to(ROOT)) for p in pages if "```python" in p.read_text()}
    assert with_code == set(PAGES) | set(NOT_RUN)
    assert not set(PAGES) & set(NOT_RUN)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_code_runs_top_to_bottom(page, tmp_path):
    """Every block in one namespace, in the page's order, in an empty directory."""
    data, files = PAGES[page]
    blocks = python_blocks(page)
    assert blocks, page
    directory = tmp_path / "page"
    directory.mkdir()
    for name in files:
        write_reader_file(name, directory)
    (tmp_path / "page.json").write_text(json.dumps([page, data, blocks]))
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(tmp_path / "page.json")],
        env={**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": PYTHONPATH},
        check=False,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=directory,
    )
    assert done.returncode == 0, done.stderr[-3000:]


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
