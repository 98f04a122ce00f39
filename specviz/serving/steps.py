"""A streamed run cut into the engine's steps, whatever shape the engine streams in.

vLLM and SGLang send one chunk per engine step: a chunk is a step. llama.cpp sends one chunk
per token, so a chunk is a token; with `timings_per_token` every chunk carries the request's
running draft counters, which rise at the first chunk of each verify step that drafted (the
server raises them before that step's tokens go out). That step made its kept drafts plus the
target's own token, so it is that chunk and the next ones until kept + 1 tokens are in; a chunk
that comes after, with the counters unchanged, is a step that drafted nothing (one token).

Limits (a step is never invented, but may be drawn imprecisely): a chunk without timings counts
as the step before it; a token held back (an unfinished UTF-8 character, a possible stop string)
goes out inside the next chunk, so where that crosses a step boundary the chunk goes to the
later step. Pure functions of records.
"""
from __future__ import annotations

from dataclasses import dataclass

from .records import ServerRun

CHUNKS, ALIGNED, COUNTERS = "chunks", "aligned", "counters"  # how the steps were found


@dataclass(frozen=True)
class Step:
    text: str
    t: float  # seconds from the request to the arrival of the step's first chunk
    tokens: int | None  # None: the engine did not say
    kept: int | None = None  # drafts the step kept (None: unknown)
    drafted: int | None = None


def text_chunks(run: ServerRun) -> list:
    """The chunks that carry output (a chat stream opens with a role-only chunk, ends with usage)."""
    return [c for c in run.chunks if c.text]


def aligned(run: ServerRun) -> bool:
    """Do the per-step arrays name the chunks one to one? Only when their counts are equal:
    a step that drafted nothing, or a prefill chunk, has no entry, and then no chunk can be
    matched to a step without guessing."""
    s = run.spec
    return bool(s and s.per_step_accepted is not None and s.per_step_drafted is not None
                and len(s.per_step_accepted) == len(s.per_step_drafted) == len(text_chunks(run)) > 0)


def per_token(run: ServerRun) -> bool:
    """Does the engine stream one chunk per token with running draft counters (llama.cpp)?"""
    return any(c.drafts is not None for c in run.chunks)


def steps(run: ServerRun | None) -> tuple[list[Step], str]:
    """(the run's steps, how they were found: COUNTERS, ALIGNED or CHUNKS). Steps without text
    (a token held back, the end-of-sequence token) are left out, as the page draws no empty box."""
    if run is None:
        return [], CHUNKS
    if per_token(run):
        rebuilt = _from_counters(run.chunks)
        if rebuilt is not None:
            return [s for s in rebuilt if s.text], COUNTERS
    chunks = text_chunks(run)
    if aligned(run):
        s = run.spec
        return [Step(c.text, c.t, c.tokens, a, d) for c, a, d in
                zip(chunks, s.per_step_accepted, s.per_step_drafted)], ALIGNED
    return [Step(c.text, c.t, c.tokens) for c in chunks], CHUNKS


def _from_counters(chunks) -> list[Step] | None:
    """llama.cpp's steps from its chunks' running counters; None when they went backwards."""
    out: list[Step] = []
    previous, left = (0, 0), 0  # the counters so far; tokens the current drafting step still owes
    for c in chunks:
        n = 1 if c.tokens is None else c.tokens
        counters = previous if c.drafts is None else c.drafts
        if counters != previous:
            drafted, kept = counters[0] - previous[0], counters[1] - previous[1]
            if drafted < 0 or kept < 0:
                return None
            out.append(Step(c.text, c.t, n, kept, drafted))
            previous, left = counters, kept + 1 - n
        elif out and left > 0:
            last = out[-1]
            out[-1] = Step(last.text + c.text, last.t, last.tokens + n, last.kept, last.drafted)
            left -= n
        elif n:
            out.append(Step(c.text, c.t, n, 0, 0))
    return out
