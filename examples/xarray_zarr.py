"""For xarray and zarr users: a labelled Dataset written as a zarr grid store, fitted from
its path, predicted lazily, and checked against the in-memory fit of the same Dataset.

1. Build an xarray Dataset of examples: three numeric variables (1-D over "sample") and
   two categorical variables one-hot encoded as 2-D variables ("sample", "<name>_value"),
   plus a 0/1 "clicked" label.
2. Write it as a grid store with ``dask_scd.to_grid(ds, "clicked", path)``: one column
   block per data variable, feature names "var=value".
3. Fit ``dask_scd.LogisticRegression`` on the store's path (the workers read the cells),
   predict the click probability lazily as a dask array, and compare with the model
   fitted on the Dataset in memory.

Run:  .venv/bin/python examples/xarray_zarr.py            (200,000 examples)
      .venv/bin/python examples/xarray_zarr.py --small    (5,000; also
      DASK_SCD_EXAMPLE_SIZE=small)
"""

import os
import sys
import tempfile
import time

import dask.array as da
import numpy as np
import xarray as xr

import dask_scd

SMALL = "--small" in sys.argv or os.environ.get("DASK_SCD_EXAMPLE_SIZE") == "small"
N_SAMPLES = 5_000 if SMALL else 200_000
ALPHA = 1e-3
TOL = 1e-8


def make_dataset(n: int, rng) -> xr.Dataset:
    """Numeric and one-hot categorical variables with a planted logistic model."""
    variables, score = {}, np.zeros(n)
    for name in ("age", "income", "visits"):
        values = rng.normal(size=n)
        variables[name] = ("sample", values)
        score += rng.normal() * values
    for name, cardinality in (("country", 12), ("device", 4)):
        codes = rng.integers(cardinality, size=n)
        one_hot = np.zeros((n, cardinality))
        one_hot[np.arange(n), codes] = 1.0
        variables[name] = (("sample", f"{name}_value"), one_hot)
        score += rng.normal(size=cardinality)[codes]
    clicked = (rng.random(n) < 1.0 / (1.0 + np.exp(-score))).astype(float)
    variables["clicked"] = ("sample", clicked)
    coords = {
        "country_value": [f"c{k}" for k in range(12)],
        "device_value": ["phone", "tablet", "desktop", "tv"],
    }
    return xr.Dataset(variables, coords=coords)


def main():
    ds = make_dataset(N_SAMPLES, np.random.default_rng(0))
    print(ds)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "clicks.zarr")
        start = time.perf_counter()
        grid = dask_scd.to_grid(ds, "clicked", path, row_chunk=N_SAMPLES // 4)
        print(f"\nwrote {grid} in {time.perf_counter() - start:.2f}s")
        print(
            f"blocks: {[len(block) for block in grid.blocks]} "
            f"(one per variable), pure: {grid.purity}"
        )

        model = dask_scd.LogisticRegression(alpha=ALPHA, tol=TOL, random_state=0)
        start = time.perf_counter()
        model.fit(path)  # the store carries its labels
        print(
            f"\nfit on the store ({model.solver_}): {time.perf_counter() - start:.2f}s, "
            f"{model.n_iter_[0]} epochs, certified relative gap {model.dual_gap_[0]:.1e}"
        )
        print("features:", ", ".join(model.feature_names_in_[:6]), "...")

        probabilities = model.predict_proba(grid)  # lazy: nothing is read yet
        assert isinstance(probabilities, da.Array)
        print(
            f"predict_proba(grid): a lazy {type(probabilities).__name__} "
            f"of shape {probabilities.shape}, chunks {probabilities.chunks[0]}"
        )
        click_rate = float(probabilities[:, 1].mean().compute())
        print(
            f"mean predicted click probability {click_rate:.4f}, "
            f"observed {float(ds.clicked.mean()):.4f}"
        )

        in_memory = dask_scd.LogisticRegression(alpha=ALPHA, tol=TOL, random_state=0)
        in_memory.fit(ds, "clicked")
        difference = np.abs(in_memory.coef_ - model.coef_).max()
        print(
            f"\nthe same Dataset in memory: max |coef difference| {difference:.1e}, "
            f"same feature names: "
            f"{list(in_memory.feature_names_in_) == list(model.feature_names_in_)}"
        )


if __name__ == "__main__":
    main()
