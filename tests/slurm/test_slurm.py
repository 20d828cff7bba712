"""Fits on SLURM jobs through dask-jobqueue, disturbed as batch systems disturb them: a job
cancelled mid-fit, workers reaching their lifetime, the client killed. Each fit ends at
the undisturbed model (the block-SCD model does not depend on the workers) with its gap
certified; the fits' timings, beside the same fit on a LocalCluster, are written to
benchmarks/results/slurm.md."""

import datetime
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster

import dask_scd
from dask_scd import cli
from dask_scd.datasets import make_onehot
from dask_scd.runtime import jobqueue as jq

sys.path.insert(0, str(Path(__file__).parent))
from client_fit import FIT, slurm_resources  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PARTITION = os.environ.get("DASK_SCD_SLURM_PARTITION", "debug")


def _partition_answers() -> str | None:
    """None when the partition answers, else why not."""
    if shutil.which("sinfo") is None:
        return "sinfo is not installed"
    try:
        done = subprocess.run(
            ["sinfo", "-h", "-p", PARTITION, "-o", "%t"], capture_output=True, text=True, timeout=15
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"sinfo did not answer ({error})"
    if done.returncode != 0 or not done.stdout.strip():
        return f"no SLURM partition {PARTITION!r} answers (make test-slurm starts one)"
    try:
        import dask_jobqueue  # noqa: F401
    except ImportError:
        return "dask-jobqueue is not installed (the jobqueue extra)"
    return None


# Only where a SLURM partition answers (make test-slurm starts a one-node cluster):
# elsewhere, and in make test, skipped at once.
_WHY_NOT = _partition_answers()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")]
RESULTS = ROOT / "benchmarks" / "results" / "slurm.md"
TIMINGS = []  # (scenario, cluster, workers, epochs, seconds, relative gap, max |Δw|)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A directory the jobs share with this process (the one node is this machine)."""
    given = os.environ.get("DASK_SCD_SLURM_DIR")
    if given:
        path = Path(given) / "tests"
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("slurm")


@pytest.fixture(scope="module")
def grid(shared):
    X, y, fields = make_onehot(30_000, n_fields=9, cardinality=30, random_state=0)
    return dask_scd.to_grid(
        X, y, shared / "onehot.zarr", row_chunk=15_000, blocks=fields, overwrite=True
    )


@pytest.fixture(scope="module")
def undisturbed(grid):
    """The fit on a LocalCluster of 2 worker processes of 1 thread (as 2 one-core jobs)."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        result = timed_fit("undisturbed", "LocalCluster", client, grid)
    yield result
    write_timings()


def timed_fit(scenario, where, client, grid, reference=None, resumed_at=0, **options):
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = dask_scd.fit(grid, client=client, **FIT, **options)
    seconds = time.perf_counter() - start
    delta = float(np.max(np.abs(result.coef_ - reference.coef_))) if reference is not None else 0.0
    TIMINGS.append(
        (
            scenario,
            where,
            len(client.scheduler_info()["workers"]),
            result.n_iter_ - resumed_at,
            seconds,
            result.dual_gap_,
            delta,
        )
    )
    return result


def assert_same_model(result, reference):
    assert result.converged_ and result.dual_gap_ <= FIT["tol"]
    assert np.max(np.abs(result.coef_ - reference.coef_)) <= 1e-12
    assert abs(result.intercept_ - reference.intercept_) <= 1e-12


@contextmanager
def slurm_cluster(shared, name, worker_extra_args=None):
    resources = slurm_resources(PARTITION)
    with jq.make_cluster(
        resources, shared_directory=shared, job_name=name, worker_extra_args=worker_extra_args
    ) as cluster:
        cluster.adapt(minimum_jobs=resources.jobs, maximum_jobs=resources.jobs)
        with Client(cluster) as client:
            jq.wait_for_workers(client, cluster, resources.n_workers, timeout=180)
            yield cluster, client


def wait_until(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout} s")
        time.sleep(0.5)


def workers(client):
    return set(client.scheduler_info()["workers"])


def squeue(name):
    done = subprocess.run(
        ["squeue", "-h", "--name", name, "-o", "%i"], capture_output=True, text=True, timeout=30
    )
    return done.stdout.split()


# ------------------------------------------------------------------------ the scenarios


def test_the_example_through_slurm(shared, grid, undisturbed, tmp_path):
    directory = shared / "example"
    directory.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "DASK_SCD_EXAMPLE_SIZE": "small",
        "DASK_SCD_SLURM_QUEUE": PARTITION,
        "DASK_SCD_SHARED_DIR": str(directory),
        "DASK_SCD_JOBS": "2",
        "DASK_SCD_CORES": "1",
        "DASK_SCD_MEMORY": "2GiB",
        "DASK_SCD_WALLTIME": "00:10:00",
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "cluster_jobqueue.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"#SBATCH -p {PARTITION}" in done.stdout
    # The pending report ("waiting for workers: 0/2 joined after N s; job J ...") is printed
    # only while workers are missing: on an idle node they may join before the first check
    # (tests/test_jobqueue.py checks the report itself against squeue's output).
    gap = re.search(r"LogisticRegression on the grid: relative gap (\S+),", done.stdout)
    assert gap and float(gap.group(1)) <= 1e-6
    saved = np.load(directory / "clicks.model.npz")
    # The same fit of the grid the example wrote, on a cluster in this process.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        local = dask_scd.fit(
            dask_scd.open_grid(directory / "clicks.zarr"),
            loss="logistic",
            alpha=1e-5,
            tol=1e-6,
            solver="block_scd",
            random_state=0,
        )
    assert float(saved["dual_gap"]) <= 1e-6
    assert np.max(np.abs(saved["coef"] - local.coef_)) <= 1e-12
    assert abs(float(saved["intercept"]) - local.intercept_) <= 1e-12


def test_the_fit_on_slurm_jobs_matches_the_local_one(shared, grid, undisturbed):
    with slurm_cluster(shared, "dscd-plain") as (cluster, client):
        result = timed_fit("undisturbed", "SLURM", client, grid, undisturbed)
    assert_same_model(result, undisturbed)


def test_a_cancelled_job_is_replaced_mid_fit(shared, grid, undisturbed):
    with slurm_cluster(shared, "dscd-cancel") as (cluster, client):
        first = set(jq.job_ids(cluster))
        before = workers(client)
        cancelled = []

        def disturb(state):
            if state["epoch"] == 1:
                cancelled.append(sorted(first)[0])
                subprocess.run(["scancel", cancelled[0]], check=True, timeout=30)
            if state["epoch"] == 2:  # the rest of the fit runs on the replacement
                wait_until(
                    lambda: len(workers(client) - before) >= 1, 120, "no replacement worker joined"
                )

        result = timed_fit(
            "job cancelled at epoch 1", "SLURM", client, grid, undisturbed, callback=disturb
        )
        replacements = set(jq.job_ids(cluster)) - first
    assert cancelled and replacements
    assert_same_model(result, undisturbed)


def test_workers_reaching_their_lifetime_are_replaced_mid_fit(shared, grid, undisturbed):
    lifetime = ["--lifetime", "30s", "--lifetime-stagger", "10s"]
    with slurm_cluster(shared, "dscd-lifetime", lifetime) as (cluster, client):
        first = set(jq.job_ids(cluster))
        before = workers(client)

        def disturb(state):
            if state["epoch"] == 2:  # at least one worker retires and is replaced mid-fit
                wait_until(
                    lambda: len(workers(client) - before) >= 1,
                    120,
                    "no worker retired and was replaced",
                )

        result = timed_fit(
            "workers' lifetime 30 s ± 10 s", "SLURM", client, grid, undisturbed, callback=disturb
        )
        assert set(jq.job_ids(cluster)) - first  # adapt submitted new jobs
    assert_same_model(result, undisturbed)


def test_a_killed_client_resumes_from_its_checkpoint_on_new_jobs(shared, grid, undisturbed):
    assert undisturbed.n_iter_ > 6  # the client is killed after epoch 6
    for stale in shared.glob("dask-scd-*.npz"):
        stale.unlink()
    client_script = Path(__file__).parent / "client_fit.py"
    process = subprocess.Popen(
        [sys.executable, str(client_script), str(grid.path), str(shared), "dscd-killed", PARTITION],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        lines = []
        for line in process.stdout:
            lines.append(line.strip())
            if line.strip() == "epoch 6":
                process.send_signal(signal.SIGKILL)
                break
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert lines[-1] == "epoch 6" and process.returncode == -signal.SIGKILL, lines
    # Its jobs outlive it (until their death timeout): cancel them, as a user would.
    subprocess.run(["scancel", "--name", "dscd-killed"], check=True, timeout=30)
    wait_until(lambda: not squeue("dscd-killed"), 60, "the killed client's jobs did not end")
    (checkpoint,) = shared.glob("dask-scd-*.npz")  # the default one, written at epoch 5
    with slurm_cluster(shared, "dscd-resumed") as (cluster, client):
        result = timed_fit(
            "client killed after epoch 6, resumed from epoch 5",
            "SLURM",
            client,
            dask_scd.open_grid(grid.path),
            undisturbed,
            resumed_at=5,
            resume=True,
        )
    assert result.history_.iteration == list(range(1, result.n_iter_ + 1))
    assert result.n_iter_ == undisturbed.n_iter_
    np.testing.assert_array_equal(result.coef_, undisturbed.coef_)  # bit for bit
    assert_same_model(result, undisturbed)
    assert checkpoint.exists()


def test_the_cli_fits_on_slurm_and_resumes(shared, grid, undisturbed, capsys):
    out = shared / "cli-model.json"
    common = [
        "fit",
        str(grid.path),
        "--slurm",
        PARTITION,
        "--jobs",
        "2",
        "--cores",
        "1",
        "--memory",
        "2GiB",
        "--walltime",
        "00:10:00",
        "--loss",
        "logistic",
        "--alpha",
        "1e-4",
        "--tol",
        "1e-12",
        "--solver",
        "block_scd",
        "--out",
        str(out),
        "--checkpoint-every",
        "1",
    ]
    assert cli.main([*common, "--max-iter", "3"]) == 0
    first = capsys.readouterr().out
    assert "waiting for workers: 0/2 joined" in first and "fitted block_scd: 3 epochs" in first
    assert (shared / "cli-model.ckpt.npz").exists()
    assert cli.main([*common, "--max-iter", "1000", "--resume"]) == 0
    second = capsys.readouterr().out
    assert f"fitted block_scd: {undisturbed.n_iter_} epochs" in second
    import json

    model = json.loads(out.read_text())
    assert model["history"]["iteration"][:4] == [1, 2, 3, 4]
    assert np.max(np.abs(np.array(model["coef"]) - undisturbed.coef_)) <= 1e-12
    assert model["dual_gap"] <= 1e-12


def test_a_request_no_node_can_hold_fails_fast_naming_the_partition(grid, capsys):
    limits = jq.partition_limits(PARTITION)
    start = time.monotonic()
    status = cli.main(
        [
            "fit",
            str(grid.path),
            "--slurm",
            PARTITION,
            "--cores",
            str(limits.cpus + 1),
            "--solver",
            "block_scd",
        ]
    )
    err = capsys.readouterr().err
    assert status == cli.FAILURE and time.monotonic() - start < 30
    assert f"{limits.cpus + 1} cores" in err
    assert f"partition {PARTITION!r}: nodes of at most {limits.cpus} CPUs" in err


# ------------------------------------------------------------------------ the record


def write_timings():
    if not TIMINGS:
        return
    load = os.getloadavg()
    lines = [
        f"## {datetime.date.today()}: one-node SLURM ({os.cpu_count()} cores), "
        f"{platform.python_version()}",
        "",
        "`make test-slurm` (tests/slurm/test_slurm.py): logistic L2, alpha = 1e-4, tol = 1e-12, "
        "block SCD on a one-hot grid of 30,000 × 270 (9 fields, 2 row chunks of 15,000); "
        "SLURM: 2 jobs of 1 core, 1 worker each; LocalCluster: 2 worker processes of 1 thread. "
        f"Load average after: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}. Fit time includes "
        "the waits the disturbed scenarios impose (a replacement job to start).",
        "",
        "| scenario | cluster | workers at the end | epochs run | fit s | s / epoch | relative gap "
        "| max \\|Δw\\| to undisturbed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scenario, where, n_workers, epochs, seconds, gap, delta in TIMINGS:
        lines.append(
            f"| {scenario} | {where} | {n_workers} | {epochs} | {seconds:.1f} | "
            f"{seconds / max(epochs, 1):.2f} | {gap:.1e} | {delta:.1e} |"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n\n")
