"""How long runs wait and how long they may take: the Line of runs and a run's Deadline.

Gradio's queue could serialise runs too, but it cannot tell a visitor "busy, 3 ahead of
you", refuse one visitor's second run, or show a script its place in its own results. So
every run request enters its handler at once and waits here, in arrival order, and the
policy says how many may run, wait, or belong to one visitor. No Gradio here.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from ...core.errors import SpecvizError

WAIT_POLL = 1.0  # seconds between a waiting run's updates (and checks for Stop)


class Busy(SpecvizError):
    """The line is full, or this visitor already has a run in it."""


class Line:
    """Runs in arrival order: the first `slots` run, up to `waiting` more wait for a turn."""

    def __init__(self, slots: int = 1, waiting: int | None = None, per_visitor: int | None = None):
        self.slots, self.waiting, self.per_visitor = slots, waiting, per_visitor
        self._tickets: list[tuple[object, str | None]] = []  # (ticket, visitor), in arrival order
        self._changed = threading.Condition()

    def join(self, visitor: str | None = None) -> object:
        """A ticket for one run; raises Busy when the line is full or `visitor` has enough in it."""
        with self._changed:
            n = len(self._tickets)
            mine = sum(v == visitor for _, v in self._tickets) if visitor is not None else 0
            if self.per_visitor is not None and mine >= self.per_visitor:
                raise Busy("you already have a run going or waiting here: wait for it to finish, or press Stop")
            if self.waiting is not None and n >= self.slots + self.waiting:
                raise Busy(f"the app is busy: {n} runs ahead of you, and no room to wait. Try again in a minute")
            ticket = object()
            self._tickets.append((ticket, visitor))
            return ticket

    def ahead(self, ticket: object) -> int:
        """Runs ahead of this one (running or waiting); 0 once it may run."""
        with self._changed:
            return self._ahead(ticket)

    def _ahead(self, ticket: object) -> int:
        i = next(i for i, (t, _) in enumerate(self._tickets) if t is ticket)
        return 0 if i < self.slots else i

    def wait(self, ticket: object, timeout: float) -> int:
        """Block until the line moves or `timeout` seconds pass; the runs still ahead."""
        with self._changed:
            ahead = self._ahead(ticket)
            if ahead:
                self._changed.wait_for(lambda: self._ahead(ticket) != ahead, timeout)
            return self._ahead(ticket)

    def leave(self, ticket: object) -> None:
        with self._changed:
            self._tickets = [(t, v) for t, v in self._tickets if t is not ticket]
            self._changed.notify_all()

    def turn(self, visitor: str | None = None) -> "Turn":
        """A place in the line for one run (raises Busy, as join does)."""
        return Turn(self, self.join(visitor))

    def run(self, session, request, status: Callable, prepare: Callable, body: Callable):
        """One visitor's run through the line, as a generator of updates. Begins a run of `session`
        (its stop check: session.begin()), checks the request (`prepare()`: a SpecvizError, Busy
        included, becomes one status update), waits for a turn (status updates; the visitor's Stop
        ends the wait), then yields from body(what prepare returned, the stop check). The run ends
        in the session however it ends."""
        should_stop = session.begin()
        try:
            try:
                prepared = prepare()
                turn = self.turn(getattr(request, "session_hash", None))
            except SpecvizError as e:
                yield status(str(e), "busy" if isinstance(e, Busy) else "error")
                return
            with turn:
                if (yield from turn.wait(status, should_stop=should_stop)):
                    yield from body(prepared, should_stop)
        finally:
            session.end()

    def __len__(self) -> int:
        return len(self._tickets)


class Turn:
    """One run's place in a Line. `with turn:` leaves the line however the run ends: done,
    an error, or Gradio closing the generator of a visitor who has gone."""

    def __init__(self, line: Line, ticket: object):
        self.line, self.ticket = line, ticket

    def __enter__(self) -> "Turn":
        return self

    def __exit__(self, *exc) -> None:
        self.line.leave(self.ticket)

    def wait(self, status: Callable, poll: float = WAIT_POLL, should_stop: Callable[[], bool] | None = None):
        """Yield status(message, "waiting", ahead=n) until this run's turn, then return True;
        or, if should_stop() comes first, yield status(message, "stopped") and return False.

        Yields at least every `poll` seconds (Gradio can end a gone visitor's run only at a
        yield), the same update again while the place in the line holds.
        """
        ahead, shown = self.line.ahead(self.ticket), None
        while ahead:
            if should_stop is not None and should_stop():
                yield status("Stopped before the run started.", "stopped")
                return False
            if shown is None or shown[0] != ahead:
                message = f"Waiting for a turn: {ahead} run{'s' if ahead > 1 else ''} ahead of you."
                shown = ahead, status(message, "waiting", ahead=ahead)
            yield shown[1]
            ahead = self.line.wait(self.ticket, poll)
        return True


class Deadline:
    """The engine's stop check: the visitor's Stop, or the policy's time limit once started."""

    def __init__(self, should_stop: Callable[[], bool], seconds: float | None):
        self.should_stop, self.seconds, self.end = should_stop, seconds, None

    def start(self) -> None:
        """The clock runs from here: loading models does not count against a run."""
        if self.seconds is not None:
            self.end = time.monotonic() + self.seconds

    @property
    def passed(self) -> bool:
        return self.end is not None and time.monotonic() >= self.end

    def __call__(self) -> bool:
        return self.should_stop() or self.passed
