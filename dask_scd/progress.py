"""Progress of a fit: one line per certified iteration, or nothing."""

from __future__ import annotations


class Progress:
    """Reports the certified iterations of one fit.

    Parameters
    ----------
    solver : str
        The engine's name, shown in every line.
    tol, max_iter :
        The fit's target gap and iteration budget.
    verbose : bool or int
        False/0: silent; otherwise a line per certified iteration.
    """

    def __init__(self, solver: str, tol: float, max_iter: int, verbose=False) -> None:
        self.solver, self.tol, self.max_iter, self.verbose = solver, tol, max_iter, verbose

    def update(self, iteration: int, relative_gap: float, primal: float, **extra) -> None:
        if self.verbose:
            print(f"[{self.solver}] epoch {iteration:4d}  relative gap {relative_gap:.3e}  "
                  f"primal {primal:.10g}")

    def close(self) -> None:
        pass

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
