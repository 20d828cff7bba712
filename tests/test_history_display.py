"""What a fit shows: a short repr, the history as a DataFrame and as a figure."""

import builtins
import sys

import numpy as np
import pytest

import dask_scd
from dask_scd.result import History

matplotlib = pytest.importorskip("matplotlib")  # the 'plot' extra
matplotlib.use("Agg")


@pytest.fixture(scope="module")
def result():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 20))
    y = np.where(X @ rng.normal(size=20) > 0, 1.0, -1.0)
    return dask_scd.fit(X, y, loss="logistic", alpha=1e-3, tol=1e-10, solver="scd", random_state=0)


def test_repr_is_short_and_names_the_fit(result):
    text = repr(result)
    assert len(text) < 250
    for part in (
        "solver='scd'",
        "loss='logistic'",
        "penalty='l2'",
        "alpha=0.001",
        f"dual_gap={result.dual_gap_:.3e}",
        f"n_iter={result.n_iter_}",
        f"len(history)={len(result.history_)}",
    ):
        assert part in text
    assert len(repr(result.history_)) < 100


def test_to_pandas(result):
    frame = result.history_.to_pandas()
    assert list(frame.columns) == ["iteration", "relative_gap", "primal", "seconds"]
    assert len(frame) == len(result.history_)
    np.testing.assert_array_equal(frame["relative_gap"], result.history_.relative_gap)
    assert frame["iteration"].iloc[-1] == result.n_iter_


def test_plot_saves_a_figure(result, tmp_path):
    axes = result.history_.plot()
    assert [axis.get_xlabel() for axis in axes] == ["seconds", "epoch"]
    assert all(axis.get_yscale() == "log" for axis in axes)
    np.testing.assert_array_equal(axes[1].lines[0].get_ydata(), result.history_.relative_gap)
    path = tmp_path / "history.png"
    axes[0].figure.savefig(path)
    assert path.stat().st_size > 1000


def test_plot_with_bytes_moved_and_on_given_axes(tmp_path):
    import matplotlib.pyplot as plt

    history = History()
    for epoch in range(1, 5):
        history.append(
            epoch, 10.0**-epoch, 1.0 + 10.0**-epoch, 0.1 * epoch, bytes_moved=1e6 * epoch
        )
    axes = history.plot()
    assert [axis.get_xlabel() for axis in axes] == ["seconds", "epoch", "bytes moved"]
    assert "bytes_moved" in history.to_pandas().columns
    _, ax = plt.subplots()
    (drawn,) = history.plot(ax)  # one Axes: the gap against seconds only
    assert drawn is ax and ax.get_xlabel() == "seconds"
    plt.close("all")


def test_old_records_load_without_bytes_moved():
    history = History.from_dict(
        {"iteration": [1], "relative_gap": [0.5], "primal": [1.0], "seconds": [0.1]}
    )
    assert history.bytes_moved == [] and len(history) == 1


def test_plot_without_matplotlib_names_the_extra(result, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    for module in [m for m in sys.modules if m.startswith("matplotlib")]:
        monkeypatch.delitem(sys.modules, module)
    with pytest.raises(ImportError, match=r"pip install dask-scd\[plot\]"):
        result.history_.plot()


@pytest.mark.parametrize("solver", ["newton", "gram", "scd", "sdca"])
def test_history_has_one_entry_per_iteration(solver):
    """The Newton engines re-certify their last iterate on fresh margins: that replaces
    its entry instead of repeating the iteration ([0, ..., 9, 9] for n_iter_ = 9)."""
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    loss = "squared" if solver == "gram" else "logistic"
    result = dask_scd.fit(X, y, loss=loss, alpha=1e-3, solver=solver, tol=1e-10, max_iter=2000)
    iterations = list(result.history_.iteration)
    assert iterations == sorted(set(iterations))  # strictly increasing: no repeat
    assert iterations[-1] == result.n_iter_
    assert result.history_.relative_gap[-1] == pytest.approx(result.dual_gap_)


def test_one_vs_rest_history_plots_every_class_and_stays_a_list():
    """A one-vs-rest model's ``history_``: one labelled line per class on every panel,
    and each class's History by index and iteration, as the list it was."""
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(0)
    X = rng.normal(size=(150, 4))
    y = np.array(["a", "b", "c"])[np.argmax(X[:, :3] + 0.3 * rng.normal(size=(150, 3)), 1)]
    model = dask_scd.LogisticRegression(multi_class="ovr", tol=1e-8, random_state=0).fit(X, y)
    history = model.history_
    assert isinstance(history, list) and len(history) == 3
    assert all(isinstance(h, History) for h in history)
    assert repr(history) == "Histories(3 models, by class: a, b, c)"
    assert [len(h) for h in history] == [len(history[k]) for k in range(3)]
    np.testing.assert_array_equal([h.iteration[-1] for h in history], model.n_iter_)
    axes = history.plot()
    assert [axis.get_xlabel() for axis in axes] == ["seconds", "epoch"]
    for axis in axes:
        assert len(axis.lines) == len(model.classes_)
        labels = [text.get_text() for text in axis.get_legend().get_texts()]
        assert labels == ["class a", "class b", "class c"]
    for line, one in zip(axes[1].lines, history):
        np.testing.assert_array_equal(line.get_ydata(), one.relative_gap)
    frame = history.to_pandas()
    assert list(frame.columns[:2]) == ["class", "iteration"]
    assert len(frame) == sum(len(h) for h in history)
    plt.close("all")
