"""The counts of ``bench_scaleout.py`` per epoch, their tables, the fitted cost model
(``_scaleout_model.py``) and its projection, as markdown."""

from __future__ import annotations

import dataclasses
from collections import Counter

import _scaleout_counts as counts
import _scaleout_model as model
import numpy as np

MB = 1e6
DATACENTER_RTT = 200e-6  # s added per round trip and hop: two 10 GbE network round trips
TARGETS = (
    # (label, rows, features, nodes, cores per node, link bytes/s, rows per row chunk)
    ("1B rows x 611k features", 1_000_000_000, 611_438, 64, 16, 10e9 / 8, 1_048_576),
    ("1B rows x 1M features", 1_000_000_000, 1_000_000, 64, 16, 10e9 / 8, 1_048_576),
)
EPOCHS_TO_1E6 = (6, 10, 14)  # block SCD's epochs to 1e-6 (benchmarks/results/scale.md)


# -------------------------------------------------------------------- per epoch


def epoch_rows(marks, processes, roles, records, calls) -> list:
    """One dict per epoch of a counted fit (the first includes the fit's setup)."""
    bounds = marks.times
    moved = counts.split_bytes(processes, roles, bounds)
    stages = [t for proc in processes for t, _, index in proc["stages"] if index == 0]
    rows = []
    for k in range(len(bounds) - 1):
        lo, hi = bounds[k], bounds[k + 1]
        b = moved[k]
        tasks = [r for r in records if r[1] == k]
        waits = [c for c in calls if lo <= c[0] < hi]
        polls = sum(name == "poll" for _, name, _ in waits)
        rows.append(
            {
                "epoch": k + 1,
                "wall": hi - lo,
                "tasks": len(tasks),
                "depth": max((r[5] for r in tasks), default=0),
                "task_compute": sum(r[4] for r in tasks),
                "w2w": b.get("w2w", 0),
                "w2w_messages": b.get("w2w_messages", 0),
                "max_in": max((v for key, v in b.items() if key.startswith("in:")), default=0),
                "to_client": b.get("to_client", 0),
                "from_client": b.get("from_client", 0),
                "worker_sched": b.get("worker_sched", 0),
                "worker_cpu": sum(marks.worker_cpu[k + 1]) - sum(marks.worker_cpu[k]),
                "main_cpu": marks.main_cpu[k + 1] - marks.main_cpu[k],
                "round_trips": len(waits) - polls,
                "waits": dict(Counter(name for _, name, _ in waits)),
                "stages": sum(lo <= t < hi for t in stages),
            }
        )
    return rows


def steady(rows: list) -> dict:
    """The mean of the epochs that neither start nor end the fit (epochs 2 .. E−1): the
    first carries the setup, the last the final certificate."""
    middle = rows[1:-1] or rows[-1:]
    out = {key: float(np.mean([r[key] for r in middle])) for key in middle[0] if key != "waits"}
    out["waits"] = middle[0]["waits"]
    out["hops"] = out["stages"] if out["stages"] > 0 else out["depth"]
    return out


def model_rows(measured: dict, config: str) -> list:
    """The steady epoch of ``config`` at every W, with ``workers``, ``engine``,
    ``fallbacks`` (collective iterations the engine redid as task graphs) and
    ``worker_cpu_raw`` set; ``worker_cpu`` is net of the workers' idle CPU over the
    epoch's wall time."""
    out = []
    for (W, c), run in sorted(measured["runs"].items()):
        if c == config:
            epoch = steady(run["epochs"])
            idle = measured.get("idle", {}).get(W, {"worker": 0.0, "main": 0.0})
            epoch["worker_cpu_raw"] = epoch["worker_cpu"]
            epoch["worker_cpu"] = max(epoch["worker_cpu"] - idle["worker"] * W * epoch["wall"], 0)
            epoch["main_cpu_raw"] = epoch["main_cpu"]
            epoch["main_cpu"] = max(epoch["main_cpu"] - idle["main"] * epoch["wall"], 0.0)
            extra = {"workers": W, "engine": run["engine"], "fallbacks": run["fallbacks"]}
            out.append({**extra, **epoch})
    return out


def fitted_rows(rows: list, config: str) -> list:
    """The rows a model of ``config`` is fitted to: a collective engine's without the
    cluster sizes whose counted epochs fell back to task graphs (more tasks than
    members)."""
    return rows if config == "graph" else [r for r in rows if r["tasks"] == r["workers"]]


# ------------------------------------------------------------------------ tables


def md_table(head, lines) -> str:
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows += ["| " + " | ".join(str(x) for x in line) + " |" for line in lines]
    return "\n".join(rows)


def _waits(w: dict) -> str:
    text = ", ".join(f"{n} {k}" for k, n in sorted(w.items()) if k != "poll") or "—"
    return text + (f"; {w['poll']} polls while waiting" if w.get("poll") else "")


def counts_table(rows: list) -> str:
    head = [
        "W",
        "tasks",
        "graph depth",
        "exchange stages",
        "round trips (client waits)",
        "w2w MB (messages)",
        "busiest worker in, MB",
        "to client MB",
        "from client MB",
        "worker↔scheduler MB",
        "worker CPU s (net of idle)",
        "scheduler+client CPU s (net of idle)",
        "task compute s",
        "wall s",
    ]
    lines = [
        [
            f"{r['workers']}" + (" ‡" if r["fallbacks"] else ""),
            f"{r['tasks']:.0f}",
            f"{r['depth']:.0f}",
            f"{r['stages']:.0f}",
            f"{r['round_trips']:.0f} ({_waits(r['waits'])})",
            f"{r['w2w'] / MB:.2f} ({r['w2w_messages']:.0f})",
            f"{r['max_in'] / MB:.2f}",
            f"{r['to_client'] / MB:.2f}",
            f"{r['from_client'] / MB:.2f}",
            f"{r['worker_sched'] / MB:.2f}",
            f"{r['worker_cpu_raw']:.2f} ({r['worker_cpu']:.2f})",
            f"{r['main_cpu_raw']:.2f} ({r['main_cpu']:.2f})",
            f"{r['task_compute']:.2f}",
            f"{r['wall']:.2f}",
        ]
        for r in rows
    ]
    return md_table(head, lines)


def latency_table(latency: dict, idle: dict) -> str:
    lines = [
        [
            W,
            f"{v['round_trip'] * 1e3:.2f}",
            _ms(v["ping"]),
            f"{v['hop'] * 1e3:.2f}",
            "{worker:.3f} / {main:.3f}".format(**idle[W]) if W in idle else "—",
        ]
        for W, v in sorted(latency.items())
    ]
    head = [
        "W",
        "client round trip, ms",
        "worker→worker rpc ping, ms",
        "task→task hop, ms",
        "idle CPU s/s: a worker / the scheduler's process",
    ]
    return md_table(head, lines)


def _ms(x) -> str:
    return "—" if x != x else f"{x * 1e3:.2f}"


def model_table(fits: dict) -> str:
    head = [
        "engine",
        "c₀ (CPU s)",
        "c₁ (CPU s / worker)",
        "t₀ tasks",
        "t₁ tasks / worker",
        "s₀ (CPU s)",
        "s₁ (CPU s / worker)",
        "R",
        "D",
        "b₀ MB",
        "b₁ MB / worker",
        "worst misfit: C, tasks, B, scheduler",
    ]
    lines = []
    for config, (m, misfit) in fits.items():
        lines.append(
            [
                config,
                f"{m.c0:.3f}",
                f"{m.c1:.3f}",
                f"{m.t0:.1f}",
                f"{m.t1:.1f}",
                f"{m.s0:.3f}",
                f"{m.s1:.4f}",
                f"{m.round_trips:.1f}",
                f"{m.hops:.0f}",
                f"{m.b0 / MB:.3f}",
                f"{m.b1 / MB:.3f}",
                misfit,
            ]
        )
    return md_table(head, lines)


def misfit(m: model.CostModel, rows: list) -> str:
    """How far the fitted lines are from the inputs they were fitted to: the largest
    relative error of C(W), tasks(W), B(W) and the scheduler's CPU over the measured W."""
    worst = dict.fromkeys(("C", "tasks", "B", "sched"), 0.0)
    for r in rows:
        W = r["workers"]
        for name, fitted, seen in (
            ("C", m.c0 + m.c1 * W, r["worker_cpu"]),
            ("tasks", m.t0 + m.t1 * W, r["tasks"]),
            ("B", m.bytes_in(W), r["max_in"]),
            ("sched", m.s0 + m.s1 * W, r["main_cpu"]),
        ):
            if seen:
                worst[name] = max(worst[name], abs(fitted - seen) / abs(seen))
    return ", ".join(f"{k} {v:.0%}" for k, v in worst.items())


# -------------------------------------------------------------------- the projection


def fitted(measured: dict) -> dict:
    """config → (CostModel, its worst misfit) over the measured W."""
    out = {}
    for config in sorted({c for _, c in measured["runs"]}):
        rows = fitted_rows(model_rows(measured, config), config)
        m = model.fit_model(rows)
        out[config] = (m, misfit(m, rows))
    return out


def measured_latency(measured: dict, collective: bool) -> tuple[float, float]:
    """(client round trip, hop) in seconds, medians over the clusters of 2+ workers: the
    hop is a worker-to-worker ping for a collective epoch's stages, a task-to-task hop
    for a task graph's levels."""
    lat = [v for W, v in measured["latency"].items() if W > 1] or list(measured["latency"].values())
    hop = "ping" if collective else "hop"
    return (
        float(np.median([v["round_trip"] for v in lat])),
        float(np.nanmedian([v[hop] for v in lat])),
    )


def extra_tree_hops(grid: dict, cards, target: model.Target) -> int:
    """Sequential hops a task-graph epoch gains at ``target``: the blocks whose
    statistics the engine sums in a tree of tasks there (its own rule: more than
    INLINE_GROUPS row chunks and over TREE_BYTES of statistics), a tree's levels each,
    and the certificate's deeper tree."""
    from dask_scd.engines.block.block_scd import _BlockSCD
    from dask_scd.runtime.cluster import ClusterRuntime

    R = target.row_chunks
    levels = model.tree_levels(R)
    trees = sum(
        R > ClusterRuntime.INLINE_GROUPS
        and R * min(c, target.chunk_rows) * 32 > _BlockSCD.TREE_BYTES
        for c in cards
    )
    return trees * levels + levels - model.tree_levels(grid["row_chunks"])


def runs_collectively(cards, target: model.Target) -> bool:
    """The engine's own rule (``_fits_collectively``): every block's statistics over all
    row chunks within COLLECTIVE_BYTES."""
    from dask_scd.engines.block.block_scd import _BlockSCD

    most = max(min(c, target.chunk_rows) for c in cards)
    return target.row_chunks * most * 32 <= _BlockSCD.COLLECTIVE_BYTES


def projection_table(measured: dict, fits: dict, cardinalities) -> str:
    head = [
        "target",
        "engine",
        "compute s: non-zeros + sums",
        "scheduler s",
        "latency s (ours / datacenter)",
        "bytes s: busiest / spread",
        "epoch s",
        "to 1e-6: 6 / 10 / 14 epochs",
    ]
    lines = []
    rate = measured["kernels"]["block_scd"]
    for spec in TARGETS:
        target = model.Target(*spec)
        cards = model.scaled_cardinalities(cardinalities, target.features)
        for config, (m, _) in fits.items():
            collective = config != "graph"
            if collective and not runs_collectively(cards, target):
                label = f"{config} (collective: hypothetical, the engine runs task graphs here)"
            else:
                label = config
            extra = 0 if collective else extra_tree_hops(measured["grid"], cards, target)
            scaled = model.project(m, measured["grid"], cardinalities, target, extra)
            # the work on the non-zeros at the in-memory block-SCD rate of one core
            nnz = target.rows * measured["grid"]["nnz"] / measured["grid"]["n"]
            scaled = dataclasses.replace(scaled, c0=nnz / rate)
            rt, hop = measured_latency(measured, collective)
            # the per-worker scheduler work: per member (collective), per group (graph)
            groups = target.nodes if collective else target.groups
            kw = {"cores": target.nodes * target.cores, "groups": groups}
            # a task graph over more than INLINE_GROUPS groups sums in reducing tasks
            kw["replicated"] = collective
            ours = scaled.terms(target.nodes, rt, hop, target.bandwidth, **kw)
            dc = scaled.terms(
                target.nodes, rt + DATACENTER_RTT, hop + DATACENTER_RTT, target.bandwidth, **kw
            )
            epoch = sum(dc.values())
            lines.append(
                [
                    target.label,
                    label,
                    f"{scaled.c0 / kw['cores']:.2f} + {ours['compute'] - scaled.c0 / kw['cores']:.2f}",
                    f"{ours['scheduler']:.2f}",
                    f"{ours['latency']:.2f} / {dc['latency']:.2f}",
                    f"{ours['bytes']:.2f} / {ours['bytes'] / target.nodes:.2f}",
                    f"{epoch:.1f}",
                    " / ".join(_minutes(k * epoch) for k in EPOCHS_TO_1E6),
                ]
            )
    return md_table(head, lines)


def _minutes(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


# ------------------------------------------------------------------------ the page


def render(measured: dict) -> str:
    """The results section: header, latencies, counts per engine, model, projection."""
    from bench_scale import cardinalities

    g, meta = measured["grid"], measured["meta"]
    fits = fitted(measured)
    parts = [header(meta, g), "### Latencies (medians)", ""]
    parts += [latency_table(measured["latency"], measured.get("idle", {})), ""]
    for config in fits:
        rows = model_rows(measured, config)
        parts += [f"### {config}: counts per epoch (the mean of epochs 2..{meta['epochs'] - 1})"]
        parts += ["", f"Engine that ran: {rows[0]['engine']}.", "", counts_table(rows), ""]
        for r in rows:
            if r["fallbacks"]:
                parts += [
                    f"‡ W={r['workers']}: {len(r['fallbacks'])} collective iteration(s) "
                    f"redone as task graphs ({r['fallbacks'][0]})"
                    + (
                        "."
                        if r["tasks"] == r["workers"]
                        else ", among the counted ones: left out of the model."
                    ),
                    "",
                ]
    k = measured["kernels"]
    parts += [
        "### In-memory kernels, one core",
        "",
        f"scd (CSC): {k['scd'] / 1e6:.1f} M non-zeros/s; block SCD in memory: "
        f"{k['block_scd'] / 1e6:.1f} M non-zeros/s (epochs of the same data, from the "
        "histories, certificates included).",
        "",
        "### The cost model fitted to the counts",
        "",
        model_table(fits),
        "",
        "### Projection (logistic L2, one epoch; 64 nodes x 16 cores, 10 Gb/s links, "
        "row chunks of 1,048,576 rows)",
        "",
        projection_table(measured, fits, cardinalities()),
        "",
    ]
    return "\n".join(parts)


def header(meta: dict, g: dict) -> str:
    import dask
    import distributed
    import psutil
    from _machine import cpu_model, library_commit

    return (
        f"## {meta['date']} — {cpu_model()}, {psutil.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.1f} GiB RAM\n\n"
        f"Command: `{meta['cmd']}`; library at {library_commit()}; dask {dask.__version__}, "
        f"distributed {distributed.__version__}, numpy {np.__version__}; run took "
        f"{meta['minutes']:.1f} min; load average at the end {meta['load']} (other "
        "processes shared the 2 cores).\n\n"
        f"Grid: {g['n']:,} rows x {g['p']:,} features, {g['nnz']:,} non-zeros, "
        f"{g['row_chunks']} row chunks (bench_scale's one-hot design, "
        "`write_grid_pieces`); logistic L2, alpha = 1/n, intercept; LocalCluster of W "
        f"processes x 1 thread; {meta['epochs']} epochs per fit. Bytes are those written on "
        "the TCP comms (frames and headers), worker→worker including the collective "
        "exchanges; 'round trips' are the client's blocking calls from the fitting "
        "thread and the engine's waits for a collective epoch's members; CPU seconds "
        "from the processes' CPU times (workers), the fitting process (scheduler, "
        "client, nannies). Wall time is not the measure: 2 cores run W processes.\n"
    )
