"""Saving and loading fitted models: :func:`save` writes an estimator or a
:class:`~dask_scd.FitResult` to one file, :func:`load` reads it back.

The file is a numpy ``.npz`` archive (format ``"dask_scd.model"``, version
``FORMAT_VERSION``) read with ``allow_pickle=False``: nothing in it is ever run. It holds

- ``metadata``: a 0-d string array, one JSON document: ``format`` and ``format_version``,
  ``library_version`` (the dask_scd that wrote it), ``model`` (the class name), ``params``
  (an estimator's ``get_params()``), a summary for the reader (``problem``: loss,
  penalty, alpha, l1_ratio, fit_intercept and the values a cross-validation chose;
  ``classes``: the labels and their dtype; ``certificate``: primal and dual objectives,
  relative gap, iterations, solver) and ``attributes``, every fitted attribute (the
  fields of a FitResult);
- one array entry per array attribute (``coef_``, ``intercept_``, ``classes_``, ...),
  stored exactly: a loaded model predicts bit for bit as the saved one.

In the JSON, a value that plain JSON would change is tagged: ``{"__array__": entry}``,
``{"__tuple__": [...]}``, ``{"__dict__": [[key, value], ...]}`` (any dict: keys may be
class labels), ``{"__float__": "nan"}``, ``{"__history__": {...}}``,
``{"__histories__": {"histories", "labels", "name"}}`` (a one-vs-rest model's) and
``{"__object_array__": [...], "shape": [...]}`` (labels or feature names of dtype
object). Loading imports scikit-learn and numpy, never ``distributed``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import zipfile

import numpy as np

from dask_scd.data.files import write_atomically
from dask_scd.result import FitResult, Histories, History

__all__ = ["FORMAT", "FORMAT_VERSION", "READABLE_VERSIONS", "NotAModelError", "load", "save"]

FORMAT = "dask_scd.model"
FORMAT_VERSION = 1
#: The format versions :func:`load` reads.
READABLE_VERSIONS = (1,)
METADATA = "metadata"  # the archive's entry holding the JSON document

_PLAIN = "a number, string, boolean, None, or a list, tuple, dict or array of them"


def save(model, path) -> None:
    """Write a fitted estimator or a :class:`~dask_scd.FitResult` to ``path``.

    The file is written to a temporary file in the same directory, then renamed onto
    ``path``: it is never left half written, and a reader sees the old file or the new
    one. ``path`` is used as given (no ``.npz`` is added).

    Parameters
    ----------
    model : estimator or FitResult
        A fitted dask_scd estimator (``Ridge``, ``Lasso``, ``ElasticNet``,
        ``LogisticRegression``, ``LinearSVC``, ``RidgeCV``, ``LassoCV``,
        ``ElasticNetCV``, ``LogisticRegressionCV``), or the result of
        :func:`dask_scd.fit`.
    path : str or os.PathLike
        The file to write (an existing file is replaced).

    Raises
    ------
    ValueError
        If the model is not one of these, is not fitted, or holds a parameter that
        cannot be stored (anything but a number, string, boolean, None, or a list,
        tuple, dict or array of them: a splitter object as ``cv``, a callable
        ``scoring``).
    FileNotFoundError
        If the directory of ``path`` does not exist.

    See Also
    --------
    load : read the file back.
    """
    path = os.fspath(path)
    metadata, arrays = _document(model)
    text = json.dumps(metadata, allow_nan=False)  # strict JSON: non-finite floats are tagged
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot save to {path}: directory {directory} does not exist")
    write_atomically(
        path, lambda handle: np.savez_compressed(handle, **{METADATA: np.array(text)}, **arrays)
    )


def load(path):
    """Read a model written by :func:`save` (or by ``dask-scd fit --out model.json``).

    Needs numpy and scikit-learn only: a process that loads a model and predicts with
    it never imports ``distributed``.

    Parameters
    ----------
    path : str or os.PathLike
        A file written by :func:`save`, or the JSON model of the ``dask-scd fit``
        command (read as a :class:`~dask_scd.FitResult`).

    Returns
    -------
    estimator or FitResult
        The model as it was saved: an estimator of the same class with the same
        ``get_params()`` and fitted attributes (it predicts and scores at once), or a
        FitResult.

    Raises
    ------
    FileNotFoundError
        If there is no file at ``path``.
    ValueError
        If the file is not a dask_scd model, or was written in a format version this
        dask_scd does not read (a newer one: the message names both versions).

    See Also
    --------
    save : write a model.
    """
    path = os.fspath(path)
    with open(path, "rb") as handle:
        start = handle.read(64)
    if start.lstrip().startswith(b"{"):
        return _load_cli_json(path)
    metadata, arrays = _read_archive(path)
    _check_format(path, metadata)
    try:
        return _build(metadata, arrays)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"{path} is a damaged dask_scd model file ({error!r})") from None


# ------------------------------------------------------------------ encoding


class _Encoder:
    """Values as JSON (:func:`save`'s tags where plain JSON would change them), their
    arrays collected in ``arrays`` under the name of where they were found."""

    def __init__(self):
        self.arrays = {}

    def encode(self, value, where: str, lenient: bool = False):
        """``value`` as JSON; ``lenient``: a value of another type becomes its repr (the
        engines' diagnostics in ``extras_``), else a ValueError naming ``where``."""
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, numbers.Real):
            value = float(value)
            return value if math.isfinite(value) else {"__float__": repr(value)}
        if isinstance(value, np.ndarray):
            return self._array(value, where)
        if isinstance(value, History):
            record = value.as_dict().items()
            return {"__history__": {key: self.encode(v, where) for key, v in record}}
        if isinstance(value, Histories):
            return {
                "__histories__": {
                    "histories": [self.encode(h, f"{where}.{k}") for k, h in enumerate(value)],
                    "labels": self.encode(list(value.labels), f"{where}.labels"),
                    "name": value.name,
                }
            }
        if isinstance(value, (list, tuple)):
            items = [self.encode(v, f"{where}.{k}", lenient) for k, v in enumerate(value)]
            return {"__tuple__": items} if isinstance(value, tuple) else items
        if isinstance(value, dict):
            return {
                "__dict__": [
                    [self.encode(key, f"{where}.{k}.key"), self.encode(v, f"{where}.{k}", lenient)]
                    for k, (key, v) in enumerate(value.items())
                ]
            }
        if lenient:
            return repr(value)
        raise TypeError(where)

    def _array(self, value: np.ndarray, where: str):
        if value.dtype.kind == "O":  # labels or names of dtype object: their items as JSON
            items = [self.encode(v, f"{where}.{k}") for k, v in enumerate(value.ravel())]
            return {"__object_array__": items, "shape": list(value.shape)}
        if value.dtype.hasobject:
            raise TypeError(where)
        self.arrays[where] = value
        return {"__array__": where}


def _decode(value, arrays: dict):
    """Inverse of :meth:`_Encoder.encode`."""
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    if not isinstance(value, dict):
        return value
    if "__array__" in value:
        return arrays[value["__array__"]]
    if "__float__" in value:
        return float(value["__float__"])
    if "__tuple__" in value:
        return tuple(_decode(v, arrays) for v in value["__tuple__"])
    if "__dict__" in value:
        return {_decode(k, arrays): _decode(v, arrays) for k, v in value["__dict__"]}
    if "__history__" in value:
        record = value["__history__"]
        return History.from_dict({key: _decode(v, arrays) for key, v in record.items()})
    if "__histories__" in value:
        record = value["__histories__"]
        histories = [_decode(h, arrays) for h in record["histories"]]
        return Histories(histories, _decode(record["labels"], arrays), record["name"])
    if "__object_array__" in value:
        items = _decode(value["__object_array__"], arrays)
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(value["shape"])
    raise ValueError(f"unknown tag {sorted(value)}")


# ------------------------------------------------------------------ documents


def _model_classes() -> dict:
    """The classes a file may name: the estimators and FitResult (nothing else is ever
    built from a file)."""
    from dask_scd import estimators

    classes = {name: getattr(estimators, name) for name in estimators.__all__}
    classes["FitResult"] = FitResult
    return classes


def _document(model) -> tuple[dict, dict]:
    """(the JSON metadata, the arrays) of ``model``, checked."""
    name = type(model).__name__
    if _model_classes().get(name) is not type(model):
        raise ValueError(
            f"save writes a dask_scd estimator or FitResult, not {type(model).__qualname__} "
            "(use pickle or joblib for other objects)"
        )
    encoder = _Encoder()
    if isinstance(model, FitResult):
        params = None
        fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(FitResult)}
    else:
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(model)  # NotFittedError, a ValueError, for an unfitted estimator
        params = model.get_params(deep=False)
        fields = {
            key: value
            for key, value in vars(model).items()
            if key.endswith("_") and not key.startswith("_") and key not in params
        }
    encoded_params = None if params is None else {}
    for key, value in (params or {}).items():
        try:
            encoded_params[key] = encoder.encode(value, f"params.{key}")
        except TypeError:
            raise ValueError(
                f"cannot save {name}: its parameter {key}={value!r} is not {_PLAIN} "
                f"(set it to one, e.g. cv=5, or use pickle or joblib)"
            ) from None
    attributes = {
        key: encoder.encode(value, key, lenient=key == "extras_") for key, value in fields.items()
    }
    from dask_scd import __version__

    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "library_version": __version__,
        "model": name,
        "params": encoded_params,
        "problem": _plain(_problem(model)),
        "classes": _classes_summary(getattr(model, "classes_", None)),
        "certificate": _plain(_certificate(model)),
        "attributes": attributes,
    }
    return metadata, encoder.arrays


def _plain(value):
    """A summary value as plain JSON for the reader (dicts as objects, arrays as lists,
    non-finite floats tagged)."""
    if isinstance(value, dict):
        return {str(key): _plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    return _Encoder().encode(value, "summary", lenient=True)


def _problem(model) -> dict:
    """loss, penalty, alpha, l1_ratio, fit_intercept (and C, and what a cross-validation
    chose: alpha_, C_, l1_ratio_) of a model, for the reader of the file."""
    if isinstance(model, FitResult):
        keys = ("loss", "penalty", "alpha", "l1_ratio", "fit_intercept")
        return {key: getattr(model, key) for key in keys}
    problem = getattr(model, "_refit_problem", None)
    if problem is None:
        C = getattr(model, "C", None)
        alpha = getattr(model, "alpha", None)
        problem = {
            "loss": model._loss_name(),
            "penalty": getattr(model, "penalty", model._penalty),
            "alpha": model._default_alpha if alpha is None and C is None else alpha,
            "C": C,
            "l1_ratio": getattr(model, "l1_ratio", None),
            "fit_intercept": model.fit_intercept,
        }
    problem = dict(problem)
    if getattr(model, "multi_class_", None) == "multinomial":
        problem["loss"] = "multinomial"
    for key in ("alpha_", "C_", "l1_ratio_"):
        if hasattr(model, key):
            problem[key] = getattr(model, key)
    return problem


def _classes_summary(classes) -> dict | None:
    if classes is None:
        return None
    classes = np.asarray(classes)
    return {"dtype": str(classes.dtype), "values": _plain(classes)}


def _certificate(model) -> dict:
    """The certificate of the fit (one entry per model for several): relative gap,
    primal and dual objectives, iterations, solver."""
    if isinstance(model, FitResult):
        gap, primal = model.dual_gap_, model.primal_
        extra = {"converged": model.converged_, "grad_norm": model.grad_norm_}
    else:
        gap = getattr(model, "dual_gap_", None)
        histories = getattr(model, "history_", None)
        many = isinstance(histories, list)
        primal = [_last_primal(h) for h in histories] if many else _last_primal(histories)
        extra = {"grad_norm": getattr(model, "grad_norm_", None)}
    dual = None
    if gap is not None and primal is not None and None not in np.atleast_1d(primal).tolist():
        primal_values = np.asarray(primal, dtype=np.float64)
        dual = primal_values - np.asarray(gap, dtype=np.float64) * np.abs(primal_values)
    return {
        "relative_gap": gap,
        "primal": primal,
        "dual": dual,
        "n_iter": getattr(model, "n_iter_", None),
        "solver": getattr(model, "solver_", None),
        **extra,
    }


def _last_primal(history) -> float | None:
    return history.primal[-1] if isinstance(history, History) and history.primal else None


def _build(metadata: dict, arrays: dict):
    """The model a checked file describes."""
    name = metadata["model"]
    cls = _model_classes().get(name)
    if cls is None:
        raise ValueError(f"it names an unknown model {name!r}")
    attributes = {key: _decode(value, arrays) for key, value in metadata["attributes"].items()}
    if cls is FitResult:
        return FitResult(**attributes)
    params = {key: _decode(value, arrays) for key, value in metadata["params"].items()}
    model = cls(**params)
    for key, value in attributes.items():
        setattr(model, key, value)
    return model


# ------------------------------------------------------------------ reading


class NotAModelError(ValueError):
    """A file that is not a dask_scd model (of any format version)."""


def _not_a_model(path: str, why) -> ValueError:
    return NotAModelError(f"{path} is not a dask_scd model file ({why})")


def _read_archive(path: str) -> tuple[dict, dict]:
    """(metadata, arrays) of an ``.npz`` file, read without pickle."""
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise _not_a_model(path, "a .npy array, not an .npz archive")
        with archive:
            if METADATA not in archive.files:
                raise _not_a_model(path, f"no {METADATA!r} entry")
            entry = archive[METADATA]
            if entry.shape != () or entry.dtype.kind != "U":
                raise _not_a_model(path, f"its {METADATA!r} entry is not one string")
            metadata = json.loads(str(entry[()]))
            arrays = {key: archive[key] for key in archive.files if key != METADATA}
    except (FileNotFoundError, NotAModelError):
        raise
    # ValueError: not an npz, a pickled entry, JSON that does not parse, or not UTF-8
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
        raise _not_a_model(path, error) from None
    return metadata, arrays


def _check_format(path: str, metadata) -> None:
    """Refuse a file of another format, or of a format version this library does not read."""
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        found = metadata.get("format") if isinstance(metadata, dict) else None
        raise _not_a_model(path, f"format={found!r}, expected {FORMAT!r}")
    version = metadata.get("format_version")
    if version in READABLE_VERSIONS and not isinstance(version, bool):
        return
    from dask_scd import __version__

    readable = ", ".join(map(str, READABLE_VERSIONS))
    newer = isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION
    hint = (
        f" (written by dask_scd {metadata.get('library_version')}: load it with that "
        "version or a newer one)"
        if newer
        else ""
    )
    raise ValueError(
        f"{path} is a dask_scd model of format version {version!r}, which dask_scd "
        f"{__version__} does not read: it reads format version {readable}{hint}"
    )


def _load_cli_json(path: str) -> FitResult:
    """The JSON model of ``dask-scd fit --out`` as a FitResult (``fit_intercept`` is not
    recorded there: None)."""
    try:
        with open(path, encoding="utf-8") as handle:
            model = json.load(handle)
        classes = model.get("classes")
        return FitResult(
            coef_=np.asarray(model["coef"], dtype=np.float64),
            intercept_=float(model["intercept"]),
            dual_gap_=float(model["dual_gap"]),
            n_iter_=int(model["n_iter"]),
            history_=History.from_dict(model.get("history") or {}),
            converged_=bool(model["converged"]),
            solver_=str(model["solver"]),
            loss=str(model["loss"]),
            penalty=model["penalty"],
            alpha=float(model["alpha"]),
            l1_ratio=float(model["l1_ratio"]),
            primal_=float(model.get("primal", math.nan)),
            classes_=None if classes is None else np.asarray(classes),
            extras_={key: model.get(key) for key in ("grid", "feature_names")},
        )
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise _not_a_model(
            path, f"JSON, but not a model of dask-scd fit --out: {error!r}"
        ) from None
