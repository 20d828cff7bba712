"""Workers as batch jobs (SLURM, PBS) through dask-jobqueue, never silently stuck.

- The jobs' resources (jobs, cores, processes, memory, walltime, queue, account) come from
  arguments, else ``DASK_SCD_*`` environment variables, else defaults that fit the
  partition (``sinfo -h -p P -o "%c %m %l"``); a request no node of the partition can
  hold fails before any job is submitted, naming the partition's limits.
- While waiting for workers, the scheduler's pending reason of every job
  (``squeue -h -j IDS -o "%i %T %r"``) is reported every few seconds; a reason that
  never clears (a bad constraint, the partition's configuration) fails at once.
- Workers retire before the walltime kills their job (``--lifetime`` with a stagger, so
  they do not all leave at once), and ``adapt`` submits replacements; fits on such a
  cluster write a checkpoint every few epochs by default (:func:`walltime_defaults`).

dask-jobqueue is the ``jobqueue`` extra and is imported only when a cluster is started.
"""

from __future__ import annotations

import hashlib
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

KINDS = ("slurm", "pbs")
# The environment variables each resource is read from when no argument gives it.
ENVIRONMENT = {
    "jobs": "DASK_SCD_JOBS",
    "cores": "DASK_SCD_CORES",
    "processes": "DASK_SCD_PROCESSES",
    "memory": "DASK_SCD_MEMORY",
    "walltime": "DASK_SCD_WALLTIME",
    "account": "DASK_SCD_ACCOUNT",
}
QUEUE_ENVIRONMENT = {"slurm": "DASK_SCD_SLURM_QUEUE", "pbs": "DASK_SCD_PBS_QUEUE"}
DEFAULT_JOBS = 2
DEFAULT_WALLTIME = 3600
MAX_DEFAULT_CORES = 8
# Checkpoints on a jobqueue cluster, when the fit names none.
CHECKPOINT_EVERY = 5
# SLURM's pending reasons that no amount of waiting clears (the job must be changed).
NEVER_RUNS = frozenset(
    """BadConstraints PartitionConfig PartitionNodeLimit PartitionTimeLimit InvalidAccount
    InvalidQOS AccountNotAllowed QOSNotAllowed PartitionDown PartitionInactive
    AssocMaxCpuPerJobLimit AssocMaxWallDurationPerJobLimit QOSMaxCpuPerJobLimit
    QOSMaxWallDurationPerJobLimit QOSMaxMemoryPerJob DependencyNeverSatisfied JobHeldAdmin
    """.split()
)


@dataclass(frozen=True)
class Limits:
    """The largest node of a partition (CPUs, memory in MiB) and its time limit in seconds
    (None: unlimited)."""

    partition: str
    cpus: int
    memory_mb: int
    walltime: int | None

    def __str__(self) -> str:
        time_limit = (
            "no time limit"
            if self.walltime is None
            else f"time limit {format_walltime(self.walltime)}"
        )
        return (
            f"partition {self.partition!r}: nodes of at most {self.cpus} CPUs and "
            f"{self.memory_mb} MiB, {time_limit}"
        )


@dataclass(frozen=True)
class Resources:
    """What every job asks for: ``cores`` and ``memory`` per job, shared by its
    ``processes`` workers."""

    kind: str
    queue: str | None
    jobs: int
    cores: int
    processes: int
    memory: str
    walltime: str
    account: str | None = None

    @property
    def n_workers(self) -> int:
        return self.jobs * self.processes

    @property
    def walltime_seconds(self) -> int:
        return parse_walltime(self.walltime)


# ------------------------------------------------------------------------ parsing


def parse_walltime(text: str) -> int | None:
    """Seconds of a SLURM/PBS time: ``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS``, ``MM``
    (minutes, as SLURM reads it); ``infinite``/``UNLIMITED`` → None."""
    text = str(text).strip()
    if text.lower() in ("infinite", "unlimited", "n/a", "none", ""):
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if match is None:
        raise ValueError(f"walltime {text!r} is not D-HH:MM:SS, HH:MM:SS, MM:SS or minutes")
    days, first, second, third = match.groups()
    if third is not None:
        seconds = int(first) * 3600 + int(second) * 60 + int(third)
    elif second is not None:
        seconds = int(first) * 3600 + int(second) * 60 if days else int(first) * 60 + int(second)
    else:
        seconds = int(first) * (3600 if days else 60)
    return seconds + int(days or 0) * 86400


def format_walltime(seconds: int) -> str:
    """``HH:MM:SS`` (hours may exceed 24), the form both SLURM and PBS read."""
    seconds = int(seconds)
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def memory_mb(memory: str) -> int:
    """MiB that SLURM is asked for when a job's ``memory`` is this (dask-jobqueue rounds
    up to whole GiB above 1 GiB, to whole MiB below)."""
    from dask.utils import parse_bytes

    n = parse_bytes(str(memory))
    if n >= 2**30:
        return math.ceil(n / 2**30) * 1024
    return max(1, math.ceil(n / 2**20))


def _memory_text(text) -> str:
    memory_mb(text)  # a readable size, or ValueError
    return str(text)


def _leading_int(text: str) -> int:
    match = re.match(r"\d+", text)
    if match is None:
        raise ValueError(text)
    return int(match.group())


def parse_sinfo(partition: str, output: str) -> Limits:
    """The :class:`Limits` of ``partition`` from ``sinfo -h -p P -o "%c %m %l"`` lines
    (one per group of alike nodes: CPUs, memory in MiB, time limit)."""
    rows = [line.split() for line in output.splitlines() if line.strip()]
    if not rows:
        raise ValueError(
            f"SLURM has no partition {partition!r} (sinfo lists no node in it; "
            "`sinfo -s` lists the partitions)"
        )
    try:
        cpus = max(_leading_int(row[0]) for row in rows)
        memory = max(_leading_int(row[1]) for row in rows)
        walltime = parse_walltime(rows[0][2]) if len(rows[0]) > 2 else None
    except (ValueError, IndexError):
        raise ValueError(
            f"cannot read sinfo's answer for partition {partition!r}: {output.strip()!r}"
        ) from None
    return Limits(partition, cpus, memory, walltime)


def _run(command: list[str], timeout: float = 20.0) -> str | None:
    """stdout of a scheduler command, or None when it is not installed or fails."""
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def partition_limits(partition: str | None, run=_run) -> Limits | None:
    """The partition's :class:`Limits` from ``sinfo``; None when sinfo is not installed
    or does not answer (then nothing can be checked). ``partition=None``: the default
    partition."""
    command = ["sinfo", "-h", "-o", "%c %m %l %P"]
    output = run(command if partition is None else command[:2] + ["-p", partition] + command[2:])
    if output is None:
        return None
    if partition is None:  # the default partition is starred in %P
        default = [line for line in output.splitlines() if line.rstrip().endswith("*")]
        if not default:
            return None
        output = "\n".join(default)
        partition = default[0].split()[-1].rstrip("*")
    return parse_sinfo(partition, output)


# ------------------------------------------------------------------------ resources


def job_resources(
    kind: str = "slurm",
    *,
    queue=None,
    jobs=None,
    cores=None,
    processes=None,
    memory=None,
    walltime=None,
    account=None,
    limits: Limits | None = None,
    environ=None,
) -> Resources:
    """The resources of every job: the arguments, else the ``DASK_SCD_*`` environment
    variables (:data:`ENVIRONMENT`, :data:`QUEUE_ENVIRONMENT`), else defaults that fit
    ``limits`` (the partition's largest node).

    Defaults: 2 jobs; all of a node's CPUs up to 8; one worker process per 4 cores;
    90 % of the node's memory in proportion to the cores; the partition's time limit up
    to 1 hour. Raises ValueError when a node of the partition cannot hold one job.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not one of {KINDS}")
    environ = os.environ if environ is None else environ

    def given(name, value, convert=str):
        if value is None and environ.get(ENVIRONMENT[name]):
            value, where = environ[ENVIRONMENT[name]], f"${ENVIRONMENT[name]}"
        else:
            where = name
        if value is None:
            return None
        try:
            return convert(value)
        except ValueError:
            raise ValueError(f"{where}={value!r} is not a valid {name}") from None

    def positive(text):
        value = int(text)
        if value < 1:
            raise ValueError(text)
        return value

    queue = queue if queue is not None else environ.get(QUEUE_ENVIRONMENT[kind]) or None
    jobs = given("jobs", jobs, positive) or DEFAULT_JOBS
    cores = given("cores", cores, positive)
    if cores is None:
        cores = min(limits.cpus, MAX_DEFAULT_CORES) if limits else 1
    processes = given("processes", processes, positive) or max(1, cores // 4)
    if processes > cores:
        raise ValueError(
            f"processes={processes} > cores={cores}: each worker process needs at least one core"
        )
    memory = given("memory", memory, _memory_text)
    if memory is None:
        share = int(0.9 * limits.memory_mb * cores / limits.cpus) if limits else 2048
        # Whole GiB above 1 GiB: dask-jobqueue rounds the request up to them.
        memory = f"{share // 1024}GiB" if share >= 1024 else f"{share}MiB"
    walltime = given("walltime", walltime)
    if walltime is None:
        limit = limits.walltime if limits else None
        walltime = format_walltime(min(limit or DEFAULT_WALLTIME, DEFAULT_WALLTIME))
    if parse_walltime(walltime) is None:
        raise ValueError(f"walltime={walltime!r}: a job needs a finite walltime")
    account = given("account", account)
    resources = Resources(
        kind,
        queue,
        jobs,
        cores,
        processes,
        memory,
        format_walltime(parse_walltime(walltime)),
        account,
    )
    if limits is not None:
        check_fits(resources, limits)
    return resources


def check_fits(resources: Resources, limits: Limits) -> None:
    """ValueError naming the partition's limits when no node of it can run one job."""
    problems = []
    if resources.cores > limits.cpus:
        problems.append(f"{resources.cores} cores (--cores / $DASK_SCD_CORES)")
    if memory_mb(resources.memory) > limits.memory_mb:
        problems.append(
            f"{resources.memory} = {memory_mb(resources.memory)} MiB of memory "
            "(--memory / $DASK_SCD_MEMORY)"
        )
    if limits.walltime is not None and resources.walltime_seconds > limits.walltime:
        problems.append(f"a walltime of {resources.walltime} (--walltime / $DASK_SCD_WALLTIME)")
    if problems:
        raise ValueError(
            f"no job can ever run: each asks for {' and '.join(problems)}, but {limits}"
        )


def lifetime_args(walltime_seconds: int) -> list[str]:
    """``dask worker`` arguments that retire a worker before its job's walltime: a
    lifetime of the walltime less three staggers, the stagger 5 % of the walltime
    (at most 5 minutes), so the workers of a cluster do not all leave at once."""
    stagger = max(1, min(300, walltime_seconds // 20))
    lifetime = max(1, walltime_seconds - 3 * stagger)
    return ["--lifetime", f"{lifetime}s", "--lifetime-stagger", f"{stagger}s"]


# ------------------------------------------------------------------------ the cluster


def _import_cluster(kind: str):
    try:
        import dask_jobqueue
    except ImportError:
        raise ImportError(
            "a SLURM or PBS cluster needs dask-jobqueue: pip install 'dask-scd[jobqueue]'"
        ) from None
    return {"slurm": dask_jobqueue.SLURMCluster, "pbs": dask_jobqueue.PBSCluster}[kind]


def make_cluster(
    resources: Resources,
    *,
    shared_directory=None,
    local_directory=None,
    python=None,
    worker_extra_args=None,
    **cluster_options,
):
    """A dask-jobqueue cluster (not yet scaled) for ``resources``.

    Workers run ``python`` (default: this interpreter, so the jobs find the same
    environment), retire before the walltime (:func:`lifetime_args`) unless
    ``worker_extra_args`` sets ``--lifetime``, and write their logs to
    ``shared_directory/dask-scd-logs``. ``shared_directory`` is also where fits on this cluster
    write their default checkpoints (:func:`walltime_defaults`).
    """
    Cluster = _import_cluster(resources.kind)
    extra = list(worker_extra_args or [])
    if "--lifetime" not in extra:
        extra += lifetime_args(resources.walltime_seconds)
    options = dict(
        cores=resources.cores,
        processes=resources.processes,
        memory=resources.memory,
        walltime=resources.walltime,
        python=python or sys.executable,
        worker_extra_args=extra,
    )
    if resources.queue is not None:
        options["queue"] = resources.queue
    if resources.account is not None:
        options["account"] = resources.account
    if local_directory is not None:
        options["local_directory"] = local_directory
    if shared_directory is not None:
        shared_directory = os.path.abspath(os.fspath(shared_directory))
        options["log_directory"] = os.path.join(shared_directory, "dask-scd-logs")
    options["scheduler_options"] = {"dashboard_address": ":0"}  # a free port, not 8787
    options.update(cluster_options)
    cluster = Cluster(**options)
    cluster.dask_scd_shared_directory = shared_directory
    return cluster


def dry_run_script(resources: Resources, *, shared_directory=None, **options) -> str:
    """The job script of :func:`make_cluster`'s cluster (same arguments), creating
    nothing on disk.

    dask-jobqueue creates a cluster's log directory when the cluster is made: the cluster
    is made with a temporary shared directory, removed after, whose path in the script
    is replaced by ``shared_directory``'s.
    """
    if shared_directory is None:
        with make_cluster(resources, **options) as cluster:
            return cluster.job_script()
    shared_directory = os.path.abspath(os.fspath(shared_directory))
    with tempfile.TemporaryDirectory(prefix="dask-scd-dry-run-") as scratch:
        with make_cluster(resources, shared_directory=scratch, **options) as cluster:
            script = cluster.job_script()
    return script.replace(scratch, shared_directory)


def job_ids(cluster) -> list[str]:
    """The scheduler's ids of the cluster's submitted jobs."""
    jobs = getattr(cluster, "workers", {}).values()
    return [str(job.job_id) for job in jobs if getattr(job, "job_id", None)]


def pending_reasons(kind: str, ids: list[str], run=_run) -> dict[str, tuple[str, str]]:
    """{job id: (state, reason)} of the jobs the scheduler still lists."""
    if not ids:
        return {}
    if kind == "slurm":
        output = run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i %T %r"]) or ""
        return {
            parts[0]: (parts[1], " ".join(parts[2:]))
            for parts in (line.split() for line in output.splitlines())
            if len(parts) >= 2
        }
    output = run(["qstat", "-f", *ids]) or ""
    reasons, current = {}, None
    for line in output.splitlines():
        if line.startswith("Job Id:"):
            current = line.split(":", 1)[1].strip().split(".")[0]
            reasons[current] = ("", "")
        elif current and "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            state, comment = reasons[current]
            if key == "job_state":
                reasons[current] = (value, comment)
            elif key == "comment":
                reasons[current] = (state, value)
    return reasons


def wait_for_workers(
    client,
    cluster,
    n_workers: int,
    *,
    timeout: float = 600.0,
    every: float = 5.0,
    out=print,
    limits: Limits | None = None,
    run=_run,
    submit_timeout: float = 25.0,
) -> None:
    """Wait until ``n_workers`` workers have joined, reporting every ``every`` seconds
    how many are up and each pending job's state and reason.

    Raises RuntimeError at once when the scheduler gives a job a reason that never
    clears (:data:`NEVER_RUNS`), when no job was submitted within ``submit_timeout``
    seconds (the submission command failed: its error is in the log above), and
    TimeoutError after ``timeout`` seconds, naming the reasons.
    """
    kind = "pbs" if type(cluster).__name__.startswith("PBS") else "slurm"
    where = f" ({limits})" if limits is not None else ""
    start = time.monotonic()
    last_report = -every
    reasons = {}
    while True:
        joined = len(client.scheduler_info()["workers"])
        if joined >= n_workers:
            return
        elapsed = time.monotonic() - start
        if elapsed - last_report >= every:
            last_report = elapsed
            ids = job_ids(cluster)
            if not ids and elapsed > submit_timeout:
                raise RuntimeError(
                    f"no job was submitted in {submit_timeout:.0f} s: the "
                    f"submission failed (the error is logged above){where}"
                )
            reasons = pending_reasons(kind, ids, run=run)
            out(
                f"waiting for workers: {joined}/{n_workers} joined after {elapsed:.0f} s; "
                + _describe(ids, reasons)
            )
            never = {
                i: r
                for i, (state, r) in reasons.items()
                if state.upper() in ("PENDING", "PD", "Q", "H") and r in NEVER_RUNS
            }
            if never:
                listed = ", ".join(f"job {i}: {r}" for i, r in sorted(never.items()))
                raise RuntimeError(
                    f"the scheduler will never start these jobs ({listed}); "
                    f"ask for fewer cores, less memory or a shorter walltime"
                    f"{where}"
                )
        if elapsed > timeout:
            raise TimeoutError(
                f"{joined}/{n_workers} workers joined in {timeout:.0f} s; "
                f"{_describe(job_ids(cluster), reasons)}{where}"
            )
        time.sleep(min(1.0, every))


def _describe(ids, reasons) -> str:
    if not ids:
        return "no job submitted yet"
    parts = []
    for i in ids:
        state, reason = reasons.get(i, ("", ""))
        text = f"job {i} {state or 'not listed'}"
        if reason and reason not in ("None", "(null)"):
            text += f" ({reason})"
        parts.append(text)
    return "; ".join(parts)


# ------------------------------------------------------------------------ fits on it


def is_jobqueue_client(client) -> bool:
    """Whether ``client``'s cluster is a dask-jobqueue cluster (never imports it)."""
    module = sys.modules.get("dask_jobqueue")
    cluster = getattr(client, "cluster", None)
    return (
        module is not None and cluster is not None and isinstance(cluster, module.JobQueueCluster)
    )


def walltime_defaults(client, options: dict, identity: dict) -> str | None:
    """On a jobqueue cluster, a fit that names no checkpoint writes one every
    :data:`CHECKPOINT_EVERY` epochs to ``dask-scd-<hash of the fit>.npz`` in the cluster's
    shared directory (:func:`make_cluster`), else ``$DASK_SCD_CHECKPOINT_DIR``, else the
    working directory: a client killed with its job resumes from it with
    ``resume=True``. Sets the options in place; returns the path, or None."""
    if options.get("checkpoint") is not None or not is_jobqueue_client(client):
        return None
    directory = (
        getattr(client.cluster, "dask_scd_shared_directory", None)
        or os.environ.get("DASK_SCD_CHECKPOINT_DIR")
        or os.getcwd()
    )
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode())
    path = os.path.join(directory, f"dask-scd-{digest.hexdigest()[:16]}.npz")
    options["checkpoint"] = path
    options.setdefault("checkpoint_every", CHECKPOINT_EVERY)
    return path
