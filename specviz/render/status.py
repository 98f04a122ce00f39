"""The one-line status above the panels: what is happening, how far along, or what went wrong."""
from __future__ import annotations

from html import escape

# Each state's icon is drawn by the stylesheet (.sv-icon-*), not an emoji: a machine without
# an emoji font showed those as empty boxes.
ICONS = {"info": "info", "running": "busy", "loading": "busy", "waiting": "busy", "done": "ok",
         "stopped": "stop", "error": "error", "busy": "error"}


def count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 token', '2 tokens', '400,001 tokens' (plural: the word when it is not noun + 's')."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def isolated(text: str) -> str:
    """Text from a file or a model, set apart for bidirectional text inside a sentence of the app's
    own (plain text: Unicode's first-strong isolate and its pop). A right-to-left override in a
    trace's drafter field reversed the rest of the status sentence: inside an isolate it reverses
    only its own text."""
    return f"\u2068{text}\u2069"


def bdi(text: str) -> str:
    """The same for HTML: escaped, in a <bdi> element."""
    return f"<bdi>{escape(text)}</bdi>"


MB = 1_000_000  # decimal megabytes: the limits are set in them, so "8 MB" on the page is 8 MB in the docs


def megabytes(n: int) -> str:
    """'8 MB', '40.2 MB': a file's size or a limit, said one way everywhere."""
    return f"{n / MB:.1f}".removesuffix(".0") + " MB"


def step_label(index: int, total: int) -> str:
    """'Step 3 of 12' for the step the engine numbers 2 (StepEvent.step counts from 0; people
    count from 1). Every label a reader sees (inspector, step-through, replay, charts) says it so."""
    return f"Step {index + 1} of {total}"


def status_html(message: str, state: str = "info", fraction: float | None = None) -> str:
    """state: info | loading | waiting | running | done | stopped | error | busy; fraction in [0, 1] draws a progress bar."""
    bar = ""
    if fraction is not None:
        bar = f'<progress max="1" value="{min(max(fraction, 0.0), 1.0):.3f}"></progress>'
    role = ' role="alert"' if state == "error" else ' role="status"'
    return (
        f'<div class="sv-status sv-status-{state}" data-state="{state}"{role}>'
        f'<span class="sv-icon sv-icon-{ICONS.get(state, "info")}" aria-hidden="true"></span>'
        f'<span class="sv-status-text">{escape(message)}</span>{bar}</div>'
    )
