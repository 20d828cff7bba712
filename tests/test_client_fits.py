"""Many fits in a row under one ``distributed.Client`` on the same in-memory X.

In-memory one-vs-rest fits and the folds of the path/CV estimators send X to the cluster
once per fit. With a content-hashed key, the next fit on the same X reused the key while
the previous fit's release of it was still on its way to the scheduler: a fit failed
with ``FutureCancelledError: ... lost dependencies``, or hung with the key "in memory"
on the scheduler and missing on its worker. Every fit here must also give the very
model the same estimator fits without a client.
"""

import time

import numpy as np
import pytest
from sklearn.datasets import load_diabetes, load_iris
from sklearn.model_selection import GridSearchCV

from dask_scd import LassoCV, LinearSVC, LogisticRegression, LogisticRegressionCV
from dask_scd.estimators.fitting import _current_client, _fit_on_cluster

# The models fitted below, by name; each test fits them under the client and compares
# with the same fit made before the client exists.
MODELS = {
    "ovr": lambda: LogisticRegression(multi_class="ovr", tol=1e-8),
    "svc": lambda: LinearSVC(tol=1e-8),
    "grid": lambda: GridSearchCV(LinearSVC(tol=1e-8), {"alpha": [1e-3, 1e-2]}, cv=3),
    "logistic_cv": lambda: LogisticRegressionCV(Cs=3, cv=3, tol=1e-8),
    "lasso_cv": lambda: LassoCV(n_alphas=5, cv=3, tol=1e-8),
}


def _data(name: str) -> tuple:
    """Lasso on diabetes (a regression), every classifier on iris (three classes)."""
    load = load_diabetes if name == "lasso_cv" else load_iris
    return load(return_X_y=True)


def _coef(model) -> np.ndarray:
    """The fitted coefficients (GridSearchCV's: those of its refitted best model)."""
    return getattr(model, "best_estimator_", model).coef_


@pytest.fixture(scope="module")
def expected() -> dict:
    """Each model's coefficients fitted without a client (before the cluster starts)."""
    assert _current_client() is None
    return {name: _coef(make().fit(*_data(name))) for name, make in MODELS.items()}


@pytest.fixture(scope="module")
def client(expected):
    """Two worker processes of one thread each, as where the failure was seen; started
    after ``expected`` so that the references are fitted without it."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture
def scattered(client, monkeypatch) -> list:
    """The keys under which the fits send their data to the cluster, in order (the fits
    find this client as the default one, so its ``scatter`` is what they call)."""
    keys, scatter = [], client.scatter

    def recording(*args, **kwargs):
        future = scatter(*args, **kwargs)
        keys.append(future.key)
        return future

    monkeypatch.setattr(client, "scatter", recording)
    return keys


def _fit_and_check(name: str, expected: dict) -> None:
    """Fit the model ``name`` here (under the client if there is one): the same numbers."""
    model = MODELS[name]().fit(*_data(name))
    np.testing.assert_allclose(_coef(model), expected[name], rtol=1e-10, atol=0)


def _task_prefixes(client) -> set:
    """The task prefixes the scheduler has seen (a key's name, its leading "_" dropped)."""
    return set(client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes)))


def _each_once(keys: list) -> bool:
    """Whether no key was sent twice: each fit sends X under a key of its own (a key that
    comes back is what met the previous fit's release)."""
    return len(set(keys)) == len(keys)


@pytest.mark.timeout(60)
def test_fifty_fits_in_a_row_on_the_same_X(client, expected, scattered):
    """20 one-vs-rest logistic fits, each followed by a LinearSVC on the same X, then
    10 GridSearchCV fits (7 LinearSVC fits each, on folds that repeat across the grid):
    none fails or hangs, and each is the model fitted without the client."""
    for _ in range(20):
        _fit_and_check("ovr", expected)
        _fit_and_check("svc", expected)
    for _ in range(10):
        _fit_and_check("grid", expected)
    assert "fit_task" in _task_prefixes(client)  # the fits did run on the cluster
    assert len(scattered) == 20 + 20 + 10 * 7 and _each_once(scattered)


@pytest.mark.timeout(60)
def test_cross_validated_fits_in_a_row(client, expected, scattered):
    """The path/CV estimators send X once per fit to run their folds as tasks: several
    fits in a row on the same X, alternating, each the model fitted without a client.
    (Their refits between two scatters make the race rare: the keys are checked too.)"""
    for _ in range(4):
        _fit_and_check("logistic_cv", expected)
        _fit_and_check("lasso_cv", expected)
    assert "fold_task" in _task_prefixes(client)
    assert len(scattered) == 8 and _each_once(scattered)


def _held_keys(client) -> int:
    """How many keys the scheduler still holds, of any client."""
    return client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))


@pytest.mark.timeout(60)
def test_a_failed_task_releases_the_other_tasks_and_X(client):
    """When one binary fit fails, the caller gets its error and the scheduler forgets X
    and the other fits (none is left running or held for a result nobody reads)."""
    X, y = load_iris(return_X_y=True)
    good = np.where(y == 0, 1.0, -1.0)
    bad = np.full(len(y), np.nan)  # the task's fit raises on NaN labels
    options = dict(
        loss="logistic", penalty="l2", alpha=1e-3, l1_ratio=0.5, fit_intercept=True, tol=1e-8
    )
    with pytest.raises(ValueError) as raised:
        _fit_on_cluster(client, X, [good, bad, good], options, [None] * 3)
    deadline = time.monotonic() + 10
    while _held_keys(client) and time.monotonic() < deadline:
        time.sleep(0.05)
    # ``raised`` holds the failed call's frame, and with it its futures, until here.
    assert _held_keys(client) == 0, raised
