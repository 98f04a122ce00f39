"""The race: the baseline and each arm on one prompt of one target, as generate, the Playground and Compare run
it: drafters prepared, every racer warmed up, then the runs in turn (engine/interleave.py: fewest tokens next,
ties to the first listed), each event labelled in context and added to its Trace. Callers keep their presentation.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Hashable, Iterator, Mapping

from ..core.events import RunEnd
from ..engine.generate import GenerationConfig, baseline_generate, speculative_generate
from ..engine.interleave import interleave_all
from ..render.trace import Labels, Trace
from ..traces.labels import Labeler
from .arms import BASELINE, Arm
from .prepare import Prepared, Steps, drafter_steps, warm
from .spec import check_length


def baseline(cfg: GenerationConfig) -> Arm:
    """The plain run under `cfg`, as an arm of the race."""
    return Arm(BASELINE, None, cfg, BASELINE)


@dataclass(frozen=True)
class Turn:
    """One turn of the race: the run `name`'s next event, its tokens' text in context (None for a RunEnd)."""

    name: Hashable
    event: object
    labels: Labels | None


class Race:
    """`arms` (key -> Arm, in the order ties go; a baseline(cfg) among them runs plain decoding) on `target` (a
    models.Loaded) for the prompt `ids`. `drafters` are arms' drafters already built (key -> drafter);
    prepare() builds the rest. remember: a speculative run adds its answer to suffix decoding's memory."""

    def __init__(self, models, target, ids: list[int], arms: Mapping[Hashable, Arm],
                 drafters: Mapping[Hashable, object] | None = None, remember: bool = True):
        self.models, self.target, self.ids, self.remember = models, target, list(ids), remember
        eos = {"eos_token_ids": target.eos_token_ids}  # each run ends at the target's end of turn
        self.arms = {key: replace(arm, cfg=replace(arm.cfg, **eos)) for key, arm in arms.items()}
        self.drafters = {key: None for key, arm in self.arms.items() if arm.engine == BASELINE} | dict(drafters or {})
        self.failed: dict[Hashable, Exception] = {}  # an arm whose drafter could not be built: the others race on
        self.traces: dict[Hashable, Trace] = {}
        self.read: dict[Hashable, int] = {}  # prompt tokens each run's prefill has read (the engine reads in chunks)

    def prepare(self, memory=None, **load) -> Steps:
        """Each arm's drafter not given yet, a draft model's load a Step (run/prepare.py: the caller runs it);
        memory: suffix decoding's (None: the process's); load: models.load's options."""
        for key, arm in self.arms.items():
            if key in self.drafters:
                continue
            try:
                drafter = yield from drafter_steps(arm.spec, self.target, self.models, memory, **load)
                check_length(drafter, arm.cfg.k)
            except Exception as e:  # one bad drafter must not sink the others
                self.failed[key] = e
                continue
            self.drafters[key] = drafter

    def warm(self, cfg: GenerationConfig, curve: bool = False) -> Steps:
        """A warm-up of every racer (none pays the first-run costs alone), then the target's verify-cost
        curve when asked for (run/prepare.warm); returns the curve."""
        racers = list({id(d): d for d in self.drafters.values()}.values())
        return warm(Prepared(self.target, self.ids, cfg, None), curve=curve, drafters=racers)

    def run(self, should_stop=None) -> Iterator[Turn]:
        """One race, on fresh traces (self.traces, key -> Trace) that every turn's event is added to."""
        keys = [key for key in self.arms if key in self.drafters]
        self.traces = {key: Trace(self.arms[key].label, speculative=self.arms[key].engine != BASELINE,
                                  k=self.arms[key].cfg.k, eos=self.target.eos_token_ids) for key in keys}
        self.read = dict.fromkeys(keys, 0)
        streams = {key: self.stream(key, should_stop) for key in keys}
        return self.turns({key: Labeler(self.models, self.target, self.ids) for key in keys}, streams)

    def stream(self, key: Hashable, should_stop=None) -> Iterator:
        """The engine's event stream of the arm `key`."""
        arm, read = self.arms[key], lambda done, _total: self.read.__setitem__(key, done)
        if arm.engine == BASELINE:
            return baseline_generate(self.target.model, self.ids, arm.cfg, should_stop, on_prefill=read)
        return speculative_generate(self.target.model, self.drafters[key], self.ids, arm.cfg, should_stop,
                                    remember=self.remember, on_prefill=read)

    def turns(self, labelers: dict, streams: dict) -> Iterator[Turn]:
        for key, event in interleave_all(streams):
            turn = Turn(key, event, None if isinstance(event, RunEnd) else labelers[key].label(event))
            self.traces[key].add(event, turn.labels)
            yield turn
