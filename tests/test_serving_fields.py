"""Reading serving engines' speculation fields: vLLM's per-request metrics, SGLang's meta_info and
llama.cpp's timings, from inputs in the engines' own shapes (real responses of a vLLM 0.32
server, the rest built the way the engines' source builds them), with alpha, tau and
per-position rates checked by hand."""
from __future__ import annotations

import json

import pytest

from specviz.errors import SpecvizError
from specviz.serving import engines
from specviz.serving.engines import (llamacpp_spec, llamacpp_spec_from_chunks, raw_spec_fields, sglang_spec,
                                     spec_from_response, vllm_spec)

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
