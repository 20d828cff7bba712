"""dask_scd in benchopt's public benchmarks, against the peers those benchmarks ship.

For each of benchmark_logreg_l2, benchmark_logreg_l1 and benchmark_lasso found under
``--checkouts`` (git clones; see benchmarks/README.md), the script

1. copies the checkout into a temporary directory (the checkout itself is never written)
   and adds our files from ``benchmarks/benchopt_dask_scd/``: ``solvers/dask_scd.py``,
   ``benchmark_utils/dask_scd_mapping.py`` and ``datasets/libsvm_files.py``;
2. runs ``benchopt run`` on the copy in this Python environment (no conda), on one thread
   (OMP / OpenBLAS / MKL / numba threads 1) pinned to one core with ``taskset`` where it
   exists, with a timeout per solver and row: the benchmark's Simulated datasets (nothing
   downloaded) and the LIBSVM files a8a and a9a.t of ``--data`` where present;
3. reads benchopt's results and, per row (benchmark x dataset parameters x objective
   parameters), takes f* = the smallest objective any solver reached and, for each
   solver, the time of its fastest run with (f − f*)/|f*| ≤ 1e-6 and ≤ 1e-9; the table
   sets ours against the fastest peer. Printed and appended to
   ``benchmarks/results/benchopt.md``.

``python benchmarks/bench_benchopt.py --checkouts DIR`` (full), ``--quick`` (a few rows,
short timeouts: a check of the harness), ``--benchmarks lasso,logreg_l1``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import (  # noqa: E402
    cpu_model,
    library_commit,
    load_average,
    print_and_append,
)

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent
OURS_DIR = HERE / "benchopt_dask_scd"
RESULTS = HERE / "results" / "benchopt.md"
SHARED_DATA = REPOSITORY.parent / "shared" / "data"
LIBSVM_FILES = ("a8a", "a9a.t")
OURS = "dask_scd"
TARGETS = (1e-6, 1e-9)
WITHIN = 1.5  # "within 1.5x" of the fastest peer
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)

# The peer solvers of each benchmark run here (benchopt's -s selections), with the module
# each needs. scikit-learn's sag, saga and sgd are left out of the L2 benchmark: their
# curves do not get near 1e-9 within a timeout. Snap ML runs on the CPU.
PEER_MODULES = {
    "sklearn": "sklearn",
    "skglm": "skglm",
    "Celer": "celer",
    "glum": "glum",
    "snapml": "snapml",
    "Lightning": "lightning",
}


@dataclass(frozen=True)
class Benchmark:
    """One of benchopt's benchmarks, as this script runs it."""

    name: str  # the checkout is benchmark_<name>
    peers: tuple[str, ...]
    quick_dataset: str
    quick_objectives: tuple[str, ...]


BENCHMARKS = {
    "logreg_l2": Benchmark(
        "logreg_l2",
        (
            "sklearn[solver=liblinear]",
            "sklearn[solver=newton-cg]",
            "sklearn[solver=newton-cholesky]",
            "sklearn[solver=lbfgs]",
            "snapml[gpu=False]",
            "Lightning",
        ),
        "Simulated[n_samples=1000,n_features=10]",
        ("L2 Logistic Regression[lmbd=1.0]",),
    ),
    "logreg_l1": Benchmark(
        "logreg_l1",
        ("sklearn[solver=liblinear]", "Celer", "skglm", "snapml[gpu=False]", "Lightning"),
        "Simulated[n_samples=500,n_features=2000]",
        ("Sparse Logistic Regression[fit_intercept=False,reg=0.1]",),
    ),
    "lasso": Benchmark(
        "lasso",
        ("sklearn", "Celer", "skglm", "glum", "snapml[gpu=False]"),
        "Simulated[n_samples=500,n_features=600,rho=0]",
        (
            "Lasso Regression[fit_intercept=False,reg=0.1]",
            "Lasso Regression[fit_intercept=True,reg=0.1]",
        ),
    ),
}

# benchopt 1.10 reads ``_used_seed`` of a dataset whose data it has cached, an attribute
# that only ``RunContextMixin.__init__`` sets; the benchmarks' datasets define their own
# ``__init__`` (the style benchopt documented before) and never call it. The launcher
# gives the attribute its initial value as a class default, then runs benchopt's CLI.
LAUNCHER = (
    "import sys\n"
    "from benchopt.utils.run_context_mixin import RunContextMixin\n"
    "RunContextMixin._used_seed = None\n"
    "from benchopt.cli import benchopt\n"
    "sys.exit(benchopt())\n"
)


def peer_module(selection: str) -> str:
    """The module a peer's benchopt selection (``"sklearn[solver=lbfgs]"``) imports."""
    return PEER_MODULES[selection.split("[")[0]]


def missing_modules(modules) -> dict[str, str]:
    """The modules among ``modules`` that do not import here, with the reason."""
    missing = {}
    for module in sorted(set(modules)):
        try:
            importlib.import_module(module)
        except Exception as error:  # a broken install fails with anything, not only ImportError
            missing[module] = f"{type(error).__name__}: {error}"
    return missing


# --------------------------------------------------------------- the results table


def relative_error(value: float, best: float) -> float:
    """(f − f*)/|f*|, the distance to the best objective of a row."""
    return (value - best) / max(abs(best), 1e-300)


def time_to(runs, best: float, target: float) -> float | None:
    """The time of the fastest run within ``target`` of ``best``, None when none is.

    Parameters
    ----------
    runs : list of dict
        One solver's runs of one row, each with ``time`` and ``objective_value``.
    best : float
        f*, the row's best objective.
    target : float
        The relative error to reach.
    """
    times = [
        run["time"]
        for run in runs
        if math.isfinite(run["objective_value"])
        and relative_error(run["objective_value"], best) <= target
    ]
    return min(times) if times else None


@dataclass
class Row:
    """One benchmark x dataset x objective: f* and each solver's time to each target."""

    benchmark: str
    dataset: str
    objective: str
    best: float
    times: dict  # solver -> {target: seconds or None}

    def fastest_peer(self, target: float):
        """(name, seconds) of the fastest peer to ``target``, or (None, None)."""
        reached = [
            (t[target], solver)
            for solver, t in self.times.items()
            if solver != OURS and t[target] is not None
        ]
        if not reached:
            return None, None
        seconds, solver = min(reached)
        return solver, seconds

    def ours(self, target: float):
        """Our seconds to ``target``, None when not reached (or not run)."""
        return self.times.get(OURS, {}).get(target)


def row_key(record) -> tuple[str, str, str]:
    return record["benchmark"], record["dataset_name"], record["objective_name"]


def table_rows(records, targets=TARGETS) -> list[Row]:
    """Group benchopt's records by row and compute f* and every solver's times.

    Parameters
    ----------
    records : list of dict
        benchopt's result rows, each with ``benchmark``, ``dataset_name``,
        ``objective_name``, ``solver_name``, ``time`` and ``objective_value``.
    targets : tuple of float
        The relative errors to time.

    Returns
    -------
    list of Row, in the order the rows first appear.
    """
    grouped: dict = {}
    for record in records:
        solvers = grouped.setdefault(row_key(record), {})
        solvers.setdefault(record["solver_name"], []).append(record)
    rows = []
    for (benchmark, dataset, objective), solvers in grouped.items():
        values = [
            r["objective_value"]
            for runs in solvers.values()
            for r in runs
            if math.isfinite(r["objective_value"])
        ]
        if not values:
            continue
        best = min(values)
        times = {
            solver: {target: time_to(runs, best, target) for target in targets}
            for solver, runs in solvers.items()
        }
        rows.append(Row(benchmark, dataset, objective, best, times))
    return rows


def tally(rows, target: float) -> tuple[int, int, int]:
    """(K, M, N): of the N rows where some solver reached ``target``, ours was the
    fastest on K and within 1.5x of the fastest peer on M."""
    fastest = within = counted = 0
    for row in rows:
        _, peer = row.fastest_peer(target)
        ours = row.ours(target)
        if peer is None and ours is None:
            continue
        counted += 1
        if ours is not None and (peer is None or ours <= peer):
            fastest += 1
        if ours is not None and (peer is None or ours <= WITHIN * peer):
            within += 1
    return fastest, within, counted


def _seconds(value) -> str:
    return "not reached" if value is None else f"{value:.3g}"


def _ratio(ours, peer) -> str:
    if ours is None:
        return "—"
    if peer is None:
        return "no peer"
    return f"{ours / peer:.2f}"


def _objective_parameters(name: str) -> str:
    match = re.search(r"\[(.*)\]", name)
    return match.group(1) if match else name


def render_table(rows, targets=TARGETS) -> str:
    """The markdown table: per row and target, the fastest peer, ours and the ratio."""
    head = ["benchmark", "dataset", "objective", "f*"]
    for target in targets:
        head += [f"fastest peer {target:g}", "s", f"ours {target:g} (s)", "ours/peer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.benchmark, row.dataset, _objective_parameters(row.objective)]
        cells.append(f"{row.best:.10g}")
        for target in targets:
            peer, seconds = row.fastest_peer(target)
            ours = row.ours(target)
            cells += [peer or "none", _seconds(seconds), _seconds(ours), _ratio(ours, seconds)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_counts(rows, targets=TARGETS) -> str:
    lines = []
    for target in targets:
        fastest, within, counted = tally(rows, target)
        lines.append(
            f"- to {target:g}: ours fastest on {fastest} of {counted} rows, within "
            f"{WITHIN:g}x of the fastest peer on {within}."
        )
    return "\n".join(lines)


# --------------------------------------------------------------- benchopt's output


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SOLVER_LINE = re.compile(r"^ {4}\|--(?P<solver>.+?): (?P<status>[a-z][a-z_ ()]*?)\s*$")
_ERROR_LINE = re.compile(r"^(?P<error>[A-Za-z_.]*(Error|Exception)\b.*)$")


def solver_statuses(log: str):
    """(dataset, objective, solver, status, last error line) of every finished solver in
    a benchopt log (its progress lines, rewritten in place, are skipped)."""
    dataset = objective = error = None
    found = []
    for raw in _ANSI.sub("", log).replace("\r", "\n").splitlines():
        line = raw.rstrip()
        if not line or "%" in line or "initialization" in line:
            continue
        match = _SOLVER_LINE.match(line)
        if match:
            status = match["status"]
            found.append((dataset, objective, match["solver"], status, error))
            error = None
        elif line.startswith("  |--"):
            objective = line[5:].strip()
        elif _ERROR_LINE.match(line):
            error = line.strip()
        elif not line.startswith(" ") and "[" in line and not line.startswith("Traceback"):
            dataset = line.strip()
    return found


def read_records(parquet: Path, benchmark: str) -> list[dict]:
    """benchopt's result file as a list of dicts tagged with the benchmark's name."""
    import pandas as pd

    frame = pd.read_parquet(parquet)
    columns = ["dataset_name", "objective_name", "solver_name", "time", "objective_value"]
    records = frame[columns].to_dict("records")
    for record in records:
        record["benchmark"] = benchmark
        record["time"] = float(record["time"])
        record["objective_value"] = float(record["objective_value"])
    return records


# --------------------------------------------------------------- running benchopt


def prepare_copy(checkout: Path, workdir: Path) -> Path:
    """A copy of ``checkout`` under ``workdir`` with our solver, mapping and dataset."""
    copy = workdir / checkout.name
    shutil.copytree(checkout, copy, ignore=shutil.ignore_patterns(".git", "outputs", "__cache__"))
    utils = copy / "benchmark_utils"
    utils.mkdir(exist_ok=True)
    (utils / "__init__.py").touch()
    shutil.copy(OURS_DIR / "mapping.py", utils / "dask_scd_mapping.py")
    shutil.copy(OURS_DIR / "solver.py", copy / "solvers" / f"{OURS}.py")
    shutil.copy(OURS_DIR / "dataset.py", copy / "datasets" / "libsvm_files.py")
    return copy


def benchopt_command(benchmark, copy, args, solvers, libsvm_files, output) -> list[str]:
    """The ``benchopt run`` command line for one benchmark copy."""
    command = [sys.executable, "-c", LAUNCHER, "run", str(copy)]
    for solver in (OURS, *solvers):
        command += ["-s", solver]
    if args.dataset:  # rows named on the command line
        datasets = list(args.dataset)
    else:
        datasets = [benchmark.quick_dataset] if args.quick else ["Simulated"]
        datasets += [f"LIBSVM-files[file={name}]" for name in libsvm_files]
    for dataset in datasets:
        command += ["-d", dataset]
    objectives = args.objective or (benchmark.quick_objectives if args.quick else ())
    for objective in objectives:
        command += ["-o", objective]
    command += ["-n", str(args.max_runs), "--timeout", f"{args.timeout:g}"]
    command += ["-r", str(args.repetitions)]
    command += ["--no-plot", "--no-display", "--output", str(output)]
    core = pinned_core()
    if core is not None:
        command = ["taskset", "-c", str(core)] + command
    return command


def pinned_core():
    """The core benchopt is pinned to (the first this process may use), None without
    taskset."""
    if shutil.which("taskset") is None or not hasattr(os, "sched_getaffinity"):
        return None
    return min(os.sched_getaffinity(0))


def child_environment(data: Path, checks: Path) -> dict:
    env = dict(os.environ)
    for variable in THREAD_VARIABLES:
        env[variable] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPOSITORY)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["DASK_SCD_LIBSVM_DIR"] = str(data)
    env["DASK_SCD_BENCHOPT_CHECKS"] = str(checks)
    return env


def run_benchmark(benchmark, checkout, args, solvers, libsvm_files, workdir):
    """Run one benchmark; returns its records, solver statuses and the command."""
    copy = prepare_copy(checkout, workdir)
    output = workdir / f"{benchmark.name}.parquet"
    log_path = workdir / f"{benchmark.name}.log"
    command = benchopt_command(benchmark, copy, args, solvers, libsvm_files, output)
    env = child_environment(args.data, workdir / "checks.jsonl")
    print(f"== {benchmark.name}: benchopt run ({len(solvers) + 1} solvers), log {log_path}")
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    statuses = solver_statuses(log_path.read_text(encoding="utf-8", errors="replace"))
    print(f"   {time.perf_counter() - started:.0f} s, {len(statuses)} solver runs")
    if not output.exists():
        print(f"   benchopt wrote no results; the end of its log:\n{tail(log_path)}")
        return [], statuses
    return read_records(output, benchmark.name), statuses


def tail(path: Path, lines: int = 30) -> str:
    text = _ANSI.sub("", path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(text.replace("\r", "\n").splitlines()[-lines:])


def read_checks(path: Path):
    """Our warm-up fits' objective as benchopt computes it against n times ours."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------- the report


def _repetitions(count: int) -> str:
    """'One repetition' or 'The fastest of N repetitions'."""
    return "One repetition" if count == 1 else f"The fastest of {count} repetitions"


def render_checks(checks) -> str:
    if not checks:
        return "Objective check: no record (our solver did not run)."
    worst = max(
        abs(c["benchopt"] - c["ours_times_n"]) / max(abs(c["benchopt"]), 1e-300) for c in checks
    )
    return (
        f"Objective check: on {len(checks)} problems, benchopt's objective of our warm-up "
        f"fit equals n x our objective (`FitResult.primal_`) to a relative {worst:.1e} "
        "at most."
    )


def render_failures(statuses) -> str:
    """The solver runs that did not end 'done' (also 'done (timeout)'), 'max_runs' or
    'timeout'."""
    bad = [s for s in statuses if s[3].split()[0] not in ("done", "max_runs", "timeout")]
    if not bad:
        return ""
    lines = ["Solvers that gave no curve:", ""]
    for dataset, objective, solver, status, error in bad:
        reason = f": `{error[:160]}`" if error else ""
        lines.append(f"- {solver} on {dataset} · {objective}: {status}{reason}")
    return "\n".join(lines)


def render_stops(statuses) -> str:
    counts: dict = {}
    for _, _, solver, status, _ in statuses:
        counts.setdefault(solver, {}).setdefault(status, 0)
        counts[solver][status] += 1
    parts = [
        f"{solver} " + ", ".join(f"{n} {status}" for status, n in sorted(by.items()))
        for solver, by in sorted(counts.items())
    ]
    return "How each solver's curves ended: " + "; ".join(parts) + "."


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in [
        "benchopt",
        "numpy",
        "scipy",
        "scikit-learn",
        "numba",
        "skglm",
        "celer",
        "glum",
        "snapml",
    ]:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} absent")
    return ", ".join(found)


# --------------------------------------------------------------- main


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkouts",
        type=Path,
        default=None,
        help="folder holding the clones benchmark_logreg_l2, benchmark_logreg_l1, benchmark_lasso",
    )
    parser.add_argument(
        "--benchmarks",
        default=",".join(BENCHMARKS),
        help="comma-separated, of: " + ", ".join(BENCHMARKS),
    )
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="folder of a8a, a9a.t")
    parser.add_argument("--quick", action="store_true", help="a few rows, short timeouts")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per solver and row")
    parser.add_argument("--max-runs", type=int, default=None, help="benchopt's -n")
    parser.add_argument(
        "--repetitions",
        type=int,
        default=1,
        help="benchopt's -r: each solver's curve run this many times; a time to a target is "
        "the fastest of them (fewer noisy millisecond rows)",
    )
    parser.add_argument(
        "--dataset",
        action="append",
        help="run only this benchopt dataset selection (repeatable), e.g. "
        "'Simulated[n_samples=500,n_features=600,rho=0]'",
    )
    parser.add_argument(
        "--objective",
        action="append",
        help="run only this benchopt objective selection (repeatable)",
    )
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--keep", action="store_true", help="keep the copies, benchopt's logs and results"
    )
    args = parser.parse_args(argv)
    if args.timeout is None:
        args.timeout = 5.0 if args.quick else 60.0
    if args.max_runs is None:
        args.max_runs = 30 if args.quick else 100
    return args


def check_setup(args) -> tuple[list, dict]:
    """The benchmarks to run with their checkouts, and the peers missing here; exits with
    a message naming what to install or clone when benchopt or a checkout is absent."""
    names = [name.strip() for name in args.benchmarks.split(",") if name.strip()]
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        sys.exit(f"unknown benchmark(s) {unknown}; known: {', '.join(BENCHMARKS)}")
    problems = []
    if missing_modules(["benchopt", "pandas", "pyarrow"]):
        problems.append(
            "benchopt (with pandas, pyarrow) is not installed here: "
            "pip install -e '.[bench]' (make bench-benchopt does)"
        )
    if args.checkouts is None:
        problems.append("no --checkouts folder given (make bench-benchopt BENCHMARKS=DIR)")
        found = []
    else:
        found = [(BENCHMARKS[n], args.checkouts / f"benchmark_{n}") for n in names]
        for benchmark, checkout in found:
            if not (checkout / "objective.py").exists():
                problems.append(
                    f"{checkout} is not a checkout: git clone "
                    f"https://github.com/benchopt/benchmark_{benchmark.name} {checkout}"
                )
    if problems:
        sys.exit("cannot run:\n- " + "\n- ".join(problems))
    peers = {peer_module(s) for benchmark, _ in found for s in benchmark.peers}
    return found, missing_modules(peers)


def main(argv=None):
    args = parse_args(argv)
    found, missing = check_setup(args)
    for module, reason in missing.items():
        print(f"peer {module} not available, its solvers are left out ({reason})")
    libsvm_files = [name for name in LIBSVM_FILES if (args.data / name).exists()]
    if args.quick:
        libsvm_files = libsvm_files[:1]
    if not libsvm_files:
        print(f"no LIBSVM file in {args.data}: the LIBSVM rows are not run")
    command = " ".join([os.path.relpath(sys.executable)] + sys.argv)
    started, load_start = time.perf_counter(), load_average()
    records, statuses = [], []
    workdir = Path(tempfile.mkdtemp(prefix="bench_benchopt_"))
    try:
        for benchmark, checkout in found:
            solvers = [s for s in benchmark.peers if peer_module(s) not in missing]
            got, stops = run_benchmark(benchmark, checkout, args, solvers, libsvm_files, workdir)
            records += got
            statuses += stops
        checks = read_checks(workdir / "checks.jsonl")
    finally:
        if args.keep:
            print(f"copies, logs and results kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    rows = table_rows(records)
    elapsed = time.perf_counter() - started
    core = pinned_core()
    header = (
        f"## {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC — "
        f"{cpu_model()}, {os.cpu_count()} cores (1 thread"
        + (f", pinned to core {core} by taskset" if core is not None else "")
        + ")\n\n"
        f"Command: `{command}` (run took {elapsed / 60:.1f} min); library at "
        f"{library_commit()}; load average {load_start} at the start, {load_average()} at "
        f"the end.\nVersions: {versions()}.\n"
        f"benchopt run: `-n {args.max_runs} --timeout {args.timeout:g} -r {args.repetitions}`, one process, "
        f"datasets {'the quick rows' if args.quick else 'Simulated (all its parameters)'}"
        + (f" and LIBSVM {', '.join(libsvm_files)}" if libsvm_files else ", no LIBSVM file")
        + ".\n"
        + "".join(
            f"Peer {module} absent ({reason}): its solvers left out.\n"
            for module, reason in missing.items()
        )
    )
    notes = (
        "Times are benchopt's: the wall time of one `run(stop_val)` from scratch (setup "
        "and warm-up outside it); a solver's time to a target is its fastest run whose "
        "objective is within the target of f*, the smallest objective of all the row's "
        "runs. The ratio is ours / the fastest peer's (below 1: ours faster). "
        f"{_repetitions(args.repetitions)} per run, on a machine the load average says was "
        "shared: times of a few milliseconds are noisy, and all of them are indicative."
    )
    parts = [header, notes, render_table(rows), render_counts(rows), render_checks(checks)]
    parts += [render_stops(statuses), render_failures(statuses)]
    print_and_append("\n\n".join(p for p in parts if p) + "\n", args.output, save=not args.no_save)


if __name__ == "__main__":
    main()
