"""Class labels for the classifiers: the classes of the input (computed on the cluster
for dask and grid labels), the ±1 targets of the binary models, and probabilities from
decision values (labels: :func:`dask_scd.result.class_labels`)."""

from __future__ import annotations

import numpy as np
from scipy.special import expit
from sklearn.utils.multiclass import check_classification_targets, type_of_target

from dask_scd.data.inputs import ModelInput
from dask_scd.validation import is_dask


def _classes(data: ModelInput) -> np.ndarray:
    """The sorted class labels, computed on the cluster for dask and grid labels (a
    grid's in the dtype its labels were written in: its ``y`` holds them as float64)."""
    if data.kind == "native" or data.kind == "memory":
        check_classification_targets(data.y)
        return np.unique(data.y)
    y = data.X.y if data.kind == "grid" else data.y
    if is_dask(y):
        import dask.array as da

        classes = np.unique(np.asarray(da.unique(y).compute()))
    else:
        classes = np.unique(np.asarray(y))
    if data.kind == "grid":
        classes = classes.astype(data.X.label_dtype)
    if type_of_target(classes) not in ("binary", "multiclass"):
        raise ValueError(
            f"Unknown label type: {type_of_target(classes)!r} (a classifier "
            f"needs class labels; got {len(classes)} distinct values)"
        )
    return classes


def _binary_targets(classes, y, grid: bool) -> list:
    """The ±1 targets of the binary models of labels ``y`` (numpy or dask): ``classes[1]``
    against ``classes[0]`` for two classes (None for a ``grid``'s own labels, which its
    fit maps to ±1), else each class against the rest (``np.where`` dispatches to
    ``da.where`` for dask labels)."""
    if grid and len(classes) == 2:
        return [None]
    return [np.where(y == label, 1.0, -1.0) for label in model_classes(classes)]


def model_classes(classes) -> np.ndarray:
    """The class of each binary model: ``classes[1]`` for two classes, else every class."""
    return classes[1:] if len(classes) == 2 else classes


def _softmax(scores):
    """Rows of exp(scores) normalized (a multinomial model's probabilities)."""
    from scipy.special import softmax

    return softmax(scores, axis=1)


def _probabilities(scores):
    if scores.ndim == 1:
        positive = expit(scores)
        return np.column_stack([1.0 - positive, positive])
    probabilities = expit(scores)
    return probabilities / probabilities.sum(axis=1, keepdims=True)
