"""Replaying draft-length controllers on a draft record, and the best k at every step in hindsight.

A greedy record (draft_record.py) replays exactly: a step at position i drafting j tokens keeps
min(j, match_i) and emits one more, so every controller's k per step, drafts kept and target passes are
what a live run of it gives on the same text. Time is priced from the record: T(1) times v(j + 1) from
the machine's measured verify curve, plus c per drafter forward (a draft stopped by a confidence check
before a token ran the drafter once more than it drafted), plus the prefill. A sampled record replays in
expectation: rollouts whose coins fall with each position's recorded chance of a first draft token being
kept (the mean over them, labelled so), not the run that would happen.

The hindsight best is a dynamic programme over positions: the least time from position i to the end is
the least, over draft lengths j, of step i's cost plus the least time from where that step lands. It
knows what no controller can (where each copy breaks), so it is the ceiling on this text and machine.
Pure arithmetic over the record: no model, no torch.
"""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Sequence

from ..core.metrics import HINDSIGHT
from . import controller_names
from .controllers import K_RECORD, sized
from .draft_length import Prices
from .draft_record import DraftRecord

ROLLOUTS = 200  # a sampled record's rollouts per controller


class Rates:
    """Tokens per target pass and per second of a run with .tokens, .passes and .seconds (a replay's or
    a live run's)."""

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.passes if self.passes else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Replayed(Rates):
    """One controller on one record: its steps (a sampled record's: one rollout's) and its totals."""

    controller: str
    positions: tuple[int, ...]  # where each step started
    ks: tuple[int, ...]  # the length each step asked for (within the room left)
    drafted: tuple[int, ...]
    accepted: tuple[int, ...]
    tokens: int
    passes: float  # target passes after the prefill (a sampled record's: the mean over rollouts)
    seconds: float  # prefill included
    exact: bool  # False: in expectation (a sampled record)



def prices(record: DraftRecord) -> Prices:
    """The record's costs as dynamic k reads prices: its verify curve and drafting cost."""
    return Prices(lambda m: verify_ratio(record, m), record.draft_cost, dict(record.draft_cost_by_kind))


def verify_ratio(record: DraftRecord, m: int) -> float:
    v = record.verify
    return v[min(max(m, 1), len(v)) - 1]


def step_seconds(record: DraftRecord, drafted: int, forwards: int, kind) -> float:
    """One step's priced time: a pass over drafted + 1 tokens, and the drafter's forwards."""
    c = record.draft_cost_by_kind.get(kind, record.draft_cost)
    return record.step_seconds * (verify_ratio(record, drafted + 1) + c * forwards)


def drafted_under(stop, draft: Sequence[int], q: Sequence[float], size: int) -> tuple[int, int]:
    """(tokens drafted, drafter forwards) of a draft of `size` from the maximal `draft`, under a confidence
    stop (drafters/base.StopRule; None: none): the draft ends where the rule stops it or the drafter has no more."""
    n = min(size, len(draft))
    judge = getattr(stop, "judge", None)
    if stop is None or (not stop and judge is None):
        return n, n
    for i in range(n):
        if judge is not None and judge(i, q[i]):
            return i, i + 1
        if getattr(stop, "after", False):
            if q[i] < stop:
                return i + 1, i + 1
        elif (i > 0 or getattr(stop, "first", False)) and q[i] < stop:
            return i, i + 1  # the drafter ran to see position i's q, then stopped
    return n, n


def replay(record: DraftRecord, name: str, seed: int = 0) -> Replayed:
    """The controller `name` (controller_names) replayed on `record`: exactly when greedy, else in expectation."""
    if record.greedy:
        return _replay_greedy(record, name)
    rng = random.Random(seed)
    runs = [_rollout(record, name, rng) for _ in range(ROLLOUTS)]
    first = runs[0]
    return Replayed(first.controller, first.positions, first.ks, first.drafted, first.accepted, first.tokens,
                    statistics.fmean(r.passes for r in runs), statistics.fmean(r.seconds for r in runs), False)


def _replay_greedy(record: DraftRecord, name: str) -> Replayed:
    controller = controller_names.build(name, prices(record))
    n, matches = len(record.output), record.matches
    i, seconds, steps = 0, record.prefill_seconds, []
    while i < n:
        kind = record.kinds[i]
        k = sized(controller.next(kind), record.budget - i)
        d, forwards = drafted_under(controller.stop, record.drafts[i], record.q[i], k)
        a = min(matches[i], d)
        controller.observe(d, a, record.q[i][:d], kind)
        seconds += step_seconds(record, d, forwards, kind)
        steps.append((i, k, d, a))
        i += min(a + 1, n - i)
    return _replayed(controller.name, steps, n, len(steps), seconds, True)


def _rollout(record: DraftRecord, name: str, rng: random.Random) -> Replayed:
    """One sampled rollout: draft j at position i keeps each token with the chance recorded at its position."""
    controller = controller_names.build(name, prices(record))
    n = len(record.output)
    i, seconds, steps = 0, record.prefill_seconds, []
    while i < n:
        kind = record.kinds[i]
        k = sized(controller.next(kind), record.budget - i)
        q = [record.first_q[min(i + j, n - 1)] for j in range(len(record.drafts[i]))]  # q along the output
        d, forwards = drafted_under(controller.stop, record.drafts[i], q, k)
        a = 0
        while a < d and i + a < n and rng.random() < record.accept[i + a]:
            a += 1
        controller.observe(d, a, q[:d], kind)
        seconds += step_seconds(record, d, forwards, kind)
        steps.append((i, k, d, a))
        i += min(a + 1, n - i)
    return _replayed(controller.name, steps, n, len(steps), seconds, False)


def _replayed(name, steps, tokens, passes, seconds, exact) -> Replayed:
    pos, ks, ds, acc = (tuple(x) for x in zip(*steps)) if steps else ((), (), (), ())
    return Replayed(name, pos, ks, ds, acc, tokens, passes, seconds, exact)


def hindsight(record: DraftRecord) -> Replayed:
    """The least-time draft length at every step, knowing the record (in expectation when sampled)."""
    n = len(record.output)
    chances = _kept_chances(record)
    best, choice, passes = [0.0] * (n + 1), [0] * n, [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        top = min(len(record.drafts[i]), sized(K_RECORD, record.budget - i))
        options = []
        for j in range(top + 1):
            # (probability, tokens emitted) of each outcome of drafting j at i
            outcomes = _outcomes(chances[i], j, n - i)
            cost = step_seconds(record, j, j, record.kinds[i])
            options.append((cost + sum(p * best[i + e] for p, e in outcomes), j, outcomes))
        best[i], choice[i], outcomes = min(options, key=lambda o: (o[0], o[1]))
        passes[i] = 1.0 + sum(p * passes[i + e] for p, e in outcomes)
    steps, i = [], 0
    while i < n:  # the path: greedy exactly; sampled, each step landing where it keeps most likely
        j = choice[i]
        outcomes = _outcomes(chances[i], j, n - i)
        e = max(outcomes, key=lambda o: o[0])[1]
        steps.append((i, j, j, e - 1))
        i += e
    return _replayed(HINDSIGHT, steps, n, passes[0], record.prefill_seconds + best[0], record.greedy)


def _kept_chances(record: DraftRecord) -> list[list[float]]:
    """Per position i, the chance each token of a draft from i is kept given the ones before it were."""
    n = len(record.output)
    if record.greedy:
        return [[1.0] * m + [0.0] for m in record.matches]
    return [[record.accept[min(i + j, n - 1)] for j in range(K_RECORD)] + [0.0] for i in range(n)]


def _outcomes(chance: list[float], j: int, left: int) -> list[tuple[float, int]]:
    """[(probability, tokens emitted)] of a step drafting j: a of them kept, then the target's own token."""
    out, reach = [], 1.0  # reach: the chance the first a drafts were all kept
    for a in range(j + 1):
        p = reach * (1.0 - chance[a] if a < j else 1.0)
        if p > 0:
            out.append((p, min(a + 1, left)))
        if a < j:
            reach *= chance[a]
        if reach == 0:
            break
    return out
