"""For scikit-learn users: dask_scd's LogisticRegression in a Pipeline and a GridSearchCV.

1. Load scikit-learn's digits (10 classes; the full size repeats it 20 times with noise).
2. Search alpha for StandardScaler() + dask_scd.LogisticRegression (one-vs-rest) with
   3-fold cross-validation.
3. Refit the best model, print its certified duality gap per class and its history, and
   check it against scikit-learn's LogisticRegression with C = 1/(alpha·n) on each class.

Run:  .venv/bin/python examples/sklearn_pipeline.py            (about a minute)
      .venv/bin/python examples/sklearn_pipeline.py --small    (seconds; also
      DASK_SCD_EXAMPLE_SIZE=small)
"""

import os
import sys
import time

import numpy as np
from sklearn import linear_model
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import dask_scd

SMALL = "--small" in sys.argv or os.environ.get("DASK_SCD_EXAMPLE_SIZE") == "small"
TOL = 1e-8


def load():
    X, y = load_digits(return_X_y=True)
    if SMALL:
        return X[:600], y[:600]
    rng = np.random.default_rng(0)
    copies = [X + rng.normal(scale=1.0, size=X.shape) for _ in range(20)]
    return np.vstack(copies), np.tile(y, 20)


def search(X, y):
    pipeline = make_pipeline(
        StandardScaler(), dask_scd.LogisticRegression(tol=TOL, multi_class="ovr", random_state=0)
    )
    grid = {"logisticregression__alpha": [1e-3, 1e-2, 1e-1]}
    start = time.perf_counter()
    searcher = GridSearchCV(pipeline, grid, cv=3).fit(X, y)
    print(
        f"GridSearchCV over {grid['logisticregression__alpha']}: {time.perf_counter() - start:.1f}s"
    )
    for alpha, score in zip(
        grid["logisticregression__alpha"], searcher.cv_results_["mean_test_score"]
    ):
        print(f"  alpha={alpha:g}  mean accuracy {score:.4f}")
    return searcher


def check_against_sklearn(model, X_scaled, y):
    """Our objective against scikit-learn's, class by class (C = 1/(alpha·n))."""
    n = len(y)
    problem = dask_scd.Problem(loss="logistic", alpha=model.alpha, l1_ratio=0.0, fit_intercept=True)
    worst = 0.0
    for k, label in enumerate(model.classes_):
        y_pm = np.where(y == label, 1.0, -1.0)
        reference = linear_model.LogisticRegression(
            C=1.0 / (model.alpha * n), tol=1e-10, max_iter=5000
        ).fit(X_scaled, y_pm)
        ours = dask_scd.certificate(
            problem, X_scaled, y_pm, model.coef_[k], model.intercept_[k]
        ).primal
        theirs = dask_scd.certificate(
            problem, X_scaled, y_pm, reference.coef_[0], reference.intercept_[0]
        ).primal
        worst = max(worst, (ours - theirs) / abs(theirs))
    print(
        f"largest (ours − scikit-learn)/|scikit-learn| objective over the classes: "
        f"{worst:.1e}  (negative: ours is lower)"
    )


def main():
    X, y = load()
    print(f"digits: {X.shape[0]} examples x {X.shape[1]} features, {len(np.unique(y))} classes")
    searcher = search(X, y)
    best = searcher.best_estimator_
    model = best[-1]
    print(f"best alpha={model.alpha:g}, accuracy on the training set {searcher.score(X, y):.4f}")
    print(
        f"certified relative gap per class: max {model.dual_gap_.max():.1e} "
        f"(tol={TOL:g}), epochs {model.n_iter_.tolist()}"
    )
    print(model.history_[0].to_pandas().tail(3).to_string(index=False))
    check_against_sklearn(model, best[0].transform(X), y)


if __name__ == "__main__":
    main()
