"""Input checks, done once in the wrappers so that kernels never validate."""

from __future__ import annotations

import contextlib
import contextvars
import numbers
import os
import sys
import warnings

import numpy as np
import scipy.sparse as sp

from dask_scd.kernels.layout import check_structure
from dask_scd.kernels.lines import largest_magnitude as largest_magnitude
from dask_scd.objectives import (
    CLASSIFICATION_LOSSES,
    LOSSES,
    MULTINOMIAL,
    PENALTIES,
    UNPENALIZED_LOSSES,
    Bounds,
    Problem,
)

# The weighted objective's own rule, kept beside it; callers read it here too.
from dask_scd.objectives import check_sample_weight as check_sample_weight
from dask_scd.objectives.weights import one_per_row
from dask_scd.objectives.weights import per_row_weights as per_row_weights

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_collected: contextvars.ContextVar = contextvars.ContextVar("dask_scd_warnings", default=None)


class TaskOverheadWarning(UserWarning):
    """A Dask engine was named for data so small, or so finely chunked, that the
    scheduler's time per task will dominate its epochs (:func:`dask_scd.fit` says what it
    found and what to do: larger chunks, or ``solver="auto"``)."""


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """Issue a warning at the user's line: the first frame outside ``dask_scd``.

    Inside :func:`collect_warnings` (a fit run as a task on a worker) the warning is kept
    for the caller's process to issue again instead.
    """
    collected = _collected.get()
    if collected is not None:
        collected.append((category, str(message)))
        return
    warnings.warn(message, category, stacklevel=_caller_level())


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside the package, for the caller of warn."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


@contextlib.contextmanager
def collect_warnings():
    """Keep the package's warnings in a list of ``(category, message)`` rather than issue
    them: a task on a worker returns them for :func:`reissue` in the caller's process."""
    collected = []
    token = _collected.set(collected)
    try:
        yield collected
    finally:
        _collected.reset(token)


def reissue(collected) -> None:
    """Issue again, at the user's line, warnings kept by :func:`collect_warnings`."""
    for category, message in collected:
        warn(message, category)


def check_problem(loss, penalty, alpha, l1_ratio, fit_intercept) -> Problem:
    """Validate the problem's arguments and return a :class:`Problem`.

    ``penalty=None`` (the smooth losses "squared" and "logistic" only) is the problem
    without regularization: alpha is ignored and the Problem has alpha 0.
    """
    if loss not in LOSSES and loss != MULTINOMIAL:
        raise ValueError(f"loss={loss!r} is not one of {(*LOSSES, MULTINOMIAL)}")
    if not isinstance(fit_intercept, bool | np.bool_):
        # bool("no") is True: anything but a real bool is refused rather than guessed at.
        raise ValueError(f"fit_intercept={fit_intercept!r} must be True or False")
    if penalty is None:
        if loss not in UNPENALIZED_LOSSES:
            raise ValueError(
                f"penalty=None (no regularization) is fitted for loss in "
                f"{UNPENALIZED_LOSSES}, got loss={loss!r}"
            )
        return Problem(loss=loss, alpha=0.0, l1_ratio=0.0, fit_intercept=bool(fit_intercept))
    if penalty not in PENALTIES:
        raise ValueError(f"penalty={penalty!r} is not one of {PENALTIES}")
    if not isinstance(alpha, numbers.Real) or not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(
            f"alpha={alpha!r} must be a finite number > 0 (the dual and the duality gap "
            "need a strictly positive regularization)"
        )
    if not isinstance(l1_ratio, numbers.Real) or not 0.0 <= l1_ratio <= 1.0:
        raise ValueError(f"l1_ratio={l1_ratio!r} must be in [0, 1]")
    if loss == "hinge" and penalty != "l2":
        raise ValueError(
            f"loss='hinge' needs penalty='l2' (got penalty={penalty!r}): the hinge is not "
            "smooth, so it is solved in the dual, which exists for the L2 penalty only; "
            "use loss='squared_hinge' for an L1 or elastic-net SVM"
        )
    rho = {"l2": 0.0, "l1": 1.0, "elasticnet": float(l1_ratio)}[penalty]
    return Problem(loss=loss, alpha=float(alpha), l1_ratio=rho, fit_intercept=bool(fit_intercept))


def check_bounds(lower_bounds, upper_bounds, n_features: int) -> Bounds | None:
    """The box ``lower_bounds <= θ <= upper_bounds`` as :class:`Bounds`, or None.

    Each side is None (open), a number (every feature's) or an array of shape
    (n_features,), ``-inf`` / ``+inf`` allowed for an open side; lower ≤ upper, else a
    ValueError naming the first feature where it is not. A box open on every side is None:
    the problem without bounds.
    """
    lower = _bound_side(lower_bounds, n_features, "lower_bounds")
    upper = _bound_side(upper_bounds, n_features, "upper_bounds")
    if lower is None and upper is None:
        return None
    lower = np.full(n_features, -np.inf) if lower is None else lower
    upper = np.full(n_features, np.inf) if upper is None else upper
    if (lower == np.inf).any() or (upper == -np.inf).any():
        raise ValueError("lower_bounds cannot be +inf nor upper_bounds -inf: no θ lies there")
    wrong = np.flatnonzero(lower > upper)
    if len(wrong):
        j = int(wrong[0])
        raise ValueError(
            f"lower_bounds must be <= upper_bounds: at feature {j}, lower_bounds[{j}] = "
            f"{float(lower[j])!r} > upper_bounds[{j}] = {float(upper[j])!r} ({len(wrong)} "
            "such features)"
        )
    if np.isneginf(lower).all() and np.isposinf(upper).all():
        return None
    return Bounds(lower, upper)


def _bound_side(values, n_features: int, name: str):
    """One side of the box as float64 of shape (n_features,), or None (``values`` None)."""
    if values is None:
        return None
    if isinstance(values, bool | np.bool_):
        raise ValueError(f"{name}={values!r} must be a number or an array of numbers")
    try:
        side = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be a number or an array of numbers, got {values!r}"
        ) from None
    if side.ndim == 0:
        side = np.full(n_features, float(side))
    if side.shape != (n_features,):
        raise ValueError(
            f"{name} has shape {side.shape}, expected a number or shape ({n_features},): "
            "one bound per feature of X"
        )
    if np.isnan(side).any():
        raise ValueError(f"{name} contains NaN (first at index {int(np.argmax(np.isnan(side)))})")
    return side


class LazyGenerator:
    """``numpy.random.default_rng(seed)`` (None or a seed ≥ 0) made at the first read of
    :attr:`generator`: a Newton fit without its Hessian sample draws nothing, and making
    one costs ~40 µs inside a fit, a third of a small fit's Newton step."""

    __slots__ = ("_seed", "_generator")

    def __init__(self, seed):
        self._seed, self._generator = seed, None

    @property
    def generator(self) -> np.random.Generator:
        if self._generator is None:
            self._generator = np.random.default_rng(self._seed)
        return self._generator


def as_generator(rng) -> np.random.Generator:
    """``rng`` itself, or the Generator of a :class:`LazyGenerator`."""
    return rng.generator if isinstance(rng, LazyGenerator) else rng


def check_random_state(random_state):
    """The Generator of ``random_state`` (None, a seed or a Generator, returned as it is):
    a :class:`LazyGenerator` for None or a seed ≥ 0 (made on first use)."""
    if isinstance(random_state, (LazyGenerator, np.random.Generator)):
        return random_state
    seed = isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool)
    if random_state is None or (seed and random_state >= 0):
        return LazyGenerator(None if random_state is None else int(random_state))
    try:
        return np.random.default_rng(random_state)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"random_state={random_state!r} must be None, an integer >= 0, a sequence of "
            f"them or a numpy.random.Generator ({exc})"
        ) from None


def check_fit_args(tol, max_iter) -> None:
    if not isinstance(tol, numbers.Real) or not tol > 0:
        raise ValueError(f"tol={tol!r} must be a number > 0 (a relative duality gap)")
    if not isinstance(max_iter, numbers.Integral) or max_iter < 1:
        raise ValueError(f"max_iter={max_iter!r} must be an integer ≥ 1")


def check_start(coef_init, intercept_init, n_features: int, fit_intercept: bool):
    """A warm start (θ, b) for :class:`dask_scd.engines.base.Options`, or None.

    θ is copied (the caller's array is never modified) and defaults to zeros; b defaults
    to 0 (and is 0 without an intercept). Neither given: None, a cold start.
    """
    if coef_init is None and intercept_init is None:
        return None
    coef = np.zeros(n_features) if coef_init is None else np.array(coef_init, dtype=np.float64)
    if coef.shape != (n_features,):
        raise ValueError(
            f"coef_init has shape {np.shape(coef_init)}, expected "
            f"({n_features},): one coefficient per feature of X"
        )
    if not np.all(np.isfinite(coef)):
        raise ValueError("coef_init holds NaN or infinite values")
    intercept = 0.0 if intercept_init is None else intercept_init
    if not isinstance(intercept, numbers.Real) or not np.isfinite(intercept):
        raise ValueError(f"intercept_init={intercept_init!r} must be a finite number")
    return coef, float(intercept) if fit_intercept else 0.0


# The sparse formats the in-memory engines read directly; any other is converted to CSR.
ENGINE_SPARSE_FORMATS = ("csr", "csc")
# Labels or features beyond this make (y − ŷ)², ‖x_i‖², the curvature and the sums of the
# duality gap overflow float64.
MAX_VALUE = 1e100


def check_matrix(X, *, bounded: bool = True):
    """Check an in-memory design matrix.

    Returns X itself when the engines read it as it is (numpy, CSR, CSC), else a new
    object: other scipy.sparse formats (COO, LIL, DOK, BSR, DIA) and pydata ``sparse``
    arrays become CSR, a pandas DataFrame of nullable numeric columns a float64 array
    with NaN for its missing values (xarray objects are read by
    :func:`dask_scd.data.read_input` first). The caller's object is never modified.
    ``bounded``: also refuse values beyond ``MAX_VALUE``, where a fit's sums overflow (a
    prediction's product does not: False at prediction time).
    """
    check_structure(X)  # before any format change reads the indices
    X = _engine_matrix(X)
    if not sp.issparse(X):
        X = np.asarray(X)
        if X.dtype == object:
            X = object_numbers(X)
    check_2d(X)
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"X is empty: shape {X.shape}")
    X = as_engine_dtype(X)
    values = X.data if sp.issparse(X) else X
    if values.size == 0:
        return X
    largest = largest_magnitude(values)
    if not np.isfinite(largest):
        raise ValueError(_nonfinite_message(X))
    if bounded:
        check_feature_magnitude(largest)
    return X


def check_finite(X, origin: tuple = (0, 0), where: str = "") -> None:
    """Refuse NaN and infinity in a 2-D X (numpy, scipy.sparse or pydata sparse), with a
    ValueError naming which and where the first one is. A dask array's chunk is checked
    when it is computed: ``origin`` is its first entry's (row, column) in the array, the
    place reported; ``where`` is added to it (" of row chunk 3") when that is unknown."""
    values = X.data if sp.issparse(X) or is_pydata_sparse(X) else X
    values = np.asarray(values)
    # Integers cannot be NaN; max/min find a non-finite value without a boolean temporary.
    if values.dtype.kind == "f" and not np.isfinite(largest_magnitude(values)):
        raise ValueError(_nonfinite_message(X, origin, where))


def first_nonfinite(X) -> tuple[int, int, str]:
    """(row, column, "NaN", "inf" or "-inf") of the first NaN or infinity of a 2-D X
    (numpy, scipy.sparse or pydata sparse), row by row (the error path only: X holds one)."""
    if sp.issparse(X) or is_pydata_sparse(X):
        X = to_scipy(X)  # CSR: its stored values in row order
        first = int(np.argmax(~np.isfinite(X.data)))
        row = int(np.searchsorted(X.indptr, first, side="right")) - 1
        column, value = int(X.indices[first]), X.data[first]
    else:
        X = np.asarray(X)
        row, column = (int(i) for i in np.argwhere(~np.isfinite(X))[0])
        value = X[row, column]
    return row, column, "NaN" if np.isnan(value) else "inf" if value > 0 else "-inf"


def _nonfinite_message(X, origin: tuple = (0, 0), where: str = "") -> str:
    """The error of X's first NaN or infinity, row by row (the error path only)."""
    row, column, which = first_nonfinite(X)
    return (
        f"X contains NaN or infinity (first at row {origin[0] + row}, column "
        f"{origin[1] + column}{where}): the value there is {which}"
    )


def check_2d(X) -> None:
    """Refuse an X that is not 2-D (from the shape alone)."""
    if len(X.shape) != 2:
        raise ValueError(f"X must be 2-D of shape (n_samples, n_features), got shape {X.shape}")


def check_known_chunks(a, name: str = "X") -> None:
    """Refuse a dask array whose chunk sizes are unknown (NaN in its chunks)."""
    if any(np.isnan(c) for axis in a.chunks for c in axis):
        raise ValueError(
            f"{name} has unknown chunk sizes (NaN in {name}.chunks); "
            f"call {name}.compute_chunk_sizes() first"
        )


def check_n_features(X, n_features: int) -> None:
    """Refuse an X that is not 2-D or not ``n_features`` wide, the fitted model's (from
    the shape alone: a dask array is not computed)."""
    check_2d(X)
    if X.shape[1] != n_features:
        raise ValueError(f"X has {X.shape[1]} features, but this model was fitted on {n_features}")


# The dtypes the engines read X in; every other numeric dtype (integers, bool, float16) is
# converted to float64 once, before any engine is chosen or any statistic of X is taken:
# ``auto``'s cost model and the engines then see the same values, and no sum of squares is
# taken in a dtype that wraps (int8 row norms overflowed).
ENGINE_DTYPES = (np.float64, np.float32)


def engine_dtype(dtype) -> np.dtype:
    """The dtype the engines read an X of ``dtype`` in (ValueError if not numeric)."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "biuf":
        raise ValueError(f"X must be numeric, got dtype {dtype}")
    return dtype if dtype in ENGINE_DTYPES else np.dtype(np.float64)


def object_numbers(X) -> np.ndarray:
    """A float64 copy of an object array that holds numbers (scikit-learn converts one
    alike), else a ValueError naming its first entry that is not a number."""
    try:
        return X.astype(np.float64)
    except (TypeError, ValueError):
        pass
    for index, value in np.ndenumerate(X):
        try:
            float(value)
        except (TypeError, ValueError):
            where = ", ".join(str(i) for i in index)
            raise ValueError(
                f"X must be numeric: X[{where}] = {value!r} ({type(value).__name__}) "
                "is not a number"
            ) from None
    raise ValueError("X must be numeric, got dtype object")


def as_engine_dtype(X):
    """X itself when its dtype is an engine's (float64, float32), else a float64 copy
    (numpy, scipy.sparse or dask array alike; the caller's object is never modified)."""
    dtype = engine_dtype(X.dtype)
    return X if X.dtype == dtype else X.astype(dtype)


def check_feature_magnitude(largest: float, where: str = "") -> None:
    """Refuse feature values whose squares and sums overflow float64 (``where``: " in ...")."""
    if largest > MAX_VALUE:
        raise ValueError(
            f"X is too large{where}: max |X| = {largest:.3e} > {MAX_VALUE:.0e}, where ‖x_i‖², "
            "the curvature and the sums of the duality gap overflow float64; rescale the "
            "features (e.g. sklearn.preprocessing.StandardScaler or MaxAbsScaler)"
        )


def _engine_matrix(X):
    if sp.issparse(X):
        return X if X.format in ENGINE_SPARSE_FORMATS else X.tocsr()  # tocsr: a new object
    if is_pydata_sparse(X):  # numpy refuses to densify it
        return to_scipy(X)
    if type(X).__module__.startswith("pandas") and hasattr(X, "dtypes"):
        return numeric_frame(X)
    return X


def is_pydata_sparse(obj) -> bool:
    """A pydata ``sparse`` array (by module name, as :func:`is_dask`)."""
    return type(obj).__module__.startswith("sparse")


def is_dask(obj) -> bool:
    """A dask array (checked by module name: importing dask is not needed to say no).
    The one test of it: the data layer, the results and the grid writer ask here."""
    return type(obj).__module__.startswith("dask.") and hasattr(obj, "chunks")


def to_scipy(chunk):
    """A scipy.sparse CSR matrix of a scipy.sparse or pydata ``sparse`` chunk (not copied
    when it already is one)."""
    if sp.issparse(chunk):
        return sp.csr_matrix(chunk)
    if hasattr(chunk, "to_coo"):  # pydata sparse DOK
        chunk = chunk.to_coo()
    if hasattr(chunk, "to_scipy_sparse"):  # pydata sparse COO, GCXS
        return sp.csr_matrix(chunk.to_scipy_sparse())
    return sp.csr_matrix(np.asarray(chunk))


def numeric_frame(frame, name: str = "X"):
    """A pandas DataFrame of numbers: numeric columns with nullable ones as float64,
    NA → NaN; a column of another dtype that holds numbers (object, categories of
    numbers) as float64; else a TypeError naming the columns that are not numbers.

    numpy turns nullable columns (Float64, Int64) into an object array; plain numpy
    columns are left to ``np.asarray``, which keeps float32 as it is.
    """
    import pandas as pd

    dtypes = list(frame.dtypes)
    if all(pd.api.types.is_numeric_dtype(d) for d in dtypes):
        if all(isinstance(d, np.dtype) for d in dtypes):
            return frame
        return frame.to_numpy(dtype=np.float64, na_value=np.nan)
    check_numeric_columns(frame, name)
    return frame.to_numpy(dtype=np.float64, na_value=np.nan)


def check_numeric_columns(frame, name: str = "X") -> None:
    """Refuse a pandas DataFrame with a column that is not numbers (strings, categories
    of strings, dates), naming them; a column of numbers in another dtype passes."""
    import pandas as pd

    bad = [
        (column, dtype)
        for k, (column, dtype) in enumerate(frame.dtypes.items())
        if not pd.api.types.is_numeric_dtype(dtype) and not _holds_numbers(frame.iloc[:, k])
    ]
    if bad:
        raise non_numeric_columns(bad, "sklearn.preprocessing.OneHotEncoder", name)


def _holds_numbers(column) -> bool:
    try:
        column.to_numpy(dtype=np.float64, na_value=np.nan)
    except (TypeError, ValueError):
        return False
    return True


def non_numeric_columns(bad: list, encoder: str, name: str = "X") -> TypeError:
    """The error for a frame's columns that are not numbers: ``bad`` their (name, dtype)
    pairs, ``encoder`` what turns them into numbers."""
    described = ", ".join(f"{str(column)!r} ({dtype})" for column, dtype in bad[:10])
    return TypeError(
        f"{name} has non-numeric columns {described}{', ...' if len(bad) > 10 else ''}"
        f": the features must be numbers; encode these columns (e.g. {encoder}) or drop "
        "them"
    )


def _missing_labels(y) -> np.ndarray:
    """Where an object array of labels holds None, NaN or pandas' NA."""

    def missing(v):
        return v is None or (isinstance(v, float) and np.isnan(v)) or type(v).__name__ == "NAType"

    return np.fromiter((missing(v) for v in y), dtype=bool, count=len(y))


def check_labels(y, n_samples: int, loss: str):
    """Check y; map classification labels to ±1 (to class indices for "multinomial").

    Returns
    -------
    y : array of shape (n_samples,), float64 (a new array: the caller's is untouched);
        for ``loss="multinomial"`` the index of each label in ``classes`` (intp)
    classes : array of shape (2,) or None; ``classes[0]`` ↦ −1, ``classes[1]`` ↦ +1
        (of shape (n_classes,), sorted, for "multinomial").
    """
    if type(y).__module__.startswith("pandas") and hasattr(y, "dtype"):
        y = numeric_frame(y, "y") if hasattr(y, "dtypes") and y.ndim == 2 else pandas_labels(y)
    y = one_per_row(y, n_samples, "y", "labels")
    if y.dtype.kind == "O" and _missing_labels(y).any():
        raise ValueError(f"y contains None or NaN (first at index {np.argmax(_missing_labels(y))})")
    if loss not in CLASSIFICATION_LOSSES and loss != MULTINOMIAL:
        if y.dtype.kind not in "biuf":
            raise ValueError(f"y must be numeric for loss={loss!r}, got dtype {y.dtype}")
        y = y.astype(np.float64)  # always a copy
        check_label_values(y)
        return y, None
    if y.dtype.kind == "f":
        _check_finite_labels(y)
    try:
        classes = np.unique(y)
    except TypeError as exc:  # labels of types that do not compare (1 and "a")
        raise ValueError(f"y mixes labels that cannot be compared: {exc}") from None
    if len(classes) < 2:
        raise ValueError(f"y has a single class {classes.tolist()}: a classifier needs two")
    if loss == MULTINOMIAL:
        return np.searchsorted(classes, y).astype(np.intp), classes
    if len(classes) > 2:
        raise ValueError(
            f"loss={loss!r} is a binary loss but y has {len(classes)} classes "
            f"({classes[:5].tolist()}...); for more than two classes use loss='multinomial' "
            "(one softmax model), or fit one binary model per class (one-vs-rest: y == k "
            "against the rest)"
        )
    return np.where(y == classes[1], 1.0, -1.0), classes


def check_label_values(y) -> None:
    """Refuse float64 regression targets whose duality gap cannot be computed."""
    _check_finite_labels(y)
    largest = float(np.max(np.abs(y))) if len(y) else 0.0
    if largest > MAX_VALUE:
        raise ValueError(
            f"y is too large: max |y| = {largest:.3e} > {MAX_VALUE:.0e}, where the squares of "
            "the residuals and the sums of the duality gap overflow float64; rescale y "
            "(e.g. y / y.std())"
        )


def _check_finite_labels(y) -> None:
    if not np.isfinite(y).all():
        raise ValueError(
            f"y contains NaN or infinity (first at index {np.argmax(~np.isfinite(y))})"
        )


def pandas_labels(series):
    """A Series of labels as numpy: nullable numbers (Float64, Int64) as float64 with NaN
    for NA, anything else as ``to_numpy`` gives it (int labels stay ints)."""
    import pandas as pd

    dtype, types = series.dtype, pd.api.types
    if not isinstance(dtype, np.dtype) and types.is_numeric_dtype(dtype):
        if not types.is_bool_dtype(dtype):
            return series.to_numpy(dtype=np.float64, na_value=np.nan)
    return series.to_numpy()


def check_weighted_classes(y, weights) -> None:
    """Refuse ±1 labels whose examples of positive weight are all of one class."""
    if weights is None:
        return
    present = np.unique(y[weights > 0])
    if len(present) < 2:
        raise ValueError(
            f"sample_weight leaves a single class with positive weight "
            f"({present.tolist()} in ±1 terms): a classifier needs two classes"
        )
