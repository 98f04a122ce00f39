"""The "Distributions at this step" block: p against q at the inspector's step, reshaped live.

It reads the frame the step inspector reads (Session.last: a live run or a replay), so it
follows the step slider, and its temperature / top-p sliders redraw from the recorded
log-probs with no new run.
"""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from ...render import distribution as view
from ..page import Page, accordion


@dataclass(frozen=True)
class Controls:
    row: gr.Slider
    temperature: gr.Slider
    top_p: gr.Slider
    plot: gr.Plot
    card: gr.HTML


def controls() -> Controls:
    # Closed at first: a deep look at one step, opened when the lesson gets there (the page was ~3,600 px)
    with accordion("Distributions at this step", "sv-dist-box",
                   "The target's p and the drafter's q at one position of the step chosen above. "
                   "Move temperature or top-p to see how the same step would have gone. A sampled tree step "
                   "shows, at each depth, the children tried in order and p′ after each refusal."):
        with gr.Row():
            row = gr.Slider(1, 2, value=1, step=1, label="position (1 = first draft; last = bonus)",
                            elem_id="sv-dist-row", min_width=160)
            temperature = gr.Slider(0.05, 2.0, value=1.0, step=0.05, label="temperature (this view only)",
                                    elem_id="sv-dist-temperature", min_width=160)
            top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.01, label="top-p (this view only)",
                              elem_id="sv-dist-top-p", min_width=160)
        plot = gr.Plot(view.figure(None), show_label=False, elem_id="sv-dist-plot")
        card = gr.HTML(view.card_html(None, 1.0, 1.0), elem_id="sv-dist-card")
    return Controls(row, temperature, top_p, plot, card)


def show(session, step, row, temperature, top_p):
    """The figure, the card and the position slider (its range: this step's drafts and the bonus)."""
    frame = getattr(session, "last", None)
    t, p = float(temperature or 1.0), float(top_p or 1.0)
    # both sliders count from 1, as the page does; the trace counts from 0
    pos = view.position(frame.spec, int(step or 1) - 1, int(row or 1) - 1, t, p) if frame is not None else None
    rows = len(pos.step.draft) + 1 if pos is not None else 1
    return view.figure(pos), view.card_html(pos, t, p), gr.Slider(maximum=max(rows, 2), value=pos.row + 1 if pos else 1)


def at_run_settings(session, step, row, temperature, top_p):
    """A new step opens at the run's own temperature and top-p (greedy: the temperature-1
    softmax it records), so the bars first show what the run compared; a replay keeps the sliders."""
    s = getattr(session, "settings", None)
    if s is not None:
        temperature, top_p = (1.0, 1.0) if s.greedy else (s.temperature, s.top_p)
    return (*show(session, step, row, temperature, top_p), temperature, top_p)


def wire(c: Controls, page: Page) -> None:
    """Redraw when the step changes (a run, a replay or the visitor moves it) or a control moves."""
    step = page.step
    inputs, outputs = [page.session, step, c.row, c.temperature, c.top_p], [c.plot, c.card, c.row]
    instant = dict(queue=False, api_visibility="private", show_progress="hidden")
    step.change(at_run_settings, inputs, [*outputs, c.temperature, c.top_p], **instant)
    for control in (c.row, c.temperature, c.top_p):
        control.input(show, inputs, outputs, **instant)
