"""llama.cpp's server read right and said plainly (issue 49): its one-chunk-per-token streams
drawn as engine steps, every server state in a sentence, and fair speed figures.

The streams are built by hand in the shape llama-server sends with `"timings_per_token": true`
(tools/server/server-context.cpp send_partial_response, server-task.cpp's OpenAI chat chunks,
server-common.cpp server_slot_stats::to_json): one chunk per token, each with the running
`timings`, whose draft_n / draft_n_accepted appear once something was drafted; a token that
ends inside a UTF-8 character is held back and goes out with the next one.
"""
from __future__ import annotations

import io
import json
import subprocess
import threading
import time
import types
from html import unescape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from specviz.serving import bench_server, client, generate_command, speed, state
from specviz.serving.figures import PER_TOKEN, REBUILT, UNDRAFTED as UNDRAFTED_CAPTION, groups_html, headline_html
from specviz.serving.records import ServerRun, SpecStats
from specviz.serving.steps import COUNTERS, steps
from specviz.ui import Policy
from specviz.ui.handlers import Session
from specviz.ui.live.limits import Line
from specviz.ui.blocks.serving import ServingRuns

PROMPT_N, CACHE_N = 30, 0


def timings(predicted: int, drafts: tuple[int, int] = (0, 0), cache_n: int = CACHE_N, tps: float = 40.0) -> dict:
    t = {"cache_n": cache_n, "prompt_n": PROMPT_N, "prompt_ms": 300.0, "prompt_per_token_ms": 10.0,
         "prompt_per_second": 100.0, "predicted_n": predicted, "predicted_ms": predicted * 1000 / tps,
         "predicted_per_token_ms": 1000 / tps, "predicted_per_second": tps}
    if drafts[0]:
        t |= {"draft_n": drafts[0], "draft_n_accepted": drafts[1]}
    return t


def chunk(content, t: dict | None, finish=None) -> dict:
    delta = {} if content is None else {"content": content}
    event = {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
             "created": 1764859200, "id": "chatcmpl-49", "model": "smollm2", "system_fingerprint": "b11434",
             "object": "chat.completion.chunk"}
    if t is not None:
        event["timings"] = t
    return event


# (text sent, running predicted_n, running (draft_n, draft_n_accepted)); None: a chunk without timings
TOKENS = [
    ("The", 1, (0, 0)),  # the token from prefill
    (" cat", 2, (0, 0)),  # a step that drafted nothing
    (" sat", 3, (4, 4)), (" on", 4, (4, 4)), (" the", 5, (4, 4)), (" mat", 6, (4, 4)), (",", 7, (4, 4)),  # all 4 kept
    (" and", 8, (7, 4)),  # drafted 3, kept none: the target's own token only
    (" caf", 9, (10, 6)), ("é", 11, (10, 6)),  # drafted 3, kept 2; "é" is two tokens, the first held back
    (" It", 12, (12, 7)), (" purred", None, None),  # drafted 2, kept 1; the second chunk carries no timings
    (".", 14, (12, 7)),  # nothing drafted (how many tokens its chunk holds is unknown after an untimed one)
]


UNDRAFTED = [(text, n, (0, 0)) for text, n, _ in TOKENS if n is not None]  # speculation that never drafted


def llamacpp_stream(tokens=TOKENS, tps=40.0, cache_n=CACHE_N) -> list[dict]:
    events = [{"choices": [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}],
               "object": "chat.completion.chunk", "timings": timings(0, cache_n=cache_n, tps=tps)}]
    for text, predicted, drafts in tokens:
        events.append(chunk(text, None if predicted is None else timings(predicted, drafts, cache_n, tps)))
    last = tokens[-1]
    final = timings(last[1], last[2], cache_n, tps)
    events.append(chunk(None, final, finish="stop"))
    events.append({"choices": [], "object": "chat.completion.chunk", "timings": final,
                   "usage": {"completion_tokens": last[1], "prompt_tokens": PROMPT_N + cache_n,
                             "total_tokens": last[1] + PROMPT_N + cache_n}})
    return events


def read(events) -> ServerRun:
    lines = []
    for e in events:
        lines += [f"data: {json.dumps(e)}\n".encode(), b"\n"]
    run = ServerRun(url="http://127.0.0.1:8080", model="smollm2")
    client._read_stream(iter(lines + [b"data: [DONE]\n"]), run, time.perf_counter(), True, None, None)
    run.elapsed_s = 1.0
    return run


# ---- 1. steps drawn right for a stream of one chunk per token ----------------------------------

def test_llamacpp_tokens_are_grouped_into_the_steps_its_counters_mark():
    run = read(llamacpp_stream())
    assert run.engine == "llama.cpp" and run.text == "The cat sat on the mat, and café It purred."
    assert [c.tokens for c in run.chunks] == [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, None, None]
    groups, found = steps(run)
    assert found == COUNTERS
    assert [(g.text, g.tokens, g.kept, g.drafted) for g in groups] == [
        ("The", 1, 0, 0), (" cat", 1, 0, 0), (" sat on the mat,", 5, 4, 4), (" and", 1, 0, 3),
        (" café", 3, 2, 3), (" It purred", 2, 1, 2), (".", 1, 0, 0)]
    s = run.spec  # the same steps as the engine's reader counts
    assert s.per_step_drafted == (4, 3, 3, 2) and s.per_step_accepted == (4, 0, 2, 1)
    assert [g.drafted for g in groups if g.drafted] == list(s.per_step_drafted)


def test_the_page_draws_llamacpp_steps_and_says_what_a_box_is():
    html = groups_html(read(llamacpp_stream()), "Speculative server", "")
    assert html.count('data-kind="step"') == 7
    assert 'data-tip="step 3: kept 4 of 4 drafts · 5 tokens"' in html
    assert 'data-tip="step 4: kept 0 of 3 drafts · 1 token"' in html
    assert 'data-tip="step 1: nothing drafted · 1 token"' in html
    assert REBUILT in html.replace("&#x27;", "'") and "what the server sent together" not in html
    plain = groups_html(read(llamacpp_stream(UNDRAFTED)), "Speculative server", "")
    assert plain.count('data-kind="step"') == 12 and UNDRAFTED_CAPTION in plain
    events = llamacpp_stream(UNDRAFTED)  # a server that ignored timings_per_token: timings at the end only
    untimed = read([{k: v for k, v in e.items() if k != "timings"} for e in events[:-2]] + events[-2:])
    assert PER_TOKEN in groups_html(untimed, "Speculative server", "").replace("&#x27;", "'")


def test_the_cli_marks_several_token_steps_and_explains_marks_only_when_there_are_some():
    run = read(llamacpp_stream())
    out = io.StringIO()
    assert generate_command.print_groups(run, out)
    assert out.getvalue() == "The cat⟨ sat on the mat,⟩ and⟨ café⟩⟨ It purred⟩.\n\n"
    undrafted = read(llamacpp_stream(UNDRAFTED))
    out = io.StringIO()
    assert not generate_command.print_groups(undrafted, out) and "⟨" not in out.getvalue()
    args = type("A", (), dict(max_new_tokens=64, temperature=0.0, seed=None, chat=None))()
    for r, legend in ((run, True), (undrafted, False)):
        summary = io.StringIO()
        generate_command.print_summary(generate_command.result(args, r, None, None), summary,
                                       marked=legend)
        assert ("groups:" in summary.getvalue()) == legend
    summary = io.StringIO()
    generate_command.print_summary(generate_command.result(args, run, None, None), summary, marked=True)
    assert "rebuilt from llama.cpp's running draft counters" in summary.getvalue()


# ---- 2. every server state said plainly ----------------------------------------------------------

LLAMACPP_METRICS = "\n".join([  # what --metrics shows whether or not the server speculates
    "# TYPE llamacpp:tokens_predicted_total counter", "llamacpp:tokens_predicted_total 14",
    "llamacpp:spec_decode_num_draft_tokens_total 0", "llamacpp:spec_decode_num_accepted_tokens_total 0",
    "llamacpp:spec_decode_num_drafts_total 0", ""])
NOT_ENABLED = json.dumps({"error": {"code": 501, "type": "not_supported_error", "message":
                                     "This server does not support metrics endpoint. Start it with `--metrics`"}})
VLLM_SPEC = "vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"m\"} 3\n" \
            "vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"m\"} 12\n" \
            "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"m\"} 5\n"


def slots(speculative: bool, types: str) -> str:
    return json.dumps([{"id": 0, "n_ctx": 8192, "speculative": speculative, "is_processing": False,
                        "params": {"speculative.types": types, "timings_per_token": True}}])


@pytest.fixture(scope="module")
def pages():
    """A server whose pages the test sets: {path: (status, body)}."""
    table: dict = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = table.get(self.path, (404, "not found"))
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", table
    server.shutdown()
    server.server_close()


def look(pages, **paths) -> state.Probe:
    url, table = pages
    table.clear()
    table.update({"/" + name: page for name, page in paths.items()})
    return state.probe(url + "/v1", timeout_s=2)


def test_a_llamacpp_server_that_speculates_but_drafted_nothing_is_told_so_with_its_own_flags(pages):
    run = read(llamacpp_stream(UNDRAFTED))
    found = look(pages, metrics=(200, LLAMACPP_METRICS), slots=(200, slots(True, "ngram-simple")))
    assert found == state.Probe("ok", "llama.cpp", True, True, "ngram-simple")
    said = state.explain(run, found)
    assert said.startswith("Speculation is on (ngram-simple) but llama.cpp drafted nothing for this request")
    assert "12-token match" in said and "--speculative-config" not in said
    assert state.explain(read(llamacpp_stream()), found) is None  # it drafted: nothing to explain


def test_a_llamacpp_server_without_speculation_or_metrics_is_told_what_to_start_it_with(pages):
    run = read(llamacpp_stream(UNDRAFTED))
    found = look(pages, metrics=(501, NOT_ENABLED), slots=(200, slots(False, "none")))
    assert found == state.Probe("off", "llama.cpp", False, False, "none")
    said = state.explain(run, found)
    assert said.startswith("This llama.cpp server is not speculating: start llama-server with --spec-type ngram-mod")
    assert "-md DRAFT.gguf" in said and "start llama-server with --metrics" in said
    assert "--speculative-config" not in said
    # /slots switched off too (--no-slots): it cannot tell off from nothing drafted, and says both
    said = state.explain(run, look(pages, metrics=(501, NOT_ENABLED)))
    assert said.startswith("llama.cpp sent no draft counters") and "--spec-type" in said and "--metrics" in said


def test_vllm_states_name_vllm_flags_and_an_unknown_engine_is_said_to_be_unknown(pages):
    bare = ServerRun(url="http://127.0.0.1:8000", model="m", text="hi", elapsed_s=1.0)
    found = look(pages, metrics=(200, "vllm:num_requests_running{model_name=\"m\"} 0\n"))
    assert found == state.Probe("ok", "vllm", False)
    assert state.explain(bare, found).startswith("This vLLM server is not speculating: start vLLM with "
                                                 "--speculative-config")
    found = look(pages, metrics=(200, VLLM_SPEC))
    assert "--per-request-spec-decode-metrics" in state.explain(bare, found)
    unknown = state.explain(bare, look(pages, metrics=(200, "tgi_request_count 3\n")))
    assert "it reads vLLM, SGLang and llama.cpp" in unknown and "--spec-type" not in unknown
    assert "cannot tell which engine" in state.explain(bare, look(pages))  # no /metrics at all (404)
    nothing = ServerRun(url="u", model="m", spec=SpecStats(engine="vllm", drafted=0, accepted=0, steps=0))
    assert state.explain(nothing, None).startswith("Speculation is on but vLLM drafted nothing")


def test_the_page_says_the_state_after_a_run(pages):
    url, table = pages
    look(pages, metrics=(200, LLAMACPP_METRICS), slots=(200, slots(True, "ngram-simple")))
    run = read(llamacpp_stream(UNDRAFTED))
    backend = types.SimpleNamespace(stream_completion=lambda *a, **k: run, probe=state.probe)
    policy = Policy()
    runs = ServingRuns(policy, Line(policy.concurrency, policy.max_waiting, policy.runs_per_visitor), backend)
    *_, last = runs.run(Session(), None, server=url, baseline="", model="", prompt="Hi", mode="greedy",
                        temperature=0.0, seed=0, max_new_tokens=16, chat=True)
    assert "llama.cpp drafted nothing for this request" in unescape(last["status"])
    assert "--speculative-config" not in unescape(last["status"])


# ---- 3. fair speed ---------------------------------------------------------------------------------

LONG = [(f" w{i}", i + 1, (0, 0)) for i in range(3)] + \
    [(f" x{i}", i + 4, (4 * (i // 5 + 1), 4 * (i // 5 + 1))) for i in range(20)]  # 23 tokens, 4 steps of 5


def pair(spec_tps=60.0, base_tps=40.0, spec_cache=0, base_cache=0, tokens=LONG):
    spec = read(llamacpp_stream(tokens, tps=spec_tps, cache_n=spec_cache))
    base = read(llamacpp_stream([(t, n, (0, 0)) for t, n, _ in tokens], tps=base_tps, cache_n=base_cache))
    base.elapsed_s = 0.25  # end to end, the plain server looks 3x faster than decoding says
    return spec, base


def test_the_speedup_compares_decode_rates_where_the_engine_gives_them():
    spec, base = pair()
    assert spec.decode_tokens_per_s == 60.0 and spec.tokens == 23 and spec.spec.drafted == 16
    c = speed.compare(spec, base)
    assert c == speed.Comparison(1.5, speed.DECODE)
    spec.timings, base.timings = None, None  # an engine with no decode-only rate: end to end, and said so
    spec.engine = base.engine = "vllm"
    assert speed.compare(spec, base) == speed.Comparison((23 / 1.0) / (23 / 0.25), speed.END_TO_END)


def test_no_speedup_for_short_answers_or_runs_that_drafted_nothing_and_differing_caches_are_said():
    spec, base = pair(tokens=LONG[:8])
    assert speed.compare(spec, base).withheld == "8 tokens is too short to time (a speedup needs 16 from each server)"
    spec, base = pair(tokens=[(t, n, (0, 0)) for t, n, _ in LONG])
    c = speed.compare(spec, base)
    assert c.speedup is None and "drafted nothing" in c.withheld
    spec, base = pair(spec_cache=26, base_cache=0)  # the prompt was cached on one server only
    c = speed.compare(spec, base)
    assert c.speedup == 1.5 and c.cache == ("the two servers' prompt caches differ: the speculative one reused 26 "
                                            "of 56 prompt tokens from its cache, the plain one 0 of 30")


def test_the_cli_and_the_page_say_which_rate_they_compare():
    spec, base = pair(spec_cache=26)
    args = type("A", (), dict(max_new_tokens=64, temperature=0.0, seed=None, chat=None))()
    r = generate_command.result(args, spec, None, base)
    assert r["speedup"] == 1.5 and r["speedup_basis"] == "decode" and r["stats"]["decode_tokens_per_s"] == 60.0
    out = io.StringIO()
    generate_command.print_summary(r, out, marked=False)
    text = out.getvalue()
    assert "60.0 tokens/s decoding (23.0 end to end)" in text
    assert "speedup 1.50x (decode-only tokens/s" in text and "prompt caches differ" in text
    short = generate_command.result(args, *pair(tokens=LONG[:8])[:1], None, pair(tokens=LONG[:8])[1])
    out = io.StringIO()
    generate_command.print_summary(short, out, marked=False)
    assert "no speedup: 8 tokens is too short to time" in out.getvalue() and "speedup 3" not in out.getvalue()
    cards = unescape(headline_html(spec, base))
    assert "1.50×" in cards and "decode-only tokens/s" in cards and "prompt caches differ" in cards


def test_the_server_bench_takes_decode_rates_when_every_run_has_one():
    runs = [{"prompt": "p", "category": "code", "repeat": 0, "arm": arm, "text": "t", "tokens": 20,
             "tokens_per_s": e2e, "decode_tokens_per_s": decode, "drafted": 8, "accepted": 4, "steps": 2}
            for arm, e2e, decode in (("spec", 20.0, 60.0), ("base", 40.0, 40.0))]
    row = bench_server.summarise(runs, greedy=True)[0]
    assert row["speedup"] == 1.5 and row["rate"] == "decode"
    runs[1]["decode_tokens_per_s"] = None
    row = bench_server.summarise(runs, greedy=True)[0]
    assert row["speedup"] == 0.5 and row["rate"] == "end-to-end"
    out = io.StringIO()
    bench_server.print_table([row], out)
    assert "end to end" in out.getvalue()


def test_serve_llamacpp_refuses_bad_arguments_before_building_anything():
    script = str(Path(__file__).resolve().parents[1] / "scripts" / "serve-llamacpp.sh")
    for args, words in ((["--spec", "eagle"], "--spec must be"), (["--port", "x"], "--port must be a number"),
                        (["--spec", "draft"], "--spec draft needs --draft GGUF")):
        r = subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and words in r.stderr
