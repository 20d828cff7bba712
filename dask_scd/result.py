"""The one result object every engine returns, and its per-epoch history."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class History:
    """Per-iteration record: relative duality gap, primal objective, elapsed seconds.

    One entry per epoch (a pass over all coordinates, or over all blocks and the
    intercept for the dask engine).
    """

    iteration: list = field(default_factory=list)
    relative_gap: list = field(default_factory=list)
    primal: list = field(default_factory=list)
    seconds: list = field(default_factory=list)

    def append(self, iteration: int, relative_gap: float, primal: float, seconds: float):
        self.iteration.append(int(iteration))
        self.relative_gap.append(float(relative_gap))
        self.primal.append(float(primal))
        self.seconds.append(float(seconds))

    def __len__(self) -> int:
        return len(self.iteration)

    def as_dict(self) -> dict:
        return {
            "iteration": list(self.iteration),
            "relative_gap": list(self.relative_gap),
            "primal": list(self.primal),
            "seconds": list(self.seconds),
        }

    @classmethod
    def from_dict(cls, record: dict) -> "History":
        return cls(**{key: list(record[key]) for key in cls.__dataclass_fields__})

    def plot(self, ax=None):
        """Relative gap against time on a log scale (needs the ``plot`` extra)."""
        import matplotlib.pyplot as plt

        ax = ax or plt.gca()
        ax.semilogy(self.seconds, self.relative_gap, marker=".")
        ax.set_xlabel("seconds")
        ax.set_ylabel("relative duality gap")
        return ax


@dataclass
class FitResult:
    """A fitted linear model with its duality-gap certificate.

    Attributes
    ----------
    coef_ : array of shape (n_features,)
    intercept_ : float
    dual_gap_ : float
        Relative duality gap ``(P − D)/|P|`` certified at the end of the fit.
    n_iter_ : int
        Epochs: passes over all coordinates (in memory) or all blocks (dask engine).
    history_ : History
    converged_ : bool
    solver_ : str
        The engine that ran ("scd", "sdca", "block_scd").
    classes_ : array of shape (2,) or None
        For classification losses, the labels mapped to −1 and +1.
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

    def decision_function(self, X) -> np.ndarray:
        """``X @ coef_ + intercept_`` for X of shape (n_samples, n_features)."""
        return np.asarray(X @ self.coef_).ravel() + self.intercept_

    def predict(self, X) -> np.ndarray:
        """Regression values, or class labels (from ``classes_``) for classifiers."""
        scores = self.decision_function(X)
        if self.classes_ is None:
            return scores
        return np.where(scores > 0, self.classes_[1], self.classes_[0])
