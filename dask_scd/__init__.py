"""dask_scd: regularized linear models by coordinate descent, certified by duality gaps.

The public names load on first use: a dask worker that runs the engines' tasks imports
``dask_scd.engines`` and ``dask_scd.kernels`` only, not scikit-learn (whose import costs a
worker process ~100 MiB of its memory limit).
"""

from importlib import import_module

_EXPORTS = {
    "fit": "dask_scd.api",
    "path": "dask_scd.paths",
    "PathResult": "dask_scd.paths",
    "FitResult": "dask_scd.result",
    "History": "dask_scd.result",
    "Histories": "dask_scd.result",
    "Problem": "dask_scd.objectives",
    "Certificate": "dask_scd.objectives",
    "certificate": "dask_scd.objectives",
    "Grid": "dask_scd.grid",
    "GridCorruptionError": "dask_scd.grid",
    "open_grid": "dask_scd.grid",
    "to_grid": "dask_scd.grid",
    "Ridge": "dask_scd.estimators",
    "Lasso": "dask_scd.estimators",
    "ElasticNet": "dask_scd.estimators",
    "LogisticRegression": "dask_scd.estimators",
    "LinearSVC": "dask_scd.estimators",
    "RidgeCV": "dask_scd.estimators",
    "LassoCV": "dask_scd.estimators",
    "ElasticNetCV": "dask_scd.estimators",
    "LogisticRegressionCV": "dask_scd.estimators",
    "Progress": "dask_scd.progress",
    "TaskOverheadWarning": "dask_scd.validation",
    "save": "dask_scd.persist",
    "load": "dask_scd.persist",
}

__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:  # a submodule, e.g. dask_scd.datasets after a plain `import dask_scd`
        try:
            return import_module(f"dask_scd.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"dask_scd.{name}":
                raise
            raise AttributeError(f"module 'dask_scd' has no attribute {name!r}") from None
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
