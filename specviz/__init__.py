"""specviz: see speculative decoding happen, step by step, exactly.

The package face: the names below, imported lazily, so `specviz.core.events` or `specviz.render`
load without torch.
May import: every layer. Layers, bottom to top (tests/test_layers.py keeps them one way): core ->
modeling -> drafters -> engine -> render -> traces -> run -> serving, train -> bench, matrix -> audit -> ui
-> cli (and app.py).
"""
from importlib import import_module

_HOMES = {
    "Draft": "drafters", "Drafter": "drafters", "DraftModel": "drafters", "LayerSkip": "drafters",
    "PromptLookup": "drafters", "Suffix": "drafters", "SuffixMemory": "drafters",
    "GenerationConfig": "engine.generate", "baseline_generate": "engine.generate",
    "collect": "engine.generate", "speculative_generate": "engine.generate", "SpecvizError": "core.errors",
    "RunEnd": "core.events", "RunStats": "core.events", "StepEvent": "core.events", "TokenEvent": "core.events",
    "Sampling": "core.sampling",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module 'specviz' has no attribute {name!r}")
