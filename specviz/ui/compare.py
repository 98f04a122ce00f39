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

from ..core.errors import SpecvizError
from ..engine.generate import baseline_generate, speculative_generate
from ..render import Trace
from ..render.numbers import MIN_TOKENS
from ..render.status import count
from ..run.prepare import warm
from ..run.race import race
from ..run.arms import parse_arm
from ..run.spec import NONE, check_length
from .limits import Deadline
from .policy import Policy
from .runner import (Frame, Stopped, Worker, end_frame, finish_frame, make_drafter, preparing, readable, stepping,
                     waiting)
from ..run.settings import Settings

ROUNDS = 3  # timed rounds after the warm-up: enough for a median and a range


@dataclass
class CompareFrame(Frame):
    """A Frame that also keeps each finished round's tokens/s, baseline first, then each run."""

    rounds: list = field(default_factory=list)


def compare_drafters(s: Settings, policy: Policy, models, should_stop: Callable[[], bool],
                      drafters: list[str] = (), rounds: int = ROUNDS, memory=None) -> Iterator[CompareFrame]:
    """Warm every arm up, then `rounds` interleaved rounds of the baseline and every drafter."""
    drafters = list(dict.fromkeys(d.strip() for d in drafters if d and d.strip()))
    asked = {}  # index in frame.runs -> its Arm; a name that does not parse is its panel's error
    frame = CompareFrame(base=Trace("baseline", speculative=False), runs=[Trace(d, k=s.k) for d in drafters],
                         greedy=s.greedy, target=s.target)
    for i, (name, trace) in enumerate(zip(drafters, frame.runs)):
        try:
            asked[i] = parse_arm(name, s.config())
            trace.label = asked[i].label
        except SpecvizError as e:
            trace.error = str(e)
    error, should_stop = None, Deadline(should_stop, policy.max_run_seconds)
    try:
        if not drafters:
            raise SpecvizError("pick at least one drafter to compare with the baseline")
        policy.check(replace(s, drafter=NONE))
        for arm in asked.values():
            policy.check_drafter(arm.spec.text)
        p = yield from preparing(s, policy, models, frame, should_stop)  # the target: each arm's drafter follows
        target, ids, cfg = p.target, p.ids, p.cfg
        arms = {}  # index in frame.runs -> (its config, with the target's end-of-turn tokens; its drafter or None)
        for i, arm in asked.items():
            if should_stop():
                break
            try:
                drafter = yield from make_drafter(models, arm.spec, target, frame, should_stop, policy.model_bytes,
                                                  memory)
                check_length(drafter, arm.cfg.k)
            except Stopped:
                raise
            except Exception as e:  # one bad drafter must not sink the others
                frame.runs[i].error = readable(e, policy.hosted)
                continue
            arms[i] = replace(arm.cfg, eos_token_ids=cfg.eos_token_ids), drafter
        should_stop.start()
        with Worker() as worker:  # the model's work on one thread; this one keeps the page told
            # The Playground's warm-up (run/prepare.py), of every arm: none pays the first-run costs alone.
            drafters = [None, *(drafter for _, drafter in arms.values())]
            yield from stepping(warm(p, curve=False, drafters=drafters), frame, should_stop, worker)
            for r in range(rounds):
                if should_stop() or not arms:
                    break
                turns = f"Round {r + 1} of {rounds}: {count(len(arms) + 1, 'run')} taking turns"
                frame.message = f"{turns}, each reading the prompt first (prefill of {count(len(ids), 'token')})"
                frame.fraction = r / rounds
                yield from _round(frame, target, arms, ids, cfg, should_stop, models, r > 0, worker, turns)
                if all(t.done for t in _timed(frame, arms)) and _measured(_timed(frame, arms)):
                    frame.rounds.append([t.stats().tokens_per_s for t in [frame.base, *frame.runs]])
        finish_frame(frame, should_stop)
        n = len(frame.rounds)
        if frame.state == "done" and should_stop():  # stopped in the warm-up or between rounds: no run says so
            frame.state = "stopped"
            frame.message = (f"Stopped after {count(n, 'timed round')}." if n or any(t.events for t in frame.runs)
                             else "Stopped during the warm-up, before any timed round.")
        if frame.state == "done":
            frame.message = (f"Done: {count(n, 'round')} of every run taking turns after a warm-up, on a prompt "
                             f"of {count(len(ids), 'token')}; speedups are the median (range) over the rounds.")
        if any(t.error for t in frame.runs) and frame.state == "done":
            frame.message += " Some drafters could not run: see their panels."
    except Exception as e:
        error = e
    yield end_frame(frame, error, policy.hosted)


def _streams(target, arms: dict, ids, cfg, should_stop) -> dict:
    """The baseline first, then each drafter's run (under its own config), as engine event streams."""
    streams = {"base": baseline_generate(target.model, ids, cfg, should_stop)}
    for i, (own, drafter) in arms.items():
        streams[i] = speculative_generate(target.model, drafter, ids, own, should_stop, remember=False)
    return streams


def _timed(frame: CompareFrame, arms: dict) -> list[Trace]:
    return [frame.base, *(frame.runs[i] for i in arms)]


def _measured(traces: list[Trace]) -> bool:
    """A round whose speedups mean something: every run ended by itself (a run Stop cut short is
    timed to where it was cut) with the tokens the Playground needs before it shows a speedup."""
    return all(t.stats().stop_reason != "cancelled" and t.stats().tokens >= MIN_TOKENS for t in traces)


def _round(frame: CompareFrame, target, arms: dict, ids, cfg, should_stop, models, again: bool, worker: Worker,
           turns: str):
    """One timed round, every arm's panel growing as its events come (each made on `worker`; a
    step that takes seconds, such as a long prompt's prefill, is counted in the status). Once every
    arm has read the prompt the status says `turns` alone: "reading the prompt first" stayed 12 s on."""
    if again:  # fresh traces: the panels show the round under way
        frame.base = Trace(frame.base.label, speculative=False)
        frame.runs = [Trace(t.label, k=t.k) if i in arms else t for i, t in enumerate(frame.runs)]
    traces = {"base": frame.base, **{i: frame.runs[i] for i in arms}}
    events, said = race(models, target, ids, _streams(target, arms, ids, cfg, should_stop)), frame.message
    while (item := (yield from waiting(lambda: next(events, None), frame, lambda t: f"{said} · {t} s",
                                       worker=worker))) is not None:
        name, event, labels = item
        traces[name].add(event, labels)
        if said != turns and all(t.events for t in traces.values()):
            frame.message = said = turns
        yield frame
