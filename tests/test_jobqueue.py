"""Workers as batch jobs without a batch scheduler: sinfo/squeue answers are given, the
job scripts are printed (--dry-run), the defaults on a jobqueue cluster are checked."""

import os
import shutil
import time
import warnings

import numpy as np
import pytest
from distributed import Client, LocalCluster

import dask_scd
from dask_scd import cli
from dask_scd.datasets import make_onehot
from dask_scd.grid import to_grid
from dask_scd.runtime import jobqueue as jq

SINFO = "2 24105 1:00:00\n16+ 64000 1:00:00\n"


def answering(**outputs):
    """A ``run`` that answers each command (by its name) with the given text."""
    calls = []

    def run(command, timeout=20.0):
        calls.append(command)
        return outputs.get(command[0])

    run.calls = calls
    return run


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("1:00:00", 3600),
        ("2-00:00:00", 172800),
        ("30:00", 1800),
        ("30", 1800),
        ("1-12", 129600),
        ("1-12:30", 131400),
        ("00:00:45", 45),
        ("infinite", None),
        ("UNLIMITED", None),
    ],
)
def test_walltimes_read_as_slurm_reads_them(text, seconds):
    assert jq.parse_walltime(text) == seconds
    if seconds is not None:
        assert jq.parse_walltime(jq.format_walltime(seconds)) == seconds


def test_sinfo_gives_the_largest_node_and_the_time_limit():
    run = answering(sinfo=SINFO)
    limits = jq.partition_limits("debug", run=run)
    assert run.calls == [["sinfo", "-h", "-p", "debug", "-o", "%c %m %l %P"]]
    assert (limits.cpus, limits.memory_mb, limits.walltime) == (16, 64000, 3600)
    assert "at most 16 CPUs and 64000 MiB" in str(limits)
    assert jq.partition_limits("debug", run=answering()) is None  # no sinfo: nothing known
    with pytest.raises(ValueError, match="no partition 'nope'"):
        jq.partition_limits("nope", run=answering(sinfo=""))
    default = jq.partition_limits(
        None, run=answering(sinfo="4 8000 infinite debug*\n64 512000 2-00:00:00 big\n")
    )
    assert (default.partition, default.cpus, default.walltime) == ("debug", 4, None)


def test_memory_is_asked_in_whole_gib_as_dask_jobqueue_writes_it():
    assert jq.memory_mb("16GiB") == 16 * 1024
    assert jq.memory_mb("16GB") == 15 * 1024  # 16e9 bytes = 14.9 GiB, rounded up
    assert jq.memory_mb("500MiB") == 500


def test_defaults_fit_the_partition_and_arguments_beat_the_environment():
    limits = jq.Limits("debug", cpus=2, memory_mb=24105, walltime=1800)
    r = jq.job_resources("slurm", queue="debug", limits=limits, environ={})
    assert (r.jobs, r.cores, r.processes, r.walltime) == (2, 2, 1, "00:30:00")
    assert jq.memory_mb(r.memory) <= 0.9 * 24105
    environ = {
        "DASK_SCD_JOBS": "3",
        "DASK_SCD_CORES": "1",
        "DASK_SCD_MEMORY": "1GiB",
        "DASK_SCD_WALLTIME": "00:10:00",
        "DASK_SCD_ACCOUNT": "proj",
        "DASK_SCD_SLURM_QUEUE": "debug",
    }
    r = jq.job_resources("slurm", limits=limits, environ=environ)
    assert (r.queue, r.jobs, r.cores, r.memory, r.walltime, r.account) == (
        "debug",
        3,
        1,
        "1GiB",
        "00:10:00",
        "proj",
    )
    r = jq.job_resources("slurm", jobs=1, cores=2, limits=limits, environ=environ)
    assert (r.jobs, r.cores, r.n_workers) == (1, 2, 1)
    with pytest.raises(ValueError, match=r"\$DASK_SCD_CORES='many' is not a valid cores"):
        jq.job_resources("slurm", environ={"DASK_SCD_CORES": "many"})
    with pytest.raises(ValueError, match="processes=4 > cores=2"):
        jq.job_resources("slurm", cores=2, processes=4, environ={})


@pytest.mark.parametrize(
    "ask, named",
    [
        (dict(cores=4), "4 cores"),
        (dict(memory="32GiB"), "32GiB = 32768 MiB of memory"),
        (dict(walltime="02:00:00"), "a walltime of 02:00:00"),
    ],
)
def test_a_request_no_node_can_hold_fails_naming_the_limits(ask, named):
    limits = jq.Limits("debug", cpus=2, memory_mb=24105, walltime=3600)
    with pytest.raises(ValueError, match="no job can ever run") as error:
        jq.job_resources("slurm", queue="debug", limits=limits, environ={}, **ask)
    assert named in str(error.value)
    assert "partition 'debug': nodes of at most 2 CPUs and 24105 MiB, time limit 01:00:00" in str(
        error.value
    )


def test_lifetimes_end_before_the_walltime_staggered():
    for walltime in (60, 1200, 3600, 86400):
        args = jq.lifetime_args(walltime)
        lifetime, stagger = (int(args[i].rstrip("s")) for i in (1, 3))
        assert 0 < stagger < lifetime and lifetime + stagger < walltime


class FakeJob:
    def __init__(self, job_id):
        self.job_id = job_id


class FakeCluster:
    def __init__(self, *ids):
        self.workers = {f"w{i}": FakeJob(i) for i in ids}


class FakeClient:
    def __init__(self, n):
        self.n = n

    def scheduler_info(self):
        return {"workers": {f"tcp://w{i}": {} for i in range(self.n)}}


def test_waiting_reports_the_pending_reason_and_fails_fast_when_it_never_clears():
    limits = jq.Limits("debug", cpus=2, memory_mb=24105, walltime=3600)
    lines = []
    run = answering(squeue="11 PENDING Resources\n12 PENDING BadConstraints\n")
    with pytest.raises(
        RuntimeError,
        match=r"never start these jobs \(job 12: BadConstraints\)"
        r".*at most 2 CPUs",
    ):
        jq.wait_for_workers(
            FakeClient(0),
            FakeCluster("11", "12"),
            2,
            timeout=20,
            every=0.01,
            out=lines.append,
            limits=limits,
            run=run,
        )
    assert run.calls[0] == ["squeue", "-h", "-j", "11,12", "-o", "%i %T %r"]
    assert lines == [
        "waiting for workers: 0/2 joined after 0 s; job 11 PENDING (Resources); "
        "job 12 PENDING (BadConstraints)"
    ]


def test_waiting_times_out_naming_the_reasons_and_returns_once_workers_joined():
    lines = []
    run = answering(squeue="11 PENDING Priority\n")
    with pytest.raises(
        TimeoutError,
        match=r"0/1 workers joined in 1 s; job 11 PENDING "
        r"\(Priority\)",
    ):
        jq.wait_for_workers(  # 1 s: two reports even where a loaded machine stalls a sleep
            FakeClient(0), FakeCluster("11"), 1, timeout=1.0, every=0.1, out=lines.append, run=run
        )
    assert len(lines) >= 2 and all("job 11 PENDING (Priority)" in line for line in lines)
    with pytest.raises(RuntimeError, match="no job was submitted"):
        jq.wait_for_workers(
            FakeClient(0),
            FakeCluster(),
            1,
            timeout=5,
            every=0.05,
            out=lines.append,
            run=run,
            submit_timeout=0.1,
        )
    jq.wait_for_workers(FakeClient(2), FakeCluster("11"), 2, run=run)  # no wait, no error


def test_pbs_states_and_comments():
    output = (
        "Job Id: 7.server\n    job_state = Q\n    comment = Not Running: Insufficient "
        "amount of resource: ncpus\nJob Id: 8.server\n    job_state = R\n"
    )
    reasons = jq.pending_reasons("pbs", ["7", "8"], run=answering(qstat=output))
    assert reasons == {
        "7": ("Q", "Not Running: Insufficient amount of resource: ncpus"),
        "8": ("R", ""),
    }


# ------------------------------------------------------------------------ the CLI


@pytest.fixture(scope="module")
def small_grid(tmp_path_factory):
    X, y, blocks = make_onehot(600, 3, 5, random_state=0)
    path = tmp_path_factory.mktemp("jobs") / "g.zarr"
    to_grid(X, y, path, row_chunk=300, blocks=blocks)
    return path


def test_dry_run_prints_the_slurm_job_script(small_grid, capsys, monkeypatch):
    pytest.importorskip("dask_jobqueue")
    monkeypatch.setenv("DASK_SCD_ACCOUNT", "proj")
    status = cli.main(
        [
            "fit",
            str(small_grid),
            "--slurm",
            "debug",
            "--jobs",
            "3",
            "--cores",
            "4",
            "--processes",
            "2",
            "--memory",
            "8GiB",
            "--walltime",
            "02:00:00",
            "--dry-run",
            "--out",
            str(small_grid.parent / "m.json"),
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    for line in (
        "#SBATCH -p debug",
        "#SBATCH -A proj",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --mem=8G",
        "#SBATCH -t 02:00:00",
    ):
        assert line in out
    import sys

    assert f"{sys.executable} -m distributed.cli.dask_worker" in out
    assert "--nthreads 2 --memory-limit 4.00GiB --nworkers 2" in out
    assert "--lifetime 6300s --lifetime-stagger 300s" in out
    assert "3 jobs of 2 worker processes (nothing submitted" in out
    assert not (small_grid.parent / "m.json").exists()
    assert not (small_grid.parent / "m.ckpt.npz").exists()


@pytest.mark.parametrize("kind", ["--slurm", "--pbs"])
def test_dry_run_creates_nothing_on_disk(small_grid, tmp_path, capsys, monkeypatch, kind):
    """The script names the log directory beside the grid; the dry run creates it not,
    nor anything else, there or in the working directory."""
    pytest.importorskip("dask_jobqueue")
    shutil.copytree(small_grid, tmp_path / "g.zarr")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    args = ["fit", "../g.zarr", kind, "debug", "--cores", "4", "--memory", "8GB", "--dry-run"]
    assert cli.main(args) == 0
    assert f"{tmp_path}/dask-scd-logs" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == ["g.zarr", "work"]
    assert os.listdir(work) == []


def test_dry_run_prints_the_pbs_job_script(small_grid, capsys):
    pytest.importorskip("dask_jobqueue")
    status = cli.main(
        [
            "fit",
            str(small_grid),
            "--pbs",
            "workq",
            "--cores",
            "8",
            "--memory",
            "16GB",
            "--walltime",
            "00:20:00",
            "--dry-run",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "#PBS -q workq" in out and "#PBS -l walltime=00:20:00" in out
    assert "ncpus=8" in out and "--nthreads 4" in out  # 2 processes (cores / 4) of 4 threads
    assert "--lifetime 1020s --lifetime-stagger 60s" in out


def test_cli_errors_of_the_batch_options(small_grid, capsys):
    assert cli.main(["fit", str(small_grid), "--dry-run"]) == cli.FAILURE
    assert "--dry-run prints the job script of --slurm or --pbs" in capsys.readouterr().err
    assert (
        cli.main(["fit", str(small_grid), "--slurm", "debug", "--memory", "lots", "--dry-run"])
        == cli.FAILURE
    )
    assert "memory='lots' is not a valid memory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["fit", str(small_grid), "--slurm", "debug", "--pbs", "workq"])


def test_cli_resume_continues_from_the_checkpoint_beside_the_output(small_grid, tmp_path, capsys):
    out = tmp_path / "model.json"
    common = [
        "fit",
        str(small_grid),
        "--loss",
        "logistic",
        "--alpha",
        "0.01",
        "--solver",
        "block_scd",
        "--tol",
        "1e-15",
        "--out",
        str(out),
        "--checkpoint-every",
        "1",
        "--quiet",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main([*common, "--max-iter", "2", "--resume"]) == 0
        assert (tmp_path / "model.ckpt.npz").exists()
        assert cli.main([*common, "--max-iter", "4", "--resume"]) == 0
    import json

    resumed = json.loads(out.read_text())
    assert resumed["history"]["iteration"] == [1, 2, 3, 4]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        straight = dask_scd.fit(
            str(small_grid),
            loss="logistic",
            alpha=0.01,
            tol=1e-15,
            solver="block_scd",
            max_iter=4,
            random_state=0,
        )
    np.testing.assert_array_equal(resumed["coef"], straight.coef_)


# ------------------------------------------------------------------------ fit's options


def test_performance_report_and_dashboard_link(small_grid, tmp_path, capsys):
    report = tmp_path / "report.html"
    with Client(
        LocalCluster(n_workers=1, processes=False, threads_per_worker=2, dashboard_address=":0")
    ) as client:
        result = dask_scd.fit(
            str(small_grid),
            loss="logistic",
            alpha=0.01,
            tol=1e-8,
            solver="block_scd",
            random_state=0,
            verbose=2,
            performance_report=report,
        )
        link = client.dashboard_link
        client.cluster.close()
    assert result.dual_gap_ <= 1e-8
    assert report.stat().st_size > 10_000 and "Dask Performance Report" in report.read_text()
    assert f"dask dashboard: {link}" in capsys.readouterr().out
    X = np.random.default_rng(0).normal(size=(40, 3))
    with pytest.warns(UserWarning, match="performance_report applies to the dask engines"):
        dask_scd.fit(X, X[:, 0], performance_report=tmp_path / "none.html")
    assert not (tmp_path / "none.html").exists()


def test_default_checkpoint_only_on_a_jobqueue_cluster(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    options = {}
    with Client(LocalCluster(n_workers=1, processes=False, dashboard_address=":0")) as client:
        assert not jq.is_jobqueue_client(client)
        assert jq.walltime_defaults(client, options, {"a": 1}) is None and options == {}
        client.cluster.close()

    class Job:  # a stand-in for dask_jobqueue with one cluster class
        class JobQueueCluster:
            dask_scd_shared_directory = None

    class FakeClient:
        cluster = Job.JobQueueCluster()

    monkeypatch.setitem(__import__("sys").modules, "dask_jobqueue", Job)
    path = jq.walltime_defaults(FakeClient(), options, {"a": 1})
    assert path == os.path.join(str(tmp_path), os.path.basename(path))
    assert options == {"checkpoint": path, "checkpoint_every": jq.CHECKPOINT_EVERY}
    assert jq.walltime_defaults(FakeClient(), {}, {"a": 1}) == path  # the same fit, same file
    assert jq.walltime_defaults(FakeClient(), {}, {"a": 2}) != path
    given = {"checkpoint": "mine.npz"}
    assert jq.walltime_defaults(FakeClient(), given, {"a": 1}) is None
    assert given == {"checkpoint": "mine.npz"}


def _inc(x):
    return x + 1


def _n_workers(dask_scheduler):
    return len(dask_scheduler.workers)


def test_a_task_whose_home_left_with_every_worker_runs_on_a_newcomer():
    from dask_scd.runtime.cluster import release_stale_homes

    with (
        LocalCluster(
            n_workers=1, processes=False, threads_per_worker=1, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        assert release_stale_homes(client) and release_stale_homes(client)  # idempotent
        (home,) = client.scheduler_info()["workers"]
        cluster.scale(0)
        deadline = time.monotonic() + 30
        # The scheduler's own count (the client's scheduler_info is a cached copy).
        while client.run_on_scheduler(_n_workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.run_on_scheduler(_n_workers) == 0
        future = client.submit(_inc, 1, workers=[home], allow_other_workers=True, pure=False)
        cluster.scale(1)  # a new worker, at a new address
        assert future.result(timeout=30) == 2


def test_a_task_reaching_no_worker_while_a_newcomer_registers_is_released():
    """The race behind a rare hang: the scheduler awaits its plugins between adding a
    worker and moving its no-worker tasks, so a task submitted in that window reaches
    no-worker after the plugin's add_worker ran. The plugin's transition hook releases
    its stale restrictions and moves it to processing once the transition is over."""
    import asyncio
    from types import SimpleNamespace

    from dask_scd.runtime.cluster import _stale_homes_plugin

    moved, callbacks = [], []
    ts = SimpleNamespace(
        state="no-worker", loose_restrictions=True, worker_restrictions={"tcp://gone:1"}
    )
    scheduler = SimpleNamespace(
        tasks={"k": ts},
        workers={"tcp://new:2": object()},
        running={object()},
        loop=SimpleNamespace(add_callback=lambda f, *a: callbacks.append((f, a))),
        transitions=lambda recs, stimulus_id: moved.append(recs),
    )
    plugin = _stale_homes_plugin()
    asyncio.run(plugin.start(scheduler))
    plugin.transition("k", "waiting", "processing")  # other transitions: untouched
    assert ts.worker_restrictions == {"tcp://gone:1"} and not callbacks
    plugin.transition("k", "waiting", "no-worker")
    assert ts.worker_restrictions == set() and ts.loose_restrictions is False
    ((f, args),) = callbacks
    f(*args)
    assert moved == [{"k": "processing"}]
    # A task whose named worker is still there keeps its restrictions.
    kept = SimpleNamespace(
        state="no-worker", loose_restrictions=True, worker_restrictions={"tcp://new:2"}
    )
    scheduler.tasks["j"] = kept
    plugin.transition("j", "waiting", "no-worker")
    assert kept.worker_restrictions == {"tcp://new:2"} and len(callbacks) == 1


def test_a_task_reaching_no_worker_before_a_newcomer_runs_is_released():
    """A newcomer registered but not yet running takes the no-worker tasks when its
    status changes, by their restrictions: a task that reached no-worker then, its named
    worker gone, waited for ever (seen under load). Its restrictions are released at
    once; it is moved by the scheduler when the newcomer runs, not by the plugin."""
    import asyncio
    from types import SimpleNamespace

    from dask_scd.runtime.cluster import _stale_homes_plugin

    callbacks = []
    ts = SimpleNamespace(
        state="no-worker", loose_restrictions=True, worker_restrictions={"tcp://gone:1"}
    )
    scheduler = SimpleNamespace(
        tasks={"k": ts},
        workers={"tcp://new:2": object()},
        running=set(),
        loop=SimpleNamespace(add_callback=lambda f, *a: callbacks.append((f, a))),
    )
    plugin = _stale_homes_plugin()
    asyncio.run(plugin.start(scheduler))
    plugin.transition("k", "waiting", "no-worker")
    assert ts.worker_restrictions == set() and ts.loose_restrictions is False
    assert not callbacks
