"""The larger-than-RAM benchmark's pure parts (``benchmarks/bench_beyond_ram.py``): Vowpal
Wabbit's text of our rows, the hash width that gives every feature its own weight, its
readable model read back into our column order, the per-epoch table of a fit; and the
epoch time of the in-memory engines the grid is compared with (`bench_epoch_rates.py`).

Where vowpalwabbit is installed (the ``bench`` extra), a tiny VW run checks the whole
mapping: its objective computed from its own average loss equals ours at its weights.
"""

import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import import_benchmark


@pytest.fixture(scope="module")
def beyond():
    return import_benchmark("bench_beyond_ram")


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_scale")


def test_vw_lines_are_labels_and_column_numbers(beyond):
    X = sp.csr_matrix(np.array([[1.0, 0, 1, 0], [0, 1.0, 0, 1], [1.0, 0, 0, 0]]))
    text = beyond.vw_lines(X, np.array([1.0, -1.0, 1.0])).decode()
    assert text == "1 |f 0 2\n-1 |f 1 3\n1 |f 0\n"


def test_vw_bits_give_every_feature_and_the_constant_its_own_weight(beyond):
    bits, index, const = beyond.vw_bits(611_438, 728008763)
    assert bits == 20  # 2**20 > 611,438: the first width that holds them
    assert len(np.unique(index)) == 611_438 and const not in set(index.tolist())
    assert index[0] == 728008763 & (2**20 - 1) and const == 11650396 & (2**20 - 1)
    # a namespace whose range would wrap onto the constant takes a wider hash
    wrap = (11650396 - 5) & (2**18 - 1)
    bits, index, const = beyond.vw_bits(100, wrap)
    assert bits > 18 and const not in set(index.tolist())


def test_read_weights_maps_indices_back_to_columns(beyond):
    header = "Version 9.11.9\nbits:20\nlda:0\n0 ngram:\n0 skip:\noptions: --bfgs\nChecksum: 1\n:0\n"
    index = np.array([100, 101, 102])
    theta, b = beyond.read_weights(header + "7:0.5\n100:1.25\n102:-2 3.1 1\n", index, 7)
    np.testing.assert_array_equal(theta, [1.25, 0.0, -2.0])
    assert b == 0.5


def test_average_loss_is_read_from_vw_output(beyond):
    out = "finished run\nnumber of examples = 20000\naverage loss = 0.298474\nbest constant = -0.49"
    assert beyond.average_loss(out) == 0.298474


def test_epochs_of_and_time_to_follow_the_history(beyond):
    samples = [
        {"epoch": -1, "t": 0.0, "disk": 0},
        {"epoch": 1, "t": 10.0, "disk": 500},
        {"epoch": 2, "t": 14.0, "disk": 1200},
        {"epoch": 3, "t": 19.0, "disk": 1900},
    ]
    res = {
        "probe": samples,
        "iteration": [1, 3],  # epoch 2 not certified
        "gap": [1e-2, 1e-7],
        "primal": [0.6, 0.5],
        "seconds": [9.0, 18.0],
    }
    rows = beyond.epochs_of({"result": res})
    assert rows == [(1, 10.0, 500, 1e-2), (2, 4.0, 700, None), (3, 5.0, 700, 1e-7)]
    assert beyond.time_to(res, 0.55) == (18.0, 3)
    assert beyond.time_to(res, 0.6) == (9.0, 1)
    assert beyond.time_to(res, 0.4) is None


def test_pieces_cover_the_rows_once(bench):
    truth, plan = bench.piece_plan(1000, 300)
    assert [r for _, r in plan] == [300, 300, 300, 100]
    assert [i for i, _ in plan] == [0, 1, 2, 3]
    assert truth.shape == (611_438,)
    # the same pieces again: the VW text and the grid hold the same rows
    X1, y1 = bench._piece(1, 300, 3, truth)
    X2, y2 = bench._piece(1, 300, 3, truth)
    assert (X1 != X2).nnz == 0 and np.array_equal(y1, y2)


def test_vw_objective_equals_ours_at_its_weights(beyond, bench, tmp_path):
    pyvw = pytest.importorskip("vowpalwabbit.pyvw")
    X, y = bench._piece(0, 2000, 3, bench.piece_plan(2000, 2000)[0])
    n, p = X.shape
    (tmp_path / "d.txt").write_bytes(beyond.vw_lines(X, y))
    ws = pyvw.Workspace("--quiet")
    bits, index, const = beyond.vw_bits(p, ws.hash_space(beyond.NAMESPACE))
    ws.finish()
    vw = [sys.executable, "-m", "vowpalwabbit", "-d", str(tmp_path / "d.txt"), "-c"]
    model, readable = tmp_path / "m", tmp_path / "r"
    train = ["-k", "--passes", "3", "--bfgs", "--loss_function", "logistic", "--l2", "1"]
    train += ["-b", str(bits), "--holdout_off", "--predict_only_model"]
    train += ["--readable_model", str(readable), "-f", str(model)]
    subprocess.run(vw + train, check=True, capture_output=True)
    test = ["-t", "-i", str(model), "--predict_only_model", "--loss_function", "logistic"]
    out = subprocess.run(vw + test, check=True, capture_output=True, text=True)
    theta, b = beyond.read_weights(readable.read_text(), index, const)
    ours = np.mean(np.logaddexp(0, -y * (X @ theta + b))) + 0.5 / n * theta @ theta
    vw_value = beyond.average_loss(out.stdout + out.stderr) + 0.5 / n * theta @ theta
    assert abs(vw_value - ours) <= 1e-5 * ours  # VW prints 6 digits, keeps float32
    assert np.count_nonzero(theta) > 100


def test_steady_epoch_leaves_the_first_certified_iteration_out():
    rates = import_benchmark("bench_epoch_rates")
    # certified at epochs 1, 3, 6: (9.5 - 2.0) s over 5 epochs
    assert rates.steady_epoch([2.0, 5.0, 9.5], [1, 3, 6]) == 1.5
    assert rates.steady_epoch([4.0], [2]) == 2.0  # one certificate: its mean


def test_the_report_of_a_failed_fit_without_root_or_vw(beyond, bench):
    """A fit that left no result, no disk speed (not root), VW skipped: the section is
    still written, saying so, rather than the run's output being lost."""
    args = bench.parse_args(["--beyond-ram", "1000", "--no-save"])
    facts = {
        "ram": 2**34,
        "speed": None,
        "written": {
            "shape": [1000, 611438],
            "nnz": 26000,
            "disk": 2**20,
            "seconds": 3.0,
            "peak_rss": 2**28,
        },
        "memory": 2**30,
        "commit": "abc1234",
        "elapsed": 60.0,
        "device": "vda",
    }
    fit = {"outcome": "failed (exit 1)", "result": None}
    text = beyond.report(bench, args, facts, fit, {"skipped": "vowpalwabbit is not installed"})
    assert "Outcome: **failed (exit 1)**" in text
    assert "not measured (not root)" in text
    assert "Vowpal Wabbit: vowpalwabbit is not installed" in text
