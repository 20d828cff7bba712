"""dask_scd: regularized linear models by coordinate descent, certified by duality gaps."""

from dask_scd.api import fit
from dask_scd.estimators import (
    ElasticNet,
    ElasticNetCV,
    Lasso,
    LassoCV,
    LinearSVC,
    LogisticRegression,
    LogisticRegressionCV,
    Ridge,
    RidgeCV,
)
from dask_scd.grid import Grid, GridCorruptionError, open_grid, to_grid
from dask_scd.objectives import Certificate, Problem, certificate
from dask_scd.path import PathResult, path
from dask_scd.progress import Progress
from dask_scd.result import FitResult, History

__all__ = [
    "fit",
    "path",
    "PathResult",
    "FitResult",
    "History",
    "Problem",
    "Certificate",
    "certificate",
    "Grid",
    "GridCorruptionError",
    "open_grid",
    "to_grid",
    "Ridge",
    "Lasso",
    "ElasticNet",
    "LogisticRegression",
    "LinearSVC",
    "RidgeCV",
    "LassoCV",
    "ElasticNetCV",
    "LogisticRegressionCV",
    "Progress",
]
__version__ = "0.1.0"
