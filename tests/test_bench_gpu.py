"""The GPU benchmark runs end to end under numba's CUDA simulator, at tiny size.

In a fresh process (numba reads ``NUMBA_ENABLE_CUDASIM`` when ``numba.cuda`` is first
imported): the script's ``main`` on 100 rows, 2 epochs and 1 DuHL round, into a tmp file.
The table must have every row, and the GPU model's objective must equal the CPU one's:
the simulator runs a launch's blocks one after another, so a GPU epoch is the CPU epoch
in the same order.
"""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    # The script pins its thread counts in os.environ at import: keep them out of the session.
    saved = dict(os.environ)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_gpu
    finally:
        sys.path.remove(str(BENCHMARKS))
        os.environ.clear()
        os.environ.update(saved)
    return bench_gpu


def _run(argv, **env):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(BENCHMARKS)!r})
        import bench_gpu
        sys.exit(bench_gpu.main({argv!r}))
    """)
    return subprocess.run([sys.executable, "-c", script], env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=300)


def _rows(text: str) -> dict:
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if cells and not cells[0].startswith("---"):
            rows[cells[0]] = cells
    return rows


def test_tiny_run_under_the_simulator(bench, tmp_path):
    output = tmp_path / "gpu.md"
    out = _run(["--rows", "100", "--max-epochs", "2", "--max-rounds", "1", "--output",
                str(output)], NUMBA_ENABLE_CUDASIM="1")
    assert out.returncode == 0, out.stderr
    text = output.read_text()
    assert "numba CUDA simulator" in text and "--rows 100" in text
    rows = _rows(text)
    for name in bench.tpa_rows() + bench.duhl_rows():
        assert name in rows, name
    assert len(bench.tpa_rows()) == 10 and len(bench.duhl_rows()) == 6
    for name in bench.tpa_rows():
        objective_gap, bound = float(rows[name][-2]), float(rows[name][-1])
        if name.startswith(("ridge", "lasso")):
            # The CPU runs the squared loss's own epoch (its intercept by centering), the
            # GPU the general one: equal only at the optimum, within the certified gaps.
            assert objective_gap <= bound, name
        else:
            assert objective_gap <= 1e-8, name


def test_without_a_device_it_says_so_and_writes_nothing(tmp_path):
    output = tmp_path / "gpu.md"
    out = _run(["--output", str(output)], NUMBA_ENABLE_CUDASIM="0", NUMBA_DISABLE_CUDA="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().count("\n") == 0 and "no CUDA device" in out.stdout
    assert not output.exists()
