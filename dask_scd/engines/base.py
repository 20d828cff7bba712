"""What every engine receives and returns: the seam between ``fit`` and the engines.

An engine is a function ``run(data, problem, options) -> Run``:

- ``data`` is a source of the data layer (:mod:`dask_scd.data`): an
  :class:`~dask_scd.data.memory.InMemory` (validated X and y) for the in-memory engines,
  a :class:`~dask_scd.data.sources.Source` of cells for the dask engines;
- ``problem`` is the :class:`dask_scd.objectives.Problem`;
- ``options`` is :class:`Options`: the common fit arguments, a :class:`Progress` reporter
  and the engine's own keyword options, the instance of the dataclass it declares
  (:mod:`dask_scd.engines.options`), its values checked.

It returns a :class:`Run`: coefficients, intercept and the final certificate. Engines
never validate user input, never call :func:`dask_scd.fit`, and never build the user's
result: :func:`dask_scd.api.fit` does those once, for all of them. The registry of
engines is :mod:`dask_scd.engines.registry`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from dask_scd import objectives as obj
from dask_scd.engines.options import EngineOptions, NoOptions
from dask_scd.progress import Progress, epoch_info
from dask_scd.result import History
from dask_scd.validation import as_generator


@dataclass
class Options:
    """The fit's common arguments, as every engine receives them."""

    tol: float
    max_iter: int
    # A numpy Generator, or a validation.LazyGenerator that becomes one at the first read
    # of :attr:`rng` (copies of these options share it, and its draws go on).
    random: object
    progress: Progress = field(default_factory=lambda: Progress("", 0.0, 0))
    engine: EngineOptions = field(default_factory=NoOptions)  # the engine's own, checked
    device: str = "cpu"  # where epochs run, "cpu" or "gpu" (see dask_scd.kernels.device)
    # A warm start (θ in the original feature order, b), or None for θ = 0 and the best
    # intercept at θ = 0. Engines without a primal start ("sdca", "duhl", the hinge's
    # Newton) begin cold.
    start: tuple | None = None
    # What an engine may keep between runs on the same data (the points of a path: its
    # design of X, Gram blocks of a constant curvature, the margins of ``start``); None
    # for a single fit.
    memo: dict | None = None

    @property
    def rng(self) -> np.random.Generator:
        """The fit's random Generator (created here on first use)."""
        return as_generator(self.random)

    @property
    def callback(self):
        """The caller's ``callback`` (an engine option), or None."""
        return getattr(self.engine, "callback", None)


@dataclass
class Run:
    """What an engine hands back to :func:`dask_scd.fit`."""

    coef: np.ndarray
    intercept: float
    certificate: obj.Certificate
    n_iter: int
    history: History
    extras: dict = field(default_factory=dict)  # engine-specific figures (bytes moved, ...)
    stopped_by_callback: bool = False  # the user's callback asked to stop: no warning
    # penalty=None: ‖∇P‖∞/max(1, |P|), the stopping measure where there is no gap.
    grad_norm: float | None = None

    def converged(self, tol: float) -> bool:
        if self.grad_norm is not None:
            return self.grad_norm <= tol
        return self.certificate.relative_gap <= tol


class CertificateSchedule:
    """When to pay for a certificate (a full pass over X): the two-stage test.

    Every epoch at first; then when the cheap test says the iterate has nearly stopped
    moving (max |Δθ| ≤ 1e-3·max |θ|) and ``spacing`` epochs have passed since the last
    certificate, and at least every ``every`` epochs.
    """

    def __init__(self, first=3, every=5, gate=1e-3):
        self.first, self.every, self.gate = first, every, gate
        self.last = 0

    def due(self, epoch, max_delta, max_coef, final, spacing=1) -> bool:
        due = (
            final
            or epoch <= self.first
            or epoch - self.last >= self.every
            or (max_delta <= self.gate * max_coef and epoch - self.last >= spacing)
        )
        if due:
            self.last = epoch
        return due


class Trace:
    """A fit's :class:`~dask_scd.result.History`, its progress reports and the caller's
    ``callback``, timed in seconds since the trace began.

    Every in-memory engine records its certified epochs here, so the callback is called
    here, once per reported step, with :func:`~dask_scd.progress.epoch_info`; a True
    return sets :attr:`stopped`, which the engine's loop reads to stop after that step
    (and :meth:`ended` marks its Run). It never changes what the engine computes.
    """

    def __init__(self, progress: Progress, callback=None):
        self.history, self.progress, self.callback = History(), progress, callback
        self.start = time.perf_counter()
        self._reported = None  # the last step reported
        self.stopped = False  # the callback asked to stop

    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def record(self, step: int, measure: float, primal: float, report: bool = True) -> float:
        """One history entry (``measure``: the relative gap, or what stands in for it),
        reported to the progress and the callback unless ``report`` is False or the step
        was reported already (a step certified again on fresh margins replaces its
        history entry, and is not a new line); returns its seconds."""
        seconds = self.seconds()
        self.history.append(step, measure, primal, seconds)
        if report and step != self._reported:
            self.progress.update(step, measure, primal)
            self._reported = step
            if self.callback is not None and self.callback(
                epoch_info(step, measure, primal, seconds)
            ):
                self.stopped = True
        return seconds

    def certified(self, step: int, cert: obj.Certificate, tol: float) -> bool:
        """Record ``cert``, the certificate of ``step``; whether the fit stops there (``tol``
        reached, or the callback asked)."""
        self.record(step, cert.relative_gap, cert.primal)
        return cert.relative_gap <= tol or self.stopped

    def ended(self, run: Run) -> Run:
        """``run``, marked as stopped by the callback when it was."""
        run.stopped_by_callback = run.stopped_by_callback or self.stopped
        return run
