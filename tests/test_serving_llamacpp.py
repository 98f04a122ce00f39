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
import time

from specviz.serving import client, generate_command
from specviz.serving.figures import PER_TOKEN, REBUILT, UNDRAFTED as UNDRAFTED_CAPTION, groups_html
from specviz.serving.records import ServerRun
from specviz.serving.steps import COUNTERS, steps

PROMPT_N, CACHE_N = 30, 0


def timings(predicted: int, drafts: tuple[int, int] = (0, 0), cache_n: int = CACHE_N, tps: float = 40.0) -> dict:
    t = {"cache_n": cache_n, "prompt_n": PROMPT_N, "prompt_ms": 300.0, "prompt_per_token_ms": 10.0,
         "prompt_per_second": 100.0, "predicted_n": predicted, "predicted_ms": predicted * 1000 / tps,
         "predicted_per_token_ms": 1000 / tps, "predicted_per_second": tps}
    if drafts[0]:
        t |= {"draft_n": drafts[0], "draft_n_accepted": drafts[1]}
    return t


def chunk(content, t: dict | None, finish=None) -> dict:
    event = {"choices": [{"finish_reason": finish, "index": 0, "delta": {} if content is None else {"content": content}}],
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
