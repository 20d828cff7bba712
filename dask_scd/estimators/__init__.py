"""scikit-learn estimators over :func:`dask_scd.fit`: Ridge, Lasso, ElasticNet,
LogisticRegression and LinearSVC.

They take what ``fit`` takes (numpy, scipy.sparse, pandas, dask arrays, grid stores,
xarray, libsvm files) and pass the scikit-learn estimator checks. Every model minimizes

    P(θ, b) = (1/n) Σ loss(y_i, x_iᵀθ + b) + alpha·(l1_ratio·‖θ‖₁ + (1 − l1_ratio)/2·‖θ‖²)

and carries the certificate of its fit: ``dual_gap_`` (relative duality gap) and
``history_``.

The package, one concern per module: ``base`` (the shared base
classes: input handling, fitting, prediction), ``regressors``
and ``classifiers`` (the public estimators),
``docstrings`` (their shared docstring sections),
``fitting`` (one fit per target, warm starts, one-vs-rest fits as
tasks on the current ``distributed.Client``), ``cv`` (LassoCV, ElasticNetCV, RidgeCV,
LogisticRegressionCV) and ``path_cv`` (their folds and scored paths as tasks), and
``multiclass``
(class labels, one-vs-rest targets, probabilities from decision values); labels of
decision values and lazy decision values of dask input are
``dask_scd.result.class_labels`` and ``dask_scores``, which ``FitResult`` uses too.
"""

from dask_scd.estimators.classifiers import LinearSVC, LogisticRegression
from dask_scd.estimators.cv import ElasticNetCV, LassoCV, RidgeCV
from dask_scd.estimators.logistic_cv import LogisticRegressionCV
from dask_scd.estimators.regressors import ElasticNet, Lasso, Ridge

__all__ = [
    "ElasticNet",
    "ElasticNetCV",
    "Lasso",
    "LassoCV",
    "LinearSVC",
    "LogisticRegression",
    "LogisticRegressionCV",
    "Ridge",
    "RidgeCV",
]
