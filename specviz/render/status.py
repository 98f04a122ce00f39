"""The one-line status above the panels: what is happening, how far along, or what went wrong."""
from __future__ import annotations

from html import escape

ICONS = {"info": "ℹ", "running": "⏳", "done": "✓", "stopped": "⏹", "error": "⚠"}


def status_html(message: str, state: str = "info", fraction: float | None = None) -> str:
    """state: info | running | done | stopped | error; fraction in [0, 1] draws a progress bar."""
    bar = ""
    if fraction is not None:
        bar = f'<progress max="1" value="{min(max(fraction, 0.0), 1.0):.3f}"></progress>'
    role = ' role="alert"' if state == "error" else ' role="status"'
    return (
        f'<div class="sv-status sv-status-{state}" data-state="{state}"{role}>'
        f'<span class="sv-status-icon">{ICONS.get(state, "")}</span>'
        f'<span class="sv-status-text">{escape(message)}</span>{bar}</div>'
    )
