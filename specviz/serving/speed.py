"""Fair speed figures from two servers: the speculative one against the plain one.

End to end (request sent to stream closed) counts prompt processing, and that differs for
reasons that are not speculation: one server may have the prompt in its cache and the other
not. So where the engine reports its own decode-only rate (llama.cpp's
timings.predicted_per_second) the speedup compares those; otherwise it is end to end and says
so. No speedup for answers too short to time (render.numbers.MIN_TOKENS, as a local run), nor
for a run that drafted nothing: that measures two plain servers.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..render.numbers import MIN_TOKENS
from ..render.status import count
from .records import ServerRun

DECODE, END_TO_END = "decode", "end-to-end"
SAID = {DECODE: "decode-only tokens/s, from the engines' own timings (prompt processing left out)",
        END_TO_END: "end-to-end tokens/s, request sent to stream closed (prompt processing included)"}


@dataclass(frozen=True)
class Comparison:
    speedup: float | None = None
    basis: str | None = None  # DECODE or END_TO_END (what the speedup compares)
    withheld: str | None = None  # why there is no speedup, when the runs ended but do not give one
    cache: str | None = None  # a sentence when the two servers' prompt caches differ


def rate(run: ServerRun | None) -> float:
    """Tokens per second, request sent to stream closed (prefill included); while it streams,
    to the latest chunk."""
    if run is None:
        return 0.0
    if run.elapsed_s > 0:
        return run.tokens_per_s
    last = max((c.t for c in run.chunks), default=0.0)
    return run.tokens / last if last > 0 else 0.0


def drafted_nothing(run: ServerRun) -> bool:
    """Known to have drafted nothing: the engine's fields say 0, or llama.cpp (whose timings
    always come) sent no draft counters. vLLM without per-request fields: unknown, so False."""
    if run.spec is not None:
        return run.spec.drafted == 0
    return run.engine == "llama.cpp" and run.timings is not None


def cache_note(spec: ServerRun, base: ServerRun) -> str | None:
    a, b = spec.prompt_cache, base.prompt_cache
    if a is None or b is None or a[0] == b[0]:
        return None
    return (f"the two servers' prompt caches differ: the speculative one reused {a[0]} of {a[0] + a[1]} prompt "
            f"tokens from its cache, the plain one {b[0]} of {b[0] + b[1]}")


def compare(spec: ServerRun | None, base: ServerRun | None) -> Comparison:
    """The speedup of spec over base once both runs ended, on the fairest basis they give."""
    if not (spec and base) or spec.error or base.error or not (spec.elapsed_s and base.elapsed_s):
        return Comparison()
    cache = cache_note(spec, base)
    shortest = min(spec.tokens, base.tokens)
    if shortest < MIN_TOKENS:
        return Comparison(withheld=f"{count(shortest, 'token')} is too short to time (a speedup needs "
                                   f"{MIN_TOKENS} from each server)", cache=cache)
    if drafted_nothing(spec):
        return Comparison(withheld="the speculative server drafted nothing, so this would time two plain servers",
                          cache=cache)
    if spec.decode_tokens_per_s and base.decode_tokens_per_s:
        return Comparison(spec.decode_tokens_per_s / base.decode_tokens_per_s, DECODE, cache=cache)
    if rate(base) <= 0:
        return Comparison(cache=cache)
    return Comparison(rate(spec) / rate(base), END_TO_END, cache=cache)
