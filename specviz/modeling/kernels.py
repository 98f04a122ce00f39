"""Which kernel multiplies a linear layer, chosen by timing every kernel on the CPU that runs it.

A decode step multiplies one row by every weight, a verify step a few rows, a prefill many. The
fastest of torch's CPU kernels for that depends on the weight's shape, the row count, the dtype
and the CPU (docs/performance.md has what each machine measured), so nothing here assumes one:
the first time a shape is met at a thread count, every path below is timed on the model's own
weights of that shape at each row bucket, checked against F.linear, and the fastest that agrees
is kept. kernel_table.py keeps the plans on disk, keyed by the CPU (model name and flags) and torch's
version, an entry per shape, dtype and thread count, so the next load costs nothing.

The paths (`PATHS`):
- linear: F.linear (MKL's GEMV/GEMM for fp32 on x86; oneDNN for bf16).
- onednn: oneDNN's matmul on the weight where it lies (`_linear_pointwise`, inductor's CPU linear).
- packed: oneDNN's matmul on a copy of the weight reordered once into its blocked layout (what
  inductor's weight freezing does; the AMX / AVX512-BF16 kernels for bf16 read this layout).
- mkl: MKL's packed GEMM on a copy packed for one row (fp32, one-row multiplies only).
SPECVIZ_PACK=0 keeps F.linear everywhere; SPECVIZ_PACK=<path> forces one path on every float CPU
linear, whatever its size (how the tests run each path through a whole model).
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

BUCKETS = (1, 2, 3, 5, 9, 17, 33, 64)  # rows timed; a multiply of r rows takes the first bucket >= r
_BUCKET_OF = [next((i for i, b in enumerate(BUCKETS) if b >= r), len(BUCKETS) - 1) for r in range(BUCKETS[-1] + 1)]
REPEATS = 2  # timed passes per path and bucket; the fastest is kept (noise only ever adds time)
FLUSH_BYTES = 64 << 20  # weights are timed out of cache: cycled through when they hold this much, else flushed
PASS_BYTES = 64 << 20  # a timing pass multiplies about this many bytes of weights (a large model: its first layers)
# Agreement with F.linear, relative to the output's largest value: fp32 kernels differ in summation
# order (~1e-6 here), half-precision ones in one rounding of the output.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}
COPY = ("packed", "mkl")  # the paths that multiply by a copy of the weight
PAD_MS = 0.005  # what padding a multiply's rows with zeros costs (one small op), charged when comparing
PAD_MARGIN = 0.05  # and a padded kernel must win by this much more: within the timings' noise, the rows' own


def bucket(rows: int) -> int:
    """The index in BUCKETS whose path a multiply of `rows` rows takes."""
    return _BUCKET_OF[rows] if rows < len(_BUCKET_OF) else len(BUCKETS) - 1


@dataclass(frozen=True)
class Path:
    """One way to compute F.linear(x, w, b): `prepare(w)` makes the copy it multiplies by (None: the
    weight itself), `run(x, copy, w, b)` multiplies; `rows` limits it to one bucket's row count."""

    name: str
    dtypes: tuple
    run: Callable
    prepare: Callable | None = None
    rows: int | None = None


def _onednn(x, copy, w, b):
    return torch.ops.mkldnn._linear_pointwise(x, w if copy is None else copy, b, "none", [], "")


def _mkl(x, copy, w, b):
    return torch.ops.mkl._mkl_linear(x.reshape(1, -1), copy, w, b, 1).reshape(*x.shape[:-1], -1)


HALF = (torch.bfloat16, torch.float16)
PATHS = {p.name: p for p in (
    Path("linear", (torch.float32, *HALF), lambda x, copy, w, b: F.linear(x, w, b)),
    Path("onednn", (torch.float32, *HALF), _onednn),
    Path("packed", (torch.float32, *HALF), _onednn, lambda w: torch.ops.mkldnn._reorder_linear_weight(w)),
    Path("mkl", (torch.float32,), _mkl, lambda w: torch.ops.mkl._mkl_reorder_linear_weight(w, 1), rows=1),
)}


def forced() -> str | None:
    """SPECVIZ_PACK's path, "linear" for 0, None when the table decides; an unknown name is refused."""
    value = os.environ.get("SPECVIZ_PACK", "").strip().lower()
    if value in ("", "1", "auto"):
        return None
    if value == "0":
        return "linear"
    if value not in PATHS:
        from ..core.errors import SpecvizError

        raise SpecvizError(f"SPECVIZ_PACK={value!r}: give 0, auto or one of {', '.join(PATHS)}")
    return value


@dataclass
class Plan:
    """A shape's chosen path for each bucket, and what each path measured (ms a multiply; None: not
    available, or disagreed with F.linear)."""

    paths: tuple[str, ...]
    ms: dict[str, list]

    def copies(self) -> set[str]:
        return {parse(p)[0] for p in self.paths} & set(COPY)


def candidates(dtype, copies: int, on_x86: bool | None = None) -> list[str]:
    """The paths worth timing for `dtype`, where `copies` copies of each weight may be kept (0: none;
    1: oneDNN's packed one; 2: MKL's one-row copy too). oneDNN and MKL are x86 libraries here;
    elsewhere (Apple silicon, Graviton) F.linear alone."""
    if on_x86 is None:
        on_x86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
    if not on_x86 or not torch.backends.mkldnn.is_available():
        return ["linear"]
    allowed = {0: (), 1: ("packed",), 2: COPY}[min(copies, 2)]
    return [n for n, p in PATHS.items() if dtype in p.dtypes and (n not in COPY or n in allowed)]


def _agrees(out: torch.Tensor, ref: torch.Tensor) -> bool:
    scale = ref.float().abs().max().item() + 1e-6
    return bool(torch.isfinite(out).all()) and (out.float() - ref.float()).abs().max().item() <= TOLERANCE.get(
        ref.dtype, 1e-5) * scale


def shape_of(weight: torch.Tensor) -> str:
    return f"{weight.shape[0]}x{weight.shape[1]} {str(weight.dtype).replace('torch.', '')}"


def measure(items, names: list[str], say: Callable[[str], None] | None = None) -> dict[str, Plan]:
    """Time each path in `names` on `items` (objects with .weight, .bias and a .copies dict, in the
    order a forward multiplies them) at every bucket; per weight shape, the fastest path that agrees
    with F.linear wins each bucket (F.linear where none does). Passes run over the weights in that
    order, so each is timed with the caches as a forward leaves them; the copies a winning path
    multiplies by are left in .copies, the rest dropped."""
    used = _sample(items)
    keys = [shape_of(it.weight) for it in used]
    first = {k: it for k, it in reversed(list(zip(keys, used)))}
    ms = {k: {n: [None] * len(BUCKETS) for n in names} for k in first}
    size = sum(it.weight.numel() * it.weight.element_size() for it in used)
    scratch = None if size >= FLUSH_BYTES else torch.ones(FLUSH_BYTES // 4)
    made: set[tuple[int, str]] = set()  # (item, path) copies made here
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for name in names:
            path = PATHS[name]
            try:
                for it in used:
                    if path.prepare and name not in it.copies:
                        it.copies[name] = path.prepare(it.weight)
                        made.add((id(it), name))
            except (RuntimeError, NotImplementedError):
                continue
            _time_buckets(path, first, used, keys, scratch, g, ms)
    plans = {}
    for k, by_path in ms.items():
        plans[k] = Plan(tuple(choose(by_path, i) for i in range(len(BUCKETS))), by_path)
        if say:
            say(f"{k}: " + ", ".join(f"{b} rows {p}" for b, p in zip(BUCKETS, plans[k].paths)))
    for it, k in zip(used, keys):
        for name in [n for n in it.copies if (id(it), n) in made and n not in plans[k].paths]:
            del it.copies[name]
    return plans


def _time_buckets(path: Path, first, used, keys, scratch, g, ms) -> None:
    """ms[shape][path.name][bucket]: a multiply's ms, None where the path disagrees with F.linear."""
    for i, rows in enumerate(BUCKETS):
        if path.rows is not None and rows != path.rows:
            continue
        xs = {k: torch.randn(rows, it.weight.shape[1], generator=g).to(it.weight.dtype) for k, it in first.items()}
        ok = {k: _works(path, xs[k], it) for k, it in first.items()}
        for k, seconds in _time(path, xs, used, keys, ok, scratch).items():
            ms[k][path.name][i] = seconds * 1e3


def choose(by_path: dict[str, list], i: int) -> str:
    """The winner of bucket i: the fastest path there, or a path at a larger bucket with the rows
    padded with zeros ("packed@5": oneDNN's one-row kernel can be slower than its five-row one, and a
    padded row is computed as a verify's rows are); F.linear where nothing was timed."""
    options = [(ms[j] * (1 + PAD_MARGIN) + PAD_MS if j != i else ms[j], n, j) for n, ms in by_path.items()
               for j in range(i, len(BUCKETS)) if ms[j] is not None and (j == i or PATHS[n].rows is None)]
    if not options:
        return "linear"
    _, name, j = min(options)
    return name if j == i else f"{name}@{BUCKETS[j]}"


def parse(entry: str) -> tuple[str, int]:
    """A plan's entry as (path name, rows to pad to; 0 for none)."""
    name, _, rows = entry.partition("@")
    return name, int(rows) if rows else 0


def _works(path: Path, x, item) -> bool:
    try:
        return _agrees(path.run(x, item.copies.get(path.name), item.weight, item.bias),
                       F.linear(x, item.weight, item.bias))
    except (RuntimeError, NotImplementedError):
        return False


def _sample(items):
    """The items a timing pass multiplies: in order until they hold PASS_BYTES (every weight of a
    small model; the first layers of a large one), then one of each shape not met yet (the LM head)."""
    out, size, seen = [], 0, set()
    for it in items:
        if size < PASS_BYTES or shape_of(it.weight) not in seen:
            out.append(it)
            seen.add(shape_of(it.weight))
            size += it.weight.numel() * it.weight.element_size()
    return out


def _time(path: Path, xs, used, keys, ok, scratch) -> dict[str, float]:
    """Seconds of one multiply per shape, the best of REPEATS passes over `used` (each call after a
    flush of the caches where the weights are too few to push each other out of them)."""
    for k, it in zip(keys, used):  # the first call makes the kernel (oneDNN's JIT, MKL's handles)
        if ok[k]:
            path.run(xs[k], it.copies.get(path.name), it.weight, it.bias)
    best: dict[str, float] = {}
    for _ in range(REPEATS):
        total: dict[str, list] = {}
        for k, it in zip(keys, used):
            if not ok[k]:
                continue
            copy, w, b, x = it.copies.get(path.name), it.weight, it.bias, xs[k]
            if scratch is not None:
                scratch.sum()
            t0 = time.perf_counter()
            path.run(x, copy, w, b)
            spent = total.setdefault(k, [0.0, 0])
            spent[0] += time.perf_counter() - t0
            spent[1] += 1
        for k, (seconds, n) in total.items():
            best[k] = min(best.get(k, float("inf")), seconds / n)
    return best


def bandwidth(passes: int = 9, size: int = 1 << 30) -> float:
    """Bytes per second this machine reads memory at with torch's threads: a sum over `size` bytes, the
    median of `passes` (the wall a one-token pass, which reads every weight once, runs into). The
    median, not the best: on a shared virtual machine single passes ran up to 1.7x the rest."""
    x = torch.ones(size // 4)
    seconds = []
    with torch.inference_mode():
        x.sum()
        for _ in range(passes):
            t0 = time.perf_counter()
            x.sum()
            seconds.append(time.perf_counter() - t0)
    return size / statistics.median(seconds)


def ms_of(plan: Plan, i: int) -> float | None:
    """What bucket i's chosen entry measured (at the bucket it pads to, where it pads)."""
    name, rows = parse(plan.paths[i])
    return plan.ms.get(name, [None] * len(BUCKETS))[bucket(rows) if rows else i]


def summary(plans: dict[str, Plan]) -> list[dict]:
    """The plans as rows for a report: the entry (shape, dtype, threads), then per bucket the chosen
    path and its ms."""
    return [{"entry": name, "buckets": list(BUCKETS), "paths": list(plan.paths),
             "ms": [ms_of(plan, i) for i in range(len(BUCKETS))]} for name, plan in sorted(plans.items())]
