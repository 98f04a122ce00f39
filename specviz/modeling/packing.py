"""Fast CPU linears for the few-row multiplies of decoding and verifying (oneDNN).

A decode step multiplies one row by every weight matrix, a verify step 2-17 rows. MKL's
sgemm (F.linear's path on x86 CPUs) is poor at exactly these shapes: below 4 rows it runs
one GEMV per row that streams a wide weight at half speed, and from 4 rows a GEMM kernel
that costs 2-3x the one-row time. oneDNN's matmul (`torch.ops.mkldnn._linear_pointwise`,
the op inductor emits for a CPU linear) reads the weight where it lies, with no copy, and
its cost barely grows with rows. Measured on this project's 2-core CPU (AMD EPYC, weights
out of cache, median): the 49152 x 576 LM head 11.2 / 19.0 / 21.6 ms for 1 / 5 / 9 rows
through F.linear (5.7 / 17.8 / 19.0 with MKL's packed copies), 4.8 / 7.1 / 7.8 ms here; the
embedded model's forward over 1 / 5 / 9 tokens 45 / 73 / 85 ms (MKL, packed) -> ~40 / 50 / 55
ms. Verifying 5 tokens went from 1.6x to ~1.25x a one-token step: that ratio decides
whether a draft pays.

q/k/v, and gate/up, read the same input: `pack(model)` concatenates each group's weights
once (a copy, ~0.3x the decoder's weights; only while it fits GROUP_BUDGET and an eighth of
the RAM) so each group is one multiply. A copy is remade when a weight changes in place.

The fast op is used for float32 CPU weights of a megabyte or more when no gradient is
wanted and autocast is off; elsewhere (training, CUDA, MPS, half precision) F.linear. It is
used on x86-64 CPUs only, where it was measured, and checked once against F.linear (left
unused if it is missing or disagrees); SPECVIZ_PACK=0 turns it off.

Trained drafter heads beside an fp32 CPU target compute in bf16 where the CPU multiplies bf16
in hardware (`draft_dtype`): a draft step is a few small multiplies whose time is reading
their weights, so half the bytes is most of half the time. Only drafts can change (at near
ties); the target verifies in fp32, so the output cannot.
"""
from __future__ import annotations

import functools
import os
import pathlib
import platform
import weakref

import torch
import torch.nn.functional as F
from torch import nn

GROUP_BUDGET = 2 << 30  # bytes of concatenated q/k/v and gate/up copies at most, per model
# oneDNN's call costs ~15 us more than F.linear's: weights under ~1 MB (in cache, a few us
# of work) keep F.linear. 576 x 576 and up are faster here, and tiny test models stay quick.
MIN_WEIGHT = 1 << 18  # elements
X86 = ("x86_64", "amd64", "i686", "x86")
_packed: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()
_works: bool | None = None  # does oneDNN's linear reproduce F.linear here? (checked once)


def _memory() -> int:
    """Bytes of RAM on this machine (a large number where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _check() -> bool:
    # Measured on x86-64 only; on ARM (Apple silicon, Graviton) F.linear's BLAS is the known path.
    if platform.machine().lower() not in X86 or not torch.backends.mkldnn.is_available():
        return False
    try:
        g = torch.Generator().manual_seed(0)
        w, b = torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
        for rows in (1, 5, 17):
            x = torch.randn(rows, 24, generator=g)
            with torch.no_grad():
                if not torch.allclose(_onednn(x, w, b), F.linear(x, w, b), rtol=1e-4, atol=1e-4):
                    return False
        return True
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def available() -> bool:
    """Is oneDNN's linear present, reproducing F.linear, and not switched off?"""
    global _works
    if os.environ.get("SPECVIZ_PACK", "1") == "0":
        return False
    if _works is None:
        _works = _check()
    return _works


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX or AVX512-BF16): without it bf16 is
    emulated and slower than fp32, so it is never assumed (a free Space's CPU may lack it).
    Read once: every drafter built asks, and /proc/cpuinfo grows with the core count."""
    try:
        flags = pathlib.Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def draft_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype a trained drafter head computes in beside a target whose weights are like
    `weight`: bf16 beside an fp32 target on a CPU with native bf16 (the head's and the LM-head
    rows' bytes halve; measured on the shipped EAGLE head, tree of 4, 2 threads: 10.6 -> 8.9
    ms of drafting a step), else the target's own dtype. SPECVIZ_DRAFT_BF16=0 keeps fp32."""
    if (weight.is_cpu and weight.dtype is torch.float32 and os.environ.get("SPECVIZ_DRAFT_BF16", "1") != "0"
            and native_bf16()):
        return torch.bfloat16
    return weight.dtype


def _fast(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """May this multiply take oneDNN's linear? fp32 CPU, a weight of MIN_WEIGHT elements or
    more, no gradient wanted, no autocast."""
    # (called for every multiply of a forward: the cheap attribute checks come first)
    return (x.is_cpu and weight.is_cpu and x.dtype is torch.float32 and weight.dtype is torch.float32
            and weight.dim() == 2 and weight.numel() >= MIN_WEIGHT and x.dim() >= 1
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and not torch.is_autocast_enabled("cpu") and available())


def dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), through oneDNN where that is the faster path."""
    if _fast(x, weight) and (bias is None or bias.dtype == torch.float32):
        return _onednn(x, weight, bias)
    return F.linear(x, weight, bias)


def linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """module(x), through `dense`: for the drafters' layers."""
    return dense(x, module.weight, module.bias)


class _Group:
    """Linear layers that read the same input, multiplied as one concatenated weight."""

    def __init__(self, modules: tuple):
        self.modules = modules
        self.sizes = [m.weight.shape[0] for m in modules]
        self._make()

    def _stamps(self):
        # (inference tensors keep no version counter; nothing outside inference mode may change them)
        return tuple((m.weight.data_ptr(), 0 if m.weight.is_inference() else m.weight._version)
                     for m in self.modules)

    def _make(self):
        with torch.no_grad():
            w = self.modules[0].weight
            self.weight = torch.cat([m.weight.detach() for m in self.modules])
            biases = [m.bias for m in self.modules]
            self.bias = None if all(b is None for b in biases) else torch.cat(
                [b.detach() if b is not None else w.new_zeros(n) for b, n in zip(biases, self.sizes)])
        self.stamps = self._stamps()

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self._stamps() != self.stamps:  # a weight was replaced or changed in place: remake
            self._make()
        return list(_onednn(x, self.weight, self.bias).split(self.sizes, dim=-1))


def _groups(model) -> list[tuple]:
    """The decoder's linears that share an input, a tuple per group."""
    groups = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        groups += [(attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)]
    return groups


def pack(model) -> dict:
    """{tuple of linears: _Group} for `model`'s decoder, made once per model; empty where the
    fast op is not used or the copies would not fit."""
    if model in _packed:
        return _packed[model]
    table: dict = {}
    p = model.get_output_embeddings().weight
    if available() and p.device.type == "cpu" and p.dtype == torch.float32:
        groups = _groups(model)
        if 4 * sum(m.weight.numel() for g in groups for m in g) <= min(GROUP_BUDGET, _memory() // 8):
            table = {g: _Group(g) for g in groups}
    _packed[model] = table
    return table


def linears(modules: tuple, x: torch.Tensor, table: dict | None) -> list[torch.Tensor]:
    """[m(x) for m in modules]: one multiply by the group's concatenated weight where `table`
    (pack's) holds one and the fast op applies, else each module through `dense`; with
    table None (a torch.compile'd stack) the modules themselves."""
    if table is None or not _fast(x, modules[0].weight):
        return [m(x) for m in modules]
    entry = table.get(modules) if table else None
    if entry is not None:
        return entry(x)
    return [dense(x, m.weight, m.bias) for m in modules]
