"""The race: the runs of one prompt advanced in turn (engine/interleave.py: the one with the fewest tokens
goes next, ties to the first listed), each event labelled with its tokens' text in context, as the CLI's
generate, the Playground and Compare all show them (replay.py plays a recorded race back in the same
turns). Each caller keeps its presentation: the app's worker thread and status words, the CLI's printing.
"""
from __future__ import annotations

from typing import Hashable, Iterator

from ..core.events import RunEnd
from ..engine.interleave import interleave_all
from ..render.trace import Labels
from ..traces.labels import Labeler


def race(models, target, ids: list[int], runs: dict[Hashable, Iterator]) -> Iterator[tuple[Hashable, object, Labels | None]]:
    """(run's name, event, its labels; None for a RunEnd) for every event of `runs` (name -> an engine
    event stream on `target`, a models.Loaded, for the prompt `ids`), in turn."""
    labelers = {name: Labeler(models, target, ids) for name in runs}
    for name, event in interleave_all(runs):
        yield name, event, None if isinstance(event, RunEnd) else labelers[name].label(event)
