"""Advance several runs in turn, never concurrently: the arm with the fewest tokens goes next.

Their timings stay honest (each run's clock only counts its own steps), every run meets the
same machine conditions (a warming CPU, a busy neighbour) at the same point of its text, and
the texts grow side by side. Each yielded item is (name, event). With a speculative run and
a baseline, the speculative run moves one step, then the baseline catches up to the same
number of tokens, then the speculative run steps again.
"""
from __future__ import annotations

from typing import Iterator

from ..core.events import RunEnd, StepEvent


def interleave_all(runs: dict[str, Iterator]) -> Iterator[tuple[str, object]]:
    """Every event of every run; ties go to the run listed first."""
    tokens = dict.fromkeys(runs, 0)
    while tokens:
        name = min(tokens, key=tokens.get)  # dicts keep order: the first of the fewest
        ev = next(runs[name])
        if isinstance(ev, RunEnd):
            del tokens[name]
        else:
            tokens[name] += len(ev.emitted) if isinstance(ev, StepEvent) else 1
        yield name, ev


def interleave(spec, base) -> Iterator[tuple[str, object]]:
    """A speculative run ("spec") and its baseline ("base")."""
    return interleave_all({"spec": spec, "base": base})
