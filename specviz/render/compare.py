"""The Compare tab: one row of numbers per run, and every run's coloured text side by side."""
from __future__ import annotations

from .html import panel_html
from .numbers import headline
from .trace import Trace

COLUMNS = ("run", "tokens_per_s", "speedup", "alpha", "tau", "target_calls", "tokens", "stop")
HEADERS = ["run", "tokens/s", "speedup", "α", "τ", "target calls", "tokens", "stopped by"]


def compare_rows(base: Trace, runs: list[Trace]) -> list[dict]:
    """The baseline first, then each speculative run, as plain dicts (JSON-ready)."""
    rows = []
    if base.events or base.done:
        b = base.stats()
        rows.append(dict(run=base.label, tokens_per_s=b.tokens_per_s, speedup=1.0, alpha=None, tau=1.0,
                         target_calls=b.target_calls, tokens=b.tokens, stop=b.stop_reason))
    for run in runs:
        s = run.stats()
        h = headline(run, base)
        rows.append(dict(run=run.label, tokens_per_s=s.tokens_per_s, speedup=h.speedup,
                         alpha=s.acceptance_rate if s.drafted else None, tau=s.mean_accepted_length,
                         target_calls=s.target_calls, tokens=s.tokens,
                         stop=run.error and "error" or s.stop_reason))
    return rows


STOP_REASONS = {"max_new_tokens": "token limit", "eos": "end of text", "cancelled": "Stop pressed",
                "context": "context full", "running": "running"}


def table_values(rows: list[dict]) -> list[list]:
    """Rows for a table widget: numbers rounded for reading, blanks for what does not apply."""
    def cell(key, value):
        if value is None:
            return "—"
        if key == "speedup":
            return f"{value:.2f}×"
        if key == "stop":
            return STOP_REASONS.get(value, value)
        if isinstance(value, float):
            return round(value, 2 if key != "alpha" else 3)
        return value

    return [[cell(k, r[k]) for k in COLUMNS] for r in rows]


def side_by_side_html(base: Trace, runs: list[Trace]) -> str:
    """Each run's text as a panel in a responsive grid, baseline first."""
    panels = []
    for trace in [base, *runs]:
        if not (trace.events or trace.error or trace.done):
            continue
        s = trace.stats()
        note = trace.error and "error" or f"{s.tokens} tokens · {s.tokens_per_s:.1f} tok/s"
        if trace.speculative and s.drafted:
            note += f" · α {s.acceptance_rate:.2f}"
        panels.append(panel_html(trace, trace.label, note))
    if not panels:
        return '<div class="sv-grid sv-empty"><span class="sv-placeholder">Pick drafters and press Compare.</span></div>'
    return f'<div class="sv-grid" data-runs="{len(panels)}">{"".join(panels)}</div>'

