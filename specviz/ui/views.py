"""From a runner Frame to the values the page's components show (and the API returns)."""
from __future__ import annotations

import gradio as gr

from ..render import (PLAYGROUND_CHARTS, agreement, agreement_html, compare_figures, divergence, compare_rows, headline,
                      headline_html, panel_html, playground_chart_data, side_by_side_html, status_html, step_html,
                      table_values)
from ..render.compare import HEADERS
from ..render.html import WINDOW
from ..render.status import count
from ..render.trace import Trace
from .live.runner import Frame


def _run_note(trace: Trace) -> str:
    if not (trace.events or trace.done):
        return ""
    s = trace.stats()
    return f"{count(s.tokens, 'token')} · {s.tokens_per_s:.1f} tok/s · {count(s.steps, 'target pass', 'target passes')}"


def _run_dict(trace: Trace) -> dict:
    return {"label": trace.label, "text": trace.text(), "token_ids": trace.token_ids,
            "error": trace.error, **trace.stats().to_dict()}


def _divergence(frame: Frame) -> dict | None:
    """Greedy runs that part: where, by what margins, and whether rounding explains it."""
    d = divergence(frame.spec, frame.base, frame.dtype) if frame.greedy else None
    return None if d is None else {**d.to_dict(), "sentence": d.sentence()}


def playground_summary(frame: Frame) -> dict:
    """The machine-readable result: what a script calling the API usually wants."""
    spec, base = frame.spec, frame.base
    same, first_difference = agreement(spec, base)
    return {
        "state": frame.state, "message": frame.message, "ahead": frame.ahead, "target": frame.target,
        "greedy": frame.greedy,
        # Greedy: identical over the tokens both runs produced (compared_tokens); Stop ends them apart.
        "identical": same if frame.greedy else None, "first_difference": first_difference,
        "divergence": _divergence(frame),
        "compared_tokens": min(len(spec.token_ids), len(base.token_ids)),
        "headline": headline(spec, base, frame.curve).to_dict(),
        "verify_cost": None if frame.curve is None else frame.curve.to_dict(),
        "speculative": _run_dict(spec), "baseline": _run_dict(base),
    }


CHARTS = tuple(PLAYGROUND_CHARTS)  # acceptance, throughput, lengths, positions: playground_figures' order


def _charts(frame: Frame, pinned: int | None = None, shown: dict | None = None, resend: bool = False) -> dict:
    """The four charts, the step slider and the inspector; left as they are (gr.skip) when the
    frame does not redraw them (runner.throttle paces them). The slider counts steps from 1, as
    every label does; the inspector follows the newest step that drafted something (the last
    steps of a run often draft nothing: no room left), unless the reader `pinned` an older one.
    `shown`: what the page's charts draw now (render.charts.playground_chart_data), kept up to date
    here; a chart that would draw the same is left as it is, unless `resend`."""
    if not frame.charts:
        return dict.fromkeys((*CHARTS, "step", "inspector"), gr.skip())
    spec, base = frame.spec, frame.base
    data = playground_chart_data(spec, base)
    charts = {name: gr.skip() if shown is not None and not resend and shown.get(name) == data[name]
              else PLAYGROUND_CHARTS[name](spec, base) for name in CHARTS}
    if shown is not None:
        shown.update(data)
    steps = spec.steps
    n_steps = len(steps)
    if pinned is not None and pinned < n_steps:
        step = pinned  # the value too: an update drawn before the reader's choice may have moved the slider
    else:
        step = next((i for i in range(n_steps - 1, -1, -1) if steps[i].draft), max(n_steps - 1, 0))
    return {**charts, **inspected(spec, step, max(frame.steps or 0, n_steps))}


def inspected(spec, step: int, total: int) -> dict:
    """The step slider and the inspector on `step` (from 0) of `spec`'s steps, of `total` in the run."""
    n_steps = len(spec.steps)
    # maximum 2 at least: a slider from 1 to 1 has no track (it is not interactive then anyway)
    return {"step": gr.Slider(value=step + 1, minimum=1, maximum=max(n_steps, 2), interactive=n_steps > 1),
            "inspector": step_html(spec, step, total)}


def _window(frame: Frame) -> int | None:
    """How many tokens the panels draw one by one: all once both runs are shown to their end; while
    a run goes, plays or is stepped through, its last WINDOW (the rest as plain text), so a frame
    costs the same at step 1,000 as at step 10."""
    ended = all(t.done or t.error for t in (frame.spec, frame.base))
    return None if ended and frame.playing is None else WINDOW


def playground_values(frame: Frame, pinned: int | None = None, charts: dict | None = None,
                      resend: bool = False) -> dict:
    """The Playground's outputs by name (layout.py's): status, check, headline, the two panels,
    four charts, step slider, inspector, summary. `pinned`: the step (from 0) the reader chose in the inspector, kept while the run goes on.
    `charts`: what the page's charts show (a Session's), so that one that would not change is not sent again;
    `resend`: send every chart all the same (what an API caller reads from a run's last update)."""
    spec, base = frame.spec, frame.base
    started = bool(spec.events or base.events)
    window = _window(frame)
    return {
        "status": status_html(frame.message, frame.state, frame.fraction),
        "check": agreement_html(spec, base, frame.greedy, frame.dtype) if started else "",
        "headline": headline_html(headline(spec, base, frame.curve)) if started else "",
        "spec": panel_html(spec, f"Speculative · {spec.label}", _run_note(spec), playing=frame.playing,
                           window=window),
        "base": panel_html(base, "Baseline · plain decoding", _run_note(base), window=window),
        **_charts(frame, pinned, charts, resend),
        "summary": playground_summary(frame),
    }


def compare_values(frame: Frame) -> dict:
    """The Compare tab's outputs by name (layout.py's): status, table, two charts, the outputs
    side by side (each run's last WINDOW tokens drawn one by one while the race goes, every token
    once it has ended: as the Playground's panels), summary."""
    rows = compare_rows(frame.base, frame.runs, getattr(frame, "rounds", ()))
    speed, quality = compare_figures(rows) if frame.charts else (gr.skip(), gr.skip())
    summary = {"state": frame.state, "message": frame.message, "ahead": frame.ahead, "target": frame.target,
               "rows": rows,
               "runs": [_run_dict(t) for t in [frame.base, *frame.runs]]}
    return {
        "status": status_html(frame.message, frame.state, frame.fraction),
        "table": {"headers": HEADERS, "data": table_values(rows)},
        "speed": speed, "quality": quality,
        "panels": side_by_side_html(frame.base, frame.runs, window=None if frame.final else WINDOW),
        "summary": summary,
    }


def error_frame(message: str, greedy: bool = True) -> Frame:
    frame = Frame(base=Trace("baseline", speculative=False), runs=[Trace("speculative")],
                  message=message, state="error", greedy=greedy, final=True)
    return frame
