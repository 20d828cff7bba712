"""Fit real models on data that needs no download, printing the duality gap and timings.

1. In memory: scikit-learn's breast cancer data (L2 logistic, lasso), certified to 1e-9.
2. A generated one-hot (Criteo-like) problem: 200k examples, 20 categorical fields.
"""

import time

import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.preprocessing import StandardScaler

import dask_scd
from dask_scd.datasets import make_onehot


def show(name, result, seconds):
    print(f"{name:<42} solver={result.solver_:<9} epochs={result.n_iter_:<5} "
          f"relative gap={result.dual_gap_:.2e}  objective={result.primal_:.8f}  {seconds:.2f}s")


def timed(name, *args, **kwargs):
    start = time.perf_counter()
    result = dask_scd.fit(*args, **kwargs)
    show(name, result, time.perf_counter() - start)
    return result


def main():
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    print("== breast cancer (569 × 30), in memory")
    timed("logistic, L2 (alpha=1e-3)", X, y, loss="logistic", alpha=1e-3, tol=1e-9, random_state=0)
    timed("lasso (alpha=1e-2)", X, y.astype(float), penalty="l1", alpha=1e-2, tol=1e-9,
          random_state=0)
    timed("linear SVM, hinge (alpha=1e-2)", X, y, loss="hinge", alpha=1e-2, tol=1e-9,
          random_state=0, max_iter=20_000)

    print("\n== generated one-hot data (200,000 × ~100k, 20 fields), in memory")
    X, y, _ = make_onehot(200_000, n_fields=20, cardinality=5000, random_state=0)
    print(f"   X: {X.shape[0]:,} × {X.shape[1]:,}, {X.nnz:,} non-zeros")
    result = timed("logistic, L2 (alpha=1e-5), per-epoch gaps:", X, y, loss="logistic",
                   alpha=1e-5, tol=1e-8, random_state=0)
    for epoch, gap, seconds in zip(result.history_.iteration, result.history_.relative_gap,
                                   result.history_.seconds):
        print(f"   epoch {epoch:3d}  relative gap {gap:.3e}  at {seconds:6.2f}s")
    timed("lasso on ±1 labels (alpha=1e-4)", X, y, penalty="l1", alpha=1e-4, tol=1e-8,
          random_state=0)
    accuracy = np.mean(result.predict(X) == y)
    print(f"   training accuracy of the logistic model: {accuracy:.3f}")


if __name__ == "__main__":
    main()
