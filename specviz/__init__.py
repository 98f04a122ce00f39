"""specviz: see speculative decoding happen, step by step, exactly.

Layers, one direction: models -> drafters -> engine -> events -> render -> UI.
"""
from .drafters import Draft, Drafter, DraftModel, LayerSkip, PromptLookup
from .engine import GenerationConfig, baseline_generate, collect, speculative_generate
from .errors import SpecvizError
from .events import RunEnd, RunStats, StepEvent, TokenEvent
from .sampling import Sampling

__all__ = [
    "Draft", "Drafter", "DraftModel", "LayerSkip", "PromptLookup", "GenerationConfig", "Sampling", "SpecvizError",
    "RunEnd", "RunStats", "StepEvent", "TokenEvent", "baseline_generate", "collect", "speculative_generate",
]
