"""Choosing each step's draft length from what drafting and verifying really cost.

With acceptance rate alpha per draft token (independent, as in Leviathan et al.), a draft
of j tokens yields E(j) = (1 - alpha^(j+1)) / (1 - alpha) tokens per step, and costs
T(j + 1) (a target forward over j + 1 tokens) plus j * c_draft. Dynamic k picks the j in
0..k_max with the most expected tokens per second, from running estimates of all three:

- alpha: discounted counts of accepted / rejected draft tokens (recent steps weigh
  more, and an idle estimate drifts back to the prior, so a drafter that was unlucky
  gets tried again instead of being shut off for good). Drafts whose drafter names their
  kind (`Drafter.plan`: prompt lookup's n-gram length; a hybrid's model drafts) get a rate
  per kind, whose prior is the overall rate;
- the first token's rate after what came before: a step right after a draft kept whole continues
  it (a copy that held tends to go on holding), one after a refusal or a plain step starts afresh
  (prompt lookup's 3-gram drafts there are kept ~15% of the time, against ~95% inside a copy, on the
  embedded model's records). With `by_context`, first tokens and acceptance by depth are counted
  per (kind, which of the two) too; an untried pair starts at CONTINUE after a kept draft and, afresh, just above the rate at
  which drafting one token pays for itself, so each kind of draft is tried at least once;
- acceptance by depth: real drafts are not accepted independently token by token (a copy
  holds for a span, then breaks), so beyond the first token E(j) uses the acceptance of
  position l given l - 1 accepted, counted per position and kind (discounted like alpha)
  and shrunk towards the position before it where few drafts reached it. With alpha alone a run of
  accepted copies priced long drafts that broke after a few (docs/performance.md);
- T(m) = T(1) * v(m): the machine's speed now times the shape of the cost curve, learned
  apart (verify_estimate.py), so a slow step or a size timed long ago cannot decide the run;
- c_draft: measured draft seconds per drafted token, as a fraction of T(1) (per kind where
  kinds are named: a hybrid's copied drafts cost ~nothing, its model's do not).

Exploring: a step that drafts nothing says nothing about alpha, so after PROBE_GAP such
steps in a row (of one kind) one token is drafted; and the cost of drafting is known only
against a plain step's, so when none was timed for STALE steps and the ratio is unsure
enough that a plain step might be as good, one is taken. Stale verify costs revert to an
optimistic prior (verify_estimate.py), so a length priced out long ago is tried again.
Every choice is a function of the timings and outcomes seen: no randomness.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

from .verify_estimate import VerifyCost

DISCOUNT = 0.8  # weight of the past per step in the alpha estimate: a memory of ~5 steps
IDLE_DISCOUNT = 0.9  # per step without a draft (of that kind): a memory of ~10 such steps
PRIOR = 0.25  # pseudo-counts each way: alpha starts at 0.5, and a few rejections can shut a useless drafter off
PROBE_GAP = 12  # steps of one kind without a draft before one token is drafted regardless
CONTINUE = 0.9  # the prior of a first token right after a draft kept whole
FRESH_MARGIN = 0.1  # afresh, an untried kind's prior: the one-token break-even rate and this much
STALE = 16  # steps after which a plain step's time is stale
SLOW_DRAFT = 3.0  # a drafting time over this many times the estimate counts as this many


@dataclass(frozen=True)
class Prices:
    """What a step costs, known before the run: v(m), a target pass over m tokens in one-token passes (the
    measured verify curve, verify_cost.py), and c, a drafted token's cost in the same unit (by kind of
    draft where kinds differ). Dynamic k given prices decides from acceptance alone, so the same steps
    replay the same decisions (draft_replay.py); without, it learns the costs from its own timings."""

    verify: Callable[[float], float]
    draft: float = 0.0
    draft_by_kind: Mapping[object, float] = field(default_factory=dict)

    def c(self, kind=None) -> float:
        return self.draft_by_kind.get(kind, self.draft)

    def ratios(self, top: int) -> list[float]:
        """v(m) for m = 0..top, never below 1 (index 0 unused)."""
        return [1.0] + [max(1.0, self.verify(m)) for m in range(1, top + 1)]


class DraftLength:
    """The draft-length policy: how much each step drafts (`plan`), from what earlier steps did (`record`).

    tree_nodes: a tree drafter's candidates per step at fixed k (0: this run drafts no trees).
    confidence: with dynamic k, the drafter's own stop (chains stop below it; a tree is given the
    largest budget, 4k, and keeps the nodes whose path probability reaches it)."""

    def __init__(self, k: int, k_max: int, dynamic: bool, tree_nodes: int = 0, confidence: float = 0.0,
                 prices: Prices | None = None, by_context: bool = False):
        self.k, self.k_max, self.dynamic = k, k_max, dynamic
        self.by_context = by_context
        self.after_kept = False  # the last step drafted, and the target kept all of it
        self.by_context_kind: dict[tuple, tuple[float, float]] = {}  # (kind, after_kept) -> (accepted, rejected)
        self.prices = prices
        self.steps = 0
        self.tree_nodes = tree_nodes
        self.confidence = confidence if dynamic else 0.0
        self.accepted = self.rejected = 0.0
        self.by_kind: dict[int, tuple[float, float]] = {}  # kind -> (accepted, rejected), discounted
        self.cost = VerifyCost()
        self.draft_ratio: float | None = None  # draft seconds per drafted token / T(1), averaged
        self.ratio_by_kind: dict[int, float] = {}
        self.idle: dict[int | None, int] = {}  # kind -> steps in a row that drafted nothing
        # kind -> per draft position l = 1..k_max: [accepted, reached] (reached: drafted with l - 1 kept)
        self.depth: dict[int | None, list[list[float]]] = {}

    @property
    def alpha(self) -> float:
        return (self.accepted + PRIOR) / (self.accepted + self.rejected + 2 * PRIOR)

    def alpha_of(self, kind=None) -> float:
        """The acceptance rate of drafts of this kind (the overall rate for None)."""
        if kind is None or kind not in self.by_kind:
            return self.alpha
        acc, rej = self.by_kind[kind]
        return (acc + 2 * PRIOR * self.alpha) / (acc + rej + 2 * PRIOR)

    def first_rate(self, kind, v: list[float], c: float) -> float:
        """The chance the coming step's first draft token is kept: its kind's rate, or with `by_context` its
        rate in this context (after a draft kept whole or not), leaning on a prior where few were seen."""
        if not self.by_context:
            return self.alpha_of(kind)
        prior = CONTINUE if self.after_kept else min(1.0, v[2] - 1.0 + c + FRESH_MARGIN)
        acc, rej = self.by_context_kind.get((kind, self.after_kept), (0.0, 0.0))
        return (acc + 2 * PRIOR * prior) / (acc + rej + 2 * PRIOR)

    def expected(self, first: float, kind=None) -> list[float]:
        """E(j) for j = 0..k_max: expected tokens of a step drafting j (of this kind), when its
        first draft is accepted with probability `first` and each later one as its position has
        been (a position no draft reached: as the one before it, so alpha's geometric law)."""
        gains, kept, rate = [1.0], 1.0, first
        depth = self.depth.get((kind, self.after_kept)) if self.by_context else None
        depth = depth or self.depth.get(kind)
        for l in range(1, self.k_max + 1):
            if l > 1 and depth:  # accepted at l given l - 1 were, shrunk towards position l - 1's rate
                acc, reached = depth[l - 1]
                rate = (acc + 2 * PRIOR * rate) / (reached + 2 * PRIOR)
            kept *= rate
            gains.append(gains[-1] + kept)
        return gains

    def verify_cost(self, m: int) -> float | None:
        """Estimated seconds to verify m tokens now (None before any step)."""
        t1 = self.cost.t1
        return None if t1 is None else t1 * self.cost.ratios(m)[m]

    def draft_cost(self, kind=None) -> float:
        """Drafting seconds per token, as a fraction of a one-token verify."""
        return self.ratio_by_kind.get(kind, self.draft_ratio) or 0.0

    def plan(self, drafter, ids: list[int], room: int) -> tuple[object, int]:
        """(the kind of draft coming, how many tokens or tree nodes to ask for) for the next step. The
        drafter first says what kind of draft it has (prompt lookup: the n-gram length it matched), and
        dynamic k gives it the length that kind has earned; at fixed k a tree drafter gets the tree's
        budget, and a tree sized by confidence the largest. Never more than room - 1: the target adds one."""
        if drafter is None:
            return None, 0
        kind = drafter.plan(ids)
        tree = self.tree_nodes and drafter.tree_width > 1
        if tree and self.confidence > 0:
            wanted = self.k_max
        elif tree and not self.dynamic:  # dynamic k sizes trees itself
            wanted = self.tree_nodes
        else:
            wanted = self.next(kind)
        return kind, max(0, min(wanted, room - 1))

    def next(self, kind=None) -> int:
        """The draft length for the coming step (for a draft of this kind, when known)."""
        if not self.dynamic:
            return self.k
        if not self.steps:
            return self.k  # nothing seen yet: start where the user said
        if self.prices is not None:
            c, v = self.prices.c(kind), self.prices.ratios(self.k_max + 1)
        else:
            c, v = self.draft_cost(kind), self.cost.ratios(self.k_max + 1)
        gains = self.expected(self.first_rate(kind, v, c), kind)
        rates = [gains[j] / (v[j + 1] + c * j) for j in range(self.k_max + 1)]
        best = max(range(self.k_max + 1), key=lambda j: (rates[j], -j))  # ties: the shorter
        if best == 0 and self.idle.get(kind, 0) >= PROBE_GAP:
            return 1  # the cheapest look at whether this kind of draft has started to work
        # Drafting is judged against a plain step, whose time is learned only by taking one:
        # when the ratio is unsure enough that a plain step might be as good, time one.
        if self.prices is None and self.cost.age(1) >= STALE and \
                rates[0] >= rates[best] * math.exp(-self.cost.spread(best + 1)):
            return 0
        return best

    def record(self, drafted: int, accepted: int, draft_time: float, verify_time: float, kind=None,
               q=None) -> None:
        """What one step did: feeds the estimates behind `next` (given prices, its times are not read)."""
        self.steps += 1
        if self.prices is None:
            self.cost.observe(drafted + 1, verify_time)
        self.idle[kind] = 0 if drafted else self.idle.get(kind, 0) + 1
        if drafted and self.prices is None:
            per = draft_time / drafted / self.cost.t1
            self.draft_ratio = _mean(self.draft_ratio, per)
            if kind is not None:
                self.ratio_by_kind[kind] = _mean(self.ratio_by_kind.get(kind), per)
        self.accepted, self.rejected = _counted(self.accepted, self.rejected, drafted, accepted)
        fade = DISCOUNT if drafted else IDLE_DISCOUNT
        # by kind, and with by_context also by context: a copy's drafts hold longer than those drafted afresh
        for key in (kind, (kind, self.after_kept)) if self.by_context else (kind,):
            for l, counts in enumerate(self.depth.setdefault(key, [[0.0, 0.0] for _ in range(self.k_max)]), start=1):
                counts[0] *= fade
                counts[1] *= fade
                if l <= drafted and l <= accepted + 1:  # drafted, and every draft before it was kept
                    counts[1] += 1
                    counts[0] += l <= accepted
        if kind is not None:
            self.by_kind[kind] = _counted(*self.by_kind.get(kind, (0.0, 0.0)), drafted, accepted)
        if drafted:  # the first token alone, in the context it was drafted in
            key = (kind, self.after_kept)
            self.by_context_kind[key] = _counted(*self.by_context_kind.get(key, (0.0, 0.0)), 1, min(accepted, 1))
        self.after_kept = bool(drafted) and accepted == drafted


def _mean(old: float | None, new: float) -> float:
    """A running average of a cost. Timing noise is one-sided (nothing runs much faster than
    it can): a slow sample (a first call, a busy moment) counts only up to SLOW_DRAFT times
    the average, and a fast one counts more than a slow one."""
    if old is None:
        return new
    if new > old:
        return 0.8 * old + 0.2 * min(new, SLOW_DRAFT * old)
    return 0.5 * old + 0.5 * new


def _counted(acc: float, rej: float, drafted: int, accepted: int) -> tuple[float, float]:
    """Discounted (accepted, rejected) counts after a step that drafted `drafted` tokens."""
    if not drafted:  # not tried: the memory fades slowly, so an unlucky drafter is tried again
        return IDLE_DISCOUNT * acc, IDLE_DISCOUNT * rej
    # The tokens after the first rejection were never judged: count only up to it.
    return DISCOUNT * acc + accepted, DISCOUNT * rej + (1 if accepted < drafted else 0)
