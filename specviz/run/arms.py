"""An arm: one drafter (run/spec.py: a kind and its argument) run one way, its GenerationConfig, as Compare, the bench
and `generate` race them. A name's '@' suffix is sugar for one knob of that config, read once here: 'NAME@token' or
'NAME@block' sets verification, 'NAME@chain' chains, 'NAME@drawn' or 'NAME@chosen' tree_drafting.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from ..core.errors import SpecvizError
from ..engine.generate import TREE_DRAFTINGS, VERIFICATIONS, GenerationConfig
from ..render.rules import RULE_NAMES
from .spec import DrafterSpec, Kind, parse

# Each suffix -> (the knob it sets, what the arm's label adds).
SUFFIXES = {**{rule: ({"verification": rule}, RULE_NAMES[rule]) for rule in VERIFICATIONS},
            "chain": ({"chains": True}, "chains"), **{d: ({"tree_drafting": d}, f"{d} trees") for d in TREE_DRAFTINGS}}


BASELINE = "baseline"  # the engine (and label) of the plain run, in the bench and the race


@dataclass(frozen=True)
class Arm:
    label: str  # as a person reads it: "EAGLE (block verification)"; the bench's, unique: "eagle@chain k=4 block"
    spec: DrafterSpec | None  # None: no drafter of specviz's (the bench's baseline and its peers)
    cfg: GenerationConfig  # the run's config with what the name's '@' suffix asked for
    engine: str = "specviz"  # the others: BASELINE or a bench peer ("hf", "hf-pld", "hf-assisted")
    drafter: str | None = None  # the drafter's name as the bench was given it ("eagle@chain"), for its records


def parse_arm(text: str, base_cfg: GenerationConfig, kinds: Mapping[str, Kind] | None = None) -> Arm:
    """The arm `text` asks for on `base_cfg` (the run's settings), or SpecvizError in a sentence: a name that
    is no drafter, or a tree's shape asked of a drafter that drafts no trees."""
    s = (text or "").strip()
    inner, at, suffix = s.rpartition("@")
    asked = suffix.strip().lower() if at else ""
    if asked not in SUFFIXES:
        inner, asked = s, ""
    spec = parse(inner.strip(), kinds)
    if asked and asked not in VERIFICATIONS and not spec.kind.trees:
        raise SpecvizError(f"{spec.text} does not draft trees: '@{asked}' applies to tree drafters "
                           "(medusa, eagle, block)")
    knob, said = SUFFIXES.get(asked, ({}, ""))
    return Arm(f"{spec.label} ({said})" if said else spec.label, spec, replace(base_cfg, **knob))
