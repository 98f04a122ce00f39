"""Why checking is cheap, and what a run would give on other hardware: the pictures.

The verify-cost curve (verify_cost.VerifyCurve) against the ideal flat line, with one plain
sentence of what it means here; and a run re-timed on a hardware profile (retime.Retimed)
as two stacked bars of where each run's time goes. A re-timing is arithmetic on a run's
recorded decisions: every word of it says so, so no one reads it as a measurement.
"""
from __future__ import annotations

from html import escape

import plotly.graph_objects as go

from .charts import COLORS, figure, styled, waiting_for

NO_CURVE = "Generate a run: this machine's verify cost is measured once per model"
PARTS = (  # (retime part, legend, colour)
    ("other", "prefill and bookkeeping", "#BBBBBB"),
    ("passes", "target passes (one step each)", COLORS["corrected"]),
    ("extra verify", "extra cost of verifying more tokens", COLORS["rejected"]),
    ("drafting", "drafting", COLORS["bonus"]),
)


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} bytes"


def curve_figure(curve, verified: float | None = None, recorded_on: str | None = None) -> go.Figure:
    """T(m) / T(1) for m = 1..32 on a log axis, beside the ideal (flat at 1) and a pass whose
    every token costs a full step (m); `verified` marks this run's tokens per pass;
    `recorded_on`: the curve came with a replayed trace from that machine."""
    # Title and subtitle on two lines: on one, a phone cut it after "relative to one"
    fig = styled(figure(), "Cost of one target pass<br><sup>relative to a one-token pass</sup>",
                 "tokens checked in one pass", "relative cost", height=320)  # short: a phone's plot is low
    fig.update_layout(margin_t=60)
    if curve is None:
        return waiting_for(fig, NO_CURVE)
    sizes, rel = list(curve.sizes), list(curve.relative)
    fig.add_scatter(x=sizes, y=[m for m in sizes], name="if each token cost a full step", mode="lines",
                    line=dict(color=COLORS["rejected"], dash="dot", width=2), hoverinfo="skip")
    fig.add_scatter(x=sizes, y=[1.0] * len(sizes), name="ideal: memory-bound, extra tokens free", mode="lines",
                    line=dict(color=COLORS["accepted"], dash="dash", width=2), hoverinfo="skip")
    fig.add_scatter(x=sizes, y=rel, name=f"measured on {recorded_on}" if recorded_on else "measured on this machine",
                    mode="lines+markers",
                    line=dict(color=COLORS["corrected"], width=3), marker=dict(size=8),
                    customdata=[[1e3 * t] for t in curve.seconds],
                    hovertemplate="%{x} tokens: %{y:.2f}× one token (%{customdata[0]:.1f} ms)<extra></extra>")
    if verified is not None and verified > 1:
        fig.add_scatter(x=[verified], y=[curve.cost(verified)], name="this run's pass", mode="markers",
                        marker=dict(size=13, color=COLORS["bonus"], symbol="diamond", line=dict(color="#222", width=1)),
                        hovertemplate="this run: %{x:.1f} tokens a pass, %{y:.2f}× one token<extra></extra>")
    top = max(4.0, 1.3 * max(rel))
    fig.update_xaxes(type="log", tickvals=sizes, ticktext=[str(m) for m in sizes])
    fig.update_yaxes(range=[0, top])
    fig.add_annotation(text=f"each pass reads {_size(curve.weight_bytes)} of weights", showarrow=False,
                       xref="paper", yref="paper", x=0.01, y=0.98, xanchor="left", font=dict(size=12, color="#555"))
    return fig


def curve_caption(curve, verified: float | None = None, recorded_on: str | None = None) -> str:
    """One plain sentence of what the curve means, for the run's pass size (k + 1 = 5 when none).
    recorded_on: the curve came with a replayed trace, measured on that machine, not this one."""
    if curve is None:
        return f'<div class="sv-cost-caption" data-curve="none">{escape(NO_CURVE)}.</div>'
    m = verified if verified is not None and verified > 1 else 5
    v, weights = curve.cost(m), _size(curve.weight_bytes)
    n = f"{m:.0f}" if float(m).is_integer() else f"{m:.1f}"
    here, that = (f"on the machine that recorded this run ({recorded_on})", "that") if recorded_on else ("here", "this")
    head = (f"Checking {n} tokens in one pass costs {v:.2f}× one token {here}, not {n}×: every pass must read "
            f"all {weights} of weights")
    if v <= 1 + 0.04 * (m - 1):
        text = f"{head}, and the extra tokens ride along almost free, which is what speculative decoding counts on."
    else:
        each = 100 * (v - 1) / (m - 1)
        text = (f"{head}, but {that} machine's arithmetic is slow enough that each extra token still adds "
                f"{each:.0f}% of a step; on a GPU the curve stays flat to ~16 tokens, which is why speedups "
                "are larger there.")
    fact = (f"One-token pass: {1e3 * curve.seconds[0]:.1f} ms on {curve.device} ({curve.dtype}), "
            f"about {_size(curve.bandwidth)}/s if it reads the weights once.")
    source = "recorded" if recorded_on else "measured"
    return (f'<div class="sv-cost-caption" data-curve="{source}" data-v="{v:.3f}"><p>{escape(text)}</p>'
            f'<p class="sv-cost-fact">{escape(fact)}</p></div>')


def retime_figure(r) -> go.Figure:
    """Where each run's time goes on the profile, in plain decode steps: one stacked bar per run."""
    # a short axis title: beside the run names a phone's plot is ~170 px wide ("time, in plain decode step" was cut)
    fig = styled(figure(), "Where each run's time goes, re-timed", "time (plain steps)", "", height=300)
    fig.update_layout(legend=dict(y=-0.42, traceorder="normal"), margin_b=40)
    if r is None:
        return waiting_for(fig, "Generate a run (or replay a trace) to re-time it")
    rows = ["speculative", "baseline"]
    for key, name, color in PARTS:
        xs = [r.spec[key], r.base[key]]
        fig.add_bar(y=rows, x=xs, name=name, orientation="h", marker_color=color,
                    hovertemplate="%{y}: %{x:.1f} steps of " + name + "<extra></extra>")
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(rangemode="tozero")
    return fig


def retime_html(r, measured: float | None, shown: tuple[int, int] | None = None) -> str:
    """The re-timing's one line: labelled as a calculation, beside what was measured. shown: (steps
    on screen, the run's steps) while stepping through a run: then it is those steps' decisions,
    not the run's (3 steps were called "this run's decisions")."""
    whose = "this run's"
    if shown is not None and shown[0] < shown[1]:
        whose = f"the first {shown[0]} of this run's {shown[1]} steps (those on screen so far): their"
    here = "" if measured is None else f" (measured here: {measured:.2f}×)"
    return (f'<div class="sv-retime" data-speedup="{r.speedup:.4f}"><b>Re-timed, not measured:</b> {whose} '
            f"accept/reject decisions on {escape(r.profile.name)} would give <b>{r.speedup:.2f}×</b>{here}.</div>")
