"""What state a server is in when a run shows no drafting, said in one sentence for the engine
in front of us (never a vLLM flag to a llama.cpp user).

probe() looks (GET /metrics, and llama.cpp's /slots); explain() is pure. What the engines show:
  llama.cpp  /metrics only with `--metrics` (else 501, "Start it with `--metrics`"); its
             llamacpp:spec_decode_* counters are written whether or not it speculates, so they
             cannot tell "off" from "nothing drafted". /slots (on by default) gives each slot's
             `speculative` (can_speculate(): a drafter is loaded) and `params["speculative.types"]`
             (tools/server/server-context.cpp, server_slot::to_json; server-task.cpp).
  vLLM       registers vllm:spec_decode_* only when speculation is configured; the per-request
             counts need --per-request-spec-decode-metrics.
  SGLang     sglang:spec_verify_calls_total; per-request counts only on non-streamed requests.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from ..core.errors import SpecvizError
from . import prometheus
from .records import ServerRun

ENGINES = {"vllm:": "vllm", "llamacpp:": "llama.cpp", "sglang:": "sglang"}
NAMES = {"vllm": "vLLM", "llama.cpp": "llama.cpp", "sglang": "SGLang"}
# How to turn speculation on, per engine.
FLAGS = {
    "llama.cpp": "start llama-server with --spec-type ngram-mod (n-gram lookup, no second model) "
                 "or -md DRAFT.gguf (a small draft model)",
    "vllm": "start vLLM with --speculative-config, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
            "\"prompt_lookup_max\": 4}'",
    "sglang": "start SGLang with --speculative-algorithm (e.g. EAGLE with --speculative-draft-model-path)",
}
NGRAM = ("an n-gram drafter drafts only when the text repeats a long enough piece of what came before "
         "(llama.cpp's ngram-simple needs a 12-token match by default, ngram-mod 24), so a short chat may draft "
         "nothing: try a prompt that copies text, or a shorter match (--spec-ngram-simple-size-n, "
         "--spec-ngram-mod-n-match)")


@dataclass(frozen=True)
class Probe:
    """What a server shows about its speculation besides the response."""

    metrics: str  # "ok", "off" (the engine answered that /metrics is not enabled), "unreachable"
    engine: str | None = None  # from the /metrics names, or llama.cpp's 501 sentence
    spec_counters: bool = False  # /metrics has speculation counters for that engine
    speculative: bool | None = None  # llama.cpp /slots: a drafter is loaded (None: unknown)
    spec_types: str | None = None  # llama.cpp /slots: params["speculative.types"]


def _get(url: str, timeout_s: float) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"User-Agent": "specviz"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        try:
            return e.code, e.read().decode("utf-8", "replace")
        except OSError:
            return e.code, ""


def probe(url: str, timeout_s: float = 5.0) -> Probe:
    """GET /metrics (and /slots for llama.cpp); never raises for a server that does not answer."""
    root = prometheus.metrics_url(url)[: -len("/metrics")]
    try:
        status, text = _get(root + "/metrics", timeout_s)
    except (OSError, ValueError):
        return Probe("unreachable")
    if status != 200:
        llamacpp = "--metrics" in text  # "This server does not support metrics endpoint. Start it with `--metrics`"
        found = Probe("off" if status in (404, 501) else "unreachable", "llama.cpp" if llamacpp else None)
    else:
        try:
            samples = prometheus.parse(text)
        except SpecvizError:
            return Probe("unreachable")
        names = {name for name, _ in samples}
        engine = next((e for prefix, e in ENGINES.items() if any(n.startswith(prefix) for n in names)), None)
        counters = (prometheus.sglang_counters(samples) is not None if engine == "sglang"
                    else engine is not None and prometheus.spec_counters(samples, engine.replace(".", "") + ":")
                    is not None)
        found = Probe("ok", engine, counters)
    if found.engine in (None, "llama.cpp"):
        try:
            status, text = _get(root + "/slots", timeout_s)
            slots = json.loads(text) if status == 200 else None
        except (OSError, ValueError):
            slots = None
        if isinstance(slots, list) and slots and all(isinstance(s, dict) and "speculative" in s for s in slots):
            types = next((s.get("params", {}).get("speculative.types") for s in slots
                          if isinstance(s.get("params"), dict)), None)
            found = Probe(found.metrics, "llama.cpp", found.spec_counters,
                          any(bool(s["speculative"]) for s in slots), types if isinstance(types, str) else None)
    return found


def explain(run: ServerRun | None, found: Probe | None = None) -> str | None:
    """One sentence on why a run shows no drafting (None when it drafted, or had nothing to show)."""
    if run is None:
        return None
    s = run.spec
    if s is not None and s.drafted:
        return None
    engine = run.engine or (s.engine if s else None) or (found.engine if found else None)
    name = NAMES.get(engine, engine)
    metrics = found.metrics if found else None
    if engine == "llama.cpp":
        speculative = found.speculative if found else None
        if speculative:
            types = f" ({found.spec_types})" if found.spec_types and found.spec_types != "none" else ""
            said = f"Speculation is on{types} but llama.cpp drafted nothing for this request: {NGRAM}."
        elif speculative is False:
            said = f"This llama.cpp server is not speculating: {FLAGS['llama.cpp']}."
        else:
            said = (f"llama.cpp sent no draft counters: nothing was drafted for this request, or speculation is off "
                    f"(to turn it on, {FLAGS['llama.cpp']}).")
        if metrics == "off":
            said += " Its /metrics answered that it is off: start llama-server with --metrics for its counters."
        return said
    if s is not None:  # the engine's fields are there, with nothing drafted
        return f"Speculation is on but {name} drafted nothing for this request: {NGRAM.split(' (')[0]}."
    if engine == "vllm":
        if found and found.spec_counters:
            return ("This vLLM server speculates but sent no per-request counts: start it with "
                    "--per-request-spec-decode-metrics summary (or detailed, for per-step counts).")
        return f"This vLLM server is not speculating: {FLAGS['vllm']}."
    if engine == "sglang":
        return ("SGLang gives per-request speculation counts only on non-streamed requests, and this view streams"
                + ("; its /metrics shows its speculation counters." if found and found.spec_counters else
                   f"; if it is not speculating, {FLAGS['sglang']}."))
    if metrics == "off":
        return ("The server sent no speculation fields, and its /metrics is off: specviz cannot tell which "
                "engine this is or whether it speculates.")
    return ("The server sent no speculation fields that specviz reads (it reads vLLM, SGLang and llama.cpp), and "
            "its /metrics names none of those engines: it may not be speculating, or be an engine specviz "
            "does not know.")
