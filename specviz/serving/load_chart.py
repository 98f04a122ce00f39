"""The load sweep as one plotly figure (load_report.load_figure is the public name).

Concurrency goes on a log axis because the levels grow by factors (1, 2, 4 ...); the
crossover is drawn as a vertical line trace, not a shape, since shapes on log axes take
log10 coordinates and a trace is easy to find by name.
"""
from __future__ import annotations

import plotly.graph_objects as go

from ..render.charts import COLORS, FONT, subplots
from .load import ARMS

TITLES = ("Total tokens/s", "Time to first token (s): p50 solid, p95 dotted",
          "Inter-token latency (ms): p50 solid, p95 dotted", "Acceptance (speculative)")


def _series(doc: dict, arm: str, key: str, scale: float = 1.0) -> tuple[list, list]:
    xs, ys = [], []
    for lv in doc["levels"]:
        value = lv.get(arm, {}).get(key)
        if value is not None:
            xs.append(lv["concurrency"])
            ys.append(value * scale)
    return xs, ys


def build(doc: dict) -> go.Figure:
    fig = subplots(rows=2, cols=2, subplot_titles=TITLES, horizontal_spacing=0.1, vertical_spacing=0.16)
    for arm in ARMS:
        colour = COLORS[arm]
        x, y = _series(doc, arm, "tokens_per_s")
        fig.add_scatter(x=x, y=y, name=f"{arm} tokens/s", mode="lines+markers", line=dict(color=colour),
                        legendgroup=arm, hovertemplate="concurrency %{x}<br>%{y:.1f} tokens/s<extra></extra>",
                        row=1, col=1)
        for row, col, key, scale, unit in ((1, 2, "ttft", 1.0, "s"), (2, 1, "itl", 1e3, "ms")):
            for q, dash in (("p50", "solid"), ("p95", "dot")):
                x, y = _series(doc, arm, f"{key}_{q}_s", scale)
                label = "TTFT" if key == "ttft" else "inter-token"
                fig.add_scatter(x=x, y=y, name=f"{arm} {label} {q}", mode="lines+markers", legendgroup=arm,
                                line=dict(color=colour, dash=dash), showlegend=False,
                                hovertemplate=f"{arm} {q}<br>concurrency %{{x}}<br>%{{y:.3g}} {unit}<extra></extra>",
                                row=row, col=col)
    _policy_and_crossover(fig, doc)
    x, y = _series(doc, "speculative", "acceptance_rate")
    _, tau = _series(doc, "speculative", "mean_accepted_length")
    with_tau = len(tau) == len(y)  # tau needs a step count, which not every engine gives
    fig.add_scatter(x=x, y=y, name="acceptance rate (alpha)", mode="lines+markers",
                    line=dict(color=COLORS["accepted"]), customdata=tau if with_tau else None,
                    hovertemplate="concurrency %{x}<br>alpha %{y:.2f}"
                    + ("<br>tau %{customdata:.2f}" if with_tau else "") + "<extra></extra>", row=2, col=2)
    levels = [lv["concurrency"] for lv in doc["levels"]]
    fig.update_xaxes(type="log", tickvals=levels, ticktext=[str(c) for c in levels], title_text="concurrency",
                     showline=True, linecolor="#bbb")
    fig.update_yaxes(rangemode="tozero", showline=True, linecolor="#bbb")
    fig.update_yaxes(range=[0, 1.05], row=2, col=2)
    fig.update_layout(font=FONT, height=640, margin=dict(l=56, r=16, t=60, b=48),
                      title=dict(text="Speculation on and off under load", x=0.01, xanchor="left"),
                      legend=dict(orientation="h", yanchor="top", y=-0.1, x=0.0), uirevision="keep")
    return fig


def _policy_and_crossover(fig: go.Figure, doc: dict) -> None:
    policy, cross = doc.get("policy") or {}, doc.get("crossover") or {}
    rows = policy.get("levels") or []
    if rows:
        fig.add_scatter(x=[r["concurrency"] for r in rows], y=[r["tokens_per_s"] for r in rows],
                        name=policy_name(policy), mode="lines", line=dict(color="#222", dash="dash", width=1),
                        hovertemplate="policy<br>concurrency %{x}<br>%{y:.1f} tokens/s<extra></extra>", row=1, col=1)
    at = cross.get("concurrency")
    if at is not None:
        top = max((lv[arm]["tokens_per_s"] for lv in doc["levels"] for arm in ARMS if arm in lv), default=1.0)
        between = f" (estimated between measured {cross['below']} and {cross['above']})" if cross.get("below") else ""
        fig.add_scatter(x=[at, at], y=[0, top], name=f"crossover ~{at:.1f}{between}", mode="lines",
                        line=dict(color=COLORS["rejected"], dash="dot"),
                        hovertemplate=f"speculation stops paying near concurrency {at:.1f}<extra></extra>",
                        row=1, col=1)


def policy_name(policy: dict) -> str:
    """The policy line's legend entry, in the measured levels it chooses between: the crossover
    is interpolated (~8.3) while a policy can only switch at a level that was measured (16),
    and a reader seeing both numbers needs to know why they differ."""
    rows, threshold = policy.get("levels") or [], policy.get("threshold")
    on = [r["concurrency"] for r in rows if r["speculate"]]
    if threshold is None or not on:
        return f"policy: {policy['rule']}"
    return (f"policy: speculate at measured levels up to {max(on)}, not from {threshold} "
            "(the first measured level past the crossover)")
