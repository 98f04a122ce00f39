"""The Compare tab: one row of numbers per run, and every run's coloured text side by side."""
from __future__ import annotations

from statistics import median

from .html import panel_html
from .numbers import headline
from .status import count
from .trace import Trace

COLUMNS = ("run", "tokens_per_s", "speedup", "alpha", "tau", "target_calls", "tokens", "stop")
HEADERS = ["run", "tokens/s", "speedup (range)", "α", "τ", "target passes", "tokens", "stopped by"]


def compare_rows(base: Trace, runs: list[Trace], rounds: list[list[float]] = ()) -> list[dict]:
    """The baseline first, then each speculative run, as plain dicts (JSON-ready).

    rounds: each finished timed round's tokens/s, baseline first then each run. With any,
    tokens/s and speedup are their medians (speedups taken within a round), with the range;
    before the first round ends they are the runs' live numbers.
    """
    rows = []
    for i, run in enumerate([base, *runs]):
        s = run.stats()
        queued = not (run.events or run.done or run.error)
        row = dict(run=run.label, tokens_per_s=None if queued else s.tokens_per_s, speedup=None,
                   speedup_min=None, speedup_max=None, rounds=len(rounds),
                   alpha=s.acceptance_rate if run.speculative and s.drafted else None,
                   # The playground's rule: passes while generating, one per step; the prefill (one
                   # pass over the prompt) is the same for every run and is not counted.
                   tau=s.mean_accepted_length if run.events else None, target_calls=s.steps,
                   tokens=s.tokens, stop="queued" if queued else run.error and "error" or s.stop_reason)
        speedups = [r[i] / r[0] for r in rounds if r[0] > 0 and r[i] > 0]
        if speedups:
            row.update(tokens_per_s=median([r[i] for r in rounds]), speedup=median(speedups),
                       speedup_min=min(speedups), speedup_max=max(speedups))
        elif run is base and not queued:
            row["speedup"] = 1.0
        elif not queued:
            row["speedup"] = headline(run, base).speedup  # None while too few tokens to time
        rows.append(row)
    return rows


STOP_REASONS = {"max_new_tokens": "token limit", "eos": "end of text", "cancelled": "Stop pressed",
                "context": "context full", "running": "running", "queued": "queued"}


def table_values(rows: list[dict]) -> list[list]:
    """Rows for a table widget: numbers rounded for reading, blanks for what does not apply."""
    def cell(key, value, row):
        if value is None:
            return "measuring…" if key == "speedup" and row["stop"] == "running" else "—"
        if key == "speedup" and row["speedup_min"] is not None and row["speedup_max"] > row["speedup_min"]:
            return f"{value:.2f}× ({row['speedup_min']:.2f}–{row['speedup_max']:.2f})"
        if key == "speedup":
            return f"{value:.2f}×"
        if key == "stop":
            return STOP_REASONS.get(value, value)
        if isinstance(value, float):
            return round(value, 2 if key != "alpha" else 3)
        return value

    return [[cell(k, r[k], r) for k in COLUMNS] for r in rows]


def side_by_side_html(base: Trace, runs: list[Trace]) -> str:
    """Each run's text as a panel in a responsive grid, baseline first."""
    panels = []
    for trace in [base, *runs]:
        if not (trace.events or trace.error or trace.done):
            continue
        s = trace.stats()
        note = trace.error and "error" or f"{count(s.tokens, 'token')} · {s.tokens_per_s:.1f} tok/s"
        if trace.speculative and s.drafted:
            note += f" · α {s.acceptance_rate:.2f}"
        panels.append(panel_html(trace, trace.label, note))
    if not panels:
        return '<div class="sv-grid sv-empty"><span class="sv-placeholder">Pick drafters and press Compare.</span></div>'
    return f'<div class="sv-grid" data-runs="{len(panels)}">{"".join(panels)}</div>'

