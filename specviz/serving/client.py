"""One streamed completion from an OpenAI-compatible server, chunk by chunk.

Only the standard library: a server run must not need anything the app does not already have.
The request asks for usage on every chunk (`stream_options.continuous_usage_stats`, vLLM's and
SGLang's extension), so each chunk's token count is known; a server that refuses the option is
asked again without it, and then the chunk counts stay unknown (None).
"""
from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Callable

from ..core.errors import SpecvizError
from ..modeling.chat import chat_messages
from . import engines
from .records import Chunk, ServerRun
from .urls import base_url

USER_AGENT = "specviz"


def get_json(url: str, path: str, timeout_s: float = 10.0) -> dict:
    """GET base + path as JSON; a sentence naming the server when it does not answer."""
    base = base_url(url)
    try:
        with urllib.request.urlopen(_request(base + path), timeout=timeout_s) as r:
            return json.loads(r.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise SpecvizError(f"the server at {base} did not answer {path}: {_reason(e)}") from None


def server_model(url: str, timeout_s: float = 10.0) -> str:
    """The first model the server lists (GET /v1/models)."""
    data = get_json(url, "/v1/models", timeout_s).get("data") or []
    if not data or not isinstance(data[0], dict) or "id" not in data[0]:
        raise SpecvizError(f"the server at {base_url(url)} lists no model at /v1/models")
    return str(data[0]["id"])


def server_version(url: str, timeout_s: float = 5.0) -> str | None:
    """The version a server reports of itself: llama.cpp's build in /props ("b8681-..."), vLLM's
    /version ("0.32.0"); None when it tells neither."""
    for path, field in (("/props", "build_info"), ("/version", "version")):
        try:
            data = get_json(url, path, timeout_s)
        except SpecvizError:
            continue
        if isinstance(data, dict) and data.get(field):
            return str(data[field])
    return None


def stream_completion(url: str, prompt: str, *, model: str | None = None, max_tokens: int = 128,
                      temperature: float = 0.0, seed: int | None = None, chat: bool = True,
                      timeout_s: float = 120.0, on_chunk: Callable[[ServerRun], None] | None = None,
                      stop: Callable[[], bool] | None = None, messages: list[dict] | None = None,
                      params: dict | None = None) -> ServerRun:
    """Stream one completion: chat messages (chat=True) or a raw prompt (/v1/completions).

    Never raises for a failed request: the run keeps what arrived and says why in `.error`
    (a load sweep counts failures; the CLI prints them). Raises SpecvizError only for a URL
    that is not one. `on_chunk(run)` is called after every chunk; `stop()` returning True
    closes the stream early (the run keeps its chunks, error "stopped"). `messages` (chat only)
    sends a whole conversation instead of `prompt` as one user turn. `params`: more request fields
    (sampling settings such as top_k), sent as given."""
    base = base_url(url)
    run = ServerRun(url=base, model=model or "")
    if not run.model:
        try:
            run.model = server_model(base, min(timeout_s, 10.0))
        except SpecvizError as e:
            run.error = str(e)
            return run
    body = {"model": run.model, "max_tokens": int(max_tokens), "temperature": float(temperature),
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            # llama.cpp's server then puts its running draft counters on every chunk, from which
            # engines.llamacpp_spec_from_chunks rebuilds the steps; other engines ignore it.
            "timings_per_token": True}
    if seed is not None:
        body["seed"] = int(seed)
    body.update(params or {})
    if chat:
        body["messages"] = messages or chat_messages([("user", prompt)])
    else:
        body["prompt"] = prompt
    path = "/v1/chat/completions" if chat else "/v1/completions"
    start = time.perf_counter()
    try:
        try:
            response = _post(base + path, body, timeout_s)
        except urllib.error.HTTPError as e:
            if e.code != 400 or "continuous_usage_stats" not in _error_text(e):
                raise
            body["stream_options"] = {"include_usage": True}  # a server without per-chunk usage
            response = _post(base + path, body, timeout_s)
        with response:
            _read_stream(response, run, start, chat, on_chunk, stop)
    except urllib.error.HTTPError as e:
        run.error = f"the server at {base} answered {e.code}: {_error_message(_error_text(e))[:300]}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        run.error = f"the server at {base} failed: {_reason(e)}"
    run.elapsed_s = time.perf_counter() - start
    return run


def _read_stream(response, run: ServerRun, start: float, chat: bool, on_chunk, stop) -> None:
    """A streamed completion's chunks into `run`: text, per-chunk token counts, the engine's numbers."""
    predicted = 0  # llama.cpp: tokens its running timings.predicted_n so far accounts for
    untimed = False  # has a chunk with text but no timings come since that count?
    timings = []  # llama.cpp: each chunk's running draft counters
    for event in _sse_events(response):
        t = time.perf_counter() - start
        if "error" in event and not event.get("choices"):
            run.error = f"the server reported: {str(event['error'])[:300]}"
            break
        usage = event.get("usage") or {}
        text, finish = _chunk_text(event, chat)
        tokens, drafts = None, None
        timed = event.get("timings") if isinstance(event.get("timings"), dict) else None
        if usage.get("completion_tokens") is not None:
            tokens = int(usage["completion_tokens"]) - (run.completion_tokens or 0)  # what this chunk adds to the usage
            run.completion_tokens = int(usage["completion_tokens"])
        if timed is not None:  # llama.cpp (with timings_per_token, on every chunk)
            run.engine, run.timings = "llama.cpp", timed
            drafts = engines.llamacpp_counters(timed)
            timings.append(timed)
            if isinstance(timed.get("predicted_n"), int) and timed["predicted_n"] >= predicted:
                # one chunk per token, but a token ending inside a UTF-8 character is held back
                # and goes out with the next: the running count says how many a chunk holds
                # (unless a chunk without timings came between: then it is not known)
                if tokens is None and not untimed:
                    tokens = timed["predicted_n"] - predicted
                predicted, untimed = timed["predicted_n"], False
        elif text:
            untimed = True
        if usage.get("prompt_tokens") is not None:
            run.prompt_tokens = int(usage["prompt_tokens"])
        if event.get("choices") and (text or tokens):
            run.chunks.append(Chunk(t=t, text=text, tokens=tokens, drafts=drafts))
            run.text += text
        run.finish_reason = finish or run.finish_reason
        spec, raw = engines.read_spec(event)
        if spec is not None:
            run.spec, run.raw_metrics, run.engine = spec, raw, spec.engine
        if on_chunk is not None:
            on_chunk(run)
        if stop is not None and stop():
            run.error = "stopped"
            break
    # llama.cpp: the totals, plus the steps between the chunks' counters (None from other engines)
    run.spec = engines.llamacpp_spec_from_chunks(timings) or run.spec


def _sse_events(response):
    """Server-sent events: the JSON of each `data: {json}` line, until `data: [DONE]`."""
    lines = (raw.decode("utf-8", "replace").strip() for raw in response)
    for data in (line[len("data:"):].strip() for line in lines if line.startswith("data:")):
        if data == "[DONE]":
            return
        yield json.loads(data)


def _chunk_text(event: dict, chat: bool) -> tuple[str, str | None]:
    choices = event.get("choices") or []
    pieces = [((c.get("delta") or {}).get("content") if chat else c.get("text")) or "" for c in choices]
    return "".join(pieces), next((c["finish_reason"] for c in reversed(choices) if c.get("finish_reason")), None)


def _request(url: str, body: dict | None = None) -> urllib.request.Request:
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json, text/event-stream"}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode("utf-8")
    return urllib.request.Request(url, data=data, headers=headers)


def _post(url: str, body: dict, timeout_s: float):
    return urllib.request.urlopen(_request(url, body), timeout=timeout_s)


def _error_text(e: urllib.error.HTTPError) -> str:
    """The error body (read once, then kept on the exception: a body can be read only once)."""
    if not hasattr(e, "specviz_text"):
        try:
            e.specviz_text = e.read().decode("utf-8", "replace")
        except OSError:
            e.specviz_text = str(e)
    return e.specviz_text


def _error_message(text: str) -> str:
    """An OpenAI-style error body's message ({"error": {"message": ...}}), else the text as sent."""
    try:
        error = json.loads(text).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        return text
    return str(message) if message else text


def _reason(e: Exception) -> str:
    """Why a request failed, in words: the socket's own "[Errno 111] Connection refused" told a teacher
    nothing about what to do."""
    reason = getattr(e, "reason", None) or e
    if isinstance(reason, ConnectionRefusedError):
        return "nothing is listening there: is the server started, and on that port?"
    if isinstance(reason, socket.gaierror):
        return "no machine has that name: check the URL's host"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return "it did not answer in time"
    return str(reason)
