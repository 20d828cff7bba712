"""The ``dask-scd`` command: convert a libsvm file to a grid store, describe a grid, fit one,
predict with a fitted model (usage: ``dask-scd COMMAND --help`` and docs/cli.md).

Every error is one line on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings

from dask_scd.data.files import write_atomically
from dask_scd.engines.registry import SOLVERS
from dask_scd.objectives import LOSSES, PENALTIES

PROG = "dask-scd"
USAGE_ERROR = 2  # argparse's status for a bad command line
FAILURE = 1


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr (no usage block)."""

    def error(self, message):
        self.exit(USAGE_ERROR, f"{PROG}: error: {message} (see {self.prog} --help)\n")


def _argument_type(convert, valid, name: str, expected: str):
    """An argparse ``type``: ``convert`` of the text, refused unless ``valid``; argparse
    names the type by its ``name`` in its message."""

    def parse(text: str):
        value = convert(text)
        if not valid(value):
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text}")
        return value

    parse.__name__ = name
    return parse


_positive_int = _argument_type(int, lambda v: v >= 1, "positive integer", "an integer ≥ 1")
_positive_float = _argument_type(
    float, lambda v: 0 < v < float("inf"), "positive number", "a finite number > 0"
)
_fraction = _argument_type(float, lambda v: 0.0 <= v <= 1.0, "number in [0, 1]", "in [0, 1]")


def build_parser() -> argparse.ArgumentParser:
    """The ``dask-scd`` argument parser and its four subcommands.

    Kept whole: a declaration, one ``add_argument`` per option in the order ``--help``
    lists them; split up it would hide the command line's shape.
    """
    from dask_scd import __version__

    parser = _Parser(
        prog=PROG,
        description="Regularized linear models by coordinate "
        "descent, certified by their duality gap, on zarr grid stores.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    defaults = {"formatter_class": argparse.ArgumentDefaultsHelpFormatter}

    convert = commands.add_parser("convert", help="write a libsvm file as a grid store", **defaults)
    convert.add_argument("input", metavar="INPUT", help="libsvm / svmlight text file")
    convert.add_argument("output", metavar="OUT", help="directory of the grid store to write")
    convert.add_argument(
        "--row-chunk", type=_positive_int, default=100_000, help="examples per row chunk"
    )
    convert.add_argument(
        "--column-block",
        type=_positive_int,
        default=None,
        metavar="M",
        help="consecutive blocks of M features (None: pure blocks detected by greedy colouring)",
    )
    convert.add_argument(
        "--n-features",
        type=_positive_int,
        default=None,
        metavar="P",
        help="features of the grid, when the file's last ones never occur "
        "(None: the largest index in the file)",
    )
    convert.add_argument("--overwrite", action="store_true", help="replace an existing store")
    convert.add_argument(
        "--weights",
        metavar="FILE",
        default=None,
        help="sample weights to store, one number per line of a text file",
    )

    info = commands.add_parser("info", help="describe a grid store", **defaults)
    info.add_argument("grid", metavar="GRID", help="directory of a grid store")

    fit = commands.add_parser(
        "fit", help="fit a model on a grid store, printing its gap", **defaults
    )
    fit.add_argument("grid", metavar="GRID", help="directory of a grid store")
    fit.add_argument("--loss", choices=LOSSES, default="squared", help="the loss")
    fit.add_argument("--penalty", choices=PENALTIES, default="l2", help="the penalty")
    fit.add_argument(
        "--alpha", type=_positive_float, default=1.0, help="regularization strength, per example"
    )
    fit.add_argument(
        "--l1-ratio", type=_fraction, default=0.5, help="the L1 share of an elastic-net penalty"
    )
    fit.add_argument(
        "--tol", type=_positive_float, default=1e-6, help="target relative duality gap"
    )
    fit.add_argument("--solver", choices=SOLVERS, default="auto", help="the engine")
    fit.add_argument(
        "--max-iter", type=_positive_int, default=1000, help="iterations of the engine at most"
    )
    fit.add_argument("--no-intercept", action="store_true", help="fit no intercept")
    fit.add_argument("--random-state", type=int, default=0, help="the seed")
    fit.add_argument(
        "--scheduler-address",
        metavar="ADDR",
        default=None,
        help="a running dask scheduler (tcp://host:port); None: a local one",
    )
    fit.add_argument(
        "--out",
        metavar="MODEL.json",
        default=None,
        help="write the model as JSON, or as dask_scd.save does for a name ending in .npz",
    )
    fit.add_argument("--quiet", action="store_true", help="print only the summary line")
    fit.add_argument(
        "--checkpoint",
        metavar="PATH",
        default=None,
        help="checkpoint file (None: beside --out, else beside the grid, when the "
        "fit runs on a cluster or --resume is given)",
    )
    fit.add_argument(
        "--checkpoint-every",
        type=_positive_int,
        default=5,
        metavar="K",
        help="write the checkpoint every K epochs",
    )
    fit.add_argument(
        "--resume",
        action="store_true",
        help="continue from the checkpoint of an earlier run, if there is one",
    )
    fit.add_argument(
        "--performance-report",
        metavar="report.html",
        default=None,
        help="write dask's performance report of the fit (a dask engine)",
    )
    _add_jobqueue_arguments(fit)
    fit.add_argument(
        "--weights",
        metavar="FILE",
        default=None,
        help="sample weights, one number per line of a text file (in place "
        "of the grid's stored weights)",
    )

    predict = commands.add_parser(
        "predict", help="predict with a model written by fit --out", **defaults
    )
    predict.add_argument("model", metavar="MODEL.json", help="a model written by fit --out")
    predict.add_argument("data", metavar="DATA", help="a grid store or a libsvm file")
    predict.add_argument(
        "--out",
        metavar="PREDICTIONS.txt",
        default=None,
        help="one prediction a line (None: standard output)",
    )
    return parser


def _add_jobqueue_arguments(fit) -> None:
    """``--slurm``/``--pbs`` and the jobs' resources (default: ``DASK_SCD_*`` environment
    variables, else what fits the partition: :func:`dask_scd.runtime.jobqueue.job_resources`)."""
    batch = fit.add_argument_group("workers as batch jobs (dask-jobqueue)")
    where = batch.add_mutually_exclusive_group()
    where.add_argument(
        "--slurm",
        metavar="PARTITION",
        default=None,
        help="run the workers as SLURM jobs in this partition",
    )
    where.add_argument(
        "--pbs", metavar="QUEUE", default=None, help="run the workers as PBS jobs in this queue"
    )
    batch.add_argument(
        "--jobs",
        type=_positive_int,
        default=None,
        metavar="N",
        help="jobs kept running (adapt replaces those that end); $DASK_SCD_JOBS, else 2",
    )
    batch.add_argument(
        "--cores",
        type=_positive_int,
        default=None,
        metavar="C",
        help="cores per job; $DASK_SCD_CORES, else a node's CPUs up to 8",
    )
    batch.add_argument(
        "--processes",
        type=_positive_int,
        default=None,
        metavar="P",
        help="worker processes per job; $DASK_SCD_PROCESSES, else cores / 4",
    )
    batch.add_argument(
        "--memory",
        default=None,
        metavar="M",
        help="memory per job, shared by its processes (16GiB, 16GB = 14.9GiB); "
        "$DASK_SCD_MEMORY, else 90%% of a node's share for the cores",
    )
    batch.add_argument(
        "--walltime",
        default=None,
        metavar="T",
        help="HH:MM:SS per job; $DASK_SCD_WALLTIME, else the partition's limit up to 1 hour",
    )
    batch.add_argument(
        "--account", default=None, metavar="A", help="account charged; $DASK_SCD_ACCOUNT"
    )
    batch.add_argument(
        "--local-directory",
        default=None,
        metavar="DIR",
        help="node-local spill directory of the workers ($TMPDIR, /scratch)",
    )
    batch.add_argument(
        "--wait",
        type=_positive_float,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for the workers to start",
    )
    batch.add_argument(
        "--dry-run",
        action="store_true",
        help="print the job script and exit without submitting anything",
    )


def main(argv=None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        commands = {"convert": _convert, "info": _info, "fit": _fit, "predict": _predict}
        return commands[args.command](args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError, TypeError, ImportError, RuntimeError) as error:
        print(f"{PROG}: error: {_one_line(error)}", file=sys.stderr)
        return FAILURE


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, FileNotFoundError) and error.filename and error.strerror:
        text = f"{error.strerror}: {error.filename}"
    return text


def _convert(args) -> int:
    from dask_scd.grid import to_grid

    if not os.path.isfile(args.input):
        raise FileNotFoundError(f"input file not found: {args.input}")
    if os.path.exists(args.output) and not args.overwrite:
        raise FileExistsError(f"{args.output} exists (pass --overwrite to replace it)")
    weights = _read_weights(args.weights)
    start = time.perf_counter()
    grid = to_grid(
        args.input,
        None,
        args.output,
        row_chunk=args.row_chunk,
        blocks=args.column_block,
        overwrite=args.overwrite,
        n_features=args.n_features,
        sample_weight=weights,
    )
    print(f"wrote {grid} in {time.perf_counter() - start:.2f}s")
    return 0


def _read_weights(path):
    """The weights of a text file, one number per line (None without a file)."""
    if path is None:
        return None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"weights file not found: {path}")
    import numpy as np

    try:
        return np.loadtxt(path, dtype=np.float64, ndmin=1)
    except ValueError as exc:
        raise ValueError(f"weights file {path}: {exc}") from None


def _open(path: str):
    from dask_scd.grid import open_grid

    if not os.path.exists(path):
        raise FileNotFoundError(f"grid store not found: {path}")
    if not os.path.isdir(path):
        raise ValueError(
            f"{path} is a file, not a grid store (convert it first: {PROG} convert {path} OUT.zarr)"
        )
    return open_grid(path)


def _info(args) -> int:
    grid = _open(args.grid)
    kind = "sparse" if grid.is_sparse else "dense"
    sizes = [len(block) for block in grid.blocks]
    print(f"grid        {grid.path}")
    print(
        f"shape       {grid.shape[0]} examples x {grid.shape[1]} features, {kind} "
        f"{grid.dtype}, {grid.nnz} non-zeros"
    )
    print(f"row chunks  {grid.n_row_chunks} of {grid.row_chunk} examples")
    print(f"blocks      {grid.n_blocks} (sizes {min(sizes)}-{max(sizes)}), {sum(grid.purity)} pure")
    print(f"weights     {'stored' if grid.has_weights else 'none'}")
    if grid.feature_names is not None:
        names = ", ".join(grid.feature_names[:5])
        print(f"features    {names}{', ...' if grid.shape[1] > 5 else ''}")
    return 0


def _fit(args) -> int:
    import dask_scd

    if args.out is not None:
        _check_writable(args.out)  # before the fit: its work is not lost to a typo
    grid = _open(args.grid)
    args.sample_weight = _read_weights(args.weights)  # None: the grid's stored weights
    kind = "slurm" if args.slurm is not None else "pbs" if args.pbs is not None else None
    if args.dry_run and kind is None:
        raise ValueError("--dry-run prints the job script of --slurm or --pbs: name one")
    if kind is not None and args.scheduler_address is not None:
        raise ValueError(f"--{kind} starts its own scheduler: drop --scheduler-address")
    options = _checkpoint_options(
        args, on_cluster=kind is not None or args.scheduler_address is not None
    )
    if args.performance_report is not None:
        _check_writable(args.performance_report, "--performance-report")
        options["performance_report"] = args.performance_report
    if kind is not None:
        return _fit_on_jobs(dask_scd, grid, args, kind, options)
    if args.scheduler_address is not None:
        from distributed import Client

        with Client(args.scheduler_address, timeout="10s") as client:
            return _fit_and_report(dask_scd, grid, args, client=client, **options)
    # An in-process cluster's own logs (task errors, shutdown) would add lines to the
    # one-line errors of this command.
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    return _fit_and_report(dask_scd, grid, args, **options)


def _checkpoint_options(args, on_cluster: bool) -> dict:
    """``checkpoint``/``resume`` of the fit: a fit on a cluster (or one asked to resume)
    checkpoints beside ``--out`` (model.json → model.ckpt.npz), else beside the grid."""
    path = args.checkpoint
    if path is None and not (on_cluster or args.resume):
        return {}
    if path is None:
        stem = os.path.splitext(args.out)[0] if args.out else os.path.normpath(args.grid)
        path = f"{stem}.ckpt.npz"
    return {"checkpoint": path, "checkpoint_every": args.checkpoint_every, "resume": args.resume}


def _fit_on_jobs(dask_scd, grid, args, kind: str, options: dict) -> int:
    """Start a SLURMCluster or PBSCluster, wait for its workers (reporting the scheduler's
    pending reasons, failing fast on a request that can never run), fit on it."""
    from dask_scd.runtime import jobqueue

    queue = args.slurm if kind == "slurm" else args.pbs
    limits = jobqueue.partition_limits(queue) if kind == "slurm" and not args.dry_run else None
    resources = jobqueue.job_resources(
        kind,
        queue=queue,
        jobs=args.jobs,
        cores=args.cores,
        processes=args.processes,
        memory=args.memory,
        walltime=args.walltime,
        account=args.account,
        limits=limits,
    )
    shared = os.path.dirname(os.path.abspath(options.get("checkpoint") or args.grid))
    logging.getLogger("distributed").setLevel(logging.ERROR)
    where = {"shared_directory": shared, "local_directory": args.local_directory}
    if args.dry_run:  # prints the script; nothing is submitted or written
        print(jobqueue.dry_run_script(resources, **where))
        print(
            f"{resources.jobs} jobs of {resources.processes} worker processes "
            f"(nothing submitted or written: --dry-run)"
        )
        return 0
    with jobqueue.make_cluster(resources, **where) as cluster:
        from distributed import Client

        cluster.adapt(minimum_jobs=resources.jobs, maximum_jobs=resources.jobs)
        with Client(cluster) as client:
            print(
                f"{kind} jobs: {resources.jobs} x ({resources.cores} cores, "
                f"{resources.processes} workers, {resources.memory}, {resources.walltime}) "
                f"in {queue}; dashboard {client.dashboard_link}"
            )
            jobqueue.wait_for_workers(
                client, cluster, resources.n_workers, timeout=args.wait, limits=limits
            )
            if args.solver == "auto":
                options["in_memory_limit"] = 0  # the jobs' workers fit it, not this process
            return _fit_and_report(dask_scd, grid, args, client=client, **options)


def _fit_and_report(dask_scd, grid, args, **engine_options) -> int:
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = dask_scd.fit(
            grid,
            loss=args.loss,
            penalty=args.penalty,
            alpha=args.alpha,
            l1_ratio=args.l1_ratio,
            fit_intercept=not args.no_intercept,
            tol=args.tol,
            max_iter=args.max_iter,
            solver=args.solver,
            random_state=args.random_state,
            verbose=0 if args.quiet else 2,
            sample_weight=args.sample_weight,
            **engine_options,
        )
    seconds = time.perf_counter() - start
    for warning in caught:
        print(f"{PROG}: warning: {_one_line(warning.message)}", file=sys.stderr)
    print(
        f"fitted {result.solver_}: {result.n_iter_} epochs, relative gap "
        f"{result.dual_gap_:.3e}, objective {result.primal_:.10g}, {seconds:.2f}s"
    )
    if args.out is not None:
        _write_model(args.out, result, grid)
        print(f"wrote {args.out}")
    if engine_options.get("performance_report"):
        print(f"wrote {engine_options['performance_report']}")
    return 0


def _predict(args) -> int:
    """Decision values (squared loss) or labels of DATA, one a line."""
    import numpy as np

    from dask_scd.result import dask_scores

    if args.out is not None:
        _check_writable(args.out)
    model = _read_model(args.model)
    coef = np.asarray(model.coef_, dtype=np.float64)
    data = _read_data(args.data, len(coef))
    X = data.X
    if data.kind == "grid":
        scores = dask_scores(X.X, coef[X.feature_order][None, :], np.array([model.intercept_]))[
            :, 0
        ].compute()
    else:
        scores = np.asarray(X @ coef).ravel() + model.intercept_
    classes = model.classes_
    values = scores if classes is None else np.where(scores > 0, classes[1], classes[0])
    text = "".join(f"{value:.17g}\n" for value in values)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    write_atomically(args.out, lambda handle: handle.write(text), text=True)
    print(f"wrote {len(values)} predictions to {args.out}", file=sys.stderr)
    return 0


def _read_data(path: str, n_features: int):
    """DATA (a grid store or a libsvm file) as a ModelInput of the model's width.

    A grid must have that width. A libsvm file may be narrower (a test split whose last
    features never occur) and is widened with zero columns; one wider is refused by name
    (sklearn's own message names neither the file nor the model).
    """
    from dask_scd.data.inputs import read_input

    data = read_input(path)  # a libsvm file at its own width: compared below
    width = data.X.shape[1]
    if width > n_features or (width < n_features and data.kind == "grid"):
        # A narrower grid is a test split converted without its training set's width.
        hint = (
            ""
            if width > n_features
            else f" (convert its libsvm file with --n-features {n_features})"
        )
        raise ValueError(
            f"the model has {n_features} features, the data at {path} has {width}{hint}"
        )
    if width < n_features:
        data.X.resize(data.X.shape[0], n_features)  # CSR: only its shape changes
    return data


def _read_model(path: str):
    """The FitResult of one coefficient vector at ``path``: the JSON of ``fit --out``, or
    what :func:`dask_scd.save` writes (``fit --out model.npz``)."""
    from dask_scd.persist import NotAModelError, load
    from dask_scd.result import FitResult

    if not os.path.isfile(path):
        raise FileNotFoundError(f"model file not found: {path}")
    try:
        model = load(path)
    except NotAModelError as exc:
        raise ValueError(f"{path} is not a model written by {PROG} fit --out ({exc})") from None
    if not isinstance(model, FitResult) or model.coef_.ndim != 1:
        raise ValueError(f"{path} holds no model of one coefficient vector, as fit --out writes")
    return model


def _check_writable(path: str, option: str = "--out") -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"the directory of {option} {path} does not exist: {directory}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{option} {path} is a directory (name a file)")
    if not os.access(directory, os.W_OK):
        raise PermissionError(f"cannot write {option} {path}: {directory} is not writable")


def _write_model(path: str, result, grid) -> None:
    """The model as JSON, or as :func:`dask_scd.save` writes it for a ``.npz`` name;
    written to a temporary file first: never half a file."""
    if path.endswith(".npz"):
        from dask_scd.persist import save

        return save(result, path)
    model = {
        "loss": result.loss,
        "penalty": result.penalty,
        "alpha": result.alpha,
        "l1_ratio": result.l1_ratio,
        "solver": result.solver_,
        "coef": [float(value) for value in result.coef_],
        "intercept": float(result.intercept_),
        "classes": None if result.classes_ is None else [float(c) for c in result.classes_],
        "dual_gap": float(result.dual_gap_),
        "primal": float(result.primal_),
        "n_iter": int(result.n_iter_),
        "converged": bool(result.converged_),
        "feature_names": grid.feature_names,
        "grid": grid.path,
        "history": result.history_.as_dict(),
    }
    text = json.dumps(model, indent=1)
    write_atomically(path, lambda handle: handle.write(text), text=True)


if __name__ == "__main__":  # pragma: no cover - the console script calls main()
    sys.exit(main())
