"""The page's event handlers: plain (generator) functions over a visitor's Session.

Each visitor has one Session in gr.State: the stop flag the engine polls between steps
and the last results (the step inspector reads them). Models live in the loading module's
shared cache, never here. The one thing all visitors share is the Line their runs wait in.
"""
from __future__ import annotations

import functools
import os
from typing import Callable

import gradio as gr

from ..drafters.suffix_memory import DEFAULT_TOKENS, SuffixMemory
from ..render import step_html
from ..run.spec import NONE
from .live import runner
from .live.compare import compare_drafters
from .live.limits import Line
from .policy import Policy
from .live.runner import Frame
from ..run.settings import Settings
from .views import compare_values, error_frame, playground_values

UPDATE_EVERY = 0.3  # seconds between page updates during a run (the final state always shows)
# What the status says from the press of Stop to the run's end (the page's script says it at the
# press, svStopping in assets/specviz.js; each update says it again, where the run's count would overwrite it).
STOPPING = "Stopping…"
EMPTY_DRAFTER = "The drafter box was empty, so this ran as plain decoding (drafter 'none')."


class Session:
    """One visitor's state. Plain attributes only: gr.State deep-copies it per visitor.

    Stop belongs to the runs going when it is pressed: each run counts the presses from the click
    that asked for it (`begin`), so one run's end cannot clear a Stop meant for another of the same
    visitor (a Generate waiting in the Line behind an exactness check), and a Stop pressed while
    nothing ran cannot stop the next run."""

    def __init__(self, memory_tokens: int = DEFAULT_TOKENS):
        self.stops = 0  # Stop presses so far
        self.armed = None  # the presses counted when a run button was clicked, until that run begins
        self.running = 0  # this visitor's runs in the Line (waiting or going)
        self.last = None  # the playground Frame on screen (a run's or a replay's): the step inspector reads it
        self.run = None  # the last playground run's Frame, kept while a replay is on screen
        self.settings = None  # what that run was asked for (a downloaded trace records it)
        # Suffix decoding's earlier answers, this visitor's alone: gr.State copies the Session per
        # visitor and drops it when the visitor leaves; capped by the policy's memory_tokens.
        self.memory = SuffixMemory(memory_tokens)
        # The inspector's step (from 0) the reader chose while it was not the newest; None: the
        # inspector follows each new step. Moving the slider to the last step, or a new run, resumes.
        self.pinned = None
        # An example picked during a run (ui/layout.py): its drafter is set once the run ends.
        self.picked = False
        # What the Playground's charts draw now (views.playground_values): an unchanged one is not sent again.
        self.charts = {}

    @property
    def busy(self) -> bool:
        """A run was asked for and has not ended (queued in Gradio, in the Line, or going)."""
        return self.armed is not None or self.running > 0

    def arm(self) -> None:
        """At a run button's click: a Stop from now on ends the run it asks for, even before it begins."""
        self.armed = self.stops

    def press_stop(self) -> None:
        self.stops += 1

    def begin(self) -> Callable[[], bool]:
        """A run begins: its stop check, true once Stop is pressed after its click (or, for a script's
        call with no click, after now). Pair with end()."""
        since = self.stops if self.armed is None else min(self.armed, self.stops)
        self.armed, self.running = None, self.running + 1
        return lambda: self.stops > since

    def end(self) -> None:
        self.running = max(0, self.running - 1)


def notice(message: str, state: str, ahead: int | None = None) -> Frame:
    """A frame that is only a status line: an error, a refusal, a place in the line."""
    frame = error_frame(message)
    frame.state, frame.ahead = state, ahead
    return frame


def zero_gpu() -> bool:
    """On a ZeroGPU Space the `spaces` package runs GPU functions in another process."""
    if not os.environ.get("SPACES_ZERO_GPU"):
        return False
    try:
        import spaces  # noqa: F401
    except ImportError:
        return False
    return True


def on_gpu(fn):
    """Apply `@spaces.GPU` when the `spaces` package is present (ZeroGPU Spaces); else do nothing."""
    try:
        import spaces
    except ImportError:
        return fn
    return spaces.GPU(duration=180)(fn)


class Handlers:
    def __init__(self, policy: Policy, models):
        self.policy, self.models = policy, models
        self.line = Line(policy.concurrency, policy.max_waiting, policy.runs_per_visitor)
        self._frames = on_gpu(self._frames)  # on ZeroGPU only the run holds a GPU, not the wait

    def arm(self, session: Session) -> Session:
        """Runs at the click, before the queue: a Stop from now on belongs to this run."""
        session.arm()
        session.pinned = None
        return session

    def stop(self, session: Session) -> Session:
        session.press_stop()
        return session

    def generate(self, session: Session, request: gr.Request = None, **controls):
        """Stream the speculative run and the baseline side by side (API: /generate)."""
        def values(frame):  # reads the pin at each update: the reader may move the slider mid-run
            # the run's last update carries every chart: it is what a script calling /generate reads
            return playground_values(frame, session.pinned, session.charts, resend=frame.final)
        run = functools.partial(runner.playground, memory=session.memory)
        yield from self._stream(session, request, controls, run, values, remember=True)

    def compare(self, session: Session, drafters, request: gr.Request = None, **controls):
        """The baseline and each drafter in `drafters`, warmed up, then taking turns for a few
        rounds (API: /compare)."""
        if not isinstance(drafters, (list, tuple)):  # a script may pass "a, b" instead of a list
            drafters = str(drafters or "").split(",")
        run = functools.partial(compare_drafters, drafters=[str(d) for d in drafters], memory=session.memory)
        yield from self._stream(session, request, {**controls, "drafter": NONE}, run, compare_values,
                                remember=False)

    def _stream(self, session: Session, request, controls: dict, run, values, remember: bool):
        def status(message, state, ahead=None):
            return {**values(notice(message, state, ahead)), "session": session}

        blank = "drafter" in controls and not str(controls["drafter"] or "").strip()

        def frames(settings: Settings, should_stop):
            if remember:
                session.settings = settings
            for frame in runner.throttle(self._frames(run, settings, should_stop), UPDATE_EVERY):
                if should_stop() and frame.state in ("loading", "running"):
                    frame.message = STOPPING
                if blank and frame.final and EMPTY_DRAFTER not in frame.message:  # it ran as 'none': say so
                    frame.message = f"{frame.message} {EMPTY_DRAFTER}"
                if remember:
                    session.last = session.run = frame
                yield {**values(frame), "session": session}

        yield from self.line.run(session, request, status, lambda: Settings.from_controls(**controls), frames)

    def _frames(self, run, settings: Settings, should_stop):
        yield from run(settings, policy=self.policy, models=self.models, should_stop=should_stop)

    def inspect(self, session: Session, step):
        """The step the reader chose on the slider (which counts from 1). An older step than the
        newest pins the inspector there while the run goes on; the newest lets it follow again."""
        frame = session.last
        if frame is None:
            return step_html(error_frame("").spec, 0)
        index, total = int(step or 1) - 1, len(frame.spec.steps)
        session.pinned = index if index < total - 1 else None
        return step_html(frame.spec, index, frame.steps)
