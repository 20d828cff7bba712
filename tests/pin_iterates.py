"""The fits whose iterates are pinned in tests/data/pinned_iterates.json (see test_seam.py).

``python tests/pin_iterates.py`` rewrites the file; run it only when a change of the
iterates is intended, and say so in the commit.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

import dask.array as da
import numpy as np
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris
from sklearn.exceptions import ConvergenceWarning

import dask_scd
from dask_scd.datasets import make_onehot

PINNED = Path(__file__).resolve().parent / "data" / "pinned_iterates.json"


def _data():
    Xb, yb = load_breast_cancer(return_X_y=True)
    Xb = (Xb - Xb.mean(0)) / Xb.std(0)
    Xd, yd = load_diabetes(return_X_y=True)
    Xo, yo, _ = make_onehot(3000, 4, 10, random_state=0)
    rng = np.random.default_rng(0)
    Xt = rng.normal(size=(20_000, 8))
    yt = np.where(Xt @ rng.normal(size=8) + rng.logistic(size=20_000) > 0, 1.0, -1.0)
    Xi, yi = load_iris(return_X_y=True)
    Xi = (Xi - Xi.mean(0)) / Xi.std(0)
    wb = np.random.default_rng(1).integers(0, 4, size=len(yb)).astype(np.float64)
    return {
        "cancer": (Xb, yb),
        "diabetes": (Xd, yd),
        "onehot": (Xo, yo),
        "tall": (Xt, yt),
        "iris": (Xi, yi),
        "cancer-weights": wb,
    }


# (name, data, fit arguments): a few epochs of every engine, every loss and penalty.
CASES = [
    ("gram-lasso", "diabetes", dict(loss="squared", penalty="l1", alpha=0.1, solver="gram")),
    ("scd-enet", "diabetes", dict(loss="squared", penalty="elasticnet", alpha=0.05, solver="scd")),
    ("scd-logistic-l1", "cancer", dict(loss="logistic", penalty="l1", alpha=0.01, solver="scd")),
    ("scd-logistic-l2", "onehot", dict(loss="logistic", alpha=1e-3, solver="scd")),
    ("scd-sqhinge", "cancer", dict(loss="squared_hinge", alpha=0.01, solver="scd")),
    ("sdca-logistic", "cancer", dict(loss="logistic", alpha=0.01, solver="sdca")),
    ("sdca-hinge", "onehot", dict(loss="hinge", alpha=1e-3, solver="sdca")),
    ("sdca-ridge", "diabetes", dict(loss="squared", alpha=0.01, solver="sdca")),
    ("block-logistic", "onehot-dask", dict(loss="logistic", alpha=1e-3, solver="block_scd")),
    # Every other engine, pinned before the data layer moved below them.
    ("newton-logistic-l2", "cancer", dict(loss="logistic", alpha=0.01, solver="newton")),
    (
        "newton-logistic-l1",
        "cancer",
        dict(loss="logistic", penalty="l1", alpha=0.01, solver="newton"),
    ),
    ("newton-hinge", "cancer", dict(loss="hinge", alpha=0.01, solver="newton")),
    ("newton-sqhinge-onehot", "onehot", dict(loss="squared_hinge", alpha=1e-3, solver="newton")),
    ("newton-logistic-sampled", "tall", dict(loss="logistic", alpha=1e-4, solver="newton")),
    ("duhl-ridge", "onehot", dict(loss="squared", alpha=1e-3, solver="duhl")),
    ("duhl-logistic", "cancer", dict(loss="logistic", alpha=0.01, solver="duhl")),
    (
        "block-sqhinge-impure",
        "cancer-dask",
        dict(loss="squared_hinge", alpha=0.01, solver="block_scd"),
    ),
    (
        "block-newton-logistic",
        "onehot-dask",
        dict(loss="logistic", alpha=1e-3, solver="block_newton"),
    ),
    (
        "grid-block-l1",
        "onehot-grid",
        dict(loss="logistic", penalty="l1", alpha=1e-3, solver="block_scd"),
    ),
    ("grid-block-ridge", "onehot-grid", dict(loss="squared", alpha=1e-3, solver="block_scd")),
    (
        "grid-block-residency",
        "onehot-grid",
        dict(
            loss="logistic", alpha=1e-3, solver="block_scd", residency="duhl", memory_budget=40_000
        ),
    ),
    ("grid-block-newton", "onehot-grid", dict(loss="logistic", alpha=1e-3, solver="block_newton")),
    # Every engine and data kind (added with the conformance matrix, before its fixes).
    ("lbfgs-logistic", "cancer", dict(loss="logistic", alpha=0.01, solver="lbfgs")),
    ("gram-ridge-csr", "onehot", dict(loss="squared", alpha=1e-3, solver="gram")),
    (
        "scd-logistic-l1-csc",
        "onehot-csc",
        dict(loss="logistic", penalty="l1", alpha=1e-3, solver="scd"),
    ),
    ("scd-float32", "cancer-f32", dict(loss="logistic", alpha=0.01, solver="scd")),
    ("sdca-grid-logistic", "onehot-grid", dict(loss="logistic", alpha=1e-3, solver="sdca")),
    ("sdca-grid-ridge", "onehot-grid", dict(loss="squared", alpha=1e-3, solver="sdca")),
    ("cocoa-logistic", "cancer", dict(loss="logistic", alpha=0.01, solver="cocoa")),
    ("cocoa-dask-ridge", "cancer-dask", dict(loss="squared", alpha=0.01, solver="cocoa")),
    ("newton-multinomial", "iris", dict(loss="multinomial", alpha=0.01, solver="newton")),
    ("newton-unpenalized", "cancer", dict(loss="logistic", penalty=None, solver="newton")),
    (
        "block-newton-multinomial",
        "iris-dask",
        dict(loss="multinomial", alpha=0.01, solver="block_newton"),
    ),
    (
        "newton-logistic-weighted",
        "cancer",
        dict(loss="logistic", alpha=0.01, solver="newton", weighted=True),
    ),
    ("sdca-hinge-weighted", "cancer", dict(loss="hinge", alpha=0.01, solver="sdca", weighted=True)),
    (
        "scd-l1-weighted",
        "cancer",
        dict(loss="logistic", penalty="l1", alpha=0.01, solver="scd", weighted=True),
    ),
    (
        "block-scd-weighted",
        "cancer-dask",
        dict(loss="logistic", alpha=0.01, solver="block_scd", weighted=True),
    ),
]


def run_cases() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        return _run_cases(tmp)


def _run_cases(tmp) -> dict:
    data = _data()
    out = {}
    for name, source, kwargs in CASES:
        if source == "onehot-dask":
            X, y = data["onehot"]
            X = da.from_array(X.toarray(), chunks=(1000, 10))
        elif source == "cancer-dask":
            X, y = data["cancer"]
            X = da.from_array(X, chunks=(200, 10))
        elif source == "onehot-grid":
            X, y = data["onehot"]
            path = os.path.join(tmp, "onehot.zarr")
            if not os.path.exists(path):
                dask_scd.to_grid(X, y, path, row_chunk=1000)
            X, y = dask_scd.open_grid(path), None
        elif source == "iris-dask":
            X, y = data["iris"]
            X = da.from_array(X, chunks=(50, 4))
        elif source == "onehot-csc":
            X, y = data["onehot"]
            X = X.tocsc()
        elif source == "cancer-f32":
            X, y = data["cancer"]
            X = X.astype(np.float32)
        else:
            X, y = data[source]
        kwargs = dict(kwargs)
        if kwargs.pop("weighted", False):
            kwargs["sample_weight"] = data["cancer-weights"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            if kwargs["solver"] in ("block_scd", "block_newton") or source.endswith("-dask"):
                from distributed import Client, LocalCluster

                with (
                    LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as c,
                    Client(c) as client,
                ):
                    result = dask_scd.fit(
                        X, y, tol=1e-14, max_iter=4, random_state=0, client=client, **kwargs
                    )
            else:
                result = dask_scd.fit(X, y, tol=1e-14, max_iter=6, random_state=0, **kwargs)
        out[name] = {
            "coef": [float(v).hex() for v in np.ravel(result.coef_)],
            "intercept": [float(v).hex() for v in np.ravel(result.intercept_)],
            "n_iter": int(result.n_iter_),
        }
    return out


if __name__ == "__main__":
    PINNED.write_text(json.dumps(run_cases(), indent=1) + "\n")
    print(f"wrote {PINNED}")
