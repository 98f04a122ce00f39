"""The draft-length controllers section: each controller's k over the run (a step chart), its tokens
per target pass, predicted tok/s and gap to the hindsight best, and the top two raced live beside
their replays. Pure functions of run/draft_control.py's results."""
from __future__ import annotations

from html import escape

import plotly.graph_objects as go

from ..core.metrics import HINDSIGHT
from .charts import RUNS, figure, styled, waiting_for

RACED = 2  # controllers raced live: the replay's two fastest


def k_figure(replays: list) -> go.Figure:
    """k per step against the output position it started at, one step line per controller."""
    fig = styled(figure(), "Draft length over the run, per controller", "output position", "tokens drafted", 400)
    # A dozen controllers wrap the legend into rows: start it below the x-axis title, with room for them.
    fig.update_layout(legend=dict(y=-0.3), margin=dict(b=140))
    if not replays:
        return waiting_for(fig, "press Replay controllers after a run")
    for i, r in enumerate(replays):
        hindsight = r.controller == HINDSIGHT
        fig.add_scatter(x=list(r.positions), y=list(r.drafted), mode="lines", line_shape="hv", name=r.controller,
                        line=dict(color="#222222" if hindsight else RUNS[i % len(RUNS)], width=3 if hindsight else 1.5,
                                  dash="dot" if hindsight else "solid"))
    return fig


def rows(replays: list) -> list[dict]:
    """The table's rows: per controller its tokens per pass, predicted tok/s and share of the best's."""
    best = next((r.tokens_per_s for r in replays if r.controller == HINDSIGHT), 0.0)
    return [{"controller": r.controller, "tokens_per_pass": r.tokens_per_pass, "predicted_tokens_per_s": r.tokens_per_s,
             "of_best": r.tokens_per_s / best if best else 0.0, "exact": r.exact} for r in replays]


def _gap(row: dict) -> str:
    return "-" if row["controller"] == HINDSIGHT else f"{row['of_best'] - 1:+.0%}"


def table_html(replays: list) -> str:
    if not replays:
        return '<div class="sv-controllers">Generate a run, then replay the controllers on it.</div>'
    how = "replayed exactly (greedy)" if all(r.exact for r in replays) else "replayed in expectation (sampled)"
    body = "".join(
        f"<tr><th scope=\"row\">{escape(x['controller'])}</th><td>{x['tokens_per_pass']:.2f}</td>"
        f"<td>{x['predicted_tokens_per_s']:.1f}</td><td>{x['of_best']:.0%}</td>"
        f"<td>{_gap(x)}</td></tr>" for x in rows(replays))
    return (f'<div class="sv-controllers"><table class="sv-controllers-table"><caption>Controllers on this run, '
            f"{how}: the hindsight best knows where every draft breaks, so it is the ceiling</caption>"
            "<thead><tr><th scope=\"col\">controller</th><th scope=\"col\">tokens per pass</th>"
            "<th scope=\"col\">predicted tok/s</th><th scope=\"col\">of the best</th><th scope=\"col\">gap</th></tr>"
            f"</thead><tbody>{body}</tbody></table></div>")


def race_html(pairs: list) -> str:
    """[(Replayed, Live, agrees)] as a table: replayed and live tokens per pass, predicted and measured tok/s."""
    if not pairs:
        return ""
    body = "".join(
        f"<tr><th scope=\"row\">{escape(r.controller)}</th><td>{r.tokens_per_pass:.2f}</td><td>{run.tokens_per_pass:.2f}</td>"
        f"<td>{r.tokens_per_s:.1f}</td><td>{run.tokens_per_s:.1f}</td>"
        f"<td>{_same(r, run, agrees)}</td></tr>" for r, run, agrees in pairs)
    return ('<div class="sv-controllers"><table class="sv-controllers-table"><caption>The top two raced live: '
            "greedy replays and live runs draft the same, so tokens per pass are equal</caption>"
            "<thead><tr><th scope=\"col\">controller</th><th scope=\"col\">replayed tokens per pass</th>"
            "<th scope=\"col\">live tokens per pass</th><th scope=\"col\">predicted tok/s</th>"
            "<th scope=\"col\">measured tok/s</th><th scope=\"col\">same drafts</th></tr>"
            f"</thead><tbody>{body}</tbody></table></div>")


def _same(r, run, agrees: bool) -> str:
    """The verdict on a live run: one stopped early drafted only part of the run, which says nothing against it."""
    if getattr(run, "stopped", False):
        return f"stopped after {run.tokens} of {r.tokens} tokens (not compared)"
    return "yes" if agrees else "no" if r.exact else "in expectation"


def raced(replays: list) -> list:
    """The controllers to race: the replay's fastest RACED, the hindsight best left out (no rule runs it)."""
    return [r for r in replays if r.controller != HINDSIGHT][:RACED]
