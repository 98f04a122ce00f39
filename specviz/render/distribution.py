"""The distribution view: at one position of one step, the target's p and the drafter's q as
paired bars, the residual the corrected token is drawn from, the overlap (the chance a
draft is accepted) and the draw u against p/q, reshaped with any temperature / top-p.
A sampled tree step has no q: at a depth of its branch the view shows the target's p, the
children the sibling walk tried there in order (p′(x), u, verdict, the mass a refusal left)
and p′ after the refusals, the distribution the next child or the correction is judged by.

Reads a Trace (events and labels) like every renderer; the maths is specviz.core.distribution.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

import plotly.graph_objects as go

from ..core.distribution import REST, accept_prob, one_hot, overlap, reshape, residual, without
from ..core.events import StepEvent
from .charts import COLORS, FONT, distinct, figure as new_figure, waiting_for
from .html import RESIDUAL, RESIDUAL_GLOSS, VISIBLE_WHITESPACE, WALK_RESIDUAL, WALK_RULE
from .rules import comparable
from .trace import Trace
from .tree import Judged, ordinal, sibling_walk, walk_end, walk_table

SHOWN = 12  # bars per series: the most probable tokens of p or q (the rest is one bar)
P_COLOR, Q_COLOR, R_COLOR = COLORS["corrected"], COLORS["bonus"], COLORS["rejected"]  # Okabe-Ito


@dataclass(frozen=True)
class Position:
    """One position of one step, reshaped: what the figure and the card show."""

    step: StepEvent
    row: int  # 0..len(draft)-1 a draft position, len(draft) the bonus position
    p: dict
    q: dict  # {} at the bonus position (nothing drafted there)
    names: dict  # token id -> display text
    raw: bool  # reshaped from raw logits (False: an older trace, only the processed top)
    walk: tuple[Judged, ...] = ()  # a sampled tree step: the children the sibling walk tried at this depth
    tree_labels: tuple[str, ...] = ()  # its nodes' display text

    @property
    def drafted(self) -> int | None:
        return self.step.draft[self.row] if self.row < len(self.step.draft) else None


def _rows(e: StepEvent, labels, row: int):
    """(target row, drafter row or None, names, raw?) as (token, log-prob) pairs."""
    raw = bool(e.p_raw)
    p_rows, q_rows = (e.p_raw, e.q_raw) if raw else (e.p_top, e.q_top)
    p_names, q_names = (labels.p_raw, labels.q_raw) if raw else (labels.p_top, labels.q_top)
    as_log = (lambda r: r) if raw else (lambda r: [(t, math.log(x) if x > 0 else -1e4) for t, x in r])
    names = {}
    for rows, texts in ((p_rows, p_names), (q_rows, q_names)):
        if row < len(rows) and row < len(texts):
            names.update({t: s for (t, _), s in zip(rows[row], texts[row])})
    if row < len(e.draft) and row < len(labels.draft):
        names[e.draft[row]] = labels.draft[row]
    p = as_log(p_rows[row]) if row < len(p_rows) else []
    q = as_log(q_rows[row]) if row < len(q_rows) else None
    return p, q, names, raw


def position(trace: Trace, index: int, row: int, temperature: float, top_p: float) -> Position | None:
    """Step `index`'s position `row` (both clamped), reshaped; None when there is no step."""
    steps = [(e, lab) for e, lab in zip(trace.events, trace.labels) if isinstance(e, StepEvent)]
    if not steps:
        return None
    e, labels = steps[min(max(int(index or 0), 0), len(steps) - 1)]
    row = min(max(int(row or 0), 0), len(e.draft))
    p_row, q_row, names, raw = _rows(e, labels, row)
    p = reshape(p_row, temperature, top_p)
    if row == len(e.draft):
        q = {}
    elif q_row is None:
        q = one_hot(e.draft[row])  # a drafter that gives a token, no distribution
    else:
        q = reshape(q_row, temperature, top_p)
    walk = ()
    if not e.greedy and row < len(e.draft):  # a tree's depth `row`: its children in the order tried
        walk = tuple(j for j in sibling_walk(e.tree) if j.depth == row)
        names.update({e.tree.tokens[j.node]: labels.tree[j.node] for j in walk if j.node < len(labels.tree)})
    return Position(e, row, p, q, names, raw, walk, labels.tree)


def _name(pos: Position, t: int) -> str:
    if t == REST:
        return "other tokens"
    text = pos.names.get(t, f"#{t}").translate(VISIBLE_WHITESPACE)
    return f"{text!r}"[1:-1] if text.strip() else f"␣{text}" if text else f"#{t}"


def figure(pos: Position | None) -> go.Figure:
    fig = new_figure()
    # Room above 1 for the "drafted" arrow, and the legend under the bars: on top it covered the arrow.
    fig.update_layout(font=FONT, height=340, margin=dict(l=50, r=10, t=40, b=60),
                      barmode="group", legend=dict(orientation="h", yanchor="top", y=-0.28, x=0),
                      yaxis=dict(range=[0, 1.25], tickvals=[0, 0.2, 0.4, 0.6, 0.8, 1.0]))
    if pos is None:
        return waiting_for(fig, "run something, then pick a step")
    if pos.walk:
        return _walk_figure(fig, pos)
    res = residual(pos.p, pos.q) if pos.q else {}
    tokens = sorted(set(pos.p) | set(pos.q), key=lambda t: (t == REST, -max(pos.p.get(t, 0), pos.q.get(t, 0))))
    tokens = [t for t in tokens if t != REST][:SHOWN] + ([REST] if REST in pos.p or REST in pos.q else [])
    x = [_name(pos, t) for t in tokens]
    x = distinct(x)
    fig.add_bar(x=x, y=[pos.p.get(t, 0) for t in tokens], name="p (target)", marker_color=P_COLOR)
    if pos.q:
        fig.add_bar(x=x, y=[pos.q.get(t, 0) for t in tokens], name="q (drafter)", marker_color=Q_COLOR)
        fig.add_bar(x=x, y=[res.get(t, 0) for t in tokens], name=f"residual {RESIDUAL}: p's excess over q, rescaled",
                    marker_color=R_COLOR, marker_pattern_shape="/")
    if pos.drafted is not None and pos.drafted in tokens:
        # The arrow ends on the top of the drafted token's tallest bar.
        top = max(pos.p.get(pos.drafted, 0), pos.q.get(pos.drafted, 0))
        fig.add_annotation(x=x[tokens.index(pos.drafted)], y=top, text="drafted", showarrow=True, arrowhead=2,
                           ax=0, ay=-28, yanchor="bottom", font=dict(size=13))
    where = f"draft position {pos.row + 1}" if pos.q else "bonus position (all drafts kept)"
    fig.update_layout(title=dict(text=f"Step {pos.step.step + 1}, {where}", font=dict(size=14)),
                      yaxis_title="probability")
    return fig


def _refused(pos: Position) -> set[int]:
    return {pos.step.tree.tokens[j.node] for j in pos.walk if not j.kept}


def _walk_figure(fig: go.Figure, pos: Position) -> go.Figure:
    """A sampled tree's depth: the target's p there, p′ once the refused children are taken out
    (what the next child, or the correction, was judged by), each child marked with its turn."""
    tree, refused = pos.step.tree, _refused(pos)
    after = without(pos.p, refused) if refused else {}
    tried = [tree.tokens[j.node] for j in pos.walk]
    tokens = sorted(set(pos.p) | set(tried), key=lambda t: (t == REST, t not in tried, -pos.p.get(t, 0)))
    tokens = [t for t in tokens if t != REST][:max(SHOWN, len(set(tried)))] + ([REST] if REST in pos.p else [])
    tokens = sorted(tokens, key=lambda t: (t == REST, -pos.p.get(t, 0)))
    x = distinct([_name(pos, t) for t in tokens])
    fig.add_bar(x=x, y=[pos.p.get(t, 0) for t in tokens], name="p (target) at this node", marker_color=P_COLOR)
    if after:
        mass = sum(v for t, v in pos.p.items() if t not in refused)
        fig.add_bar(x=x, y=[after.get(t, 0) for t in tokens], marker_color=R_COLOR, marker_pattern_shape="/",
                    name=f"p′ after the refusals: p without the refused children ÷ {mass:.3f}")
    marks: dict[int, list[str]] = {}
    for j in pos.walk:  # a repeated token has one bar: its turns share one mark
        marks.setdefault(tree.tokens[j.node], []).append(f"{ordinal(j.order)}: {'kept' if j.kept else 'refused'}")
    for t, said in marks.items():
        if t in tokens:
            top = max(pos.p.get(t, 0), after.get(t, 0))
            fig.add_annotation(x=x[tokens.index(t)], y=top, text=", ".join(said), showarrow=True, arrowhead=2,
                               ax=0, ay=-28, yanchor="bottom", font=dict(size=13))
    fig.update_layout(title=dict(text=f"Step {pos.step.step + 1}, depth {pos.row + 1}: the children tried in order",
                                 font=dict(size=14)), yaxis_title="probability")
    return fig


def _walk_card(pos: Position) -> list[str]:
    """The card's lines at a sampled tree's depth: the rule, the walk there, and how it ended."""
    e, walk = pos.step, pos.walk
    lines = [f"<b>The sibling walk at this node</b>: {escape(WALK_RULE)}, p′ starting as the target's p here",
             walk_table(e.tree, pos.tree_labels, depth=pos.row)]
    if any(not j.kept for j in walk):
        lines.append(escape(WALK_RESIDUAL[:1].upper() + WALK_RESIDUAL[1:]))
    kept = next((j for j in walk if j.kept), None)
    if kept is not None and kept.order > 1 and not kept.repeat:
        name = escape(_name(pos, e.tree.tokens[kept.node]))
        lines.append(f"So <code class=\"sv-inspect-tok\">'{name}'</code>, tried after {kept.order - 1} "
                     f"refusal{'s' if kept.order > 2 else ''}, was judged by p′ = p / mass left = {kept.p:.3f} / "
                     f"{kept.mass:.3f} = {kept.before:.3f}, not by its p: its draw u = {kept.u:.3f} fell below "
                     "that, and it was kept")
    if pos.row == sibling_walk(e.tree)[-1].depth:  # the walk ended at this depth
        end = walk_end(e, pos.tree_labels)
        lines.append(escape(end[:1].upper() + end[1:]))
    return lines


def card_html(pos: Position | None, temperature: float, top_p: float) -> str:
    """The numbers beside the bars: overlap, the draw u against p/q, the verdict, what is shown."""
    if pos is None:
        return '<div class="sv-dist sv-muted">Run something (or replay a trace), then pick a step.</div>'
    e, lines = pos.step, []
    if pos.walk:
        lines.extend(_walk_card(pos))
    elif pos.q:
        a = overlap(pos.p, pos.q)
        lines.append(f"<b>overlap Σ min(p, q) = {a:.3f}</b>: the chance the drafter's token is accepted here")
        x = pos.drafted
        ap = accept_prob(pos.p, pos.q, x)
        # quoted, its spaces kept: "drafted <code> by</code>" read as "drafted by: p = ..."
        name = escape(_name(pos, x))
        lines.append(f"drafted <code class=\"sv-inspect-tok\">'{name}'</code>: p = {pos.p.get(x, 0):.3f}, "
                     f"q = {pos.q.get(x, 0):.3f}, min(1, p/q) = {ap:.3f}")
        if e.draws is not None and pos.row < len(e.draws):
            u = e.draws[pos.row]
            kept = "kept" if u < ap else (f"rejected: the corrected token is drawn from the residual {RESIDUAL}, "
                                          f"{RESIDUAL_GLOSS}")
            if e.verification == "block" and comparable(e):  # the block decided, not this position's coin alone
                kept = "kept" if pos.row < e.accepted else "not kept"
                lines.append(f"the run's draw u = {u:.3f}; the run judged the block as a whole (block verification): "
                             f"this draft was {kept}, the inspector's backward pass says why; token-wise "
                             f"(u {'<' if u < ap else '≥'} {ap:.3f}) would have {'kept' if u < ap else 'rejected'} it")
            else:
                lines.append(f"the run's draw u = {u:.3f} {'<' if u < ap else '≥'} {ap:.3f}: {kept} (at these settings)")
        elif e.greedy:
            lines.append("greedy run: kept only if it is the target's top token; the bars show the "
                         "distributions a sampled run would compare")
        if pos.row > e.accepted:
            lines.append("(in the run this position was not checked: an earlier draft was rejected)")
    elif e.accepted >= len(e.draft):
        lines.append("every draft was accepted: the same target pass gives this bonus token from p")
    else:  # the position after the drafts, which this step never reached
        lines.append(f"this step did not reach here: draft {e.accepted + 1} was rejected, and the target's "
                     f"corrected token came from that position (no bonus token)")
    scope = (f"Reshaped with temperature {temperature:g}, top-p {top_p:g} over the recorded top tokens "
             "(the rest is one estimated bar)" if pos.raw else
             "This trace holds only the processed top tokens: shown as recorded")
    # A greedy run draws nothing: it kept a draft when it was the target's top token, no u involved.
    used = ("The run compared the drafts with the target's top token (greedy draws no u)" if e.greedy else
            f"The run used the recorded {'p′ and u' if pos.walk else 'p, q and u'}")
    lines.append(f'<span class="sv-muted">{escape(scope)}. {used}.</span>')
    return f'<div class="sv-dist" data-row="{pos.row}">{"<br>".join(lines)}</div>'
