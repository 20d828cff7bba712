"""The docstring sections that the five estimators share: common parameters, attributes
and accepted inputs, filled into each class's template by :func:`_docstring`."""

import re

_COMMON_PARAMETERS = """
    fit_intercept : bool, default=True
        Fit an unpenalized intercept b (X is never centred).
    tol : float, default=1e-6
        Target relative duality gap ``(P − D)/|P|``: the fit stops once it is certified
        below ``tol`` (a bound on the objective's distance to the optimum, unlike
        scikit-learn's ``tol``, which bounds the coefficients' last change).
    max_iter : int, default=1000
        Maximum number of epochs (passes over all coordinates, or over all blocks on a
        cluster).
    solver : {"auto", "gram", "scd", "sdca", "block_scd"}, default="auto"
        The engine (see :func:`dask_scd.fit`); "auto" chooses from the problem and the
        size of the data. Not scikit-learn's solver names.
    warm_start : bool, default=False
        Reuse the previous solution when refitting (regularization paths): the
        previous model is kept, without any epoch, when its certificate for the new
        parameters is already below ``tol`` (in-memory data); otherwise the fit starts
        from it (``coef_init`` of :func:`dask_scd.fit`).
    random_state : int, numpy.random.Generator or None, default=None
        Seeds the coordinate (or block) order: the same seed gives the same model.
    verbose : bool, int or "auto", default=0
        0: silent; 1: a progress bar in a terminal or notebook, else a line per
        certified epoch; 2: a line per certified epoch (see :class:`dask_scd.Progress`).
"""

_BOX_PARAMETERS = """
    lower_bounds, upper_bounds : float, array-like or None, default=None
        Coefficient constraints ``lower_bounds <= coef_ <= upper_bounds``, a number or
        an array of shape (n_features,) (glum's and Spark MLlib's bounds; ``-inf`` /
        ``+inf`` leave a side open; the intercept is never bounded): every coordinate
        step clips into the box and ``dual_gap_`` is the box's duality gap
        (:func:`dask_scd.fit`; solved by the engines "scd" and "block_scd", which
        "auto" picks).
"""

_BOUND_PARAMETERS = (
    """
    positive : bool, default=False
        Constrain the coefficients to be >= 0 (scikit-learn's ``positive``; the same as
        ``lower_bounds=0``, which it may not be given with)."""
    + _BOX_PARAMETERS
)

_COMMON_ATTRIBUTES = """
    n_iter_ : {n_iter}
        Epochs run{per_model}.
    dual_gap_ : {dual_gap}
        Relative duality gap ``(P − D)/|P|`` certified at the end of the fit{per_model}.
    history_ : History{history}
        The certified epochs: relative gap, objective and time of each.
    solver_ : str
        The engine that ran.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of the features seen during fit (DataFrame columns, the feature coordinate
        of an xarray object, a grid's feature names); absent when X has none.
"""

_INPUTS = """
    X may be a numpy array, a scipy.sparse matrix, a pandas DataFrame, a dask array
    (numpy or scipy.sparse chunks, any chunking: column chunks are the engine's blocks),
    a :class:`dask_scd.Grid` or the path of one, an xarray DataArray (sample, feature)
    or Dataset (one column per 1-D variable), or the path of a libsvm file. ``predict``
    of a dask array or a grid is lazy and returns a dask array.

    ``fit(X, y, sample_weight=w)`` weighs the examples: the loss term becomes
    ``(1/Σw) Σ w_i loss_i`` (docs/objectives.md), solved by "newton", "sdca", "gram" and,
    over Dask, "block_newton" ("auto" picks among them); the multinomial model of more
    than two classes takes them too.
"""

_CLASS_WEIGHT = """
    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplying ``sample_weight``, as scikit-learn defines
        them: a dict ``{label: weight}`` (classes left out weigh 1), or "balanced",
        ``n_samples / (n_classes · count_k)`` for class k (the counts weighted by
        ``sample_weight`` when given). With ``C`` the model is fitted with
        ``alpha = 1 / (C · Σw)``, Σw the sum of the combined weights, which is
        scikit-learn's ``C Σ w_i loss_i + penalty``. With more than two classes the
        multinomial model weighs each example by its class's weight, and so does every
        one-vs-rest model.
"""

_REGRESSOR_ATTRIBUTES = _COMMON_ATTRIBUTES.format(
    n_iter="int", dual_gap="float", history="", per_model=""
)
_CLASSIFIER_ATTRIBUTES = _COMMON_ATTRIBUTES.format(
    n_iter="ndarray of shape (n_models,)",
    dual_gap="ndarray of shape (n_models,)",
    history=" or list of History",
    per_model=", one entry per binary model",
)


# The cross-validated estimators' shared sections.
_CV_PARAMETERS = """
    cv : int, cross-validation splitter or iterable, default=None
        The folds (scikit-learn's ``cv``): None for 5 folds, an int for that many
        (``KFold``; ``StratifiedKFold`` for a classifier), a splitter such as
        ``KFold(5, shuffle=True, random_state=0)``, or (train, test) index pairs.
    n_jobs : int or None, default=None
        Accepted for scikit-learn's signature; it changes nothing. The folds run as
        tasks on the current ``distributed.Client`` when one is running (its workers set
        the parallelism), else one after the other in this process (see Notes).
    tol : float, default=1e-6
        Target relative duality gap ``(P − D)/|P|`` of every path point and of the refit.
    max_iter : int, default=1000
        Maximum iterations of the engine per point (see :func:`dask_scd.fit`).
    solver : str, default="auto"
        The engine (see :func:`dask_scd.fit`).
    random_state : int, numpy.random.Generator or None, default=None
        Seeds the engines' coordinate order.
    verbose : bool or int, default=0
        Progress of each fit (see :class:`dask_scd.Progress`).
"""

_CV_NOTES = """
    In memory (numpy, scipy.sparse, pandas), on a running ``distributed.Client`` the
    folds' paths are tasks on its workers (X sent once); else they run here, one after
    the other. A dask array or a grid is never sliced or copied: each fold's path is the
    weighted :func:`dask_scd.path` of all of X with weight 0 on the held-out rows (the
    same objective as the training rows' alone), the folds one after the other, each
    point a :func:`dask_scd.fit` that runs on the cluster (in memory below
    ``in_memory_limit``, as ``fit`` decides); the held-out rows are scored from a lazy
    product of X with the path's coefficients. The folds, the grid and the choice are
    those of the same data in memory. Every path point is certified below ``tol`` by
    its duality gap.
"""


_SAMPLE_WEIGHT = """
            Non-negative weights of the examples (a number: the same for every row; a
            dask vector chunked like y for a dask X; a grid's stored weights when
            omitted). Each fold's path weighs its training rows by w, the held-out
            scores are weighted by w, and the refit uses w: integer weights are the
            rows repeated, with the same folds.
"""


_PLACEHOLDER = re.compile(r"^ *\{(\w+)\}$", re.MULTILINE)
_SECTIONS = {
    "common_parameters": _COMMON_PARAMETERS,
    "regressor_attributes": _REGRESSOR_ATTRIBUTES,
    "classifier_attributes": _CLASSIFIER_ATTRIBUTES,
    "class_weight": _CLASS_WEIGHT,
    "inputs": _INPUTS,
    "bound_parameters": _BOUND_PARAMETERS,
    "box_parameters": _BOX_PARAMETERS,
    "cv_parameters": _CV_PARAMETERS,
    "cv_notes": _CV_NOTES,
    "sample_weight": _SAMPLE_WEIGHT,
}


def _docstring(template: str) -> str:
    """``template`` with each line that is a ``{section}`` replaced by that section (in
    its own indentation)."""
    return _PLACEHOLDER.sub(lambda found: _SECTIONS[found[1]].strip("\n"), template)


def _fill_doc(method):
    """A method whose docstring :func:`_docstring` fills in."""
    method.__doc__ = _docstring(method.__doc__)
    return method
