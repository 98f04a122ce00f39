"""The only place that calls a model: one forward over new tokens, and KV-cache rollback.

Caches are transformers' DynamicCache. A rejection is undone by cropping the cache back
to the accepted length (a slice, no recomputation).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from .errors import SpecvizError


def new_cache(model) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    if not cache.is_croppable:
        raise SpecvizError(
            f"{type(model).__name__} uses a cache that cannot be rolled back "
            "(sliding-window or recurrent layers); speculative decoding needs rollback"
        )
    return cache


def forward(model, ids: torch.Tensor, cache: DynamicCache, logits_to_keep: int = 0) -> torch.Tensor:
    """Run `ids` (1-D) after what `cache` holds; return logits (rows, vocab) in float32.

    logits_to_keep=0 keeps a row per input token; 1 keeps only the last (prefill).
    """
    out = model(input_ids=ids.view(1, -1), cache=cache, use_cache=True, logits_to_keep=logits_to_keep)
    return out.logits[0].float()


def rollback(cache: DynamicCache, length: int) -> None:
    """Drop cached positions past `length`."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)  # transformers 5 takes a negative count: tokens to drop


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so timings measure the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def context_length(model) -> int | None:
    cfg = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def output_vocab_size(model) -> int:
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "weight"):
        return head.weight.shape[0]
    return model.config.vocab_size
