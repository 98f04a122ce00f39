"""Turning the names given to `--drafters` into drafters.

    none         the speculative loop with nothing to propose (measures its overhead)
    pld          prompt lookup (n-grams 3..1 of the context)
    tiny-random  a 2-layer, hidden-256 model built from the target's config with random
                 weights: shares the tokenizer, accepts ~nothing, so it measures the cost
                 of drafting with a model rather than any gain
    anything else  a model id or folder, loaded like the target (same tokenizer required)

A drafter the engine gains later is one more entry in BUILTIN.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch

from ..drafters import Drafter, DraftModel, PromptLookup
from ..errors import SpecvizError


@dataclass
class BenchDrafter:
    name: str
    drafter: Drafter | None  # None: the speculative loop with empty drafts
    model: object | None = None  # the draft model, when there is one (hf-assisted uses it)


def tiny_random_model(target, layers: int = 2, hidden: int = 256, seed: int = 0):
    """A small random-init causal LM with the target's architecture family and vocabulary."""
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(target.config)
    heads = 4
    for key, value in dict(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=4 * hidden,
                           num_attention_heads=heads, num_key_value_heads=2,
                           head_dim=hidden // heads).items():
        if hasattr(cfg, key):
            setattr(cfg, key, value)
    torch.manual_seed(seed)
    param = next(target.parameters())
    model = AutoModelForCausalLM.from_config(cfg, dtype=param.dtype)
    return model.to(param.device).eval()


def _tiny_random(target) -> BenchDrafter:
    model = tiny_random_model(target)
    return BenchDrafter("tiny-random", DraftModel(model, name="tiny-random"), model)


BUILTIN: dict[str, Callable[[object], BenchDrafter]] = {
    "none": lambda target: BenchDrafter("none", None),
    "pld": lambda target: BenchDrafter("pld", PromptLookup()),
    "tiny-random": _tiny_random,
}


def make_drafters(names: list[str], target, load_model: Callable[[str], object] | None = None) -> list[BenchDrafter]:
    """One BenchDrafter per name; `load_model(name)` returns a draft model for other names."""
    out = []
    for name in names:
        if name in BUILTIN:
            out.append(BUILTIN[name](target))
            continue
        if load_model is None:
            raise SpecvizError(f"unknown drafter {name!r}: use {', '.join(BUILTIN)} or a model id/folder")
        model = load_model(name)
        out.append(BenchDrafter(name, DraftModel(model, name=name), model))
    return out
