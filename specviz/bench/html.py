"""A self-contained HTML report: plotly charts (plotly.js inlined once) and the tables.

The file opens offline in any browser; nothing is fetched from a CDN.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go
import plotly.io as pio

from .report import cost_table, phase_table, summary_table

CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }
pre { background: #f6f6f6; padding: 1rem; overflow-x: auto; font-size: 12px; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
"""


def _rows(doc: dict, category: str | None = None) -> list[dict]:
    return [r for r in doc["summary"] if category is None or r["category"] == category]


def _arms(doc: dict) -> list[str]:
    return list(dict.fromkeys(r["arm"] for r in doc["summary"]))


def _by_category(doc: dict, field: str, title: str, y_title: str, reference: float | None = None) -> go.Figure:
    cats = list(dict.fromkeys(r["category"] for r in doc["summary"]))
    fig = go.Figure()
    for arm in _arms(doc):
        rows = {r["category"]: r for r in doc["summary"] if r["arm"] == arm}
        fig.add_bar(name=arm, x=cats, y=[rows[c][field] if c in rows else None for c in cats])
    if reference is not None:
        fig.add_hline(y=reference, line_dash="dot", line_color="#888")
    fig.update_layout(title=title, barmode="group", yaxis_title=y_title, height=420)
    return fig


def _predicted_vs_measured(doc: dict) -> go.Figure:
    fig = go.Figure()
    top = 1.0
    for arm in _arms(doc):
        rows = [r for r in doc["summary"] if r["arm"] == arm and r["predicted"] and r["category"] != "all"]
        if not rows:
            continue
        fig.add_scatter(name=arm, mode="markers", x=[r["predicted"] for r in rows],
                        y=[r["decode_speedup"] for r in rows], text=[r["category"] for r in rows])
        top = max([top] + [r["predicted"] for r in rows] + [r["decode_speedup"] for r in rows])
    fig.add_scatter(name="efficiency 1", mode="lines", x=[0, top * 1.1], y=[0, top * 1.1],
                    line=dict(dash="dot", color="#888"))
    fig.update_layout(title="Measured decode speedup vs the cost model's prediction",
                      xaxis_title="predicted", yaxis_title="measured", height=420)
    return fig


def _positions(doc: dict) -> go.Figure:
    fig = go.Figure()
    for r in _rows(doc, "all"):
        pos = r["position_acceptance"]
        if pos:
            fig.add_scatter(name=r["arm"], mode="lines+markers", x=list(range(1, len(pos) + 1)), y=pos)
    fig.update_layout(title="Acceptance by draft position (given the tokens before it were accepted)",
                      xaxis_title="draft position", yaxis_title="P(accepted)", yaxis_range=[0, 1.05], height=400)
    return fig


def _phases(doc: dict) -> go.Figure:
    arms = [p["arm"] for p in doc["phases"]]
    fig = go.Figure()
    names = {"draft_forward": "draft forward", "draft_other": "draft other",
             "target_forward": "target forward", "other": "other (verify maths, rollback, sync, Python)"}
    for key, name in names.items():
        fig.add_bar(name=name, x=arms,
                    y=[p["ms_per_step"][key] * p["steps"] / p["tokens"] for p in doc["phases"]])
    fig.update_layout(title="Where the decode time goes (ms per generated token)", barmode="stack",
                      yaxis_title="ms / token", height=420)
    return fig


def _verify_costs(doc: dict) -> go.Figure:
    fig = go.Figure()
    for cat, c in doc["costs"].items():
        sizes = sorted(int(n) for n in c["verify_ratio"])
        fig.add_scatter(name=cat, mode="lines+markers", x=sizes, y=[c["verify_ratio"][str(n)] for n in sizes])
    fig.update_layout(title="Verify cost ratio v(n): target forward over n new tokens / over 1",
                      xaxis_title="new tokens n", yaxis_title="v(n)", height=400)
    return fig


def figures(doc: dict) -> list[go.Figure]:
    return [
        _by_category(doc, "tokens_per_s", "Tokens per second (prefill included)", "tokens / s"),
        _by_category(doc, "speedup", "Speedup over the baseline, same prompts, interleaved runs", "x", 1.0),
        _predicted_vs_measured(doc),
        _positions(doc),
        _phases(doc),
        _verify_costs(doc),
    ]


def write_html(doc: dict, path: str) -> None:
    c = doc["config"]
    charts = [pio.to_html(fig, full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figures(doc))]
    env = ", ".join(f"{k} {v}" for k, v in doc["environment"].items() if not isinstance(v, (list, dict)))
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>specviz bench</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>specviz bench: {html.escape(str(c['target']))}</h1>",
        f"<p>{html.escape(doc['created'])}; {html.escape(env)}</p>",
        f"<p><code>{html.escape(c.get('command') or '')}</code></p>",
        *charts,
        "<h2>Summary</h2>", f"<pre>{html.escape(summary_table(doc))}</pre>",
        "<h2>Phases</h2>", f"<pre>{html.escape(phase_table(doc))}</pre>",
        "<h2>Verify cost ratios</h2>", f"<pre>{html.escape(cost_table(doc))}</pre>",
        "</body></html>",
    ]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
