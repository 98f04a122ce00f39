"""The kernel plans on disk: one file per CPU (model name and flags) and torch version, an entry per weight
shape, dtype, thread count and copies allowed (kernels.Plan). What cannot be read, or was made for another
machine, is ignored with a one-line note and made anew; what is missing is timed (kernels.measure) and saved.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import platform
import sys
import threading

import torch

from . import kernels

VERSION = 1  # of the file and of what a path means: a new one makes every table anew


def machine() -> dict:
    """What a table is valid for: the CPU's model name and flags, the architecture, torch's version."""
    name, flags = platform.processor() or platform.machine(), ""
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and name in ("", platform.processor(), platform.machine()):
                name = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = value.strip()
    return {"cpu": name, "arch": platform.machine(), "flags": hashlib.sha256(flags.encode()).hexdigest()[:16],
            "torch": torch.__version__, "version": VERSION}


def _valid(entry) -> bool:
    if not isinstance(entry, str):
        return False
    name, _, rows = entry.partition("@")
    return name in kernels.PATHS and (not rows or rows.isdigit() and int(rows) in kernels.BUCKETS)


def table_path(key: dict | None = None) -> pathlib.Path:
    from .embedded import cache_dir

    key = key or machine()
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"{digest}.json"


def entry_key(shape: str, threads: int, copies: int) -> str:
    """A plan's name in the table: the weight's shape (kernels.shape_of), the thread count, the copies it may keep."""
    kept = {0: " nocopy", 1: " onecopy"}.get(min(copies, 2), "")
    return f"{shape} {threads}t{kept}"


def note(message: str) -> None:
    print(f"specviz: {message}", file=sys.stderr, flush=True)


class Table:
    """Plans by entry_key, read from and written to one file (table_path); what cannot be read is
    ignored with a one-line note and made anew."""

    def __init__(self, path: pathlib.Path | None = None, key: dict | None = None):
        self.key = key or machine()
        self.path = path or table_path(self.key)
        self.plans: dict[str, kernels.Plan] = {}
        self.lock = threading.Lock()
        self._read()

    def _read(self) -> None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return
        except OSError as e:
            note(f"ignoring the kernel table {self.path} ({e.strerror}); timing the kernels again")
            return
        why = self._load(text)
        if why:
            note(f"ignoring the kernel table {self.path} ({why}); timing the kernels again")
            self.plans = {}

    def _load(self, text: str) -> str | None:
        try:
            doc = json.loads(text)
        except ValueError:
            return "not JSON: cut short or overwritten"
        if not isinstance(doc, dict) or not isinstance(doc.get("plans"), dict):
            return "not a kernel table"
        if doc.get("machine") != self.key:
            return "made for another CPU or torch version" if isinstance(doc.get("machine"), dict) else "no machine"
        for name, entry in doc["plans"].items():
            paths, ms = (entry.get("paths"), entry.get("ms")) if isinstance(entry, dict) else (None, None)
            if not (isinstance(paths, list) and len(paths) == len(kernels.BUCKETS) and all(_valid(p) for p in paths)
                    and isinstance(ms, dict)):
                return f"its entry {name!r} is malformed"
            self.plans[name] = kernels.Plan(tuple(paths), ms)
        return None

    def save(self) -> None:
        doc = {"machine": self.key, "buckets": list(kernels.BUCKETS),
               "plans": {k: {"paths": list(p.paths), "ms": p.ms} for k, p in sorted(self.plans.items())}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(doc, indent=1))
            os.replace(tmp, self.path)
        except OSError as e:  # a read-only home: the table lives for this process only
            note(f"could not save the kernel table to {self.path} ({e.strerror})")

    @contextlib.contextmanager
    def exclusive(self):
        """This process's and every other's measuring of this machine's table, one at a time (two test
        workers, or the app and a bench, would otherwise time the kernels against each other)."""
        with self.lock:
            handle = None
            with contextlib.suppress(OSError, ImportError):
                import fcntl

                self.path.parent.mkdir(parents=True, exist_ok=True)
                handle = open(self.path.with_suffix(".lock"), "w")
                fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                if handle is not None:
                    handle.close()

    def plans_for(self, items, threads: int, copies: int, say=None) -> dict[str, kernels.Plan]:
        """{shape: Plan} at `threads` for the items' weight shapes (packing's kernels: .weight, .bias and
        .copies, in a forward's order), timed now where neither this process nor the file has them, then saved."""
        keys = {kernels.shape_of(it.weight) for it in items}

        def name(k):
            return entry_key(k, threads, copies)
        if any(name(k) not in self.plans for k in keys):
            with self.exclusive():
                self.plans = {}
                self._read()  # another process may have measured them meanwhile
                if any(name(k) not in self.plans for k in keys):
                    dtype = items[0].weight.dtype
                    for k, plan in kernels.measure(items, kernels.candidates(dtype, copies), say).items():
                        self.plans.setdefault(name(k), plan)
                    self.save()
        return {k: self.plans[name(k)] for k in keys}


_table: Table | None = None
_table_guard = threading.Lock()


def table() -> Table:
    """This machine's table (read once per process)."""
    global _table
    with _table_guard:
        if _table is None:
            _table = Table()
        return _table


def reset() -> None:
    """Forget the table read (the tests point SPECVIZ_CACHE elsewhere)."""
    global _table
    with _table_guard:
        _table = None
