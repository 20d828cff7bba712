"""The one result object every engine returns, and its per-epoch history."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dask_scd.validation import check_finite, check_matrix, check_n_features, is_dask

PLOT_EXTRA = "pip install dask-scd[plot]"


@dataclass
class History:
    """Per-iteration record: relative duality gap, primal objective, elapsed seconds.

    One entry per certified epoch (a pass over all coordinates, or over all blocks and
    the intercept for the dask engine).

    Attributes
    ----------
    iteration : list of int
        The epoch's number, from 1.
    relative_gap : list of float
        Relative duality gap ``(P − D)/|P|`` after the epoch.
    primal : list of float
        Primal objective P after the epoch.
    seconds : list of float
        Elapsed seconds since the start of the epoch loop.
    bytes_moved : list of float
        Bytes sent between the client and the workers up to the epoch, when the engine
        records them (else empty).
    """

    iteration: list = field(default_factory=list)
    relative_gap: list = field(default_factory=list)
    primal: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    bytes_moved: list = field(default_factory=list)

    def append(
        self,
        iteration: int,
        relative_gap: float,
        primal: float,
        seconds: float,
        bytes_moved: float | None = None,
    ) -> None:
        """Record one certified epoch.

        An iteration certified again (the Newton engines re-certify their last iterate on
        margins recomputed from scratch) replaces its entry: one entry per iteration.

        Parameters
        ----------
        iteration : int
            The epoch (or Newton step) just certified.
        relative_gap : float
            Its relative duality gap ``(P − D)/|P|``.
        primal : float
            Its primal objective P.
        seconds : float
            Wall time since the fit started.
        bytes_moved : float, optional
            Bytes the engine moved between workers so far (only if it counts them).
        """
        again = bool(self.iteration) and self.iteration[-1] == int(iteration)
        entries = [
            (self.iteration, int(iteration)),
            (self.relative_gap, float(relative_gap)),
            (self.primal, float(primal)),
            (self.seconds, float(seconds)),
        ]
        if bytes_moved is not None:
            entries.append((self.bytes_moved, float(bytes_moved)))
        for values, value in entries:
            if again and values:
                values.pop()
            values.append(value)

    def __len__(self) -> int:
        return len(self.iteration)

    def __repr__(self) -> str:
        if not self.iteration:
            return "History(0 epochs)"
        return (
            f"History({len(self)} epochs, last: epoch {self.iteration[-1]}, "
            f"relative gap {self.relative_gap[-1]:.3e}, {self.seconds[-1]:.3g}s)"
        )

    def as_dict(self) -> dict:
        """The record as a dict of plain lists (JSON-friendly).

        Returns
        -------
        dict
            One list per field (``iteration``, ``relative_gap``, ``primal``,
            ``seconds``, ``bytes_moved``).
        """
        return {key: list(getattr(self, key)) for key in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, record: dict) -> History:
        """Inverse of :meth:`as_dict`; keys missing from older records start empty.

        Parameters
        ----------
        record : dict
            A record written by :meth:`as_dict`.

        Returns
        -------
        History
        """
        return cls(**{key: list(record.get(key, [])) for key in cls.__dataclass_fields__})

    def to_pandas(self):
        """The record as a :class:`pandas.DataFrame`, one row per certified epoch.

        Returns
        -------
        pandas.DataFrame
            Columns ``iteration``, ``relative_gap``, ``primal``, ``seconds`` and, when
            recorded, ``bytes_moved``.
        """
        try:
            import pandas as pd
        except ImportError as error:
            raise ImportError("History.to_pandas needs pandas: pip install pandas") from error
        columns = {
            key: values
            for key, values in self.as_dict().items()
            if key != "bytes_moved" or self._has_bytes()
        }
        return pd.DataFrame(columns)

    def _has_bytes(self) -> bool:
        return len(self.bytes_moved) == len(self.iteration) > 0

    def plot(self, ax=None):
        """Draw the relative gap on a log scale against seconds, epochs and bytes moved.

        Needs matplotlib (``pip install dask-scd[plot]``). Bytes moved are drawn only
        when the engine recorded them.

        Parameters
        ----------
        ax : matplotlib Axes or sequence of Axes, optional
            One Axes draws the gap against seconds only. A sequence draws one panel per
            x quantity (seconds, epochs, bytes moved), as many as it holds. By default a
            new figure with one panel per recorded quantity.

        Returns
        -------
        numpy.ndarray of matplotlib Axes
            The panels drawn on.
        """
        return _plot(ax, "History.plot", [(self, None)])


def _plot(ax, who: str, lines: list, legend: bool = False):
    """Draw the relative gap of each (History, its legend label or None) of ``lines``
    against seconds, epochs and, when every one recorded them, bytes moved; the panels
    drawn on."""
    panels = [("seconds", "seconds"), ("epoch", "iteration")]
    if lines and all(history._has_bytes() for history, _ in lines):
        panels.append(("bytes moved", "bytes_moved"))
    axes = _panel_axes(ax, len(panels), who)[: len(panels)]
    for history, label in lines:
        for axis, (name, field_name) in zip(axes, panels):
            axis.semilogy(
                getattr(history, field_name), history.relative_gap, marker=".", label=label
            )
            axis.set_xlabel(name)
            axis.set_ylabel("relative duality gap")
            axis.grid(True, which="major", alpha=0.3)
    for axis in axes if legend else ():
        axis.legend(fontsize="small")
    return axes


def _panel_axes(ax, n_panels: int, who: str):
    """The Axes to draw on: those of ``ax``, or a new figure of ``n_panels`` side by
    side; matplotlib missing is an ImportError that names the extra."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(f"{who} needs matplotlib, the 'plot' extra: {PLOT_EXTRA}") from error
    if ax is None:
        _, ax = plt.subplots(
            1,
            n_panels,
            figsize=(4.0 * n_panels, 3.2),
            squeeze=False,
            layout="constrained",
        )
    return np.atleast_1d(np.asarray(ax, dtype=object)).ravel()


class Histories(list):
    """The histories of models fitted side by side (one-vs-rest: one per class), a list
    of :class:`History` in the order of the models, which plots them together.

    Indexing, iteration and ``len`` are the list's: ``histories[k]`` is model k's
    History.

    Parameters
    ----------
    histories : iterable of History
        One per model.
    labels : sequence, optional
        What each model is fitted for (its class; default its index), in the legend.
    name : str, default "model"
        What a label names ("class", "output"), in front of it in the legend.
    """

    def __init__(self, histories=(), labels=None, name: str = "model"):
        super().__init__(histories)
        self.labels = list(range(len(self))) if labels is None else list(labels)
        self.name = name

    def __repr__(self) -> str:
        labels = ", ".join(map(str, self.labels))
        return f"Histories({len(self)} models, by {self.name}: {labels})"

    def plot(self, ax=None):
        """Draw every model's relative gap on a log scale, one labelled line each, against
        seconds, epochs and (when every model recorded them) bytes moved.

        Needs matplotlib (``pip install dask-scd[plot]``).

        Parameters
        ----------
        ax : matplotlib Axes or sequence of Axes, optional
            As :meth:`History.plot`: one Axes draws against seconds only; by default a
            new figure with one panel per quantity.

        Returns
        -------
        numpy.ndarray of matplotlib Axes
            The panels drawn on, each with a legend.
        """
        lines = [(history, f"{self.name} {label}") for label, history in zip(self.labels, self)]
        return _plot(ax, "Histories.plot", lines, legend=True)

    def to_pandas(self):
        """Every model's record as one :class:`pandas.DataFrame`: :meth:`History.to_pandas`
        of each, after a first column, named ``name``, of its label.

        Returns
        -------
        pandas.DataFrame
        """
        frames = [history.to_pandas() for history in self]  # names pandas if it is missing
        import pandas as pd

        for label, frame in zip(self.labels, frames):
            frame.insert(0, self.name, label)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


@dataclass
class FitResult:
    """A fitted linear model with its duality-gap certificate.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_classes, n_features)
        θ, in the original feature order; one row per class for ``loss="multinomial"``.
    intercept_ : float or ndarray of shape (n_classes,)
        b (0.0 when no intercept is fitted); one per class for ``loss="multinomial"``.
    dual_gap_ : float
        Relative duality gap ``(P − D)/|P|`` certified at the end of the fit; NaN for
        ``penalty=None``, which has no dual (see ``grad_norm_``).
    n_iter_ : int
        Epochs: passes over all coordinates (in memory) or all blocks (dask engine).
    history_ : History
        The certified epochs.
    converged_ : bool
        Whether ``dual_gap_ ≤ tol`` (``grad_norm_ ≤ tol`` for ``penalty=None``).
    solver_ : str
        The engine that ran ("gram", "scd", "sdca", "block_scd").
    loss : str
        The loss, as given.
    penalty : str
        The penalty, as given.
    alpha : float
        The regularization strength.
    l1_ratio : float
        The effective ρ: 0 for "l2", 1 for "l1".
    primal_ : float
        P(θ, b), the objective of the returned model.
    classes_ : ndarray of shape (2,) or (n_classes,), or None
        For classification losses, the labels mapped to −1 and +1; for
        ``loss="multinomial"`` the labels of the rows of ``coef_``.
    extras_ : dict
        The engine's own figures: ``total_passes`` (reads of X, Newton engines),
        ``bytes_moved`` and ``swaps`` (DuHL residency), ...
    grad_norm_ : float or None
        For ``penalty=None`` only: the relative gradient norm ``‖∇P‖∞ / max(1, |P|)``
        (the intercept's derivative included) the fit stopped on; None otherwise.
    bytes_moved_ : int
        Bytes moved into fast memory during the fit (0 when the engine keeps all of X).
    fit_intercept : bool or None
        Whether the intercept was fitted (None for a model saved by the command line,
        which does not record it).
    """

    coef_: np.ndarray
    intercept_: float
    dual_gap_: float
    n_iter_: int
    history_: History
    converged_: bool
    solver_: str
    loss: str
    penalty: str
    alpha: float
    l1_ratio: float
    primal_: float = np.nan
    classes_: np.ndarray | None = None
    extras_: dict = field(default_factory=dict)
    grad_norm_: float | None = None
    fit_intercept: bool | None = None

    @property
    def bytes_moved_(self) -> int:
        return int(self.extras_.get("bytes_moved", 0))

    def __repr__(self) -> str:
        # The history is left out on purpose: it can hold thousands of entries.
        ratio = f", l1_ratio={self.l1_ratio:g}" if self.penalty == "elasticnet" else ""
        return (
            f"FitResult(solver={self.solver_!r}, loss={self.loss!r}, "
            f"penalty={self.penalty!r}, alpha={self.alpha:g}{ratio}, "
            f"dual_gap={self.dual_gap_:.3e}, n_iter={self.n_iter_}, "
            f"len(history)={len(self.history_)})"
        )

    def decision_function(self, X) -> np.ndarray:
        """``X @ coef_ + intercept_`` for X of shape (n_samples, n_features).

        Parameters
        ----------
        X : ndarray, scipy.sparse matrix or dask array of shape (n_samples, n_features)

        Returns
        -------
        ndarray or dask array of shape (n_samples,) or (n_samples, n_classes)
            One column per class for ``loss="multinomial"``. A lazy dask array for a
            dask X (nothing is computed).

        Raises
        ------
        ValueError
            If X is not 2-D, not numeric, not of the fitted width or holds a NaN or an
            infinity. A dask X's width is checked at once, its values chunk by chunk when
            the result is computed (checking them now would compute X twice).
        """
        X = self._check_X(X)
        if is_dask(X):
            scores = dask_scores(X, np.atleast_2d(self.coef_), np.atleast_1d(self.intercept_))
            return scores if np.ndim(self.coef_) == 2 else scores[:, 0]
        if np.ndim(self.coef_) == 2:
            return np.asarray(X @ np.asarray(self.coef_).T) + np.asarray(self.intercept_)
        return np.asarray(X @ self.coef_).ravel() + self.intercept_

    def predict(self, X) -> np.ndarray:
        """Regression values, or class labels (from ``classes_``) for classifiers.

        Parameters
        ----------
        X : ndarray, scipy.sparse matrix or dask array of shape (n_samples, n_features)

        Returns
        -------
        ndarray or dask array of shape (n_samples,)
            A lazy dask array for a dask X (nothing is computed).

        Raises
        ------
        ValueError
            As :meth:`decision_function`: X of another width, or with NaN or infinity.
        """
        scores = self.decision_function(X)
        return scores if self.classes_ is None else class_labels(scores, self.classes_)

    def _check_X(self, X):
        """X checked as the estimators check it at prediction time (2-D, numeric, finite,
        of the fitted width); in-memory X converted as the engines read it."""
        n_features = np.shape(self.coef_)[-1]
        if is_dask(X):
            check_n_features(X, n_features)
            return _finite_chunks(X)
        X = check_matrix(X, bounded=False)
        check_n_features(X, n_features)
        return X


def class_labels(scores, classes):
    """The label of each decision value (numpy or lazily of a dask array): ``classes[1]``
    where a binary model's is > 0, else ``classes[0]``; of several models' columns the
    class of the largest."""
    classes = np.asarray(classes)
    labels = _binary_labels if scores.ndim == 1 else _argmax_labels
    if is_dask(scores):
        drop = {} if scores.ndim == 1 else {"drop_axis": 1}
        meta = np.empty(0, dtype=classes.dtype)
        return scores.map_blocks(labels, classes, dtype=classes.dtype, meta=meta, **drop)
    return labels(scores, classes)


def _binary_labels(scores, classes):
    return classes[(np.asarray(scores) > 0).astype(np.intp)]


def _argmax_labels(scores, classes):
    return classes[np.argmax(scores, axis=1)]


def _finite_chunks(X):
    """A dask X whose chunks are checked for NaN and infinity as they are computed."""
    if X.dtype.kind != "f":  # integers cannot be NaN: no task added
        return X
    return X.map_blocks(_finite_chunk, dtype=X.dtype, meta=X._meta)


def _finite_chunk(chunk, block_info=None):
    """The chunk itself, once :func:`check_finite` found it finite."""
    (rows, columns), index = block_info[0]["array-location"], block_info[0]["chunk-location"]
    if np.isnan(rows[0]):  # unknown chunk sizes (a filtered X): the row within its chunk
        check_finite(chunk, (0, columns[0]), f" of row chunk {index[0]}")
    else:
        check_finite(chunk, (rows[0], columns[0]))
    return chunk


def dask_scores(X, coef: np.ndarray, intercept: np.ndarray):
    """Lazy ``X @ coef.T + intercept`` over any chunking: one partial product per chunk,
    summed over the column chunks (sparse chunks never densified)."""
    import dask.array as da

    weights = da.from_array(np.ascontiguousarray(coef.T), chunks=(X.chunks[1], coef.shape[0]))
    partial = da.blockwise(
        _chunk_scores,
        "ijk",
        X,
        "ij",
        weights,
        "jk",
        adjust_chunks={"j": 1},
        dtype=np.float64,
        meta=np.empty((0, 0, 0)),
    )
    return partial.sum(axis=1) + intercept


def _chunk_scores(block, weights):
    scores = block @ weights
    if hasattr(scores, "todense"):  # a pydata sparse chunk gives a sparse product
        scores = scores.todense()
    return np.asarray(scores, dtype=np.float64).reshape(block.shape[0], 1, weights.shape[1])
