"""Draft-length controllers: the rules engines use to choose how many tokens to draft each step.

Each rule is written from its engine's documented behaviour (the docstrings name the source), as a
small object the engine asks before each step (`next`) and tells after it (`observe`: how many were
drafted and kept, and the drafter's q of each drafted token). A rule that stops a draft by the
drafter's confidence says how in `stop` (drafters/base.StopRule), which the drafter applies while
drafting. Every rule here decides from counts and q alone, never from timings, so a run's greedy
record (draft_record.py) replays it exactly (draft_replay.py); specviz's own dynamic k does too when
it is given its prices up front (draft_length.Prices), as a replay and its live check are.

Names and parameters are parsed in controller_names.py.
"""
from __future__ import annotations

from typing import Sequence

from ..drafters.base import StopRule
from .draft_length import DraftLength, Prices

K_RECORD = 16  # the longest draft any controller asks for: a record holds drafts this long


def sized(wanted: int, room: int) -> int:
    """A step's draft length: what the rule wants, at most K_RECORD and room - 1 (the target adds one)."""
    return max(0, min(int(wanted), K_RECORD, room - 1))


class Controller:
    """A draft-length rule. The engine reads it through the policy interface DraftLength has
    (`plan`, `confidence`, `record`); a replay calls `next` and `observe` directly."""

    name = ""  # as typed ("sglang-adaptive"); controller_names.build sets the full name with parameters
    stop: StopRule | None = None  # the drafter's confidence stop, where the rule has one

    def next(self, kind=None) -> int:
        raise NotImplementedError

    def observe(self, drafted: int, accepted: int, q: Sequence[float] | None = None, kind=None) -> None:
        """One step drafted `drafted` tokens and the target kept `accepted`; q: the drafter's probability of
        each drafted token (None: a deterministic drafter, q = 1)."""

    # The engine's policy interface (engine/generate.py asks DraftLength the same).
    @property
    def confidence(self) -> float:
        return self.stop if self.stop is not None else 0.0

    def plan(self, drafter, ids: list[int], room: int) -> tuple[object, int]:
        if drafter is None:
            return None, 0
        kind = drafter.plan(ids)
        return kind, sized(self.next(kind), room)

    def record(self, drafted: int, accepted: int, draft_time: float, verify_time: float, kind=None,
               q: Sequence[float] | None = None) -> None:
        self.observe(drafted, accepted, q, kind)


class Fixed(Controller):
    """k tokens every step."""

    def __init__(self, k: int = 4):
        self.k = k

    def next(self, kind=None) -> int:
        return self.k


class SGLangAdaptive(Controller):
    """SGLang's `--speculative-adaptive` (docs/advanced_features/adaptive_speculative_decoding.md): tiers of
    `candidate_steps`; after each verify the accepted draft length enters an EMA (alpha `ema`); after
    `warmup` verifies, every `interval` verifies, the tier moves to clamp(round(EMA) + 1): down to a lower
    tier s while EMA <= s - 0.5 + `down` (hysteresis), up past the current tier s while EMA > s - 0.5 + `up`.
    The start is snapped to the nearest tier; the EMA starts at start - 1, where the tier holds."""

    def __init__(self, steps: Sequence[int] = (1, 3, 7), ema: float = 0.2, warmup: int = 10, interval: int = 5,
                 down: float = -0.25, up: float = 0.0, start: int = 3):
        self.tiers = sorted(set(steps))
        self.current = min(self.tiers, key=lambda s: (abs(s - start), s))
        self.alpha, self.warmup, self.interval, self.down, self.up = ema, warmup, interval, down, up
        self.ema = float(self.current - 1)
        self.verifies = 0

    def next(self, kind=None) -> int:
        return self.current

    def observe(self, drafted, accepted, q=None, kind=None) -> None:
        self.ema = (1 - self.alpha) * self.ema + self.alpha * accepted
        self.verifies += 1
        if self.verifies <= self.warmup or (self.verifies - self.warmup) % self.interval:
            return
        i = self.tiers.index(self.current)
        while i > 0 and self.ema <= self.tiers[i - 1] - 0.5 + self.down:
            i -= 1
        while i < len(self.tiers) - 1 and self.ema > self.tiers[i] - 0.5 + self.up:
            i += 1
        self.current = self.tiers[i]


class SGLangAuto(Controller):
    """SGLang's `--auto-spec` (docs/advanced_features/auto_spec.md), batch size 1: an EMA (alpha `ema`,
    starting at 0.5) of each verify's acceptance rate, (accepted + 1) / (steps + 1) as its engine counts it;
    at or above `pos` (--pos-threshold) the next larger of the allowed `steps`, below `neg` the next smaller.
    Batch 1's defaults: steps 3-6 from 5, thresholds 0.55 and 0.50."""

    def __init__(self, steps: Sequence[int] = (3, 4, 5, 6), start: int = 5, pos: float = 0.55, neg: float = 0.50,
                 ema: float = 0.3):
        self.steps = sorted(set(steps))
        self.current = min(self.steps, key=lambda s: (abs(s - start), s))
        self.pos, self.neg, self.alpha = pos, neg, ema
        self.rate = 0.5

    def next(self, kind=None) -> int:
        return self.current

    def observe(self, drafted, accepted, q=None, kind=None) -> None:
        rate = (accepted + 1) / (self.current + 1)
        self.rate = self.alpha * rate + (1 - self.alpha) * self.rate
        if self.rate >= self.pos:
            self.current = next((s for s in self.steps if s > self.current), self.current)
        elif self.rate < self.neg:
            self.current = next((s for s in reversed(self.steps) if s < self.current), self.current)


class LlamaPMin(Controller):
    """llama.cpp's draft loop (common/speculative.cpp; `--draft-max`, `--draft-p-min`): draft up to `max`
    tokens, and before each one, the first included, stop when the drafter's top probability is below `p`."""

    def __init__(self, p: float = 0.75, max: int = K_RECORD):
        self.max = max
        self.stop = StopRule(p, first=True)

    def next(self, kind=None) -> int:
        return self.max


class HFHeuristic(Controller):
    """transformers' assisted generation, `num_assistant_tokens_schedule="heuristic"`: start at
    `num_assistant_tokens` (`start`, default 20); after each step, +2 when every drafted token was kept,
    else -1 (at least 1). A step that drafted nothing (no candidates) changes nothing."""

    def __init__(self, start: int = 20):
        self.tokens = start

    def next(self, kind=None) -> int:
        return self.tokens

    def observe(self, drafted, accepted, q=None, kind=None) -> None:
        if drafted:
            self.tokens = self.tokens + 2 if accepted == drafted else max(1, self.tokens - 1)


class HFConfidence(Controller):
    """transformers' assisted generation at its defaults (`num_assistant_tokens` 20, schedule "constant",
    `assistant_confidence_threshold` 0.4): the assistant stops after a token whose own probability is below
    the threshold (ConfidenceCriteria); with `adapt` the threshold then moves, as transformers does where
    scikit-learn is installed, to the one minimising fpr + 3 fnr over every drafted token judged so far (its
    probability against whether the target kept it: false negatives weigh 75%)."""

    def __init__(self, threshold: float = 0.4, k: int = 20, adapt: bool = True):
        self.k, self.adapt = k, adapt
        self.stop = StopRule(threshold, after=True)
        self.probs: list[float] = []
        self.matches: list[int] = []

    def next(self, kind=None) -> int:
        return self.k

    def observe(self, drafted, accepted, q=None, kind=None) -> None:
        if not drafted or not self.adapt:
            return
        judged = min(drafted, accepted + 1)  # the kept tokens and the first refused one
        self.probs += [1.0] * judged if q is None else [float(x) for x in q[:judged]]
        self.matches += [1] * accepted + [0] * (judged - accepted)
        if len(self.probs) > 5 and 0 in self.matches and 1 in self.matches:
            self.stop = StopRule(min_cost_threshold(self.probs, self.matches), after=True)


def min_cost_threshold(probs: Sequence[float], matches: Sequence[int], fn_weight: float = 3.0) -> float:
    """The threshold t minimising fpr + fn_weight * fnr when tokens with prob >= t count as kept
    (a ROC curve's points, from the highest threshold down; the first on ties)."""
    pos = sum(matches)
    neg = len(matches) - pos
    best, best_cost = float("inf"), fn_weight  # above every prob: nothing predicted kept
    for t in sorted(set(probs), reverse=True):
        tp = sum(1 for p, m in zip(probs, matches) if p >= t and m)
        fp = sum(1 for p, m in zip(probs, matches) if p >= t and not m)
        cost = fp / neg + fn_weight * (1 - tp / pos)
        if cost < best_cost:
            best, best_cost = t, cost
    return best


BINS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)  # upper edges of the q bins calibrated
CALIBRATION_PRIOR = 2.0  # pseudo-judgements per bin at q itself: a drafter's q is its own first guess
EXTEND = False  # a model draft (one with q) is asked for the longest length; its q stop ends it
JUDGE_FIRST = True
EARNED_MEMORY = 0.9
SCALE = 1.0


class Specviz(Controller):
    """specviz's own dynamic k (draft_length.py): each step the length with the most expected tokens per
    pass, from acceptance learned by depth and kind of draft (a copy's first token also by whether the step
    before kept its draft whole: DraftLength's by_context). Given `prices` (a replay, or a live run checked
    against one) it prices steps from them, and a draft with q is cut where its next token, its q calibrated
    on the tokens judged so far, would earn less than its own cost at the plan's rate; without prices it
    learns costs from its own timings, as `--dynamic-k` does."""

    def __init__(self, start: int = 4, prices: Prices | None = None):
        self.length = DraftLength(start, K_RECORD, True, prices=prices)
        self.prices = prices
        self.bins = [[0.0, 0.0] for _ in BINS]  # per q bin: drafted tokens kept, judged
        self.with_q: dict = {}  # kind -> its drafts carry a drafter's q
        self.stop = StopRule(0.0, judge=self._judge) if prices is not None else None
        self.c, self.reach = 0.0, 1.0
        self.tokens = self.spent = 0.0  # discounted: tokens emitted and one-token passes spent, as priced

    def next(self, kind=None) -> int:
        # Copies are read by context (a copy kept whole tends to go on); a model's drafts, whose tokens
        # carry q, are cut by their q instead, and counting them by context cost EAGLE ~3% of its speed.
        self.length.by_context = not self.with_q.get(kind, False)
        j = self.length.next(kind)
        if self.prices is not None:
            self.c = self.prices.c(kind)
            if EXTEND and j and self.with_q.get(kind):
                j = K_RECORD
        return j

    def calibrated(self, q: float) -> float:
        """P(a drafted token is kept | its q), from the tokens judged so far, leaning on q itself."""
        kept, judged = self.bins[next(b for b, edge in enumerate(BINS) if q < edge or edge == BINS[-1])]
        return (kept + CALIBRATION_PRIOR * q) / (judged + CALIBRATION_PRIOR)

    def _judge(self, i: int, q: float) -> bool:
        if q >= 1.0:  # a copy, or a drafter sure of itself: nothing to weigh
            return False
        if i == 0:
            self.reach = 1.0
        a = self.calibrated(q)
        v = self.prices.ratios(i + 2)
        if (i or JUDGE_FIRST) and self.earned and self.reach * a < SCALE * self.earned * (v[i + 2] - v[i + 1] + self.c):
            return True
        self.reach *= a
        return False

    @property
    def earned(self) -> float:
        """Tokens per one-token pass this run has made lately: what a drafted token must earn for its cost."""
        return self.tokens / self.spent if self.spent else 0.0

    def observe(self, drafted, accepted, q=None, kind=None) -> None:
        self.length.record(drafted, accepted, 0.0, 0.0, kind)
        if self.prices is not None:
            v = self.prices.ratios(drafted + 1)[drafted + 1]
            self.tokens = EARNED_MEMORY * self.tokens + accepted + 1
            self.spent = EARNED_MEMORY * self.spent + v + self.prices.c(kind) * drafted
        q = [1.0] * drafted if q is None else q
        if drafted:
            self.with_q[kind] = any(x < 1.0 for x in q[:drafted])
        for l in range(min(drafted, accepted + 1)):
            if q[l] < 1.0:
                b = self.bins[next(b for b, edge in enumerate(BINS) if q[l] < edge or edge == BINS[-1])]
                b[0] += l < accepted
                b[1] += 1

    def record(self, drafted, accepted, draft_time, verify_time, kind=None, q=None) -> None:
        if self.prices is not None:
            self.observe(drafted, accepted, q, kind)
        else:
            self.length.record(drafted, accepted, draft_time, verify_time, kind)
