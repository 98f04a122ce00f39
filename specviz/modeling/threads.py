"""How many threads torch computes with, chosen for each run from what the machine is doing then.

torch's default is one thread per core, and every matrix multiply then waits for its slowest
thread. When anything else wants a core (another job, a browser on the same machine) that
thread waits a whole scheduler slice: on a shared 2-core machine plain decoding fell from
15.5 tokens/s with 2 threads (quiet) to 3.2-3.8 (busy), while 1 thread kept 8-16. On a quiet
machine, though, the second thread is worth ~15% (13.2-13.8 tokens/s with one). So the count
is chosen per run, from the cores other work keeps busy at that moment (sampled for a fifth
of a second from /proc/stat, our own process left out; the load average where there is no
/proc):

- `batch` (generate, the bench): every idle core.
- `app`: one core fewer, at most: the page's own server, the visitor's browser and the
  charts' rendering run on the same cores while tokens stream.

SPECVIZ_THREADS=N sets the number outright; an explicit OMP_NUM_THREADS (torch's own
setting) is left alone. torch fixes a thread's count the first time that thread computes
and only a call from the thread itself changes it later, so `for_run` is called by the
thread that runs the model, right before the run.

machine() describes the machine for the JSON reports (the bench, the load sweep), with the
same load average the thread count reads.
"""
from __future__ import annotations

import math
import os
import platform
import time

from ..core.errors import SpecvizError

ENV = "SPECVIZ_THREADS"


ROLES = ("batch", "app")


def choose(cores: int, load: float, setting: str | None = None, role: str = "app") -> int:
    """Threads for a machine with `cores` usable cores and `load` cores' worth of other work.

    `setting` is SPECVIZ_THREADS: a positive number wins; empty or "auto" means the rule.
    `role`: "batch" may take every idle core; "app" keeps one core spare for the page.
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
    most = cores if role == "batch" else cores - 1
    return max(1, min(most, idle))


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


def environment(device, dtype, load_before: float | None = None) -> dict:
    """machine(), plus what only a local model run has: torch, transformers, threads, device, dtype."""
    import torch
    import transformers

    from .kernel_table import machine as cpu

    return {**machine(load_before), "cpu": cpu()["cpu"], "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "device": str(device), "dtype": str(dtype).replace("torch.", "")}


def _cpu_ticks() -> tuple[int, int, int] | None:
    """(busy ticks of the whole machine, all ticks, this process's ticks) from /proc; None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user..steal; guest time is already inside user
    return total - idle, total, int(own[11]) + int(own[12])  # utime + stime


def other_work(window: float = 0.2, sleep=time.sleep, ticks=_cpu_ticks) -> float | None:
    """Cores' worth of work other than ours over the next `window` seconds (None where /proc is
    missing): the machine's busy time less this process's own, so our last run does not count."""
    before = ticks()
    if before is None:
        return None
    sleep(window)
    after = ticks()
    if after is None:
        return None
    busy, total, own = (b - a for a, b in zip(before, after))
    cpus = os.cpu_count() or 1
    return max(0.0, (busy - own) / total * cpus) if total > 0 else None


def for_run(role: str = "app", environ=os.environ, measure=other_work) -> str:
    """Set torch's thread count for the run about to start, in the calling thread (the one that
    will run the model), from the machine's state now; returns a line saying what and why."""
    import torch

    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}")
    setting = environ.get(ENV)
    if setting is None and environ.get("OMP_NUM_THREADS"):
        return f"{torch.get_num_threads()} torch threads (OMP_NUM_THREADS)"
    cores = usable_cores()
    fixed = setting is not None and setting.strip().lower() not in ("", "auto")
    load = None if fixed else measure()
    source = "other work now"
    if load is None:
        load, source = load_average() or 0.0, "load average"
    n = choose(cores, load, setting, role)
    torch.set_num_threads(n)
    why = ENV if fixed else f"{cores} cores, {source} {load:.1f}"
    return f"{n} torch thread{'s' if n > 1 else ''} ({why}; set {ENV}=N to change)"
