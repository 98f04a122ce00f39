"""A small causal LM with the target's tokenizer, drafting autoregressively.

It keeps its own KV cache: each propose feeds only the tokens it has not seen (the last
step's accepted tokens and the target's token), then drafts one token per forward.
After feedback the cache is cropped back to the accepted prefix.
"""
from __future__ import annotations

import torch

from ..modeling.forward import forward, new_cache, rollback
from .base import Draft, Drafter, autoregressive_draft, empty_draft


class DraftModel(Drafter):
    name = "draft model"

    def __init__(self, model, name: str | None = None):
        self.model = model
        if name:
            self.name = name

    def begin(self, prompt_ids, processor, generator, device, hidden=None, trees=False) -> None:
        self.processor, self.generator, self.device = processor, generator, device
        self.cache = new_cache(self.model)
        self.cached = 0  # tokens of the context held in the cache
        self.base = 0  # context length at the last propose
        self.drafted = False  # did this step's propose feed drafts the cache must drop again?
        # Prefill all but the last prompt token; propose feeds the rest.
        if len(prompt_ids) > 1:
            self._feed(prompt_ids[:-1])

    def _feed(self, tokens) -> torch.Tensor:
        x = torch.as_tensor(tokens, dtype=torch.long, device=self.device)
        logits = forward(self.model, x, self.cache, logits_to_keep=1)
        self.cached += x.numel()
        return logits

    def propose(self, ids, k, min_confidence=0.0) -> Draft:
        if k < 1:
            return empty_draft(self.device)
        self.base, self.drafted = len(ids), True
        logits = self._feed(ids[self.cached:])
        return autoregressive_draft(self.processor, self.generator, logits, k, min_confidence, self._feed)

    def feedback(self, accepted: int, hidden=None, path=None) -> None:
        # The cache holds context + drafts[:-1]; only context + drafts[:accepted] stay valid. A step
        # this drafter sat out (dynamic k chose 0, the last token) fed nothing to take back.
        if not self.drafted:
            return
        self.drafted = False
        keep = min(self.cached, self.base + accepted)
        rollback(self.cache, keep)
        self.cached = keep
