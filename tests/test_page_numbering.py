"""Issue 39, items 1, 2 and 4 below the browser: one step numbering (from 1, "of N") in the
inspector, step-through and replay; the inspector staying where a reader put it; the step
buttons off until there is something to play; table and card numbers that fit their boxes."""
from __future__ import annotations

import re

import pytest
from app_server import PROMPT, app_models  # noqa: F401 (app_models is a fixture)
from test_trace_file import sampled  # noqa: F401 (sampled is a fixture)

from specviz.render import distribution as dist
from specviz.render.compare import table_values
from specviz.render.inspect import step_html
from specviz.render.numbers import Headline, headline_html
from specviz.render.status import step_label
from specviz.ui import Policy, Settings
from specviz.ui.handlers import Handlers, Session
from specviz.ui.blocks.replay import play_phases, race, ready, step, step_through
from specviz.ui.live.runner import Frame
from specviz.ui.views import playground_values

STEP = re.compile(r"Step (\d+) of (\d+)")


def after_run(rec) -> Session:
    session = Session()
    session.last = session.run = Frame(base=rec.base, runs=[rec.spec], state="done", greedy=False, final=True)
    session.settings = Settings(prompt=PROMPT, target="tiny", drafter="d", temperature=0.9)
    return session


def test_the_label_counts_steps_from_one_and_says_how_many_there_are():
    assert step_label(0, 59) == "Step 1 of 59" and step_label(58, 59) == "Step 59 of 59"


def test_the_inspector_numbers_the_last_of_n_steps_n_of_n(sampled):  # noqa: F811
    rec, _ = sampled
    n = len(rec.spec.steps)
    assert STEP.search(step_html(rec.spec, n - 1)).groups() == (str(n), str(n))  # was "Step n-1 of n-1"
    assert STEP.search(step_html(rec.spec, 0)).groups() == ("1", str(n))


def test_replay_step_through_and_inspector_name_the_same_step_alike(sampled):  # noqa: F811
    rec, _ = sampled
    n = len(rec.spec.steps)
    session = after_run(rec)
    r = step_through(session)["replay"]
    values = step(r, session, +1)  # the first step shown
    assert STEP.search(values["status"]).groups() == ("1", str(n))
    assert STEP.search(values["inspector"]).groups() == ("1", str(n))  # was "Step 0 of 0"
    values = step(r, session, +1)
    assert STEP.search(values["status"]).group(0) == STEP.search(values["inspector"]).group(0) == f"Step 2 of {n}"
    assert values["step"].value == 2 and values["step"].minimum == 1  # the slider counts from 1 too
    # played in phases, the next step is step 3 from its first phase to its last
    played = list(play_phases(r, session, 10.0, sleep=lambda s: None))
    messages = [v["status"] for v in played]
    assert {STEP.search(m).group(0) for m in messages} == {f"Step 3 of {n}"}
    # from the verify on, the inspector shows the step being played (it lagged at "Step 2" in phases 2 and 3)
    assert {STEP.search(str(v["inspector"])).group(0) for v in played[1:]} == {f"Step 3 of {n}"}
    assert all(v["step"].value == 3 for v in played[1:])
    assert not any(re.search(r"\d/\d (\w+): \1:", m) for m in messages), messages  # was "4/4 bonus: bonus:"
    values = step(r, session, -3)  # back before the first step: no "Step 0"
    assert "Step 0" not in values["status"] and "Before step 1" in values["status"]
    for values in race(r, session, 10.0, clock=lambda: 0.0, sleep=lambda s: None):
        assert "Step 0" not in values["status"] + str(values["inspector"])


def test_next_step_plays_the_last_run_when_no_trace_is_loaded(sampled):  # noqa: F811
    rec, _ = sampled
    session = after_run(rec)
    values = step(None, session, +1)
    r = values["replay"]
    assert r is not None and r.position == 1 and STEP.search(values["status"]).group(1) == "1"
    values = step(None, Session(), +1)
    assert values["replay"] is None and 'data-state="error"' in values["status"]


def test_the_step_buttons_are_on_only_when_there_is_something_to_play(sampled):  # noqa: F811
    rec, _ = sampled
    assert [b.interactive for b in ready(None, Session())] == [False] * 6
    assert [b.interactive for b in ready(None, after_run(rec))] == [True] * 6
    r = step(None, after_run(rec), +1)["replay"]
    # a loaded trace with no run of the visitor's own: everything but "Step through this run"
    assert [b.interactive for b in ready(r, Session())] == [False] + [True] * 5


def test_the_inspector_stays_on_the_step_the_reader_chose_while_the_run_goes_on(sampled):  # noqa: F811
    rec, _ = sampled
    n = len(rec.spec.steps)
    session = after_run(rec)
    handlers = Handlers(Policy(), models=None)
    assert STEP.search(handlers.inspect(session, 2)).group(0) == f"Step 2 of {n}"
    assert session.pinned == 1
    values = playground_values(session.last, session.pinned)  # the run's next update
    assert STEP.search(values["inspector"]).group(0) == f"Step 2 of {n}"
    assert values["step"].value == 2  # the slider stays there too
    handlers.inspect(session, n)  # back to the newest step: follow again
    assert session.pinned is None
    values = playground_values(session.last, session.pinned)
    assert values["step"].value >= n - 1 and STEP.search(values["inspector"]).group(1) != "2"
    handlers.inspect(session, 2)
    assert handlers.arm(session).pinned is None  # a new run follows from its start


def test_compare_cells_have_one_number_of_decimals_per_column_and_the_range_apart():
    rows = [dict(run="baseline", tokens_per_s=20.0, speedup=1.0, speedup_min=None, speedup_max=None, rounds=0,
                 alpha=None, tau=1.0, target_calls=24, tokens=24, stop="max_new_tokens"),
            dict(run="d", tokens_per_s=21.43, speedup=1.0712, speedup_min=1.0071, speedup_max=1.1, rounds=3,
                 alpha=0.4, tau=3.0, target_calls=8, tokens=24, stop="max_new_tokens"),
            dict(run="e", tokens_per_s=None, speedup=None, speedup_min=None, speedup_max=None, rounds=0,
                 alpha=0.426, tau=1.7123, target_calls=2, tokens=3, stop="running")]
    base, d, e = table_values(rows)
    assert d[1:6] == ["21.4", "1.07×", "1.01–1.10", "0.40", "3.00"]
    assert base[1:6] == ["20.0", "1.00×", "—", "—", "1.00"]
    assert e[1:6] == ["—", "measuring…", "—", "0.43", "1.71"]


def test_a_word_in_a_headline_card_is_marked_to_be_set_smaller():
    h = Headline(spec_tps=10.0, base_tps=9.0, speedup=None, alpha=0.5, tau=2.0, k=4.0, c=None, predicted=None,
                 calls_saved=3, base_calls=6, timing="measuring")
    out = headline_html(h)
    assert re.search(r'data-metric="speedup"[^>]*><div class="sv-card-value sv-card-word">measuring…', out)
    assert re.search(r'data-metric="alpha"[^>]*><div class="sv-card-value">0.50', out)


def test_the_distribution_arrow_points_at_the_drafted_bar_and_the_empty_chart_says_why(sampled):  # noqa: F811
    rec, _ = sampled
    # the first drafting step whose drafted token is among the bars drawn (the top few of p and q)
    pos, fig = next((pos, fig) for i, e in enumerate(rec.spec.steps) if e.draft
                    for pos in [dist.position(rec.spec, i, 0, 1.0, 1.0)] for fig in [dist.figure(pos)]
                    if any(a.text == "drafted" for a in fig.layout.annotations))
    e = pos.step
    arrow = next(a for a in fig.layout.annotations if a.text == "drafted")
    assert arrow.y == pytest.approx(max(pos.p.get(e.draft[0], 0), pos.q.get(e.draft[0], 0)))  # the bar's top
    assert arrow.ay < 0 and fig.layout.yaxis.range[1] > 1.1  # above it, inside the plot (not on the legend)
    assert fig.layout.legend.y < 0  # the legend under the bars
    assert f"Step {e.step + 1}," in fig.layout.title.text
    empty = dist.figure(None)
    assert empty.layout.xaxis.range == (0, 1) and "pick a step" in empty.layout.annotations[0].text.replace("<br>", " ")


def test_charts_count_steps_from_one(sampled):  # noqa: F811
    from specviz.render.charts import acceptance_figure

    rec, _ = sampled
    first = next(e for e in rec.spec.steps if e.draft)
    assert acceptance_figure(rec.spec).data[0].x[0] == first.step + 1

