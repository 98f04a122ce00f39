"""The Playground's "Why checking is cheap · on other hardware" block.

The first chart: the target's verify-cost curve on this machine (measured once per model by the runner,
before the run was timed) and what it means. The second: the run on screen (a live run's or a
replayed trace's) re-timed on a hardware profile: this machine as measured, a GPU-like
machine whose verify pass stays flat to 16 tokens, or custom costs. Re-timing is arithmetic
on the run's recorded decisions (retime.py), and the block says so wherever it shows a number.
"""
from __future__ import annotations

from dataclasses import dataclass
from html import escape

import gradio as gr

from ...core.errors import SpecvizError
from ...core.retime import as_measured, custom, draft_cost, from_curve, gpu_like, retime, run_timing
from ...render.hardware import curve_caption, curve_figure, retime_figure, retime_html
from ...render.numbers import headline
from ..page import Page, accordion

THIS, GPU, CUSTOM = "this machine, as measured", "GPU-like (verify flat to 16 tokens)", "custom"
SLOPE, C = 0.10, 0.05  # the custom sliders' start: roughly this project's CPU with a small draft model
# "first" and "second", not "left" and "right": on a phone the two charts stack, one above the other
INTRO = (
    "A decode step is bound by reading the weights, not by arithmetic, so checking k + 1 drafted tokens in "
    "one pass should cost little more than producing one. The first chart: how true that is on this machine. "
    "The second: this run's own accept/reject decisions re-timed on other hardware: a calculation, not a "
    "measurement."
)


@dataclass(frozen=True)
class Controls:
    curve: gr.Plot
    caption: gr.HTML
    profile: gr.Radio
    slope: gr.Slider
    c: gr.Slider
    result: gr.HTML
    bars: gr.Plot


def controls() -> Controls:
    with accordion("Why checking is cheap · on other hardware", "sv-hardware-box", INTRO, open=True):
        with gr.Row(equal_height=False):
            with gr.Column(min_width=300):
                curve = gr.Plot(curve_figure(None), label="verify cost curve", show_label=False,
                                elem_id="sv-cost-curve")
                caption = gr.HTML(curve_caption(None), elem_id="sv-cost-caption")
            with gr.Column(min_width=300):
                profile = gr.Radio([THIS, GPU, CUSTOM], value=GPU, label="Re-time this run on",
                                   elem_id="sv-retime-profile")
                slope = gr.Slider(0, 1, value=SLOPE, step=0.01, elem_id="sv-retime-slope",
                                  label="custom: each extra verified token costs (plain steps)")
                c = gr.Slider(0, 1, value=C, step=0.01, elem_id="sv-retime-c",
                              label="custom: c, one drafted token costs (plain steps)")
                result = gr.HTML(elem_id="sv-retime-result")
                bars = gr.Plot(retime_figure(None), label="re-timed runs", show_label=False,
                               elem_id="sv-retime-bars")
    return Controls(curve, caption, profile, slope, c, result, bars)


def wire(c: Controls, page: Page) -> None:
    """Redraw the block after each event that puts a run on screen (page.on_screen) and when
    a control changes; moving a slider picks the custom profile."""
    inputs, outputs = [page.session, c.profile, c.slope, c.c], [c.curve, c.caption, c.result, c.bars]
    instant = dict(queue=False, api_visibility="private")
    for event in page.on_screen:
        event.then(show, inputs, outputs, **instant)
    c.profile.change(show, inputs, outputs, **instant)
    for slider in (c.slope, c.c):
        slider.change(lambda s, _, slope, cost: [CUSTOM, *show(s, CUSTOM, slope, cost)], inputs,
                       [c.profile, *outputs], **instant)


def _number(value, default: float) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return default
    return min(max(x, 0.0), 1.0) if x == x else default


def _curve(session):
    """The curve for the run on screen: its own, or for a replay of the same target, the one
    this session measured (a fact of this machine, and the block says whose machine it is)."""
    frame, run = session.last, session.run
    if frame.curve is None and run is not None and run.target == frame.target:
        return run.curve
    return frame.curve


def show(session, profile, slope, cost) -> list:
    """The curve, its caption, the re-timing's line and its bars for the run on screen."""
    frame = getattr(session, "last", None)
    curve = None if frame is None else _curve(session)
    recorded = frame is not None and curve is not None and curve is frame.curve  # not borrowed from this session
    where = frame.recorded_on if recorded else None
    machine = "the machine that recorded this run" if where else "this machine"
    if frame is None or not frame.spec.steps:
        return [curve_figure(curve, recorded_on=where), curve_caption(curve, recorded_on=where),
                '<div class="sv-retime">Generate a run (or replay a trace) to re-time it.</div>', retime_figure(None)]
    h = headline(frame.spec, frame.base, curve)
    verified = h.verified if h.verified > 1 else None
    spec, base = run_timing(frame.spec.events, frame.spec.elapsed), run_timing(frame.base.events, frame.base.elapsed)
    c = draft_cost(spec, base)
    chosen = {THIS: as_measured(), GPU: gpu_like(c)}.get(profile) or custom(_number(slope, SLOPE), _number(cost, C))
    try:
        r = retime(spec, base, chosen)
    except SpecvizError as e:
        return [curve_figure(curve, verified, where), curve_caption(curve, verified, where),
                f'<div class="sv-retime">{escape(str(e))}</div>', retime_figure(None)]
    line = retime_html(r, h.speedup, (len(frame.spec.steps), frame.steps) if frame.steps else None)
    if curve is not None and profile == THIS:
        model = retime(spec, base, from_curve(curve.cost, c))
        line += (f'<div class="sv-retime-note">The cost model alone ({machine}\'s verify curve and c = {c:.3f}) '
                 f"gives {model.speedup:.2f}×; the difference is what it leaves out (the engine's bookkeeping, "
                 "the run's timing noise).</div>")
    elif curve is not None and verified is not None:
        line += (f'<div class="sv-retime-note">Why: a pass over this run\'s {verified:.1f} tokens costs '
                 f"{curve.cost(verified):.2f} steps on {machine} and {chosen.verify(verified):.2f} on this "
                 "profile; drafting costs the same share of a step on both.</div>")
    return [curve_figure(curve, verified, where), curve_caption(curve, verified, where), line, retime_figure(r)]
