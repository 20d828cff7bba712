"""What one row chunk computes in the block-SCD engine: the engine's task functions.

Every function here is pure (inputs are never modified, results are new arrays) and
deterministic, so a task that dask re-runs after losing a worker gives the same bytes.
A *cell* is the part of X in one row chunk and one column block; it arrives either as
data (a chunk of a persisted dask array) or as a :class:`CellRef` read here from a grid
store, through a per-process cache bounded in bytes. The intercept is the block ``None``
whose cell is a column of ones.

Partial results are plain dicts of float64 arrays, summed over row chunks in row-chunk
order by the engine (never in arrival order), so the model does not depend on which
worker computed what.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dask_scd import objectives as obj
from dask_scd.coarse import LINE_SEARCH_STEPS, coarse_line_search, coarse_newton
from dask_scd.kernels import block as block_kernels
from dask_scd.kernels import cpu, scalar
from dask_scd.kernels.device import on_device
from dask_scd.kernels.layout import MajorMatrix
from dask_scd.kernels.scalar import ARMIJO as _ARMIJO
from dask_scd.runtime.strategies import ByteLRU
from dask_scd.validation import (check_feature_magnitude, check_label_values,
                                  largest_magnitude)


# ----------------------------------------------------------------------- cell access


@dataclass(frozen=True)
class CellRef:
    """Cell (row chunk ``r``, block ``b``) of the grid store at ``path``.

    ``version`` is the store's :attr:`~dask_scd.grid.Grid.store_version`: with the path it
    keys the cache, so a copy of a store (same ``grid_id``) is never served the cells of
    the original, nor a store replaced at the same path those of the one it replaced.
    """

    path: str
    grid_id: str
    r: int
    b: int
    version: str = ""

    @property
    def key(self) -> tuple:
        return ("cell", self.path, self.grid_id, self.version, self.r, self.b)


@dataclass(frozen=True)
class LabelRef:
    """Labels of row chunk ``r`` of a grid store, mapped to ±1 if ``classes`` is given."""

    path: str
    grid_id: str
    r: int
    classes: tuple | None = None
    version: str = ""

    @property
    def key(self) -> tuple:
        return ("labels", self.path, self.grid_id, self.version, self.r, self.classes)


class _CellCache:
    """Least-recently-used cells of this process, bounded in bytes.

    A :class:`dask_scd.runtime.strategies.ByteLRU` (which counts the bytes it loads and
    its evictions) with a second bound. The cache is unmanaged memory: dask cannot spill
    it, and a worker whose process memory passes the pause threshold (80 % of its memory
    limit) stops running tasks. So the bound is taken from what the worker has left when
    the cache is first used — half of (pause threshold − resident memory then), the other
    half being for the tasks' own arrays — and before every insertion the resident memory
    is checked again: an insertion that would take the process past ``resident at start
    + bound`` first drops least-recently-used cells, and is skipped if that is not enough.
    """

    def __init__(self, max_bytes: int | None, ceiling: int | None = None):
        self.ceiling = ceiling  # resident bytes the process should stay under, or None
        self._lru = None if max_bytes is None else ByteLRU(max_bytes, _nbytes)
        self._sizing = threading.Lock()
        # Cells a residency policy holds (see hold): outside the LRU, never evicted by it.
        self._pinned: dict = {}
        self._groups: dict = {}
        self._pinning = threading.local()  # the hold running in this thread, if any

    def hold(self, group, resolve) -> dict:
        """Pin exactly the cells that ``resolve()`` reads, for ``group`` (a row chunk):
        the group's other pinned cells are released. Returns the loads and bytes this
        took (a cell already pinned costs nothing)."""
        pinning = self._pinning
        pinning.keys, pinning.loads, pinning.bytes = set(), 0, 0
        try:
            resolve()
            keep = pinning.keys
        finally:
            pinning.keys = None
        for key in self._groups.get(group, set()) - keep:
            self._pinned.pop(key, None)
        self._groups[group] = keep
        return {"loads": pinning.loads, "bytes": pinning.bytes}

    @property
    def max_bytes(self) -> int | None:
        return None if self._lru is None else self._lru.max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int):
        if self._lru is None:
            self._lru = ByteLRU(value, _nbytes)
        else:
            self._lru.max_bytes = value

    def get(self, key, load):
        with self._sizing:
            if self._lru is None:
                # Sized at first use, inside a task: at import time (while a task is being
                # unpacked) the worker and its memory limit are not reachable yet.
                bound, self.ceiling = _cache_budget()
                self._lru = ByteLRU(bound, _nbytes)
        pinning = getattr(self._pinning, "keys", None)
        if key in self._pinned:
            if pinning is not None:
                pinning.add(key)
            return self._pinned[key]
        lru = self._lru
        value, hit = lru.lookup(key)
        if pinning is not None:
            value = value if hit else load()
            self._pinned[key] = value
            pinning.add(key)
            self._pinning.loads += 1
            self._pinning.bytes += _nbytes(value)
            return value
        if hit:
            return value
        value = load()
        size = _nbytes(value)
        with lru.lock:
            if key not in lru.keys and size <= lru.max_bytes and self._make_room(size):
                lru.insert(key, value, size)
        return value

    def _make_room(self, size: int) -> bool:
        """Drop old cells until ``size`` more bytes fit the bound and the process ceiling."""
        lru = self._lru
        excess = lru.nbytes + size - lru.max_bytes
        if self.ceiling is not None:
            excess = max(excess, _resident_bytes() + size - self.ceiling)
        while excess > 0 and lru.nbytes:
            excess -= lru.evict_oldest()
        return excess <= 0

    @property
    def _items(self):
        """The cached keys, least recently used first."""
        return () if self._lru is None else self._lru.keys

    @property
    def nbytes(self) -> int:
        return 0 if self._lru is None else self._lru.nbytes

    _bytes = nbytes

    @property
    def counts(self) -> dict:
        """Bytes loaded into the cache, loads and evictions since the process started."""
        lru = self._lru
        if lru is None:
            return {"bytes_moved": 0, "loads": 0, "evictions": 0}
        return {"bytes_moved": lru.bytes_moved, "loads": lru.loads, "evictions": lru.evictions}

    def clear(self):
        if self._lru is not None:
            self._lru.clear()


def hold_cells(group, cells: list) -> dict:
    """Make exactly ``cells`` resident for ``group`` in this process (a residency policy's
    choice for one row chunk); returns {"loads", "bytes"} it took."""
    return CACHE.hold(group, lambda: [cell_view(cell) for cell in cells])


def _nbytes(value) -> int:
    if isinstance(value, CellView):
        m = value.matrix
        return m.data.nbytes + m.indices.nbytes + m.indptr.nbytes
    return getattr(value, "nbytes", 0)


def _resident_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _cache_budget() -> tuple[int, int | None]:
    """(bound in bytes, resident-memory ceiling) for this process's cell cache.

    In a dask worker with a memory limit: half of what is left below the pause threshold
    (or the terminate threshold, or the limit) after the memory already resident, and the
    ceiling ``resident + bound``. Outside a worker, or without a limit: 1 GiB, no ceiling.
    """
    try:
        from distributed import get_worker

        manager = get_worker().memory_manager
        limit = manager.memory_limit
    except (ImportError, ValueError, AttributeError):
        return 1 << 30, None
    if not limit:
        return 1 << 30, None
    fraction = manager.memory_pause_fraction or manager.memory_terminate_fraction or 1.0
    resident = _resident_bytes()
    bound = max(0, int(0.5 * (fraction * limit - resident)))
    return bound, resident + bound


CACHE = _CellCache(None)


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


class CellView:
    """A cell wrapped for the kernels: X_cell d, X_cellᵀ v and friends."""

    def __init__(self, cell):
        if not sp.issparse(cell) and type(cell).__module__.startswith("sparse"):
            cell = to_scipy(cell)
        self.n_rows, self.n_columns = cell.shape
        self.by_columns = sp.issparse(cell)
        self.matrix = MajorMatrix.from_array(cell, "columns" if self.by_columns else "rows")
        self._squared_sums = None
        self._cube_sums = None

    def cube_sums(self) -> np.ndarray:
        """Σ_i |x_ij|³ per column (the cubic term of the logistic bound), once per cell."""
        if self._cube_sums is None:
            m = self.matrix
            cubes = np.abs(m.data.astype(np.float64)) ** 3
            if m.dense:
                self._cube_sums = cubes.reshape(self.n_rows, self.n_columns).sum(axis=0)
            else:  # CSC: the columns are the major lines
                column = np.repeat(np.arange(self.n_columns), np.diff(m.indptr))
                self._cube_sums = np.bincount(column, weights=cubes, minlength=self.n_columns)
        return self._cube_sums

    def squared_sums(self) -> np.ndarray:
        """(X_cell∘X_cell)ᵀ 1, the squared loss's curvature: computed once per cached cell."""
        if self._squared_sums is None:
            self._squared_sums = self.rmatvec(np.ones(self.n_rows), squared=True)
        return self._squared_sums

    def rmatvec(self, v, squared=False) -> np.ndarray:
        """X_cellᵀ v (or (X_cell∘X_cell)ᵀ v)."""
        m = self.matrix
        return m.dot(v, squared) if self.by_columns else m.scatter(v, squared)

    def matvec(self, d) -> np.ndarray:
        """X_cell d."""
        m = self.matrix
        return m.scatter(d) if self.by_columns else m.dot(d)

    def gram(self, weights) -> np.ndarray:
        """X_cellᵀ diag(weights) X_cell as a dense (n_columns, n_columns) array."""
        m = self.matrix
        if self.by_columns:
            C = sp.csc_matrix((m.data, m.indices, m.indptr), shape=(self.n_rows, self.n_columns))
            return np.asarray((C.T @ C.multiply(weights[:, None])).todense(), dtype=np.float64)
        A = m.data.reshape(self.n_rows, self.n_columns).astype(np.float64)
        return A.T @ (A * weights[:, None])

    def trials(self, loss_code, y, margins, direction, steps) -> np.ndarray:
        """(K, n_columns) loss changes per step size and coordinate (a pure cell)."""
        m = self.matrix
        return block_kernels.coordinate_trials(
            m.data, m.indices, m.indptr, m.dense, m.n_major, m.n_minor, self.by_columns,
            y, margins, np.ascontiguousarray(direction, dtype=np.float64), steps,
            block_kernels.are_quarters(steps), loss_code,
        )


class DeviceCellView:
    """A cell in device memory wrapped for the CUDA kernels: :class:`CellView`'s methods.

    The cell is a cupy array, a ``cupyx.scipy.sparse`` matrix, a numba device array or a
    :class:`~dask_scd.kernels.device.DeviceCSC`; it stays on the device. Each method
    copies its vectors there (O(n_rows) numbers: labels, margins, derivatives) and
    returns host numpy arrays: per-column sums, or X_cell d. The kernels are those of
    :mod:`dask_scd.kernels.cuda_cells`, imported with the first device cell.
    """

    by_columns = True

    def __init__(self, cell):
        from dask_scd.kernels import cuda_cells

        self._kernels = cuda_cells
        self.columns = cuda_cells.columns(cell)
        self.n_rows, self.n_columns = self.columns.n_rows, self.columns.n_columns
        self._squared_sums = None
        self._cube_sums = None

    @property
    def nbytes(self) -> int:
        return self.columns.nbytes

    def cube_sums(self) -> np.ndarray:
        """Σ_i |x_ij|³ per column, once per cell."""
        if self._cube_sums is None:
            self._cube_sums = self._sums(np.ones(self.n_rows), 3)
        return self._cube_sums

    def squared_sums(self) -> np.ndarray:
        """(X_cell∘X_cell)ᵀ 1, once per cell."""
        if self._squared_sums is None:
            self._squared_sums = self._sums(np.ones(self.n_rows), 2)
        return self._squared_sums

    def rmatvec(self, v, squared=False) -> np.ndarray:
        """X_cellᵀ v (or (X_cell∘X_cell)ᵀ v)."""
        return self._sums(v, 2 if squared else 1)

    def _sums(self, v, power) -> np.ndarray:
        return self._kernels.column_sums(self.columns, v, power)[0]

    def matvec(self, d) -> np.ndarray:
        """X_cell d."""
        return self._kernels.matvec(self.columns, d)

    def gram(self, weights, other: DeviceCellView | None = None) -> np.ndarray:
        """X_cellᵀ diag(weights) X_cell (or X_other) as a dense host array."""
        return self._kernels.gram(self.columns, weights,
                                  None if other is None else other.columns)

    def trials(self, loss_code, y, margins, direction, steps) -> np.ndarray:
        """(K, n_columns) loss changes per step size and coordinate (a pure cell)."""
        return self._kernels.trials(self.columns, loss_code, y, margins, direction, steps)

    def inspect(self) -> tuple[float, np.ndarray]:
        """(max |x|, NaN if any entry is not finite; entries per row)."""
        return self._kernels.inspect(self.columns)


def cell_view(cell) -> CellView | DeviceCellView | None:
    """Resolve a cell argument of a task (None stays None: the intercept's ones).

    A cell in device memory gets a :class:`DeviceCellView` (the CUDA kernels), any other
    a :class:`CellView` (the CPU kernels).
    """
    if cell is None or isinstance(cell, (CellView, DeviceCellView)):
        return cell
    if isinstance(cell, CellRef):
        from dask_scd.grid import read_cell

        def load():
            return CellView(read_cell(cell.path, cell.grid_id, cell.r, cell.b))

        return CACHE.get(cell.key, load)
    if on_device(cell):
        return DeviceCellView(cell)
    return CellView(cell)


def labels(y) -> np.ndarray:
    """Resolve a labels argument (a LabelRef or an array) to float64 (±1 when classified)."""
    if isinstance(y, LabelRef):
        from dask_scd.grid import read_labels

        def load():
            values = read_labels(y.path, y.grid_id, y.r)
            if y.classes is not None:
                return np.where(values == y.classes[1], 1.0, -1.0)
            values = np.asarray(values, dtype=np.float64)
            check_label_values(values)  # the client never reads a grid's real labels
            return values

        # Cached after the ±1 mapping: every task of the row chunk reads them.
        return CACHE.get(y.key, load)
    return np.asarray(y, dtype=np.float64)


def label_stats(y) -> dict:
    """One row chunk's label counts: {"n", "sum", "pos"} (Σ y, and #(y > 0))."""
    y = labels(y)
    return {"n": np.array([float(len(y))]), "sum": np.array([y.sum()]),
            "pos": np.array([float(np.count_nonzero(y > 0))])}


def intercept_at_zero(loss: str, n: float, total: float, pos: float) -> float:
    """argmin_b (1/n) Σ ℓ(y_i, b): the best intercept for θ = 0, from label counts.

    At θ = 0 every margin is b, so a ±1-labelled loss sees only the counts n₊ and n₋:
    logistic b = log(n₊/n₋), squared hinge b = (n₊ − n₋)/n, hinge b = sign(n₊ − n₋) (any
    b in [−1, 1] when n₊ = n₋; 0 is taken), squared loss b = mean(y). No label vector is
    needed, whatever n.
    """
    neg = n - pos
    if loss == "squared":
        return total / n
    if loss == "logistic":
        if pos == 0 or neg == 0:
            raise ValueError("y has a single class: a classifier needs two")
        return float(np.log(pos / neg))
    if loss == "squared_hinge":
        return (pos - neg) / n
    if loss == "hinge":
        return float(np.sign(pos - neg))
    raise ValueError(f"unknown loss {loss!r}")


# --------------------------------------------------------------------- preflight


def inspect_cell(cell, where: str) -> dict:
    """Check a cell once before fitting: finite values and purity.

    Returns ``{"max_per_row"}``: the most non-zeros one example has in the block.
    """
    view = cell_view(cell)
    if isinstance(view, DeviceCellView):
        largest, counts = view.inspect()
    else:
        largest, counts = largest_magnitude(view.matrix.data), None
    if not np.isfinite(largest):
        raise ValueError(f"X contains NaN or infinity in {where}")
    check_feature_magnitude(largest, f" in {where}")
    if counts is None:
        counts = _nonzeros_per_row(view)
    return {"max_per_row": int(counts.max()) if counts.size else 0, "nbytes": _nbytes(view)}


def _nonzeros_per_row(view: CellView) -> np.ndarray:
    m = view.matrix
    if m.dense:
        return np.count_nonzero(m.data.reshape(view.n_rows, view.n_columns), axis=1)
    return np.bincount(m.indices, minlength=view.n_rows)


# --------------------------------------------------------------------- margins


def refresh_margins(cells: list, state: dict, offsets, n_rows: int) -> np.ndarray:
    """ŷ = Σ_b X_cell(b) θ_b + b for one row chunk, exactly (no accumulated rounding).

    ``state`` is {"coef", "intercept"} with coef in grid column order; block b is
    ``coef[offsets[b]:offsets[b + 1]]``.
    """
    coef = state["coef"]
    margins = np.full(n_rows, float(state["intercept"]))
    for b, cell in enumerate(cells):
        theta = coef[offsets[b]:offsets[b + 1]]
        if np.any(theta):
            margins += cell_view(cell).matvec(theta)
    return margins


def apply_step(margins, cell, step: dict) -> np.ndarray:
    """ŷ + X_cell Δθ_B for the step of one block (a new array)."""
    delta = step["delta"]
    if not np.any(delta):
        return margins
    if cell is None:
        return margins + delta[0]
    return margins + cell_view(cell).matvec(delta)


# ------------------------------------------------------------- one block iteration


def block_stats(cell, y, margins, loss: str, gram: bool = False) -> dict:
    """Partial sums of g = Xᵀℓ'(ŷ) and h = (X∘X)ᵀℓ''(ŷ) over one row chunk.

    With ``gram`` also the block's weighted Gram matrix X_Bᵀ diag(ℓ''(ŷ)) X_B, for an exact
    Newton step on an impure block.
    """
    y = labels(y)
    d1, d2 = block_kernels.derivatives(obj.LOSS_CODES[loss], y, margins)
    view = cell_view(cell)
    if view is None:
        return {"g": np.array([d1.sum()]), "h": np.array([d2.sum()])}
    # Under the squared loss ℓ'' = 1: h is the same in every epoch (and the same bits).
    h = view.squared_sums() if loss == "squared" else view.rmatvec(d2, squared=True)
    stats = {"g": view.rmatvec(d1), "h": h}
    if gram:
        stats["gram"] = view.gram(d2)
    elif loss == "logistic":
        stats["cube"] = view.cube_sums()
    return stats


def block_direction(problem: obj.Problem, n_samples: int, theta, intercept_block: bool,
                    *partials) -> dict:
    """Sum the partial statistics (in order) and take the prox-Newton coordinate step.

    θ*_j = S(h_j θ_j − g_j, αρ)/(h_j + α(1−ρ)) (the SCD paper's θ* = T/(T'+λ)); for the
    intercept, b* = b − g/h. Returns the direction and the model decrease of each
    coordinate that the Armijo test compares with.
    """
    g = _ordered_sum(p["g"] for p in partials) / n_samples
    h = _ordered_sum(p["h"] for p in partials) / n_samples
    l1, l2 = (0.0, 0.0) if intercept_block else (problem.l1, problem.l2)
    if "gram" in partials[0]:
        hessian = _ordered_sum(p["gram"] for p in partials) / n_samples
        target = cpu.block_newton_qp(hessian, g, np.asarray(theta, dtype=np.float64), l1, l2,
                                     1000, 1e-15)
    else:
        denom = h + l2
        z = h * theta - g
        with np.errstate(divide="ignore", invalid="ignore"):
            target = np.where(denom > 0, np.sign(z) * np.maximum(np.abs(z) - l1, 0.0) / denom,
                              theta)
    direction = target - theta
    model = g * direction + _penalty(l1, l2, target) - _penalty(l1, l2, theta)
    # "theta"/"delta" are the full step, exact on a pure block under squared loss;
    # otherwise block_choose scales it.
    out = {"start": theta, "direction": direction, "model": model, "l1": l1, "l2": l2,
           "theta": target, "delta": direction}
    if "cube" in partials[0]:
        cube = _ordered_sum(p["cube"] for p in partials) / n_samples
        out["proven"] = _cubic_accepts(model, h, direction, cube)
    return out


def _cubic_accepts(model, h, delta, cube_mean) -> np.ndarray:
    """Per coordinate: does the Armijo test surely pass at the full step?

    Taylor with remainder, per coordinate of a pure block (its coordinates touch disjoint
    examples): f(θ + Δ) − f(θ) ≤ :func:`scalar.logistic_taylor_bound`, so a bound
    below the Armijo line proves what the trials would find; those coordinates are left
    out of the trials (the same test as the in-memory engine's).
    """
    bound = scalar.logistic_taylor_bound(model, h, delta, cube_mean)
    return (bound <= _ARMIJO * model) & (delta != 0.0)


def block_trials(cell, y, margins, direction: dict, problem: obj.Problem, pure: bool) -> dict:
    """Partial objective changes along the direction, for the line search.

    Pure block: per coordinate and step size (its coordinates touch disjoint examples).
    Impure block: for the whole block, per step size; under squared loss the exact
    quadratic instead, from ⟨u, ŷ − y⟩ and ‖u‖² with u = X_cell d.
    """
    d = direction["direction"]
    if pure and "proven" in direction:  # coordinates proven to pass at the full step: not tried
        d = np.where(direction["proven"], 0.0, d)
        if not np.any(d):
            return {"trials": np.zeros((len(LINE_SEARCH_STEPS), len(d)))}
    y = labels(y)
    view = cell_view(cell)
    if view is None or not pure:
        u = np.full(len(margins), d[0]) if view is None else view.matvec(d)
        if problem.loss == "squared":
            return {"linear": np.array([obj.vdot(u, margins - y)]), "quadratic": np.array([obj.vdot(u, u)])}
        return {"trials": block_kernels.line_trials(
            y, margins, u, LINE_SEARCH_STEPS, block_kernels.are_quarters(LINE_SEARCH_STEPS),
            problem.loss_code)}
    return {"trials": view.trials(problem.loss_code, y, margins, d, LINE_SEARCH_STEPS)}


def block_choose(direction: dict, n_samples: int, slack: float, *partials) -> dict:
    """Pick the step sizes from the summed trials (Armijo) or solve the squared-loss line.

    ``slack`` is the rounding noise of an objective change (≈ 1e-13·P): a step whose
    change is below it is accepted rather than stalling at the precision floor.
    """
    theta, d = direction["start"], direction["direction"]
    l1, l2 = direction["l1"], direction["l2"]
    if "quadratic" in partials[0]:
        linear = _ordered_sum(p["linear"] for p in partials)[0] / n_samples
        quadratic = _ordered_sum(p["quadratic"] for p in partials)[0] / n_samples
        step = _exact_line(theta, d, linear, quadratic, l1, l2)
        return {"theta": theta + step * d, "delta": step * d}
    trials = _ordered_sum(p["trials"] for p in partials) / n_samples  # (K,) or (K, |B|)
    steps = LINE_SEARCH_STEPS[:, None] if trials.ndim == 2 else LINE_SEARCH_STEPS
    if trials.ndim == 1:
        change = trials + _penalty(l1, l2, theta + steps[:, None] * d).sum(axis=1) - \
            _penalty(l1, l2, theta).sum()
        model = direction["model"].sum()
    else:
        change = trials + _penalty(l1, l2, theta + steps * d) - _penalty(l1, l2, theta)
        model = direction["model"]
    accept = change <= _ARMIJO * steps * model + slack
    first = np.argmax(accept, axis=0)  # the largest accepted step size
    chosen = np.where(accept.any(axis=0), LINE_SEARCH_STEPS[first], 0.0)
    if trials.ndim == 2 and "proven" in direction:
        chosen = np.where(direction["proven"], 1.0, chosen)
    delta = chosen * d
    return {"theta": theta + delta, "delta": delta}


def _exact_line(theta, d, linear, quadratic, l1, l2) -> float:
    """argmin_a a·linear + a²/2·quadratic + Σ_j pen(θ_j + a d_j) for a ≥ 0 (convex, 1-D)."""
    from scipy.optimize import minimize_scalar

    f = lambda a: a * linear + 0.5 * a * a * quadratic + _penalty(l1, l2, theta + a * d).sum()  # noqa: E731
    if l1 == 0.0:
        curvature = quadratic + l2 * obj.vdot(d, d)
        slope = linear + l2 * obj.vdot(theta, d)
        return max(0.0, -slope / curvature) if curvature > 0 else 0.0
    result = minimize_scalar(f, bounds=(0.0, 2.0), method="bounded", options={"xatol": 1e-12})
    return float(result.x) if f(result.x) < f(0.0) else 0.0


_penalty = scalar.penalty.py_func  # elementwise on arrays too


def _ordered_sum(parts) -> np.ndarray:
    """Σ in the given (row-chunk) order: the same bits whatever worker made each part."""
    parts = iter(parts)
    total = np.array(next(parts), dtype=np.float64, copy=True)
    for part in parts:
        total += part
    return total


# ------------------------------------------------------------------ certificate


def certificate_stats(cells: list, y, margins, problem: obj.Problem) -> dict:
    """One row chunk's share of the certificate, before the dual point's projection.

    The projection scales the positive and negative parts of a = −ℓ'(ŷ) by factors known
    only after the reduction, so the linear terms are kept apart by sign:
    Xᵀa = s₊ Xᵀa₊ + s₋ Xᵀa₋ (all blocks concatenated in grid column order). The cells are
    read one at a time, so at most one of them is held beyond the cache.
    """
    y = labels(y)
    a = -obj.loss_derivative(problem.loss, y, margins)
    pos, neg = np.where(a > 0, a, 0.0), np.where(a < 0, a, 0.0)
    xt_pos, xt_neg = [], []
    for cell in cells:
        view = cell_view(cell)
        xt_pos.append(view.rmatvec(pos))
        xt_neg.append(view.rmatvec(neg))
        del view
    return {
        "loss": np.array([obj.loss_value(problem.loss, y, margins).sum()]),
        "pos": np.array([pos.sum()]),
        "neg": np.array([neg.sum()]),
        "xt_pos": np.concatenate(xt_pos),
        "xt_neg": np.concatenate(xt_neg),
        "margin_pos": np.array([obj.vdot(pos, margins)]),
        "margin_neg": np.array([obj.vdot(neg, margins)]),
    }


def dual_loss_sum(y, margins, problem: obj.Problem, total: dict) -> np.ndarray:
    """Σ −ℓ*(−a_i) over one row chunk for the dual point projected with ``total``'s sums."""
    y = labels(y)
    a = obj.dual_point(problem, y, margins, _scales(problem, total))
    return np.array([obj.dual_loss(problem.loss, y, a).sum()])


def _scales(problem, total) -> tuple[float, float]:
    return obj.dual_scales(problem, {"pos": total["pos"][0], "neg": total["neg"][0]})


def certificate(problem: obj.Problem, n_samples: int, state: dict, total: dict,
                *duals) -> dict:
    """The duality-gap certificate of ``state`` from the reduced statistics.

    Returns ``state`` with its certificate under "certificate": the client fetches both
    in one round trip.
    """
    scales = _scales(problem, total)
    dual_sum = float(_ordered_sum(duals)[0])
    correlation = (scales[0] * total["xt_pos"] + scales[1] * total["xt_neg"]) / n_samples
    margin_dot = scales[0] * total["margin_pos"][0] + scales[1] * total["margin_neg"][0]
    cert = obj.primal_certificate(problem, n_samples, state["coef"], float(total["loss"][0]),
                                  dual_sum, correlation, float(margin_dot))
    return {**state, "certificate": cert}


def sum_partials(*partials) -> dict:
    """Key-wise ordered sum of partial dicts (the aggregate of a tree reduction)."""
    return {key: _ordered_sum(p[key] for p in partials) for key in partials[0]}


# ------------------------------------------------------------------ coarse step


@dataclass(frozen=True)
class RowSums:
    """S_r of the coarse step, stored compactly: shape (n_rows, k) in full.

    ``counts`` (n_rows, m) holds the columns that are not all ones, as uint8 or int16 when
    they are small non-negative or signed integers (the counts of a one-hot or set-valued
    block), else float64; ``column_of`` (k,) gives the stored column of each coarse
    coordinate, −1 for the ones vector (a complete one-hot block and the intercept).
    """

    counts: np.ndarray
    column_of: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.counts.nbytes + self.column_of.nbytes

    def toarray(self) -> np.ndarray:
        """The (n_rows, k) float64 array (for tests)."""
        full = np.ones((self.counts.shape[0], len(self.column_of)))
        for k, c in enumerate(self.column_of):
            if c >= 0:
                full[:, k] = self.counts[:, c]
        return full


def block_row_sums(cells: list, with_intercept: bool) -> RowSums:
    """S_r = [X_cell(b) 1 for every block b] (+ a column of ones), compactly.

    The directions "shift a whole block" (and the intercept) span the slow subspace of
    coordinate descent on one-hot-like data: a complete one-hot block sums to the ones
    vector, a set-valued block nearly so. On such data S_r takes 1 byte per row and
    set-valued block instead of 8 per row and block.
    """
    stored, column_of = [], []
    for cell in cells:
        view = cell_view(cell)
        column = view.matvec(np.ones(view.n_columns))
        del view
        if np.all(column == 1.0):
            column_of.append(-1)
        else:
            column_of.append(len(stored))
            stored.append(column)
    if with_intercept:
        column_of.append(-1)
    n_rows = len(column) if cells else 0
    dtype = _compact_dtype(stored)
    counts = np.empty((n_rows, len(stored)), dtype=dtype)
    for j, column in enumerate(stored):
        counts[:, j] = column
    return RowSums(counts, np.array(column_of, dtype=np.int64))


def _compact_dtype(columns) -> np.dtype:
    """The smallest of uint8, int16 holding every value exactly, else float64."""
    if not columns:
        return np.dtype(np.uint8)
    lo = min(float(c.min()) for c in columns)
    hi = max(float(c.max()) for c in columns)
    if not all(np.array_equal(c, np.round(c)) for c in columns):
        return np.dtype(np.float64)
    for dtype in (np.uint8, np.int16):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return np.dtype(dtype)
    return np.dtype(np.float64)


def coarse_stats(row_sums: RowSums, y, margins, loss: str) -> dict:
    """Partial gradient Sᵀℓ'(ŷ) and curvature Sᵀ diag(ℓ''(ŷ)) S of the coarse problem.

    Summed in row order by a loop (never BLAS), so the same bits on every worker.
    """
    y = labels(y)
    d1 = obj.loss_derivative(loss, y, margins)
    d2 = obj.loss_second_derivative(loss, y, margins)
    g, h = block_kernels.coarse_stats(row_sums.counts, row_sums.column_of, d1, d2)
    return {"g": g, "h": h}


def coarse_direction(problem: obj.Problem, n_samples: int, offsets, state: dict,
                     *partials) -> dict:
    """Sum the coarse statistics in order and solve the k-dimensional Newton problem."""
    total = sum_partials(*partials)
    g, h = total["g"] / n_samples, total["h"] / n_samples
    blocks = _blocks(state["coef"], offsets)
    return {"shift": coarse_newton(problem, g, h, blocks), "g": g}


def coarse_trials(row_sums: RowSums, y, margins, direction: dict, loss: str) -> dict:
    """Partial Σ ℓ(ŷ + t·S c) − ℓ(ŷ) for the line search of the coarse step."""
    shift = direction["shift"]
    if not np.any(shift):
        return {"trials": np.zeros(len(LINE_SEARCH_STEPS))}
    y = labels(y)
    u = block_kernels.coarse_matvec(row_sums.counts, row_sums.column_of, shift)
    base = obj.loss_value(loss, y, margins)
    return {"trials": np.array([(obj.loss_value(loss, y, margins + t * u) - base).sum()
                                for t in LINE_SEARCH_STEPS])}


def coarse_apply(problem: obj.Problem, n_samples: int, offsets, state: dict, direction: dict,
                 *trials) -> dict:
    """The state moved by the coarse step (line-searched when ``trials`` are given)."""
    shift = direction["shift"]
    if not np.any(shift):
        return state
    blocks = _blocks(state["coef"], offsets)
    step = 1.0
    if trials:
        change = _ordered_sum(p["trials"] for p in trials) / n_samples
        step = coarse_line_search(problem, change, direction["g"], shift, blocks)
    coef = state["coef"].copy()
    for b in range(len(offsets) - 1):
        coef[offsets[b]:offsets[b + 1]] += step * shift[b]
    intercept = state["intercept"]
    if problem.fit_intercept:
        intercept += step * shift[-1]
    return {"coef": coef, "intercept": float(intercept)}


def _blocks(coef, offsets) -> list:
    return [coef[offsets[b]:offsets[b + 1]] for b in range(len(offsets) - 1)]
