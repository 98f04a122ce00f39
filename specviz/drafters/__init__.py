from .base import Draft, Drafter, empty_draft
from .draft_model import DraftModel
from .layer_skip import LayerSkip
from .prompt_lookup import PromptLookup

__all__ = ["Draft", "Drafter", "DraftModel", "LayerSkip", "PromptLookup", "empty_draft"]
