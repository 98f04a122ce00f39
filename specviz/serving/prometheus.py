"""A server's `/metrics` page: the Prometheus text format, and the speculation counters in it.

Per-request fields (engines.py) say what one request did; these counters say what the whole
server did, every tenant included. Counters only grow, so two snapshots taken around a run and
subtracted (`after - before`) give that run's share, provided nobody else was using the server.

Names, from the engines' source:
  vLLM 0.32 (vllm/v1/spec_decode/metrics.py, SpecDecodingProm; labels model_name, engine):
    vllm:spec_decode_num_drafts_total                verify steps that drafted (one per request per step)
    vllm:spec_decode_num_draft_tokens_total          draft tokens verified
    vllm:spec_decode_num_accepted_tokens_total       draft tokens kept (bonus excluded)
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}  steps that kept draft i (0-based)
    raised per scheduler step, so a snapshot includes requests still running.
  llama.cpp server (tools/server/server-task.cpp, metrics to Prometheus text) uses the same four
    names under `llamacpp:`, counted per slot and added when a request finishes.
  SGLang has no draft or accepted counter: sglang:spec_accept_length and sglang:spec_accept_rate
    are gauges over the last logging interval (a snapshot, not a total). Its only counter is
    sglang:spec_verify_calls_total (python/sglang/srt/observability/metrics_collector.py,
    TokenizerMetricsCollector), added per finished request, which with
    sglang:generation_tokens_total gives tokens per verify (SGLangCounters).
"""
from __future__ import annotations

import http.client
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

from ..core.errors import SpecvizError

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


# ---------------------------------------------------------------- the text format

def _label_value(line: str, i: int, number: int) -> tuple[str, int]:
    """The quoted value starting at line[i] == '"', unescaped, and the index after its closing quote."""
    out = []
    i += 1
    while i < len(line):
        c = line[i]
        if c == '"':
            return "".join(out), i + 1
        if c == "\\":
            if i + 1 >= len(line) or line[i + 1] not in _ESCAPES:
                raise SpecvizError(f"metrics line {number}: bad escape in a label value: {line!r}")
            out.append(_ESCAPES[line[i + 1]])
            i += 2
            continue
        out.append(c)
        i += 1
    raise SpecvizError(f"metrics line {number}: a label value has no closing quote: {line!r}")


def _labels(line: str, i: int, number: int) -> tuple[Labels, int]:
    """The {name="value",...} set starting at line[i] == '{', sorted by name, and the index after '}'."""
    labels: dict[str, str] = {}
    i += 1
    while True:
        while i < len(line) and line[i] == " ":
            i += 1
        if i < len(line) and line[i] == "}":
            return tuple(sorted(labels.items())), i + 1
        match = _LABEL_NAME.match(line, i)
        if not match:
            raise SpecvizError(f"metrics line {number}: expected a label name at column {i + 1}: {line!r}")
        name, i = match.group(), match.end()
        while i < len(line) and line[i] == " ":
            i += 1
        if line[i:i + 1] != "=":
            raise SpecvizError(f"metrics line {number}: expected '=' after label {name!r}: {line!r}")
        i += 1
        while i < len(line) and line[i] == " ":
            i += 1
        if line[i:i + 1] != '"':
            raise SpecvizError(f"metrics line {number}: the value of label {name!r} is not quoted: {line!r}")
        value, i = _label_value(line, i, number)
        if name in labels:
            raise SpecvizError(f"metrics line {number}: label {name!r} appears twice: {line!r}")
        labels[name] = value
        while i < len(line) and line[i] == " ":
            i += 1
        if line[i:i + 1] == ",":
            i += 1
        elif line[i:i + 1] != "}":
            raise SpecvizError(f"metrics line {number}: expected ',' or '}}' after label {name!r}: {line!r}")


def _sample(line: str, number: int) -> tuple[str, Labels, float]:
    """One sample line: name, optional labels, value, optional timestamp (read and dropped)."""
    match = _NAME.match(line)
    if not match:
        raise SpecvizError(f"metrics line {number}: does not start with a metric name: {line!r}")
    name, i = match.group(), match.end()
    labels: Labels = ()
    if line[i:i + 1] == "{":
        labels, i = _labels(line, i, number)
    rest = line[i:].split()
    if not 1 <= len(rest) <= 2 or (line[i:i + 1] not in (" ", "\t")):
        raise SpecvizError(f"metrics line {number}: expected 'value [timestamp]' after the name: {line!r}")
    try:
        value = float(rest[0])  # takes +Inf, -Inf and NaN as Prometheus writes them
        if len(rest) == 2:
            int(rest[1])  # a timestamp in milliseconds
    except ValueError:
        raise SpecvizError(f"metrics line {number}: not a number: {line!r}") from None
    return name, labels, value


def parse(text: str) -> Samples:
    """Prometheus text exposition -> {(metric name, sorted label pairs): value}.

    Skips comments (# HELP, # TYPE, # EOF) and blank lines; label values may hold escaped quotes,
    backslashes and newlines, commas and braces; values may be +Inf, -Inf or NaN; a trailing
    timestamp is dropped. A line that is none of these raises SpecvizError naming the line.
    """
    samples: Samples = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, labels, value = _sample(line, number)
        samples[(name, labels)] = value
    return samples


def total(samples: Samples, name: str) -> float | None:
    """The sum of a metric over all its label sets (engines, models); None when it is not there."""
    values = [value for (sample_name, _), value in samples.items() if sample_name == name]
    return sum(values) if values else None


def metrics_url(url: str) -> str:
    """The server's root + "/metrics" (kept as is when it already ends there): vLLM and SGLang
    serve Prometheus text at the root, beside /v1, so a base URL given with /v1 loses it."""
    url = url.rstrip("/")
    if url.endswith("/metrics"):
        return url
    return (url[:-3] if url.endswith("/v1") else url) + "/metrics"


def fetch(url: str, timeout_s: float = 5) -> str:
    """GET the server's /metrics page as text; SpecvizError (saying what failed) when it cannot."""
    target = metrics_url(url)
    try:
        with urllib.request.urlopen(target, timeout=timeout_s) as response:
            return response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        raise SpecvizError(f"{target} answered HTTP {e.code} {e.reason}: is this the engine's own "
                           "port, with its metrics endpoint on?") from None
    except urllib.error.URLError as e:
        raise SpecvizError(f"could not read {target}: {e.reason}") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise SpecvizError(f"could not read {target}: {e or type(e).__name__}") from None


# ---------------------------------------------------------------- speculation counters

@dataclass(frozen=True)
class SpecCounters:
    """vLLM's (or llama.cpp's) server-wide speculation counters, or their change over a run."""

    drafts: float  # verify steps that drafted, one per request per step
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: tuple[float, ...] = ()  # [i]: steps that kept draft i (0-based)

    def __sub__(self, before: "SpecCounters") -> "SpecCounters":
        """after - before: what happened between two snapshots. Refused when a counter went down
        (the server restarted in between, so the difference means nothing)."""
        width = max(len(self.accepted_per_position), len(before.accepted_per_position))
        pad = lambda values: values + (0.0,) * (width - len(values))  # noqa: E731
        change = SpecCounters(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted_tokens=self.accepted_tokens - before.accepted_tokens,
            accepted_per_position=tuple(a - b for a, b in zip(pad(self.accepted_per_position),
                                                              pad(before.accepted_per_position))),
        )
        if min((change.drafts, change.draft_tokens, change.accepted_tokens, *change.accepted_per_position)) < 0:
            raise SpecvizError("the server's speculation counters went down between the two snapshots "
                               "(was it restarted?)")
        return change

    @property
    def acceptance_rate(self) -> float:
        """alpha: kept draft tokens / draft tokens (0.0 when nothing was drafted)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float | None:
        """tau: tokens per drafting verify step, 1 + accepted/drafts (bonus included); None without a step."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else None

    @property
    def per_position_acceptance(self) -> list[float]:
        """accepted_per_position[i] / drafts: P(draft i kept) over ALL drafting steps.

        vLLM counts one draft per step whatever its length, and keeps no per-position count of
        drafted tokens on this page, so a step that drafted fewer than i + 1 tokens (ngram often
        does) still counts in the denominator: this is not P(kept | drafted), which
        SpecStats.per_position_acceptance gives from vLLM's `detailed` per-step arrays."""
        return [kept / self.drafts for kept in self.accepted_per_position] if self.drafts else []

    def to_dict(self) -> dict:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens,
                "accepted_tokens": self.accepted_tokens,
                "accepted_per_position": list(self.accepted_per_position),
                "acceptance_rate": self.acceptance_rate, "mean_accepted_length": self.mean_accepted_length,
                "per_position_acceptance": self.per_position_acceptance}


SPEC_PREFIXES = ("vllm:", "llamacpp:")


def _per_position(samples: Samples, name: str) -> tuple[float, ...]:
    """{position="i"} series summed over their other labels, as a tuple indexed by i (gaps: 0)."""
    by_position: dict[int, float] = {}
    for (sample_name, labels), value in samples.items():
        if sample_name != name:
            continue
        position = dict(labels).get("position", "")
        if not position.isdigit():
            raise SpecvizError(f"{name} has a series without a numeric position label: {dict(labels)}")
        by_position[int(position)] = by_position.get(int(position), 0.0) + value
    width = max(by_position, default=-1) + 1
    return tuple(by_position.get(i, 0.0) for i in range(width))


def spec_counters(samples: Samples, prefix: str | None = None) -> SpecCounters | None:
    """The speculation counters of a parsed /metrics page, summed over model_name/engine labels.

    prefix "vllm:" or "llamacpp:"; None tries both, vLLM first. None when the three totals are
    not all there (no speculation configured, or another engine).
    """
    for p in (prefix,) if prefix else SPEC_PREFIXES:
        drafts = total(samples, p + "spec_decode_num_drafts_total")
        draft_tokens = total(samples, p + "spec_decode_num_draft_tokens_total")
        accepted = total(samples, p + "spec_decode_num_accepted_tokens_total")
        if drafts is not None and draft_tokens is not None and accepted is not None:
            return SpecCounters(drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted,
                                accepted_per_position=_per_position(
                                    samples, p + "spec_decode_num_accepted_tokens_per_pos_total"))
    return None


def read_spec_counters(url: str) -> "SpecCounters | None":
    """The server's speculation counters now, or None when it has no /metrics or no such
    counters there (a plain server): callers then fall back to the requests' own fields."""
    try:
        return spec_counters(parse(fetch(url)))
    except (OSError, ValueError, SpecvizError):
        return None


@dataclass(frozen=True)
class SGLangCounters:
    """SGLang's only speculation counter, with the generated tokens beside it (or their change).

    Both are added when a request finishes (observe_one_finished_request), so a snapshot misses
    requests still running. No draft-token counter exists, so there is no alpha here."""

    verify_calls: float  # sglang:spec_verify_calls_total: sum of finished requests' spec_verify_ct
    generation_tokens: float  # sglang:generation_tokens_total, over its is_streaming label

    def __sub__(self, before: "SGLangCounters") -> "SGLangCounters":
        change = SGLangCounters(self.verify_calls - before.verify_calls,
                                self.generation_tokens - before.generation_tokens)
        if change.verify_calls < 0 or change.generation_tokens < 0:
            raise SpecvizError("SGLang's counters went down between the two snapshots (was it restarted?)")
        return change

    @property
    def tokens_per_verify(self) -> float | None:
        """Generated tokens / verify calls: SGLang's spec_accept_length over the run. Above tau
        = 1 + accepted/steps, because each request's first token (from prefill) is counted too."""
        return self.generation_tokens / self.verify_calls if self.verify_calls else None

    def to_dict(self) -> dict:
        return {"verify_calls": self.verify_calls, "generation_tokens": self.generation_tokens,
                "tokens_per_verify": self.tokens_per_verify}


def sglang_counters(samples: Samples) -> SGLangCounters | None:
    """SGLangCounters from a parsed SGLang /metrics page; None without sglang:spec_verify_calls_total."""
    verify_calls = total(samples, "sglang:spec_verify_calls_total")
    if verify_calls is None:
        return None
    return SGLangCounters(verify_calls, total(samples, "sglang:generation_tokens_total") or 0.0)
