"""specviz: see speculative decoding happen, step by step, exactly.

Layers, one direction: models -> drafters -> engine -> events -> render -> UI.
Names are imported lazily, so `specviz.events` or `specviz.render` load without torch.
"""
from importlib import import_module

_HOMES = {
    "Draft": "drafters", "Drafter": "drafters", "DraftModel": "drafters", "LayerSkip": "drafters",
    "PromptLookup": "drafters", "Suffix": "drafters", "SuffixMemory": "drafters", "GenerationConfig": "engine", "baseline_generate": "engine",
    "collect": "engine", "speculative_generate": "engine", "SpecvizError": "errors",
    "RunEnd": "events", "RunStats": "events", "StepEvent": "events", "TokenEvent": "events",
    "Sampling": "sampling",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module 'specviz' has no attribute {name!r}")
