"""What a serving engine tells us about one request, as plain records.

The rates follow the local engine's meanings (events.RunStats), so `stats.acceptance_rate`,
`stats.mean_accepted_length` and `stats.tokens_per_s` mean the same in a local and a server run:
  alpha  accepted drafts / drafted tokens
  tau    tokens per target pass over the steps that drafted (accepted drafts + the target's own
         token), vLLM's `mean_acceptance_length`
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..core import metrics


@dataclass(frozen=True)
class Chunk:
    """One streamed piece of output: what the server sent together, and when it arrived.

    vLLM and SGLang send one chunk per engine step, so with speculation a chunk holds the step's
    kept drafts and the target's own token; llama.cpp sends one chunk per token, and its steps
    are rebuilt from `drafts` (steps.py). `tokens` is how many tokens it holds when the server
    says (None: unknown, e.g. an engine that reports no per-chunk count)."""

    t: float  # seconds from sending the request to receiving this chunk
    text: str
    tokens: int | None = None
    # llama.cpp with timings_per_token: the request's running (draft_n, draft_n_accepted) as this
    # chunk left the server ((0, 0) before anything was drafted); None: the chunk carried no timings
    drafts: tuple[int, int] | None = None


@dataclass(frozen=True)
class SpecStats:
    """One request's speculation, from the engine's own per-request fields.

    per_step_accepted / per_step_drafted: one entry per verify step that drafted (vLLM's
    `detailed` level; None when the engine gives only totals)."""

    engine: str  # "vllm", "sglang", "llama.cpp"
    drafted: int
    accepted: int
    steps: int | None = None  # verify steps that drafted
    k: int | None = None  # configured draft length (the most a step drafts)
    per_step_accepted: tuple[int, ...] | None = None
    per_step_drafted: tuple[int, ...] | None = None
    histogram: tuple[int, ...] | None = None  # steps that kept exactly j drafts, j = 0..k

    @property
    def acceptance_rate(self) -> float:
        return metrics.acceptance_rate(self.accepted, self.drafted)

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per verify step (kept drafts + the target's own token); None without a step count."""
        return metrics.mean_accepted_length(self.accepted + self.steps, self.steps) if self.steps else None

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(draft i kept | the step drafted at least i tokens), i = 1..k, from the per-step arrays."""
        return [kept / offered if offered else 0.0 for offered, kept in self.per_position_counts]

    @property
    def per_position_counts(self) -> list[tuple[int, int]]:
        """(steps that drafted at least i tokens, steps that kept at least i), i = 1..k."""
        if self.per_step_accepted is None or self.per_step_drafted is None:
            return []
        longest = max(self.per_step_drafted, default=0)
        steps = list(zip(self.per_step_accepted, self.per_step_drafted))
        return [(sum(d >= i for _, d in steps), sum(d >= i and a >= i for a, d in steps))
                for i in range(1, longest + 1)]

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(acceptance_rate=self.acceptance_rate, mean_accepted_length=self.mean_accepted_length,
                 per_position_acceptance=self.per_position_acceptance)
        return d


@dataclass
class ServerRun:
    """One streamed completion from a server: its text, chunk timings and the engine's numbers."""

    url: str
    model: str
    text: str = ""
    chunks: list[Chunk] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # the server's usage count (the chunks' count when it gives none)
    elapsed_s: float = 0.0  # request sent -> stream closed
    finish_reason: str | None = None
    spec: SpecStats | None = None
    raw_metrics: dict = field(default_factory=dict)  # the engine's per-request fields, as sent
    error: str | None = None  # a failed request keeps what arrived before the failure
    engine: str | None = None  # "vllm", "sglang", "llama.cpp" when the stream says; None: unknown
    timings: dict | None = None  # llama.cpp: the latest `timings` object, as sent

    @property
    def decode_tokens_per_s(self) -> float | None:
        """The engine's own decode-only rate (prompt processing excluded): llama.cpp's
        timings.predicted_per_second. None when the engine gives none (vLLM, SGLang)."""
        value = (self.timings or {}).get("predicted_per_second")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None

    @property
    def prompt_cache(self) -> tuple[int, int] | None:
        """llama.cpp: (prompt tokens reused from its cache, prompt tokens processed), from
        timings.cache_n / prompt_n; None when the engine does not say."""
        t = self.timings or {}
        cached, processed = t.get("cache_n"), t.get("prompt_n")
        if isinstance(cached, (int, float)) and isinstance(processed, (int, float)):
            return int(cached), int(processed)
        return None

    @property
    def ttft_s(self) -> float | None:
        """Time to the first chunk with text."""
        return next((c.t for c in self.chunks if c.text), None)

    @property
    def tokens(self) -> int:
        if self.completion_tokens is not None:
            return self.completion_tokens
        return sum(c.tokens or 0 for c in self.chunks)

    @property
    def inter_token_s(self) -> float | None:
        """Mean seconds per output token after the first ((end - first) / (tokens - 1): vLLM's TPOT)."""
        first = self.ttft_s
        if first is None or self.tokens < 2:
            return None
        last = max(c.t for c in self.chunks)
        return (last - first) / (self.tokens - 1)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0
