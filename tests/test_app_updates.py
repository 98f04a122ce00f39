"""How often the page is redrawn during a run, and what a slow model load shows meanwhile."""
from __future__ import annotations

import threading
import types

import pytest

from specviz.errors import SpecvizError
from specviz.render import Trace
from specviz.ui import runner


def test_a_silent_load_phase_counts_its_seconds(monkeypatch):
    """Converting the embedded model is silent for up to a minute: the status must not freeze."""
    monkeypatch.setattr(runner, "HEARTBEAT", 1)
    done = threading.Event()

    def load(name, progress=None, **kwargs):
        progress("converting", 0.7)
        done.wait(60)  # until the page has shown a count
        raise SpecvizError("the test is only about the status meanwhile")

    frame = runner.Frame(base=Trace("baseline", speculative=False), runs=[Trace("spec")])
    messages = []
    with pytest.raises(SpecvizError):
        for f in runner.loading(types.SimpleNamespace(load=load), "m", "target", frame, lambda: False):
            messages.append(f.message)
            if f.message.endswith("s)"):
                done.set()
    assert "target m: converting" in messages
    assert "target m: converting (1 s)" in messages
