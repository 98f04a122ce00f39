"""Preparing a run, the same steps in the same order for every entry point: the settings read into the engine's
config, the target loaded, the prompt encoded, the drafter built (its draft model loaded where the target is),
then, before anything is timed, a warm-up and the target's verify-cost curve.

Each slow step is a Step, yielded to the caller, who runs its work and sends back what it returned: the CLI
runs it where it stands (a load's progress on stderr), the app on a thread while it keeps the page told (and
Stop pressed). So `generate` and the Playground cannot drift apart in what they do before a run, only in how
they show it; Compare prepares its target and warms up every arm's drafter with the same steps.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, replace
from typing import Callable, Generator, Sequence

from ..drafters.base import Drafter
from ..engine import verify_cost
from ..engine.generate import GenerationConfig, warm_up
from .arms import Arm
from .settings import Settings
from .spec import DrafterSpec, build, check_length, load_draft, model_name, placed_as

log = logging.getLogger(__name__)
Progress = Callable[[str, float], None]  # (what is happening, fraction done): a load's progress


@dataclass(frozen=True)
class Step:
    """A slow step: `says` what it does ("target SmolLM2-135M (embedded)", "Warming up ... (untimed)"),
    `work(progress)` does it; a `load` is a model's load, which reports its progress and may take minutes."""

    says: str
    work: Callable[[Progress | None], object]
    load: bool = False


@dataclass
class Prepared:
    target: object  # a models.Loaded
    ids: list[int]  # the prompt's token ids
    cfg: GenerationConfig  # with the target's end-of-turn tokens
    drafter: Drafter | None


Steps = Generator[Step, object, object]


def prepare(s: Settings, arm: Arm, models, *, chat: bool | None = None, memory=None,
            check_prompt: Callable[[int], None] | None = None, placed: dict | None = None, **load) -> Steps:
    """The steps up to the run of `arm` (parse_arm of s.drafter on s.config()), returning Prepared. chat: the template
    where the model has one (None), or not (False), or required (True); check_prompt(tokens): a deployment's limit;
    placed: the target's device, dtype and the like (models.load's); load: models.load's options for every
    model (cache_bytes, trust_remote_code). A value the engine would refuse is refused before any model loads."""
    target = yield Step(f"target {model_name(s.target)}",
                        lambda progress: models.load(s.target, progress=progress, **({"dtype": s.dtype} | (placed or {})),
                                                     **load), True)
    ids = models.encode_prompt(target, s.prompt, chat)
    if check_prompt is not None:
        check_prompt(len(ids))
    drafter = yield from drafter_steps(arm.spec, target, models, memory, **load)
    check_length(drafter, arm.cfg.k)
    return Prepared(target, ids, replace(arm.cfg, eos_token_ids=target.eos_token_ids), drafter)


def drafter_steps(spec: DrafterSpec, target, models, memory=None, **load) -> Steps:
    """The drafter `spec` names, returned; a draft model is loaded (a step) on the target's device, in its
    precision. memory: suffix decoding's (None: the process's)."""
    draft = None
    if spec.needs_model:
        draft = yield Step(f"draft model {model_name(spec.argument)}",
                           lambda progress: load_draft(models, spec.argument, target, progress=progress, **load),
                           True)
    return build(spec, target, memory=memory, draft=draft)


def warm(p: Prepared, curve: bool = True, drafters: Sequence[Drafter | None] | None = None) -> Steps:
    """A warm-up (untimed: one-time costs count in no run's tokens/s) of p's drafter, or of each of `drafters`
    (a race of several: Compare's), then the target's verify-cost curve (measured once per model and device;
    None when not asked for or it could not be measured): timed after the warm-up and before the runs, never
    inside them. The curve changes no draft (the engine never reads it): it explains the run (the predictions,
    the hardware view), so a caller that shows none of it need not spend the second or two it takes."""
    arms = [p.drafter] if drafters is None else drafters
    yield Step(f"Warming up {model_name(p.target.name)} (untimed)",
               lambda _: [warm_up(p.target.model, drafter, p.ids, p.cfg) for drafter in arms])
    if not curve:
        return None
    known = verify_cost.known(p.target.model)
    if known is not None:
        return known
    return (yield Step("Measuring the verify cost curve (once per model)", lambda _: _curve_or_none(p.target.model)))


def _curve_or_none(model):
    try:
        return verify_cost.curve(model)
    except Exception:  # the curve explains the run; failing to measure it must not stop the run
        log.exception("could not measure the verify cost curve")
        return None


def on_stderr() -> Progress:
    """A load's progress for a command line (generate, bench, train, audit): each new message a line on stderr."""
    said = [None]

    def progress(message: str, fraction: float) -> None:
        if message != said[0]:
            said[0] = message
            print(f"{message} ...", file=sys.stderr, flush=True)
    return progress


def drive(steps: Steps, work: Callable, through: tuple = ()):
    """Run every step by `work(step)`, a generator returning the step's result (what it yields passes on: the
    page's frames); what the steps return. A step's error goes back into the steps, which may set it aside (a
    race's arm whose drafter could not load); an error in `through` ends the run."""
    try:
        step = next(steps)
        while True:
            try:
                done = yield from work(step)
            except through:
                raise
            except Exception as e:
                step = steps.throw(e)
                continue
            step = steps.send(done)
    except StopIteration as finished:
        return finished.value


def run_here(steps: Steps, progress: Progress | None = None):
    """Run every step where the caller stands (the CLI), a load's progress to `progress`; what the steps return."""
    def work(step):
        return step.work(progress)
        yield  # a generator that yields nothing, so drive ends at its first next()

    try:
        next(drive(steps, work))
    except StopIteration as done:
        return done.value
