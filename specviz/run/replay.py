"""Playing a saved race (traces/trace_file.Recording) back through the same Traces the renderers read.

Two orders. `in_order`: the order the app and the CLI advanced the two runs (engine/interleave.py's
turns: one speculative step, then the baseline up to as many tokens), for stepping through.
`race`: every event at the engine second it happened, both runs on one clock from the
start of their prefill, so played at those times the two runs race at their true relative
speed, whatever the machine replaying them.
"""
from __future__ import annotations

from typing import Iterator

from ..core.events import RunEnd, StepEvent
from ..engine.interleave import interleave
from ..render.trace import Labels, Trace
from ..traces.trace_file import Recording

Item = tuple[str, object, "Labels | None"]  # ("spec" | "base", event, its labels; None for a RunEnd)


def fresh(rec: Recording) -> tuple[Trace, Trace]:
    """Empty traces shaped like the recording's, to fill with items; a recording without a
    baseline gets an empty baseline that says so."""
    spec = Trace(rec.spec.label, k=rec.spec.k)
    if rec.base is None:
        return spec, Trace("baseline", speculative=False, error="This trace has no baseline run.")
    return spec, Trace(rec.base.label, speculative=False, k=rec.base.k)


def add(spec: Trace, base: Trace, item: Item) -> None:
    which, event, labels = item
    (spec if which == "spec" else base).add(event, labels)


def _items(trace: Trace) -> Iterator[tuple[object, Labels | None]]:
    yield from zip(trace.events, trace.labels)
    if trace.end is not None:
        yield trace.end, None


def in_order(rec: Recording) -> Iterator[Item]:
    """Every event of both runs, in the order a live run showed them."""
    if rec.base is None:
        yield from (("spec", e, labels) for e, labels in _items(rec.spec))
        return
    runs = {"spec": rec.spec, "base": rec.base}
    seen = {"spec": 0, "base": 0}
    # interleave() needs each run to end in a RunEnd; one that stopped with an error has none.
    streams = {w: iter([*t.events, t.end or RunEnd((), t.stats())]) for w, t in runs.items()}
    for which, event in interleave(streams["spec"], streams["base"]):
        trace, i = runs[which], seen[which]
        seen[which] += 1
        if i < len(trace.events):
            yield which, event, trace.labels[i]
        elif trace.end is not None:
            yield which, event, None


def _clock(event) -> float:
    return event.stats.elapsed if isinstance(event, RunEnd) else event.elapsed


def race(rec: Recording) -> list[tuple[float, Item]]:
    """(engine second, item) for every event of both runs, soonest first."""
    timed = [(_clock(item[1]), n, item) for n, item in enumerate(in_order(rec))]
    return [(t, item) for t, _, item in sorted(timed, key=lambda x: x[:2])]


def after_steps(rec: Recording, steps: int) -> tuple[Trace, Trace]:
    """The two runs as a live run showed them after `steps` speculative steps (the baseline
    caught up to as many tokens); past the last step, both runs whole."""
    spec, base = fresh(rec)
    shown = 0
    for item in in_order(rec):
        if isinstance(item[1], StepEvent):
            if shown == steps:
                break
            shown += 1
        add(spec, base, item)
    return spec, base


def step_count(rec: Recording) -> int:
    return len(rec.spec.steps)
