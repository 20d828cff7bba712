"""dask_scd at Criteo-like scale: in memory, on a grid over a 2-worker cluster, out of core,
against Spark MLlib, dask-ml and the best in-memory peers (scikit-learn, glum, Snap ML).

Data (generated, seeded): 26 one-hot categorical fields with Zipf-distributed values and
vocabularies spread log-uniformly from 10 to 200,000 (611,438 features, 26 non-zeros per
row), ``dask_scd.datasets.make_onehot``. Problems (rows): logistic L2 at alpha = 1/n and
0.1/n, logistic L1 and squared-loss L1 at ~10 % non-zeros, squared-loss L2 at 1/n, all
with an intercept, objective P = (1/n) Σ loss + alpha·(ρ‖θ‖₁ + (1−ρ)/2‖θ‖²).

Columns: per method, the time to a relative objective error (P − P*)/|P*| of 1e-4 and
1e-6 against a reference optimum P* (the smallest objective any run of the row reached;
our in-memory fits run at tol=1e-10), iterations, non-zeros per second per worker, time
per iteration and peak memory. Every run has a wall-clock cap and reads "over cap" when
it hits it. On the grid: ``auto``, ``block_scd``, ``block_newton`` and ``cocoa`` (CoCoA
with adaptive aggregation, one part per worker, split by feature); ``--grid-solvers``
picks some of them.

Run ``python benchmarks/bench_scale.py`` (full: 2M rows, hours on 2 cores) or ``--quick``
(200k rows). See benchmarks/README.md.
"""

from __future__ import annotations

import os

# One thread per process (this one, forked runs, the dask workers, which inherit it), before
# numpy, numba and BLAS are imported. Spark gets its own local[2].
for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import multiprocessing  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _cgroup  # noqa: E402
import bench_beyond_ram  # noqa: E402
import bench_epoch_rates  # noqa: E402
import bench_ooc_cgroup  # noqa: E402

RESULTS = HERE / "results" / "scale.md"
DATA = HERE / "data" / "bench_scale"  # gitignored (benchmarks/data/)
ERRORS = (1e-4, 1e-6)  # relative objective errors reported
OUR_TOL = 1e-10  # our fits run to this certified gap (or their cap): P* comes from them
# The L1 rows: alpha = L1_FRACTION · alpha_max, alpha_max = ‖Xᵀa‖∞/n with a = −ℓ'(y, b₀) at
# the intercept-only model (ȳ's model for the squared loss). Chosen once on the quick size
# (200k rows): the 90 % quantile of |x_jᵀa|/n is 2.0e-4·alpha_max for both losses (a
# feature seen a couple of times enters), which lets in about 10 % of the 611k features.
L1_FRACTION = 2e-4


# The data sets (--data): fields, and the Zipf exponent of their values. "heavy" has more
# fields, and its vocabularies' frequent values take more of the rows (exponent 1.2), so
# that its rare values are rarer: more columns seen a handful of times, which the block
# steps reach only through their tiny curvature.
DATASETS = {"criteo": (26, 1.0), "heavy": (39, 1.2)}
DATASET = "criteo"  # set by main from --data


def n_fields() -> int:
    return DATASETS[DATASET][0]


def cardinalities(fields=None, low=10, high=200_000) -> list:
    """Vocabulary sizes spread log-uniformly from ``low`` to ``high`` (611,438 in all
    for the 26 fields of the default data)."""
    fields = n_fields() if fields is None else fields
    return [int(c) for c in np.round(np.geomspace(low, high, fields)).astype(int)]


def make_data(n, seed=0):
    """``make_onehot(n, fields, cardinalities(), zipf=…, random_state=seed)`` of the data
    set :data:`DATASET`: X (CSR), ±1 y, blocks."""
    from dask_scd.datasets import make_onehot

    fields, zipf = DATASETS[DATASET]
    return make_onehot(
        n, n_fields=fields, cardinality=cardinalities(), zipf=zipf, random_state=seed
    )


def data_description() -> str:
    """The generator call of :data:`DATASET`, for the report."""
    fields, zipf = DATASETS[DATASET]
    exponent = "" if zipf == 1.0 else f", zipf={zipf:g}"
    return (
        f"`make_onehot(n, {fields}, cardinality=geomspace(10, 200000, {fields}){exponent}, "
        "random_state=0)`"
    )


@dataclass(frozen=True)
class Sizes:
    n: int
    cap: float  # seconds, per run (and per ladder of runs of one method)
    ooc_rows: int
    ooc_epochs: int


FULL = Sizes(2_000_000, 600.0, 6_000_000, 3)
QUICK = Sizes(200_000, 60.0, 600_000, 2)
SPARK_LADDER = (1, 2, 5, 10, 20, 40, 80, 160, 320, 640, 1280)
PEER_TOLS = tuple(10.0**-k for k in range(2, 11))
# A worker process holding the engine's state for 611k features peaks at ~310-380 MiB here
# (measured on 60k- and 600k-row grids; 320 MiB workers sat at their pause threshold and
# stalled): a limit below this floor only stalls.
OOC_FLOOR = 448 * 2**20


# --------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class Row:
    key: str
    loss: str
    penalty: str
    scale: float  # alpha = scale/n (L2) or scale·alpha_max (L1)

    @property
    def rho(self) -> float:
        return 1.0 if self.penalty == "l1" else 0.0

    def alpha(self, X, y) -> float:
        n = X.shape[0]
        if self.penalty == "l2":
            return self.scale / n
        return self.scale * alpha_max(X, y, self.loss)

    def describe(self) -> str:
        if self.penalty == "l2":
            return f"{self.loss} L2, alpha = {self.scale:g}/n"
        return f"{self.loss} L1, alpha = {self.scale:g}·alpha_max (~10 % non-zeros)"


ROWS = (
    Row("logistic-l2", "logistic", "l2", 1.0),
    Row("logistic-l2-0.1", "logistic", "l2", 0.1),
    Row("logistic-l1", "logistic", "l1", L1_FRACTION),
    Row("squared-l2", "squared", "l2", 1.0),
    Row("squared-l1", "squared", "l1", L1_FRACTION),
)
COLUMNS = ("ours-mem", "ours-grid", "spark", "dask-ml", "sklearn", "glum", "snapml", "ooc")


def alpha_max(X, y, loss) -> float:
    """‖Xᵀa‖∞/n with a = −ℓ'(y, b₀), b₀ the optimal intercept alone: the smallest alpha
    of the pure L1 problem whose solution is θ = 0 (for the squared loss a = y − ȳ)."""
    from dask_scd.objectives import loss_derivative, optimal_intercept

    y = np.asarray(y, dtype=np.float64)
    b0 = optimal_intercept(loss, y, np.zeros_like(y))
    a = -loss_derivative(loss, y, np.full_like(y, b0))
    return float(np.abs(np.asarray(X.T @ a).ravel()).max() / len(y))


# --------------------------------------------------------------- objectives, errors


def objective(loss, alpha, rho, X, y, coef, intercept) -> float:
    """Our P(θ, b) = (1/n) Σ ℓ(y_i, x_iᵀθ + b) + alpha·(ρ‖θ‖₁ + (1−ρ)/2‖θ‖²), in numpy."""
    z = np.asarray(X @ coef).ravel() + intercept
    if loss == "logistic":
        losses = np.logaddexp(0.0, -y * z)
    else:
        losses = 0.5 * (y - z) ** 2
    coef = np.asarray(coef, dtype=np.float64)
    return float(
        losses.mean() + alpha * (rho * np.abs(coef).sum() + 0.5 * (1.0 - rho) * coef @ coef)
    )


def spark_label_std(y) -> float:
    """The label scale Spark's LinearRegression divides y by (sample std, n − 1)."""
    return float(np.std(np.asarray(y, dtype=np.float64), ddof=1))


def spark_reg_param(loss, alpha, rho, y) -> float:
    """Spark's regParam for our (loss, alpha, ρ ∈ {0, 1}).

    LogisticRegression minimizes (1/n) Σ log-loss + λ(ρ‖w‖₁ + (1−ρ)/2‖w‖²): λ = alpha.
    LinearRegression (solver="l-bfgs") fits y/σ with λ/σ, σ = spark_label_std(y), and
    scales the coefficients back by σ: in the original scale that is (1/2n) Σ (y − ŷ)² +
    λ(ρ‖w‖₁ + (1−ρ)/(2σ)‖w‖²): the L1 term is ours, the L2 term is ours for λ = alpha·σ.
    """
    if loss == "logistic" or rho == 1.0:
        return float(alpha)
    if rho == 0.0:
        return float(alpha) * spark_label_std(y)
    raise ValueError("only ρ = 0 or 1 map onto one Spark regParam")


def spark_objective(loss, reg_param, elastic_net, X, y, coef, intercept) -> float:
    """The objective Spark minimizes, in its own units (what its ``objectiveHistory``
    reports), at the coefficients it returns (original scale).

    LogisticRegression: (1/n) Σ log(1 + exp(−y ŷ)) + λ(ρ‖w‖₁ + (1−ρ)/2‖w‖²) — ours.
    LinearRegression: fitted on y/σ with coefficients w/σ and λ/σ (σ the label's sample
    std): (1/2n) Σ (y/σ − ŷ/σ)² + (λ/σ)(ρ‖w/σ‖₁ + (1−ρ)/2‖w/σ‖²), which is
    :func:`spark_objective_ours` / σ².
    """
    z = np.asarray(X @ coef).ravel() + intercept
    coef = np.asarray(coef, dtype=np.float64)
    if loss == "logistic":
        data = np.logaddexp(0.0, -y * z).mean()
        return float(
            data
            + reg_param * (elastic_net * np.abs(coef).sum() + 0.5 * (1 - elastic_net) * coef @ coef)
        )
    s = spark_label_std(y)
    w = coef / s
    return float(
        0.5 * ((y / s - z / s) ** 2).mean()
        + (reg_param / s) * (elastic_net * np.abs(w).sum() + 0.5 * (1 - elastic_net) * w @ w)
    )


def spark_objective_ours(loss, y, spark_value) -> float:
    """Spark's objective value in our units (times σ² for LinearRegression)."""
    return spark_value if loss == "logistic" else spark_value * spark_label_std(y) ** 2


def rel_error(primal, p_star) -> float:
    if primal is None or not math.isfinite(p_star) or not math.isfinite(primal):
        return math.inf
    return max(primal - p_star, 0.0) / abs(p_star)


def time_to_error(seconds, primal, p_star, error, offset=0.0):
    """(seconds + offset, index) of the first iterate within ``error`` of P*, or None.

    ``seconds`` and ``primal`` are a History's lists (one entry per certified
    iteration); ``offset`` adds the time before the history's clock started.
    """
    for k, (s, p) in enumerate(zip(seconds, primal)):
        if rel_error(p, p_star) <= error:
            return s + offset, k
    return None


# ------------------------------------------------------------------ a run's record


@dataclass
class Outcome:
    """One method on one row: iterates (time, objective) or runs of a ladder."""

    column: str  # the COLUMNS key
    name: str
    points: list = field(default_factory=list)  # (seconds, primal, iterations)
    status: str = ""  # "", "over cap", "error: ...", "n/a: ..."
    iterations: int | None = None
    seconds: float | None = None  # the whole run (or the ladder's last run)
    passes: float | None = None  # passes over X of the whole run (for nnz/s)
    per_iteration: float | None = None
    peak: str = "—"
    workers: int = 1
    note: str = ""
    solver: str = ""
    support: int | None = None  # non-zero coefficients of the final solution

    def hit(self, p_star, error):
        return next(((s, it) for s, p, it in self.points if rel_error(p, p_star) <= error), None)

    def best(self):
        return min((p for _, p, _ in self.points), default=math.inf)


def fmt_s(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if x >= 100:
        return f"{x:.0f} s"
    if x >= 1:
        return f"{x:.3g} s"
    return f"{x * 1e3:.3g} ms"


def fmt_bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} GiB"


def md_table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c).replace("|", "/") for c in r) + " |" for r in rows]
    return "\n".join(out)


def log(*a):
    print(*a, flush=True)


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def vm_hwm(pid="self") -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Poller(threading.Thread):
    """Peak RSS of this process and of its worker processes (children started by
    multiprocessing spawn: the LocalCluster's workers), polled every 0.2 s."""

    def __init__(self, pids=None, interval=0.2):
        super().__init__(daemon=True)
        import psutil

        self.me = psutil.Process()
        self.pids = pids  # extra processes (and their children) to watch, e.g. Spark's
        self.own = 0
        self.workers: dict = {}
        self.tree = 0
        self.interval = interval
        self._halt = threading.Event()

    def run(self):
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def sample(self):
        import psutil

        with contextlib.suppress(Exception):
            self.own = max(self.own, self.me.memory_info().rss)
        for child in self.me.children(recursive=True):
            with contextlib.suppress(Exception):
                if "spawn_main" in " ".join(child.cmdline()):
                    r = child.memory_info().rss
                    self.workers[child.pid] = max(self.workers.get(child.pid, 0), r)
        for pid in self.pids or ():
            with contextlib.suppress(Exception):
                root = psutil.Process(pid)
                total = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
                self.tree = max(self.tree, total)

    def stop(self):
        self._halt.set()
        self.join()
        self.sample()


# ------------------------------------------------------------------- ours in process


class OverCap(Exception):
    pass


@contextlib.contextmanager
def streamed(cap):
    """Record every certified iteration of any dask_scd fit in this process as
    (seconds since the fit call, primal, iteration), and stop the fit (OverCap raised
    from its progress report) once ``cap`` seconds have passed."""
    from dask_scd.progress import Progress

    original = Progress.update
    record = {"t0": time.perf_counter(), "points": [], "solver": ""}

    def update(self, iteration, relative_gap, primal, **extra):
        now = time.perf_counter() - record["t0"]
        record["solver"] = self.solver
        record["points"].append((now, float(primal), int(iteration)))
        original(self, iteration, relative_gap, primal, **extra)
        if now > cap:
            raise OverCap

    Progress.update = update
    try:
        yield record
    finally:
        Progress.update = original


def run_ours(column, name, X, y, row, alpha, cap, nnz, workers=1, **kw) -> Outcome:
    """dask_scd.fit at tol=OUR_TOL under ``cap``; times from the fit call (setup included)."""
    import dask_scd

    out = Outcome(column, name, workers=workers)
    poller = Poller()
    base = rss()
    poller.start()
    result = None
    t0 = time.perf_counter()
    with warnings.catch_warnings(), streamed(cap) as rec:
        warnings.simplefilter("ignore")
        try:
            result = dask_scd.fit(
                X,
                y,
                loss=row.loss,
                penalty=row.penalty,
                alpha=alpha,
                tol=OUR_TOL,
                max_iter=1_000_000,
                random_state=0,
                **kw,
            )
        except OverCap:
            out.status = "over cap"
        except Exception as exc:  # an engine refusing the problem
            text = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
            out.status = f"error: {text}"
    wall = time.perf_counter() - t0
    poller.stop()
    out.points = list(rec["points"])
    out.seconds = wall
    if result is not None:
        h = result.history_
        # The history's clock starts at the epoch loop: shift it by the setup.
        offset = out.points[0][0] - h.seconds[0] if out.points and h.seconds else 0.0
        out.points = [(s + offset, p, it) for s, p, it in zip(h.seconds, h.primal, h.iteration)]
        out.iterations = int(result.n_iter_)
        out.solver = result.solver_
        out.passes = result.extras_.get("total_passes")
        if out.passes is None and result.solver_ in ("scd", "sdca", "block_scd", "gram"):
            out.passes = float(result.n_iter_)
        iter_time = h.seconds[-1] if h.seconds else wall
        out.per_iteration = iter_time / max(result.n_iter_, 1)
        out.note = f"certified gap {result.dual_gap_:.1e}"
        out.support = int(np.count_nonzero(result.coef_))
        if not result.converged_ and wall >= cap:
            out.status = "over cap"
    elif out.points:
        out.iterations = out.points[-1][2]
        out.solver = rec["solver"]
        out.per_iteration = out.points[-1][0] / max(out.iterations, 1)
        if out.solver in ("scd", "sdca", "block_scd"):
            out.passes = float(out.iterations)  # epochs; the Newton engines' are unknown
    if workers == 1:
        out.peak = f"+{fmt_bytes(max(poller.own - base, 0))} (process)"
    else:
        peaks = sorted(poller.workers.values(), reverse=True)[:workers]
        out.peak = " / ".join(fmt_bytes(v) for v in peaks) + " (workers)" if peaks else "—"
    return out


def run_ours_forked(name, X, y, row, alpha, cap, nnz, **kw) -> Outcome:
    """run_ours in a forked child, which streams each certified iterate to this process:
    the in-memory engines certify only every few epochs (SCD's interval grows), so the
    child is killed at 1.1 x cap + 5 s and the iterates received so far still count."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child():
        from dask_scd.progress import Progress

        original = Progress.update

        def update(self, iteration, relative_gap, primal, **extra):
            send.send(("point", float(primal), int(iteration), self.solver))
            original(self, iteration, relative_gap, primal, **extra)

        Progress.update = update
        try:
            start = rss()
            out = run_ours("ours-mem", name, X, y, row, alpha, cap, nnz, **kw)
            out.peak = f"+{fmt_bytes(max(vm_hwm() - start, 0))} (process)"
            send.send(("done", out))
        except BaseException as exc:
            send.send(("error", f"{type(exc).__name__}: {exc}"[:160]))
        finally:
            send.close()

    t0 = time.perf_counter()
    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    send.close()
    out = Outcome("ours-mem", name)
    deadline = t0 + 1.1 * cap + 5.0
    try:
        while True:
            left = deadline - time.perf_counter()
            if left <= 0 or not receive.poll(left):
                out.status = "over cap (killed)"
                break
            msg = receive.recv()
            if msg[0] == "point":
                out.points.append((time.perf_counter() - t0, msg[1], msg[2]))
                out.solver, out.iterations = msg[3], msg[2]
            elif msg[0] == "done":
                out = msg[1]
                break
            else:
                out.status = f"error: {msg[1]}"
                break
    except EOFError:
        out.status = out.status or f"error: the run died (exit code {proc.exitcode})"
    finally:
        proc.join(timeout=2.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
        receive.close()
    if out.status.startswith("over cap (killed)"):
        out.seconds = time.perf_counter() - t0
    if out.status.startswith("over cap (killed)") and out.points:
        out.per_iteration = out.points[-1][0] / max(out.iterations or 1, 1)
        if out.solver in ("scd", "sdca"):
            out.passes = float(out.iterations)
    return out


def warm_up(X, y):
    """Compile the numba kernels of every in-memory engine on a small slice."""
    import dask_scd

    Xs, ys = X[:3000], y[:3000]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for loss in ("logistic", "squared"):
            for penalty in ("l2", "l1"):
                for solver in ("auto", "newton", "block_scd", "scd", "sdca"):
                    with contextlib.suppress(Exception):
                        dask_scd.fit(
                            Xs,
                            ys,
                            loss=loss,
                            penalty=penalty,
                            alpha=1e-3,
                            tol=1e-4,
                            max_iter=3,
                            solver=solver,
                        )


MEM_SOLVERS = ("auto", "newton", "block_scd", "scd", "sdca")


def in_memory_engines(row, chosen=MEM_SOLVERS) -> tuple:
    """The in-memory engines run on a row (SDCA has no L1 penalty)."""
    return tuple(s for s in chosen if s != "sdca" or row.penalty == "l2")


# -------------------------------------------------------------- peers, in a forked child


def isolated(fn, timeout):
    """``fn()`` in a forked child killed after ``timeout`` s: ("ok", value), ("timeout",
    None) or ("error", message). The child reports the memory its run added (VmHWM −
    RSS at the fork) as value["added"]."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child():
        try:
            start = rss()
            value = fn()
            value["added"] = max(vm_hwm() - start, 0)
            send.send(("ok", value))
        except BaseException as exc:
            text = str(exc).splitlines()[0][:160] if str(exc) else ""
            send.send(("error", f"{type(exc).__name__}: {text}"))
        finally:
            send.close()

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    send.close()
    try:
        status, value = receive.recv() if receive.poll(timeout) else ("timeout", None)
    except EOFError:
        status, value = "error", f"the run died (exit code {proc.exitcode})"
    finally:
        proc.join(timeout=5.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
        receive.close()
    return status, value


@dataclass
class Peer:
    column: str
    name: str
    build: object  # (tol) -> estimator, or a reason string (skipped)
    layout: str = "rows"  # "rows" CSR, "columns" CSC, "dask"
    labels01: bool = False
    tols: tuple = PEER_TOLS


def peer_methods(row, alpha, n, p, sizes) -> list:
    out = []
    C = 1.0 / (alpha * n)
    # scikit-learn
    from sklearn.linear_model import Lasso, LogisticRegression, Ridge

    if row.loss == "logistic":
        solver = "lbfgs" if row.penalty == "l2" else "saga"
        pen = {"l1_ratio": row.rho} if _sklearn_l1_ratio() else {"penalty": row.penalty}
        out.append(
            Peer(
                "sklearn",
                f"sklearn LogisticRegression({solver})",
                lambda tol, s=solver: LogisticRegression(
                    C=C, solver=s, tol=tol, max_iter=100_000, **pen
                ),
            )
        )
        out.append(
            Peer(
                "sklearn",
                "sklearn LogisticRegression(newton-cholesky)",
                f"forms a dense {p} x {p} Hessian",
            )
        )
    elif row.penalty == "l2":
        for solver in ("sparse_cg", "lsqr"):
            out.append(
                Peer(
                    "sklearn",
                    f"sklearn Ridge({solver})",
                    lambda tol, s=solver: Ridge(
                        alpha=alpha * n, solver=s, tol=tol, max_iter=100_000
                    ),
                )
            )
    else:
        out.append(
            Peer(
                "sklearn",
                "sklearn Lasso(cd)",
                lambda tol: Lasso(alpha=alpha, tol=tol, max_iter=100_000),
                "columns",
            )
        )
    # glum: its lbfgs for L2 (IRLS forms a dense p x p Hessian: skipped)
    glum = _optional("glum")
    if isinstance(glum, str):
        out.append(Peer("glum", "glum", glum))
    elif row.penalty == "l2":
        fam = "binomial" if row.loss == "logistic" else "normal"
        out.append(
            Peer(
                "glum",
                "glum (lbfgs)",
                lambda tol: glum.GeneralizedLinearRegressor(
                    family=fam,
                    alpha=alpha,
                    l1_ratio=0.0,
                    solver="lbfgs",
                    gradient_tol=tol,
                    max_iter=100_000,
                ),
                "columns",
                labels01=row.loss == "logistic",
            )
        )
    else:
        out.append(
            Peer(
                "glum",
                "glum (irls-cd)",
                f"forms a dense {p} x {p} Hessian (lbfgs takes no L1 term)",
            )
        )
    # Snap ML: dual CD for L2 (intercept as a penalized constant column); its L1 (primal)
    # solver fits no intercept.
    snapml = _optional("snapml")
    if isinstance(snapml, str):
        out.append(Peer("snapml", "snapml", snapml))
    elif row.penalty == "l1":
        out.append(Peer("snapml", "snapml", "its L1 (primal) solver fits no intercept"))
    else:
        cls = snapml.LogisticRegression if row.loss == "logistic" else snapml.LinearRegression
        out.append(
            Peer(
                "snapml",
                f"snapml {cls.__name__}(dual)",
                lambda tol, cls=cls: cls(
                    regularizer=alpha * n,
                    dual=True,
                    fit_intercept=True,
                    intercept_scaling=100.0,
                    tol=tol,
                    max_iter=1_000_000,
                    n_jobs=1,
                ),
                "rows",
            )
        )
    # dask-ml on the sparse dask array (expected to fail: the error is recorded)
    dml = _optional("dask_ml.linear_model")
    if isinstance(dml, str):
        out.append(Peer("dask-ml", "dask-ml", dml))
    else:
        solvers = ("lbfgs", "admm") if row.penalty == "l2" else ("admm",)
        cls = dml.LogisticRegression if row.loss == "logistic" else dml.LinearRegression
        for s in solvers:
            out.append(
                Peer(
                    "dask-ml",
                    f"dask-ml {cls.__name__}({s})",
                    lambda tol, s=s, cls=cls: cls(
                        penalty=row.penalty,
                        C=C,
                        solver=s,
                        tol=tol,
                        max_iter=10_000,
                        fit_intercept=True,
                    ),
                    "dask",
                    tols=(1e-4, 1e-6, 1e-8),
                )
            )
    return out


def _sklearn_l1_ratio() -> bool:
    import inspect

    from sklearn.linear_model import LogisticRegression

    return inspect.signature(LogisticRegression).parameters["penalty"].default == "deprecated"


def _optional(module):
    import importlib

    try:
        return importlib.import_module(module)
    except Exception as exc:
        return f"{module} not installed ({type(exc).__name__})"


def run_peer(peer: Peer, layouts, y, row, alpha, cap) -> Outcome:
    """The peer at tightening tolerances (each from scratch, in a forked child), until one
    run reaches 1e-6 of the working P*, the objective stalls, or ``cap`` s are spent."""
    out = Outcome(peer.column, peer.name)
    if isinstance(peer.build, str):
        out.status = f"n/a: {peer.build}"
        return out
    X = layouts[peer.layout]
    yy = (y > 0).astype(np.float64) if peer.labels01 else y
    if peer.layout == "dask":
        import dask.array as da

        n = X.shape[0]
        X = da.from_array(X, chunks=(max(n // 8, 1), X.shape[1]), asarray=False)
        yy = da.from_array(yy, chunks=max(n // 8, 1))

    def fit(tol):
        def go():
            import dask

            est = peer.build(tol)
            with warnings.catch_warnings(), dask.config.set(scheduler="synchronous"):
                warnings.simplefilter("ignore")
                t = time.perf_counter()
                est.fit(X, yy)
                seconds = time.perf_counter() - t
            coef = np.asarray(est.coef_, dtype=np.float64).ravel()
            b = float(np.ravel(getattr(est, "intercept_", 0.0))[0])
            if peer.column == "snapml":
                b *= 100.0  # its intercept_ is the weight of the constant column
            it = getattr(est, "n_iter_", None)
            with contextlib.suppress(TypeError, ValueError):
                it = int(np.max(it)) if it is not None else None
            return {"seconds": seconds, "coef": coef, "intercept": b, "n_iter": it}

        return go

    spent, best = 0.0, []
    for tol in peer.tols:
        left = cap - spent
        if left <= 1.0:
            out.status = out.status or "over cap"
            break
        status, value = isolated(fit(tol), left)
        if status == "timeout":
            out.status = "over cap"
            spent = cap
            break
        if status == "error":
            out.status = f"error: {value}"
            break
        spent += value["seconds"]
        P = objective(
            row.loss, alpha, row.rho, layouts["rows"], y, value["coef"], value["intercept"]
        )
        out.points.append((value["seconds"], P, value["n_iter"]))
        out.iterations, out.seconds = value["n_iter"], value["seconds"]
        out.peak = f"+{fmt_bytes(value['added'])} (process)"
        out.note = f"last tol={tol:.0e}"
        best.append(P)
        out.support = int(np.count_nonzero(value["coef"]))
        if rel_error(P, row_pref.get(row.key, math.inf)) <= ERRORS[-1]:
            break
        if len(best) >= 3 and best[-3] - best[-1] <= 1e-12 * abs(best[-1]):
            out.note += ", objective stalled"
            break
    out.passes = out.iterations
    # Ladder runs: each point is a separate run from scratch; 'seconds' is its own time.
    return out


row_pref: dict = {}  # the working P* of each row (our fits), for the ladders' stopping rule


# ----------------------------------------------------------------------------- Spark


def write_libsvm(path, X, y):
    from sklearn.datasets import dump_svmlight_file

    tmp = Path(str(path) + ".tmp")
    dump_svmlight_file(X, y, str(tmp), zero_based=False)  # Spark reads one-based indices
    tmp.rename(path)


def _spark_main(args):
    """In a fresh process: read the libsvm file, cache it, then fit at each maxIter the
    parent asks for (one JSON line per fit; the parent answers 'next' or 'stop')."""
    spec = json.loads(args._spark)
    import pyspark
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench_scale")
        .config("spark.driver.memory", spec["driver_memory"])
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    t = time.perf_counter()
    df = (
        spark.read.format("libsvm")
        .option("numFeatures", str(spec["p"]))
        .load(spec["path"])
        .repartition(4)
    )
    if spec["loss"] == "logistic":
        df = df.withColumn("label", (F.col("label") + 1.0) / 2.0)
    df = df.cache()
    rows = df.count()
    print(
        "LOADED",
        json.dumps(
            {"seconds": time.perf_counter() - t, "rows": rows, "version": pyspark.__version__}
        ),
        flush=True,
    )

    def estimator(max_iter):
        if spec["loss"] == "logistic":
            from pyspark.ml.classification import LogisticRegression

            return LogisticRegression(
                maxIter=max_iter,
                regParam=spec["reg_param"],
                elasticNetParam=spec["elastic_net"],
                tol=1e-12,
                fitIntercept=True,
                standardization=False,
                family="binomial",
            )
        from pyspark.ml.regression import LinearRegression

        return LinearRegression(
            maxIter=max_iter,
            regParam=spec["reg_param"],
            elasticNetParam=spec["elastic_net"],
            tol=1e-12,
            fitIntercept=True,
            standardization=False,
            solver="l-bfgs",
        )

    estimator(2).fit(df)  # warm-up: JIT and the first job's setup, not timed
    for max_iter in spec["ladder"]:
        t = time.perf_counter()
        model = estimator(max_iter).fit(df)
        seconds = time.perf_counter() - t
        coef = model.coefficients.toArray()
        out = Path(spec["workdir"]) / f"spark-{max_iter}.npy"
        np.save(out, coef)
        summary = model.summary
        print(
            "FIT",
            json.dumps(
                {
                    "max_iter": max_iter,
                    "seconds": seconds,
                    "file": str(out),
                    "intercept": float(model.intercept),
                    "iterations": int(summary.totalIterations),
                    "objective": float(summary.objectiveHistory[-1]),
                }
            ),
            flush=True,
        )
        if sys.stdin.readline().strip() != "next":
            break
    spark.stop()


def run_spark(row, alpha, X, y, libsvm, cap, workdir) -> tuple[Outcome, dict]:
    """Spark at maxIter = 1, 2, 5, 10, 20, ... (each fit from scratch on the cached data)
    until a fit is within 1e-6 of the working P*, Spark stops before maxIter, or the
    ladder's fits have spent ``cap`` s. Returns the outcome and load facts."""
    name = (
        "Spark LogisticRegression" if row.loss == "logistic" else "Spark LinearRegression(l-bfgs)"
    ) + (" OWL-QN" if row.penalty == "l1" else " L-BFGS")
    out = Outcome("spark", name, workers=2)
    reg = spark_reg_param(row.loss, alpha, row.rho, y)
    spec = {
        "path": str(libsvm),
        "p": X.shape[1],
        "loss": row.loss,
        "reg_param": reg,
        "elastic_net": row.rho,
        "ladder": list(SPARK_LADDER),
        "workdir": str(workdir),
        # 8g held the 2M-row rows (5.5-6.5 GiB resident); the 3x table's data is
        # 3x larger: the heap grows with it (within this 23.5 GiB machine)
        "driver_memory": "8g" if X.shape[0] <= 3_000_000 else "14g",
    }
    cmd = [sys.executable, __file__, "--_spark", json.dumps(spec)]
    err = open(workdir / f"spark-{row.key}.stderr", "w")
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        start_new_session=True,
    )
    poller = Poller(pids=[proc.pid])
    poller.start()
    lines: list = []
    cond = threading.Condition()

    def reader():
        for line in proc.stdout:
            with cond:
                lines.append(line)
                cond.notify_all()
        with cond:
            lines.append(None)
            cond.notify_all()

    threading.Thread(target=reader, daemon=True).start()

    def next_line(timeout):
        deadline = time.perf_counter() + timeout
        with cond:
            while True:
                for i, line in enumerate(lines):
                    if line is None or line.startswith(("LOADED", "FIT")):
                        return lines.pop(i)
                left = deadline - time.perf_counter()
                if left <= 0:
                    return "TIMEOUT"
                cond.wait(left)

    load = {}
    spent = 0.0
    line = next_line(max(cap, 300.0))  # JVM start and the load have their own allowance
    if line and line.startswith("LOADED"):
        load = json.loads(line.split(" ", 1)[1])
        while True:
            line = next_line(cap - spent + 60.0)  # + the untimed warm-up and the save
            if line is None or line == "TIMEOUT":
                out.status = "over cap" if line == "TIMEOUT" else "died (see stderr)"
                break
            r = json.loads(line.split(" ", 1)[1])
            coef = np.load(r["file"])
            os.remove(r["file"])
            P = objective(row.loss, alpha, row.rho, X, y, coef, r["intercept"])
            spark_P = spark_objective(row.loss, reg, row.rho, X, y, coef, r["intercept"])
            out.points.append((r["seconds"], P, r["iterations"]))
            out.iterations, out.seconds, out.passes = r["iterations"], r["seconds"], r["iterations"]
            out.per_iteration = r["seconds"] / max(r["iterations"], 1)
            out.note = (
                f"maxIter={r['max_iter']}; Spark's objectiveHistory[-1] "
                f"{r['objective']:.10g} vs its objective recomputed by us "
                f"{spark_P:.10g}; in our units {spark_objective_ours(row.loss, y, spark_P):.10g}"
                f" vs our P {P:.10g}"
            )
            spent += r["seconds"]
            out.support = int(np.count_nonzero(coef))
            done = (
                rel_error(P, row_pref.get(row.key, math.inf)) <= ERRORS[-1]
                or r["iterations"] < r["max_iter"]
                or spent >= cap
            )
            if spent >= cap and not done:
                out.status = "over cap"
            try:
                proc.stdin.write("stop\n" if done else "next\n")
                proc.stdin.flush()
            except BrokenPipeError:
                break
            if done:
                if spent >= cap and rel_error(P, row_pref.get(row.key, math.inf)) > ERRORS[-1]:
                    out.status = "over cap"
                break
    else:
        out.status = (
            "error: Spark did not load the data (see stderr)"
            if line != "TIMEOUT"
            else "over cap (loading)"
        )
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    poller.stop()
    err.close()
    out.peak = f"{fmt_bytes(poller.tree)} (JVM + python)"
    return out, load


# ------------------------------------------------------------------------------ grids


def write_grid(path, X, y, blocks, row_chunk):
    from dask_scd.grid import to_grid

    return to_grid(X, y, path, row_chunk=row_chunk, blocks=blocks, overwrite=True)


def _piece(i, rows, seed, truth):
    """Rows of piece i of the 3x grid: make_onehot's design, labels from ONE planted model
    shared by all pieces (make_onehot's own would differ per piece)."""
    X, _, _ = make_data(rows, seed=[seed, i])
    score = X @ truth / np.sqrt(n_fields()) - 0.5
    rng = np.random.default_rng([seed, i, 1])
    y = np.where(rng.random(rows) < 1.0 / (1.0 + np.exp(-score)), 1.0, -1.0)
    return X, y


def piece_plan(n, row_chunk, seed=3):
    """The planted model and the (index, rows) of every piece of an n-row grid written
    by :func:`write_grid_pieces`: :func:`_piece` gives the same rows again from them."""
    truth = np.random.default_rng(seed).normal(size=int(sum(cardinalities())))
    return truth, [(i, min(row_chunk, n - s)) for i, s in enumerate(range(0, n, row_chunk))]


def write_grid_pieces(path, n, row_chunk, seed=3):
    """A grid written without ever holding X whole: a dask array of per-row-chunk delayed
    scipy.sparse pieces, which to_grid reads one row chunk at a time."""
    import dask
    import dask.array as da

    from dask_scd.grid import to_grid

    sizes = cardinalities()
    p = int(sum(sizes))
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    blocks = [np.arange(offsets[k], offsets[k + 1]) for k in range(len(sizes))]
    truth, plan = piece_plan(n, row_chunk, seed)
    xs, ys = [], []
    for i, rows in plan:
        part = dask.delayed(_piece, nout=2, pure=True)(i, rows, seed, truth)
        xs.append(
            da.from_delayed(
                part[0],
                shape=(rows, p),
                dtype=np.float64,
                meta=sp.csr_matrix((0, 0), dtype=np.float64),
            )
        )
        ys.append(da.from_delayed(part[1], shape=(rows,), dtype=np.float64))
    X, y = da.concatenate(xs, axis=0), da.concatenate(ys, axis=0)
    with dask.config.set(scheduler="synchronous"):
        return to_grid(X, y, path, row_chunk=row_chunk, blocks=blocks, overwrite=True)


# Rows per row chunk of the out-of-core grid: a worker's tasks hold a few vectors of a row
# chunk (margins, derivatives, a cell) at once; at 1.07M rows (8.6M / 8) those pushed a
# 448 MiB worker past its pause threshold again and again (measured: it stalled).
OOC_ROW_CHUNK = 262_144


def ooc_row_chunk(n: int) -> int:
    """Rows per row chunk (and per piece) of an n-row grid written by ``--_write``: an
    eighth of the rows, at most :data:`OOC_ROW_CHUNK`."""
    return min(n // 8, OOC_ROW_CHUNK)


def _write_main(args):
    t = time.perf_counter()
    g = write_grid_pieces(args._write, args._rows, ooc_row_chunk(args._rows))
    print(
        "RESULT",
        json.dumps(
            {
                "seconds": time.perf_counter() - t,
                "nnz": int(g.nnz),
                "shape": list(g.shape),
                "peak_rss": vm_hwm(),
                "disk": _du(args._write),
            }
        ),
        flush=True,
    )


def _du(path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, f))
    return total


def cluster(memory_limit="4GiB", local_directory=None):
    from distributed import LocalCluster

    kw = {"local_directory": str(local_directory)} if local_directory else {}
    return LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        memory_limit=memory_limit,
        dashboard_address=None,
        **kw,
    )


# The engines run on the grid: CoCoA (K = the 2 workers, adaptive aggregation, split by
# feature: its parts are column blocks) against the block engines.
GRID_SOLVERS = ("auto", "block_scd", "block_newton", "cocoa")


def run_grid(solver, grid, row, alpha, cap, client, nnz) -> Outcome:
    """Ours on the grid through the cluster; block engines stopped by a callback at cap."""
    kw = {"client": client}
    if solver != "cocoa" and (solver != "auto" or grid.nnz * 12 > 256 * 2**20):
        start = time.perf_counter()
        # auto below in_memory_limit fits on the client, in memory: no callback there
        kw["callback"] = lambda info: time.perf_counter() - start > cap
    out = run_ours(
        "ours-grid",
        f"ours grid {solver}",
        grid,
        None,
        row,
        alpha,
        cap,
        nnz,
        workers=2,
        solver=solver,
        **kw,
    )
    if solver == "block_newton" and out.status.startswith("error"):
        out.status = "refused: p > 2048"
        out.note = out.note or "block_newton refuses more than 2048 features"
    if solver == "auto" and out.solver and out.solver not in ("block_scd", "block_newton"):
        out.workers = 1  # below in_memory_limit: X read onto the client, fitted in memory
        out.note = "fitted in memory on the client (grid below in_memory_limit); " + out.note
    return out


def _ooc_main(args):
    """In a fresh process: a LocalCluster of 2 workers with the given memory_limit, a few
    block_scd epochs on the grid, peak RSS of every worker. Prints one RESULT line."""
    _quiet()
    from distributed import Client

    import dask_scd

    grid = dask_scd.open_grid(args._ooc)
    n = grid.shape[0]
    # --_probe (bench_ooc_cgroup): time and bytes read at every epoch, θ and b saved
    probe = _cgroup.EpochProbe(args._ooc) if args._probe else None
    poller = Poller()
    poller.start()
    with cluster(args._memory, Path(args._ooc).parent / "scratch") as c, Client(c) as client:
        t0 = time.perf_counter()
        if probe is not None:
            probe({"epoch": -1})
        r = dask_scd.fit(
            grid,
            loss="logistic",
            penalty="l2",
            alpha=1.0 / n,
            tol=args._tol,
            max_iter=args._epochs,
            solver="block_scd",
            client=client,
            random_state=0,
            **({} if probe is None else {"callback": probe}),
        )
        wall = time.perf_counter() - t0
        poller.stop()
        hwm = client.run(vm_hwm)
        cache = client.run(_cache_stats)
    if probe is not None:
        bench_ooc_cgroup.save_fit(args._probe, r)
    print(
        "RESULT",
        json.dumps(
            {
                "wall": wall,
                "seconds": r.history_.seconds,
                "epochs": int(r.n_iter_),
                "gap": r.history_.relative_gap,
                "primal": r.history_.primal,
                "iteration": r.history_.iteration,
                "worker_peaks": list(poller.workers.values()),
                "vm_hwm": list(hwm.values()),
                "client_peak": poller.own,
                "cache": list(cache.values()),
                "probe": None if probe is None else probe.samples,
            }
        ),
        flush=True,
    )


def _cache_stats():
    from dask_scd.data.cache import CACHE

    counts = CACHE.counts
    return [
        int(CACHE.nbytes),
        int(CACHE.max_bytes or 0),
        int(counts["reads"]),
        int(counts.get("spill_hits", 0)),
        int(counts.get("spill_bytes", 0)),
    ]


def _cache_cell(held, bound, reads, spill_hits=0, spill_bytes=0) -> str:
    """A worker's :func:`_cache_stats` as the out-of-core table gives them."""
    text = f"{fmt_bytes(held)} of {fmt_bytes(bound)}, {reads:,} reads"
    if spill_hits:
        text += f", {spill_hits:,} from the spill file ({fmt_bytes(spill_bytes)})"
    return text


def _parse_bytes(text) -> int:
    from dask.utils import parse_bytes

    return int(parse_bytes(str(text)))


def run_ooc(path, memory, epochs, timeout) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--_ooc",
        str(path),
        "--_memory",
        str(memory),
        "--_epochs",
        str(epochs),
    ]
    err = open(Path(path).parent / f"ooc-{memory}.stderr", "w")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True
    )
    try:
        stdout, _ = proc.communicate(timeout=timeout)
        outcome = "finished" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        outcome = f"over cap ({timeout:.0f} s)"
    err.close()
    res = [
        json.loads(line.split(" ", 1)[1])
        for line in (stdout or "").splitlines()
        if line.startswith("RESULT")
    ]
    return {"outcome": outcome, "result": res[-1] if res else None}


def _quiet():
    warnings.filterwarnings("ignore")
    for name in (
        "distributed",
        "distributed.worker",
        "distributed.nanny",
        "distributed.scheduler",
        "distributed.core",
        "distributed.utils_perf",
        "py4j",
        "tornado",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)


# ------------------------------------------------------------------------ the tables


@dataclass
class RowResult:
    row: Row
    alpha: float
    outcomes: list
    p_star: float = math.nan
    nnz_star: int = 0
    spark_load: dict = field(default_factory=dict)
    spark_check: str = ""


def nnz_rate(o: Outcome, nnz) -> str:
    if o.passes is None or not o.seconds or o.status.startswith(("error", "n/a", "refused")):
        return "—"
    secs = o.points[-1][0] if o.column in ("ours-mem", "ours-grid") and o.points else o.seconds
    if not secs:
        return "—"
    return f"{nnz * o.passes / secs / o.workers / 1e6:.3g} M"


def row_table(res: RowResult, nnz) -> str:
    head = [
        "method",
        "time to 1e-4",
        "time to 1e-6",
        "iterations",
        "time / iteration",
        "nnz/s/worker (passes)",
        "peak memory",
        "status",
        "notes",
    ]
    lines = []
    for o in res.outcomes:
        cells = []
        for e in ERRORS:
            h = o.hit(res.p_star, e)
            if h is not None:
                cells.append(f"{fmt_s(h[0])} ({h[1]} it)" if h[1] is not None else fmt_s(h[0]))
            elif o.status.startswith(("n/a", "error", "refused")):
                cells.append("—")
            else:
                best = rel_error(o.best(), res.p_star)
                cells.append(
                    f"not reached (best {best:.1e})" if math.isfinite(best) else "not reached"
                )
        passes = f" ({o.passes:g})" if o.passes is not None else ""
        lines.append(
            [
                o.name + (f" → {o.solver}" if o.solver and o.solver not in o.name else ""),
                *cells,
                o.iterations if o.iterations is not None else "—",
                fmt_s(o.per_iteration),
                nnz_rate(o, nnz) + passes if nnz_rate(o, nnz) != "—" else "—",
                o.peak,
                o.status or "ok",
                o.note,
            ]
        )
    return md_table(head, lines)


def grid_ratio_table(results) -> str:
    head = [
        "row",
        "engine (grid)",
        "time / iteration, grid",
        "in-memory engine",
        "time / iteration, in memory",
        "ratio grid / in memory",
    ]
    # A grid engine against the same engine in memory, or against in-memory auto where
    # auto ran that engine and the engine itself did not run in memory.
    pairs = (
        ("block_scd", "block_scd"),
        ("block_scd", "auto"),
        ("auto", "auto"),
        ("block_newton", "newton"),
    )
    lines = []
    for res in results:
        by = {o.name: o for o in res.outcomes}
        for g, m in pairs:
            og, om = by.get(f"ours grid {g}"), by.get(f"ours {m}")
            if og is None or om is None:
                continue
            if m == "auto" != g and (f"ours {g}" in by or om.solver != g):
                continue
            ratio = (
                f"{og.per_iteration / om.per_iteration:.2f}"
                if og.per_iteration and om.per_iteration
                else "—"
            )
            lines.append(
                [
                    res.row.key,
                    f"{g}" + (f" → {og.solver}" if og.solver else ""),
                    fmt_s(og.per_iteration) if og.per_iteration else og.status or "—",
                    f"{m}" + (f" → {om.solver}" if om.solver else ""),
                    fmt_s(om.per_iteration),
                    ratio,
                ]
            )
    return md_table(head, lines)


def header(args, sizes, elapsed, n, p, nnz, commit) -> str:
    import dask
    import distributed
    import psutil
    import sklearn
    import zarr
    from _machine import cpu_model

    vers = [
        f"numpy {np.__version__}",
        f"scipy {__import__('scipy').__version__}",
        f"scikit-learn {sklearn.__version__}",
        f"dask {dask.__version__}",
        f"distributed {distributed.__version__}",
        f"zarr {zarr.__version__}",
    ]
    for mod, label in (
        ("pyspark", "pyspark"),
        ("dask_ml", "dask-ml"),
        ("glum", "glum"),
        ("snapml", "snapml"),
    ):
        m = _optional(mod)
        vers.append(
            f"{label} {getattr(m, '__version__', '?')}"
            if not isinstance(m, str)
            else f"{label} not installed"
        )
    java = ""
    with contextlib.suppress(Exception):
        java = subprocess.run(
            ["java", "-version"], capture_output=True, text=True
        ).stderr.splitlines()[0]
    cmd = " ".join(
        shlex.quote(a)
        for a in [os.path.relpath(sys.executable), "benchmarks/bench_scale.py", *args.argv]
    )
    load = os.getloadavg()
    return (
        f"## {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} — {cpu_model()}, "
        f"{os.cpu_count()} cores, {fmt_bytes(psutil.virtual_memory().total)} RAM\n\n"
        f"Command: `{cmd}` ({'quick' if args.quick else 'full'} size, {n:,} rows x {p:,} "
        f"features, {nnz:,} non-zeros; cap {sizes.cap:g} s per run; run took "
        f"{elapsed / 60:.1f} min; load average at the end {load[0]:.2f} / {load[1]:.2f} / "
        f"{load[2]:.2f}); library at {commit}.\n"
        f"Versions: {', '.join(vers)}; {java}.\n\n"
        f"Data: {data_description()} "
        "(Zipf values, one non-zero per field and row). P* = the smallest objective any run "
        f"of the row reached: our in-memory fits run at tol={OUR_TOL:g} (certified "
        "relative gap) and their histories' objectives count, as do every peer's solutions "
        "(objective recomputed by us at the coefficients they return). Time to error e = "
        "the first iterate (ours: certified iteration of the history, times from the fit "
        "call, setup included) or run (peers: each run of a tolerance / maxIter ladder from "
        "scratch, fit call alone) with (P − P*)/|P*| ≤ e. 'over cap' = stopped at the "
        "per-run cap (ours: at the first certified iteration past it); the times before it "
        "still count. nnz/s/worker = nnz(X) x passes over X / seconds / workers (passes: "
        "epochs for CD, the Newton engines' counted passes, L-BFGS iterations for Spark "
        "and the peers, a lower bound). Peak memory: '+' = what the run added to its "
        "process (RSS polled / VmHWM in forked runs); workers: peak RSS per worker "
        "process; Spark: JVM + its python driver.\n"
    )


def library_commit() -> str:
    root = HERE.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "dask_scd"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return f"commit {head}" + (" + uncommitted changes to dask_scd/" if dirty.strip() else "")


# ------------------------------------------------------------------------------ main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"{QUICK.n:,} rows, {QUICK.cap:g} s cap")
    p.add_argument(
        "--only", default=None, help="comma-separated row keys: " + ", ".join(r.key for r in ROWS)
    )
    p.add_argument("--skip", default="", help="comma-separated columns: " + ", ".join(COLUMNS))
    p.add_argument("--rows", type=int, default=None, help="rows of the data (n)")
    p.add_argument(
        "--data",
        choices=sorted(DATASETS),
        default="criteo",
        help="the generated data set: criteo (26 fields, Zipf exponent 1) or heavy (39 "
        "fields, exponent 1.2) (default: %(default)s)",
    )
    p.add_argument("--cap", type=float, default=None, help="seconds per run")
    p.add_argument(
        "--grid-solvers",
        default=",".join(GRID_SOLVERS),
        help="comma-separated engines run on the grid (default: %(default)s)",
    )
    p.add_argument(
        "--mem-solvers",
        default=",".join(MEM_SOLVERS),
        help="comma-separated engines run in memory (default: %(default)s)",
    )
    p.add_argument("--no-save", action="store_true", help="print only")
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--workdir", type=Path, default=DATA)
    p.add_argument(
        "--ooc-rows",
        type=int,
        default=None,
        help="rows of the out-of-core grid (default 3x --rows)",
    )
    p.add_argument(
        "--ooc-memory",
        default=None,
        help="memory_limit per worker of the limited run (default: stored / 3 / 2, "
        "at least the floor a worker needs)",
    )
    p.add_argument(
        "--cgroup-memory",
        default=None,
        help="run only the out-of-core fit inside a memory cgroup of this limit (page cache "
        "counted; root; see benchmarks/bench_ooc_cgroup.py), on a grid of --ooc-rows rows",
    )
    p.add_argument(
        "--cgroup-epochs", type=int, default=3, help="epochs of the cgroup runs (%(default)s)"
    )
    p.add_argument(
        "--cgroup-warm",
        action="store_true",
        help="with --cgroup-memory: also the limited workers without the cgroup (page cache warm)",
    )
    p.add_argument(
        "--beyond-ram",
        type=int,
        default=None,
        metavar="ROWS",
        help="run only the larger-than-RAM fit: a grid of ROWS rows written piece by piece, "
        "fitted to --beyond-tol, against Vowpal Wabbit (benchmarks/bench_beyond_ram.py)",
    )
    p.add_argument(
        "--beyond-memory",
        default="7GiB",
        help="memory_limit per worker of the larger-than-RAM fit (%(default)s)",
    )
    p.add_argument("--beyond-tol", type=float, default=1e-6, help="its certified tol (%(default)s)")
    p.add_argument(
        "--vw-passes",
        type=int,
        default=8,
        help="passes of Vowpal Wabbit's BFGS there; 0 skips it (%(default)s)",
    )
    p.add_argument(
        "--epoch-rates",
        type=int,
        default=None,
        metavar="ROWS",
        help="run only the in-memory engines' epoch on one thread at ROWS rows of --data "
        "(benchmarks/bench_epoch_rates.py): what the grid's epoch is compared with",
    )
    p.add_argument("--_spark", dest="_spark", help=argparse.SUPPRESS)
    p.add_argument("--_probe", dest="_probe", help=argparse.SUPPRESS)
    p.add_argument("--_write", dest="_write", help=argparse.SUPPRESS)
    p.add_argument("--_rows", dest="_rows", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_ooc", dest="_ooc", help=argparse.SUPPRESS)
    p.add_argument("--_memory", dest="_memory", help=argparse.SUPPRESS)
    p.add_argument("--_epochs", dest="_epochs", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_tol", dest="_tol", type=float, default=1e-12, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def select_rows(only):
    if not only:
        return list(ROWS)
    keys = [k.strip() for k in only.split(",") if k.strip()]
    unknown = sorted(set(keys) - {r.key for r in ROWS})
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; known: {[r.key for r in ROWS]}")
    return [r for r in ROWS if r.key in keys]


def main(argv=None):
    args = parse_args(argv)
    global DATASET
    DATASET = args.data
    if args._spark:
        return _spark_main(args)
    if args._write:
        return _write_main(args)
    if args._ooc:
        return _ooc_main(args)
    if args.cgroup_memory:
        return bench_ooc_cgroup.main_cgroup(sys.modules[__name__], args)
    if args.beyond_ram:
        return bench_beyond_ram.main_beyond(sys.modules[__name__], args)
    if args.epoch_rates:
        return bench_epoch_rates.main_rates(sys.modules[__name__], args)
    _quiet()
    from threadpoolctl import threadpool_limits

    limits = threadpool_limits(limits=1)  # noqa: F841
    sizes = QUICK if args.quick else FULL
    if args.rows or args.cap:
        from dataclasses import replace

        sizes = replace(
            sizes,
            n=args.rows or sizes.n,
            cap=args.cap or sizes.cap,
            ooc_rows=3 * (args.rows or sizes.n),
        )
    if args.ooc_rows:
        from dataclasses import replace

        sizes = replace(sizes, ooc_rows=args.ooc_rows)
    rows = select_rows(args.only)
    grid_solvers = tuple(g.strip() for g in args.grid_solvers.split(",") if g.strip())
    if not set(grid_solvers) <= set(GRID_SOLVERS):
        raise SystemExit(
            f"unknown grid engines {sorted(set(grid_solvers) - set(GRID_SOLVERS))}; "
            f"known: {GRID_SOLVERS}"
        )
    mem_solvers = tuple(g.strip() for g in args.mem_solvers.split(",") if g.strip())
    if not set(mem_solvers) <= set(MEM_SOLVERS):
        raise SystemExit(
            f"unknown in-memory engines {sorted(set(mem_solvers) - set(MEM_SOLVERS))}; "
            f"known: {MEM_SOLVERS}"
        )
    skip = {c.strip() for c in args.skip.split(",") if c.strip()}
    unknown = skip - set(COLUMNS)
    if unknown:
        raise SystemExit(f"unknown columns {sorted(unknown)}; known: {COLUMNS}")
    workdir = args.workdir / (f"n{sizes.n}" if DATASET == "criteo" else f"{DATASET}-n{sizes.n}")
    workdir.mkdir(parents=True, exist_ok=True)
    commit = library_commit()
    started = time.perf_counter()

    t = time.perf_counter()
    X, y, blocks = make_data(sizes.n)
    X.sort_indices()
    n, p = X.shape
    nnz = int(X.nnz)
    log(f"data {n:,} x {p:,}, {nnz:,} non-zeros: {time.perf_counter() - t:.1f} s")
    Xc = X.tocsc()
    Xc.sort_indices()
    layouts = {"rows": X, "columns": Xc, "dask": X}
    warm_up(X, y)

    results = []
    for row in rows:
        alpha = row.alpha(Xc, y)
        log(f"== {row.key}: alpha = {alpha:.4g} [{time.perf_counter() - started:.0f} s]")
        res = RowResult(row, alpha, [])
        if "ours-mem" not in skip:
            for solver in in_memory_engines(row, mem_solvers):
                o = run_ours_forked(
                    f"ours {solver}",
                    Xc if solver == "scd" else X,
                    y,
                    row,
                    alpha,
                    sizes.cap,
                    nnz,
                    solver=solver,
                )
                res.outcomes.append(o)
                log(
                    f"  {o.name} → {o.solver}: {o.status or 'ok'}, {o.iterations} it, "
                    f"best P {o.best():.12g}, {fmt_s(o.seconds)}"
                )
        row_pref[row.key] = min((o.best() for o in res.outcomes), default=math.inf)
        for peer in peer_methods(row, alpha, n, p, sizes):
            if peer.column in skip:
                continue
            o = run_peer(peer, layouts, y, row, alpha, sizes.cap)
            res.outcomes.append(o)
            log(f"  {o.name}: {o.status or 'ok'}, best P {o.best():.12g}")
        results.append(res)

    grid_info = {}
    if "ours-grid" not in skip:
        from distributed import Client

        import dask_scd

        gpath = workdir / "grid.zarr"
        t = time.perf_counter()
        # to_grid's default blocks, as a user writes it: the pure blocks coloured on all
        # rows (the in-memory engine's too); the 26 fields as blocks take ~1.3x the epochs.
        grid = write_grid(gpath, X, y, None, max(n // 8, 1))
        grid_info = {
            "seconds": time.perf_counter() - t,
            "disk": _du(gpath),
            "blocks": grid.n_blocks,
        }
        grid = dask_scd.open_grid(gpath)
        log(f"grid written in {grid_info['seconds']:.1f} s")
        with cluster(local_directory=workdir / "scratch") as c, Client(c) as client:
            # Warm up the workers (imports, numba) on one epoch of each loss.
            for loss in ("logistic", "squared"):
                with contextlib.suppress(Exception), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    dask_scd.fit(
                        grid,
                        loss=loss,
                        alpha=1e-3,
                        tol=1e-12,
                        max_iter=1,
                        solver="block_scd",
                        client=client,
                    )
            for res in results:
                log(f"== grid, {res.row.key}")
                for solver in grid_solvers:
                    o = run_grid(solver, grid, res.row, res.alpha, sizes.cap, client, nnz)
                    res.outcomes.append(o)
                    log(
                        f"  {o.name} → {o.solver}: {o.status or 'ok'}, {o.iterations} it, "
                        f"best P {o.best():.12g}"
                    )
        shutil.rmtree(gpath, ignore_errors=True)

    # Spark after the grid: grid fits that followed the Spark runs in one process took up
    # to 1.7x their time alone (results/scale.md, 2026-11-29 18:11 and 18:28).
    if "spark" not in skip:
        libsvm = workdir / "data.libsvm"
        if not libsvm.exists():
            t = time.perf_counter()
            write_libsvm(libsvm, X, y)
            log(
                f"libsvm written in {time.perf_counter() - t:.1f} s "
                f"({fmt_bytes(libsvm.stat().st_size)})"
            )
        for res in results:
            log(f"== Spark, {res.row.key}")
            o, load = run_spark(res.row, res.alpha, X, y, libsvm, sizes.cap, workdir)
            res.outcomes.append(o)
            res.spark_load = load
            log(f"  {o.name}: {o.status or 'ok'}, best P {o.best():.12g}; {o.note}")

    ooc_text = ""
    if "ooc" not in skip:
        ooc_text = section_ooc(sizes, workdir, results, nnz, args.ooc_memory)

    for res in results:
        every = [o.best() for o in res.outcomes]
        res.p_star = min(every, default=math.nan)
    elapsed = time.perf_counter() - started
    parts = [header(args, sizes, elapsed, n, p, nnz, commit)]
    for res in results:
        load = res.spark_load
        spark_load = (
            f" Spark {load.get('version', '?')}: libsvm read, repartitioned (4), "
            f"cached and counted in {fmt_s(load['seconds'])} (not in the times)."
            if load
            else ""
        )
        nz = _support(res)
        parts.append(
            f"### {res.row.key}: {res.row.describe()} = {res.alpha:.4g}\n\n"
            f"P* = {res.p_star:.12g}; non-zero coefficients at the best run: {nz}.{spark_load}"
            "\n\n" + row_table(res, nnz) + "\n"
        )
    if "ours-grid" not in skip:
        parts.append(
            "### Grid vs in memory, time per iteration\n\n"
            f"Grid: {n // 8:,}-row chunks x {grid_info.get('blocks')} blocks "
            "(to_grid's default: pure blocks coloured on all rows), written in "
            f"{fmt_s(grid_info.get('seconds'))}, {fmt_bytes(grid_info.get('disk', 0))}"
            " on disk; LocalCluster 2 workers x 1 thread, 4 GiB each. Time per "
            "iteration = history seconds / iterations.\n\n" + grid_ratio_table(results) + "\n"
        )
    if ooc_text:
        parts.append(ooc_text)
    text = "\n".join(parts)
    from _machine import print_and_append

    print_and_append(text, args.output, save=not args.no_save)
    shutil.rmtree(workdir / "scratch", ignore_errors=True)


def _support(res) -> str:
    """Non-zero coefficients of the run closest to P* that recorded them, of p."""
    known = [o for o in res.outcomes if o.support is not None]
    if not known:
        return "—"
    best = min(known, key=lambda o: o.best())
    p = sum(cardinalities())
    return f"{best.support:,} of {p:,} ({best.support / p:.1%}, {best.name})"


def section_ooc(sizes, workdir, results, nnz_incore, memory=None) -> str:
    """The 3x grid written piece by piece, fitted by block_scd with memory_limit per worker
    = a third of the grid's size / 2, and with 4 GiB workers (in core), same epochs."""
    path = workdir / "ooc.zarr"
    log(f"== out of core: writing {sizes.ooc_rows:,} rows piece by piece")
    cmd = [sys.executable, __file__, "--_write", str(path), "--_rows", str(sizes.ooc_rows)]
    cmd += ["--data", DATASET]
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT")]
    if not lines:
        return f"### Out of core\n\nwriting the grid failed: {out.stderr[-400:]}\n"
    w = json.loads(lines[-1].split(" ", 1)[1])
    stored = w["nnz"] * 12
    limit = stored // 3 // 2
    floor = max(limit, OOC_FLOOR) if memory is None else _parse_bytes(memory)
    rows = []
    incore_epoch = None
    for res in results:
        if res.row.key == "logistic-l2":
            for o in res.outcomes:
                if o.name == "ours grid block_scd" and o.per_iteration:
                    incore_epoch = o.per_iteration
    # In core: every worker's cell cache (half of its pause threshold, 80 % of the limit,
    # less what it holds) takes its half of the grid.
    incore = max(4 * 2**30, int((stored + OOC_FLOOR) / 0.8) + 2**28)
    runs = [("limited", floor), ("in core", incore)]
    per = {}
    for label, memory in runs:
        log(f"  ooc fit: {label}, memory_limit {fmt_bytes(memory)}, {sizes.ooc_epochs} epochs")
        r = run_ooc(path, memory, sizes.ooc_epochs, timeout=sizes.cap * (sizes.ooc_epochs + 2))
        res = r["result"]
        shutil.rmtree(workdir / "scratch", ignore_errors=True)
        if res:
            per_epoch = res["seconds"][-1] / max(res["epochs"], 1)
            per[label] = per_epoch
            peaks = " / ".join(fmt_bytes(v) for v in sorted(res["worker_peaks"], reverse=True)[:4])
            hwm = " / ".join(fmt_bytes(v) for v in res["vm_hwm"])
            cache = " / ".join(_cache_cell(*worker) for worker in res["cache"])
            rows.append(
                [
                    label,
                    fmt_bytes(memory),
                    f"{stored / (2 * memory):.2f}x",
                    r["outcome"],
                    res["epochs"],
                    fmt_s(res["wall"]),
                    fmt_s(per_epoch),
                    peaks,
                    hwm,
                    cache,
                    fmt_bytes(res["client_peak"]),
                    " → ".join(f"{g:.2e}" for g in res["gap"]),
                ]
            )
        else:
            rows.append(
                [
                    label,
                    fmt_bytes(memory),
                    f"{stored / (2 * memory):.2f}x",
                    r["outcome"],
                    "—",
                    "—",
                    "—",
                    "—",
                    "—",
                    "—",
                    "—",
                    "—",
                ]
            )
    shutil.rmtree(path, ignore_errors=True)
    ratio = (
        f"{per['limited'] / per['in core']:.2f}" if "limited" in per and "in core" in per else "—"
    )
    scaled = ""
    if incore_epoch and "limited" in per:
        per_nnz = per["limited"] / w["nnz"] / (incore_epoch / nnz_incore)
        scaled = (
            f" The 1x grid in core (block_scd, logistic-l2 row above): "
            f"{fmt_s(incore_epoch)} per epoch for {nnz_incore:,} non-zeros; per "
            f"non-zero the out-of-core pass costs {per_nnz:.2f}x that."
        )
    return (
        "### Out of core (3x grid)\n\n"
        f"Grid: {w['shape'][0]:,} rows, {w['nnz']:,} non-zeros = {fmt_bytes(stored)} stored "
        f"uncompressed (nnz x 12 B, as the engine counts), {fmt_bytes(w['disk'])} on disk; "
        f"written in {fmt_s(w['seconds'])} by a separate process from per-row-chunk delayed "
        f"make_onehot pieces (peak RSS {fmt_bytes(w['peak_rss'])}: never whole in memory), "
        f"row chunks of {ooc_row_chunk(w['shape'][0]):,} rows. "
        + (
            f"memory_limit per worker {fmt_bytes(floor)} (--ooc-memory); stored / 3 / 2 would "
            f"be {fmt_bytes(limit)}"
            if memory is not None
            else f"memory_limit per worker = stored / 3 / 2 = {fmt_bytes(limit)}"
            + (
                f", raised to the floor {fmt_bytes(OOC_FLOOR)} (a worker process holding the "
                "engine's state for 611k features peaks at ~310-380 MiB even when the grid is "
                "tiny; below it a worker pauses and the fit stalls)"
                if floor > limit
                else ""
            )
        )
        + "; the engine's cell cache is bounded by the library (½ of pause threshold − "
        "resident), so out of core the cells cannot all stay cached: 'cell cache' gives what "
        "it held at the end and how many cells each worker read from the store, and how "
        "many it read back decoded from its spill file (dask_scd.data.spill: the cells its "
        "cache had no room for, written once in the form the passes read; DASK_SCD_SPILL=0 "
        "turns it off)"
        + f". block_scd, logistic L2 alpha = 1/n, {sizes.ooc_epochs} epochs, in a fresh "
        f"process each; the same fit with {fmt_bytes(incore)} workers (the grid fits in their "
        "cell caches) gives the in-core time per pass. Worker peak RSS polled every 0.2 s; VmHWM read at "
        "the end.\n\n"
        + md_table(
            [
                "run",
                "memory_limit / worker",
                "stored / total limit",
                "outcome",
                "epochs",
                "fit wall",
                "time / pass",
                "worker peak RSS (poll)",
                "worker VmHWM",
                "cell cache (end), cells read",
                "client peak RSS",
                "relative gap",
            ],
            rows,
        )
        + f"\n\nTime per pass out of core / in core: **{ratio}**.{scaled}\n"
    )


if __name__ == "__main__":
    main()
