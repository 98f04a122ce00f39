"""The headline numbers: measured speedup beside what the theory predicts, alpha, tau, calls saved.

Theory (Leviathan et al. 2023): with acceptance rate alpha and k drafts per step, a step
yields E[tokens] = (1 - alpha^(k+1)) / (1 - alpha) and costs (c k + 1) target-step times,
where c is the cost of one draft token relative to one target decode step. So the predicted
speedup is (1 - alpha^(k+1)) / ((1 - alpha)(c k + 1)). Here c is measured: mean draft
time per step over k, divided by the baseline's mean time per token.
"""
from __future__ import annotations

from dataclasses import dataclass
from html import escape

from ..theory import predicted_speedup
from .trace import Trace


@dataclass(frozen=True)
class Headline:
    spec_tps: float  # tokens/s of the speculative run
    base_tps: float  # tokens/s of the baseline
    speedup: float | None  # spec_tps / base_tps (None until both have tokens)
    alpha: float  # acceptance rate: accepted / drafted
    tau: float  # mean tokens per step
    k: float  # mean drafted tokens per step (the configured k for a model drafter)
    c: float | None  # draft cost per token / baseline cost per token
    predicted: float | None  # Leviathan's speedup from alpha, k and c
    calls_saved: int  # target forward passes the baseline needed beyond the speculative run's
    base_calls: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def headline(spec: Trace, base: Trace) -> Headline:
    s, b = spec.stats(), base.stats()
    speedup = s.tokens_per_s / b.tokens_per_s if s.tokens and b.tokens and b.tokens_per_s > 0 else None
    k = s.drafted / s.steps if s.steps else 0.0
    base_step = b.verify_time / b.steps if b.steps else 0.0  # the baseline's time per token
    c = None
    if k > 0 and base_step > 0:
        c = (s.draft_time / s.steps) / k / base_step
    predicted = predicted_speedup(s.acceptance_rate, k, c) if c is not None else None
    return Headline(
        spec_tps=s.tokens_per_s, base_tps=b.tokens_per_s, speedup=speedup,
        alpha=s.acceptance_rate, tau=s.mean_accepted_length, k=k, c=c, predicted=predicted,
        calls_saved=b.steps - s.steps, base_calls=b.steps,
    )


def _card(label: str, value: str, hint: str, key: str) -> str:
    return (
        f'<div class="sv-card" data-metric="{key}" title="{escape(hint)}">'
        f'<div class="sv-card-value">{escape(value)}</div>'
        f'<div class="sv-card-label">{escape(label)}</div></div>'
    )


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def headline_html(h: Headline) -> str:
    c = "—" if h.c is None else f"{h.c:.2f}"
    cards = [
        _card("measured speedup", _x(h.speedup),
              "speculative tokens/s divided by baseline tokens/s (engine time, prefill included)", "speedup"),
        _card("predicted speedup", _x(h.predicted),
              f"(1 − α^(k+1)) / ((1 − α)(c·k + 1)) with α = {h.alpha:.2f}, k = {h.k:.2f} "
              f"(mean draft length), c = {c} (draft token cost / target step cost)", "predicted"),
        _card("α acceptance rate", f"{h.alpha:.2f}", "accepted draft tokens / drafted tokens", "alpha"),
        _card("τ tokens per step", f"{h.tau:.2f}",
              "tokens each target pass produced: accepted drafts plus the target's own token", "tau"),
        _card(f"target calls saved (of {h.base_calls})", f"{h.calls_saved}",
              "target forward passes the baseline needed beyond the speculative run's", "calls"),
        _card("tokens/s speculative", f"{h.spec_tps:.1f}", "engine time, prefill included", "spec-tps"),
        _card("tokens/s baseline", f"{h.base_tps:.1f}", "engine time, prefill included", "base-tps"),
    ]
    return f'<div class="sv-cards">{"".join(cards)}</div>'


def agreement(spec: Trace, base: Trace) -> tuple[bool | None, int | None]:
    """(identical, first differing token index) over the tokens both runs have produced."""
    a, b = spec.token_ids, base.token_ids
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return False, i
    if spec.done and base.done and len(a) != len(b):
        return False, n
    return (True, None) if n or (spec.done and base.done) else (None, None)


def agreement_html(spec: Trace, base: Trace, greedy: bool) -> str:
    """The greedy check (identical to baseline?) or, for sampling, why the texts differ."""
    if not greedy:
        return (
            '<div class="sv-check sv-check-sampling" data-identical="sampling">🎲 Sampling: the two runs '
            "draw different random numbers, so their texts differ, but speculative sampling gives "
            "every token exactly the target's distribution.</div>"
        )
    same, at = agreement(spec, base)
    if same is None:
        return ""
    if same:
        so_far = "" if spec.done and base.done else " so far"
        n = min(len(spec.token_ids), len(base.token_ids))
        return (
            f'<div class="sv-check sv-check-ok" data-identical="true">✓ Greedy output identical to '
            f"baseline{so_far} ({n} tokens): speculative decoding changed the speed, not the text.</div>"
        )
    return (
        f'<div class="sv-check sv-check-bad" data-identical="false">✗ Differs from baseline at token '
        f"{at}: the batched verify pass rounds differently from one-token decoding; a near-tie flipped.</div>"
    )
