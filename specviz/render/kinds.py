"""Which of an event's tokens a reader sees, in reading order, and what happened to each.

The one rule every text view follows (the app's HTML panels, the terminal, the plain
text of a run): a step shows its kept drafts, then its rejected drafts where they were
proposed, then the target's own token; kept drafts and the own token past the step's
`emitted` (cut at EOS or the token limit) are not part of the output and are not shown,
and neither is an emitted end-of-turn token (`eos`): it ends the text, it is not in it (a
rejected one still shows: it was proposed). Views only format what `shown_tokens` returns.
"""
from __future__ import annotations

from ..core.events import StepEvent, TokenEvent


def shown_tokens(event: StepEvent | TokenEvent, eos=frozenset()) -> list[tuple[str, int]]:
    """(kind, i) per shown token; i indexes the event's draft followed by its own token.

    So i == len(event.draft) is the target's own token (a baseline event has only that).
    eos: the ids that end a run (Trace.end_ids), left out where they were output.
    """
    if isinstance(event, TokenEvent):
        return [] if event.token in eos else [("baseline", 0)]
    n_out, n_draft = len(event.emitted), len(event.draft)
    shown = [("accepted", i) for i in range(min(event.accepted, n_out))]
    shown += [("rejected", i) for i in range(event.accepted, n_draft)]
    if n_out > event.accepted:
        shown.append((event.token_kind, n_draft))
    ids = event.draft + (event.token,)
    return [(kind, i) for kind, i in shown if kind == "rejected" or ids[i] not in eos]


def ended_at(event: StepEvent | TokenEvent, eos) -> bool:
    """Whether `event` output the end-of-turn token that ended its run."""
    out = event.emitted if isinstance(event, StepEvent) else (event.token,)
    return bool(out) and out[-1] in eos

