"""Compare drafters: the baseline and every drafter on one prompt, fairly timed.

Fair means what the Playground does for its two runs, for all of them: every arm is warmed
up first (untimed), then the arms advance in turn, the one with the fewest tokens next
(interleave.py), so none pays the first-run costs alone and all meet the machine's
conditions at the same point of the text. That is repeated: each round gives every arm a
speedup over the baseline of the same round, and the table shows their median and range.
Run first, once and cold, the baseline looked slow (docs/performance.md).

A drafter named NAME@block (or NAME@token, NAME@drawn, NAME@chosen) runs with that rule whatever the page's
setting (run/arms.py, as everywhere), so one drafter can race itself under both rules on the same prompt.

Suffix decoding reads the visitor's memory of earlier answers but adds nothing to it here:
every round must find the memory as the first did, or round 2 would draft round 1's answer.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from ...core.errors import SpecvizError
from ...drafters.suffix_memory import SuffixMemory
from ...render import Trace
from ...render.numbers import MIN_TOKENS
from ...render.status import count
from ...run.race import Race, baseline
from ...run.arms import parse_arm
from ...run.spec import NONE
from .limits import Deadline
from ..policy import Policy
from .runner import Frame, Worker, end_frame, finish_frame, preparing, readable, stepping, waiting
from ...run.settings import Settings

ROUNDS = 3  # timed rounds after the warm-up: enough for a median and a range
BASE = "base"  # the baseline's key in the race; the arms' are their index in frame.runs


@dataclass
class CompareFrame(Frame):
    """A Frame that also keeps each finished round's tokens/s, baseline first, then each run."""

    rounds: list = field(default_factory=list)


def compare_drafters(s: Settings, policy: Policy, models, should_stop: Callable[[], bool],
                      drafters: list[str] = (), rounds: int = ROUNDS, memory=None) -> Iterator[CompareFrame]:
    """Warm every arm up, then `rounds` raced rounds (run/race.py) of the baseline and every drafter."""
    drafters = list(dict.fromkeys(d.strip() for d in drafters if d and d.strip()))
    frame = CompareFrame(base=Trace("baseline", speculative=False), runs=[Trace(d, k=s.k) for d in drafters],
                         greedy=s.greedy, target=s.target)
    asked = _asked(frame, s)
    error, should_stop = None, Deadline(should_stop, policy.max_run_seconds)
    try:
        if not drafters:
            raise SpecvizError("pick at least one drafter to compare with the baseline")
        policy.check(replace(s, drafter=NONE))
        for arm in asked.values():
            policy.check_drafter(arm.spec.text)
        p = yield from preparing(s, policy, models, frame, should_stop)  # the target: each arm's drafter follows
        race = Race(models, p.target, p.ids, {BASE: baseline(p.cfg), **asked}, remember=False)
        memory = SuffixMemory() if memory is None else memory  # never the process's: visitors share it
        yield from stepping(race.prepare(memory, cache_bytes=policy.model_bytes), frame, should_stop)
        for i, e in race.failed.items():
            frame.runs[i].error = readable(e, policy.hosted)
        should_stop.start()
        with Worker() as worker:  # the model's work on one thread; this one keeps the page told
            yield from stepping(race.warm(p.cfg), frame, should_stop, worker)
            yield from _rounds(frame, race, rounds, should_stop, worker)
        finish_frame(frame, should_stop)
        _say_done(frame, len(p.ids), should_stop)
    except Exception as e:
        error = e
    yield end_frame(frame, error, policy.hosted)


def _asked(frame: CompareFrame, s: Settings) -> dict:
    """Index in frame.runs -> its Arm; a name that does not parse is its panel's error."""
    asked = {}
    for i, trace in enumerate(frame.runs):
        try:
            asked[i] = parse_arm(trace.label, s.config())
            trace.label = asked[i].label
        except SpecvizError as e:
            trace.error = str(e)
    return asked


def _rounds(frame: CompareFrame, race: Race, rounds: int, should_stop, worker: Worker):
    """Each round raced on fresh traces; a round whose speedups mean something keeps its tokens/s."""
    arms = len(race.drafters) - 1
    for r in range(rounds):
        if should_stop() or not arms:
            return
        turns = f"Round {r + 1} of {rounds}: {count(arms + 1, 'run')} taking turns"
        frame.message = f"{turns}, each reading the prompt first (prefill of {count(len(race.ids), 'token')})"
        frame.fraction = r / rounds
        yield from _round(frame, race, should_stop, worker, turns)
        if _measured(list(race.traces.values())):
            frame.rounds.append([t.stats().tokens_per_s for t in [frame.base, *frame.runs]])


def _say_done(frame: CompareFrame, tokens: int, should_stop) -> None:
    n = len(frame.rounds)
    if frame.state == "done" and should_stop():  # stopped in the warm-up or between rounds: no run says so
        frame.state = "stopped"
        frame.message = (f"Stopped after {count(n, 'timed round')}." if n or any(t.events for t in frame.runs)
                         else "Stopped during the warm-up, before any timed round.")
    if frame.state == "done":
        frame.message = (f"Done: {count(n, 'round')} of every run taking turns after a warm-up, on a prompt "
                         f"of {count(tokens, 'token')}; speedups are the median (range) over the rounds.")
    if any(t.error for t in frame.runs) and frame.state == "done":
        frame.message += " Some drafters could not run: see their panels."


def _measured(traces: list[Trace]) -> bool:
    """A round whose speedups mean something: every run ended by itself (a run Stop cut short is
    timed to where it was cut) with the tokens the Playground needs before it shows a speedup."""
    return all(t.done and t.stats().stop_reason != "cancelled" and t.stats().tokens >= MIN_TOKENS for t in traces)


def _round(frame: CompareFrame, race: Race, should_stop, worker: Worker, turns: str):
    """One timed round, every arm's panel growing as its events come (each made on `worker`; a
    step that takes seconds, such as a long prompt's prefill, is counted in the status). Once every
    arm has read the prompt the status says `turns` alone: "reading the prompt first" stayed 12 s on."""
    events, said = race.run(should_stop), frame.message
    frame.base, frame.runs = race.traces[BASE], [race.traces.get(i, t) for i, t in enumerate(frame.runs)]
    while (yield from waiting(lambda: next(events, None), frame, lambda t: f"{said} · {t} s",
                              worker=worker)) is not None:
        if said != turns and all(t.events for t in race.traces.values()):
            frame.message = said = turns
        yield frame
