"""The data layer: every input read, checked and described once, below the engines.

- :mod:`~dask_scd.data.inputs`: any input a model accepts (numpy, scipy.sparse, pandas,
  xarray, dask array or DataFrame, Grid, a grid store or libsvm path) reduced to X and y;
- :mod:`~dask_scd.data.memory`: validated in-memory data (:class:`InMemory`), what the
  in-memory engines receive;
- :mod:`~dask_scd.data.sources`: a dask array or a grid as a :class:`Source` of cells,
  labels and row bounds, what the dask engines receive;
- :mod:`~dask_scd.data.cells`: one cell as the kernels read it (host or device), and the
  grid's cell and label references;
- :mod:`~dask_scd.data.cache`: the worker cell cache.

Nothing here imports an engine, the cluster runtime or the public API.
"""

from dask_scd.data.inputs import ModelInput, read_input
from dask_scd.data.memory import InMemory, in_memory
from dask_scd.data.sources import DaskSource, GridSource, Source, make_source

__all__ = [
    "DaskSource",
    "GridSource",
    "InMemory",
    "ModelInput",
    "Source",
    "in_memory",
    "make_source",
    "read_input",
]
