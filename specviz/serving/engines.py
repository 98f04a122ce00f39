"""Each serving engine's own per-request speculation fields, read into records.SpecStats.

Pure functions over parsed JSON: no HTTP here (client.py fetches, this module reads). Every
reader returns None when the response carries none of its engine's speculation fields (a
server without speculation, or with the per-request report switched off), and raises
SpecvizError when the fields are there but wrong (a missing member, a negative count, totals
that contradict each other): a silently wrong acceptance rate is worse than a refusal.

What the engines tell, and where (read from their source, not guessed):

vLLM 0.32  `metrics.speculative_decoding` of the response body (non-streamed), or of the final
    usage chunk of a stream (sent only with `stream_options.include_usage`); present when the
    server runs with `--per-request-spec-decode-metrics summary|detailed`, and only for
    single-sequence requests (`n == 1`). Built by RequestSpecDecodeMetrics.to_dict
    (vllm/v1/metrics/stats.py), typed by SpeculativeDecodingMetrics
    (vllm/entrypoints/generate/base/protocol.py), filled per verify step by
    Scheduler.update_from_output (vllm/v1/core/sched/scheduler.py). Per step, totals, a
    histogram, and at `detailed` the per-step arrays.
SGLang  `meta_info` of the native /generate response; on /v1/chat/completions only when the
    request sets `return_meta_info: true` (non-streamed only: a stream refuses it), then as
    `choices[i].meta_info` (python/sglang/srt/entrypoints/openai/serving_chat.py,
    _build_chat_response). /v1/completions does not pass meta_info on at all. The spec_*
    fields are written once, when the request finishes, by
    TokenizerManager._calculate_spec_decoding_metrics
    (python/sglang/srt/managers/tokenizer_manager.py), from Req.spec_verify_ct /
    spec_accepted_tokens / spec_acceptance_histogram counted in the scheduler's output
    processor. Totals and a histogram; the drafted count is nominal (steps x k).
llama.cpp  `timings` of the response (/completion, /v1/completions, /v1/chat/completions, and the
    final stream chunk; every chunk with `timings_per_token`), from server_slot_stats::to_json
    (tools/server/server-common.cpp; result_timings in server-task.cpp before), which adds
    draft_n / draft_n_accepted only when draft_n > 0. Totals only, no step count.

What no engine tells: which drafted token was rejected, or what the rejected drafts were (no
engine returns draft token ids), or the draft and target probabilities behind a verdict. So a
server run can say how many drafts a step kept, never colour the one that failed.
"""
from __future__ import annotations

from collections.abc import Iterable

from ..core.errors import SpecvizError
from specviz.serving.records import SpecStats

# SGLang renamed its counters; the old names are still sent as aliases ("FIXME:
# backward-compat aliases, remove in next release"), older servers send only the old ones.
SGLANG_ACCEPTED = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
SGLANG_DRAFTED = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
SGLANG_HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")
SGLANG_STEPS = "spec_verify_ct"
SGLANG_KEYS = (SGLANG_STEPS, *SGLANG_ACCEPTED, *SGLANG_DRAFTED, *SGLANG_HISTOGRAM)

LLAMACPP_KEYS = ("draft_n", "draft_n_accepted")


def _count(fields: dict, key: str, engine: str) -> int:
    """A non-negative whole number from an engine's field (JSON may carry 12.0 for 12)."""
    if key not in fields:
        raise SpecvizError(f"{engine}'s speculation fields have no {key!r} (got {sorted(fields)})")
    value = fields[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecvizError(f"{engine} sent {key}={value!r}; expected a count (a whole number >= 0)")
    return value


def _counts(fields: dict, key: str, engine: str) -> tuple[int, ...] | None:
    """A list of counts, or None when the field is absent or null."""
    value = fields.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise SpecvizError(f"{engine} sent {key}={value!r}; expected a list of counts")
    return tuple(_count({key: v}, key, engine) for v in value)


def _first_key(fields: dict, keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if fields.get(k) is not None), None)


def _check(ok: bool, engine: str, what: str) -> None:
    if not ok:
        raise SpecvizError(f"{engine}'s speculation fields contradict each other: {what}")


# ---------------------------------------------------------------- vLLM

def _vllm_fields(metrics) -> dict | None:
    """The SpeculativeDecodingMetrics dict, given the response's `metrics` object (or that dict)."""
    if not isinstance(metrics, dict):
        return None
    if "speculative_decoding" in metrics:
        inner = metrics["speculative_decoding"]
        return inner if isinstance(inner, dict) else None
    return metrics if "num_draft_tokens" in metrics else None


def vllm_spec(metrics: dict) -> SpecStats | None:
    """vLLM's per-request `metrics.speculative_decoding`, as SpecStats (None when absent/null).

    `metrics` is the response's `metrics` object (PerRequestMetrics); its
    `speculative_decoding` dict itself is accepted too. Fields (RequestSpecDecodeMetrics.to_dict):
      num_draft_tokens           drafted tokens, summed over steps (grammar-invalidated drafts
                                 taken off) -> drafted
      num_accepted_draft_tokens  sum of j * histogram[j]: kept drafts, bonus excluded -> accepted
      num_spec_steps             sum(histogram): verify steps that drafted -> steps
      num_spec_tokens            the configured num_speculative_tokens -> k
      acceptance_histogram       [j] = steps that kept exactly j drafts, length k + 1 -> histogram
      per_step_accepted/_drafted at `detailed` only, one entry per verify step that drafted
      mean_acceptance_length     1 + accepted/steps (bonus included; 1.0 with no step): our tau
      draft_acceptance_rate      accepted/drafted (0.0 with no draft): our alpha
    The two rates are not copied: SpecStats derives them from the counts, the same way.

    A step enters only when the scheduler sent drafts for the request (an ngram drafter that
    finds no match drafts nothing, and that step is not counted), and a step may draft fewer
    than k (ngram stops at the end of the matched text; drafts are cut near max_model_len).
    The first token (from prefill) is in no step, so completion_tokens = 1 + steps + accepted,
    or fewer when a stop (EOS, stop string, max_tokens) cut the last step short: the scheduler
    counts that step's kept drafts before the stop throws the surplus away.
    """
    fields = _vllm_fields(metrics)
    if fields is None:
        return None
    engine = "vLLM"
    drafted = _count(fields, "num_draft_tokens", engine)
    accepted = _count(fields, "num_accepted_draft_tokens", engine)
    steps = _count(fields, "num_spec_steps", engine)
    k = _count(fields, "num_spec_tokens", engine)
    histogram = _counts(fields, "acceptance_histogram", engine)
    if histogram is None:
        raise SpecvizError("vLLM's speculation fields have no 'acceptance_histogram'")
    per_step_accepted = _counts(fields, "per_step_accepted", engine)
    per_step_drafted = _counts(fields, "per_step_drafted", engine)
    _check(len(histogram) == k + 1, engine, f"acceptance_histogram has {len(histogram)} entries for k={k}")
    _check(sum(histogram) == steps, engine, f"the histogram counts {sum(histogram)} steps, num_spec_steps={steps}")
    _check(sum(j * n for j, n in enumerate(histogram)) == accepted, engine,
           f"the histogram keeps {sum(j * n for j, n in enumerate(histogram))} drafts, "
           f"num_accepted_draft_tokens={accepted}")
    _check(accepted <= drafted, engine, f"{accepted} accepted of {drafted} drafted")
    if (per_step_accepted is None) != (per_step_drafted is None):
        raise SpecvizError("vLLM sent only one of per_step_accepted / per_step_drafted")
    if per_step_accepted is not None:
        _check(len(per_step_accepted) == len(per_step_drafted) == steps, engine,
               f"per-step arrays of {len(per_step_accepted)} and {len(per_step_drafted)} for {steps} steps")
        _check(sum(per_step_accepted) == accepted and sum(per_step_drafted) == drafted, engine,
               "the per-step arrays do not sum to the totals")
        _check(all(a <= d for a, d in zip(per_step_accepted, per_step_drafted)), engine,
               "a step kept more drafts than it drafted")
    return SpecStats(engine="vllm", drafted=drafted, accepted=accepted, steps=steps, k=k,
                     per_step_accepted=per_step_accepted, per_step_drafted=per_step_drafted,
                     histogram=histogram)


# ---------------------------------------------------------------- SGLang

def sglang_spec(meta_info: dict) -> SpecStats | None:
    """SGLang's per-request spec_* fields of `meta_info`, as SpecStats (None when absent).

    Fields (TokenizerManager._calculate_spec_decoding_metrics, written when the request finishes
    and only when spec_verify_ct > 0):
      spec_verify_ct            verify (target) passes of this request -> steps. Counted once per
                                verify in the scheduler (req.spec_verify_ct += 1).
      spec_num_correct_drafts   kept draft tokens, bonus excluded (accept_length - 1 per step)
                                -> accepted. Older servers: spec_accept_token_num; alias
                                spec_accepted_drafts.
      spec_num_proposed_drafts  spec_verify_ct * (speculative_num_draft_tokens - 1): NOMINAL, not
                                what the drafter actually offered -> drafted. Older:
                                spec_draft_token_num; alias spec_proposed_drafts.
      spec_accept_rate          accepted / drafted (nominal): our alpha, recomputed.
      spec_accept_length        completion_tokens / spec_verify_ct: the bonus is in, and so is
                                the first token, which came from prefill and no verify step, so
                                it runs above our tau = 1 + accepted/steps by about 1/steps.
                                Kept only in the raw fields.
      spec_correct_drafts_histogram (alias and older name spec_accept_histogram): [j] = steps
                                that kept exactly j drafts, grown only as far as the largest j
                                seen; padded with zeros to k + 1 here. Counted apart from the
                                accepted total (in different places by SGLang's worker
                                versions), so it is not checked against it.
    k is drafted / steps (= speculative_num_draft_tokens - 1). With a chain drafter (EAGLE
    topk=1) that is the draft length; with a tree (topk > 1) it is the tree's node count, and
    accepted/drafted is then a share of tree nodes, not of chain positions.
    No per-step arrays: SGLang keeps only totals and the histogram per request.
    """
    if not isinstance(meta_info, dict) or not any(meta_info.get(key) is not None for key in SGLANG_KEYS):
        return None
    engine = "SGLang"
    steps = _count(meta_info, SGLANG_STEPS, engine)
    accepted_key, drafted_key = _first_key(meta_info, SGLANG_ACCEPTED), _first_key(meta_info, SGLANG_DRAFTED)
    if accepted_key is None or drafted_key is None:
        if steps == 0:  # speculation on, but the request never reached a verify step
            return SpecStats(engine="sglang", drafted=0, accepted=0, steps=0)
        raise SpecvizError(f"SGLang sent spec_verify_ct={steps} but no accepted/drafted counts "
                           f"({' / '.join(SGLANG_ACCEPTED)}): too old a server to tell acceptance")
    accepted = _count(meta_info, accepted_key, engine)
    drafted = _count(meta_info, drafted_key, engine)
    _check(accepted <= drafted, engine, f"{accepted} accepted of {drafted} drafted")
    k = drafted // steps if steps and drafted % steps == 0 else None
    histogram_key = _first_key(meta_info, SGLANG_HISTOGRAM)
    histogram = _counts(meta_info, histogram_key, engine) if histogram_key else None
    if histogram is not None and k is not None and len(histogram) <= k + 1:
        histogram = histogram + (0,) * (k + 1 - len(histogram))
    return SpecStats(engine="sglang", drafted=drafted, accepted=accepted, steps=steps, k=k, histogram=histogram)


# ---------------------------------------------------------------- llama.cpp

def _llamacpp_totals(timings: dict) -> tuple[int, int]:
    engine = "llama.cpp"
    drafted, accepted = _count(timings, "draft_n", engine), _count(timings, "draft_n_accepted", engine)
    _check(accepted <= drafted, engine, f"{accepted} accepted of {drafted} drafted")
    return drafted, accepted


def llamacpp_counters(timings: dict) -> tuple[int, int]:
    """A llama.cpp chunk's running (draft_n, draft_n_accepted): (0, 0) while nothing has been
    drafted, since to_json leaves both out until then."""
    return _llamacpp_totals(timings) if any(key in timings for key in LLAMACPP_KEYS) else (0, 0)


def llamacpp_spec(timings: dict) -> SpecStats | None:
    """llama.cpp server's per-request `timings.draft_n` / `draft_n_accepted` (None when absent).

    server_slot_stats::to_json (tools/server/server-common.cpp) adds both only when draft_n > 0, so a
    request that drafted nothing looks like one from a server without speculation: None.
      draft_n           draft tokens sent to the target for verification, summed -> drafted
      draft_n_accepted  kept drafts, bonus excluded (server-context.cpp counts
                        `ids.size() - 1` per verify step) -> accepted
    No step count per request: the slot counts its verify steps (n_draft_verif_steps) but only
    /metrics shows them, summed over all requests (llamacpp:spec_decode_num_drafts_total), so
    steps, k and tau stay unknown here. See llamacpp_spec_from_chunks for a stream.
    """
    if not isinstance(timings, dict) or not any(key in timings for key in LLAMACPP_KEYS):
        return None
    drafted, accepted = _llamacpp_totals(timings)
    return SpecStats(engine="llama.cpp", drafted=drafted, accepted=accepted)


def llamacpp_spec_from_chunks(timings_seq: Iterable[dict | None]) -> SpecStats | None:
    """Per-step counts from a stream requested with `"timings_per_token": true`.

    Then every streamed chunk carries the request's running `timings` (send_partial_response in
    server-context.cpp). llama.cpp streams one chunk per token, and raises its draft counters
    once per verify step, before that step's tokens go out, so all chunks of a step show the
    same running totals and each change between consecutive chunks is one verify step: its
    delta is what that step drafted and kept. None when no chunk carries draft counters.

    Limits: a step whose tokens all stay unsent (held back as a possible stop string or an
    unfinished UTF-8 character) shows up merged into the next change; chunks without timings
    (None) are skipped. So steps here can only undercount, never invent a step.
    """
    previous, saw_counters = (0, 0), False
    per_step_drafted: list[int] = []
    per_step_accepted: list[int] = []
    for timings in timings_seq:
        if not isinstance(timings, dict):
            continue
        saw_counters = saw_counters or any(key in timings for key in LLAMACPP_KEYS)
        current = llamacpp_counters(timings)
        if current == previous:
            continue
        drafted, accepted = current[0] - previous[0], current[1] - previous[1]
        if drafted < 0 or accepted < 0:
            raise SpecvizError(f"llama.cpp's running draft counters went backwards: {previous} -> {current}")
        per_step_drafted.append(drafted)
        per_step_accepted.append(accepted)
        previous = current
    if not saw_counters:
        return None
    return SpecStats(engine="llama.cpp", drafted=previous[0], accepted=previous[1], steps=len(per_step_drafted),
                     per_step_accepted=tuple(per_step_accepted), per_step_drafted=tuple(per_step_drafted))


# ---------------------------------------------------------------- a whole response

def _sglang_meta_info(body: dict) -> dict | None:
    """Native /generate: body["meta_info"]; OpenAI chat with return_meta_info: choices[0]["meta_info"]."""
    candidates = [body.get("meta_info")]
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        candidates.append(choices[0].get("meta_info"))
    return next((m for m in candidates
                 if isinstance(m, dict) and any(m.get(key) is not None for key in SGLANG_KEYS)), None)


def _engine_fields(body) -> tuple[str, dict] | None:
    """(engine, the dict its speculation fields live in) for whichever engine's fields are present."""
    if not isinstance(body, dict):
        return None
    fields = _vllm_fields(body.get("metrics"))
    if fields is not None:
        return "vllm", fields
    meta_info = _sglang_meta_info(body)
    if meta_info is not None:
        return "sglang", meta_info
    timings = body.get("timings")
    if isinstance(timings, dict) and any(key in timings for key in LLAMACPP_KEYS):
        return "llama.cpp", timings
    return None


def read_spec(body) -> tuple[SpecStats | None, dict]:
    """(spec_from_response(body), raw_spec_fields(body)) from one look for the engine's fields:
    the stream reader wants both from every chunk."""
    found = _engine_fields(body)
    if found is None:
        return None, {}
    engine, fields = found
    return _READERS[engine](fields), _raw(engine, fields)


def spec_from_response(body: dict) -> SpecStats | None:
    """The speculation report of a whole response or a stream's final chunk, whichever engine sent it.

    vLLM: body["metrics"]["speculative_decoding"]; SGLang: body["meta_info"] or
    body["choices"][0]["meta_info"] (with n > 1 only the first choice is read); llama.cpp:
    body["timings"]. None when the body carries none of them.
    """
    return read_spec(body)[0]


def raw_spec_fields(body: dict) -> dict:
    """The engine's speculation fields exactly as sent, for `server.raw` in JSON output ({} if none).

    vLLM: the whole speculative_decoding dict; SGLang: the spec_* members of meta_info (the rest
    of meta_info can hold every token's log-probs); llama.cpp: the whole timings dict.
    """
    found = _engine_fields(body)
    return {} if found is None else _raw(*found)


def _raw(engine: str, fields: dict) -> dict:
    if engine == "sglang":
        return {key: value for key, value in fields.items() if key.startswith("spec_")}
    return dict(fields)


_READERS = {"vllm": vllm_spec, "sglang": sglang_spec, "llama.cpp": llamacpp_spec}
