"""Advance a speculative run and a baseline run in turn, never concurrently.

Their timings stay honest (each run's clock only counts its own steps) and both panels
of the app fill at the same pace. Each yielded item is (which, event) with which in
{"spec", "base"}; the spec run moves one step, then the baseline catches up to the same
number of tokens, so the two texts grow side by side.
"""
from __future__ import annotations

from typing import Iterator

from .events import RunEnd, StepEvent


def interleave(spec, base) -> Iterator[tuple[str, object]]:
    spec_tokens = base_tokens = 0
    spec_done = base_done = False
    while not (spec_done and base_done):
        if not spec_done:
            ev = next(spec)
            spec_done = isinstance(ev, RunEnd)
            if isinstance(ev, StepEvent):
                spec_tokens += len(ev.emitted)
            yield "spec", ev
        # The baseline emits one token per step: let it catch up (or run on alone).
        while not base_done and (spec_done or base_tokens < spec_tokens):
            ev = next(base)
            base_done = isinstance(ev, RunEnd)
            base_tokens += 0 if base_done else 1
            yield "base", ev
