"""dask_scd: regularized linear models by coordinate descent, certified by duality gaps."""

from dask_scd.api import fit
from dask_scd.objectives import Certificate, Problem, certificate
from dask_scd.result import FitResult, History

__all__ = ["fit", "FitResult", "History", "Problem", "Certificate", "certificate"]
__version__ = "0.1.0"
