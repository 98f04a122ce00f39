"""The CPU linears of decoding and verifying, each on the kernel measured fastest for it here.

Every linear of a megabyte or more (fp32, bf16 or fp16, CPU, no gradient wanted, no autocast) is a
`Kernel`: its weight, the copies its chosen paths multiply by, and a plan per torch thread count
saying which path (kernels.PATHS) takes each row bucket. The plans come from kernel_table.Table, which
times the paths on this machine the first time a shape is met and keeps the result on disk. Weights
under MIN_WEIGHT keep F.linear: a few microseconds of work, where any other call costs more.

q/k/v, and gate/up, read the same input: `pack(model)` concatenates each group's weights once (a
copy) so each group is one multiply; with the copies the plans ask for (oneDNN's packed layout,
MKL's), they take at most COPY_BUDGET and an eighth of the RAM, else fewer kinds of copies are timed.
A copy is remade when a weight changes in place or is replaced.

Trained drafter heads beside an fp32 CPU target compute in bf16 where this CPU's bf16 multiply was
measured faster than its fp32 one (`draft_dtype`): a draft step is a few small multiplies whose time
is reading their weights. Only drafts can change (at near ties); the target verifies in its own dtype.
"""
from __future__ import annotations

import functools
import os
import threading
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from . import kernel_table, kernels

COPY_BUDGET = 2 << 30  # bytes of concatenated groups and kernel copies at most, per model
MIN_WEIGHT = 1 << 18  # elements; smaller weights keep F.linear
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_packed: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()
_loose: dict[int, "Kernel"] = {}  # kernels of weights met outside a packed model (drafter layers), by id
_guard = threading.RLock()
_noted: set[int] = set()  # thread counts a lone weight's timing was said for


def _memory() -> int:
    """Bytes of RAM on this machine (a large number where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def available() -> bool:
    """May linears leave F.linear at all (SPECVIZ_PACK=0 says no)?"""
    return kernels.forced() != "linear"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Kernel:
    """F.linear(x, weight, bias) for one weight, or for several that read the same input (`modules`,
    multiplied as one concatenated weight and split), on the path its plan chose for x's rows."""

    def __init__(self, modules: tuple = (), weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                 copies: int = 2):
        self.modules, self.copies_allowed = modules, copies
        self.plans: dict[int, tuple[tuple[str, int], ...]] = {}  # by torch thread count: (path, pad to) a bucket
        self.copies: dict[str, torch.Tensor] = {}
        self.group: list[Kernel] = [self]  # the kernels measured together (a model's), this one among them
        if modules:
            self._make()
        else:
            self.weight, self.bias, self.sizes, self.stamps = weight, bias, [weight.shape[0]], ()

    def _stamps(self):
        # (inference tensors keep no version counter; nothing outside inference mode may change them)
        return tuple((m.weight.data_ptr(), 0 if m.weight.is_inference() else m.weight._version)
                     for m in self.modules)

    def _make(self):
        ms = self.modules
        with torch.no_grad():
            w = ms[0].weight
            self.weight = w.detach() if len(ms) == 1 else torch.cat([m.weight.detach() for m in ms])
            biases = [m.bias for m in ms]
            self.bias = None if all(b is None for b in biases) else torch.cat(
                [b.detach() if b is not None else w.new_zeros(m.weight.shape[0]) for b, m in zip(biases, ms)])
        self.sizes = [m.weight.shape[0] for m in ms]
        self.stamps = self._stamps()
        self.copies = {}
        for plan in self.plans.values():
            self._copy([name for name, _ in plan])

    def _copy(self, plan) -> None:
        with torch.no_grad():
            for name in {kernels.parse(e)[0] for e in plan} & set(kernels.COPY):
                if name not in self.copies:
                    self.copies[name] = kernels.PATHS[name].prepare(self.weight)

    def adopt(self, threads: int, paths: tuple[str, ...]) -> None:
        self.plans[threads] = tuple(kernels.parse(e) for e in paths)
        self._copy(paths)

    def path(self, rows: int) -> tuple[str, int]:
        """(path name, rows to pad to) for a multiply of `rows` rows."""
        name = kernels.forced()
        if name is not None:
            return name, 0
        threads = torch.get_num_threads()
        plan = self.plans.get(threads)
        if plan is None:
            plan = _measure(self.group, threads)
        return plan[kernels.bucket(rows)]

    def joined(self, x: torch.Tensor) -> torch.Tensor:
        """x times the whole (concatenated) weight: the group's outputs side by side."""
        if self.modules and self._stamps() != self.stamps:  # a weight was replaced or changed in place
            self._make()
        rows = x.numel() // x.shape[-1]
        name, pad = self.path(rows)
        path = kernels.PATHS[name]
        if path.rows is not None and rows != path.rows:
            path = kernels.PATHS["packed" if "packed" in self.copies else "linear"]  # (a forced one-row path)
        copy = self.copies.get(path.name)
        if path.prepare is not None and copy is None:
            self._copy((path.name,))
            copy = self.copies[path.name]
        if pad > rows:  # the rows a faster kernel wants, padded with zeros and cut off again
            flat = F.pad(x.reshape(rows, -1), (0, 0, 0, pad - rows))
            return path.run(flat, copy, self.weight, self.bias)[:rows].reshape(*x.shape[:-1], -1)
        return path.run(x, copy, self.weight, self.bias)

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = self.joined(x)
        return list(out.split(self.sizes, dim=-1)) if len(self.sizes) > 1 else [out]


def _measure(group: list[Kernel], threads: int) -> tuple[tuple[str, int], ...]:
    """Give every kernel of `group` (a model's, in its forward's order) its plan at `threads`, timed
    where the table has none (a few seconds, once per machine); group[0]'s plan."""
    with _guard:
        table = kernel_table.table()
        todo = [k for k in group if threads not in k.plans]
        by_copies: dict[int, list[Kernel]] = {}
        for k in todo:
            by_copies.setdefault(k.copies_allowed, []).append(k)
        for copies, ks in by_copies.items():
            shapes = {kernels.shape_of(k.weight) for k in ks}
            missing = [s for s in shapes if kernel_table.entry_key(s, threads, copies) not in table.plans]
            if missing and (len(group) > 1 or threads not in _noted):  # drafters' layers: one line a thread count
                _noted.add(threads)
                shapes_said = f"{len(missing)} weight shape{'s' * (len(missing) > 1)}"
                kernel_table.note(f"timing this CPU's kernels for {shapes_said} "
                             f"at {threads} thread{'s' * (threads > 1)}, once per machine (the table: {table.path})")
            plans = table.plans_for(ks, threads, copies)
            for k in ks:
                k.adopt(threads, plans[kernels.shape_of(k.weight)].paths)
        return group[0].plans[threads]


class _Probe:
    """A weight timed on its own (kernels.measure's item)."""

    def __init__(self, weight):
        self.weight, self.bias, self.copies = weight, None, {}


def native_bf16() -> bool:
    """Does this CPU multiply bf16 faster than fp32 (hardware bf16: AMX or AVX512-BF16)? Measured, not
    read from a flag list: a one- and a nine-row multiply of a 4096 x 1024 weight on the fastest
    path of each dtype. Without hardware bf16 it is emulated and slower, so it is never assumed."""
    return _bf16_measured(torch.get_num_threads())


@functools.cache
def _bf16_measured(threads: int) -> bool:
    if not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4096, 1024, generator=g) / 32
    table = kernel_table.table()
    try:
        fp32, = table.plans_for([_Probe(w)], threads, 1).values()
        bf16, = table.plans_for([_Probe(w.bfloat16())], threads, 1).values()
    except (RuntimeError, NotImplementedError):
        return False

    def best(plan, i):
        return min((ms[i] for ms in plan.ms.values() if ms[i] is not None), default=float("inf"))

    one, nine = kernels.bucket(1), kernels.bucket(9)
    return best(bf16, one) < 0.9 * best(fp32, one) and best(bf16, nine) < 0.9 * best(fp32, nine)


def draft_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype a trained drafter head computes in beside a target whose weights are like `weight`:
    bf16 beside an fp32 target where this CPU's bf16 multiply is the faster (the head's and the
    LM-head rows' bytes halve), else the target's own dtype. SPECVIZ_DRAFT_BF16=0 keeps fp32."""
    if (weight.is_cpu and weight.dtype is torch.float32 and os.environ.get("SPECVIZ_DRAFT_BF16", "1") != "0"
            and native_bf16()):
        return torch.bfloat16
    return weight.dtype


def _fast(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """May this multiply leave F.linear? A CPU float weight of MIN_WEIGHT elements or more (any size
    with SPECVIZ_PACK naming a path), x of its dtype, no gradient wanted, no autocast."""
    # (called for every multiply of a forward: the cheap attribute checks come first)
    return (x.is_cpu and weight.is_cpu and x.dtype is weight.dtype and weight.dtype in DTYPES and weight.dim() == 2
            and x.dim() >= 1 and x.numel() > 0
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and not torch.is_autocast_enabled("cpu")
            and (weight.numel() >= MIN_WEIGHT or kernels.forced() not in (None, "linear")) and available())


def dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), on the path measured fastest here for its shape and rows."""
    if not _fast(x, weight) or (bias is not None and bias.dtype is not weight.dtype):
        return F.linear(x, weight, bias)
    with _guard:
        k = _loose.get(id(weight))
        if k is None or k.weight is not weight or k.bias is not bias:
            k = _loose[id(weight)] = Kernel(weight=weight, bias=bias, copies=_copies_allowed(_nbytes(weight)))
            weakref.finalize(weight, _loose.pop, id(weight), None)
    return k(x)[0]


def linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """module(x), through `dense`: for the drafters' layers."""
    return dense(x, module.weight, module.bias)


def _copies_allowed(copy_bytes: int, fixed: int = 0) -> int:
    """How many kinds of copies (0, 1 or 2) of `copy_bytes` fit beside `fixed` bytes of groups."""
    budget = min(COPY_BUDGET, _memory() // 8)
    return next((n for n in (2, 1) if fixed + n * copy_bytes <= budget), 0)


def _groups(model) -> list[tuple]:
    """The decoder's linears, those that share an input in one tuple, and the LM head."""
    groups = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        groups += [(attn.q_proj, attn.k_proj, attn.v_proj), (attn.o_proj,), (mlp.gate_proj, mlp.up_proj),
                   (mlp.down_proj,)]
    return groups + [(model.get_output_embeddings(),)]


def pack(model) -> dict:
    """{tuple of linears: Kernel} for `model`'s decoder and head, made once per model; empty where
    every multiply keeps F.linear (SPECVIZ_PACK=0, a GPU, integer weights) or the grouped copies would
    not fit."""
    with _guard:
        if model in _packed:
            return _packed[model]
        table: dict = {}
        head = model.get_output_embeddings().weight
        if available() and head.device.type == "cpu" and head.dtype in DTYPES:
            groups = _groups(model)
            grouped = sum(_nbytes(m.weight) for g in groups if len(g) > 1 for m in g)
            weights = sum(_nbytes(m.weight) for g in groups for m in g)
            if grouped <= min(COPY_BUDGET, _memory() // 8):
                copies = _copies_allowed(weights, grouped)
                table = {g: Kernel(g, copies=copies) for g in groups}
                members = list(table.values())
                for k in members:
                    k.group = members
        _packed[model] = table
        return table


def joined(modules: tuple, x: torch.Tensor, table: dict | None) -> torch.Tensor:
    """torch.cat([m(x) for m in modules], -1), as one multiply where `table` holds the group's kernel."""
    entry = table.get(modules) if table else None
    if entry is not None and _fast(x, modules[0].weight):
        return entry.joined(x)
    return torch.cat(linears(modules, x, table), dim=-1)


def linears(modules: tuple, x: torch.Tensor, table: dict | None) -> list[torch.Tensor]:
    """[m(x) for m in modules]: one multiply by the group's kernel where `table` (pack's) holds one and
    the multiply may leave F.linear, else each module through `dense`; with table None (a
    torch.compile'd stack) the modules themselves."""
    if table is None or not _fast(x, modules[0].weight):
        return [m(x) for m in modules]
    entry = table.get(modules) if table else None
    if entry is not None:
        return entry(x)
    return [dense(x, m.weight, m.bias) for m in modules]


def chosen(model=None) -> list[dict]:
    """The plans this process's linears (`model`'s and the drafters' layers met so far) use at torch's
    thread count now: kernels.summary's rows, for the bench's report."""
    threads = torch.get_num_threads()
    found = [*(pack(model).values() if model is not None else ()), *_loose.values()]
    keys = {kernel_table.entry_key(kernels.shape_of(k.weight), threads, k.copies_allowed) for k in found}
    table = kernel_table.table()
    return kernels.summary({k: table.plans[k] for k in keys if k in table.plans})


def pass_costs(shapes: list[str], dtypes=("float32", "bfloat16")) -> dict[str, tuple[float, float]]:
    """{dtype: (ms of a one-token pass's multiplies, ms of a nine-token pass's)} read from this machine's kernel
    table for a pass over `shapes` ("960x576", one per linear of a forward), for each dtype whose every shape the
    table holds (at torch's thread count now, else at another it has): what each precision costs here, before
    a model is loaded in it. Never measures."""
    plans = kernel_table.table().plans
    counts = sorted({int(name.split()[2][:-1]) for name in plans if len(name.split()) > 2},
                    key=lambda t: (t != torch.get_num_threads(), t))
    out = {}
    for dtype in dtypes:
        for threads in counts:
            found = []
            for shape in shapes:
                plan = next((plans[k] for c in (2, 1, 0)
                             if (k := kernel_table.entry_key(f"{shape} {dtype}", threads, c)) in plans), None)
                if plan is None:
                    break
                found.append(plan)
            else:
                one, nine = kernels.bucket(1), kernels.bucket(9)
                cost = [sum(kernels.ms_of(p, i) or 0.0 for p in found) for i in (one, nine)]
                out[dtype] = (cost[0], cost[1])
                break
    return out
