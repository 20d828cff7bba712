"""The machine side of an out-of-core run: a memory cgroup that counts the page cache
(cgroup v1 or v2), the bytes read from a block device (/proc/diskstats) and by a cgroup
(v1 ``blkio.throttle.io_service_bytes``, v2 ``io.stat``), the page cache dropped, the
disk's sequential read speed. Used by ``bench_ooc_cgroup.py``; root for what it changes.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CGROUP_ROOT = Path("/sys/fs/cgroup")
SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's own size

# ------------------------------------------------------------------------ the cgroup


@dataclass(frozen=True)
class CgroupSupport:
    """Where a memory cgroup can be made: ``version`` 1 or 2 (0: none, ``reason`` says
    why), the hierarchy of the memory controller and that of the I/O controller (v1
    ``blkio``, None when absent; v2: the same as ``memory``)."""

    version: int
    memory: Path | None = None
    io: Path | None = None
    reason: str = ""


def detect(root: Path = CGROUP_ROOT, euid: int | None = None) -> CgroupSupport:
    """The cgroup version mounted at ``root`` with a memory controller, and whether this
    process (effective uid ``euid``) may make cgroups there."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return CgroupSupport(0, reason=f"not root (euid {euid}): no cgroup can be made")
    root = Path(root)
    controllers = root / "cgroup.controllers"
    if controllers.exists():
        if "memory" not in controllers.read_text().split():
            return CgroupSupport(0, reason=f"cgroup v2 at {root} has no memory controller")
        return CgroupSupport(2, root, root if "io" in controllers.read_text().split() else None)
    if (root / "memory" / "memory.limit_in_bytes").exists():
        blkio = root / "blkio"
        io = blkio if (blkio / "blkio.throttle.io_service_bytes").exists() else None
        return CgroupSupport(1, root / "memory", io)
    return CgroupSupport(0, reason=f"no cgroup memory controller under {root}")


def skip_message(support: CgroupSupport) -> str:
    """The one line printed when the section cannot run."""
    return f"out of core under a memory cgroup: skipped ({support.reason})"


class MemoryCgroup:
    """A cgroup of its own with a memory limit (and, where there is one, the I/O
    controller's counters): :meth:`create`, :meth:`enter` in the child before it runs
    (its children inherit it), :meth:`remove` at the end."""

    def __init__(self, support: CgroupSupport, name: str, limit: int):
        self.support, self.name, self.limit = support, name, int(limit)
        self.memory = support.memory / name
        self.io = None if support.io is None else support.io / name

    def _dirs(self) -> list:
        return list(dict.fromkeys(d for d in (self.memory, self.io) if d is not None))

    def create(self, device: tuple | None = None):
        """Make the cgroup and set its limit; ``device`` (major, minor): v1 counts a
        device's bytes in ``blkio.throttle.io_service_bytes`` only under a throttle
        rule, so it gets one no device reaches (1 PB/s)."""
        if self.support.version == 2:
            with contextlib.suppress(OSError):  # the controllers for the children of root
                (self.support.memory / "cgroup.subtree_control").write_text("+memory +io")
        for d in self._dirs():
            d.mkdir(exist_ok=True)
        if self.support.version == 1:
            (self.memory / "memory.limit_in_bytes").write_text(str(self.limit))
            if self.io is not None and device is not None:
                with contextlib.suppress(OSError):
                    rule = f"{device[0]}:{device[1]} {10**15}"
                    (self.io / "blkio.throttle.read_bps_device").write_text(rule)
        else:
            (self.memory / "memory.max").write_text(str(self.limit))
            with contextlib.suppress(OSError):
                (self.memory / "memory.swap.max").write_text("0")
        return self

    def enter(self):
        """Move the calling process into the cgroup (a ``preexec_fn``)."""
        for d in self._dirs():
            (d / "cgroup.procs").write_text(str(os.getpid()))

    def stats(self) -> dict:
        """Peak usage (processes and page cache), its parts at the end, limit hits."""
        if self.support.version == 1:
            stat = parse_flat_keyed(read_text(self.memory / "memory.stat"))
            return {
                "peak": _int(read_text(self.memory / "memory.max_usage_in_bytes")),
                "failcnt": _int(read_text(self.memory / "memory.failcnt")),
                "cache": stat.get("total_cache", 0),
                "rss": stat.get("total_rss", 0),
                "oom_kill": parse_flat_keyed(read_text(self.memory / "memory.oom_control")).get(
                    "oom_kill", 0
                ),
            }
        stat = parse_flat_keyed(read_text(self.memory / "memory.stat"))
        events = parse_flat_keyed(read_text(self.memory / "memory.events"))
        return {
            "peak": _int(read_text(self.memory / "memory.peak")),
            "failcnt": events.get("max", 0),
            "cache": stat.get("file", 0),
            "rss": stat.get("anon", 0),
            "oom_kill": events.get("oom_kill", 0),
        }

    def remove(self):
        """End what is left in the cgroup (the processes the fit started), then remove it."""
        for d in self._dirs():
            for pid in read_text(d / "cgroup.procs").split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
        for d in self._dirs():
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


class UsagePoller(threading.Thread):
    """Peaks of a cgroup's process memory (rss) and page cache, polled every 0.2 s."""

    def __init__(self, cgroup: MemoryCgroup, interval: float = 0.2):
        super().__init__(daemon=True)
        self.cgroup, self.interval = cgroup, interval
        self.rss = self.cache = 0
        self._halt = threading.Event()

    def run(self):
        while not self._halt.is_set():
            s = self.cgroup.stats()
            self.rss, self.cache = max(self.rss, s["rss"]), max(self.cache, s["cache"])
            self._halt.wait(self.interval)

    def stop(self):
        self._halt.set()
        self.join()


def parse_flat_keyed(text: str) -> dict:
    """``key value`` lines (memory.stat, memory.events, memory.oom_control) as ints."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def read_text(path) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _int(text: str) -> int:
    text = text.strip()
    return int(text) if text.isdigit() else 0


# ------------------------------------------------------------------- bytes read


def device_of(path) -> tuple:
    """(major, minor) of the device holding ``path``."""
    dev = os.stat(path).st_dev
    return os.major(dev), os.minor(dev)


def parse_diskstats(text: str) -> dict:
    """``/proc/diskstats`` as {(major, minor): (name, bytes read, bytes written)}."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 10 and f[0].isdigit() and f[1].isdigit():
            out[(int(f[0]), int(f[1]))] = (f[2], int(f[5]) * SECTOR, int(f[9]) * SECTOR)
    return out


def device_read(device) -> int | None:
    """Bytes read so far from ``device`` ((major, minor)), None where it is not listed."""
    found = parse_diskstats(read_text("/proc/diskstats")).get(device)
    return None if found is None else found[1]


def parse_io_read(text: str, version: int) -> int:
    """Bytes read, all devices, from v1 ``blkio.throttle.io_service_bytes`` (``MAJ:MIN
    Read N`` lines) or v2 ``io.stat`` (``MAJ:MIN rbytes=N wbytes=...``)."""
    total = 0
    for line in text.splitlines():
        f = line.split()
        if version == 1 and len(f) == 3 and f[1] == "Read" and ":" in f[0]:
            total += int(f[2])
        elif version == 2 and f and ":" in f[0]:
            for item in f[1:]:
                key, _, value = item.partition("=")
                if key == "rbytes":
                    total += int(value)
    return total


def own_io_file() -> tuple:
    """(file, version) of the I/O counters of the cgroup this process is in, or (None,
    0) when it is in the root cgroup (whose counters are the whole machine's)."""
    for line in read_text("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        if path.strip() in ("", "/"):
            continue
        if "blkio" in controllers.split(","):
            return CGROUP_ROOT / "blkio" / path.strip("/") / "blkio.throttle.io_service_bytes", 1
        if controllers == "" and (CGROUP_ROOT / "cgroup.controllers").exists():
            return CGROUP_ROOT / path.strip("/") / "io.stat", 2
    return None, 0


class EpochProbe:
    """The fit's callback: at each epoch boundary the time, the bytes read from the
    device holding ``path`` and by this process's cgroup. Never asks the fit to stop."""

    def __init__(self, path):
        try:
            self.device = device_of(path)
        except OSError:
            self.device = None
        self.io_file, self.io_version = own_io_file()
        self.samples: list = []

    def sample(self) -> dict:
        disk = device_read(self.device)
        io = parse_io_read(read_text(self.io_file), self.io_version) if self.io_file else None
        return {"t": time.perf_counter(), "disk": disk, "io": io}

    def __call__(self, info) -> bool:
        self.samples.append({"epoch": int(info["epoch"]), **self.sample()})
        return False


def per_pass(samples: list, key: str = "disk") -> list:
    """(epoch, seconds, bytes read) of each epoch from consecutive probe samples (bytes
    None where the counter was missing)."""
    out = []
    for a, b in zip(samples, samples[1:]):
        read = None if a.get(key) is None or b.get(key) is None else b[key] - a[key]
        out.append((b["epoch"], b["t"] - a["t"], read))
    return out


def floor_seconds(nbytes: int | None, speed: float | None) -> float | None:
    """The least time reading ``nbytes`` takes at ``speed`` bytes per second."""
    if nbytes is None or not speed:
        return None
    return nbytes / speed


# --------------------------------------------------------------------- the machine


def drop_caches():
    """Write back dirty pages and drop the page cache, dentries and inodes (root)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def sequential_read_speed(directory, size: int = 2 * 2**30, block: int = 16 * 2**20) -> dict:
    """Bytes per second of one sequential read of a ``size``-byte file of random bytes
    written in ``directory``: with ``O_DIRECT`` (no page cache), else buffered after
    the page cache was dropped. The file is removed."""
    path = Path(directory) / "read_speed.bin"
    chunk = np.random.default_rng(0).bytes(64 * 2**20)
    with open(path, "wb") as f:
        for _ in range(max(size // len(chunk), 1)):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    drop_caches()
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT wants
    method = "O_DIRECT"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    except OSError:
        fd, method = os.open(path, os.O_RDONLY), "buffered after drop_caches"
    done = 0
    t = time.perf_counter()
    try:
        while True:
            got = os.readv(fd, [buf])
            done += got
            if got < block:
                break
    except OSError:  # a file system refusing O_DIRECT reads
        os.close(fd)
        drop_caches()
        fd, method, done = os.open(path, os.O_RDONLY), "buffered after drop_caches", 0
        t = time.perf_counter()
        while got := os.readv(fd, [buf]):
            done += got
    seconds = time.perf_counter() - t
    os.close(fd)
    path.unlink()
    return {"bytes": done, "seconds": seconds, "speed": done / seconds, "method": method}


def read_tree(path) -> int:
    """Read every file under ``path`` (into the page cache); the bytes read."""
    total = 0
    for root, _, files in os.walk(path):
        for name in sorted(files):
            with contextlib.suppress(OSError), open(os.path.join(root, name), "rb") as f:
                while chunk := f.read(2**24):
                    total += len(chunk)
    return total
