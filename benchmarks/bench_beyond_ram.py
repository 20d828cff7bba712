"""A grid larger than the machine's memory, end to end: ``bench_scale.py --beyond-ram ROWS``.

The Criteo-like grid of ``bench_scale.py`` (its ``--data``) is written piece by piece
(never whole in memory) with ROWS rows, so that the stored grid and the spill files the
workers write beside it exceed the machine's RAM; the page cache is dropped and block_scd
fits it to a certified ``--beyond-tol`` on a LocalCluster of 2 workers of
``--beyond-memory`` each. Per epoch (the fit's callback, ``_cgroup.EpochProbe``): the time
and the bytes read from the device holding the grid (``/proc/diskstats``); at the end the
size of the workers' spill files (unlinked temporary files: from their cell caches).
Against it: the disk's sequential read speed, and Vowpal Wabbit, the classic single-machine out-of-core learner, on the same rows: its text input written from the same
pieces, then BFGS with the same exact L2 (``--l2 = alpha * n`` on VW's summed loss) for
``--vw-passes`` passes over its cache file, its objective in our units from its own test
pass (average logistic loss) and its weights (readable model) — the accuracy it reaches.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _cgroup import (
    device_of,
    device_read,
    drop_caches,
    floor_seconds,
    parse_diskstats,
    per_pass,
    read_text,
    sequential_read_speed,
)
from _machine import cpu_model, print_and_append
from bench_ooc_cgroup import run_fit, write_grid

NAMESPACE = "f"  # VW's namespace of the one-hot features
CONSTANT = 11650396  # VW's hash of its constant feature (the intercept)

# ----------------------------------------------------------------- VW's text and model


def vw_lines(X, y) -> bytes:
    """Rows of a CSR matrix of ones as VW text: ``±1 |f i j k…`` (feature names are the
    column numbers; their values 1 are implied)."""
    X = X.tocsr()
    heads = np.where(np.asarray(y) > 0, "1 |" + NAMESPACE + " ", "-1 |" + NAMESPACE + " ")
    cols = X.indices.tolist()
    ptr = X.indptr.tolist()
    out = [h + " ".join(map(str, cols[a:b])) for h, a, b in zip(heads, ptr, ptr[1:])]
    return ("\n".join(out) + "\n").encode()


def vw_bits(p: int, space: int) -> tuple[int, np.ndarray, int]:
    """The fewest hash bits (at least 18) at which the p features of namespace hash
    ``space`` and the constant all get their own weight: (bits, feature indices, constant
    index). VW maps a numeric feature name k to (space + k) masked to the bits."""
    for bits in range(18, 32):
        mask = (1 << bits) - 1
        index = (space + np.arange(p, dtype=np.int64)) & mask
        const = CONSTANT & mask
        if len(np.unique(index)) == p and const not in set(index.tolist()):
            return bits, index, const
    raise ValueError(f"no hash width below 32 bits holds {p} features")


def read_weights(text: str, index: np.ndarray, const: int) -> tuple[np.ndarray, float]:
    """θ (in our column order) and b from VW's ``--readable_model`` text: one
    ``index:weight[ …]`` line per non-zero weight after its header."""
    found = {int(m[1]): float(m[2]) for m in re.finditer(r"^(\d+):(\S+)", text, re.M)}
    theta = np.array([found.get(int(i), 0.0) for i in index])
    return theta, found.get(const, 0.0)


def average_loss(output: str) -> float:
    """The ``average loss = …`` VW prints at the end of a run."""
    return float(re.search(r"average loss = ([-+0-9.eE]+)", output).group(1))


# ----------------------------------------------------------------- the text, in parallel

_SHARED: dict = {}  # the bench_scale module and the planted model, for the forked pool


def _text_of(job) -> bytes:
    i, rows, seed = job
    X, y = _SHARED["scale"]._piece(i, rows, seed, _SHARED["truth"])
    return vw_lines(X, y)


def write_vw_text(scale, path, n, row_chunk, seed=3) -> dict:
    """VW's text of the grid's rows (the same pieces, regenerated), 2 processes."""
    truth, plan = scale.piece_plan(n, row_chunk, seed)
    _SHARED.update(scale=scale, truth=truth)
    t = time.perf_counter()
    ctx = multiprocessing.get_context("fork")
    with open(path, "wb") as f, ctx.Pool(2) as pool:
        for chunk in pool.imap(_text_of, [(i, r, seed) for i, r in plan], chunksize=1):
            f.write(chunk)
    return {"seconds": time.perf_counter() - t, "bytes": os.path.getsize(path)}


def run_vw(scale, workdir, n, p, alpha, passes, row_chunk, device) -> dict:
    """VW's text written, BFGS for ``passes`` passes (the first reads the text and writes
    the cache), a test pass for its average loss; its objective in our units."""
    try:
        from vowpalwabbit import pyvw
    except ImportError:
        return {"skipped": "vowpalwabbit is not installed (pip install -e '.[bench]')"}
    ws = pyvw.Workspace("--quiet")
    space = ws.hash_space(NAMESPACE)
    ws.finish()
    bits, index, const = vw_bits(p, space)
    text, model, readable = (workdir / x for x in ("vw.txt", "vw.model", "vw.readable"))
    scale.log(f"== Vowpal Wabbit: text of {n:,} rows")
    written = write_vw_text(scale, text, n, row_chunk)
    scale.log(f"  {scale.fmt_bytes(written['bytes'])} in {scale.fmt_s(written['seconds'])}")
    vw = [sys.executable, "-m", "vowpalwabbit", "-d", str(text), "-c"]
    train = vw + ["-k", "--passes", str(passes), "--bfgs", "--loss_function", "logistic"]
    train += ["--l2", repr(alpha * n), "-b", str(bits), "--holdout_off", "--termination", "0"]
    train += ["--predict_only_model", "--readable_model", str(readable), "-f", str(model)]
    runs = {}
    for name, cmd in (
        ("train", train),
        (
            "test",
            vw + ["-t", "-i", str(model), "--predict_only_model", "--loss_function", "logistic"],
        ),
    ):
        scale.log(f"  vw {name}")
        before, t = device_read(device), time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True)
        seconds, after = time.perf_counter() - t, device_read(device)
        if out.returncode != 0:
            return {
                "failed": f"vw {name} exit {out.returncode}: {(out.stdout + out.stderr)[-600:]}"
            }
        read = None if before is None or after is None else after - before
        loss = average_loss(out.stdout + out.stderr)
        runs[name] = {"seconds": seconds, "read": read, "loss": loss}
    theta, _ = read_weights(readable.read_text(), index, const)  # b is not penalized
    cache = Path(str(text) + ".cache")
    return {
        "bits": bits,
        "passes": passes,
        "text": written,
        "cache": cache.stat().st_size if cache.exists() else None,
        "runs": runs,
        "primal": runs["test"]["loss"] + 0.5 * alpha * float(theta @ theta),
    }


# ----------------------------------------------------------------- the run


def main_beyond(scale, args) -> None:
    """The disk's speed, the grid written, the fit, VW, one section appended."""
    import psutil

    started = time.perf_counter()
    n = args.beyond_ram
    workdir = args.workdir / "beyond"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    root = os.geteuid() == 0
    scale.log("== disk: sequential read speed")
    speed = sequential_read_speed(workdir) if root else None
    grid = workdir / "grid.zarr"
    written = write_grid(scale, grid, n, args.data)
    if written is None:
        return
    device = device_of(grid)
    if root:
        drop_caches()
    memory = scale._parse_bytes(args.beyond_memory)
    scale.log(f"== fit to {args.beyond_tol:g}, workers {scale.fmt_bytes(memory)}")
    fit = run_fit(
        scale,
        grid,
        memory,
        200,
        args.cap or 3 * 3600,
        workdir / "fit",
        tol=args.beyond_tol,
    )
    scale.log(f"  {fit['outcome']}")
    shutil.rmtree(workdir / "scratch", ignore_errors=True)
    alpha = 1.0 / n
    row_chunk = scale.ooc_row_chunk(n)  # the grid's pieces, regenerated for VW
    vw = None
    if args.vw_passes:
        vw = run_vw(
            scale, workdir, n, written["shape"][1], alpha, args.vw_passes, row_chunk, device
        )
    facts = {
        "ram": psutil.virtual_memory().total,
        "speed": speed,
        "written": written,
        "memory": memory,
        "commit": scale.library_commit(),
        "elapsed": time.perf_counter() - started,
        "device": parse_diskstats(read_text("/proc/diskstats")).get(device, ("?",))[0],
    }
    text = report(scale, args, facts, fit, vw)
    shutil.rmtree(workdir, ignore_errors=True)

    print_and_append(text, args.output, save=not args.no_save)


# ----------------------------------------------------------------- the report


def epochs_of(fit: dict) -> list:
    """(epoch, seconds, device bytes, relative gap) of every epoch of the fit, from its
    probe samples and history (gap None where the epoch was not certified)."""
    res = fit.get("result") or {}
    gaps = dict(zip(res.get("iteration") or [], res.get("gap") or []))
    return [
        (epoch, seconds, read, gaps.get(epoch))
        for epoch, seconds, read in per_pass(res.get("probe") or [], "disk")
    ]


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def time_to(res: dict, target: float) -> tuple[float, int] | None:
    """Seconds and epoch of the fit's first certified iterate with objective ≤ ``target``."""
    history = zip(res.get("seconds") or [], res.get("primal") or [], res.get("iteration") or [])
    for s, p, epoch in history:
        if p <= target:
            return s, epoch
    return None


def report(scale, args, facts: dict, fit: dict, vw: dict | None) -> str:
    """The section: machine, grid, the fit's epochs, VW."""
    import datetime
    import shlex

    b, s, w = scale.fmt_bytes, scale.fmt_s, facts["written"]
    res = fit.get("result") or {}
    rows = epochs_of(fit)
    # the spill files are unlinked temporary files: their size from the workers' caches
    spill = sum(c[4] for c in res.get("cache") or [])
    data = w["disk"] + spill
    speed = (facts["speed"] or {}).get("speed")
    steady = rows[1:] or rows
    per_s, per_read = _mean([r[1] for r in steady]), _mean([r[2] for r in steady])
    cmd = " ".join(shlex.quote(a) for a in ["benchmarks/bench_scale.py", *args.argv])
    load = os.getloadavg()
    table = scale.md_table(
        ["epoch", "seconds", "device read", "floor at disk speed", "relative gap"],
        [
            [
                e,
                s(sec),
                "—" if rd is None else b(rd),
                s(floor_seconds(rd, speed)),
                "—" if g is None else f"{g:.2e}",
            ]
            for e, sec, rd, g in rows
        ],
    )
    final = (res.get("primal") or [None])[-1]
    gap = (res.get("gap") or [None])[-1]
    text = (
        f"## {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} — {cpu_model()}, "
        f"{os.cpu_count()} cores, {b(facts['ram'])} RAM (a grid larger than the machine's "
        "memory)\n\n"
        f"Command: `{cmd}` (run took {facts['elapsed'] / 60:.1f} min; load average at the "
        f"end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}); library at {facts['commit']}."
        "\n\n"
        f"Grid: {w['shape'][0]:,} rows x {w['shape'][1]:,} features, {w['nnz']:,} "
        f"non-zeros, **{b(w['disk'])} on disk** (zstd), written in **{s(w['seconds'])}** "
        f"piece by piece (peak RSS {b(w['peak_rss'])}); the workers' spill files (decoded "
        f"cells) {b(spill)}: **grid + spill = {b(data)}, {data / facts['ram']:.2f}x "
        f"the machine's RAM**. Disk {facts['device']}: sequential read "
        + ("not measured (not root)" if not speed else f"**{speed / 1e6:.0f} MB/s** (O_DIRECT)")
        + f". Page cache dropped before the fit. block_scd, logistic L2 alpha = 1/n, "
        f"tol = {args.beyond_tol:g} (certified relative duality gap), random_state=0, "
        f"2 LocalCluster workers x 1 thread of {b(facts['memory'])}, in a fresh process. "
        f"Outcome: **{fit['outcome']}**, {res.get('epochs', '—')} epochs, fit wall "
        f"**{s(res.get('wall'))}** (setup included), final relative gap "
        f"{'—' if gap is None else f'{gap:.2e}'}, P = {final}. Epochs 2 on: "
        f"**{s(per_s)} a pass**, **{'—' if per_read is None else b(per_read)} read from the "
        f"device a pass** ({'—' if per_read is None else f'{per_read / data:.2f}'}x grid + "
        f"spill; floor at the disk's speed {s(floor_seconds(per_read, speed))}). Worker peak "
        f"RSS {' / '.join(b(v) for v in res.get('worker_peaks', [])) or '—'}; client "
        f"{'—' if res.get('client_peak') is None else b(res['client_peak'])}.\n\n" + table + "\n"
    )
    return text + vw_text(scale, vw, res, final, args)


def vw_text(scale, vw: dict | None, res: dict, final, args) -> str:
    """VW's paragraph: what it ran, its time, the accuracy it reached and ours then."""
    b, s = scale.fmt_bytes, scale.fmt_s
    if vw is None:
        return "\nVowpal Wabbit: not run (--vw-passes 0).\n"
    if "skipped" in vw or "failed" in vw:
        return f"\nVowpal Wabbit: {vw.get('skipped') or vw.get('failed')}\n"
    train, test = vw["runs"]["train"], vw["runs"]["test"]
    error = (vw["primal"] - final) / abs(final) if final else None
    ours = time_to(res, vw["primal"])
    return (
        f"\nVowpal Wabbit (vowpalwabbit {_vw_version()}, BFGS, exact L2 = alpha·n on its "
        f"summed loss, -b {vw['bits']}: no hash collision): its text of the same rows "
        f"{b(vw['text']['bytes'])}, written in {s(vw['text']['seconds'])} (2 processes); "
        f"{vw['passes']} passes (the first reads the text and writes its cache, "
        f"{b(vw['cache'])}) in **{s(train['seconds'])}** "
        f"({'—' if train['read'] is None else b(train['read'])} read from the device), "
        f"then a test pass in {s(test['seconds'])} for its average loss "
        f"{test['loss']:.6f}. Its objective in our units (that loss + alpha/2 ‖θ‖², "
        f"constant not penalized) **P = {vw['primal']:.8f}**, relative error "
        f"**{'—' if error is None else f'{error:.2e}'}** against our certified fit "
        f"(P = {final}). Ours reached VW's objective "
        + ("—" if ours is None else f"after **{s(ours[0])}** (epoch {ours[1]}) of the fit's loop")
        + ".\n"
    )


def _vw_version() -> str:
    try:
        from vowpalwabbit.version import __version__

        return __version__
    except ImportError:
        return "?"
