"""Progress of a fit: a tqdm bar in a terminal or a notebook, printed lines elsewhere.

Every engine reports its certified iterations through one :class:`Progress`::

    with Progress("scd", tol, max_iter, verbose) as progress:
        for epoch in ...:
            progress.update(epoch, cert.relative_gap, cert.primal)
"""

from __future__ import annotations

import sys

LINE = "[{solver}] epoch {iteration:4d}  relative gap {gap:.3e}  primal {primal:.10g}"


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (where tqdm.auto draws a widget)."""
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    ipython = getattr(shell, "get_ipython", lambda: None)()
    return ipython is not None and type(ipython).__name__ == "ZMQInteractiveShell"


def _interactive() -> bool:
    """Whether a live bar can be seen: stderr is a terminal, or we run in a notebook."""
    try:
        is_tty = sys.stderr.isatty()
    except (AttributeError, ValueError):  # stderr replaced, or closed
        is_tty = False
    return is_tty or _in_notebook()


def resolve_mode(verbose) -> str:
    """``"off"``, ``"bar"`` or ``"lines"`` for a ``verbose`` setting.

    ``False``/``0``/``None`` → off; ``True``/``1`` → a bar when :func:`_interactive`, else
    lines; ``2`` (or more) → lines; ``"auto"`` → a bar when interactive, else off.
    """
    if isinstance(verbose, str):
        if verbose != "auto":
            raise ValueError(f"verbose={verbose!r} must be a bool, an int or 'auto'")
        return "bar" if _interactive() else "off"
    if not verbose or int(verbose) < 0:
        return "off"
    if int(verbose) == 1:
        return "bar" if _interactive() else "lines"
    return "lines"


class Progress:
    """Report a fit's certified iterations: a tqdm bar or one printed line each.

    Parameters
    ----------
    solver : str
        The engine's name, shown in front of every line and as the bar's label.
    tol : float
        The target relative duality gap (shown next to the live gap).
    max_iter : int
        The bar's total: the fit runs at most this many epochs.
    verbose : bool, int or "auto", default False
        ``False``/``0``: silent. ``True``/``1``: a tqdm bar (:mod:`tqdm.auto`) when
        stderr is a terminal or in a notebook, else one printed line per certified
        iteration. ``2``: always one printed line per iteration. ``"auto"``: a bar when
        interactive, else silent.

    Notes
    -----
    A line reads ``[{solver}] epoch {iteration:4d}  relative gap {gap:.3e}  primal
    {primal:.10g}`` and goes to stdout; the bar goes to stderr. Also a context manager,
    which closes the bar on exit.
    """

    def __init__(self, solver: str, tol: float, max_iter: int, verbose=False) -> None:
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.mode = resolve_mode(verbose)
        self._bar = None
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=max_iter,
                desc=f"[{solver}]",
                unit="epoch",
                leave=False,
                dynamic_ncols=True,
                file=sys.stderr,
            )

    def update(self, iteration: int, relative_gap: float, primal: float, **extra) -> None:
        """Report that iteration ``iteration`` reached ``relative_gap`` and ``primal``.

        Parameters
        ----------
        iteration : int
            The epoch (or round) just certified, from 1; epochs may be skipped.
        relative_gap : float
            Its relative duality gap ``(P − D)/|P|``.
        primal : float
            Its primal objective.
        **extra
            Other figures of the iteration (``bytes_moved``...), shown on the bar.
        """
        if self.mode == "lines":
            print(
                LINE.format(
                    solver=self.solver, iteration=iteration, gap=relative_gap, primal=primal
                ),
                flush=True,
            )
        elif self._bar is not None:
            if iteration > self._bar.n:
                self._bar.update(iteration - self._bar.n)
            figures = [f"gap {relative_gap:.2e}", f"tol {self.tol:.0e}"]
            figures += [f"{key} {_short(value)}" for key, value in extra.items()]
            self._bar.set_postfix_str(", ".join(figures), refresh=True)

    def close(self) -> None:
        """Close the bar (printed lines need nothing); safe to call twice."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def epoch_info(epoch: int, relative_gap: float, primal: float, seconds: float, **more) -> dict:
    """``{"epoch", "relative_gap", "primal", "seconds", **more}``, what a fit's
    ``callback`` receives after a certified epoch (or Newton step, or round), whatever the
    engine: ``relative_gap`` is the relative gradient norm for ``penalty=None``, as the
    history records it; ``more`` what the engine adds (the block engines: ``coef`` in the
    original feature order and ``intercept``)."""
    info = {
        "epoch": int(epoch),
        "relative_gap": float(relative_gap),
        "primal": float(primal),
        "seconds": float(seconds),
    }
    info.update(more)
    return info


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)
