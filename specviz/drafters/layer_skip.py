"""Self-speculation: the target drafts for itself with some of its decoder layers skipped.

No training and no second model: the drafter is a shallow view of the target that shares
its embeddings, kept layers, final norm and LM head (Zhang et al. 2023, "Draft & Verify").
It keeps a KV cache of its own for the kept layers, so it is a DraftModel in every other way.

Works for decoders laid out as `model.<base>.layers` (Llama, Mistral, Qwen, Gemma, ...).
Layer 0 is always kept: the cache measures its length on the first layer.
"""
from __future__ import annotations

import copy
from typing import Sequence

from torch import nn

from ..core.errors import SpecvizError
from .draft_model import DraftModel


def decoder_layers(model) -> nn.ModuleList:
    base = getattr(model, model.base_model_prefix, None)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise SpecvizError(f"{type(model).__name__} has no `{model.base_model_prefix}.layers` stack of decoder layers, "
                           "which layer skipping drops from: use prompt lookup, suffix decoding or a draft model")
    return layers


def skip_layers(model, keep: Sequence[int]):
    """A view of `model` that runs only the decoder layers in `keep` (shares all weights)."""
    layers = decoder_layers(model)
    keep = sorted(set(keep))
    if not keep or keep[0] != 0 or keep[-1] >= len(layers):
        raise SpecvizError(f"layers to keep must include 0 and lie in 0..{len(layers) - 1}, got "
                           f"{len(keep)} layers from {keep[0] if keep else '-'} to {keep[-1] if keep else '-'}")
    base = getattr(model, model.base_model_prefix)
    view_base = copy.copy(base)
    view_base._modules = dict(base._modules)  # new module table: the target is untouched
    view_base.layers = nn.ModuleList([layers[i] for i in keep])
    view = copy.copy(model)
    view._modules = dict(model._modules)
    setattr(view, model.base_model_prefix, view_base)
    view.kept_layers = tuple(keep)
    return view


def default_layers(n: int) -> list[int]:
    """Keep the first and last quarter, every other layer in between (about 60%)."""
    edge = max(1, n // 4)
    middle = range(edge, n - edge, 2)
    return sorted({*range(edge), *middle, *range(n - edge, n)})


def parse_layers(text: str, n: int) -> list[int]:
    """'0-9,12,20-29' -> [0..9, 12, 20..29], each layer in 0..n-1."""
    keep = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            lo, hi = int(lo), int(hi or lo)
            if not 0 <= lo <= hi < n:  # checked before expanding: '0-10**12' must not build a list
                raise SpecvizError(f"layer range {part.strip()!r} is outside this target's {n} layers "
                                   f"(0-{n - 1}), or runs backwards")
            keep.extend(range(lo, hi + 1))
    except ValueError:
        raise SpecvizError(f"layer list {text!r} is not like '0-9,12,20-29'") from None
    return keep


class LayerSkip(DraftModel):
    def __init__(self, target, keep: Sequence[int] | None = None):
        n = len(decoder_layers(target))
        keep = default_layers(n) if keep is None else keep
        view = skip_layers(target, keep)
        super().__init__(view, name=f"layer skip ({len(view.kept_layers)}/{n} layers)")
