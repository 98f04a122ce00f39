"""Which of an event's tokens a reader sees, in reading order, and what happened to each.

The one rule every text view follows (the app's HTML panels, the terminal, the plain
text of a run): a step shows its kept drafts, then its rejected drafts where they were
proposed, then the target's own token; kept drafts and the own token past the step's
`emitted` (cut at EOS or the token limit) are not part of the output and are not shown.
Views only format what `shown_tokens` returns.
"""
from __future__ import annotations

from ..events import StepEvent, TokenEvent


def shown_tokens(event: StepEvent | TokenEvent) -> list[tuple[str, int]]:
    """(kind, i) per shown token; i indexes the event's draft followed by its own token.

    So i == len(event.draft) is the target's own token (a baseline event has only that).
    """
    if isinstance(event, TokenEvent):
        return [("baseline", 0)]
    n_out, n_draft = len(event.emitted), len(event.draft)
    shown = [("accepted", i) for i in range(min(event.accepted, n_out))]
    shown += [("rejected", i) for i in range(event.accepted, n_draft)]
    if n_out > event.accepted:
        shown.append((event.token_kind, n_draft))
    return shown

