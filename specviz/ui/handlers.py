"""The page's event handlers: plain (generator) functions over a visitor's Session.

Each visitor has one Session in gr.State: the stop flag the engine polls between steps
and the last results (the step inspector reads them). Models live in the loading module's
shared cache, never here.
"""
from __future__ import annotations

import functools
import os

from ..errors import SpecvizError
from ..render import step_html
from . import runner
from .settings import NO_DRAFTER, Policy, Settings
from .views import compare_values, error_frame, playground_values

UPDATE_EVERY = 0.3  # seconds between page updates during a run (the final state always shows)


class Session:
    """One visitor's state. Plain attributes only: gr.State deep-copies it per visitor."""

    def __init__(self):
        self.busy = False  # a run is queued or going
        self.stop = False  # Stop was pressed during that run
        self.last = None  # the last playground Frame

    def should_stop(self) -> bool:
        return self.stop


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

    def arm(self, session: Session) -> Session:
        """Runs at the click, before the queue: a Stop from now on belongs to this run."""
        session.busy, session.stop = True, False
        return session

    def stop(self, session: Session) -> Session:
        if session.busy:
            session.stop = True
        return session

    def generate(self, session: Session, **controls):
        """Stream the speculative run and the baseline side by side (API: /generate)."""
        yield from self._stream(session, controls, runner.playground, playground_values, remember=True)

    def compare(self, session: Session, drafters, **controls):
        """Run the baseline, then each drafter in `drafters`, one after another (API: /compare)."""
        if isinstance(drafters, str):  # a script may pass "a, b" instead of a list
            drafters = drafters.split(",")
        run = functools.partial(runner.compare, drafters=list(drafters or []))
        yield from self._stream(session, {**controls, "drafter": NO_DRAFTER}, run, compare_values, remember=False)

    def _stream(self, session: Session, controls: dict, run, values, remember: bool):
        session.busy = True
        try:
            try:
                settings = Settings.from_controls(**controls)
            except SpecvizError as e:
                yield [*values(error_frame(str(e))), session]
                return
            for frame in runner.throttle(run(settings, policy=self.policy, models=self.models,
                                             should_stop=session.should_stop), UPDATE_EVERY):
                if remember:
                    session.last = frame
                yield [*values(frame), session]
        finally:
            session.busy = session.stop = False

    def inspect(self, session: Session, step):
        if session.last is None:
            return step_html(error_frame("").spec, 0)
        return step_html(session.last.spec, step)
