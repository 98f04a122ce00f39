"""The degeneracy meter beside the acceptance chart: the longest run of one token and distinct-2 of the
speculative text, and a warning where acceptance is high over a text that repeats itself."""
from __future__ import annotations

from html import escape

from ..core.degeneracy import HIGH_ACCEPTANCE, LONG_RUN, LOW_DISTINCT, Degeneracy, degeneracy
from ..core.events import StepEvent
from ..core.metrics import acceptance_rate
from .status import status_html
from .trace import Trace

EMPTY = '<div class="sv-degeneracy">Degeneracy meter: generate a run to see how much its text repeats itself.</div>'


def token_text(trace: Trace, token: int | None) -> str:
    """The text of `token` as the run shows it (its label), or its id."""
    for e, labels in zip(trace.events, trace.labels):
        if isinstance(e, StepEvent):
            for t, text in zip(e.draft + (e.token,), labels.draft + (labels.token,)):
                if t == token and text:
                    return text
    return f"id {token}"


def meter(trace: Trace) -> tuple[Degeneracy, float | None] | None:
    """The run's degeneracy and its acceptance rate (None: nothing drafted), or None before any token."""
    ids = trace.token_ids
    if not ids:
        return None
    s = trace.stats()
    return degeneracy(ids), (acceptance_rate(s.accepted, s.drafted) if s.drafted else None)


def meter_html(trace: Trace) -> str:
    got = meter(trace)
    if got is None:
        return EMPTY
    d, alpha = got
    run = f"{d.longest_run}× {escape(repr(token_text(trace, d.run_token)))}" if d.longest_run > 1 else "none"
    pairs = "too few tokens" if d.distinct_2 is None else f"{d.distinct_2:.2f}"
    cells = (f'<span class="sv-degeneracy-cell"><b>longest run of one token</b> {run}</span>'
             f'<span class="sv-degeneracy-cell"><b>distinct-2</b> {pairs} '
             f'<span class="sv-degeneracy-hint">(distinct adjacent pairs / pairs; 1 = never repeats)</span></span>'
             f'<span class="sv-degeneracy-cell"><b>acceptance</b> {"-" if alpha is None else f"{alpha:.0%}"}</span>')
    if d.warns(alpha):
        note = status_html(
            f"High acceptance ({alpha:.0%}) over a degenerate text: it repeats itself (a run of {d.longest_run} "
            f"or distinct-2 {pairs}), and a loop is easy to draft. This speed is not a success: try a prompt "
            "with a short factual or copying answer.", "stopped")
    elif d.degenerate:
        note = status_html("The text repeats itself (a run of one token at least "
                           f"{LONG_RUN} long, or under {LOW_DISTINCT:.0%} of adjacent pairs distinct).", "info")
    else:
        note = ""
    return (f'<div class="sv-degeneracy" data-degenerate="{str(d.degenerate).lower()}" '
            f'data-warns="{str(d.warns(alpha)).lower()}"><span class="sv-degeneracy-title">Degeneracy meter</span>'
            f"{cells}{note}</div>")


__all__ = ["meter", "meter_html", "token_text", "HIGH_ACCEPTANCE"]
