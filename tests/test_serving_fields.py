"""Reading serving engines' speculation fields: vLLM's per-request metrics, SGLang's meta_info,
llama.cpp's timings, and the Prometheus /metrics counters, from inputs in the engines' own shapes
(real responses of a vLLM 0.32 server, text from vLLM's own metric classes, the rest built the
way the engines' source builds them), with alpha, tau and per-position rates checked by hand."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specviz.core.errors import SpecvizError
from specviz.serving import engines, prometheus
from specviz.serving.engines import (llamacpp_spec, llamacpp_spec_from_chunks, raw_spec_fields, sglang_spec,
                                     spec_from_response, vllm_spec)
from specviz.serving.prometheus import SGLangCounters, SpecCounters, parse, sglang_counters, spec_counters

# ---------------------------------------------------------------- vLLM per request

# A real /v1/completions answer of vLLM 0.32 (ngram, k=4, --per-request-spec-decode-metrics detailed)
# to "1 2 3 4 1 2 3 4 1 2", max_tokens 16: 3 steps kept all 4 drafts, + the prefill token = 16.
REAL_VLLM_BODY = json.loads(
    '{"id":"cmpl-a637ebea4f7cc0e6","object":"text_completion","created":1796062057,'
    '"model":"SmolLM2-135M-Instruct","choices":[{"index":0,"text":" 3 4 1 2 3 4 1 2","logprobs":null,'
    '"finish_reason":"length","stop_reason":null,"token_ids":null,"prompt_logprobs":null,'
    '"prompt_token_ids":null,"routed_experts":null}],"service_tier":null,'
    '"system_fingerprint":"vllm-0.32.0-2b3f0408","usage":{"prompt_tokens":19,"total_tokens":35,'
    '"completion_tokens":16,"prompt_tokens_details":null,"completion_tokens_details":null},'
    '"kv_transfer_params":null,"ec_transfer_params":null,"metrics":{"time_to_first_token_ms":null,'
    '"generation_time_ms":null,"queue_time_ms":null,"mean_itl_ms":null,"tokens_per_second":null,'
    '"speculative_decoding":{"mean_acceptance_length":5.0,"draft_acceptance_rate":1.0,'
    '"acceptance_histogram":[0,0,0,0,3],"num_spec_steps":3,"num_accepted_draft_tokens":12,'
    '"num_draft_tokens":12,"num_spec_tokens":4,"per_step_accepted":[4,4,4],"per_step_drafted":[4,4,4]}}}')

# The same request streamed with stream_options.include_usage: the final usage chunk.
REAL_VLLM_FINAL_CHUNK = json.loads(
    '{"id":"cmpl-845a7a8db59417ca","object":"text_completion","created":1796062057,'
    '"model":"SmolLM2-135M-Instruct","choices":[],"usage":{"prompt_tokens":19,"total_tokens":35,'
    '"completion_tokens":16},"system_fingerprint":"vllm-0.32.0-2b3f0408","metrics":{"speculative_decoding":'
    '{"mean_acceptance_length":5.0,"draft_acceptance_rate":1.0,"acceptance_histogram":[0,0,0,0,3],'
    '"num_spec_steps":3,"num_accepted_draft_tokens":12,"num_draft_tokens":12,"num_spec_tokens":4,'
    '"per_step_accepted":[4,4,4],"per_step_drafted":[4,4,4]}}}')

# vLLM's own RequestSpecDecodeMetrics(k=4) after observe() of steps (drafted, kept) =
# (4, 4), (4, 1), (2, 0), (4, 2), dumped through PerRequestMetrics(exclude_none=True).
VLLM_SUMMARY = {"speculative_decoding": {
    "mean_acceptance_length": 2.75, "draft_acceptance_rate": 0.5, "acceptance_histogram": [1, 1, 1, 0, 1],
    "num_spec_steps": 4, "num_accepted_draft_tokens": 7, "num_draft_tokens": 14, "num_spec_tokens": 4}}
VLLM_DETAILED = {"speculative_decoding": {**VLLM_SUMMARY["speculative_decoding"],
                                          "per_step_accepted": [4, 1, 0, 2], "per_step_drafted": [4, 4, 2, 4]}}


def test_a_real_vllm_response_reads_as_its_own_numbers():
    stats = spec_from_response(REAL_VLLM_BODY)
    assert (stats.engine, stats.drafted, stats.accepted, stats.steps, stats.k) == ("vllm", 12, 12, 3, 4)
    assert stats.histogram == (0, 0, 0, 0, 3)
    assert stats.per_step_accepted == stats.per_step_drafted == (4, 4, 4)
    assert stats.acceptance_rate == 1.0 and stats.mean_accepted_length == 5.0  # vLLM's own two rates
    # every token is a prefill token or in a step: 1 + steps + accepted = completion_tokens
    assert 1 + stats.steps + stats.accepted == REAL_VLLM_BODY["usage"]["completion_tokens"]
    assert spec_from_response(REAL_VLLM_FINAL_CHUNK) == stats
    assert raw_spec_fields(REAL_VLLM_BODY) == REAL_VLLM_BODY["metrics"]["speculative_decoding"]


def test_vllm_summary_and_detailed_give_alpha_tau_and_per_position_by_hand():
    summary = vllm_spec(VLLM_SUMMARY)
    assert (summary.drafted, summary.accepted, summary.steps, summary.k) == (14, 7, 4, 4)
    assert summary.acceptance_rate == 7 / 14 == VLLM_SUMMARY["speculative_decoding"]["draft_acceptance_rate"]
    assert summary.mean_accepted_length == 1 + 7 / 4 == VLLM_SUMMARY["speculative_decoding"]["mean_acceptance_length"]
    assert summary.per_step_accepted is None and summary.per_position_acceptance == []
    detailed = vllm_spec(VLLM_DETAILED)
    assert detailed.per_step_drafted == (4, 4, 2, 4)
    # draft i kept among steps that drafted at least i: 3/4, 2/4, 1/3 (the 2-draft step is out), 1/3
    assert detailed.per_position_acceptance == pytest.approx([3 / 4, 2 / 4, 1 / 3, 1 / 3])
    assert vllm_spec(VLLM_DETAILED["speculative_decoding"]) == detailed  # the inner dict reads the same


def test_no_vllm_speculation_fields_is_none():
    assert vllm_spec({"time_to_first_token_ms": None, "speculative_decoding": None}) is None
    assert vllm_spec({}) is None and vllm_spec(None) is None
    assert spec_from_response({"choices": [], "usage": {"completion_tokens": 3}}) is None
    assert spec_from_response({"metrics": None}) is None and spec_from_response("not json") is None
    assert raw_spec_fields({"metrics": {"speculative_decoding": None}}) == {}


@pytest.mark.parametrize("change, words", [
    ({"num_draft_tokens": None}, "num_draft_tokens"),
    ({"num_spec_steps": -1}, "num_spec_steps"),
    ({"num_accepted_draft_tokens": "12"}, "num_accepted_draft_tokens"),
    ({"acceptance_histogram": [1, 1, 1, 0]}, "4 entries"),
    ({"num_spec_steps": 5}, "num_spec_steps=5"),
    ({"num_accepted_draft_tokens": 8}, "num_accepted_draft_tokens=8"),
    ({"num_draft_tokens": 6}, "7 accepted of 6"),
    ({"per_step_drafted": [4, 4, 2]}, "per-step arrays"),
    ({"per_step_drafted": None}, "only one of"),
    ({"per_step_accepted": [4, 1, 0, 3]}, "do not sum"),
])
def test_malformed_vllm_fields_are_refused_in_words(change, words):
    fields = {**VLLM_DETAILED["speculative_decoding"], **change}
    if change.get("num_draft_tokens", 0) is None:
        del fields["num_draft_tokens"]
    with pytest.raises(SpecvizError, match=words):
        vllm_spec({"speculative_decoding": fields})


def test_a_whole_number_sent_as_a_float_is_a_count():
    fields = {**VLLM_SUMMARY["speculative_decoding"], "num_draft_tokens": 14.0}
    assert vllm_spec(fields).drafted == 14
    with pytest.raises(SpecvizError, match="14.5"):
        vllm_spec({**fields, "num_draft_tokens": 14.5})


# ---------------------------------------------------------------- SGLang per request

# As TokenizerManager._calculate_spec_decoding_metrics writes it with speculative_num_draft_tokens
# = 4 (k = 3) after 5 verify steps keeping 3, 0, 2, 1, 1 drafts: correct = 7, proposed = 5 * 3,
# histogram (Req.update_spec_acceptance_histogram) [1, 2, 1, 1], completion_tokens = 1 + 5 + 7.
SGLANG_META = {
    "id": "b7c1", "finish_reason": {"type": "length", "length": 13}, "prompt_tokens": 9,
    "completion_tokens": 13, "cached_tokens": 0, "e2e_latency": 0.41,
    "spec_accept_rate": 7 / 15, "spec_accept_length": 13 / 5,
    "spec_num_correct_drafts": 7, "spec_num_proposed_drafts": 15, "spec_verify_ct": 5,
    "spec_accepted_drafts": 7, "spec_proposed_drafts": 15,
    "spec_correct_drafts_histogram": [1, 2, 1, 1], "spec_accept_histogram": [1, 2, 1, 1],
}
# An older server: spec_accept_token_num / spec_draft_token_num, 3 steps keeping 0, 1, 1 drafts.
SGLANG_OLD_META = {"completion_tokens": 6, "spec_accept_rate": 2 / 9, "spec_accept_length": 2.0,
                   "spec_accept_token_num": 2, "spec_draft_token_num": 9, "spec_verify_ct": 3,
                   "spec_accept_histogram": [1, 2]}


def test_sglang_meta_info_gives_alpha_and_tau_from_counts():
    stats = sglang_spec(SGLANG_META)
    assert (stats.engine, stats.drafted, stats.accepted, stats.steps, stats.k) == ("sglang", 15, 7, 5, 3)
    assert stats.acceptance_rate == pytest.approx(SGLANG_META["spec_accept_rate"])
    assert stats.mean_accepted_length == pytest.approx(1 + 7 / 5)
    # SGLang's own spec_accept_length counts the prefill token too: 13 / 5 = 1.4 + 1 + 1/5
    assert SGLANG_META["spec_accept_length"] == pytest.approx(stats.mean_accepted_length + 1 / 5)
    assert stats.histogram == (1, 2, 1, 1) and stats.per_step_accepted is None


def test_older_sglang_names_and_a_short_histogram():
    stats = sglang_spec(SGLANG_OLD_META)
    assert (stats.drafted, stats.accepted, stats.steps, stats.k) == (9, 2, 3, 3)
    assert stats.histogram == (1, 2, 0, 0)  # grown only to the largest j seen, padded to k + 1
    assert stats.mean_accepted_length == pytest.approx(1 + 2 / 3)


def test_sglang_through_native_generate_and_openai_chat():
    native = {"text": " 3 4 1 2", "output_ids": [1, 2], "meta_info": SGLANG_META}
    chat = {"id": "b7c1", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "3 4"}, "finish_reason": "length",
         "meta_info": SGLANG_META}], "usage": {"completion_tokens": 13}}
    assert spec_from_response(native) == spec_from_response(chat) == sglang_spec(SGLANG_META)
    raw = raw_spec_fields(chat)
    assert raw["spec_accept_length"] == 13 / 5 and "completion_tokens" not in raw and "id" not in raw
    assert set(raw) == {key for key in SGLANG_META if key.startswith("spec_")}
    # without return_meta_info the chat answer has no meta_info: nothing to read
    assert spec_from_response({"choices": [{"index": 0, "message": {"content": "3 4"}}]}) is None


def test_sglang_edge_cases():
    assert sglang_spec({"completion_tokens": 4, "e2e_latency": 0.1}) is None  # no speculation
    assert sglang_spec({"spec_verify_ct": 0}) == engines.SpecStats(engine="sglang", drafted=0, accepted=0, steps=0)
    with pytest.raises(SpecvizError, match="too old"):
        sglang_spec({"spec_verify_ct": 4, "spec_accept_length": 2.5})
    with pytest.raises(SpecvizError, match="spec_verify_ct"):
        sglang_spec({k: v for k, v in SGLANG_META.items() if k != "spec_verify_ct"})
    with pytest.raises(SpecvizError, match="spec_correct_drafts_histogram"):
        sglang_spec({**SGLANG_META, "spec_correct_drafts_histogram": {"0": 1}})
    with pytest.raises(SpecvizError, match="16 accepted of 15"):
        sglang_spec({**SGLANG_META, "spec_num_correct_drafts": 16, "spec_correct_drafts_histogram": None,
                     "spec_accept_histogram": None})


# ---------------------------------------------------------------- llama.cpp per request

# result_timings::to_json of a speculating request (draft_n/draft_n_accepted only when draft_n > 0)
LLAMACPP_TIMINGS = {"cache_n": 804, "prompt_n": 4, "prompt_ms": 128.301, "prompt_per_token_ms": 32.07525,
                    "prompt_per_second": 31.17668607415375, "predicted_n": 665, "predicted_ms": 20629.211,
                    "predicted_per_token_ms": 31.021369924812028, "predicted_per_second": 32.235842660196745,
                    "draft_n": 604, "draft_n_accepted": 515}


def test_llamacpp_timings_give_alpha_but_no_steps():
    stats = llamacpp_spec(LLAMACPP_TIMINGS)
    assert (stats.engine, stats.drafted, stats.accepted, stats.steps) == ("llama.cpp", 604, 515, None)
    assert stats.acceptance_rate == 515 / 604 and stats.mean_accepted_length is None
    final_chunk = {"choices": [], "object": "chat.completion.chunk", "usage": {"completion_tokens": 665},
                   "timings": LLAMACPP_TIMINGS}
    assert spec_from_response(final_chunk) == stats and raw_spec_fields(final_chunk) == LLAMACPP_TIMINGS
    undrafted = {k: v for k, v in LLAMACPP_TIMINGS.items() if not k.startswith("draft")}
    assert llamacpp_spec(undrafted) is None and spec_from_response({"timings": undrafted}) is None
    with pytest.raises(SpecvizError, match="draft_n_accepted"):
        llamacpp_spec({"draft_n": 4})
    with pytest.raises(SpecvizError, match="5 accepted of 4"):
        llamacpp_spec({"draft_n": 4, "draft_n_accepted": 5})


def test_llamacpp_timings_per_token_stream_gives_steps():
    """One chunk per token, running totals raised once per verify step before its tokens go out:
    prefill token, then steps drafting 4 keeping 2 (3 tokens), 4 keeping 4 (5), 3 keeping 0 (1)."""
    base = {"prompt_n": 4, "predicted_n": 1}
    chunks = [base] + [{**base, "draft_n": 4, "draft_n_accepted": 2}] * 3 + [None] \
        + [{**base, "draft_n": 8, "draft_n_accepted": 6}] * 5 + [{**base, "draft_n": 11, "draft_n_accepted": 6}] * 2
    stats = llamacpp_spec_from_chunks(chunks)
    assert stats.per_step_drafted == (4, 4, 3) and stats.per_step_accepted == (2, 4, 0)
    assert (stats.drafted, stats.accepted, stats.steps) == (11, 6, 3)
    assert stats.mean_accepted_length == 1 + 6 / 3 and stats.acceptance_rate == 6 / 11
    # draft i kept among steps that drafted at least i: 2/3, 2/3, 1/3, and 1/2 (the 3-draft step is out)
    assert stats.per_position_acceptance == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 2])
    assert llamacpp_spec_from_chunks([base, None, base]) is None
    with pytest.raises(SpecvizError, match="backwards"):
        llamacpp_spec_from_chunks([{"draft_n": 8, "draft_n_accepted": 6}, {"draft_n": 4, "draft_n_accepted": 2}])


# ---------------------------------------------------------------- Prometheus text

def test_parse_reads_labels_escapes_special_values_and_timestamps():
    text = "\n".join([
        "# HELP odd_metric A metric with \"hard\" labels.",
        "# TYPE odd_metric counter",
        'odd_metric{path="a,b",quote="say \\"hi\\", then }{",slash="c:\\\\dir",nl="one\\ntwo"} 3',
        "plain_metric 1.5e+03",
        "empty_braces{} 2",
        'spaced{ a = "1" , b="2", } 4 1712345678901',
        'hist_bucket{le="+Inf"} +Inf',
        "neg_inf -Inf",
        "not_a_number NaN",
        "colons:in:name_total 7 -5",
        "",
        "# EOF",
    ])
    samples = parse(text)
    assert samples[("odd_metric", (("nl", "one\ntwo"), ("path", "a,b"), ("quote", 'say "hi", then }{'),
                                   ("slash", "c:\\dir")))] == 3.0
    assert samples[("plain_metric", ())] == 1500.0 and samples[("empty_braces", ())] == 2.0
    assert samples[("spaced", (("a", "1"), ("b", "2")))] == 4.0
    assert samples[("hist_bucket", (("le", "+Inf"),))] == float("inf")
    assert samples[("neg_inf", ())] == float("-inf")
    assert samples[("not_a_number", ())] != samples[("not_a_number", ())]  # NaN
    assert samples[("colons:in:name_total", ())] == 7.0
    assert len(samples) == 8


@pytest.mark.parametrize("line, words", [
    ("9metric 1", "metric name"),
    ("metric", "value"),
    ("metric one", "not a number"),
    ("metric 1 2 3", "value"),
    ("metric 1 soon", "not a number"),
    ('metric{a="1" 2', "',' or '}'"),
    ('metric{a=1} 2', "not quoted"),
    ('metric{a="1} 2', "closing quote"),
    ('metric{a="\\x"} 2', "escape"),
    ('metric{a="1",a="2"} 2', "twice"),
    ('metric{="1"} 2', "label name"),
    ('metric{a="1"}2', "value"),
])
def test_parse_refuses_a_malformed_line_by_number(line, words):
    with pytest.raises(SpecvizError, match=f"line 2: .*{words}"):
        parse("# fine\n" + line)


# Excerpts of the real vLLM 0.32 server's /metrics before and after the two requests above
# (each: 3 steps, 4 drafts drafted and kept), with neighbours that must not be mixed in.
REAL_METRICS_BEFORE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="SmolLM2-135M-Instruct"} 54.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="SmolLM2-135M-Instruct"} 1.7960613952212527e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="SmolLM2-135M-Instruct"} 215.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="SmolLM2-135M-Instruct"} 31.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="SmolLM2-135M-Instruct",position="0"} 14.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="SmolLM2-135M-Instruct",position="1"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="SmolLM2-135M-Instruct",position="2"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="SmolLM2-135M-Instruct",position="3"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="SmolLM2-135M-Instruct",position="0"} 1.7960613952213542e+09
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="SmolLM2-135M-Instruct"} 116.0
"""
REAL_METRICS_AFTER = (REAL_METRICS_BEFORE
                      .replace("} 54.0", "} 60.0").replace("} 215.0", "} 239.0").replace("} 31.0", "} 55.0")
                      .replace('"0"} 14.0', '"0"} 20.0').replace('"1"} 7.0', '"1"} 13.0')
                      .replace('"2"} 6.0', '"2"} 12.0').replace('"3"} 4.0', '"3"} 10.0'))


def test_real_vllm_counters_change_by_what_the_two_requests_reported():
    before, after = spec_counters(parse(REAL_METRICS_BEFORE)), spec_counters(parse(REAL_METRICS_AFTER))
    assert before == SpecCounters(54.0, 215.0, 31.0, (14.0, 7.0, 6.0, 4.0))
    # 215 draft tokens over 54 drafts: some ngram steps drafted fewer than k = 4
    assert before.draft_tokens < 4 * before.drafts
    run = after - before
    per_request = spec_from_response(REAL_VLLM_BODY)
    assert (run.drafts, run.draft_tokens, run.accepted_tokens) == (2 * per_request.steps, 2 * per_request.drafted,
                                                                   2 * per_request.accepted) == (6, 24, 24)
    assert run.acceptance_rate == 1.0 and run.mean_accepted_length == 5.0
    assert run.per_position_acceptance == [1.0, 1.0, 1.0, 1.0]
    assert before.mean_accepted_length == pytest.approx(1 + 31 / 54)


# Generated by vLLM 0.32's own SpecDecodingProm (k = 3) with two engines (data parallel):
# engine 0 observed steps (drafted, kept) (3, 3), (3, 1), (2, 0), (3, 2); engine 1 observed (3, 3).
VLLM_OWN_TEXT = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 4.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 1.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7961e+09
vllm:spec_decode_num_drafts_created{engine="1",model_name="m"} 1.7961e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 11.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 3.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 6.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 3.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="2"} 1.0
"""


def test_vllm_counters_sum_over_engines_and_give_rates_by_hand():
    counters = spec_counters(parse(VLLM_OWN_TEXT))
    assert counters == SpecCounters(drafts=5.0, draft_tokens=14.0, accepted_tokens=9.0,
                                    accepted_per_position=(4.0, 3.0, 2.0))
    assert counters.acceptance_rate == 9 / 14
    assert counters.mean_accepted_length == 1 + 9 / 5
    # over all 5 drafting steps, the (2, 0) step included at position 3 although it drafted only 2
    assert counters.per_position_acceptance == pytest.approx([4 / 5, 3 / 5, 2 / 5])
    assert counters.to_dict() == {
        "drafts": 5.0, "draft_tokens": 14.0, "accepted_tokens": 9.0, "accepted_per_position": [4.0, 3.0, 2.0],
        "acceptance_rate": 9 / 14, "mean_accepted_length": 2.8,
        "per_position_acceptance": counters.per_position_acceptance}


def test_counters_missing_restarted_or_from_llamacpp():
    assert spec_counters(parse("vllm:num_requests_running 1\n")) is None
    assert spec_counters(parse('vllm:spec_decode_num_drafts_total{engine="0"} 3\n')) is None  # not all three
    empty = SpecCounters(0.0, 0.0, 0.0)
    assert empty.acceptance_rate == 0.0 and empty.mean_accepted_length is None and empty.per_position_acceptance == []
    counters = spec_counters(parse(VLLM_OWN_TEXT))
    with pytest.raises(SpecvizError, match="restarted"):
        SpecCounters(1.0, 3.0, 2.0, (1.0, 1.0)) - counters
    assert (counters - SpecCounters(1.0, 2.0, 1.0, (1.0,))).accepted_per_position == (3.0, 3.0, 2.0)
    llamacpp = VLLM_OWN_TEXT.replace("vllm:", "llamacpp:")
    assert spec_counters(parse(llamacpp)) == spec_counters(parse(llamacpp), prefix="llamacpp:") == counters
    assert spec_counters(parse(llamacpp), prefix="vllm:") is None
    with pytest.raises(SpecvizError, match="position"):
        spec_counters(parse(VLLM_OWN_TEXT + 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="x"} 1\n'))


def test_sglang_counters_give_tokens_per_verify():
    before = parse('sglang:spec_verify_calls_total{model_name="m"} 100.0\n'
                   'sglang:generation_tokens_total{is_streaming="false",model_name="m"} 250.0\n'
                   'sglang:generation_tokens_total{is_streaming="true",model_name="m"} 50.0\n'
                   'sglang:spec_accept_length{model_name="m"} 2.9\n')
    after = parse('sglang:spec_verify_calls_total{model_name="m"} 110.0\n'
                  'sglang:generation_tokens_total{is_streaming="false",model_name="m"} 276.0\n'
                  'sglang:generation_tokens_total{is_streaming="true",model_name="m"} 50.0\n')
    assert sglang_counters(before) == SGLangCounters(100.0, 300.0)
    run = sglang_counters(after) - sglang_counters(before)
    assert run == SGLangCounters(10.0, 26.0) and run.tokens_per_verify == 2.6
    assert sglang_counters(parse(VLLM_OWN_TEXT)) is None and spec_counters(before) is None
    assert SGLangCounters(0.0, 0.0).to_dict() == {"verify_calls": 0.0, "generation_tokens": 0.0,
                                                  "tokens_per_verify": None}
    with pytest.raises(SpecvizError, match="restarted"):
        sglang_counters(before) - sglang_counters(after)


# ---------------------------------------------------------------- fetching /metrics

@pytest.fixture(scope="module")
def metrics_server():
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = VLLM_OWN_TEXT.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_fetch_reads_the_metrics_page(metrics_server):
    assert prometheus.fetch(metrics_server) == VLLM_OWN_TEXT
    assert prometheus.fetch(metrics_server + "/") == prometheus.fetch(metrics_server + "/metrics") == VLLM_OWN_TEXT


def test_fetch_failures_are_one_clear_sentence(metrics_server):
    with pytest.raises(SpecvizError, match="HTTP 404"):
        prometheus.fetch(metrics_server + "/nowhere")  # no page at /nowhere/metrics
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(SpecvizError, match=f"could not read {closed}/metrics"):
        prometheus.fetch(closed, timeout_s=1)
    with pytest.raises(SpecvizError, match="could not read"):
        prometheus.fetch("not a url")


def test_the_metrics_page_is_at_the_servers_root_whatever_form_its_url_takes():
    from specviz.serving.prometheus import metrics_url

    for url in ("http://127.0.0.1:8000", "http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1",
                "http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/metrics"):
        assert metrics_url(url) == "http://127.0.0.1:8000/metrics"
