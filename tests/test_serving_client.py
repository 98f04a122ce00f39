"""The streaming client: server-sent events as vLLM 0.32 sent them (recorded from
scripts/serve-vllm.sh with ngram speculation), URLs, and failures that become sentences."""
from __future__ import annotations

import json
import time

import pytest

from specviz.core.errors import SpecvizError
from specviz.serving import client
from specviz.serving.records import ServerRun

# A real chat stream (continuous usage on): the role chunk, "The", " cat", then one step that
# kept four drafts (" sat on the mat.", five tokens), the EOS step, and the usage chunk that
# carries metrics.speculative_decoding.
RECORDED = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
     "usage": {"prompt_tokens": 54, "total_tokens": 54, "completion_tokens": 0}},
    {"choices": [{"index": 0, "delta": {"content": "The"}, "finish_reason": None}],
     "usage": {"prompt_tokens": 54, "total_tokens": 55, "completion_tokens": 1}},
    {"choices": [{"index": 0, "delta": {"content": " cat"}, "finish_reason": None}],
     "usage": {"prompt_tokens": 54, "total_tokens": 56, "completion_tokens": 2}},
    {"choices": [{"index": 0, "delta": {"content": " sat on the mat."}, "finish_reason": None}],
     "usage": {"prompt_tokens": 54, "total_tokens": 61, "completion_tokens": 7}},
    {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop", "stop_reason": None}],
     "usage": {"prompt_tokens": 54, "total_tokens": 62, "completion_tokens": 8}},
    {"choices": [], "usage": {"prompt_tokens": 54, "total_tokens": 62, "completion_tokens": 8},
     "system_fingerprint": "vllm-0.32.0-2b3f0408",
     "metrics": {"speculative_decoding": {
         "mean_acceptance_length": 4.0, "draft_acceptance_rate": 0.75, "acceptance_histogram": [0, 0, 1, 0, 1],
         "num_spec_steps": 2, "num_accepted_draft_tokens": 6, "num_draft_tokens": 8, "num_spec_tokens": 4,
         "per_step_accepted": [4, 2], "per_step_drafted": [4, 4]}}},
]


def sse(events, done=True) -> list[bytes]:
    lines = []
    for e in events:
        lines += [f"data: {json.dumps(e)}\n".encode(), b"\n"]
    return lines + ([b"data: [DONE]\n", b"\n"] if done else [])


def read(lines, **kw) -> ServerRun:
    run = ServerRun(url="http://127.0.0.1:8000", model="m")
    client._read_stream(iter(lines), run, time.perf_counter(), kw.pop("chat", True), kw.pop("on_chunk", None),
                        kw.pop("stop", None))
    return run


def test_a_recorded_vllm_stream_becomes_chunks_and_the_engines_numbers():
    seen = []
    run = read(sse(RECORDED), on_chunk=lambda r: seen.append(len(r.chunks)))
    assert run.text == "The cat sat on the mat."
    assert [c.text for c in run.chunks] == ["The", " cat", " sat on the mat.", ""]
    assert [c.tokens for c in run.chunks] == [1, 1, 5, 1]  # the EOS step's token has no text
    assert run.completion_tokens == 8 == sum(c.tokens for c in run.chunks)
    assert run.prompt_tokens == 54 and run.finish_reason == "stop"
    s = run.spec
    assert s.engine == "vllm" and (s.drafted, s.accepted, s.steps, s.k) == (8, 6, 2, 4)
    assert s.acceptance_rate == 0.75 and s.mean_accepted_length == 4.0
    assert s.per_position_acceptance == [1.0, 1.0, 0.5, 0.5]
    assert run.raw_metrics  # the engine's fields, kept for the JSON
    assert seen == [0, 1, 2, 3, 4, 4]  # called after every event, the chunks so far
    assert run.ttft_s == run.chunks[0].t


def test_a_completions_stream_reads_text_fields():
    events = [{"choices": [{"index": 0, "text": "4", "finish_reason": None}]},
              {"choices": [{"index": 0, "text": "2", "finish_reason": "length"}]}]
    run = read(sse(events), chat=False)
    assert run.text == "42" and run.finish_reason == "length"
    assert [c.tokens for c in run.chunks] == [None, None] and run.spec is None


def test_a_chunk_of_several_choices_joins_their_texts_and_keeps_the_last_finish_reason_given():
    """Other lines of the event stream (a keep-alive comment, blank lines) and what follows [DONE] are no chunks."""
    events = [{"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"},
                           {"index": 1, "delta": {"content": "b"}, "finish_reason": "length"},
                           {"index": 2, "delta": {"content": None}, "finish_reason": None}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": None}]}]
    run = read([b": keep-alive\n"] + sse(events) + sse([{"choices": [{"index": 0, "delta": {"content": "late"}}]}]))
    assert run.text == "ab" and run.finish_reason == "length" and [c.text for c in run.chunks] == ["ab"]


def test_an_error_event_ends_the_run_with_its_message():
    run = read(sse(RECORDED[:2] + [{"error": {"message": "out of KV cache"}}]))
    assert run.text == "The" and "out of KV cache" in run.error


def test_stop_closes_the_stream_and_keeps_what_arrived():
    run = read(sse(RECORDED), stop=lambda: True)
    assert run.error == "stopped" and run.chunks == []  # the role chunk arrived, nothing with text yet


def test_inter_token_latency_is_time_per_token_after_the_first():
    run = ServerRun(url="u", model="m", completion_tokens=5, elapsed_s=2.0,
                    chunks=[client.Chunk(t=0.5, text="a", tokens=1), client.Chunk(t=1.3, text="bcde", tokens=4)])
    assert run.ttft_s == 0.5 and run.inter_token_s == pytest.approx(0.8 / 4) and run.tokens_per_s == 2.5


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://host", "http://", "", "javascript:alert(1)"])
def test_urls_that_are_not_http_servers_get_a_sentence_before_any_request(url):
    with pytest.raises(SpecvizError, match="the server URL must be an http:// or https:// address"):
        client.stream_completion(url, "hi", model="m")


def test_a_server_that_is_not_there_is_a_failed_run_not_a_crash():
    port = __import__("vllm_servers").free_port()  # nothing listens on it
    run = client.stream_completion(f"http://127.0.0.1:{port}", "hi", model="m", timeout_s=5)
    assert run.error and f"127.0.0.1:{port}" in run.error and run.chunks == []
    with pytest.raises(SpecvizError, match="did not answer /v1/models"):
        client.server_model(f"http://127.0.0.1:{port}", timeout_s=5)


def test_a_llamacpp_stream_with_per_token_timings_gives_its_steps():
    # llama.cpp streams one chunk per token, each with the request's running draft counters
    # (timings_per_token), raised once per verify step before that step's tokens go out.
    counters = [(0, 0), (4, 3), (4, 3), (4, 3), (4, 3), (8, 3), (8, 3)]  # (draft_n, draft_n_accepted)
    events = [{"choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}],
               "timings": {"predicted_n": i + 1, **({"draft_n": d, "draft_n_accepted": a} if d else {})}}
              for i, (d, a) in enumerate(counters)]
    run = read(sse(events))
    s = run.spec
    assert s.engine == "llama.cpp" and (s.drafted, s.accepted) == (8, 3)
    assert s.per_step_drafted == (4, 4) and s.per_step_accepted == (3, 0) and s.steps == 2
    assert s.per_position_acceptance == [0.5, 0.5, 0.5, 0.0]


def test_an_openai_error_body_is_reduced_to_its_message():
    body = '{"error":{"message":"The model `nosuch` does not exist.","type":"NotFoundError","code":404}}'
    assert client._error_message(body) == "The model `nosuch` does not exist."
    assert client._error_message("<html>bad gateway</html>") == "<html>bad gateway</html>"
    assert client._error_message('{"error": "overloaded"}') == "overloaded"
