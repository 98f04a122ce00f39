"""What a visitor asked for (Settings) and what this deployment allows (Policy).

Hosted mode (a Hugging Face Space, or SPECVIZ_HOSTED=1) serves strangers: models only
from an allow-list (no local paths, never remote code), a cap on new tokens and one run
at a time. The checks run on the server, so a script calling the API directly meets the
same rules as the page.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Mapping

from ..engine import GenerationConfig
from ..errors import SpecvizError
from ..sampling import Sampling

NO_DRAFTER = "none"
PROMPT_LOOKUP = "prompt lookup"
LAYER_SKIP = "layerskip"

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


@dataclass(frozen=True)
class Settings:
    """One visitor's request, as the controls deliver it (sliders send floats, so we convert)."""

    prompt: str
    target: str = "default"
    drafter: str = PROMPT_LOOKUP
    k: int = 4
    dynamic_k: bool = False
    sampling: bool = False  # False: greedy
    temperature: float = 0.7
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int = 0
    max_new_tokens: int = 128
    chat: bool = True

    @classmethod
    def from_controls(cls, prompt, target, drafter, k, dynamic_k, mode, temperature, top_k, top_p,
                      repetition_penalty, seed, max_new_tokens, chat) -> "Settings":
        return cls(
            prompt=prompt or "", target=(target or "").strip(), drafter=(drafter or NO_DRAFTER).strip(),
            k=_int(k, "k"), dynamic_k=bool(dynamic_k), sampling=str(mode).lower().startswith("sampl"),
            temperature=_float(temperature, "temperature"), top_k=_int(top_k, "top-k"),
            top_p=_float(top_p, "top-p"), repetition_penalty=_float(repetition_penalty, "repetition penalty"),
            seed=_int(seed, "seed"), max_new_tokens=_int(max_new_tokens, "max new tokens"), chat=bool(chat),
        )

    @property
    def greedy(self) -> bool:
        return not self.sampling

    def config(self, eos_token_ids=()) -> GenerationConfig:
        """The engine's config; raises SpecvizError for values it would not accept."""
        if self.sampling and self.temperature <= 0:
            raise SpecvizError("sampling needs a temperature above 0 (choose greedy for temperature 0)")
        sampling = Sampling(
            temperature=self.temperature if self.sampling else 0.0, top_k=self.top_k, top_p=self.top_p,
            repetition_penalty=self.repetition_penalty, seed=self.seed,
        )
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens, k=self.k, dynamic_k=self.dynamic_k, sampling=sampling,
            eos_token_ids=tuple(eos_token_ids),
        ).validate()
