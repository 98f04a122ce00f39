"""Turning the names given to `--drafters` into drafters.

Every name the other entry points understand (run/arms.py and run/spec.py: none, pld, layerskip[:layers],
a draft model id or folder, NAME@chain, and whatever they learn later) is parsed there. The
benchmark adds kinds of its own:

    tiny-random  a 2-layer, hidden-256 model built from the target's config with random
                 weights: it shares the tokenizer and accepts ~nothing, so it measures what
                 drafting with a model costs (specviz's and transformers' assisted loop)
                 rather than any gain. Nothing is downloaded.
    draft-hf     the distilled draft model ("draft", or "draft-hf:PATH" for a trained file)
                 exported as a transformers LlamaForCausalLM with the same logits
                 (drafters/export.py), run by specviz as a draft model, so `--peers
                 hf-assisted` compares both libraries on the same pair.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ..drafters import Drafter, DraftModel
from ..engine.generate import GenerationConfig
from ..run.arms import parse_arm
from ..run.spec import Kind, build, parse, with_kinds

TINY_RANDOM = "tiny-random"
DRAFT_HF = "draft-hf"


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


def _tiny_random(spec, target, **_) -> DraftModel:
    return DraftModel(tiny_random_model(target.model), name=spec.drafter_label)


def _draft_hf(spec, target, **_) -> DraftModel:
    from ..drafters.export import to_transformers

    distilled = build(parse(f"draft:{spec.argument}" if spec.argument else "draft"), target)
    # float32, as the distilled drafter itself always runs (and float16 could not hold the export)
    return DraftModel(to_transformers(distilled, target.model), name=spec.drafter_label)


# The names every entry point understands (run/spec.py), and the bench's own.
KINDS = with_kinds(Kind(TINY_RANDOM, "tiny random draft model", _tiny_random,
                        says="a random 2-layer model: what drafting with a model costs"),
                   Kind(DRAFT_HF, "distilled draft model (transformers)", _draft_hf, "PATH",
                        says="the distilled draft as a transformers model, for --peers hf-assisted"))


def make_drafters(names: list[str], target, trust_remote_code: bool = False) -> list[BenchDrafter]:
    """One BenchDrafter per name. `target` is a models.Loaded (or anything with .model,
    .device and .dtype); drafters are reused across runs (each run calls `begin`)."""
    out = []
    for name in names:
        spec = parse_arm(name, GenerationConfig(), KINDS).spec  # its shape, if any, is read again by each arm
        drafter = build(spec, target, trust_remote_code=trust_remote_code)
        inner = drafter.model if spec.copier else drafter  # a pair's model drafter
        # A separate causal LM (not layer skip's view of the target, nor a trained head): transformers' assisted
        # generation can take it.
        out.append(BenchDrafter(name, drafter, inner.model if type(inner) is DraftModel else None))
    return out
