"""Export and replay in the app: the handlers below the page, then a real browser (headless
Chromium, as test_app_browser.py) where a run's "Download trace" gives a file that loads
back and an uploaded trace fills the Playground's panels, charts and inspector in an app
that cannot load any model. Screenshots go to test-output/ (look at them)."""
from __future__ import annotations

import json

import dataclasses
import html
import re
from types import SimpleNamespace

import pytest
from app_server import PROMPT, app_models, app_policy, serve_app  # noqa: F401 (app_models is a fixture)
from test_app_browser import HANG, OUT, browser, generated  # noqa: F401 (browser is a fixture)
from test_trace_file import record, sampled  # noqa: F401 (sampled is a fixture)

from specviz.core.events import RunEnd, StepEvent
from specviz.render.html import WINDOW
from specviz.render.kinds import shown_tokens
from specviz.render.trace import Trace
from specviz.traces import trace_file
from specviz.ui import Policy, Settings, hosted_policy
from specviz.ui.handlers import Session
from specviz.ui.layout import launch_options
from specviz.ui.blocks.replay import Replay, offer_download, open_trace, pause, play_phases, race, step, step_through
from specviz.ui.live.runner import Frame


class Clock:
    """A fake clock that only sleeping moves: a race's schedule without its waiting."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_a_right_to_left_override_in_a_trace_reverses_only_its_own_text(sampled, tmp_path):  # noqa: F811
    """A trace's drafter field holding U+202E (right-to-left override) reversed the rest of the app's
    status sentence, a spoofing vector: every name from the file is isolated (U+2068 ... U+2069 in the
    status's text, <bdi> in the card's HTML) and escaped."""
    rec, _ = sampled
    spoof = "\u202e<i>lld.exe</i>"
    info = dataclasses.replace(rec.info, drafter=spoof, device="cpu\u202e")
    path = tmp_path / "spoof.json"
    trace_file.save(path, dataclasses.replace(rec, info=info))
    values = open_trace(str(path), Session(), Policy())
    text = html.unescape(re.search(r'<span class="sv-status-text">(.*?)</span>', values["status"]).group(1))
    assert f"drafter \u2068{spoof}\u2069, sampling, recorded on \u2068cpu\u202e\u2069" in text
    assert "<i>" not in values["status"] and f"drafter <bdi>{html.escape(spoof)}</bdi>" in values["about"]


def test_the_app_replays_a_trace_as_a_race_and_step_by_step(sampled, tmp_path):  # noqa: F811
    rec, _ = sampled
    path = tmp_path / "app.json"
    trace_file.save(path, rec)
    session = Session()
    values = open_trace(str(path), session, Policy())
    r, card, prompt = values["replay"], values["about"], values["prompt"]
    assert "app.json" in values["status"] and "Play race" in values["status"] and "No tokens yet" in values["spec"]
    assert prompt == PROMPT and "sampling, k 4" in re.sub("</?bdi>", "", card)  # the page says what was run

    clock = Clock()
    frames = list(race(r, session, 2.0, clock=clock, sleep=clock.sleep))
    values = frames[-1]
    total = max(rec.spec.end.stats.elapsed, rec.base.end.stats.elapsed)
    assert clock.now == pytest.approx(total / 2)  # the slower run's engine time, at twice its speed
    assert 'data-state="done"' in values["status"]
    assert values["spec"].count('data-kind="accepted"') == sum(e.accepted for e in rec.spec.steps)
    assert values["base"].count('data-kind="baseline"') == len(rec.base.events)
    assert session.last.spec.events == rec.spec.events  # the step inspector reads the replay

    values = step(r, session, -1)  # back from the end: one step before the last
    assert f"Step {len(rec.spec.steps) - 1} of {len(rec.spec.steps)}" in values["status"]
    r.position = 0
    values = step(r, session, +1)
    first = rec.spec.steps[0]
    assert f"{len(first.draft)} drafted, {first.accepted} kept" in values["status"]
    assert values["spec"].count('data-kind="rejected"') == len(first.draft) - first.accepted


def test_pause_stops_a_race_where_it_is(sampled, tmp_path):  # noqa: F811
    path = tmp_path / "pause.json"
    trace_file.save(path, sampled[0])
    session = Session()
    r = open_trace(str(path), session, Policy())["replay"]
    clock = Clock()
    frames = race(r, session, 1.0, clock=clock, sleep=clock.sleep)
    next(frames)  # the race has started
    pause(r)
    values = list(frames)[-1]
    assert 'data-state="stopped"' in values["status"] and f"Paused at step {r.position}" in values["status"]
    shown = len(session.last.spec.events) + len(session.last.base.events)
    assert 0 < shown < len(sampled[0].spec.events) + len(sampled[0].base.events) and not r.playing


def test_hosted_app_refuses_a_trace_over_its_limit_and_shows_bad_files_as_one_line(sampled, tmp_path):  # noqa: F811
    big = tmp_path / "big.json"
    big.write_text(" " * 9_000_000 + trace_file.dumps(sampled[0]))
    values = open_trace(str(big), Session(), hosted_policy(memory=16 << 30))
    r, card = values["replay"], values["about"]
    # one size unit on the page, in the docs and in the limits: "8 MB" (it said 8.4 MB for 8 MiB)
    assert r is None and 'data-state="error"' in values["status"]
    assert re.search(r"big.json is 9\.\d MB: this app replays trace files of up to 8 MB<", values["status"])
    assert "up to 8 MB" in card  # under the file box too, where the reader dropped it
    assert launch_options()["max_file_size"] >= 8_000_000  # Gradio's own limit, a backstop behind the app's
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "specviz-trace", "version": 1, "info": {"target": "<script>x()</script>"}}')
    values = open_trace(str(bad), Session(), hosted_policy(memory=16 << 30))
    assert "has no &#x27;drafter&#x27;" in values["status"] and "<script>" not in values["status"]


def tiled(run: Trace, events: int) -> Trace:
    """`run`'s events repeated to `events` of them, renumbered and re-timed, with an end that adds up."""
    out, ids, t, position = Trace(run.label, speculative=run.speculative, k=run.k), [], 0.0, 0
    for i in range(events):
        e, labels = run.events[i % len(run.events)], run.labels[i % len(run.labels)]
        if isinstance(e, StepEvent):
            t += e.draft_time + e.verify_time
            e = dataclasses.replace(e, step=i, position=position, elapsed=t)
            position += len(e.emitted)
        else:
            t += e.time
            e = dataclasses.replace(e, step=i, elapsed=t)
        out.add(e, labels)
        ids.extend(e.emitted if isinstance(e, StepEvent) else (e.token,))
    stats = dataclasses.replace(out.stats(), stop_reason="max_new_tokens", prefill_time=0.0)
    out.add(RunEnd(tuple(ids), stats))
    return out


def test_a_long_run_part_shown_costs_a_frame_the_same_as_a_short_one(sampled):  # noqa: F811
    """Next, Previous and Play redrew every token of the run each frame: at 1,024 steps that was 2.2 MB of
    HTML a frame, every 0.3 s of a race. A run part-shown draws its last WINDOW tokens one by one and the text
    before them plain; the panels stay one listbox with one Tab stop; a run shown to its end is drawn whole."""
    rec, _ = sampled
    spec = tiled(rec.spec, 1024)
    long = dataclasses.replace(rec, spec=spec, base=tiled(rec.base, len(spec.token_ids)))
    session, r = Session(), Replay(long, "long.json")
    sizes = {}
    for r.position in (300, 1000):
        values = step(r, session, +1)
        text = len(session.last.spec.text().encode()) + len(session.last.base.text().encode())
        sizes[r.position] = len(values["spec"].encode()) + len(values["base"].encode()) - text  # beyond the text
        for which in ("spec", "base"):
            panel = values[which]
            assert panel.count('tabindex="0"') == 1 and panel.count('role="listbox"') == 1
            body = re.sub(r'<span class="sv-earlier-note">.*?</span>|<span class="tok tok-rejected.*?</span>', "",
                          panel.split("</header>")[1], flags=re.S)
            drawn = html.unescape(re.sub(r"<[^>]+>", "", body))
            shown = getattr(session.last, which)
            assert drawn == shown.text()  # the text before the window is there, as plain text
    assert "Steps 1–" in values["spec"] and "Tokens 1–" in values["base"]
    assert values["spec"].count('class="tok ') <= WINDOW + 2 * rec.spec.k  # a few steps past the window at most
    assert sizes[1001] < 1.1 * sizes[301] < 400_000  # the same at step 1,001 as at step 301 (2.2 MB in all drawn whole)
    r.position = len(spec.steps) - 1
    values = step(r, session, +1)  # the run shown to its end: drawn whole
    assert "sv-earlier" not in values["spec"] and values["spec"].count('data-kind="accepted"') == sum(
        e.accepted for e in spec.steps)


def test_a_long_compare_race_costs_a_frame_the_same_as_a_short_one(sampled):  # noqa: F811
    """Compare's side-by-side panels drew every token of every run each frame: three runs and the baseline
    at 1,024 steps were 6.4 MB of HTML a frame. While the race goes each panel draws its last WINDOW tokens,
    as the Playground's do; its last frame draws every token, once."""
    from specviz.ui.live.compare import CompareFrame
    from specviz.ui.views import compare_values

    rec, _ = sampled
    sizes = {}
    for steps in (300, 1000):
        runs = [tiled(rec.spec, steps) for _ in range(3)]
        frame = CompareFrame(base=tiled(rec.base, len(runs[0].token_ids)), runs=runs, state="running")
        panels = compare_values(frame)["panels"]
        text = sum(len(t.text().encode()) for t in [frame.base, *runs])
        sizes[steps] = len(panels.encode()) - text  # beyond the text
        assert panels.count('role="listbox"') == 4 and panels.count('tabindex="0"') == 4  # one Tab stop a run
        assert panels.count("Steps 1–") == 3 and panels.count("Tokens 1–") == 1
        assert panels.count('class="tok ') <= 4 * (WINDOW + 2 * rec.spec.k)
    assert sizes[1000] < 1.1 * sizes[300] < 600_000
    frame.final = True  # the race's last frame: every token, coloured
    panels = compare_values(frame)["panels"]
    assert "sv-earlier" not in panels and panels.count('data-kind="accepted"') == 3 * sum(
        e.accepted for e in runs[0].steps)


def test_a_file_that_is_not_json_gets_a_sentence_and_the_file_box_is_emptied(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    values = open_trace(str(notes), Session(), Policy())
    r, box = values["replay"], values["upload"]
    assert r is None and "notes.txt is not a trace" in values["status"] and ".json" in values["status"]
    assert box is None  # emptied, ready for the right file


def test_download_after_a_run_saves_what_the_page_shows(sampled):  # noqa: F811
    rec, _ = sampled
    session = Session()
    assert offer_download(session).visible is False  # nothing has run yet
    session.last = session.run = Frame(base=rec.base, runs=[rec.spec], state="done", greedy=False, final=True)
    session.settings = Settings(prompt=PROMPT, target="tiny", drafter="d", temperature=0.9)
    button = offer_download(session)
    back = trace_file.load(button.value["path"])
    assert back.spec.events == rec.spec.events and back.base.events == rec.base.events
    assert (back.info.target, back.info.drafter, back.info.greedy, back.info.source) == ("tiny", "d", False, "app")


def test_stepping_through_a_run_keeps_it_for_download_and_another_step_through(sampled):  # noqa: F811
    rec, _ = sampled
    session = Session()
    session.last = session.run = Frame(base=rec.base, runs=[rec.spec], state="done", greedy=False, final=True)
    session.settings = Settings(prompt=PROMPT, target="tiny", drafter="d", temperature=0.9)
    values = step_through(session)
    r = values["replay"]
    list(play_phases(r, session, 10.0, sleep=lambda s: None))  # a step played: the page shows the replay
    assert len(session.last.spec.steps) == 1  # the step inspector reads what is shown
    back = trace_file.load(offer_download(session).value["path"])  # the run itself, not the replay
    assert back.spec.events == rec.spec.events and back.info.drafter == "d"
    values = step_through(session)
    again = values["replay"]
    assert again is not None and "Stepping through this run" in values["status"]


def test_next_step_in_phases_draws_drafts_pending_then_checked_then_judged(sampled):  # noqa: F811
    rec, _ = sampled
    session = Session()
    session.last = session.run = Frame(base=rec.base, runs=[rec.spec], state="done", greedy=False, final=True)
    session.settings = Settings(prompt=PROMPT, target="tiny", drafter="d", temperature=0.9)
    r = step_through(session)["replay"]
    first = next(e for e in rec.spec.steps if e.draft)
    r.position = rec.spec.steps.index(first)
    panels = [values["spec"] for values in play_phases(r, session, 10.0, sleep=lambda s: None)]
    k, shown = len(first.draft), shown_tokens(first)
    assert [p.count('data-kind="drafted"') for p in panels] == [k, 0, 0, 0]
    assert [p.count('data-kind="checking"') for p in panels] == [0, k, 0, 0]
    judged = [kind for kind, _ in shown if kind in ("accepted", "rejected")]
    assert [p.count(f'data-step="{first.step}"') for p in panels] == [k, k, len(judged), len(shown)]
    assert f'data-kind="{first.token_kind}" data-step="{first.step}"' in panels[3]
    assert f'data-kind="{first.token_kind}" data-step="{first.step}"' not in panels[2]


def test_an_uploaded_trace_is_re_timed_with_the_costs_of_the_machine_that_recorded_it(sampled, tmp_path):  # noqa: F811
    """A run recorded on a GPU, replayed on this CPU: the hardware block draws the file's flat
    curve and says whose it is, not this machine's; this session's own run says 'measured'."""
    from dataclasses import replace

    from specviz.ui.blocks import hardware
    from test_trace_file import H200

    rec, _ = sampled
    path = tmp_path / "h200.json"
    trace_file.save(path, replace(rec, curve=H200, info=replace(rec.info, device="cuda: NVIDIA H200")))
    session = Session()
    r = open_trace(str(path), session, Policy())["replay"]
    step(r, session, +3)
    figure, caption, line, _ = hardware.show(session, hardware.THIS, 0.1, 0.05)
    assert 'data-curve="recorded"' in caption and "the machine that recorded this run (cuda: NVIDIA H200)" in caption
    assert [t.name for t in figure.data][2] == "measured on cuda: NVIDIA H200"
    assert list(figure.data[2].y) == pytest.approx(list(H200.relative))  # the file's curve, not one measured here
    assert "the machine that recorded this run's verify curve" in line

    session = Session()  # a run made here, stepped through: its curve is this machine's
    session.last = session.run = Frame(base=rec.base, runs=[rec.spec], state="done", greedy=False, final=True,
                                       curve=H200)
    session.settings = Settings(prompt=PROMPT, target="tiny", drafter="d", temperature=0.9)
    r = step_through(session)["replay"]
    step(r, session, +3)
    assert 'data-curve="measured"' in hardware.show(session, hardware.THIS, 0.1, 0.05)[1]


# ---- in a browser ----------------------------------------------------------------------------

def no_models():
    def load(*args, **kwargs):
        raise AssertionError("a replay loaded a model")
    return SimpleNamespace(load=load)


@pytest.mark.slow  # a real browser
def test_an_uploaded_trace_replays_as_a_race_and_by_steps_with_no_model(browser, app_models, tmp_path):  # noqa: F811
    rec, _ = record(app_models, temperature=0.0, tokens=40)
    path = tmp_path / "lesson.json"
    trace_file.save(path, rec)
    n = len(rec.spec.steps)
    with serve_app(app_policy(app_models), models=no_models()) as url:
        OUT.mkdir(exist_ok=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.locator("#sv-replay-box").get_by_text("Export and replay").click()  # opens the accordion
        # Over Gradio's upload limit too: Gradio's red "Error" showed in the box, the status still "Ready".
        # The page refuses it itself, before sending it (a sparse file: no 40 MB written).
        huge = tmp_path / "huge.json"
        with open(huge, "wb") as f:
            f.truncate(40_000_000)
        page.locator("#sv-replay-file input[type=file]").set_input_files(str(huge))
        page.wait_for_selector('#sv-status:has-text("huge.json is 40 MB: this app replays trace files of up to 32 MB")',
                               timeout=HANG)
        assert "up to 32 MB" in page.locator("#sv-replay-about").inner_text()  # under the box too
        assert "Error" not in page.locator("#sv-replay-file").inner_text()
        notes = tmp_path / "notes.txt"
        notes.write_text("not a trace")
        page.locator("#sv-replay-file input[type=file]").set_input_files(str(notes))
        page.wait_for_selector('#sv-status:has-text("notes.txt is not a trace")', timeout=HANG)
        assert "Error" not in page.locator("#sv-replay-file").inner_text()  # not stuck: ready for a .json
        # Issue 66: a step number repeated loaded and replayed; it is refused in one sentence
        doc = json.loads(path.read_text())
        doc["runs"][0]["events"][1]["step"] = 0
        twice = tmp_path / "twice.json"
        twice.write_text(json.dumps(doc))
        page.locator("#sv-replay-file input[type=file]").set_input_files(str(twice))
        page.wait_for_selector('#sv-status:has-text("speculative event 2 is damaged: its step number is 0 where it '
                               'is the run\'s event 2")', timeout=HANG)
        page.screenshot(path=str(OUT / "replay-refused-steps.png"))
        page.locator("#sv-replay-file input[type=file]").set_input_files(str(path))
        page.wait_for_selector('#sv-status:has-text("Play race")', timeout=HANG)
        assert page.locator("#sv-prompt textarea").input_value() == PROMPT  # what was asked, shown
        assert "tiny-draft" in page.locator("#sv-replay-about").inner_text()
        page.locator("#sv-replay-speed input[type=number]").fill("4")
        page.locator("#sv-replay-play").click()
        page.wait_for_selector('#sv-status [data-state="done"]:has-text("Replay finished")', timeout=HANG)
        spec = page.locator("#sv-spec")
        for kind in ("accepted", "rejected", "corrected"):
            assert spec.locator(f'[data-kind="{kind}"]').count() > 0, kind
        assert page.locator('#sv-base [data-kind="baseline"]').count() == len(rec.base.events)
        assert "identical to baseline" in page.locator("#sv-check").inner_text()
        assert page.locator("#sv-chart-throughput .js-plotly-plot .main-svg").count() > 0

        page.locator("#sv-replay-previous").click()
        page.wait_for_selector(f'#sv-status:has-text("Step {n - 1} of {n}")', timeout=HANG)
        assert "drafted" in page.locator("#sv-inspector").inner_text()  # the inspector reads the replay
        page.screenshot(path=str(OUT / "replay.png"), full_page=True)
        page.close()


@pytest.mark.slow  # a real browser
def test_download_trace_after_a_run_gives_a_file_that_replays(browser, app_models, tmp_path):  # noqa: F811
    with serve_app(app_policy(app_models, max_new_tokens=16)) as url:
        page = generated(browser, url)
        page.locator("#sv-replay-box").get_by_text("Export and replay").click()  # opens the accordion
        button = page.locator("#sv-download")
        button.wait_for(state="visible", timeout=HANG)
        with page.expect_download(timeout=HANG) as download:
            button.click()
        saved = tmp_path / "downloaded.json"
        download.value.save_as(saved)
        rec = trace_file.load(saved)
        assert rec.info.source == "app" and rec.info.prompt == PROMPT and len(rec.spec.token_ids) == 16
        assert rec.spec.steps[0].p_top and rec.base.events[0].top  # the distributions came along
        page.close()
