"""The Compare tab: one row of numbers per run, and every run's coloured text side by side."""
from __future__ import annotations

from statistics import median

from .html import panel_html
from .numbers import headline
from .status import count
from .trace import Trace

COLUMNS = ("run", "tokens_per_s", "speedup", "range", "alpha", "tau", "target_calls", "tokens", "stop")
HEADERS = ["run", "tokens/s", "speedup", "range", "α", "τ", "target passes", "tokens", "stopped by"]
# Fixed widths, wide enough for every cell on one line ("measuring…", "1.01–1.10"); on a phone
# the table scrolls sideways inside its box instead of squeezing each cell into a column of letters.
WIDTHS = ["170px", "90px", "100px", "100px", "64px", "64px", "80px", "70px", "116px"]
DECIMALS = {"tokens_per_s": 1, "alpha": 2, "tau": 2}  # the same in every cell of a column


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
    """Rows for a table widget: numbers as text with one fixed number of decimals per column,
    the speedup's range across rounds in its own column, blanks for what does not apply."""
    def cell(key, row):
        value = row.get(key)
        if key == "range":
            low, high = row["speedup_min"], row["speedup_max"]
            return f"{low:.2f}–{high:.2f}" if low is not None and high > low else "—"
        if value is None and key == "speedup" and row["stop"] not in ("queued", "error"):
            # The Playground's rule: no speedup before both runs have MIN_TOKENS (prefill dominates)
            return "measuring…" if row["stop"] == "running" else "too short"
        if value is None:
            return "—"
        if key == "speedup":
            return f"{value:.2f}×"
        if key == "stop":
            return STOP_REASONS.get(value, value)
        if key in DECIMALS:
            return f"{value:.{DECIMALS[key]}f}"
        return value

    return [[cell(k, r) for k in COLUMNS] for r in rows]


def side_by_side_html(base: Trace, runs: list[Trace], window: int | None = None) -> str:
    """Each run's text as a panel in a responsive grid, baseline first; `window`, as panel_html's:
    each panel draws only its last tokens one by one (a race's frames, redrawn several times a second)."""
    panels = []
    for trace in [base, *runs]:
        if not (trace.events or trace.error or trace.done):
            continue
        s = trace.stats()
        note = trace.error and "error" or f"{count(s.tokens, 'token')} · {s.tokens_per_s:.1f} tok/s"
        if trace.speculative and s.drafted:
            note += f" · α {s.acceptance_rate:.2f}"
        panels.append(panel_html(trace, trace.label, note, window=window))
    if not panels:
        return '<div class="sv-grid sv-empty"><span class="sv-placeholder">Pick drafters and press Compare.</span></div>'
    return f'<div class="sv-grid" data-runs="{len(panels)}">{"".join(panels)}</div>'

