"""The draft-length blocks of the Playground: the degeneracy meter beside the acceptance chart, and
"Draft-length controllers on this run": the finished run's draft record, every controller replayed on it
beside the hindsight best (render/controllers.py draws them), and the top two raced live to check the
replay. Computing is run/draft_control.py's; this file only wires Gradio to it."""
from __future__ import annotations

import time
from dataclasses import dataclass

import gradio as gr

from ...core.errors import SpecvizError
from ...engine import controller_names
from ...render import controllers as view
from ...render.degeneracy import EMPTY, meter_html
from ...render.status import status_html
from ...render.trace import Trace
from ...run import draft_control
from ...run.arms import parse_arm
from ..live import runner
from ..page import Page, accordion
from ..policy import Policy


def meter_box() -> gr.HTML:
    return gr.HTML(EMPTY, label="degeneracy meter", elem_id="sv-degeneracy")


def meter(session) -> str:
    frame = getattr(session, "last", None)
    return EMPTY if frame is None else meter_html(frame.spec)


def wire_meter(box: gr.HTML, page: Page) -> None:
    """Redraw after each event that puts a run on screen (a run ends, a replay is loaded)."""
    for event in page.on_screen:
        event.then(meter, page.session, box, queue=False, api_visibility="private", show_progress="hidden")


# The controllers replayed: specviz's own, every engine rule at its defaults and fixed k from 1 to 16.
NAMES = ["specviz", *controller_names.ENGINE_RULES, "fixed:1", "fixed:2", "fixed:4", "fixed:8", "fixed:16"]


@dataclass(frozen=True)
class Controls:
    replay: gr.Button
    race: gr.Button
    status: gr.HTML
    plot: gr.Plot
    table: gr.HTML
    raced: gr.HTML
    made: gr.State  # this visitor's (record, replays) of the run on screen


def controls() -> Controls:
    # Closed at first: a question for after a run, as the distributions and exactness blocks are
    with accordion("Draft-length controllers on this run", "sv-controllers-box",
                   "How would other engines' rules for choosing k have done on this run? The run is recorded once "
                   "(at every position, the longest draft there and how far the target keeps it), then every "
                   "controller is replayed on the record beside the hindsight best, which knows where each draft "
                   "breaks. Racing the top two live checks the replay."):
        with gr.Row(elem_classes="sv-actions"):
            replay = gr.Button("Replay controllers on this run", variant="primary", elem_id="sv-controllers-replay")
            race = gr.Button("Race the top two live", elem_id="sv-controllers-race", interactive=False)
        status = gr.HTML(elem_id="sv-controllers-status")
        plot = gr.Plot(view.k_figure([]), show_label=False, elem_id="sv-controllers-plot")
        table = gr.HTML(view.table_html([]), elem_id="sv-controllers-table")
        raced = gr.HTML(elem_id="sv-controllers-race-table")
    return Controls(replay, race, status, plot, table, raced, gr.State(None))


def bounded(policy: Policy, should_stop):
    """The stop check of one piece of the block's work, ended too past the policy's max_run_seconds, as any
    run is on a hosted app: a record is one run's length of target passes, a race two runs more."""
    if not policy.max_run_seconds:
        return should_stop
    deadline = time.monotonic() + policy.max_run_seconds
    return lambda: should_stop() or time.monotonic() > deadline


def _prepared(policy: Policy, models, s, should_stop):
    """The run's target, prompt ids, config and a fresh drafter (models are cached: no new load)."""
    frame = runner.Frame(base=Trace("baseline", speculative=False), runs=[Trace("controllers")])
    gen = runner.preparing(s, policy, models, frame, should_stop, parse_arm(s.drafter, s.config()))
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value


def replayed(policy: Policy, models, session, should_stop):
    """(status, plot, table, race, made, race button) for the run on screen: its record, every controller replayed."""
    run, s = getattr(session, "run", None), getattr(session, "settings", None)
    if run is None or s is None or run.state != "done":
        yield status_html("Generate a run first: the controllers are replayed on a finished run.", "info"), \
            gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        return
    try:
        yield status_html("Recording this run's drafts at every position…", "running"), \
            gr.skip(), gr.skip(), "", None, gr.Button(interactive=False)
        p = _prepared(policy, models, s, should_stop)
        if p.drafter is None:
            raise SpecvizError("This run drafted nothing ('none'): pick a drafter and generate again.")
        rec = draft_control.record(p.target, p.drafter, p.ids, p.cfg, s.drafter, run.curve,
                                   bounded(policy, should_stop))
        replays = draft_control.replay_all(rec, NAMES)
    except Exception as e:  # a readable line, never a traceback in the page
        yield status_html(runner.readable(e, policy.hosted), "error"), gr.skip(), gr.skip(), gr.skip(), None, \
            gr.Button(interactive=False)
        return
    yield (status_html(f"Replayed {len(replays) - 1} controllers on {len(rec.output)} tokens.", "done"),
           view.k_figure(replays), view.table_html(replays), "", (rec, replays), gr.Button(interactive=True))


def race(policy: Policy, models, session, made, should_stop):
    """(status, race table): the top two live, beside their replays."""
    s = getattr(session, "settings", None)
    if made is None or s is None:
        yield status_html("Replay the controllers first.", "info"), gr.skip()
        return
    rec, replays = made
    pairs = []
    try:
        for r in view.raced(replays):
            if should_stop():
                break
            yield status_html(f"Running {r.controller} live…", "running"), view.race_html(pairs)
            p = _prepared(policy, models, s, should_stop)
            ran = draft_control.live(p.target, p.drafter, p.ids, p.cfg, rec, r.controller, s.drafter,
                                     bounded(policy, should_stop))
            pairs.append((r, ran, draft_control.agrees(r, ran)))
    except Exception as e:
        yield status_html(runner.readable(e, policy.hosted), "error"), view.race_html(pairs)
        return
    yield status_html(f"Raced {len(pairs)} controllers live.", "done"), view.race_html(pairs)


def wire(c: Controls, page: Page) -> None:
    """Both buttons take their turn in the handlers' Line (model work, bounded as any run: one record
    and two runs of the run's own length), in the visitor's Session, which every Stop stops."""
    policy, handlers, session = page.policy, page.handlers, page.session

    def queued(session, body, width):
        def status(message, state, ahead=None):
            return (status_html(message, state), *([gr.skip()] * (width - 1)))
        yield from handlers.line.run(session, None, status, lambda: None, lambda _, should_stop: body(should_stop))

    def on_replay(session):
        yield from queued(session, lambda stop: replayed(policy, page.models, session, stop), 6)

    def on_race(session, made):
        yield from queued(session, lambda stop: race(policy, page.models, session, made, stop), 2)

    instant = dict(queue=False, api_visibility="private")
    common = dict(api_visibility="private", concurrency_limit=1, concurrency_id="controllers")
    c.replay.click(handlers.arm, session, session, **instant).then(
        on_replay, session, [c.status, c.plot, c.table, c.raced, c.made, c.race], **common)
    c.race.click(handlers.arm, session, session, **instant).then(
        on_race, [session, c.made], [c.status, c.raced], **common)
