"""From what a user typed (CLI flag, app dropdown, benchmark list) to a drafter.

`make_drafter` returns a *fresh* drafter for one run (drafters hold per-run state such as
a KV cache); the models behind them come from the shared, read-only load cache.
"""
from __future__ import annotations

from typing import Callable

from ..errors import SpecvizError
from .base import Drafter
from .draft_model import DraftModel
from .prompt_lookup import PromptLookup

NONE_NAMES = ("none", "off", "baseline")
PLD_NAMES = ("pld", "prompt-lookup", "prompt lookup", "ngram")
LAYER_SKIP = "layerskip"  # "layerskip" (default subset) or "layerskip:0-9,14,20-29"


def drafter_label(spec: str) -> str:
    """A short human name for a drafter spec."""
    s = spec.strip().lower()
    if s in NONE_NAMES:
        return "none"
    if s in PLD_NAMES:
        return "prompt lookup"
    return f"draft model {spec.strip()}"


def needs_model(spec: str) -> bool:
    """Does this drafter spec name a separate draft model to load?"""
    s = (spec or "").strip().lower()
    return bool(s) and s not in NONE_NAMES and s not in PLD_NAMES and not s.startswith(LAYER_SKIP)


def draft_model(target, draft, spec: str) -> DraftModel:
    """Wrap a loaded draft model after checking it shares the target's tokenizer."""
    from .. import models

    models.check_same_vocab(target, draft)
    return DraftModel(draft.model, name=drafter_label(spec))


def make_drafter(spec: str, target, *, trust_remote_code: bool = False,
                 progress: Callable[[str, float], None] | None = None) -> Drafter | None:
    """`none` -> None (plain decoding in steps), `pld` -> prompt lookup, `layerskip[:layers]`
    -> the target with layers skipped, else a draft model id or folder.

    A draft model is loaded on the target's device and dtype and must share its tokenizer.
    """
    from .. import models  # imported here: the engine layers never need transformers' loaders

    s = (spec or "").strip()
    if not s:
        raise SpecvizError("no drafter given: use 'none', 'pld', 'layerskip' or a draft model id/folder")
    if s.lower() in NONE_NAMES:
        return None
    if s.lower() in PLD_NAMES:
        return PromptLookup()
    if s.lower().startswith(LAYER_SKIP):
        return _layer_skip(s, target)
    draft = models.load(s, device=str(target.device), dtype=_dtype_name(target.dtype),
                        trust_remote_code=trust_remote_code, progress=progress)
    return draft_model(target, draft, s)


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _layer_skip(spec: str, target) -> Drafter:
    from .layer_skip import LayerSkip, decoder_layers, parse_layers

    _, _, layers = spec.partition(":")
    keep = parse_layers(layers, len(decoder_layers(target.model))) if layers.strip() else None
    return LayerSkip(target.model, keep)
