"""A draft-length controller by name: 'NAME' or 'NAME:key=value:key=value' ('fixed:4' for fixed k), parsed
once and checked against each parameter's range, so a flag, the page and the bench refuse alike."""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Callable

from ..core.errors import SpecvizError
from . import controllers as c
from .draft_length import Prices


@dataclass(frozen=True)
class Param:
    default: object
    low: float
    high: float
    kind: str = "float"  # "float", "int", "ints" (slash-separated: 1/3/7) or "bool"
    open_low: bool = False  # low itself is out of range (an EMA's weight must be above 0)
    says: str = ""

    def range(self) -> str:
        low = f"above {self.low:g}" if self.open_low else f"from {self.low:g}"
        return f"{low} to {self.high:g}" if math.isfinite(self.high) else low.replace("from", "at least")

    def read(self, text: str, key: str, rule: str):
        try:
            if self.kind == "bool":
                if text.lower() not in ("0", "1", "true", "false", "yes", "no"):
                    raise ValueError
                return text.lower() in ("1", "true", "yes")
            values = [int(x) if self.kind != "float" else float(x) for x in text.split("/")]
        except ValueError:
            form = {"int": "a whole number", "ints": "whole numbers separated by /, such as 1/3/7",
                    "bool": "0 or 1"}.get(self.kind, "a number")
            raise SpecvizError(f"{rule}'s {key} must be {form}, got {text!r}") from None
        if not values or (self.kind != "ints" and len(values) > 1):
            raise SpecvizError(f"{rule}'s {key} takes one value, got {text!r}")
        for v in values:
            if not math.isfinite(v) or v < self.low or v > self.high or (self.open_low and v == self.low):
                raise SpecvizError(f"{rule}'s {key} must be {self.range()}, got {v:g}")
        if self.kind == "ints" and len(set(values)) < 2:
            raise SpecvizError(f"{rule}'s {key} needs at least two different values, got {text!r}")
        return tuple(values) if self.kind == "ints" else values[0]


K = float(c.K_RECORD)
UNIT = dict(low=0.0, high=1.0)
EMA = Param(0.2, 0.0, 1.0, open_low=True, says="the EMA's weight of the newest step")


@dataclass(frozen=True)
class Rule:
    make: Callable[..., c.Controller]
    params: dict
    says: str


RULES = {
    "specviz": Rule(c.Specviz, {"start": Param(4, 1, K, "int")}, "specviz's own dynamic k"),
    "sglang-adaptive": Rule(c.SGLangAdaptive, {
        "steps": Param((1, 3, 7), 1, K, "ints"), "ema": EMA, "warmup": Param(10, 0, 1000, "int"),
        "interval": Param(5, 1, 1000, "int"), "down": Param(-0.25, -K, 0.0), "up": Param(0.0, 0.0, K),
        "start": Param(3, 1, K, "int")}, "SGLang --speculative-adaptive"),
    "sglang-auto": Rule(c.SGLangAuto, {
        "steps": Param((3, 4, 5, 6), 1, K, "ints"), "start": Param(5, 1, K, "int"), "pos": Param(0.55, **UNIT),
        "neg": Param(0.50, **UNIT), "ema": Param(0.3, 0.0, 1.0, open_low=True)}, "SGLang --auto-spec, batch 1"),
    "llama-pmin": Rule(c.LlamaPMin, {"p": Param(0.75, **UNIT), "max": Param(c.K_RECORD, 1, K, "int")},
                       "llama.cpp --draft-p-min"),
    "hf-heuristic": Rule(c.HFHeuristic, {"start": Param(20, 1, 64, "int")},
                         "transformers' heuristic schedule (+2 / -1)"),
    "hf-confidence": Rule(c.HFConfidence, {"threshold": Param(0.4, **UNIT), "k": Param(20, 1, 64, "int"),
                                           "adapt": Param(True, 0, 1, "bool")},
                          "transformers' assistant confidence threshold"),
    "fixed": Rule(c.Fixed, {"k": Param(4, 1, K, "int")}, "the same k every step"),
}
ENGINE_RULES = ("sglang-adaptive", "sglang-auto", "llama-pmin", "hf-heuristic", "hf-confidence")
ALL = ("specviz", *ENGINE_RULES, *(f"fixed:{k}" for k in range(1, c.K_RECORD + 1)))


def known() -> str:
    """The names a sentence lists."""
    return ", ".join(f"'{n}'" for n in RULES) + " ('fixed:K' for K from 1 to 16; 'all' in a list)"


def parse(text: str) -> tuple[str, dict]:
    """(rule, parameters given) from 'NAME[:key=value...]'; an unknown name or parameter, or a value out of
    its range, is refused in a sentence that lists what is known."""
    name, *parts = [p.strip() for p in str(text).strip().split(":")]
    rule = RULES.get(name.lower())
    if rule is None:
        near = difflib.get_close_matches(name.lower(), RULES, n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise SpecvizError(f"unknown controller {name!r}{hint}: choose from {known()}")
    given = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq and len(rule.params) and len(parts) == 1:  # 'fixed:4': the first parameter
            key, value = next(iter(rule.params)), key
        key = key.strip().lower()
        if key not in rule.params:
            raise SpecvizError(f"{name} has no parameter {key!r}: it takes "
                               + ", ".join(f"{k} ({p.range()})" for k, p in rule.params.items()))
        given[key] = rule.params[key].read(value.strip(), key, name)
    return name.lower(), given


def canonical(text: str) -> str:
    """The name as the reports spell it: 'fixed:4', 'sglang-adaptive:ema=0.3'."""
    name, given = parse(text)
    if name == "fixed":
        return f"fixed:{given.get('k', RULES['fixed'].params['k'].default)}"
    shown = [f"{k}={'/'.join(map(str, v)) if isinstance(v, tuple) else int(v) if isinstance(v, bool) else v:}"
             for k, v in given.items()]
    return ":".join([name, *shown])


def build(text: str, prices: Prices | None = None) -> c.Controller:
    """A fresh controller for one run (prices: specviz's, where known ahead)."""
    name, given = parse(text)
    rule = RULES[name]
    options = {k: p.default for k, p in rule.params.items()} | given
    if name == "specviz":
        options["prices"] = prices
    made = rule.make(**options)
    made.name = canonical(text)
    return made


def expand(names: list[str]) -> list[str]:
    """A list as typed, 'all' spelled out, each name canonical and once."""
    out = []
    for n in names:
        out += list(ALL) if n.strip().lower() == "all" else [canonical(n)]
    return list(dict.fromkeys(out))
