"""What a visitor asked for (Settings) and what this deployment allows (Policy).

Hosted mode (a Hugging Face Space, or SPECVIZ_HOSTED=1) serves strangers: models only
from an allow-list (no local paths, never remote code), a cap on new tokens and one run
at a time. The checks run on the server, so a script calling the API directly meets the
same rules as the page.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Mapping

from ..engine import GenerationConfig
from ..errors import SpecvizError
from ..sampling import Sampling

NO_DRAFTER = "none"
PROMPT_LOOKUP = "prompt lookup"
LAYER_SKIP = "layerskip"
GREEDY, SAMPLING = "greedy", "sampling"  # the page's decoding radio: sugar for temperature 0 or not
SAMPLING_TEMPERATURE = 0.7  # what the temperature slider offers when a visitor switches to sampling
# The page's k slider stops here so each of its steps is easy to hit; the engine and the
# CLI accept up to engine.K_MAX.
K_SLIDER_MAX = 16

# (label shown, value passed to the loader). "default" is the embedded SmolLM2-135M-Instruct,
# the one model that needs no Hugging Face Hub; the others share its tokenizer.
TARGETS = (
    ("SmolLM2-135M-Instruct (embedded, offline)", "default"),
    ("SmolLM2-360M-Instruct (Hub)", "HuggingFaceTB/SmolLM2-360M-Instruct"),
    ("SmolLM2-1.7B-Instruct (Hub)", "HuggingFaceTB/SmolLM2-1.7B-Instruct"),
)
DRAFTERS = (
    ("none (plain steps)", NO_DRAFTER),
    ("prompt lookup (copy n-grams from the context)", PROMPT_LOOKUP),
    ("layer skip (the target drafts with ~70% of its layers)", LAYER_SKIP),
    ("EAGLE head (trained for the embedded model)", "eagle"),
    ("Medusa heads (trained for the embedded model)", "medusa"),
    ("distilled draft model (trained for the embedded model)", "draft"),
    ("SmolLM2-135M-Instruct (embedded) as draft model", "default"),
)


@dataclass(frozen=True)
class Policy:
    """What this deployment lets visitors choose."""

    hosted: bool = False
    targets: tuple = TARGETS  # (label, value) pairs offered in the page
    drafters: tuple = DRAFTERS
    default_target: str = "default"
    default_drafter: str = PROMPT_LOOKUP  # the best drafter that works offline
    compare_drafters: tuple[str, ...] = (PROMPT_LOOKUP, "eagle", "medusa", "draft")
    max_new_tokens: int = 1024
    concurrency: int = 1  # runs at once; more than one would make the timings lie

    def _allowed(self, name: str, pairs) -> bool:
        return name in {value for _, value in pairs}

    def check(self, s: "Settings") -> None:
        """Raise SpecvizError if these settings are not allowed here."""
        if s.max_new_tokens > self.max_new_tokens:
            raise SpecvizError(f"max new tokens is capped at {self.max_new_tokens} here, got {s.max_new_tokens}")
        if not self.hosted:
            return
        if not self._allowed(s.target, self.targets):
            names = ", ".join(v for _, v in self.targets)
            raise SpecvizError(f"this hosted app only runs these targets: {names} (got {s.target!r})")
        self.check_drafter(s.drafter)

    def check_drafter(self, name: str) -> None:
        if self.hosted and not self._allowed(name, self.drafters):
            names = ", ".join(v for _, v in self.drafters)
            raise SpecvizError(f"this hosted app only offers these drafters: {names} (got {name!r})")


def hosted_policy(**overrides) -> Policy:
    return replace(Policy(hosted=True, max_new_tokens=256, concurrency=1), **overrides)


def policy_from_env(environ: Mapping[str, str] = os.environ) -> Policy:
    """Hosted when running on a Space (SPACE_ID is set there) or when SPECVIZ_HOSTED=1."""
    if environ.get("SPACE_ID") or environ.get("SPECVIZ_HOSTED", "").strip().lower() in ("1", "true", "yes"):
        return hosted_policy()
    return Policy()


def _int(value, name: str) -> int:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise SpecvizError(f"{name} must be a whole number, got {value!r}") from None
    if f != int(f):
        raise SpecvizError(f"{name} must be a whole number, got {value!r}")
    return int(f)


def _float(value, name: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise SpecvizError(f"{name} must be a number, got {value!r}") from None


# How a control's value becomes a Settings field, by the field's type.
_CONVERT = {"str": lambda v, name: "" if v is None else str(v), "int": _int, "float": _float,
            "bool": lambda v, name: bool(v)}
_ENGINE, _SAMPLING = GenerationConfig(), Sampling()  # the engine's defaults are the app's


@dataclass(frozen=True)
class Settings:
    """One visitor's request: a field per control, named as the control's API parameter.

    Every field of `Sampling` is a field here too, so a new sampling setting needs only a
    field here and a control in the layout (named the same).
    """

    prompt: str
    target: str = "default"
    drafter: str = PROMPT_LOOKUP
    k: int = _ENGINE.k
    dynamic_k: bool = _ENGINE.dynamic_k
    temperature: float = _SAMPLING.temperature  # 0 = greedy: the one greedy switch
    top_k: int = _SAMPLING.top_k
    top_p: float = _SAMPLING.top_p
    repetition_penalty: float = _SAMPLING.repetition_penalty
    seed: int = _SAMPLING.seed
    max_new_tokens: int = _ENGINE.max_new_tokens
    chat: bool = True

    @classmethod
    def from_controls(cls, mode: str | None = None, **values) -> "Settings":
        """Settings from the page's control values, by field name (sliders send floats).

        `mode` is the page's greedy/sampling radio: greedy sends temperature 0 whatever the
        (hidden) temperature slider says; without a mode the temperature alone decides.
        """
        types = {f.name: f.type for f in fields(cls)}
        unknown = set(values) - set(types)
        if unknown:
            raise TypeError(f"no such setting: {', '.join(sorted(unknown))}")
        s = cls(**{name: _CONVERT[types[name]](v, name.replace("_", " ")) for name, v in values.items()})
        s = replace(s, target=s.target.strip(), drafter=s.drafter.strip() or NO_DRAFTER)
        if mode is None:
            return s
        if str(mode).lower().startswith(SAMPLING):
            if s.temperature <= 0:
                raise SpecvizError("sampling needs a temperature above 0 (choose greedy for temperature 0)")
            return s
        return replace(s, temperature=0.0)

    @property
    def sampling(self) -> Sampling:
        return Sampling(**{f.name: getattr(self, f.name) for f in fields(Sampling)})

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    def config(self, eos_token_ids=()) -> GenerationConfig:
        """The engine's config; raises SpecvizError for values it would not accept."""
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens, k=self.k, dynamic_k=self.dynamic_k, sampling=self.sampling,
            eos_token_ids=tuple(eos_token_ids),
        ).validate()
