"""Pictures of runs on a real serving engine (serving.records): the output as the groups the
server sent, headline numbers and plotly charts. Pure functions of the records; no Gradio.

No engine says which drafted token it rejected, so nothing here colours a token by a
verdict: an engine step (steps.py: a vLLM/SGLang chunk, or llama.cpp's tokens grouped by its
running draft counters) is drawn as a neutral box, and a step's kept drafts are told only where
the engine's counts provably line up with the chunks.
"""
from __future__ import annotations

from html import escape

import plotly.graph_objects as go

from ..render.charts import COLORS, acceptance_bars, figure, position_bars, speed_lines, styled, waiting_for
from ..render.html import spoken, token_focus, token_list
from ..render.numbers import MIN_TOKENS, card, cards_html
from ..render.status import count
from .records import ServerRun, SpecStats
from .speed import SAID, compare, rate
from .steps import ALIGNED, COUNTERS, Step, aligned, steps, text_chunks

NO_VERDICTS = "Servers do not say which drafted token they rejected, so no token is coloured by a verdict."
DETAILED = "vLLM gives them with --per-request-spec-decode-metrics detailed"
ONE_STEP = "Each box is what the server sent together: one engine step."
REBUILT = ("Each box is one engine step, rebuilt from the server's running draft counters "
           "(llama.cpp sends one chunk per token).")
PER_TOKEN = ("Each box is one token: llama.cpp sends one chunk per token, and this stream carried no running "
             "timings to group them into steps by (the server ignored timings_per_token).")
UNDRAFTED = ("Each box is one engine step: llama.cpp sends one chunk per token, and nothing was drafted, so "
             "every step made one token.")


def groups_html(run: ServerRun | None, title: str, placeholder: str, note: str = "") -> str:
    """A panel with the run's text, one box per engine step. Model text is escaped like any model text."""
    groups, found = steps(run)
    spans = []
    for i, g in enumerate(groups):
        tip = _tip(i, g, found)
        classes = "tok tok-step" + (" sv-step-odd" if i % 2 else "") + (" tok-nl" if "\n" in g.text else "")
        said = escape(f"{spoken(g.text)}, {tip}", quote=True)
        spans.append(f'<span class="{classes}" data-kind="step" data-step="{i + 1}" {token_focus(g.text)} aria-label="{said}" '
                     f'data-tip="{escape(tip, quote=True)}">{escape(g.text, quote=False)}</span>')
    if spans:
        body = token_list(spans, f"{title}, step by step", title)
    else:
        message = (run.error if run and run.error else None) or placeholder
        body = f'<div class="sv-text sv-empty"><span class="sv-placeholder">{escape(message)}</span></div>'
    note_html = f'<span class="sv-panel-note">{escape(note)}</span>' if note else ""
    foot = ""
    if spans:
        foot = f'<p class="sv-muted sv-step-note">{escape(caption(run, found))}</p>'
    return (f'<section class="sv-panel"><header class="sv-panel-head"><span class="sv-panel-title">'
            f"{escape(title)}</span>{note_html}</header>{body}{foot}</section>")


def _tip(i: int, g: Step, found: str) -> str:
    held = "" if g.tokens is None else f" · {count(g.tokens, 'token')}"
    if found == COUNTERS:
        what = "nothing drafted" if not g.drafted else f"kept {g.kept} of {count(g.drafted, 'draft')}"
        return f"step {i + 1}: {what}{held}"
    if found == ALIGNED:
        return f"step {i + 1}: kept {g.kept} of {count(g.drafted, 'draft')}"
    return f"chunk {i + 1}{held} · arrived {g.t:.3f} s after the request"


def caption(run: ServerRun | None, found: str) -> str:
    """What a box is, for the engine in front of us."""
    s = run.spec if run else None
    if found == COUNTERS:
        if not (s and s.drafted):
            return UNDRAFTED
        return f"{REBUILT} {NO_VERDICTS} Hover a box for the drafts its step kept."
    if run is not None and run.engine == "llama.cpp":
        return PER_TOKEN
    if s is None:
        return ONE_STEP
    if found == ALIGNED:
        return f"{ONE_STEP} {NO_VERDICTS} Hover a box for the drafts its step kept."
    if s.per_step_accepted is None:
        return f"{ONE_STEP} {NO_VERDICTS} The engine gave totals only ({DETAILED} per step)."
    return (f"{ONE_STEP} {NO_VERDICTS} The engine's per-step counts do not line up with the chunks here (a step "
            "that drafted nothing has no count), so the boxes are steps without their counts.")


def run_note(run: ServerRun | None) -> str:
    if run is None or not run.chunks:
        return ""
    return f"{run.model} · {count(run.tokens, 'token')} · {rate(run):.1f} tok/s"


def speedup(spec: ServerRun | None, base: ServerRun | None) -> float | None:
    """Speculative over plain tokens/s, once both runs ended with enough tokens to mean it (speed.compare)."""
    return compare(spec, base).speedup


def _tps(run: ServerRun) -> tuple[str, str]:
    """(value, what it is) for a run's tokens/s card: decode-only when the engine says, else end to end."""
    if run.decode_tokens_per_s:
        return f"{run.decode_tokens_per_s:.1f}", "decode only, the engine's own timing (prompt processing left out)"
    return f"{rate(run):.1f}", "request sent to stream closed, prompt processing included"


def headline_html(spec: ServerRun | None, base: ServerRun | None) -> str:
    if spec is None or not spec.chunks:
        return ""
    s, c = spec.spec, compare(spec, base)
    x = c.speedup
    tau = s.mean_accepted_length if s else None
    ttft = spec.ttft_s
    if x is not None:
        said = f"{SAID[c.basis]}: speculative / plain"
    elif c.withheld:
        said = f"not shown: {c.withheld}"
    else:
        said = f"tokens/s of the speculative server / the plain one, once both runs finished with {MIN_TOKENS} tokens"
    if c.cache:
        said += f"; {c.cache}"
    spec_tps, spec_said = _tps(spec)
    base_tps, base_said = _tps(base) if base is not None and base.chunks else ("—", "")
    cards = [
        card("measured speedup", "—" if x is None else f"{x:.2f}×", said, "speedup"),
        card("α acceptance rate", "—" if s is None else f"{s.acceptance_rate:.2f}",
              "accepted draft tokens / drafted tokens, from the engine's own per-request fields", "alpha"),
        card("τ tokens per step", "—" if tau is None else f"{tau:.2f}",
              "kept drafts plus the target's own token, per verify step that drafted", "tau"),
        card("tokens/s speculative", spec_tps, spec_said, "spec-tps"),
        card("tokens/s plain", base_tps, "the baseline server, same prompt and settings" +
              (f"; {base_said}" if base_said else ""), "base-tps"),
        card("time to first token", "—" if ttft is None else f"{ttft * 1000:.0f} ms",
              "speculative server; plain server: " + ("—" if base is None or base.ttft_s is None
                                                      else f"{base.ttft_s * 1000:.0f} ms"), "ttft"),
    ]
    return cards_html(cards, "sv-server")


def step_figure(s: SpecStats | None) -> go.Figure:
    """Per verify step: kept / drafted (bars) and the cumulative acceptance rate alpha (line)."""
    fig = styled(figure(), "The server's acceptance per step", "verify step", "kept / drafted")
    if s is None:
        return waiting_for(fig, "no speculation fields from this server yet")
    if s.per_step_accepted is None or s.per_step_drafted is None:
        return waiting_for(fig, f"totals only: α = {s.acceptance_rate:.2f} ({s.accepted} of {s.drafted}); "
                             f"per-step counts: {DETAILED}")
    steps = [(i, a, d) for i, (a, d) in enumerate(zip(s.per_step_accepted, s.per_step_drafted), start=1) if d]
    if not steps:
        return waiting_for(fig, "nothing drafted")
    return acceptance_bars(fig, steps, "kept")


def position_figure(s: SpecStats | None) -> go.Figure:
    """P(draft i kept | the step drafted at least i), from the per-step arrays."""
    fig = styled(figure(), "Acceptance by draft position", "draft position", "kept / offered")
    counts = s.per_position_counts if s else []
    if not counts:
        return waiting_for(fig, f"needs per-step counts ({DETAILED})" if s else "no speculation fields yet")
    return position_bars(fig, counts, "kept")


def _speed_points(run: ServerRun) -> tuple[list[float], list[float]]:
    """(seconds since the request, tokens/s so far) per chunk; only when every chunk says how
    many tokens it held, else one point for the whole run once it ended (never a guess)."""
    chunks = text_chunks(run)
    if chunks and all(c.tokens is not None for c in chunks):
        xs, ys, n = [], [], 0
        for c in chunks:
            n += c.tokens
            if c.t > 0:
                xs.append(c.t)
                ys.append(n / c.t)
        return xs, ys
    return ([run.elapsed_s], [run.tokens_per_s]) if run.elapsed_s > 0 and run.tokens else ([], [])


def speed_figure(spec: ServerRun | None, base: ServerRun | None) -> go.Figure:
    fig = styled(figure(), "Tokens per second over time", "seconds since the request", "tokens / s")
    runs = [(name, COLORS[key], *_speed_points(r))
            for r, name, key in ((spec, "speculative", "speculative"), (base, "plain", "baseline")) if r is not None]
    if not any(xs for _, _, xs, _ in runs):
        return waiting_for(fig)
    return speed_lines(fig, runs)


def serving_figures(spec: ServerRun | None, base: ServerRun | None) -> tuple[go.Figure, go.Figure, go.Figure]:
    s = spec.spec if spec else None
    return step_figure(s), position_figure(s), speed_figure(spec, base)


def run_dict(run: ServerRun | None) -> dict | None:
    """One run for the API summary: the record's fields and rates, chunks as (t, text, tokens)."""
    if run is None:
        return None
    return {"url": run.url, "model": run.model, "text": run.text, "error": run.error,
            "finish_reason": run.finish_reason, "prompt_tokens": run.prompt_tokens, "tokens": run.tokens,
            "elapsed_s": run.elapsed_s, "tokens_per_s": rate(run), "ttft_s": run.ttft_s,
            "inter_token_s": run.inter_token_s, "steps_aligned": aligned(run), "steps_from": steps(run)[1],
            "engine": run.engine, "decode_tokens_per_s": run.decode_tokens_per_s,
            "chunks": [[c.t, c.text, c.tokens] for c in run.chunks],
            "spec": run.spec.to_dict() if run.spec else None}
