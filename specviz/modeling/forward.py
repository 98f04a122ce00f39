"""The only place that calls a model: one forward over new tokens, and KV-cache rollback.

Llama-layout models run through llama_fast.py over a position-indexed cache (a rejection
is a length reset); everything else through transformers' forward and DynamicCache (a
rejection crops the cache). Either way no position is ever recomputed.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Protocol

import torch
from transformers import DynamicCache

from ..core.errors import SpecvizError
from . import llama_fast


class ForwardObserver(Protocol):
    """Told around every fast-path forward of the model it observes (the benchmark's clocks)."""

    def start(self, model) -> None: ...

    def stop(self, model) -> None: ...


# Observers by model identity. The transformers path goes through model.forward, where
# module hooks see it; the fast path does not, so it tells its observer itself.
_observers: dict[int, ForwardObserver] = {}


def observe(model, observer: ForwardObserver | None) -> None:
    """Call observer.start(model) / observer.stop(model) around every fast-path forward of
    `model`; observer=None detaches."""
    if observer is None:
        _observers.pop(id(model), None)
    else:
        _observers[id(model)] = observer


@contextmanager
def _observed(model):
    observer = _observers.get(id(model)) if _observers else None
    if observer is None:
        yield
        return
    observer.start(model)
    try:
        yield
    finally:
        observer.stop(model)


def new_cache(model):
    if llama_fast.supports(model):
        return llama_fast.new_cache(model)
    cache = DynamicCache(config=model.config)
    if not cache.is_croppable:
        raise SpecvizError(
            f"{type(model).__name__} uses a cache that cannot be rolled back "
            "(sliding-window or recurrent layers); speculative decoding needs rollback"
        )
    return cache


def forward(model, ids: torch.Tensor, cache, logits_to_keep: int = 0, hidden: bool | tuple[int, ...] = False,
            mask: torch.Tensor | None = None, positions: torch.Tensor | None = None):
    """Run `ids` (1-D) after what `cache` holds; return logits (rows, vocab) in float32.

    logits_to_keep=0 keeps a row per input token; 1 keeps only the last (prefill).
    hidden=True also returns the final hidden states (the LM head's input), every row, as
    (logits, hidden): drafters such as Medusa and EAGLE read the target's features.
    hidden=(i, j, ...) returns instead the inputs of those decoder layers (transformers'
    hidden_states numbering), concatenated along the feature axis: EAGLE-3 reads three.
    Number L (the model's layer count) is the final state itself, as hidden=True gives it.
    mask and positions (fast path only) replace the causal chain: tree drafts (core/tree.py).
    """
    layers = hidden if isinstance(hidden, tuple) else ()
    n_layers = model.config.get_text_config().num_hidden_layers if layers else 0
    inner = tuple(sorted(i for i in layers if i != n_layers))
    if isinstance(cache, llama_fast.KVCache):
        with _observed(model):
            h, found = llama_fast.states(model, ids, cache, mask=mask, positions=positions, layers=inner)
            logits = llama_fast.head(model, h[-logits_to_keep:] if logits_to_keep else h).float()
    elif hidden:
        out = model.get_decoder()(input_ids=ids.view(1, -1), cache=cache, use_cache=True,
                                  output_hidden_states=bool(inner))
        h, found = out.last_hidden_state[0], [out.hidden_states[i][0] for i in inner]
        logits = model.get_output_embeddings()(h[-logits_to_keep:] if logits_to_keep else h).float()
    else:
        out = model(input_ids=ids.view(1, -1), cache=cache, use_cache=True, logits_to_keep=logits_to_keep)
        return out.logits[0].float()
    if not hidden:
        return logits
    if not layers:
        return logits, h.float()
    by_layer = dict(zip(inner, found))
    by_layer[n_layers] = h
    return logits, torch.cat([by_layer[i] for i in layers], -1).float()


def rollback(cache, length: int) -> None:
    """Drop cached positions past `length`."""
    if isinstance(cache, llama_fast.KVCache):
        cache.crop(length)
        return
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)  # transformers 5 takes a negative count: tokens to drop


def to_host(*tensors: torch.Tensor) -> list[list[float]]:
    """Several device tensors in one host transfer (one synchronisation): each comes back
    flattened, as a list of floats (float64: token ids up to 2^53 stay exact)."""
    flat = torch.cat([t.double().reshape(-1) for t in tensors]).tolist()
    out, start = [], 0
    for t in tensors:
        out.append(flat[start:start + t.numel()])
        start += t.numel()
    return out


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
