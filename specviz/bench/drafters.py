"""Turning the names given to `--drafters` into drafters.

Every name the engine understands (specviz.drafters.choose: none, pld, layerskip[:layers],
a draft model id or folder, and whatever it learns later) is resolved there. The
benchmark adds one of its own:

    tiny-random  a 2-layer, hidden-256 model built from the target's config with random
                 weights: it shares the tokenizer and accepts ~nothing, so it measures what
                 drafting with a model costs (specviz's and transformers' assisted loop)
                 rather than any gain. Nothing is downloaded.
    draft-hf     the distilled draft model ("draft", or "draft-hf:PATH" for a trained file)
                 exported as a transformers LlamaForCausalLM with the same logits
                 (drafters/export.py), run by specviz as a draft model, so `--peers
                 hf-assisted` compares both libraries on the same pair.
    NAME@chain   a tree drafter (medusa, eagle) drafting chains only (its `tree_width` set
                 to 0), to measure what trees buy.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ..core.errors import SpecvizError
from ..drafters import Drafter, DraftModel
from ..drafters.choose import make_drafter, needs_model
from ..drafters.hybrid import Hybrid

TINY_RANDOM = "tiny-random"
DRAFT_HF = "draft-hf"
CHAIN = "@chain"


@dataclass
class BenchDrafter:
    name: str  # as the user typed it: arm labels start with it
    drafter: Drafter | None  # None: the speculative loop with empty drafts
    model: object | None = None  # a separate draft model, when there is one (hf-assisted uses it)


def tiny_random_model(target_model, layers: int = 2, hidden: int = 256, seed: int = 0):
    """A small random-init causal LM with the target's architecture family and vocabulary."""
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(target_model.config)
    heads = 4
    for key, value in dict(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=4 * hidden,
                           num_attention_heads=heads, num_key_value_heads=2,
                           head_dim=hidden // heads).items():
        if hasattr(cfg, key):
            setattr(cfg, key, value)
    torch.manual_seed(seed)
    param = next(target_model.parameters())
    model = AutoModelForCausalLM.from_config(cfg, dtype=param.dtype)
    return model.to(param.device).eval()


def make_drafters(names: list[str], target, trust_remote_code: bool = False) -> list[BenchDrafter]:
    """One BenchDrafter per name. `target` is a models.Loaded (or anything with .model,
    .device and .dtype); drafters are reused across runs (each run calls `begin`)."""
    out = []
    for name in names:
        if name == TINY_RANDOM:
            model = tiny_random_model(target.model)
            out.append(BenchDrafter(name, DraftModel(model, name=name), model))
            continue
        if name == DRAFT_HF or name.startswith(DRAFT_HF + ":"):
            from ..drafters.export import to_transformers

            _, _, path = name.partition(":")
            distilled = make_drafter(f"draft:{path}" if path else "draft", target)
            # float32, as the distilled drafter itself always runs (and float16 could not hold the export)
            model = to_transformers(distilled, target.model)
            out.append(BenchDrafter(name, DraftModel(model, name=name), model))
            continue
        spec = name.removesuffix(CHAIN)
        drafter = make_drafter(spec, target, trust_remote_code=trust_remote_code)
        if name.endswith(CHAIN):
            if drafter is None or drafter.tree_width < 2:
                raise SpecvizError(f"{spec} does not draft trees: '{CHAIN}' applies to tree drafters (medusa, eagle)")
            drafter.tree_width = 0
        inner = drafter.model if isinstance(drafter, Hybrid) else drafter  # a hybrid's model drafter
        model = inner.model if needs_model(spec) else None
        out.append(BenchDrafter(name, drafter, model))
    return out
