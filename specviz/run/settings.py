"""What a run is asked for with (Settings): the page's controls, a script's API call and generate's flags
alike, each a field here with its default (the engine's), read into the engine's config by one method.

Every value is checked here, whatever sent it: a script may send strings, NaN or 1e30 where the page's
sliders send numbers, and gets a sentence back, never a traceback. A number's field says its Bounds, which
the page's slider is drawn with, so a value outside is refused in one sentence whether it came from a flag,
the API or the page. What a deployment allows is the app's policy (ui/policy.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from ..core.errors import SpecvizError
from ..core.sampling import Sampling
from ..engine.generate import K_MAX, GenerationConfig
from .spec import NONE

PRECISIONS = ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16")  # models.load's dtype names
GREEDY, SAMPLING = "greedy", "sampling"  # the page's decoding radio: sugar for temperature 0 or not


def shown(value) -> str:
    """A value as a refusal quotes it: short (1e308 sent as a whole number is not echoed as its 309
    digits) and never rounded onto an allowed one (top-p 1.0000001 is not "1", the bound it exceeds)."""
    if isinstance(value, int) and not isinstance(value, bool):
        digits = str(abs(value))
        if len(digits) <= 12:
            return str(value)
        return f"{'-' if value < 0 else ''}{digits[0]}.{digits[1:3]}e{len(digits) - 1} ({len(digits)} digits)"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return next(t for t in (f"{value:.{p}g}" for p in range(6, 18)) if float(t) == value or len(t) > 20)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(value, name: str, whole: bool):
    """A control's value as a finite number; scripts may send strings, NaN or 1e30."""
    if value is None:  # the page's emptied box (or one Chromium emptied: "1e400") sends null, not "None"
        raise SpecvizError(f"{name} must be a number, got nothing (an empty box)")
    if isinstance(value, bool) or isinstance(value, (list, dict)):
        raise SpecvizError(f"{name} must be a number, got {shown(value)}")
    if whole and isinstance(value, int):
        return value
    text = value.strip() if isinstance(value, str) else value
    if whole and isinstance(text, str):
        try:
            return int(text)  # exact, however long
        except ValueError:
            pass
    try:
        f = float(text)
    except (TypeError, ValueError):
        raise SpecvizError(f"{name} must be a {'whole number' if whole else 'number'}, got {shown(value)}") from None
    if not math.isfinite(f):
        raise SpecvizError(f"{name} must be a finite number, got {shown(value)}")
    if whole and f != int(f):
        raise SpecvizError(f"{name} must be a whole number, got {shown(value)}")
    return int(f) if whole else f


def _bool(value, name: str) -> bool:
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise SpecvizError(f"{name} must be true or false, got {value!r}")


def _text(value, name: str) -> str:
    """A text control's value; a script's list or number is refused, not run as its printed form
    (prompt=['a'] ran as the prompt "['a']")."""
    if value is None:
        return ""
    if not isinstance(value, str):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise SpecvizError(f"{name} must be one string of text; got {shown} ({type(value).__name__})")
    return valid_unicode(value, name)


def valid_unicode(value: str, name: str) -> str:
    """`value`, if it is text a tokenizer can read: JSON may carry half of a UTF-16 pair ("\\ud800"),
    which is no character at all (the tokenizer raised a TypeError on it)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise SpecvizError(f"{name} is not valid Unicode text: character {e.start + 1} is half of a UTF-16 "
                           f"surrogate pair ({value[e.start]!r}) with no other half") from None
    return value


@dataclass(frozen=True)
class Bounds:
    """The values a number setting may take, whoever asks for it: generate's flag, a script's API call and the
    page's slider (drawn from low to high in steps of step) meet the same check and the same sentence."""

    low: float
    high: float | None = None  # None: no end here (the engine's checks and the deployment's cap still hold)
    step: float = 1

    @property
    def said(self) -> str:
        return f"from {self.low:g} to {self.high:g}" if self.high is not None else f"at least {self.low:g}"

    def check(self, value, name: str) -> None:
        if value < self.low or (self.high is not None and value > self.high):
            raise SpecvizError(f"{name} must be {self.said}, got {shown(value)}")


def _bounded(default, low: float, high: float | None = None, step: float = 1):
    """A Settings field with its Bounds."""
    return field(default=default, metadata={"bounds": Bounds(low, high, step)})


def in_words(name: str) -> str:
    """A field as sentences name it: "top-p", "max new tokens"."""
    return {"top_k": "top-k", "top_p": "top-p"}.get(name, name.replace("_", " "))


# How a control's value becomes a Settings field, by the field's type.
_CONVERT = {"str": _text,
            "int": lambda v, name: _number(v, name, whole=True),
            "float": lambda v, name: _number(v, name, whole=False), "bool": _bool}
_ENGINE, _SAMPLING = GenerationConfig(), Sampling()  # the engine's defaults are the app's


@dataclass(frozen=True)
class Settings:
    """One run's request: a field per control of the page, named as the control's API parameter, and per
    generate flag (--max-new-tokens: max_new_tokens); tests/test_entry_points.py holds the two to these.

    Every field of `Sampling` is a field here too, so a new sampling setting needs only a
    field here, a control in the layout and a generate flag (named the same).
    """

    prompt: str
    target: str = "default"
    drafter: str = "prompt lookup"  # a name run/spec.py parses: the page's menu spells prompt lookup so
    k: int = _bounded(_ENGINE.k, 1, K_MAX)
    dynamic_k: bool = _ENGINE.dynamic_k
    temperature: float = _bounded(_SAMPLING.temperature, 0.0, 2.0, 0.05)  # 0 = greedy: the one greedy switch
    top_k: int = _bounded(_SAMPLING.top_k, 0, 200)
    top_p: float = _bounded(_SAMPLING.top_p, 0.05, 1.0, 0.01)
    repetition_penalty: float = _bounded(_SAMPLING.repetition_penalty, 0.8, 2.0, 0.05)
    seed: int = _SAMPLING.seed
    max_new_tokens: int = _bounded(_ENGINE.max_new_tokens, 1)  # the page's slider ends at the deployment's cap
    chat: bool = True
    verification: str = _ENGINE.verification  # how a sampled chain draft is judged (GenerationConfig.verification)
    draft_confidence: float = _ENGINE.draft_confidence  # with dynamic k (generate's flag; the page keeps the default)
    dtype: str = "auto"  # the target's precision: auto (fp32 on a CPU, bf16 on CUDA), fp32, bf16, fp16

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
        s = cls(**{name: _CONVERT[types[name]](v, in_words(name)) for name, v in values.items()})
        for name, bounds in BOUNDS.items():
            bounds.check(getattr(s, name), in_words(name))
        s = replace(s, target=s.target.strip(), drafter=s.drafter.strip() or NONE, dtype=s.dtype.strip().lower() or "auto")
        if s.dtype not in PRECISIONS:
            shown = s.dtype if len(s.dtype) <= 20 else s.dtype[:17] + "..."
            raise SpecvizError(f"precision (dtype) must be one of {', '.join(PRECISIONS)}, got {shown!r}")
        # One rule in every mode: a value the engine would refuse is refused, even where greedy
        # decoding would not use it (a script's temperature -1 is a mistake worth telling).
        s.sampling.validate()
        if mode is None:
            return s
        if str(mode).strip().lower() not in (GREEDY, SAMPLING):
            raise SpecvizError(f"mode must be {GREEDY!r} or {SAMPLING!r}, got {mode!r}")
        if str(mode).strip().lower() == SAMPLING:
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
            verification=self.verification, draft_confidence=self.draft_confidence,
            eos_token_ids=tuple(eos_token_ids),
        ).validate()


BOUNDS = {f.name: f.metadata["bounds"] for f in fields(Settings) if "bounds" in f.metadata}  # field -> its Bounds
