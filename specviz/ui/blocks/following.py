"""Following one streamed request to a serving engine from a page handler; no Gradio here.

The client (serving/client.py) blocks until the stream closes and reports each chunk through
a callback, so it runs in a helper thread and the handler reads copies of the run from a
queue: the page updates while the server streams, and Stop or the time limit is noticed
even while the server sends nothing.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import replace
from typing import Callable, Generator

from ...serving.records import ServerRun
from ..live.limits import Deadline

_DONE = object()


class _Cut(BaseException):
    """Raised from the chunk callback to end a request the visitor stopped (or that ran past
    the time limit). A BaseException, so a client that turns its own failures (Exception)
    into `run.error` lets it through and closes the connection instead of calling it a failure."""


def follow(stream: Callable[..., ServerRun], url: str, prompt: str, deadline: Deadline, poll: float = 1.0,
           **options) -> Generator[ServerRun | None, None, tuple[ServerRun | None, bool]]:
    """Run stream(url, prompt, on_chunk=..., **options) in a helper thread.

    Yields a copy of the run after each chunk, and None after `poll` seconds without one (so
    the handler can yield, and Gradio can end a gone visitor's run). Returns (the run, cut):
    the client's final record, or the last copy when the request was cut short. An exception
    the client raised (a bad URL) is raised here."""
    updates: queue.SimpleQueue = queue.SimpleQueue()
    box: dict = {}

    def on_chunk(run: ServerRun) -> None:
        # "gone": the handler stopped following (a silent server, or a visitor who left); the
        # session's stop flag is reset once the handler ends, so it cannot tell this thread.
        if box.get("gone") or deadline():
            box["cut"] = True
            raise _Cut()
        # A copy made here, on the client's thread between two chunks, is consistent;
        # reading the client's own record from the handler's thread would race its appends.
        updates.put(replace(run, chunks=list(run.chunks)))

    def work() -> None:
        try:
            box["run"] = stream(url, prompt, on_chunk=on_chunk, **options)
        except _Cut:
            pass
        except BaseException as e:  # handed to the handler's thread, which reports it
            box["error"] = e
        finally:
            updates.put(_DONE)

    deadline.start()
    threading.Thread(target=work, daemon=True, name="specviz-server-request").start()
    last = None
    try:
        while True:
            try:
                item = updates.get(timeout=poll)
            except queue.Empty:
                if deadline():
                    # A silent server: stop waiting now; the thread ends at the next chunk or
                    # at the client's own timeout, and its result is dropped.
                    return last, True
                yield None
                continue
            if item is _DONE:
                break
            last = item
            yield last
    finally:
        box["gone"] = True  # also when Gradio closes the handler of a visitor who left
    if "error" in box:
        raise box["error"]
    return box.get("run") or last, box.get("cut", False)
