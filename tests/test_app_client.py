"""The app's API, called the way a script would: gradio_client against a live local server."""
from __future__ import annotations

import time

import pytest
from app_server import PROMPT, app_models, app_policy, serve_app, slow_prefill  # noqa: F401 (app_models is a fixture)
from gradio_client import Client
from tiny_folder import make_tiny_model_dir

SETTINGS = dict(k=4, dynamic_k=False, mode="greedy", temperature=0.7, top_k=0, top_p=1.0,
                repetition_penalty=1.0, seed=0, max_new_tokens=24, chat=True)


@pytest.fixture(scope="module")
def client(app_models):
    with serve_app(app_policy(app_models)) as url:
        yield Client(url, verbose=False)


def generate(client, **overrides):
    args = dict(SETTINGS, prompt=PROMPT, target=overrides.pop("target_folder"), drafter="prompt lookup")
    args.update(overrides)
    *_, summary = client.predict(**args, api_name="/generate")
    return summary


def test_generate_returns_both_runs_and_a_greedy_check(client, app_models):
    status, check, head, spec, base, *charts, step, inspector, summary = client.predict(
        **SETTINGS, prompt=PROMPT, target=app_models["target"], drafter=app_models["draft"], api_name="/generate")
    assert summary["state"] == "done" and summary["identical"] is True
    assert summary["speculative"]["token_ids"] == summary["baseline"]["token_ids"]
    assert summary["speculative"]["tokens"] == 24
    for kind in ("accepted", "rejected", "corrected", "bonus"):
        assert f'data-kind="{kind}"' in spec
    assert 'data-kind="baseline"' in base and "&lt;b&gt;" not in spec  # prompt not echoed
    assert 'data-identical="true"' in check and 'data-metric="speedup"' in head
    assert len(charts) == 4 and all(c["type"] == "plotly" for c in charts)
    assert "target's top token" in inspector  # greedy: the rule applied, the argmax test
    assert summary["headline"]["alpha"] == pytest.approx(summary["speculative"]["acceptance_rate"])


def test_compare_runs_the_baseline_then_each_drafter(client, app_models):
    status, table, speed, quality, panels, summary = client.predict(
        drafters=["none", "prompt lookup", app_models["draft"]], **SETTINGS, prompt=PROMPT,
        target=app_models["target"], api_name="/compare")
    assert summary["state"] == "done", summary["message"]
    runs = [r["run"] for r in summary["rows"]]
    assert runs == ["baseline", "none", "prompt lookup", "draft model: tiny-draft"]
    texts = {r["label"]: r["token_ids"] for r in summary["runs"]}
    assert len(set(map(tuple, texts.values()))) == 1  # greedy: every drafter gives the baseline's text
    assert panels.count('class="sv-panel"') == 4 and speed["type"] == "plotly"
    assert [row[0] for row in table["data"]] == runs


def test_stop_ends_the_run_early(client, app_models):
    # Long enough (several seconds even on a fast machine) that Stop lands mid-run. No bound on
    # how soon after the press it ends: that is wall-clock time, which a busy machine stretches.
    job = client.submit(**dict(SETTINGS, max_new_tokens=400), prompt=PROMPT, target=app_models["target"],
                        drafter=app_models["draft"], api_name="/generate")
    deadline = time.monotonic() + 600  # only a guard against hanging forever
    while not job.outputs() or job.outputs()[-1][-1]["state"] != "running":
        assert time.monotonic() < deadline and not job.done(), "the run never started"
        time.sleep(0.05)
    client.predict(api_name="/stop")
    summary = job.result()[-1]
    assert summary["state"] == "stopped"
    assert summary["speculative"]["stop_reason"] == "cancelled"
    assert summary["speculative"]["tokens"] < 400


def test_a_script_hears_a_long_prefills_progress_while_it_runs(client, app_models, monkeypatch):
    """docs/app.md's `submit` loop: the summary streams the status, the prefill's chunks
    counted (chunks of 4 tokens here, each made 0.35 s slower, so the heartbeat sees them)."""
    slow_prefill(monkeypatch)
    job = client.submit(**dict(SETTINGS, max_new_tokens=4), prompt=PROMPT, target=app_models["target"],
                        drafter="prompt lookup", api_name="/generate")
    said = [(summary["state"], summary["message"]) for *_, summary in job]
    assert any(state == "running" and "reading the prompt (prefill: " in message and " tokens read, " in message
               for state, message in said), said
    assert said[-1][0] == "done"


def test_stop_during_a_prefill_is_acknowledged_at_once_and_ends_it_at_the_next_piece(client, app_models, monkeypatch):
    """API /stop during a long prefill: the status went on counting the prompt's pieces (a teacher
    pressed Stop again); now every update after the press says "Stopping…", and at most the
    piece under way is read after it (pieces sized by time: tests/test_engine.py)."""
    read = []
    slow_prefill(monkeypatch, read=read)
    job = client.submit(**dict(SETTINGS, max_new_tokens=4), prompt=PROMPT * 3, target=app_models["target"],
                        drafter="prompt lookup", api_name="/generate")
    deadline = time.monotonic() + 600  # only a guard against hanging forever
    while not any("reading the prompt (prefill: " in o[-1]["message"] for o in job.outputs()):
        assert time.monotonic() < deadline and not job.done(), "the prefill's progress never showed"
        time.sleep(0.05)
    client.predict(api_name="/stop")
    at_stop, shown = len(read), len(job.outputs())
    *_, summary = job.result()
    after = [o[-1] for o in job.outputs()[shown:]]
    assert summary["state"] == "stopped" and len(read) - at_stop <= 1, (at_stop, read)
    assert [s["message"] for s in after if s["state"] == "running"] == ["Stopping…"] * sum(
        s["state"] == "running" for s in after)


def test_errors_read_as_sentences_and_the_app_keeps_serving(client, app_models, tmp_path):
    missing = generate(client, target_folder=str(tmp_path / "no-such-model"))
    assert missing["state"] == "error" and "does not exist" in missing["message"]

    other_vocab = make_tiny_model_dir(tmp_path / "other-vocab", vocab_words=("alpha", "beta", "gamma"))
    mismatch = generate(client, target_folder=app_models["target"], drafter=str(other_vocab))
    assert mismatch["state"] == "error" and "do not share a tokenizer" in mismatch["message"]

    # What a script may send that the page's controls never would: a sentence, not Gradio's
    # generic error or a traceback in the server's log.
    for bad, says in ((dict(k=0), "k must be from 1 to 64, got 0"),
                      (dict(k="abc"), "k must be a whole number, got 'abc'"),
                      (dict(seed=1e30), "seed must be a whole number from 0 to 2**64 - 1"),
                      (dict(mode="sampling", temperature="nan"), "temperature must be a finite number"),
                      # torch's RuntimeError ("probability tensor contains inf") reached the status
                      (dict(mode="sampling", temperature=1e-40), "temperature must be 0 (greedy) or at least 0.01"),
                      (dict(max_new_tokens=100_000), "max new tokens is capped at 400 here"),
                      (dict(drafter="layerskip:0-1000"), "layer range '0-1000' is outside this target's 2 layers")):
        refused = generate(client, target_folder=app_models["target"], **bad)
        assert refused["state"] == "error" and says in refused["message"], (bad, refused["message"])

    fine = generate(client, target_folder=app_models["target"], max_new_tokens=8)
    assert fine["state"] == "done" and fine["speculative"]["tokens"] == 8


def call(client, endpoint: str, values: list) -> tuple[str, object]:
    """A raw HTTP call, as curl would make it (docs/app.md): (the stream's last event, its data; for
    /generate the summary is data[-2], the session last)."""
    import json

    import httpx

    # ensure_ascii: a lone surrogate travels as the JSON escape "\\ud800", which no UTF-8 encoder writes
    sent = httpx.post(f"{client.src.rstrip('/')}/gradio_api/call/{endpoint}", content=json.dumps({"data": values}),
                      headers={"content-type": "application/json"}, timeout=60)
    sent.raise_for_status()
    stream = httpx.get(f"{client.src.rstrip('/')}/gradio_api/call/{endpoint}/{sent.json()['event_id']}", timeout=600)
    event = [line for line in stream.text.splitlines() if line.startswith("event: ")][-1][len("event: "):]
    data = [line for line in stream.text.splitlines() if line.startswith("data: ")][-1][len("data: "):]
    return event, json.loads(data)


def test_requests_gradio_or_the_tokenizer_would_refuse_get_one_sentence(client, app_models):
    """Over raw HTTP: a prompt with half a UTF-16 pair (the tokenizer's TypeError), a request one
    value short (Gradio's bare {"error": null}) and one with two values too many (every value
    shifted by one, and the drafter blamed for k's 4)."""
    given = dict(SETTINGS, prompt=PROMPT, target=app_models["target"], drafter="prompt lookup", max_new_tokens=8)
    params = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/generate"]["parameters"]
    names = [p["parameter_name"] for p in params]
    values = [given.get(p["parameter_name"], p.get("parameter_default")) for p in params]
    event, data = call(client, "generate", values)
    assert event == "complete" and data[-2]["state"] == "done"  # the request as it should be

    event, data = call(client, "generate", ["ab\ud800cd", *values[1:]])
    assert event == "complete" and data[-2]["state"] == "error"
    assert data[-2]["message"] == ("prompt is not valid Unicode text: character 3 is half of a UTF-16 surrogate "
                                   "pair ('\\ud800') with no other half")

    n = len(values)
    event, data = call(client, "generate", values[:-1])
    assert event == "error" and data["error"].startswith(f"/generate takes {n} values (prompt, target, drafter, k,")
    assert f"this request sent {n - 1}, without {names[-1]}: nothing was run" in data["error"]

    event, data = call(client, "generate", [*values, "x", "y"])
    assert event == "error" and f"this request sent {n + 2}, 2 more than it takes" in data["error"]
    event, data = call(client, "stop", [1])  # an endpoint of no values, sent one
    assert event == "error" and data["error"].startswith("/stop takes 0 values")


@pytest.mark.parametrize("body, field, words", [
    ('{"dat": []}', "data", "this request's body has no 'data' field: a call sends a JSON object whose 'data' is"),
    ('{"data": "abc"}', "data", "this request's 'data' must be a list of the endpoint's values, got 'abc' (str)"),
    ("not json", "body", "this request's body is not valid JSON (Expecting value)"),
    ("[1, 2]", "body", "this request's body must be a JSON object, got [1, 2] (list)"),
    ('{"data": [], "fn_index": "x"}', "fn_index", "this request's 'fn_index' must be a whole number, got 'x' (str)"),
])
def test_a_body_gradio_cannot_read_gets_a_sentence_naming_the_field(client, body, field, words):
    """FastAPI answered these with its bare 422 ({"detail": [{"type": "missing", "loc": ["body", "data"]...}]})."""
    import httpx

    path = "queue/join" if field == "fn_index" else "call/generate"  # /call/ reads no fn_index
    said = httpx.post(f"{client.src.rstrip('/')}/gradio_api/{path}", content=body,
                      headers={"content-type": "application/json"}, timeout=60)
    assert said.status_code == 422 and said.json()["field"] == field
    assert said.json()["error"].startswith(words) and said.json()["error"].endswith("nothing was run")
    assert "detail" not in said.json() and "\n" not in said.json()["error"]
