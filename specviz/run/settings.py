"""What a run is asked for with (Settings): the page's controls, a script's API call and generate's flags
alike, each a field here with its default (the engine's), read into the engine's config by one method.

Every value is checked here, whatever sent it: a script may send strings, NaN or 1e30 where the page's
sliders send numbers, and gets a sentence back, never a traceback. What a deployment allows is the app's
policy (ui/policy.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from ..core.errors import SpecvizError
from ..core.sampling import Sampling
from ..engine.generate import GenerationConfig
from .spec import NONE

GREEDY, SAMPLING = "greedy", "sampling"  # the page's decoding radio: sugar for temperature 0 or not


def _number(value, name: str, whole: bool):
    """A control's value as a finite number; scripts may send strings, NaN or 1e30."""
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        raise SpecvizError(f"{name} must be a number, got {value!r}")
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
        raise SpecvizError(f"{name} must be a {'whole number' if whole else 'number'}, got {value!r}") from None
    if not math.isfinite(f):
        raise SpecvizError(f"{name} must be a finite number, got {value!r}")
    if whole and f != int(f):
        raise SpecvizError(f"{name} must be a whole number, got {value!r}")
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
    k: int = _ENGINE.k
    dynamic_k: bool = _ENGINE.dynamic_k
    temperature: float = _SAMPLING.temperature  # 0 = greedy: the one greedy switch
    top_k: int = _SAMPLING.top_k
    top_p: float = _SAMPLING.top_p
    repetition_penalty: float = _SAMPLING.repetition_penalty
    seed: int = _SAMPLING.seed
    max_new_tokens: int = _ENGINE.max_new_tokens
    chat: bool = True
    verification: str = _ENGINE.verification  # how a sampled chain draft is judged (GenerationConfig.verification)
    draft_confidence: float = _ENGINE.draft_confidence  # with dynamic k (generate's flag; the page keeps the default)

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
        s = replace(s, target=s.target.strip(), drafter=s.drafter.strip() or NONE)
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
