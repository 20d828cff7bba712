"""The GPU against one CPU thread: TPA-SCD epochs, and DuHL with the GPU as fast memory.

Part 1, TPA-SCD: ``dask_scd.fit(..., device="gpu")`` against ``device="cpu"`` (one thread)
for the engines with GPU kernels, primal SCD (ridge, lasso, logistic) and dual SDCA
(hinge, logistic), on dense and sparse generated data: time per epoch, epochs and time
to a certified relative duality gap of 1e-6, the speed-up, and how far the GPU model's
objective is from the CPU one's (both certified to 1e-6, so they agree to about 1e-6).

Part 2, DuHL (``fit_duhl`` with ``Options(device="gpu")``): the GPU holds 25 % of X,
chosen by DuHL's gap memory, against sequential blocks in the same 25 % (everything
streamed through) and against all of X in the GPU: time and bytes moved into device
memory to a relative gap of 1e-4.

Run ``make bench-gpu`` on a machine with an NVIDIA GPU (1M rows by default, ``--rows``).
Without a CUDA device it says so and exits; under numba's simulator
(``NUMBA_ENABLE_CUDASIM=1``) it runs at ``--tiny`` size and writes only to ``--output``.
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse
import datetime
import platform
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

import dask_scd
from dask_scd import objectives as obj
from dask_scd.data.memory import InMemory
from dask_scd.engines import registry
from dask_scd.engines.base import Options
from dask_scd.engines.local.duhl import fit_duhl
from dask_scd.engines.options import DuHLOptions
from dask_scd.kernels import device

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "gpu.md"
TOL = 1e-6
DUHL_TOL = 1e-4
TINY_ROWS = 300


@dataclass(frozen=True)
class Case:
    """One row of the TPA-SCD table: a problem for an engine with GPU kernels."""

    name: str
    solver: str
    loss: str
    penalty: str
    alpha: float


CASES = (
    Case("ridge", "scd", "squared", "l2", 1e-3),
    Case("lasso", "scd", "squared", "l1", 1e-2),
    Case("logistic L2", "scd", "logistic", "l2", 1e-3),
    Case("hinge SVM (dual)", "sdca", "hinge", "l2", 1e-3),
    Case("logistic L2 (dual)", "sdca", "logistic", "l2", 1e-3),
)
LAYOUTS = ("dense", "sparse")
DUHL_CASES = ("lasso", "hinge SVM (dual)")
RESIDENCIES = (
    ("duhl, 25 %", "duhl", 4),
    ("sequential, 25 %", "sequential", 4),
    ("all in GPU", "duhl", 1),
)


def tpa_rows() -> list[str]:
    """The names of the TPA-SCD table's rows, in order."""
    return [
        f"{c.name}, {layout}" for c in CASES for layout in LAYOUTS if registry.get(c.solver).gpu
    ]


def duhl_rows() -> list[str]:
    return [f"{name}: {label}" for name in DUHL_CASES for label, _, _ in RESIDENCIES]


# ------------------------------------------------------------------------------- data


def make_data(n: int, layout: str, tiny: bool, seed: int = 0):
    """X (dense Gaussian, or sparse with ~10 non-zeros per row), a response with a sparse
    true support, and ±1 labels from a planted model."""
    rng = np.random.default_rng(seed)
    if layout == "dense":
        p = 8 if tiny else 100
        X = rng.normal(size=(n, p))
    else:
        p = 40 if tiny else 10_000
        X = sp.random(
            n,
            p,
            density=(0.2 if tiny else 1e-3),
            format="csr",
            random_state=rng,
            data_rvs=rng.standard_normal,
        )
    beta = np.zeros(p)
    support = rng.choice(p, max(2, p // 20), replace=False)
    beta[support] = rng.normal(size=len(support))
    signal = np.asarray(X @ beta).ravel()
    y_reg = signal + 0.5 * rng.normal(size=n)
    y_cls = np.where(X @ rng.normal(size=p) + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    # Each engine's layout, built once outside the timings: CSC for SCD, CSR for SDCA.
    return {"scd": X if layout == "dense" else X.tocsc(), "sdca": X}, y_reg, y_cls


# ---------------------------------------------------------------------------- TPA-SCD


def fit_once(case: Case, X, y, where: str, max_iter: int):
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a capped run warns; the table says "not reached"
        result = dask_scd.fit(
            X,
            y,
            loss=case.loss,
            penalty=case.penalty,
            alpha=case.alpha,
            solver=case.solver,
            device=where,
            tol=TOL,
            max_iter=max_iter,
            random_state=0,
        )
    return result, time.perf_counter() - start


def _wanted(row: str, match: str | None) -> bool:
    return match is None or match in row


def tpa_table(
    n: int, tiny: bool, max_iter: int, warm_up: bool = True, match: str | None = None
) -> tuple[list[str], list[dict]]:
    columns = [
        "problem",
        "n x p",
        "CPU s/epoch",
        "GPU s/epoch",
        "CPU epochs, s to 1e-6",
        "GPU epochs, s to 1e-6",
        "speed-up",
        "\\|P_gpu − P_cpu\\| / \\|P_cpu\\|",
        "bound (larger gap)",
    ]
    lines, records = _head(columns), []
    for layout in LAYOUTS:
        Xs, y_reg, y_cls = make_data(n, layout, tiny)
        for case in CASES:
            if not registry.get(case.solver).gpu or not _wanted(f"{case.name}, {layout}", match):
                continue
            X = Xs[case.solver]
            y = y_reg if case.loss == "squared" else y_cls
            if warm_up:  # compile the kernels outside the timings
                for where in ("cpu", "gpu"):
                    fit_once(case, X[:400], y[:400], where, 2)
            runs = {where: fit_once(case, X, y, where, max_iter) for where in ("cpu", "gpu")}
            record = _tpa_record(f"{case.name}, {layout}", X.shape, runs)
            records.append(record)
            lines.append(_tpa_line(record))
            print(lines[-1], flush=True)
    return lines + [""], records


def _tpa_record(name, shape, runs) -> dict:
    (cpu, cpu_s), (gpu, gpu_s) = runs["cpu"], runs["gpu"]
    # Both objectives lie in [P*, P* + gap·|P|]: they agree to the larger certified gap.
    return {
        "row": name,
        "shape": shape,
        "cpu": cpu,
        "gpu": gpu,
        "cpu_s": cpu_s,
        "gpu_s": gpu_s,
        "objective_gap": abs(gpu.primal_ - cpu.primal_) / abs(cpu.primal_),
        "bound": max(cpu.dual_gap_, gpu.dual_gap_),
    }


def _reached(result, seconds) -> str:
    if result.converged_:
        return f"{result.n_iter_}, {seconds:.3g}"
    return f"not reached ({result.n_iter_} epochs, gap {result.dual_gap_:.1e})"


def _tpa_line(r) -> str:
    cpu, gpu = r["cpu"], r["gpu"]
    speed_up = r["cpu_s"] / r["gpu_s"]
    both = cpu.converged_ and gpu.converged_
    return (
        f"| {r['row']} | {r['shape'][0]} x {r['shape'][1]} "
        f"| {r['cpu_s'] / max(cpu.n_iter_, 1):.3g} | {r['gpu_s'] / max(gpu.n_iter_, 1):.3g} "
        f"| {_reached(cpu, r['cpu_s'])} | {_reached(gpu, r['gpu_s'])} "
        f"| {speed_up:.2f}x{'' if both else ' (same epochs cap)'} "
        f"| {r['objective_gap']:.1e} | {r['bound']:.1e} |"
    )


# ------------------------------------------------------------------------------ DuHL


def duhl_problem(name: str, n: int, tiny: bool):
    """(X, y, problem, chunk_size): the lasso over columns, the SVM over rows."""
    Xs, y_reg, y_cls = make_data(n, "dense", tiny, seed=1)
    X = Xs["scd"]
    if name == "lasso":
        return X, y_reg, obj.Problem("squared", 0.1, 1.0, True), 4 if not tiny else 2
    return X, y_cls, obj.Problem("hinge", 1e-2, 0.0, True), max(2, n // 256)


def duhl_table(
    n: int, tiny: bool, max_rounds: int, warm_up: bool = True, match: str | None = None
) -> tuple[list[str], list[dict]]:
    columns = [
        "problem: fast memory",
        "rounds",
        "reached 1e-4",
        "swaps",
        "bytes moved",
        "× X",
        "wall (s)",
    ]
    lines, records = _head(columns), []
    for name in DUHL_CASES:
        if not any(_wanted(f"{name}: {label}", match) for label, _, _ in RESIDENCIES):
            continue
        X, y, problem, chunk = duhl_problem(name, n, tiny)
        if warm_up:
            _duhl(X[:400], y[:400], problem, "duhl", chunk, 2, X[:400].nbytes)
        for label, residency, share in RESIDENCIES:
            if not _wanted(f"{name}: {label}", match):
                continue
            result, seconds = _duhl(X, y, problem, residency, chunk, max_rounds, X.nbytes // share)
            record = {
                "row": f"{name}: {label}",
                "result": result,
                "seconds": seconds,
                "nbytes": X.nbytes,
            }
            records.append(record)
            lines.append(_duhl_line(record))
            print(lines[-1], flush=True)
    return lines + [""], records


def _duhl(X, y, problem, residency, chunk, max_rounds, budget):
    engine = DuHLOptions(
        memory_budget=budget, residency=residency, local_epochs=2, chunk_size=chunk
    )
    options = Options(DUHL_TOL, max_rounds, np.random.default_rng(0), engine=engine, device="gpu")
    start = time.perf_counter()
    result = fit_duhl(InMemory(X, y), problem, options)
    return result, time.perf_counter() - start


def _duhl_line(r) -> str:
    result, extras = r["result"], r["result"].extras
    reached = "yes" if result.converged(DUHL_TOL) else "no"
    return (
        f"| {r['row']} | {result.n_iter} | {reached} "
        f"({result.certificate.relative_gap:.1e}) | {extras['swaps']} "
        f"| {_size(extras['bytes_moved'])} | {extras['bytes_moved'] / r['nbytes']:.2f} "
        f"| {r['seconds']:.3g} |"
    )


def _head(columns) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


# ------------------------------------------------------------------------------ main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--tiny",
        action="store_true",
        help=f"{TINY_ROWS} rows and 2 epochs (what the simulator runs)",
    )
    parser.add_argument(
        "--max-epochs",
        type=int,
        default=None,
        help="epochs cap of a TPA-SCD fit (default 500; 2 with --tiny)",
    )
    parser.add_argument(
        "--max-rounds",
        type=int,
        default=None,
        help="rounds cap of a DuHL fit (default 300; 2 with --tiny)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="markdown file to append to (default benchmarks/results/gpu.md;"
        " under the simulator nothing is written without it)",
    )
    parser.add_argument(
        "--only",
        choices=("tpa", "duhl"),
        default=None,
        help="run one part only: the TPA-SCD table or the DuHL table",
    )
    parser.add_argument(
        "--match", default=None, help="run only the rows whose name contains this text"
    )
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not device.gpu_available():
        print(
            "bench_gpu: numba.cuda finds no CUDA device (and NUMBA_ENABLE_CUDASIM is not "
            "set): nothing measured, no results written"
        )
        return 0
    simulator = _simulator()
    if simulator:
        args.tiny = True
        if args.output is None:
            args.no_save = True
    n = TINY_ROWS if args.tiny and args.rows == 1_000_000 else args.rows
    max_iter = args.max_epochs or (2 if args.tiny else 500)
    max_rounds = args.max_rounds or (2 if args.tiny else 300)
    # The simulator compiles nothing: no warm-up there.
    parts = [header(args, n, max_iter, max_rounds, simulator)]
    if args.only in (None, "tpa"):
        tpa, _ = tpa_table(n, args.tiny, max_iter, not simulator, args.match)
        parts += ["### TPA-SCD: the GPU against one CPU thread\n", *tpa]
    if args.only in (None, "duhl"):
        duhl, _ = duhl_table(n, args.tiny, max_rounds, not simulator, args.match)
        parts += ["### DuHL: the GPU as fast memory\n", *duhl]
    text = "\n".join(parts)
    from _machine import print_and_append

    print_and_append(text, args.output or RESULTS, save=not args.no_save)
    return 0


def _simulator() -> bool:
    """Under numba's CUDA simulator, whose blocks' threads are Python threads: 4 threads
    per block and a short switch interval keep a tiny run to seconds; one block per dual
    epoch makes it the CPU's epoch, so the two models agree to rounding."""
    from numba import config

    if not config.ENABLE_CUDASIM:
        return False
    from dask_scd.kernels import cuda

    cuda.MAX_THREADS = 4
    cuda.SIMULATOR_BLOCKS = 1
    sys.setswitchinterval(1e-4)
    return True


def header(args, n, max_iter, max_rounds, simulator) -> str:
    import numba
    import scipy
    from _machine import cpu_model

    root = HERE.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):  # a copy of the tree without .git
        commit = os.environ.get("DASK_SCD_COMMIT", "unknown")
    versions = [
        f"numpy {np.__version__}",
        f"scipy {scipy.__version__}",
        f"numba {numba.__version__}",
    ]
    for module in ("numba_cuda", "cupy"):
        try:
            versions.append(f"{module} {__import__(module).__version__}")
        except ImportError:
            pass
    command = "python benchmarks/bench_gpu.py " + " ".join(args.argv)
    now = datetime.datetime.now().astimezone()
    return (
        f"## {now:%Y-%m-%d %H:%M %Z} — {_gpu_name(simulator)}; CPU {cpu_model()}, "
        f"Python {platform.python_version()}, {', '.join(versions)}, commit {commit}, "
        f"load {os.getloadavg()[0]:.1f}\n\n`{command.strip()}`; {n} rows; CPU: one "
        f"thread; TPA-SCD tol {TOL:g}, at most {max_iter} epochs; DuHL tol {DUHL_TOL:g}, "
        f"at most {max_rounds} rounds, local_epochs=2. Times are the fit call's wall "
        f"time after a warm-up fit that compiles the kernels.\n"
    )


def _gpu_name(simulator: bool) -> str:
    if simulator:
        return "numba CUDA simulator (no GPU; timings meaningless)"
    from numba import cuda

    gpu = cuda.get_current_device()
    name = gpu.name.decode() if isinstance(gpu.name, bytes) else str(gpu.name)
    driver = ".".join(map(str, cuda.cudadrv.driver.driver.get_version()))
    return f"GPU {name}, CUDA driver {driver}"


if __name__ == "__main__":
    sys.exit(main())
