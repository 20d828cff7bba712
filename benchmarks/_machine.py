"""Facts about the machine that the benchmark scripts record with their results, and the
one way they print and keep those results."""

import platform
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
