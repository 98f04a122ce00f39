"""Self-speculation: the target drafts for itself with some of its decoder layers skipped.

No training and no second model: the drafter is a shallow view of the target that shares
its embeddings, kept layers, final norm and LM head (Zhang et al. 2023, "Draft & Verify").
It keeps a KV cache of its own for the kept layers, so it is a DraftModel in every other way.

Works on any stack modeling/stack.py finds (`model.layers`, `transformer.h`, `transformer.blocks`,
`model.decoder.layers`, ...). Layer 0 is always kept: the cache measures its length on the first
layer. A family whose layers differ by kind (sliding and full attention) hands each layer the mask
of the kind at its place in the list, so the kept layers must keep their kinds in their new places.
"""
from __future__ import annotations

import copy
from typing import Sequence

from torch import nn

from ..core.errors import SpecvizError
from ..modeling import stack
from .draft_model import DraftModel


def decoder_layers(model) -> nn.ModuleList:
    found = stack.find(model)
    if found is None:
        raise SpecvizError(f"{type(model).__name__} has no list of decoder layers under a name specviz knows "
                           f"({', '.join(stack.LAYER_LISTS)}), which layer skipping drops from: use prompt lookup, "
                           "suffix decoding or a draft model")
    return found.layers


def _kinds_problem(model, path: str, keep: list[int]) -> str | None:
    """Why dropping layers would hand a kept layer another kind's mask, or None."""
    kinds = getattr(model.config.get_text_config(), "layer_types", None)
    if not isinstance(kinds, (list, tuple)) or len(kinds) <= keep[-1]:
        return None
    moved = [(i, j) for j, i in enumerate(keep) if kinds[i] != kinds[j]]
    if not moved:
        return None
    i, j = moved[0]
    return (f"{type(model).__name__}'s layers in `{path}` are not all alike (config.layer_types mixes "
            f"{', '.join(sorted(set(kinds)))}), and with these layers kept layer {i} ({kinds[i]}) would run as "
            f"layer {j} ({kinds[j]}): keep layers whose kinds stay in place, or use another drafter")


def skip_layers(model, keep: Sequence[int]):
    """A view of `model` that runs only the decoder layers in `keep` (shares all weights)."""
    found = stack.find(model)
    layers = decoder_layers(model)
    keep = sorted(set(keep))
    if not keep or keep[0] != 0 or keep[-1] >= len(layers):
        raise SpecvizError(f"layers to keep must include 0 and lie in 0..{len(layers) - 1}, got "
                           f"{len(keep)} layers from {keep[0] if keep else '-'} to {keep[-1] if keep else '-'}")
    problem = _kinds_problem(model, found.path, keep)
    if problem:
        raise SpecvizError(problem)
    # Copy every module on the way down to the list, each with a new module table, so the view
    # holds its own shorter list and the target is untouched.
    *parents, name = found.path.split(".")
    view = copy.copy(model)
    view._modules = dict(model._modules)
    node = view
    for part in parents:
        child = copy.copy(node._modules[part])
        child._modules = dict(child._modules)
        node._modules[part] = child
        node = child
    node._modules[name] = nn.ModuleList([layers[i] for i in keep])
    view.kept_layers = tuple(keep)
    return view


def default_layers(n: int, kinds: Sequence[str] | None = None) -> list[int]:
    """Keep the first and last quarter, every other layer in between (about 60%); where layers
    differ by kind, only those whose kind matches the place they would take. A stack too shallow for
    that rule (2 layers) keeps its first layer alone: keeping every layer would draft with the target
    itself, at twice its cost."""
    edge = max(1, n // 4)
    middle = range(edge, n - edge, 2)
    keep = sorted({*range(edge), *middle, *range(n - edge, n)})
    if len(keep) == n:
        keep = keep[:1]
    if not kinds or len(kinds) < n:
        return keep
    placed: list[int] = []
    for i in keep:
        if kinds[i] == kinds[len(placed)]:
            placed.append(i)
    return placed


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
        if n < 2:
            raise SpecvizError(f"{type(target).__name__} has one decoder layer, so layer skipping has none to drop: "
                               "use prompt lookup, suffix decoding or a draft model")
        if keep is None:
            keep = default_layers(n, getattr(target.config.get_text_config(), "layer_types", None))
        view = skip_layers(target, keep)
        super().__init__(view, name=f"layer skip ({len(view.kept_layers)}/{n} layers)")
