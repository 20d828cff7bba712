"""Facts about the machine that the benchmark scripts record with their results."""

import platform


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
