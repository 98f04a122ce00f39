"""How many threads torch computes with: one core fewer than the machine has, fewer under load.

torch's default is one thread per core, and every matrix multiply then waits for its slowest
thread. When anything else wants a core (another job, the app's own web server, a browser on
the same machine) that thread waits a whole scheduler slice, and decoding on a shared 2-core
machine ran 3-5x slower with 2 threads than with 1 (measured on this project's machines). So by default specviz
keeps one core spare and leaves out the cores other processes already keep busy (the
one-minute load average), with at least one thread: on a quiet machine that costs a little
speed, on a busy one it avoids the collapse.

SPECVIZ_THREADS=N sets the number outright; an explicit OMP_NUM_THREADS (torch's own
setting) is left alone. The choice is made once, before any model runs: torch fixes a
thread's count the first time that thread computes, so a later change would not reach the
app's worker threads.

machine() describes the machine for the JSON reports (the bench, the load sweep), with the
same load average the thread count reads.
"""
from __future__ import annotations

import math
import os
import platform

from .errors import SpecvizError

ENV = "SPECVIZ_THREADS"


def choose(cores: int, load: float, setting: str | None = None) -> int:
    """Threads for a machine with `cores` usable cores and `load` runnable processes besides us.

    `setting` is SPECVIZ_THREADS: a positive number wins; empty or "auto" means the rule.
    """
    if setting is not None and setting.strip().lower() not in ("", "auto"):
        try:
            n = int(setting)
        except ValueError:
            n = 0
        if n < 1:
            raise SpecvizError(f"{ENV}={setting!r}: give a whole number of threads >= 1, or 'auto'")
        return n
    idle = math.floor(cores - max(load, 0.0) + 0.25)  # a core 3/4 free counts as free
    return max(1, min(cores - 1, idle))


def quota_cores(cpu_max: str) -> int | None:
    """Whole cores a cgroup v2 `cpu.max` line ("200000 100000") allows; None when unlimited."""
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        return max(1, int(parts[0]) // int(parts[1]))
    except (ValueError, ZeroDivisionError):
        return None


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a container's CPU quota
    (a 2-vCPU container on a big host sees the host's cores but gets two cores' worth)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota = quota_cores(f.read())
    except OSError:
        quota = None
    return min(cores, quota) if quota else cores


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none): above the core count
    means other work shares the machine."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def machine(load_before: float | None) -> dict:
    """The machine a measurement ran on, for a JSON report: Python, OS, processor, CPU count, and
    the load average before the measurement began (`load_before`) and now, when it ended."""
    return {"python": platform.python_version(), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "load_average_before": load_before, "load_average_after": load_average()}


def apply(environ=os.environ) -> str:
    """Set torch's thread count by the rule (or SPECVIZ_THREADS); returns a line saying what and why."""
    import torch

    setting = environ.get(ENV)
    if setting is None and environ.get("OMP_NUM_THREADS"):
        return f"{torch.get_num_threads()} torch threads (OMP_NUM_THREADS)"
    cores = usable_cores()
    load = load_average() or 0.0
    n = choose(cores, load, setting)
    torch.set_num_threads(n)
    why = f"{ENV}" if setting and setting.strip().lower() != "auto" else f"{cores} cores, load {load:.1f}"
    return f"{n} torch thread{'s' if n > 1 else ''} ({why}; set {ENV}=N to change)"
