"""Plotly figures built from traces: acceptance, throughput, accepted lengths, positions.

Pure functions of the events; the engine's clocks give every time, so how often the page
redraws changes nothing here.
"""
from __future__ import annotations

import textwrap

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from ..core.events import StepEvent
from .trace import Trace

# Okabe-Ito: distinguishable with every common colour-vision deficiency.
COLORS = {
    "accepted": "#009E73", "rejected": "#D55E00", "corrected": "#0072B2", "bonus": "#E69F00",
    "baseline": "#7A7A7A", "speculative": "#0072B2", "cumulative": "#222222",
}
SERIES = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
# Compare's runs, one colour each: Okabe-Ito's, then Paul Tol's muted ones that stand apart from
# them; past these, the colours come round again with a hatching, so no two runs look alike.
RUNS = SERIES + ("#882255", "#332288", "#999933", "#44AA99", "#000000")
HATCHES = ("", "/", "x", ".")
FONT = dict(family="Inter, 'Segoe UI', system-ui, sans-serif", size=13, color="#1f2328")


def _house_template() -> go.layout.Template:
    """plotly_white, cut to what these charts draw (2-D axes, bars, lines). Naming the whole
    template validated the defaults of every trace type plotly has: most of a page's redraw
    (docs/performance.md)."""
    white = pio.templates["plotly_white"]
    layout = {k: v for k, v in white.layout.to_plotly_json().items()
              if k not in ("geo", "polar", "scene", "ternary", "mapbox", "coloraxis", "colorscale")}
    data = {kind: rows for kind, rows in white.data.to_plotly_json().items() if kind in ("bar", "scatter")}
    return go.layout.Template(layout=layout, data=data)


HOUSE = _house_template()


def figure() -> go.Figure:
    """An empty figure in the house template (go.Figure() would first apply plotly's default)."""
    return go.Figure(layout_template=HOUSE)


def subplots(**kwargs) -> go.Figure:
    """make_subplots on a house-template figure."""
    return make_subplots(figure=figure(), **kwargs)


def styled(fig: go.Figure, title: str, x: str, y: str, height: int = 280) -> go.Figure:
    """The house style every chart shares (the serving and hardware charts too): title at the
    left, axis titles, legend below, zoom kept across live updates. `fig` comes from figure()
    or subplots(), which carry the house template."""
    fig.update_layout(
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=15)),
        font=FONT, height=height,
        margin=dict(l=56, r=16, t=44, b=48),
        legend=dict(orientation="h", yanchor="top", y=-0.3, xanchor="left", x=0.0),
        hoverlabel=dict(font_size=13), bargap=0.15, uirevision="keep",  # keep zoom across updates
    )
    fig.update_xaxes(title_text=x, showline=True, linecolor="#bbb", zeroline=False)
    fig.update_yaxes(title_text=y, showline=True, linecolor="#bbb", zeroline=False)
    return fig



def distinct(labels: list[str]) -> list[str]:
    """Category labels made distinct by trailing spaces (plotly merges equal categories into one
    bar), so two tokens that print alike keep a bar each and still read the same."""
    return [f"{s} " * (1 + labels[:i].count(s)) if labels[:i].count(s) else s for i, s in enumerate(labels)]

PLACEHOLDER_CHARS = 28  # a line of a chart's placeholder: fits the plot area of a phone's chart (~230 px)


def waiting_for(fig: go.Figure, message: str = "waiting for the run") -> go.Figure:
    """A chart with nothing to draw yet: its message on empty axes from 0 (plotly's own
    default range for no data, -1 to 4 or so, made counts and rates look negative), in lines
    short enough for a phone (plotly never wraps text: a long one was cut at both edges)."""
    lines = textwrap.wrap(message, PLACEHOLDER_CHARS) or [""]
    fig.add_annotation(text="<br>".join(lines), showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font=dict(size=14, color="#888"))
    fig.update_xaxes(range=[0, 1], showticklabels=False, showgrid=False)
    fig.update_yaxes(range=[0, 1], showticklabels=False, showgrid=False)
    return fig


def acceptance_figure(spec: Trace) -> go.Figure:
    """Per step: accepted / drafted (bars) and the cumulative acceptance rate alpha (line)."""
    fig = styled(figure(), "Acceptance rate per step", "step", "accepted / drafted")
    steps = _drafted_steps(spec)
    if not steps:
        return waiting_for(fig, "nothing drafted yet")
    return acceptance_bars(fig, list(steps), "accepted")


def _drafted_steps(spec: Trace) -> tuple[tuple[int, int, int], ...]:
    """(step from 1, accepted, drafted) of each step that drafted something."""
    return tuple((e.step + 1, e.accepted, len(e.draft)) for e in spec.steps if e.draft)


def acceptance_bars(fig: go.Figure, steps: list[tuple[int, int, int]], verb: str) -> go.Figure:
    """(step, accepted, drafted) of the steps that drafted: each step's rate as a bar, and the
    cumulative alpha (all accepted so far over all drafted so far) as a line. Local runs and
    server runs draw acceptance with this one picture."""
    rate, cumulative, total_a, total_d = [], [], 0, 0
    for _, a, d in steps:
        total_a, total_d = total_a + a, total_d + d
        rate.append(a / d)
        cumulative.append(total_a / total_d)
    xs = [step for step, _, _ in steps]
    fig.add_bar(x=xs, y=rate, name="this step", marker_color=COLORS["accepted"], opacity=0.75,
                hovertemplate=f"step %{{x}}<br>%{{y:.2f}} {verb}<extra></extra>")
    fig.add_scatter(x=xs, y=cumulative, name="cumulative α", mode="lines",
                    line=dict(color=COLORS["cumulative"], width=2.5),
                    hovertemplate="through step %{x}<br>α = %{y:.3f}<extra></extra>")
    fig.update_yaxes(range=[0, 1.05])
    return fig


def speed_lines(fig: go.Figure, runs: list[tuple[str, str, list[float], list[float]]]) -> go.Figure:
    """(name, colour, seconds, tokens/s so far) of each run: one line each, from zero up. Local
    runs and server runs draw speed with this one picture. A run with a single point gets a
    marker (a line needs two points, and one alone would not show)."""
    for name, color, xs, ys in runs:
        fig.add_scatter(x=xs, y=ys, name=name, mode="lines+markers" if len(xs) == 1 else "lines",
                        line=dict(color=color, width=2.5),
                        hovertemplate="%{x:.2f} s<br>%{y:.1f} tokens/s<extra>" + name + "</extra>")
    fig.update_yaxes(rangemode="tozero")
    return fig


def _throughput_points(trace: Trace) -> tuple[list[float], list[float]]:
    xs, ys, tokens = [], [], 0
    for e in trace.events:
        tokens += len(e.emitted) if isinstance(e, StepEvent) else 1
        if e.elapsed > 0:
            xs.append(e.elapsed)
            ys.append(tokens / e.elapsed)
    return xs, ys


def throughput_figure(spec: Trace, base: Trace) -> go.Figure:
    """Tokens per second so far, against engine time, for both runs (prefill included)."""
    fig = styled(figure(), "Tokens per second over time", "engine time (s)", "tokens / s")
    if not spec.events and not base.events:
        return waiting_for(fig)
    return speed_lines(fig, [(name, COLORS[name], *_throughput_points(trace))
                             for trace, name in ((spec, "speculative"), (base, "baseline"))])


def accepted_length_figure(spec: Trace) -> go.Figure:
    """How many drafts each step kept: a histogram over the steps that drafted something."""
    fig = styled(figure(), "Accepted drafts per step", "accepted draft tokens", "steps")
    counts = _length_counts(spec)
    if not counts:
        return waiting_for(fig, "nothing drafted yet")
    colors = [COLORS["accepted"] if n else COLORS["rejected"] for n in range(len(counts))]
    fig.add_bar(x=list(range(len(counts))), y=list(counts), marker_color=colors, showlegend=False,
                hovertemplate="%{y} steps kept %{x} drafts<extra></extra>")
    fig.update_xaxes(dtick=1)
    return fig


def _length_counts(spec: Trace) -> tuple[int, ...]:
    """How many steps kept 0, 1, ... drafts, up to the longest draft (k at least); () when none drafted."""
    drafted = [e for e in spec.steps if e.draft]
    if not drafted:
        return ()
    counts = [0] * (max(max(len(e.draft) for e in drafted), spec.k) + 1)
    for e in drafted:
        counts[e.accepted] += 1
    return tuple(counts)


def position_rates(spec: Trace) -> list[tuple[int, int]]:
    """Per draft position i: (times the verifier reached it, times it was accepted).

    Position i is reached when the step drafted more than i tokens and kept all before i.
    """
    out: list[list[int]] = []
    for e in spec.steps:
        for i in range(min(len(e.draft), e.accepted + 1)):
            while len(out) <= i:
                out.append([0, 0])
            out[i][0] += 1
            out[i][1] += i < e.accepted
    return [(r, a) for r, a in out]


def block_run(spec: Trace) -> bool:
    """Did a block drafter (one pass per block, drafters/block.py) make every draft of this run?"""
    drafted = [e for e in spec.steps if e.draft]
    return bool(drafted) and all(e.parallel for e in drafted)


def position_figure(spec: Trace) -> go.Figure:
    """Acceptance rate by draft position, given the verifier got that far; for a block drafter's run,
    by position within the block, with the share of steps that kept every position up to each one."""
    block = block_run(spec)
    fig = styled(figure(), "Acceptance by position within the block" if block else "Acceptance by draft position",
                 "position in the block" if block else "draft position", "accepted / reached")
    rates = position_rates(spec)
    if not rates:
        return waiting_for(fig, "nothing drafted yet")
    position_bars(fig, rates, "accepted")
    if block:  # how deep blocks get: the steps that kept positions 1..j, of all that drafted
        steps = rates[0][0]
        fig.add_scatter(x=list(range(1, len(rates) + 1)), y=[a / steps for _, a in rates], mode="lines+markers",
                        name="kept through here (share of steps)", line={"color": COLORS["accepted"]},
                        hovertemplate="%{y:.0%} of steps kept positions 1-%{x}<extra></extra>")
        fig.update_layout(legend={"orientation": "h", "y": -0.3})
    return fig


def position_bars(fig: go.Figure, counts: list[tuple[int, int]], verb: str) -> go.Figure:
    """(times reached, times kept) per draft position from 1: each position's rate as a bar, the
    counts on hover. Local runs and server runs draw acceptance by position with this one picture."""
    fig.add_bar(x=list(range(1, len(counts) + 1)), y=[a / r if r else 0.0 for r, a in counts],
                marker_color=COLORS["corrected"], showlegend=False, customdata=[[a, r] for r, a in counts],
                hovertemplate=f"position %{{x}}: %{{customdata[0]}} of %{{customdata[1]}} {verb}<extra></extra>")
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(range=[0, 1.05])
    return fig


# The Playground's four charts by name, each drawn from the two runs.
PLAYGROUND_CHARTS = {
    "acceptance": lambda spec, base: acceptance_figure(spec),
    "throughput": throughput_figure,
    "lengths": lambda spec, base: accepted_length_figure(spec),
    "positions": lambda spec, base: position_figure(spec),
}


def playground_figures(spec: Trace, base: Trace) -> tuple[go.Figure, ...]:
    return tuple(draw(spec, base) for draw in PLAYGROUND_CHARTS.values())


def playground_chart_data(spec: Trace, base: Trace) -> dict:
    """What each of the Playground's charts draws, by name, from the helpers the charts use: equal
    data draws an equal chart, so a page already showing it need not be sent it again (a step that
    drafted nothing changes only the throughput; plotly took most of a Next step's time)."""
    return {"acceptance": _drafted_steps(spec),
            "throughput": (bool(spec.events or base.events), *map(tuple, _throughput_points(spec)),
                           *map(tuple, _throughput_points(base))),
            "lengths": _length_counts(spec),
            "positions": (block_run(spec), *position_rates(spec))}


def run_colors(names: list[str]) -> tuple[list[str], list[str]]:
    """(colour, hatching) of each of Compare's runs: the baseline grey, every other run its own
    (prompt lookup and layer skip were both orange once SERIES came round again)."""
    colors, hatches, n = [], [], 0
    for name in names:
        if name == "baseline":
            colors.append(COLORS["baseline"])
            hatches.append("")
            continue
        colors.append(RUNS[n % len(RUNS)])
        hatches.append(HATCHES[n // len(RUNS) % len(HATCHES)])
        n += 1
    return colors, hatches


def compare_figures(rows: list[dict]) -> tuple[go.Figure, go.Figure]:
    """Bar charts for the Compare tab, one bar per run (rows from render.compare.compare_rows).

    Horizontal bars: run names (often model ids) stay readable however long they are.
    """
    height = 140 + 40 * max(len(rows), 2)
    # Short title and labels: a phone cut the longer ones off (the range is in the table)
    speed = styled(figure(), "Throughput<br><sup>median tokens/s; label = speedup over the baseline</sup>",
                   "tokens / s", "", height=height)
    speed.update_layout(margin_t=60)
    quality = styled(subplots(rows=1, cols=3, shared_yaxes=True, horizontal_spacing=0.04,
                                   subplot_titles=("α", "τ", "target passes")),
                     "Acceptance and target work<br><sup>α acceptance rate · τ tokens per step · target passes</sup>",
                     "", "", height=height)
    quality.update_layout(margin_t=92)
    if not rows:
        return waiting_for(speed), waiting_for(quality)
    names = [r["run"] for r in rows]
    colors, hatches = run_colors(names)
    marker = dict(color=colors, pattern=dict(shape=hatches, fgcolor="#ffffff", solidity=0.3))
    labels = ["" if r["speedup"] is None else f"{r['speedup']:.2f}×" for r in rows]
    speed.add_bar(y=names, x=[r["tokens_per_s"] or 0 for r in rows], orientation="h", marker=marker,
                  text=labels, textposition="auto", showlegend=False,
                  hovertemplate="%{y}<br>%{x:.1f} tokens/s<extra></extra>")
    for col, key in enumerate(("alpha", "tau", "target_calls"), start=1):
        quality.add_bar(y=names, x=[r[key] or 0 for r in rows], orientation="h", marker=marker,
                        showlegend=False, row=1, col=col, hovertemplate="%{y}<br>%{x:.3~f}<extra></extra>")
    for fig in (speed, quality):
        fig.update_yaxes(autorange="reversed", title_text="")  # first run on top, as in the table
        fig.update_xaxes(rangemode="tozero")
    quality.update_annotations(font_size=13)
    return speed, quality


def empty_figures(n: int = 4) -> tuple[go.Figure, ...]:
    blank = Trace("speculative")
    return playground_figures(blank, Trace("baseline", speculative=False))[:n]

