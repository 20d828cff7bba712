"""Progress on its own: silent, printed lines, a tqdm bar on a (fake) terminal."""

import io
import sys

import pytest

from dask_scd import progress as progress_module
from dask_scd.progress import Progress, resolve_mode


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def terminal(monkeypatch):
    """stderr is a terminal (patched in the test body: pytest's capture resets it after
    fixtures run)."""
    stream = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", stream)
    return stream


def pipe(monkeypatch):
    stream = io.StringIO()  # isatty() is False: output redirected to a file or a pipe
    monkeypatch.setattr(sys, "stderr", stream)
    return stream


def run(verbose, updates=((1, 0.5, 2.0), (3, 1e-3, 1.5), (4, 2e-7, 1.25))):
    with Progress("scd", 1e-6, 10, verbose) as progress:
        for iteration, gap, primal in updates:
            progress.update(iteration, gap, primal)
    return progress


@pytest.mark.parametrize("verbose", [False, 0, None])
def test_silent(verbose, capsys, monkeypatch):
    terminal_stream = terminal(monkeypatch)
    progress = run(verbose)
    assert progress.mode == "off"
    assert capsys.readouterr().out == ""
    assert terminal_stream.getvalue() == ""


def test_lines_outside_a_terminal_keep_the_engines_format(capsys, monkeypatch):
    pipe_stream = pipe(monkeypatch)
    progress = run(True)
    assert progress.mode == "lines"
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "[scd] epoch    1  relative gap 5.000e-01  primal 2",
        "[scd] epoch    3  relative gap 1.000e-03  primal 1.5",
        "[scd] epoch    4  relative gap 2.000e-07  primal 1.25",
    ]
    assert pipe_stream.getvalue() == ""


def test_verbose_2_prints_lines_even_in_a_terminal(capsys, monkeypatch):
    terminal_stream = terminal(monkeypatch)
    assert run(2).mode == "lines"
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert terminal_stream.getvalue() == ""


def test_bar_in_a_terminal(capsys, monkeypatch):
    terminal_stream = terminal(monkeypatch)
    progress = Progress("block_scd", 1e-6, 10, True)
    assert progress.mode == "bar"
    progress.update(2, 1e-2, 3.0, bytes_moved=2048.0)
    assert progress._bar.n == 2
    progress.update(7, 3e-5, 2.0)
    assert progress._bar.n == 7
    assert progress._bar.total == 10
    progress.close()
    progress.close()  # twice is harmless
    drawn = terminal_stream.getvalue()
    assert "[block_scd]" in drawn and "gap 3.00e-05" in drawn and "bytes_moved 2.05e+03" in drawn
    assert capsys.readouterr().out == ""  # nothing on stdout: the bar only


def test_auto_is_a_bar_in_a_terminal_and_silent_elsewhere(monkeypatch):
    terminal(monkeypatch)
    assert resolve_mode("auto") == "bar"
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert resolve_mode("auto") == "off"
    assert resolve_mode(1) == "lines"


def test_notebook_counts_as_interactive(monkeypatch):
    pipe(monkeypatch)

    class ZMQInteractiveShell:
        pass

    fake_ipython = type(sys)("IPython")
    fake_ipython.get_ipython = lambda: ZMQInteractiveShell()
    monkeypatch.setitem(sys.modules, "IPython", fake_ipython)
    assert progress_module._interactive()
    assert resolve_mode(True) == "bar"


def test_bad_verbose():
    with pytest.raises(ValueError, match="verbose='loud'"):
        Progress("scd", 1e-6, 10, "loud")


@pytest.mark.parametrize("solver", ["newton", "lbfgs", "scd"])
def test_a_fit_prints_each_certified_epoch_once(solver, capsys, monkeypatch):
    """One line per certified epoch: Newton re-certifies its last iterate on margins
    recomputed from scratch, which replaces the history's entry and prints nothing more."""
    import numpy as np
    from sklearn.datasets import load_breast_cancer

    import dask_scd

    pipe(monkeypatch)
    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    fit = dask_scd.fit(X, y, loss="logistic", alpha=1e-3, solver=solver, verbose=True)
    epochs = [int(line.split()[2]) for line in capsys.readouterr().out.splitlines()]
    assert epochs == sorted(set(epochs))
    assert len(epochs) == len(fit.history_.iteration) == len(set(fit.history_.iteration))
    assert np.isfinite(fit.dual_gap_)
