"""The only place that calls a model: one forward over new tokens, and KV-cache rollback.

Llama-layout models run through llama_fast.py over a position-indexed cache (a rejection
is a length reset); everything else through transformers' forward and a RollbackCache (a
rejection crops the cache). Either way no position is ever recomputed.

Sliding-window and chunked layers (Mistral, Gemma 2/3, Cohere 2, GPT-OSS, ...) normally drop
what leaves their window as soon as it is written, which would make a rejected draft
impossible to take back. transformers lets such a layer keep everything written since the
last crop (`activate_past_recording`); RollbackCache turns that on after the prefill, and
every rollback crops (a crop of nothing trims the layer back to its window), so a sliding
layer holds at most its window plus one step's draft, as transformers' own assisted
generation does. The prefill itself runs without recording: it is never taken back.
"""
from __future__ import annotations

import functools
import inspect
import threading
from contextlib import contextmanager
from typing import Protocol

import torch
from transformers import DynamicCache

from ..core.errors import SpecvizError
from . import llama_fast, stack


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


class RollbackCache(DynamicCache):
    """transformers' DynamicCache (full, sliding and chunked layers as the model's config says)
    that the engine can always roll back: past recording starts at the first forward after
    the prefill, and `rollback` crops after every step (module docstring)."""

    recording = False
    # Sliding layers keep the window before the last rollback (or the prefill) plus what came since:
    # a rollback can undo a step, never reach behind the one before (the engine never asks it to).
    floor = 0

    @functools.cached_property
    def sliding(self) -> bool:
        """Has any sliding or chunked layer (the config's layers are all made with the cache)."""
        return any(getattr(layer, "is_sliding", False) for layer in self.layers)

    def crop(self, tokens_to_remove: int) -> None:
        # Layers a forward never wrote (those a layer-skip view skips) have nothing to crop;
        # transformers' sliding layer would fail on its empty state.
        for layer in self.layers:
            if layer.is_initialized:
                layer.crop(tokens_to_remove)

    def before_forward(self, prefill: bool) -> None:
        if not self.recording and not (prefill and self.get_seq_length() == 0):
            self.activate_past_recording()
            self.recording, self.floor = True, self.get_seq_length()


# One sentence for every model that carries a state forward instead of keeping past tokens
# (Mamba, RWKV, MiniMax, Qwen3-Next, the hybrids): the cause is the same, whatever the library calls it.
RECURRENT = ("it keeps a recurrent state (recurrent or linear-attention layers), which cannot be rolled back to an "
             "earlier token")


def keeps_state(model_class) -> bool:
    """Does this class carry a recurrent state between calls instead of a cache? (RWKV's forward
    takes `state` and no cache; older transformers marked such classes `_is_stateful`.)"""
    if model_class is None:
        return False
    if getattr(model_class, "_is_stateful", False):
        return True
    try:
        params = inspect.signature(model_class.forward).parameters
    except (TypeError, ValueError):
        return False
    return "state" in params and not {"cache", "past_key_values"} & set(params)


def rollback_problem(cache, model_class=None) -> str | None:
    """Why the engine could not roll `cache` (of a `model_class`) back after a rejected draft, or None if it can.

    Linear-attention and recurrent layers (Mamba's, Qwen3-Next's) call themselves croppable
    since transformers 5.25, but only with a history of their states kept per token, which
    their forward fills in for a few model families only; they are refused rather than trusted."""
    from transformers import cache_utils

    if keeps_state(model_class):
        return RECURRENT
    linear = getattr(cache_utils, "LinearAttentionCacheLayerMixin", ())
    layers = getattr(cache, "layers", [])
    if any(isinstance(layer, linear) for layer in layers):
        return RECURRENT
    if not cache.is_croppable:
        kinds = sorted({type(layer).__name__ for layer in layers if not layer.is_croppable})
        return f"its cache ({', '.join(kinds) or type(cache).__name__}) cannot be cropped to an earlier token"
    return None


# The first transformers whose sliding-window layers roll back with past recording on: before
# 5.18 a recording layer handed attention more keys than its mask had room for after a few
# forwards without a crop (plain decoding), a raw size-mismatch error past the window.
MIN_TRANSFORMERS = (5, 18)


@functools.lru_cache(maxsize=None)
def transformers_problem(version: str | None = None) -> str | None:
    """A sentence when the installed transformers (or `version`) is too old for this engine, else None."""
    if version is None:
        import transformers

        version = transformers.__version__
    try:
        found = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return None  # a development build: trust it
    if found >= MIN_TRANSFORMERS:
        return None
    need = ".".join(map(str, MIN_TRANSFORMERS))
    return (f"specviz needs transformers {need} or newer (this environment has {version}, whose caches cannot roll "
            f"back sliding-window layers): pip install -U 'transformers>={need},<6'")


def new_cache(model):
    problem = transformers_problem()
    if problem:
        raise SpecvizError(problem)
    if llama_fast.supports(model):
        return llama_fast.new_cache(model)
    cache = RollbackCache(config=model.config)
    problem = rollback_problem(cache, type(model))
    if problem:
        raise SpecvizError(f"{type(model).__name__} cannot be used for speculative decoding: {problem}")
    return cache


@functools.lru_cache(maxsize=None)
def _cache_keyword(forward_fn) -> str:
    """The name a model's forward takes its cache by: `cache` since transformers 5.2x,
    `past_key_values` before (and in remote code written for it). Under the old name a model
    given `cache=` would swallow it in **kwargs and run without its context."""
    try:
        params = inspect.signature(forward_fn).parameters
    except (TypeError, ValueError):
        return "cache"
    return "cache" if "cache" in params or "past_key_values" not in params else "past_key_values"


def cache_kwargs(model, cache) -> dict:
    """{name: cache} for `model(...)`, under the name its forward takes (see _cache_keyword)."""
    return {_cache_keyword(type(model).forward): cache}


# The transformers path reads the final hidden states (the LM head's input) with a hook on the
# decoder stack, so the logits come from the model's own forward, with whatever it applies after
# its LM head (Gemma's soft-capping, Cohere's logit scale, Granite's scaling). A model is shared
# by every thread of the app: the hook fills the slot of the thread that armed it, and no other.
_grabbed = threading.local()


def _grab(module, args, output) -> None:
    if getattr(_grabbed, "armed", False):
        _grabbed.h = output[0] if isinstance(output, tuple) else output.last_hidden_state


def _decoder_states(model, ids: torch.Tensor, cache, logits_to_keep: int, layers: tuple[int, ...]):
    decoder = stack.body(model)
    if not any(hook is _grab for hook in decoder._forward_hooks.values()):
        decoder.register_forward_hook(_grab)
    _grabbed.armed, _grabbed.h = True, None
    try:
        out = model(input_ids=ids.view(1, -1), **cache_kwargs(model, cache), use_cache=True,
                    logits_to_keep=logits_to_keep, output_hidden_states=bool(layers))
        h = _grabbed.h
    finally:
        _grabbed.armed, _grabbed.h = False, None
    return out.logits[0].float(), h[0], [out.hidden_states[i][0] for i in layers]


def forward(model, ids: torch.Tensor, cache, logits_to_keep: int = 0, hidden: bool | tuple[int, ...] = False,
            mask: torch.Tensor | None = None, positions: torch.Tensor | None = None):
    """Run `ids` (1-D) after what `cache` holds; return logits (rows, vocab) in float32.

    logits_to_keep=0 keeps a row per input token; 1 keeps only the last (prefill). A forward
    with logits_to_keep=1 into an empty cache is a prefill: it is never rolled back.
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
    else:
        if isinstance(cache, RollbackCache):
            cache.before_forward(prefill=logits_to_keep == 1)
        if not hidden:
            out = model(input_ids=ids.view(1, -1), **cache_kwargs(model, cache), use_cache=True,
                        logits_to_keep=logits_to_keep)
            return out.logits[0].float()
        logits, h, found = _decoder_states(model, ids, cache, logits_to_keep, inner)
    if not hidden:
        return logits
    if not layers:
        return logits, h.float()
    by_layer = dict(zip(inner, found))
    by_layer[n_layers] = h
    return logits, torch.cat([by_layer[i] for i in layers], -1).float()


def rollback(cache, length: int) -> None:
    """Drop cached positions past `length` (never behind the previous rollback's length, nor the
    prefill's: a sliding-window layer no longer holds what lay before its window then)."""
    if isinstance(cache, llama_fast.KVCache):
        cache.crop(length)
        return
    extra = cache.get_seq_length() - length
    if isinstance(cache, RollbackCache):
        if length < cache.floor and cache.sliding:
            raise SpecvizError(f"cannot roll a sliding-window cache back to {length} tokens: it was last rolled back "
                               f"to {cache.floor}, and what lay before left the window then")
        cache.floor = length
    if extra > 0 or getattr(cache, "recording", False):
        # transformers 5 takes a negative count (tokens to drop); crop(0) trims recorded layers
        cache.crop(-extra)


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


# What families call the number of positions they have: MPT says `max_seq_len` (its ALiBi bias is built
# that long, and a longer run fails inside its attention), CodeGen `n_ctx` beside `n_positions`.
CONTEXT_NAMES = ("max_position_embeddings", "n_positions", "max_seq_len", "n_ctx", "max_sequence_length",
                 "seq_length")


def context_length(model) -> int | None:
    cfg = model.config
    for name in CONTEXT_NAMES:
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def output_vocab_size(model) -> int:
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "weight"):
        return head.weight.shape[0]
    return model.config.vocab_size
