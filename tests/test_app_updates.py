"""How often the page is redrawn during a run, and what a slow model load shows meanwhile."""
from __future__ import annotations

import threading
import types

import pytest

from specviz.core.errors import SpecvizError
from specviz.render import Trace
from specviz.run.prepare import Step
from specviz.ui.live import runner


def test_a_silent_load_phase_counts_its_seconds(monkeypatch):
    """Converting the embedded model is silent for up to a minute: the status must not freeze."""
    monkeypatch.setattr(runner, "HEARTBEAT", 1)
    done = threading.Event()

    def load(progress):
        progress("converting", 0.7)
        done.wait(60)  # until the page has shown a count
        raise SpecvizError("the test is only about the status meanwhile")

    frame = runner.Frame(base=Trace("baseline", speculative=False), runs=[Trace("spec")])
    messages = []
    with pytest.raises(SpecvizError):
        for f in runner.loading(Step("target m", load, load=True), frame, lambda: False):
            messages.append(f.message)
            if f.message.endswith("s)"):
                done.set()
    assert "target m: converting" in messages
    assert "target m: converting (1 s)" in messages


def test_the_app_loads_a_draft_model_where_the_target_is_and_a_stopped_load_is_not_none():
    """The CLI loads a draft model on the target's device in its precision: the app did so on the default ones,
    and a load Stop cut short came back as None, which is drafter 'none' (plain steps under the drafter's name)."""
    import torch

    from specviz.engine.generate import GenerationConfig
    from specviz.run.arms import parse_arm
    from specviz.run.race import Race

    asked, stop = [], threading.Event()

    def load(name, progress=None, cache_bytes=None, **placed):
        asked.append(placed)
        stop.wait(60)  # until Stop is pressed
        raise SpecvizError("only the arguments and the stop matter here")

    frame = runner.Frame(base=Trace("baseline", speculative=False), runs=[Trace("spec")])
    target = types.SimpleNamespace(device=torch.device("cpu"), dtype=torch.bfloat16)
    target.eos_token_ids = ()
    race = Race(types.SimpleNamespace(load=load), target, [1], {0: parse_arm("some/draft-model", GenerationConfig())})
    made = runner.stepping(race.prepare(), frame, lambda: bool(asked) and (stop.set() or True))
    with pytest.raises(runner.Stopped):
        for _ in made:
            pass
    assert asked == [{"device": "cpu", "dtype": "bfloat16"}]


class Clock:
    """Fake time: the engine's steps and the page's drawing each move it on."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(clock: Clock, steps: int, step_time: float, state="running"):
    """A run's frames: loading, then one per engine step, then the final one."""
    yield runner.Frame(base=Trace("baseline", speculative=False), runs=[Trace("spec")], state="loading")
    frame = runner.Frame(base=Trace("baseline", speculative=False), runs=[Trace("spec")], state=state)
    for _ in range(steps):
        clock.now += step_time
        yield frame
    clock.now += step_time
    frame.state, frame.final = "done", True
    yield frame


def passed(clock: Clock, frames, draw_text: float, draw_charts: float, **pacing):
    """(time, charts?) of each frame the throttle passes on; drawing takes the given time."""
    out = []
    for f in runner.throttle(frames, clock=clock, timer=clock, **pacing):
        out.append((clock.now, f.charts))
        clock.now += draw_charts if f.charts else draw_text
    return out


def test_text_updates_often_and_charts_every_few_seconds():
    clock = Clock()
    seen = passed(clock, run(clock, steps=200, step_time=0.05), draw_text=0.01, draw_charts=0.05,
                  every=0.3, charts_every=2.0)
    text = [t for t, _ in seen]
    charts = [t for t, c in seen if c]
    assert max(b - a for a, b in zip(text, text[1:])) < 0.5  # the text streams
    assert seen[0][1] and seen[1][1] and seen[-1][1]  # loading, the first running frame and the end: all drawn
    between = charts[1:-1]  # while running
    assert all(b - a >= 2.0 for a, b in zip(between, between[1:])) and len(between) >= 3
    assert len(charts) < len(text) / 4


def test_charts_that_are_dear_to_draw_are_drawn_less_often():
    """Drawing them takes 0.5 s: at duty 0.1 they wait 5 s, so drawing stays near a tenth of the run."""
    clock = Clock()
    seen = passed(clock, run(clock, steps=600, step_time=0.05), draw_text=0.01, draw_charts=0.5,
                  every=0.3, charts_every=2.0, duty=0.1)
    charts = [t for t, c in seen if c][1:-1]
    assert all(b - a >= 5.0 for a, b in zip(charts, charts[1:])) and len(charts) >= 3
    drawing = sum(0.5 if c else 0.01 for _, c in seen)
    assert drawing / clock.now < 0.2


def test_a_frame_without_charts_leaves_them_on_the_page():
    import gradio as gr

    from specviz.ui.views import compare_values, playground_values

    frame = runner.Frame(base=Trace("baseline", speculative=False), runs=[Trace("spec")], state="running")
    frame.charts = False
    values = playground_values(frame)
    left = ["acceptance", "throughput", "lengths", "positions", "step", "inspector"]
    assert [name for name, v in values.items() if v == gr.skip()] == left
    assert "sv-status" in values["status"] and isinstance(values["summary"], dict)  # these still update
    assert [name for name, v in compare_values(frame).items() if v == gr.skip()] == ["speed", "quality"]
    frame.charts = True
    assert all(v != gr.skip() for v in playground_values(frame).values())


def test_a_chart_that_would_draw_the_same_is_not_sent_again():
    """Next redrew all four charts each step, most of its time in plotly: a chart whose data did not
    move (a step that drafted nothing changes only the throughput) is left on the page, and what is
    left there is what would have been drawn; a run's last update carries every chart (the API's)."""
    import gradio as gr
    from test_render import step

    from specviz.render import Labels, playground_figures
    from specviz.ui.views import CHARTS, playground_values

    spec, base = Trace("prompt lookup", k=4), Trace("baseline", speculative=False)
    frame = runner.Frame(base=base, runs=[spec], state="running")
    on_page, shown = {}, {}

    def sent(**kwargs) -> list[str]:
        values = playground_values(frame, charts=on_page, **kwargs)
        drawn = [name for name in CHARTS if values[name] != gr.skip()]
        shown.update({name: values[name].to_json() for name in drawn})
        now = dict(zip(CHARTS, playground_figures(spec, base)))
        assert all(shown[name] == now[name].to_json() for name in CHARTS)  # the page shows what would be drawn
        return drawn

    assert sent() == list(CHARTS)  # the first frame: every chart
    assert sent() == []  # nothing new
    spec.add(step(0, [1, 2], 1, 3), Labels(draft=("a", "b"), token="c"))
    assert sent() == list(CHARTS)
    spec.add(step(1, [], 0, 5), Labels(token="d"))  # no draft: the tokens/s moved, nothing else
    assert sent() == ["throughput"]
    assert sent(resend=True) == list(CHARTS)
    on_page.clear()  # another page (a reload): a Session of its own
    assert sent() == list(CHARTS)


def test_the_views_fill_the_outputs_the_layout_names_and_a_slip_fails_loudly():
    """The page's outputs go by name: views.py's names must be layout.py's (a new output
    forgotten in one of them fails here), and a handler wired to outputs it does not fill, or
    filling one it is not wired to, raises instead of leaving a block blank."""
    import gradio as gr

    from specviz.ui import layout
    from specviz.ui.blocks import serving
    from specviz.ui.page import named
    from specviz.ui.policy import Policy
    from specviz.ui.views import compare_values, error_frame, playground_values

    frame = error_frame("x")
    with gr.Blocks():
        _, _, _, playground, *_ = layout._playground_tab(Policy())
        *_, compare = layout._compare_tab(Policy())
        server = serving.controls(Policy(), runs=None)
    assert list(playground_values(frame)) == list(playground)  # /generate returns them in this order
    assert list(compare_values(frame)) == list(compare)
    assert list(serving.values("x", "done")) == list(server.outputs)
    shown = named(lambda: playground_values(frame), playground)()
    assert shown[playground["status"]] == playground_values(frame)["status"]
    for slip in ({**playground_values(frame), "extra": 1}, {k: v for k, v in playground_values(frame).items()
                                                            if k != "summary"}):
        with pytest.raises(ValueError, match="must agree"):
            named(lambda: slip, playground)()
        with pytest.raises(ValueError, match="must agree"):
            next(named(lambda: (yield slip), playground)())
