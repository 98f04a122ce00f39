"""Where a greedy speculative run left plain greedy decoding, and whether rounding explains it.

In float32 the two runs are identical token for token. In bfloat16 and float16 the verify pass
multiplies k + 1 rows at once, which can round differently from a one-row decode step; where the
target's two best tokens are nearly tied, that rounding can flip the argmax, and from there the
texts part (vLLM documents the same). Such a flip is not an acceptance error, and it leaves a
mark: at the first differing position each run's target preferred its own token by a margin no
larger than the precision's rounding. A margin larger than that is not rounding: it is a bug.

The margin is measured in log-probability (nats) between the token each run chose and the token
the other run chose, from the top-token lists both runs record (StepEvent.p_top, TokenEvent.top).
Pure functions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

# How far apart two log-probabilities may move between a one-row and a (k+1)-row forward of the
# same model in each precision, in nats: bf16 keeps 8 bits of mantissa (a relative error of 2^-9
# per rounding), fp16 11; logits of tens and sums over thousands of products make the absolute
# error of a logit a few hundredths in fp16 and a few tenths in bf16 (measured on the matrix's
# tiny models, docs/models.md). float32's error is below 1e-4 here; its bound is kept for GPUs
# whose float32 matrix multiplies round through TF32.
TIE_NATS = {"float32": 0.02, "bfloat16": 0.5, "float16": 0.1}


def tie_tolerance(dtype: str | None) -> float:
    """The largest margin rounding explains for weights in `dtype` ("float16", "torch.bfloat16",
    "fp16", ...); unknown precisions get float32's."""
    name = str(dtype or "float32").removeprefix("torch.").lower()
    name = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(name, name)
    return TIE_NATS.get(name, TIE_NATS["float32"])


@dataclass(frozen=True)
class Divergence:
    """The first position (0-based, among generated tokens) where the two runs' tokens differ."""

    position: int
    spec_token: int
    base_token: int
    # How strongly each run's target preferred its own token over the other run's there, in nats
    # (log p(own) - log p(other)); None when the other token was not among the recorded top tokens.
    spec_margin: float | None
    base_margin: float | None
    tolerance: float  # the largest margin the precision's rounding explains

    @property
    def near_tie(self) -> bool:
        """Both margins within rounding: a tie flipped by arithmetic, not an acceptance error."""
        return all(m is not None and m <= self.tolerance for m in (self.spec_margin, self.base_margin))

    def sentence(self) -> str:
        """One sentence for a person: what happened at the first difference and what it means."""
        def nats(m):
            return "not among its top tokens" if m is None else f"{m:.3g} nats"

        where = (f"the texts part at token {self.position}: the speculative run's target preferred its token by "
                 f"{nats(self.spec_margin)}, the baseline's preferred its own by {nats(self.base_margin)}")
        if self.near_tie:
            return (f"{where[0].upper()}{where[1:]}, within this precision's rounding ({self.tolerance:g} nats): "
                    "a near-tie rounded differently in the batched verify pass, not an acceptance error.")
        return (f"{where[0].upper()}{where[1:]}, more than this precision's rounding ({self.tolerance:g} nats) "
                "explains: this is a bug, please report it.")

    def to_dict(self) -> dict:
        return {"position": self.position, "spec_token": self.spec_token, "base_token": self.base_token,
                "spec_margin": self.spec_margin, "base_margin": self.base_margin, "tolerance": self.tolerance,
                "near_tie": self.near_tie}


def _margin(row: Sequence[tuple[int, float]] | None, own: int, other: int) -> float | None:
    probs = dict(row or ())
    if own not in probs or other not in probs or probs[own] <= 0:
        return None
    if probs[other] <= 0:
        return math.inf
    return math.log(probs[own]) - math.log(probs[other])


def spec_rows(steps) -> list[tuple[int, Sequence[tuple[int, float]] | None]]:
    """(token, the target's top tokens where it was chosen) for every token a run emitted, from its
    StepEvents (row j of a step's p_top is its j-th emitted token's) or TokenEvents (one each)."""
    out = []
    for s in steps:
        if not hasattr(s, "emitted"):
            out.append((s.token, s.top))
            continue
        for j, token in enumerate(s.emitted):
            out.append((token, s.p_top[j] if j < len(s.p_top) else None))
    return out


def first_divergence(steps, base_events, tolerance: float) -> Divergence | None:
    """Compare a speculative run (StepEvents) with a baseline (TokenEvents) over the tokens both
    produced: None when they agree, else where and by what margins they first differ."""
    for position, ((a, row_a), ev) in enumerate(zip(spec_rows(steps), base_events)):
        if a != ev.token:
            b = ev.token
            return Divergence(position, a, b, _margin(row_a, a, b), _margin(ev.top, b, a), tolerance)
    return None
