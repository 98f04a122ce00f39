"""Export and replay in the page: "Download trace" after a run, and a saved trace played back
in the Playground's own panels, charts and inspector with no model loaded: as a race at
the speed the two runs really went (scaled), or step by step.

The replay fills the same Frame a live run fills (live/runner.py), so every picture is drawn
by the code that draws a live run. The file is parsed by trace_file.load (JSON only,
size-capped by the policy, every field checked), and everything shown from it is escaped
by the renderers like any model text.
"""
from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import gradio as gr

from ...core.errors import SpecvizError
from ...core.events import StepEvent
from ...render.status import bdi, isolated, status_html, step_label
from ...run import replay as playback
from ...traces.trace_file import Recording, RunInfo, describe_device, load, save, too_large
from . import stepping, uploads
from ..page import Page, accordion, named, said
from ..policy import Policy
from ..live.runner import Frame, throttle
from ..views import error_frame, playground_values

log = logging.getLogger(__name__)
UPDATE_EVERY = 0.3  # seconds between page updates during a race, as during a live run
KEEP = 32  # trace files kept for download; older ones are deleted (Gradio serves its own copy)
SPEEDS = (0.1, 10.0)  # the speed slider's range: x true speed


class Replay:
    """One visitor's loaded trace and how far it has been played. Plain attributes: gr.State."""

    def __init__(self, recording: Recording, name: str, from_file: bool = False):
        self.recording, self.name = recording, name
        self.from_file = from_file  # an uploaded trace (maybe another machine's), not this session's run
        self.position = 0  # speculative steps shown
        self.playing = False
        self.stop = False  # Pause was pressed during a race


@dataclass(frozen=True)
class Stepper:
    """The buttons that animate the panels, in one row right above them: off until a run or
    a loaded trace gives them something to play."""
    live: gr.Button
    previous: gr.Button
    next: gr.Button
    phases: gr.Button
    play: gr.Button
    pause: gr.Button
    speed: gr.Slider

    @property
    def buttons(self) -> list[gr.Button]:
        return [self.live, self.previous, self.next, self.phases, self.play, self.pause]


def stepper() -> Stepper:
    """The row of step and race buttons; layout puts it just above the panels it animates."""
    off = dict(size="sm", min_width=60, interactive=False)
    with gr.Row(elem_classes="sv-stepper", elem_id="sv-stepper", equal_height=True):
        live = gr.Button("Step through this run", elem_id="sv-step-live", **off)
        previous = gr.Button("◀ Previous step", elem_id="sv-replay-previous", **off)
        next_ = gr.Button("Next step ▶", elem_id="sv-replay-next", variant="primary", **off)
        phases = gr.Button("Next step in phases ▶", elem_id="sv-step-phases", **off)
        play = gr.Button("Play race", elem_id="sv-replay-play", **off)
        pause = gr.Button("Pause", elem_id="sv-replay-pause", **off)
        # No reset button: it was a third Tab stop between Generate and the step inspector, beside the
        # number box and the track that set the same value (a menu would be one stop, but Gradio's
        # dropdown stays open after a Tab passes through it, over the panels)
        speed = gr.Slider(*SPEEDS, value=1.0, step=0.1, label="speed (1 = real)", elem_id="sv-replay-speed",
                          min_width=210, buttons=[])
    return Stepper(live, previous, next_, phases, play, pause, speed)


@dataclass(frozen=True)
class Controls:
    download: gr.DownloadButton
    upload: gr.File
    about: gr.HTML
    stepper: Stepper


def controls(steps: Stepper, policy: Policy) -> Controls:
    """The Export-and-replay block, placed under the Playground's results; `steps`, the row
    above the panels that plays what is loaded here. A file over the policy's limit is refused
    in the browser, before it is sent (uploads.py), in the status and under the file box."""
    with accordion("Export and replay (download this run as a trace, or load one)", "sv-replay-box",
                   "Save a run as a trace file, or load one to replay it here with no model: the buttons "
                   "above the panels play it as a race at the speed it ran, or one step at a time."):
        with gr.Row():
            download = gr.DownloadButton("Download trace", visible=False, elem_id="sv-download", scale=1)
            # No file_types: Gradio refuses another kind with a bare "Error" that stays in the
            # box; open_trace says what a trace is and empties the box instead.
            upload = gr.File(label="Replay a trace (.json)", type="filepath",
                             elem_id="sv-replay-file", scale=3, height=120)
        about = gr.HTML(elem_id="sv-replay-about")
        said("reading", READING)
        uploads.guard("#sv-replay-file", policy.max_trace_bytes, too_large, ("#sv-status", "#sv-replay-about"))
    return Controls(download, upload, about, steps)


def wire(c: Controls, page: Page) -> None:
    """Connect the block: the download follows each playground run; the replay fills the
    Playground's outputs and the session the step inspector reads, and a loaded trace puts its
    prompt in the prompt box, so the page shows what was asked. The step buttons are off while
    a run goes and on once there is a run or a trace. The events that put a replayed run on
    screen join page.on_screen, for blocks that follow it."""
    state = gr.State(None)
    shown = page.shown(replay=state)
    outputs = list(shown.values())
    instant = dict(queue=False, api_visibility="private")
    s = c.stepper
    page.run.click(lambda: [None] + [gr.Button(interactive=False)] * len(s.buttons), None, [state, *s.buttons],
                   **instant)
    page.generate.then(offer_download, page.session, c.download, **instant).then(
        ready, [state, page.session], s.buttons, **instant)
    opening = page.shown(replay=state, about=c.about, prompt=page.prompt, upload=c.upload)
    # Said at once (a big file takes seconds to check), and registered before the reading itself, which
    # Gradio then answers after it: registered after, the sentence overwrote the loaded trace's status.
    c.upload.upload(None, js="svReading", **instant)
    opened = c.upload.upload(named(lambda path, s: open_trace(path, s, page.policy), opening),
                             [c.upload, page.session], list(opening.values()), **instant)
    opened.then(ready, [state, page.session], s.buttons, **instant)
    # A race mostly sleeps between events, so a few may run beside the models' line.
    raced = s.play.click(named(race, shown), [state, page.session, s.speed], outputs, api_visibility="private",
                         concurrency_limit=4, concurrency_id="replay")
    s.pause.click(pause, state, state, **instant)
    back = s.previous.click(named(lambda r, s: step(r, s, -1), shown), [state, page.session], outputs, **instant)
    on = s.next.click(named(lambda r, s: step(r, s, +1), shown), [state, page.session], outputs, **instant)
    live = s.live.click(named(step_through, shown), page.session, outputs, **instant)
    phased = s.phases.click(named(play_phases, shown), [state, page.session, s.speed], outputs,
                            api_visibility="private", concurrency_limit=4, concurrency_id="replay")
    page.on_screen += [opened, raced, back, on, live, phased]


def ready(r, session) -> list:
    """The step buttons on when there is something to play: a loaded trace, or the last run."""
    run = recording(session) is not None
    return [gr.Button(interactive=run)] + [gr.Button(interactive=run or r is not None)] * 5


# Download ------------------------------------------------------------------------------------

_folder: list[Path] = []


def recording(session) -> Recording | None:
    """The last playground run as a Recording (None when there is no finished-enough run)."""
    frame, settings = session.run, session.settings
    if frame is None or settings is None or not frame.spec.events or frame.state in ("error", "waiting"):
        return None
    config = asdict(settings.config())
    end = frame.spec.end
    if end is not None and end.stats.stop_reason == "eos" and end.token_ids:
        config["eos_token_ids"] = [end.token_ids[-1]]  # the token that ended it: the run's EOS
    info = RunInfo(target=settings.target, drafter=settings.drafter, prompt=settings.prompt,
                   greedy=settings.greedy, config=config, source="app", device=describe_device())
    return Recording(info, frame.spec, frame.base, frame.curve)


def offer_download(session):
    """The last playground run as a trace file for the Download button (hidden when none)."""
    rec = recording(session)
    if rec is None:
        return gr.DownloadButton(visible=False)
    path = _new_file()
    save(path, rec)
    return gr.DownloadButton(value=str(path), visible=True)


def _new_file() -> Path:
    """A fresh path in this process's trace folder; the oldest traces beyond KEEP go."""
    if not _folder:
        _folder.append(Path(tempfile.mkdtemp(prefix="specviz-traces-")))
    old = sorted(_folder[0].iterdir(), key=lambda p: p.stat().st_mtime)
    for p in old[: max(0, len(old) - KEEP + 1)]:
        shutil.rmtree(p, ignore_errors=True)
    return Path(tempfile.mkdtemp(dir=_folder[0])) / f"specviz-trace-{time.strftime('%Y%m%d-%H%M%S')}.json"


# Replay ---------------------------------------------------------------------------------------

def _frame(r: Replay, spec, base, state: str, message: str, fraction: float | None = None) -> Frame:
    info = r.recording.info
    return Frame(base=base, runs=[spec], message=message, state=state, fraction=fraction, greedy=info.greedy,
                 final=state != "running", target=info.target, steps=playback.step_count(r.recording),
                 curve=r.recording.curve,  # the recording machine's costs, when the file has them
                 recorded_on=(info.device or "unknown") if r.from_file and r.recording.curve else None)


def _values(frame: Frame, session, r: Replay | None) -> dict:
    """The playground's values for `frame`, the session and the replay by name; a trace that passed the checks but still cannot be
    drawn says so in the status line instead of breaking the page."""
    try:
        values = playground_values(frame, session.pinned, session.charts)
    except Exception as e:  # the renderers met something the loader's checks did not foresee
        log.exception("could not draw a replayed trace", exc_info=e)
        frame = error_frame(f"this trace could not be drawn ({type(e).__name__}): is the file damaged?")
        values = playground_values(frame, charts=session.charts, resend=True)
    # The step inspector reads the shown frame; the live run (session.run) stays, so Download
    # trace and Step through this run still work after a replay.
    session.last = frame
    return {**values, "session": session, "replay": r}


def _about(r: Replay) -> str:
    """What was loaded, in the status sentence: every name from the file isolated (render.status.isolated)."""
    info = r.recording.info
    where = f" on {isolated(info.device)}" if info.device else ""
    mode = "greedy" if info.greedy else "sampling"
    return f"{isolated(r.name)}: {isolated(info.target)}, drafter {isolated(info.drafter)}, {mode}, recorded{where}"


def _setting(name: str, value) -> str:
    """A recorded setting in words ("dynamic k off", not the field's "dynamic_k False")."""
    if name == "dynamic_k":
        return f"dynamic k {'on' if value else 'off'}"
    if name == "max_new_tokens":
        return f"at most {bdi(str(value))} new tokens"
    return f"{name} {bdi(str(value))}"


def card(r: Replay) -> str:
    """What the loaded trace is, for the block: file, models, settings, machine, date."""
    info = r.recording.info
    settings = ", ".join(_setting(k, v) for k, v in info.config.items() if k in ("k", "dynamic_k", "max_new_tokens"))
    sampling = info.config.get("sampling")
    if not info.greedy and isinstance(sampling, dict):
        settings += ", " + ", ".join(f"{bdi(str(k).replace('_', '-'))} {bdi(str(v))}" for k, v in sampling.items())
    lines = [f"<b>{bdi(r.name)}</b>: target {bdi(info.target)}, drafter {bdi(info.drafter)}",
             f"{'greedy' if info.greedy else 'sampling'}{', ' + settings if settings else ''}",
             f"recorded {bdi(info.created or '(no date)')}" + (f" on {bdi(info.device)}" if info.device else "")
             + ": the speeds shown are that machine's"]
    return f'<div class="sv-replay-about">{"<br>".join(lines)}</div>'


# The status while an uploaded trace is read and checked: it said "Ready" for the 23 s a 23 MB file took.
READING = "Reading the trace file: every step is checked before anything is drawn…"


def open_trace(path, session, policy: Policy):
    """Load an uploaded trace and show it before its first step: values for the playground's
    outputs, the session, the replay state, the trace's card (`about`), the prompt box and the
    file box (`upload`, emptied after a refusal, so the next file can go straight in)."""
    try:
        if not path:
            raise SpecvizError("Choose a trace file to replay.")
        if Path(path).suffix.lower() != ".json":
            raise SpecvizError(f"{Path(path).name} is not a trace: a trace is the .json file that "
                               "'Download trace' saves")
        r = Replay(load(path, max_bytes=policy.max_trace_bytes, max_steps=policy.max_new_tokens), Path(path).name,
                   from_file=True)
    except SpecvizError as e:  # said in the status and under the file box, where the reader is
        return {**_values(error_frame(str(e)), session, None), "about": status_html(str(e), "error"),
                "prompt": gr.skip(), "upload": None}
    spec, base = playback.fresh(r.recording)
    n = playback.step_count(r.recording)
    session.pinned = None
    message = f"{_about(r)}. {n} steps: Play race, or Next step to go one at a time."
    return {**_values(_frame(r, spec, base, "done", message), session, r), "about": card(r),
            "prompt": r.recording.info.prompt, "upload": gr.skip()}


def _playing(r: Replay | None, session) -> Replay | None:
    """What the step buttons play: the loaded trace, else the last run from its start."""
    if r is None and (rec := recording(session)) is not None:
        r = Replay(rec, "this run")
    return r


def step(r: Replay | None, session, delta: int):
    """One speculative step forward or back (the baseline keeps pace, as in a live run); the
    inspector follows to the step just shown."""
    r = _playing(r, session)
    if r is None:
        return _values(error_frame("Generate a run or load a trace first."), session, None)
    n = playback.step_count(r.recording)
    r.position = min(max(r.position + delta, 0), n)
    session.pinned = None
    spec, base = playback.after_steps(r.recording, r.position)
    if r.position:
        e = spec.steps[-1]
        by = f" by {e.source}" if e.source else ""
        message = (f"{step_label(r.position - 1, n)}: {len(e.draft)} drafted{by}, {e.accepted} kept, "
                   f"then the target's {e.token_kind} token")
    else:
        message = f"Before step 1 of {n}: Next step to begin."
    return _values(_frame(r, spec, base, "done" if r.position == n else "stopped", message), session, r)


def step_through(session):
    """Step-through mode for the run just made: its recorded events, replayed from the start."""
    rec = recording(session)
    if rec is None:
        return _values(error_frame("Generate a run first, then step through it."), session, None)
    r = Replay(rec, "this run")
    spec, base = playback.fresh(rec)
    n = playback.step_count(rec)
    session.pinned = None
    return _values(_frame(r, spec, base, "stopped", f"Stepping through this run: {n} steps. Next step, or "
                                                    "Next step in phases."), session, r)


def play_phases(r: Replay | None, session, speed, sleep=time.sleep):
    r = _playing(r, session)
    if r is None:
        yield _values(error_frame("Generate a run or load a trace first."), session, None)
        return
    session.pinned = None
    yield from stepping.play(r, session, speed, _values, _frame, sleep)


def pause(r: Replay | None):
    if r is not None and r.playing:
        r.stop = True
    return r


def race(r: Replay | None, session, speed, clock=time.monotonic, sleep=time.sleep):
    """Both runs from the start, each event at its engine time divided by `speed`; the page
    updates at a live run's pace (runner.throttle)."""
    r = _playing(r, session)
    if r is None:
        yield _values(error_frame("Generate a run or load a trace first."), session, None)
        return
    session.pinned = None
    try:
        speed = float(speed)
    except (TypeError, ValueError):
        speed = math.nan
    if not SPEEDS[0] <= speed <= SPEEDS[1]:
        yield _values(error_frame(f"speed must be from {SPEEDS[0]:g} to {SPEEDS[1]:g}, got {speed}"), session, r)
        return
    for frame in throttle(_racing(r, speed, clock, sleep), UPDATE_EVERY, clock=clock):
        yield _values(frame, session, r)


def _racing(r: Replay, speed: float, clock, sleep) -> Iterator[Frame]:
    """The race's frame after every event, then the finished (or paused) one."""
    timed = playback.race(r.recording)
    total = timed[-1][0] if timed else 0.0
    spec, base = playback.fresh(r.recording)
    frame = _frame(r, spec, base, "running", f"Replaying at {speed:g}x", 0.0)
    r.playing, r.stop, r.position = True, False, 0
    start = clock()
    try:
        for t, item in timed:
            if r.stop:
                break
            sleep(max(0.0, start + t / speed - clock()))
            playback.add(spec, base, item)
            r.position += isinstance(item[1], StepEvent)
            frame.message = f"Replaying at {speed:g}x: engine second {t:.2f} of {total:.2f}"
            frame.fraction = t / total if total else None
            yield frame
    finally:
        r.playing = False
    paused = r.stop
    frame.state, frame.fraction, frame.final = ("stopped" if paused else "done"), None, True
    frame.message = (f"Paused at step {r.position}: Next or Previous step from here, or Play race again." if paused
                     else f"Replay finished: {_about(r)}. Previous step to go back through it.")
    yield frame
