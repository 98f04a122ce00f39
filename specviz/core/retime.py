"""Re-timing a run: the same accept/reject decisions, costed on other hardware.

A run's speedup is its decisions (how many tokens each step drafted, verified and kept)
times what drafting and verifying cost on the machine it ran on. Re-timing keeps the
decisions and swaps the costs for a hardware profile's: a verify pass over m tokens costs
v(m) plain decode steps, a drafted token c of them. That answers "what would this run's
alpha give where verifying is nearly free?" without running anything: a calculation, to
be labelled as such, never as a measurement.

The unit is one plain decode step of this run's own baseline (its mean step time, T(1)).
What is neither drafting nor verifying (the prefill, the engine's bookkeeping) stays at its
measured length in those units on every profile: it is the same work on both sides.
Profile "as measured" uses each step's recorded seconds, so it gives back the measured
speedup; the others cost each step from v and c alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .errors import SpecvizError
from .events import StepEvent, TokenEvent
from .metrics import cost_ratio

GPU_FLAT = 16  # a GPU-like verify pass costs one step up to this many tokens, then grows with them


@dataclass(frozen=True)
class StepCost:
    """What one step did, as re-timing needs it."""

    verified: int  # tokens in its one target pass: the pending token and every drafted one (each tree node)
    drafted: int  # tokens the drafter proposed
    emitted: int  # tokens the step added to the output
    draft_time: float  # measured seconds
    verify_time: float


@dataclass(frozen=True)
class RunTiming:
    """One run as re-timing sees it: its steps, and the seconds spent outside them."""

    steps: tuple[StepCost, ...]
    other: float  # elapsed minus drafting and verifying: prefill and bookkeeping

    @property
    def tokens(self) -> int:
        return sum(s.emitted for s in self.steps)


def run_timing(events, elapsed: float) -> RunTiming:
    """A run's StepEvents (speculative) or TokenEvents (baseline) and its engine seconds."""
    steps = []
    for e in events:
        if isinstance(e, StepEvent):
            drafted = len(e.tree.tokens) if e.tree is not None else len(e.draft)
            steps.append(StepCost(drafted + 1, drafted, len(e.emitted), e.draft_time, e.verify_time))
        elif isinstance(e, TokenEvent):
            steps.append(StepCost(1, 0, 1, 0.0, e.time))
    spent = sum(s.draft_time + s.verify_time for s in steps)
    return RunTiming(tuple(steps), max(0.0, elapsed - spent))


@dataclass(frozen=True)
class Profile:
    """What drafting and verifying cost on some hardware, in plain decode steps."""

    name: str  # as the page says it: "this machine (as measured)", "a GPU-like machine ..."
    verify: Callable[[float], float] | None = None  # v(m), a pass over m tokens / one plain step; None: as measured
    c: float | None = None  # one drafted token / one plain step; None: as measured


def as_measured() -> Profile:
    return Profile("this machine (as measured)")


def from_curve(cost: Callable[[float], float], c: float) -> Profile:
    """This machine's cost model: its measured verify curve (VerifyCurve.cost) and draft cost c."""
    return Profile("this machine's verify-cost curve", cost, c)


def linear(flat: float, slope: float) -> Callable[[float], float]:
    """v(m) = 1 up to `flat` tokens, then `slope` of a step per token beyond (a roofline:
    memory-bound while flat, arithmetic-bound after)."""
    return lambda m: 1.0 + slope * max(0.0, m - flat)


def gpu_like(c: float) -> Profile:
    """Verify flat up to GPU_FLAT tokens, then proportional to them; drafting at `c`."""
    return Profile(f"a GPU-like machine (verify flat to {GPU_FLAT} tokens)", linear(GPU_FLAT, 1.0 / GPU_FLAT), c)


def custom(slope: float, c: float) -> Profile:
    return Profile(f"a custom machine (each extra verified token +{slope:.2f} step, c = {c:.2f})",
                   linear(1, slope), c)


@dataclass(frozen=True)
class Retimed:
    """Both runs' time on a profile, in plain decode steps, split by what it was spent on."""

    profile: Profile
    spec: dict  # {"other", "passes", "extra verify", "drafting"}: steps of each
    base: dict
    spec_tokens: int
    base_tokens: int
    step_seconds: float  # T(1): this run's measured plain step, the unit

    @property
    def speedup(self) -> float:
        spec, base = sum(self.spec.values()), sum(self.base.values())
        if not (spec > 0 and base > 0 and self.base_tokens):
            return 0.0
        return (self.spec_tokens / spec) / (self.base_tokens / base)


def step_seconds(base: RunTiming) -> float:
    """T(1): the baseline's mean seconds per plain decode step."""
    return sum(s.verify_time for s in base.steps) / len(base.steps) if base.steps else 0.0


def draft_cost(spec: RunTiming, base: RunTiming) -> float:
    """c: the run's measured drafting seconds per drafted token, in plain steps."""
    return cost_ratio(sum(s.draft_time for s in spec.steps), sum(s.drafted for s in spec.steps), step_seconds(base))


def _costed(run: RunTiming, profile: Profile, t1: float) -> dict:
    passes = float(len(run.steps))  # each pass costs at least one plain step
    if profile.verify is None:
        verify = sum(s.verify_time for s in run.steps) / t1
        drafting = sum(s.draft_time for s in run.steps) / t1
    else:
        verify = sum(profile.verify(s.verified) for s in run.steps)
        drafting = profile.c * sum(s.drafted for s in run.steps)
    passes = min(passes, verify)  # as measured, a pass may run a little under the mean step
    return {"other": run.other / t1, "passes": passes, "extra verify": verify - passes, "drafting": drafting}


def retime(spec: RunTiming, base: RunTiming, profile: Profile) -> Retimed:
    """The two runs' decisions costed on `profile`."""
    t1 = step_seconds(base)
    if t1 <= 0:
        raise SpecvizError("re-timing needs the baseline run: its step time is the unit")
    return Retimed(profile, _costed(spec, profile, t1), _costed(base, profile, t1), spec.tokens, base.tokens, t1)
