"""The compressed major-axis view of a matrix that the CPU kernels consume."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dask_scd.kernels import dense_rows, threads
from dask_scd.kernels import lines as line_kernels

_EMPTY_INDEX = np.zeros(0, dtype=np.int32)
_NO_WEIGHTS = np.zeros(0)


# Size up to which numpy's copy between the orders beats the tiled one: both arrays then
# sit in the caches (8 MB, 100 x 10,000: 1.7 against 2.1 ms; 800 kB: 0.08 against 0.15
# ms), and above it the tiles win (16 MB: 9.4 against 4.8 ms; 320 MB: 354 against 153).
_NUMPY_COPY_BYTES = 8 * 2**20


def in_order(A: np.ndarray, order: str) -> np.ndarray:
    """The 2-D array ``A`` contiguous in ``order`` ("C" or "F"): ``A`` itself when it is,
    a tiled transposing copy (:func:`dask_scd.kernels.lines.transposed_copy`) when it is
    contiguous in the other order and larger than :data:`_NUMPY_COPY_BYTES`, else
    numpy's copy. The values are the same either way."""
    if A.flags[f"{order}_CONTIGUOUS"]:
        return A
    other = A.flags["F_CONTIGUOUS"] if order == "C" else A.flags["C_CONTIGUOUS"]
    tiled = other and A.ndim == 2 and A.dtype in (np.float32, np.float64)
    if not tiled or A.nbytes <= _NUMPY_COPY_BYTES:
        return np.asarray(A, order=order)
    if order == "C":  # A.T is C-ordered (p, n)
        out = np.empty(A.shape, dtype=A.dtype)
        line_kernels.transposed_copy(A.T, out)
        return out
    out = np.empty(A.shape[::-1], dtype=A.dtype)  # A's transpose in C order: A in F order
    line_kernels.transposed_copy(A, out)
    return out.T


def check_structure(X, name: str = "X") -> None:
    """Refuse a CSR or CSC matrix whose index pointers or indices do not fit its shape
    (:func:`structure_error`'s message as a ValueError)."""
    message = structure_error(X, name)
    if message is not None:
        raise ValueError(message)


def structure_error(X, name: str = "X") -> str | None:
    """What is wrong with a CSR or CSC matrix whose index pointers or indices do not fit
    its shape, or None: scipy builds one from raw arrays without looking, and the kernels
    (scipy's own format changes too) would read and write past its arrays. One pass over
    the indices; other formats, whose constructors check, pass as they are."""
    if not sp.issparse(X) or X.format not in ("csr", "csc"):
        return None
    lines, other = ("row", "column") if X.format == "csr" else ("column", "row")
    n_major, n_minor = X.shape if X.format == "csr" else X.shape[::-1]
    line, fault = line_kernels.structure_fault(X.indptr, X.indices, n_minor)
    if fault == 0 and len(X.indptr) == n_major + 1 and X.indptr[-1] <= len(X.data):
        return None
    malformed = f"{name} is a malformed {X.format.upper()} matrix of shape {X.shape}"
    if fault == 2:
        where = np.asarray(X.indices[X.indptr[line] : X.indptr[line + 1]])
        bad = int(where[(where < 0) | (where >= n_minor)][0])
        return (
            f"{malformed}: {lines} {line} holds the {other} index {bad}, outside "
            f"0..{n_minor - 1} (its indices do not fit its shape)"
        )
    return (
        f"{malformed}: its index pointers (indptr, {len(X.indptr)} of them for "
        f"{n_major} {lines}s, {len(X.indices)} indices and {len(X.data)} values) do not "
        f"start at 0 and rise to at most the number of indices"
        + (f" ({lines} {line})" if fault == 1 else "")
    )


@dataclass(frozen=True)
class MajorMatrix:
    """X along one axis: columns for primal SCD, rows for dual SDCA.

    ``data`` holds the values line after line (a view of a contiguous dense array, or the
    CSC/CSR data). ``n_major`` lines of length ``n_minor``.
    """

    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    dense: bool
    n_major: int
    n_minor: int

    @classmethod
    def from_array(cls, X, axis: str) -> "MajorMatrix":
        """Wrap X (numpy or scipy.sparse) for kernels over ``axis`` ("columns" or "rows").

        Copies only when the layout or dtype has to change; the caller's X is never
        modified (a sparse matrix needing sorting or deduplication is copied first).
        """
        by_columns = axis == "columns"
        n_samples, n_features = X.shape
        n_major, n_minor = (n_features, n_samples) if by_columns else (n_samples, n_features)
        if sp.issparse(X):
            fmt = "csc" if by_columns else "csr"
            M = X.asformat(fmt)
            if M.dtype not in (np.float32, np.float64):
                M = M.astype(np.float64)
            if not M.has_canonical_format:
                M = M.copy() if M is X else M
                M.sum_duplicates()  # sorts indices too
            return cls(M.data, M.indices, M.indptr, False, n_major, n_minor)
        A = np.asarray(X)
        if A.dtype not in (np.float32, np.float64):
            A = A.astype(np.float64)
        order = "F" if by_columns else "C"
        A = in_order(A, order)
        return cls(A.ravel(order=order), _EMPTY_INDEX, _EMPTY_INDEX, True, n_major, n_minor)

    def lines(self, start: int, stop: int) -> "MajorMatrix":
        """Lines ``start:stop`` as a matrix of their own, without copying: the dense
        values are a slice; a sparse one keeps the whole ``data`` and ``indices``, which
        its slice of ``indptr`` (absolute offsets) points into."""
        # The constructor, not dataclasses.replace: a pass asks for a few of these (and the
        # block shifts for some at every epoch), and replace costs 3x as much a call.
        n_minor = self.n_minor
        if self.dense:
            data = self.data[start * n_minor : stop * n_minor]
            return MajorMatrix(data, self.indices, self.indptr, True, stop - start, n_minor)
        indptr = self.indptr[start : stop + 1]
        return MajorMatrix(self.data, self.indices, indptr, False, stop - start, n_minor)

    def _args(self):
        return self.data, self.indices, self.indptr, self.dense, self.n_major, self.n_minor

    @property
    def stored(self) -> int:
        """Stored entries (every value of a dense matrix): the length of a pass."""
        return self.n_major * self.n_minor if self.dense else len(self.data)

    def dot(self, v, squared: bool = False) -> np.ndarray:
        """Σ_k A[r, k] v[k] for every line r: X v by rows, Xᵀ v by columns (A² if squared)."""
        out = np.empty(self.n_major, dtype=np.float64)
        v = np.ascontiguousarray(v, dtype=np.float64)
        if self.dense and not squared:  # four lines at a time, the same bits
            m = self.n_minor
            self._on_line_ranges(lambda lo, hi: dense_rows.dot(self.data, lo, hi, m, v, out))
            return out
        head = (self.data, self.indices, self.indptr, self.dense)
        self._on_line_ranges(
            lambda lo, hi: line_kernels.major_dot_range(
                *head, lo, hi, self.n_minor, v, out, squared
            )
        )
        return out

    def _on_line_ranges(self, work) -> None:
        """work(lo, hi) for fixed ranges of lines, on threads where a pass may use them:
        each line's result is computed by one range, by the one compiled loop, so the
        bits are the same on any number of threads."""
        ranges = threads.line_ranges(
            None if self.dense else self.indptr, self.n_major, threads.usable(self.stored)
        )
        threads.run_all([lambda lo=lo, hi=hi: work(lo, hi) for lo, hi in ranges])

    def dot_lines(self, lines, v, squared: bool = False) -> np.ndarray:
        """:meth:`dot` on the lines ``lines`` alone (the same bits there; 0 elsewhere), one
        thread: by columns, Xᵀv on a working set W without a pass over X."""
        out = np.zeros(self.n_major, dtype=np.float64)
        v = np.ascontiguousarray(v, dtype=np.float64)
        lines = np.ascontiguousarray(lines, dtype=np.int64)
        head = (self.data, self.indices, self.indptr, self.dense)
        line_kernels.major_dot_lines(*head, lines, self.n_minor, v, out, squared)
        return out

    def scatter(self, u, squared: bool = False) -> np.ndarray:
        """Σ_r A[r, k] u[r] for every minor index k: Xᵀ u by rows, X u by columns."""
        out = np.zeros(self.n_minor, dtype=np.float64)
        u = np.ascontiguousarray(u, dtype=np.float64)
        if self.dense and not squared:  # four lines at a time where wide, the same bits
            dense_rows.scatter(self.data, self.n_major, self.n_minor, u, out)
            return out
        line_kernels.major_scatter(*self._args(), u, out, squared)
        return out

    def dot_pair(self, v, w) -> tuple[np.ndarray, np.ndarray]:
        """(A v, A w) over every line in one pass over A (by columns: Xᵀv, Xᵀw)."""
        out_v = np.empty(self.n_major, dtype=np.float64)
        out_w = np.empty(self.n_major, dtype=np.float64)
        if self.dense:
            v = np.ascontiguousarray(v, dtype=np.float64)
            w = np.ascontiguousarray(w, dtype=np.float64)
            m = self.n_minor
            self._on_line_ranges(
                lambda lo, hi: line_kernels.dense_dot_pair(
                    self.data[lo * m : hi * m], hi - lo, m, v, w, out_v[lo:hi], out_w[lo:hi]
                )
            )
            return out_v, out_w
        vw = np.empty((self.n_minor, 2), dtype=np.float64)
        vw[:, 0] = v
        vw[:, 1] = w
        line_kernels.major_dot_pair(
            self.data, self.indices, self.indptr, self.n_major, vw, out_v, out_w
        )
        return out_v, out_w

    def lines_scatter(self, lines, values, offset: float, out: np.ndarray) -> np.ndarray:
        """out = offset + Σ_m values[m]·(line lines[m]), reading only those lines (by
        columns: the margins X_W θ_W + b of the columns W)."""
        line_kernels.lines_scatter(
            self.data,
            self.indices,
            self.indptr,
            self.dense,
            self.n_minor,
            lines,
            np.ascontiguousarray(values, dtype=np.float64),
            offset,
            out,
        )
        return out

    def line_nnz(self) -> np.ndarray:
        """Stored entries of every line (the cost of a pass over it)."""
        if self.dense:
            return np.full(self.n_major, self.n_minor, dtype=np.int64)
        return np.diff(self.indptr).astype(np.int64)

    def cube_sums(self, weights=None) -> np.ndarray:
        """Σ |A[line, k]|³ for every line; Σ_k v_k |A[line, k]|³ with ``weights`` v over
        the minor axis."""
        return self._power_sums(3, weights)

    def sq_norms(self, weights=None) -> np.ndarray:
        """‖line‖² for every line; Σ_k v_k A[line, k]² with ``weights`` v over the minor
        axis."""
        return self._power_sums(2, weights)

    def minor_sq_norms(self) -> np.ndarray:
        """Σ_r A[r, k]² for every minor index k of a dense matrix (by rows: the columns'
        ‖x_j‖²), the bits of the other layout's :meth:`sq_norms`."""
        if not self.dense:
            raise ValueError("minor_sq_norms reads dense lines; a sparse matrix has no such sweep")
        out = np.empty(self.n_minor, dtype=np.float64)
        line_kernels.minor_sq_sums(self.data, self.n_major, self.n_minor, out)
        return out

    def _power_sums(self, power: int, weights) -> np.ndarray:
        out = np.empty(self.n_major, dtype=np.float64)
        weights = _NO_WEIGHTS if weights is None else np.ascontiguousarray(weights, np.float64)
        line_kernels.major_power_sums(*self._args(), power, weights, out)
        return out
