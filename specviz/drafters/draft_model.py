"""A small causal LM with the target's tokenizer, drafting autoregressively.

It keeps its own KV cache: each propose feeds only the tokens it has not seen (the last
step's accepted tokens and the target's token), then drafts one token per forward.
After feedback the cache is cropped back to the accepted prefix.
"""
from __future__ import annotations

import torch

from ..modeling.forward import forward, new_cache, rollback
from .base import Autoregressive


class DraftModel(Autoregressive):
    name = "draft model"

    def _start(self) -> None:
        self.cache = new_cache(self.model)
        self.cached = 0  # tokens of the context held in the cache

    def _step(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = forward(self.model, tokens, self.cache, logits_to_keep=1)
        self.cached += tokens.numel()
        return logits

    def _length(self) -> int:
        return self.cached

    def _crop(self, n: int) -> None:
        rollback(self.cache, n)
        self.cached = n
