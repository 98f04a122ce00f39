"""One file per way of proposing drafts, all behind base.py's Drafter (what the engine calls).
May import: core and modeling; never the engine, which imports them.
"""
from .base import Draft, Drafter, empty_draft
from .draft_model import DraftModel
from .layer_skip import LayerSkip
from .prompt_lookup import PromptLookup
from .suffix import Suffix
from .suffix_memory import SuffixMemory

__all__ = ["Draft", "Drafter", "DraftModel", "LayerSkip", "PromptLookup", "Suffix", "SuffixMemory", "empty_draft"]
