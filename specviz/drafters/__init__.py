from .base import Draft, Drafter, empty_draft
from .draft_model import DraftModel
from .prompt_lookup import PromptLookup

__all__ = ["Draft", "Drafter", "DraftModel", "PromptLookup", "empty_draft"]
