"""The Serving engine tab below the page: what a server run shows, what it may reach, how it fails.

Every request goes to a fake `stream_completion` that replays hand-made ServerRun records
through the real client's callback contract, so no server (and no client module) is needed.
"""
from __future__ import annotations

import json
import time
from html import unescape
import types

import pytest
from test_app_browser import browser  # noqa: F401 (a fixture: Chromium, for the one slow test)

from specviz.core.errors import SpecvizError
from specviz.serving.figures import aligned, groups_html, serving_figures
from specviz.serving.records import Chunk, ServerRun, SpecStats
from specviz.ui import Policy, build_app, hosted_policy, policy_from_env
from specviz.ui.handlers import Session
from specviz.ui.live.limits import Line
from specviz.ui.blocks.serving import ServingRuns

SPEC, PLAIN = "http://127.0.0.1:8000", "http://127.0.0.1:8001"
HOSTILE = "<img src=x onerror=alert(1)>"


TEXTS = ("The cat sat", " on", " the mat and", ".", " Then it", " slept.")
DRAFTS = ((3, 3), (1, 3), (3, 3), (0, 3), (3, 3), (2, 3))  # (kept, drafted): 18 tokens, alpha 12/18


def spec_run(texts=TEXTS, steps=DRAFTS, **fields):
    """A speculative run: one chunk per step, each holding its kept drafts plus the target's token."""
    chunks = [Chunk(t=0.1 * (i + 1), text=text, tokens=a + 1) for i, (text, (a, _)) in enumerate(zip(texts, steps))]
    spec = SpecStats(engine="vllm", drafted=sum(d for _, d in steps), accepted=sum(a for a, _ in steps),
                     steps=len(steps), k=3, per_step_accepted=tuple(a for a, _ in steps),
                     per_step_drafted=tuple(d for _, d in steps))
    return ServerRun(url=SPEC, model="smol", text="".join(texts), chunks=chunks, elapsed_s=0.65, spec=spec,
                     completion_tokens=sum(c.tokens for c in chunks), **fields)


def plain_run(n=20):
    chunks = [Chunk(t=0.05 * (i + 1), text=f" w{i}", tokens=1) for i in range(n)]
    return ServerRun(url=PLAIN, model="smol", text="".join(c.text for c in chunks), chunks=chunks,
                     elapsed_s=0.05 * n + 0.01, completion_tokens=n)


def fake_engines(runs: dict, calls: list | None = None, between=lambda i: None):
    """stream_completion's signature and contract: on_chunk(run so far) after each chunk, from
    the calling thread; a failed request comes back with .error set."""
    def stream_completion(url, prompt, *, model=None, max_tokens=128, temperature=0.0, seed=None, chat=True,
                          timeout_s=120.0, on_chunk=None):
        if calls is not None:
            calls.append(dict(url=url, prompt=prompt, model=model, max_tokens=max_tokens,
                              temperature=temperature, seed=seed, chat=chat, timeout_s=timeout_s))
        done = runs[url]
        if isinstance(done, Exception):
            raise done
        run = ServerRun(url=url, model=model or done.model)
        for i, c in enumerate(done.chunks):
            between(i)
            run.chunks.append(c)
            run.text += c.text
            on_chunk(run)
        run.spec, run.elapsed_s, run.error = done.spec, done.elapsed_s, done.error
        run.completion_tokens = done.completion_tokens
        return run

    return types.SimpleNamespace(stream_completion=stream_completion, read_result=_read_result,
                                 load_figure=lambda result: {"figure for": result["format"]})


def _read_result(path):
    data = json.loads(open(path, encoding="utf-8").read())
    if data.get("format") != "specviz-load":
        raise SpecvizError("not a specviz-load v1 result: its 'format' is missing")
    return data


def run_all(runs: ServingRuns, session=None, **overrides) -> list[dict]:
    values = dict(server=SPEC, baseline=PLAIN, model="", prompt="Say hi", mode="greedy", temperature=0.7,
                  seed=7, max_new_tokens=64, chat=True) | overrides
    return list(runs.run(session or Session(), None, **values))


def serving(policy=None, engines=None) -> ServingRuns:
    policy = policy or Policy()
    return ServingRuns(policy, Line(policy.concurrency, policy.max_waiting, policy.runs_per_visitor), engines)


# ---- the output, drawn as the groups the server sent ---------------------------------------

def test_each_chunk_is_a_step_box_with_its_kept_drafts_when_the_counts_line_up():
    run = spec_run()
    assert aligned(run)
    html = groups_html(run, "Speculative server", "")
    assert html.count('data-kind="step"') == 6
    assert 'data-tip="step 2: kept 1 of 3 drafts"' in html
    # No engine says which draft it rejected: no token carries a verdict's colour.
    assert not any(f"tok-{kind}" in html for kind in ("accepted", "rejected", "corrected", "bonus"))


def test_chunks_that_do_not_line_up_with_the_steps_are_boxes_without_counts():
    run = spec_run()
    run.chunks.insert(0, Chunk(t=0.05, text="Well,", tokens=1))  # a prefill chunk: no step entry
    html = groups_html(run, "Speculative server", "")
    assert not aligned(run) and html.count('data-kind="step"') == 7
    assert "kept" not in html.split("sv-step-note")[0] and "do not line up" in html


def test_hostile_model_text_is_escaped_everywhere_it_shows():
    run = spec_run(texts=(HOSTILE, *TEXTS[1:]))
    run.model = HOSTILE
    failed = ServerRun(url=SPEC, model="smol", error=f"HTTP 400: {HOSTILE}")
    shown = serving(engines=fake_engines({SPEC: run, PLAIN: failed}))
    *_, last = run_all(shown)
    page = "".join(last[name] for name in ("status", "headline", "spec", "base"))
    assert HOSTILE not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "failed: HTTP 400" in last["status"]


# ---- a whole run ---------------------------------------------------------------------------

def test_a_run_streams_the_speculative_server_then_the_plain_one_and_compares_them():
    calls = []
    updates = run_all(serving(engines=fake_engines({SPEC: spec_run(), PLAIN: plain_run()}, calls)), seed=7)
    assert [c["url"] for c in calls] == [SPEC, PLAIN]  # one after the other
    assert calls[0] | dict(url=None) == dict(url=None, prompt="Say hi", model=None, max_tokens=64,
                                             temperature=0.0, seed=7, chat=True, timeout_s=120.0)  # greedy
    last = updates[-1]
    summary = last["summary"]
    assert summary["state"] == "done" and 'data-state="done"' in last["status"]
    assert summary["speculative"]["spec"]["acceptance_rate"] == pytest.approx(12 / 18)
    assert summary["speedup"] == pytest.approx((18 / 0.65) / (20 / 1.01))
    assert 'data-metric="alpha"' in last["headline"] and "0.67" in last["headline"]
    steps, positions, speed = last["steps"], last["positions"], last["speed"]
    assert [t.type for t in steps.data] == ["bar", "scatter"] and list(steps.data[0].y) == [1, 1 / 3, 1, 0, 1, 2 / 3]
    assert [t.type for t in positions.data] == ["bar"] and list(positions.data[0].y) == [5 / 6, 4 / 6, 3 / 6]
    assert [t.name for t in speed.data] == ["speculative", "plain"]
    assert "line up" not in last["base"] and "one engine step" in last["base"]  # a plain server drafts nothing
    assert any(u["summary"]["state"] == "running" for u in updates[:-1])  # the page updated while it streamed


def test_a_server_without_per_step_counts_gets_totals_not_invented_steps():
    run = spec_run()
    run.spec = SpecStats(engine="sglang", drafted=18, accepted=12)
    steps, positions, _ = serving_figures(run, None)
    assert not steps.data and "totals only: α = 0.67" in steps.layout.annotations[0].text
    assert not positions.data
    assert "kept" not in groups_html(run, "s", "").split("sv-step-note")[0]


def test_a_failed_request_is_a_sentence_and_a_raising_client_too():
    failed = ServerRun(url=SPEC, model="smol", error="connection refused (is the server running?)")
    *_, last = run_all(serving(engines=fake_engines({SPEC: failed, PLAIN: plain_run()})))
    assert last["summary"]["state"] == "error"
    assert "The speculative server failed: connection refused" in last["status"]
    boom = fake_engines({SPEC: RuntimeError("/secret/path"), PLAIN: plain_run()})
    *_, hosted = run_all(serving(hosted_policy(server_url=SPEC), boom), baseline="")
    assert "unexpected error (RuntimeError)" in hosted["status"] and "/secret" not in hosted["status"]
    *_, local = run_all(serving(engines=boom), baseline="")
    assert "/secret/path" in local["status"]  # a local user may see their own paths


def test_stop_ends_the_request_at_the_next_chunk_and_keeps_what_arrived():
    session = Session()
    stopping = fake_engines({SPEC: spec_run(), PLAIN: plain_run()}, between=lambda i: i == 2 and session.press_stop())
    *_, last = run_all(serving(engines=stopping), session)
    assert last["summary"]["state"] == "stopped" and "Stopped after 6 tokens" in last["status"]
    assert last["spec"].count('data-kind="step"') == 2 and last["summary"]["baseline"] is None
    assert not session.busy


def test_each_server_gets_its_share_of_the_time_limit():
    slept = []  # only the speculative request stalls, once, after its first chunk

    def stall(i):
        if i == 1 and not slept:
            slept.append(time.sleep(0.3))

    slow = fake_engines({SPEC: spec_run(), PLAIN: plain_run(3)}, between=stall)
    *_, last = run_all(serving(Policy(max_run_seconds=0.4), slow))
    assert last["summary"]["state"] == "done"
    assert ("Done: 4 tokens at 40.0 tok/s; plain server 18.7 tok/s. The speculative request stopped at this "
            "app's time limit (0.2 s a request) after 4 tokens.") in unescape(last["status"])
    assert last["summary"]["baseline"]["tokens"] == 3


def test_runs_wait_in_the_line_and_stop_while_waiting():
    runs = serving(engines=fake_engines({SPEC: spec_run(), PLAIN: plain_run()}))
    other = runs.line.join("someone else")
    session = Session()
    updates = runs.run(session, None, server=SPEC, prompt="hi", mode="greedy", temperature=0.7, seed=0,
                       max_new_tokens=8, chat=True)
    first = next(updates)
    assert first["summary"]["state"] == "waiting" and first["summary"]["ahead"] == 1
    session.press_stop()
    assert next(updates)["summary"]["state"] == "stopped"
    assert list(updates) == []  # ended: its ticket is out of the line
    runs.line.leave(other)
    assert len(runs.line) == 0


def test_a_silent_server_is_left_at_stop_and_its_request_ends_at_its_next_chunk():
    import threading

    from specviz.ui.blocks.following import follow
    from specviz.ui.live.limits import Deadline

    stop, ended = threading.Event(), threading.Event()

    def stream_completion(url, prompt, on_chunk=None, **options):
        run = ServerRun(url=url, model="smol")
        try:
            for i in range(5):
                run.chunks.append(Chunk(t=0.1 * i, text=f" {i}", tokens=1))
                run.text += f" {i}"
                on_chunk(run)
                time.sleep(0.6)  # silent for a while between chunks
        except BaseException:
            ended.set()
            raise
        return run

    stream = follow(stream_completion, SPEC, "hi", Deadline(stop.is_set, None), poll=0.05)
    first = next(stream)
    while first is None:  # None: a poll with no news
        first = next(stream)
    assert first.text == " 0"
    stop.set()
    started = time.monotonic()
    with pytest.raises(StopIteration) as end:
        while True:
            next(stream)
    run, cut = end.value.value
    assert cut and len(run.chunks) == 1 and time.monotonic() - started < 1.0  # not waiting for the server (2.4 s)
    stop.clear()  # as the handler's Session does once it ends: the thread must not depend on it
    assert ended.wait(2.0)


# ---- what a visitor may reach ---------------------------------------------------------------

def test_a_hosted_app_sends_requests_only_to_its_operators_servers():
    calls = []
    hosted = serving(hosted_policy(server_url=SPEC, baseline_server_url=PLAIN),
                     fake_engines({SPEC: spec_run(), PLAIN: plain_run()}, calls))
    for url in ("http://169.254.169.254/latest/meta-data", "http://127.0.0.1:22", "file:///etc/passwd"):
        *_, last = run_all(hosted, server=url)
        assert "only sends requests to the serving engines its operator named" in last["status"]
        *_, last = run_all(hosted, baseline=url)
        assert "not to the plain server URL given" in last["status"]
    assert not calls
    assert run_all(hosted, server=SPEC + "/")[-1]["summary"]["state"] == "done"
    *_, last = run_all(serving(hosted_policy(), fake_engines({})))
    assert "no serving engine: its operator names one" in last["status"]
    *_, last = run_all(hosted, max_new_tokens=1000)
    assert "capped at 256" in last["status"]


def test_a_trusted_app_takes_any_http_url_and_nothing_else():
    p = Policy()
    assert p.check_server(" http://10.0.0.5:9000/ ") == "http://10.0.0.5:9000/"
    assert p.check_server("https://example.org") == "https://example.org"
    for bad in ("", "file:///etc/passwd", "ftp://x", "127.0.0.1:8000", "http://", "gopher://a:70/"):
        with pytest.raises(SpecvizError, match="URL"):
            p.check_server(bad)


def test_the_operator_names_servers_by_env_or_arguments_and_hosted_fields_are_locked(capsys):
    env = {"SPECVIZ_SERVER_URL": SPEC, "SPECVIZ_BASELINE_SERVER_URL": PLAIN}
    assert policy_from_env(env).server_url == SPEC and policy_from_env(env | {"SPECVIZ_HOSTED": "1"}).hosted
    import app

    demo = app.demo_for(app.parse_args(["--host", "0.0.0.0", "--server", SPEC, "--baseline-server", PLAIN]))
    props = {c["props"].get("elem_id"): c["props"] for c in demo.config["components"]}
    assert props["sv-server-url"]["value"] == SPEC and props["sv-baseline-url"]["value"] == PLAIN
    assert props["sv-server-url"]["interactive"] is False and props["sv-baseline-url"]["interactive"] is False
    queued = {f.api_name: f for f in demo.fns.values() if f.api_name in ("generate", "serving")}
    assert queued["serving"].concurrency_id == queued["generate"].concurrency_id  # the models' one queue
    local = {c["props"].get("elem_id"): c["props"] for c in build_app(Policy()).config["components"]}
    assert local["sv-server-url"]["interactive"] is not False
    with pytest.raises(SystemExit):
        app.parse_args(["--server", "localhost:8000"])  # no scheme: told at startup
    assert "argument --server: the URL must be an http:// or https:// address" in capsys.readouterr().err


def test_the_api_page_names_every_serving_output_and_a_hosted_app_without_a_server_offers_no_run():
    returns = build_app(Policy()).get_api_info()["named_endpoints"]["/serving"]["returns"]
    labels = [r["label"] for r in returns]
    assert not any(label.startswith("value_") for label in labels), labels
    assert "speculative server text" in labels and "speed chart" in labels

    def run_button(policy):
        return next(c["props"] for c in build_app(policy).config["components"]
                    if c["props"].get("elem_id") == "sv-server-run")
    assert run_button(hosted_policy())["interactive"] is False  # nothing to run: not a live button
    assert run_button(hosted_policy(server_url=SPEC))["interactive"] is not False
    assert run_button(Policy())["interactive"] is not False  # locally a URL can be typed in


# ---- the load sweep -------------------------------------------------------------------------

def test_a_load_sweep_file_is_drawn_and_a_bad_one_gets_a_sentence(tmp_path, monkeypatch):
    monkeypatch.setattr("specviz.ui.blocks.serving.MAX_LOAD_BYTES", 1_000_000)
    runs = serving(engines=fake_engines({}))
    good, bad, big = tmp_path / "load.json", tmp_path / "bad.json", tmp_path / "big.json"
    good.write_text(json.dumps({"format": "specviz-load", "version": 1}))
    bad.write_text("{not json")
    big.write_text(" " * 2_345_678)
    status, figure = runs.show_upload(str(good))
    assert 'data-state="done"' in status and figure == {"figure for": "specviz-load"}
    assert "is not a specviz-load result (JSONDecodeError" in runs.show_upload(str(bad))[0]
    assert "the uploaded file is 2.3 MB: this app reads load sweeps of up to 1 MB" in runs.show_upload(str(big))[0]
    (tmp_path / "other.json").write_text("{}")
    assert "its 'format' is missing" in unescape(runs.show_upload(str(tmp_path / "other.json"))[0])
    assert "cannot read" in runs.show_path(str(tmp_path / "missing.json"))[0]
    assert runs.show_path(str(good))[1] == {"figure for": "specviz-load"}  # trusted: any path
    hosted = serving(hosted_policy(load_result=str(good)), fake_engines({}))
    assert hosted.show_path(str(good))[1] == {"figure for": "specviz-load"}  # the operator's file
    assert "reads no files by path" in hosted.show_path("/etc/passwd")[0]


# ---- in a browser ---------------------------------------------------------------------------

@pytest.mark.slow  # drives a real Chromium
def test_the_tab_in_a_browser_streams_step_boxes_with_hostile_text_as_text(browser):  # noqa: F811
    from app_server import serve_app
    from test_app_browser import HANG, OUT

    hostile = spec_run(texts=(HOSTILE, *TEXTS[1:]))
    engines = fake_engines({SPEC: hostile, PLAIN: plain_run()}, between=lambda i: time.sleep(0.05))
    with serve_app(Policy(server_url=SPEC, baseline_server_url=PLAIN), engines=engines) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.get_by_role("tab", name="Serving engine").click()
        assert page.locator("#sv-server-url input, #sv-server-url textarea").first.input_value() == SPEC
        page.locator("#sv-server-run").click()
        page.wait_for_selector('#sv-server-status [data-state="done"]', timeout=HANG)
        page.wait_for_timeout(500)
        spec = page.locator("#sv-server-spec")
        assert spec.locator(".tok-step").count() == 6 and spec.locator("img").count() == 0
        assert HOSTILE in spec.inner_text()
        assert spec.locator(".tok-step").nth(1).get_attribute("data-tip") == "step 2: kept 1 of 3 drafts"
        assert page.locator("#sv-server-base .tok-step").count() == 20
        for chart in ("steps", "positions", "speed"):
            assert page.locator(f"#sv-server-chart-{chart} .js-plotly-plot").count() == 1
        OUT.mkdir(exist_ok=True)
        page.screenshot(path=str(OUT / "serving.png"), full_page=True)
        page.close()


def test_the_shipped_sweep_is_shown_by_name_not_by_path():
    from specviz.serving.load_report import load_figure, read_json
    from specviz.ui.policy import MEASURED_LOAD, policy_from_env

    policy = policy_from_env({})
    assert policy.load_result == str(MEASURED_LOAD)  # shown until an operator names another
    engines = types.SimpleNamespace(stream_completion=None, read_result=read_json, load_figure=load_figure)
    status, figure = serving(policy, engines).show_path(policy.load_result)
    assert "measured for the README" in status and str(MEASURED_LOAD.parent) not in status
    assert len(figure.data) > 4  # both arms, the policy, the crossover, acceptance


@pytest.mark.parametrize("content", [None, "{not json", '{"format": "something else"}'])
def test_an_operators_bad_load_file_is_said_on_the_page_and_the_app_still_starts(content, tmp_path):
    from specviz.ui import build_app
    from specviz.ui.policy import policy_from_env

    path = tmp_path / "load.json"
    if content is not None:
        path.write_text(content)
    policy = policy_from_env({"SPECVIZ_LOAD_RESULT": str(path)})
    demo = build_app(policy)
    status = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "sv-load-status")
    assert "error" in status.value and ("cannot read" in status.value or "specviz-load" in status.value)
