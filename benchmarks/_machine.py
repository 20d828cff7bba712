"""Facts about the machine that the benchmark scripts record with their results, and the
one way they print and keep those results."""

import os
import platform
import subprocess
from pathlib import Path


def cpu_model() -> str:
    """The processor's model name (from /proc/cpuinfo), or the machine type."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def print_and_append(text: str, output: Path, save: bool = True) -> None:
    """Print ``text``; with ``save``, append it to the markdown file ``output``."""
    print()
    print(text)
    if save:
        output.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "a", encoding="utf-8") as f:
            f.write(text + "\n")
        print(f"appended to {output}", flush=True)


def library_commit() -> str:
    """The short commit of the repository these scripts belong to ("?" outside git)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages ("?" where there are none)."""
    try:
        return " ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "?"
