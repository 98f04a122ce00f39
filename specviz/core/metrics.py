"""The numbers of speculative decoding, as pure functions of counts and times: alpha, tau, c,
v(n) and the predicted speedup. RunStats, the page's headline, the benchmark's summary and the
serving records all read them here, so each number means the same everywhere.

Units: every cost is relative to one target forward over a single new token (a plain
decoding step), measured in the same process on the same cache state.

- alpha (acceptance rate) = accepted draft tokens / drafted tokens.
- tau (mean accepted length) = tokens emitted / speculative steps (each step emits the
  accepted drafts plus the target's own token, so tau >= 1).
- c (cost ratio) = drafting time per drafted token / one target forward.
- v(n) (verify cost ratio) = target forward over n tokens / over 1 token.

Leviathan et al. (2023, eq. 1 with the verify cost made explicit): drafting k tokens that are
each accepted with probability alpha, independently, yields E = (1 - alpha^(k+1)) / (1 - alpha)
tokens a step for c k + v(k+1) target steps, so

    predicted = (1 - alpha^(k+1)) / ((1 - alpha) * (k*c + v(k+1)))

(the paper's v = 1, verifying free of its length, holds on a GPU, not on a CPU).

Real drafts are neither always k long (prompt lookup often finds nothing, dynamic k varies,
a tree verifies all its nodes and keeps a branch) nor independent (a copied span is accepted
whole), so the same ratio is also taken over the steps that actually happened:

    predicted_steps = tau / mean over steps of (c * n_i + v(n_i + 1))

where n_i is step i's draft length. With fixed k and independent acceptance the two are
equal in expectation; engine efficiency = measured decode speedup / predicted_steps, so
it is 1 when the engine costs nothing beyond its drafter and its target forwards.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping

HINDSIGHT = "hindsight best"  # the schedule a replay finds in hindsight (engine/draft_replay), as render shows it


def acceptance_rate(accepted: int, drafted: int) -> float:
    """alpha: the share of drafted tokens the target kept (0 when nothing was drafted)."""
    return accepted / drafted if drafted else 0.0


def mean_accepted_length(tokens: int, steps: int) -> float:
    """tau: tokens emitted per target verification step."""
    return tokens / steps if steps else 0.0


def position_counts(steps: Iterable[tuple[int, int]], k: int) -> tuple[list[int], list[int]]:
    """(reached, kept) per draft position from (draft length, accepted) pairs.

    Position i is reached when a step drafted more than i tokens and kept all i before it;
    it is kept when the step accepted more than i.
    """
    reached, kept = [0] * k, [0] * k
    for n_draft, n_accepted in steps:
        for i in range(min(n_draft, n_accepted + 1, k)):
            reached[i] += 1
            kept[i] += i < n_accepted
    return reached, kept


def position_acceptance(reached: list[int], kept: list[int]) -> list[float | None]:
    """P(draft token i is accepted | tokens before it were), None where never reached."""
    return [kp / r if r else None for r, kp in zip(reached, kept)]


def expected_from_positions(rates: list[float]) -> float:
    """E[tokens per step] from the acceptance at each position given the earlier ones were kept,
    alpha_1..alpha_k: 1 + alpha_1 + alpha_1 alpha_2 + ... (drafts need not be accepted alike)."""
    total, reach = 1.0, 1.0
    for a in rates:
        reach *= a
        total += reach
    return total


def predicted_by_block(rates: list[float], draft_cost: float, verify_cost) -> list[float]:
    """For a block drafter, whose one pass drafts any block up to its size for about one price: the
    speedup a block of 1, 2, ..., len(rates) tokens predicts, from the acceptance at each position
    (`rates`), the drafting cost of a step (in target steps) and verify_cost(n), the cost of one
    verify pass over n tokens: E[tokens per step] / (draft_cost + v(k + 1))."""
    return [expected_from_positions(rates[:k]) / (draft_cost + verify_cost(k + 1)) for k in range(1, len(rates) + 1)]


def predicted_cost(draft_lengths: Mapping[int, int], c: float, verify_ratio: Mapping[int, float]) -> float:
    """Cost of the observed steps in target forwards: sum over steps of c * n + v(n + 1).

    draft_lengths: {n: how many steps drafted n tokens}; verify_ratio: {n: v(n)} for every
    n + 1 that occurs. Plain decoding costs 1 per token, so tokens / this cost is the
    step-model speedup (summary.Costs.predicted).
    """
    return sum(count * (c * n + verify_ratio[n + 1]) for n, count in draft_lengths.items())


def expected_tokens(alpha: float, k: float) -> float:
    """E[tokens per step]: 1 + alpha + ... + alpha^k."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: float, c: float, v: float = 1.0) -> float:
    """E[tokens per step] / (c k + v), in units of plain decoding's tokens per second."""
    return expected_tokens(alpha, k) / (c * k + v)


def with_prefill(predicted: float, tokens: int, prefill: float) -> float:
    """A decode-only predicted speedup over a run that also read its prompt: `prefill` target
    steps both runs spend alike, so the whole run's speedup is nearer 1."""
    return (prefill + tokens) / (prefill + tokens / predicted)


@dataclass(frozen=True)
class Prediction:
    """The step model's speedup for one run, and where the measured run parted from it: computed
    here once, so the page, the bench and re-timing only format it. per_step: E[tokens a step];
    draft and verify: a step's drafting and its verify pass, in target decode steps; prefill: the
    prompt's pass in target steps, which both runs pay alike, over `tokens` tokens."""
    per_step: float
    draft: float
    verify: float
    tokens: int = 0
    prefill: float = 0.0

    @property
    def decode(self) -> float:
        """The decode-only speedup: E[tokens a step] / E[cost of a step]."""
        cost = self.draft + self.verify
        return self.per_step / cost if cost > 0 else 0.0

    @property
    def speedup(self) -> float:
        """The whole run's speedup, its prompt read counted as the measured one counts it."""
        d = self.decode
        return with_prefill(d, self.tokens, self.prefill) if d > 0 and self.tokens else d

    def unmodelled(self, step_seconds: float, base_step: float) -> float:
        """Seconds a verify step took beyond its pass at the predicted price (picking tokens, host
        copies, what the views record); base_step: the baseline's seconds a token."""
        return step_seconds - self.verify * base_step

    def gap(self, seconds: float, base_per_token: float) -> float:
        """Seconds the run took beyond what it would have at the predicted speedup (negative: faster)."""
        return seconds - self.tokens * base_per_token / self.speedup


def cost_ratio(draft_time: float, drafted: int, target_step: float) -> float:
    """c: seconds drafting per drafted token, in units of one target forward."""
    return draft_time / drafted / target_step if drafted and target_step > 0 else 0.0


def verify_ratios(times: Mapping[int, float]) -> dict[int, float]:
    """v(n) = time of a target forward over n tokens / over 1 token."""
    one = times[1]
    return {n: t / one for n, t in sorted(times.items())}


def per_token_time(seconds: float, tokens: int) -> float:
    return seconds / tokens if tokens else float("inf")


def speedup(base_seconds: float, base_tokens: int, seconds: float, tokens: int) -> float:
    """How many times faster per token a run is than the baseline."""
    t = per_token_time(seconds, tokens)
    return per_token_time(base_seconds, base_tokens) / t if t > 0 else 0.0


def efficiency(measured: float, predicted: float) -> float | None:
    """Measured speedup / predicted speedup (None when nothing was predicted)."""
    return measured / predicted if predicted > 0 else None


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0


def common_prefix(a: Iterable[int], b: Iterable[int]) -> int:
    """How many leading tokens two outputs share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
