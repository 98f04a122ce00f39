"""Where a causal LM keeps its decoder stack: the list of layers, the module that runs them, the
embeddings, the final norm and the LM head.

Families lay the stack out differently: `model.layers` (Llama, Qwen, Mistral, Gemma, ...),
`transformer.h` (GPT-2, BLOOM, GPT-J, GPT-Neo, CodeGen, GPTBigCode, Falcon), `transformer.blocks`
(MPT, DBRX), `model.decoder.layers` (OPT), `model.language_model.layers` (multimodal wrappers).
transformers' `get_decoder()` misses some of them: a Llama 4 text model names its base
`language_model` but keeps it at `.model`, and gets itself back. So the stack is found by what it
is, a list of as many layers as the config has; the module holding that list is the body, whose
first output is the final hidden state (after the final norm: the LM head's input). Training's
target passes, layer skip, EAGLE's and Medusa's features and the probe all read it from here.
"""
from __future__ import annotations

import functools
import inspect
import weakref
from dataclasses import dataclass

from torch import nn

LAYER_LISTS = ("layers", "h", "blocks")  # what families call the list of their decoder layers
FINAL_NORMS = ("norm", "ln_f", "final_layer_norm", "norm_f", "final_norm")


@dataclass(frozen=True)
class Stack:
    path: str  # where the layers are, as the model's attributes spell it: "transformer.h"
    body: nn.Module  # the module holding (and running) the layers: input ids in, final hidden states out
    layers: nn.ModuleList
    embed: nn.Module
    norm: nn.Module | None  # the final norm, when the body has one under a known name
    head: nn.Module | None  # the LM head


def _lists(model) -> list[tuple[str, nn.ModuleList]]:
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, nn.ModuleList) and name.rpartition(".")[2] in LAYER_LISTS and len(module)]


def per_model(fn):
    """fn(model), computed once per model object and held weakly (a dropped model frees its entry); a
    model that cannot be weakly referenced is computed again each time."""
    memo: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    @functools.wraps(fn)
    def once(model):
        try:
            return memo[model]
        except (KeyError, TypeError):
            pass
        found = fn(model)
        try:
            memo[model] = found
        except TypeError:
            pass
        return found
    return once


@per_model
def find(model) -> Stack | None:
    """The decoder stack of `model`, or None when it has no list of layers under a name families use.

    Of several lists (a vision tower's, an encoder's), the one as long as the text config's layer
    count wins, then the shallowest: the language model's own stack. Looked up once per model
    (every EAGLE or Medusa step on transformers' path asks)."""
    return _find(model)


def _find(model) -> Stack | None:
    found = _lists(model)
    if not found:
        return None
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    count = getattr(text, "num_hidden_layers", None)
    path, layers = min(found, key=lambda item: (len(item[1]) != count, item[0].count(".")))
    body = model.get_submodule(path.rpartition(".")[0]) if "." in path else model
    norm = next((getattr(body, n) for n in FINAL_NORMS if isinstance(getattr(body, n, None), nn.Module)), None)
    return Stack(path, body, layers, model.get_input_embeddings(), norm, model.get_output_embeddings())


def body(model) -> nn.Module:
    """The module that runs the decoder layers (its output is post final norm); transformers'
    get_decoder() when specviz finds no stack."""
    found = find(model)
    return found.body if found is not None else model.get_decoder()


@functools.lru_cache(maxsize=None)
def _parameters(forward_fn) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(forward_fn).parameters)
    except (TypeError, ValueError):
        return frozenset()


def takes(module: nn.Module, name: str) -> bool:
    """Does `module`'s forward take the keyword `name`? (ALiBi families, BLOOM and MPT, take no
    position ids: their positions come from the attention mask.)"""
    return name in _parameters(type(module).forward)
