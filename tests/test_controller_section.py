"""The page's draft-length controllers section and degeneracy meter, as data and HTML (no browser)."""
from __future__ import annotations

from specviz.engine.draft_replay import HINDSIGHT, replay
from specviz.render import controllers as view
from specviz.render.degeneracy import meter_html
from specviz.render.trace import Labels, Trace
from specviz.run.draft_control import replay_all
from test_controllers import constructed
from test_render import step

HALF = constructed(60, lambda i: 4 if i % 10 < 5 else 0)  # copies of four, then nothing, over and over


def test_the_section_lists_every_controller_fastest_first_then_the_hindsight_best_as_the_ceiling():
    replays = replay_all(HALF, ["specviz", "fixed:1", "fixed:16"])
    rows = view.rows(replays)
    assert [r["controller"] for r in rows][-1] == HINDSIGHT and rows[-1]["of_best"] == 1.0
    speeds = [r["predicted_tokens_per_s"] for r in rows[:-1]]
    assert speeds == sorted(speeds, reverse=True) and all(r["of_best"] <= 1.0 + 1e-9 for r in rows)
    assert rows[0]["tokens_per_pass"] == replays[0].tokens_per_pass
    assert [r.controller for r in view.raced(replays)] == [rows[0]["controller"], rows[1]["controller"]]


def test_the_step_chart_draws_k_over_the_run_per_controller():
    replays = replay_all(HALF, ["fixed:4"])
    fig = view.k_figure(replays)
    assert [t.name for t in fig.data] == ["fixed:4", HINDSIGHT]
    assert all(t.line.shape == "hv" for t in fig.data)
    assert list(fig.data[0].x) == list(replay(HALF, "fixed:4").positions)
    assert "gap" in view.table_html(replays) and "+" not in view.table_html(replays).split("fixed:4")[1][:80]


def test_the_meter_warns_when_a_looping_text_is_accepted_well():
    trace = Trace("speculative")
    for _ in range(6):  # " and" drafted and kept, over and over
        trace.add(step(_, (7, 7, 7), 3, 7), Labels(draft=(" and",) * 3, token=" and"))
    html = meter_html(trace)
    assert 'data-warns="true"' in html and "24× &#x27; and&#x27;" in html and "not a success" in html
    assert 'data-warns="false"' in meter_html(_plain())


def _plain() -> Trace:
    trace = Trace("speculative")
    for i in range(12):
        trace.add(step(i, (100 + i,), 1, 200 + i), Labels(draft=(f"a{i}",), token=f"b{i}"))
    return trace


def test_a_race_stopped_early_says_so_instead_of_a_no_under_same_drafts():
    from specviz.run.draft_control import Live

    r = replay(HALF, "fixed:4")
    whole = Live(r.controller, (), r.drafted, r.tokens, r.passes, 1.0)
    cut = Live(r.controller, (), r.drafted[:3], 9, 3, 0.1, stopped=True)
    assert ">yes<" in view.race_html([(r, whole, True)])
    html = view.race_html([(r, cut, False)])
    assert f"stopped after 9 of {r.tokens} tokens" in html and ">no<" not in html


def test_the_step_charts_legend_starts_below_its_x_axis_title():
    fig = view.k_figure(replay_all(HALF, ["specviz", "fixed:1", "fixed:16"]))
    plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert -fig.layout.legend.y * plot_px > 50  # tick labels and the title take ~40 px below the axis
    assert fig.layout.margin.b > 100  # and the legend's rows have room under it
