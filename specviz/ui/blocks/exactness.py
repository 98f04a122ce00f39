"""The "Is sampling exact?" block: the first token drawn N times speculatively and N times
plainly (same settings, seeds 0..N-1 and another N), both histograms, and a chi-square p-value.
The engine that speculates is specviz's, transformers' `generate` (prompt lookup, or the drafter's
model as its assistant) or the operator's serving engine, each drawn through specviz/audit/engines.py
as `python -m specviz audit` draws.

Cheap: each speculative draw is one prefill, one draft and one verify step; each plain draw
one prefill and one token. The greedy check above compares whole texts token for token;
this is its counterpart for sampling, where only distributions can agree.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, replace

import gradio as gr
import plotly.graph_objects as go

from ...audit.engines import draws, pair, served
from ...audit.stats import MIN_DRAWS  # where the slider starts; Stop can end sooner
from ...core.errors import SpecvizError
from ...core.exactness import chi_square
from ...render.charts import COLORS, FONT, distinct, figure as new_figure
from ...render.html import VISIBLE_WHITESPACE
from ...render.status import status_html
from ...render.trace import Trace
from ...run.arms import parse_arm
from ..live import runner
from ..handlers import STOPPING
from ..live.limits import Line
from ..page import Page, accordion
from ..policy import Policy
from ...run.settings import Settings

SHOWN = 15  # tokens on the histogram's axis; the rest are one bar
ENGINES = ("specviz", "transformers generate", "serving engine")
SERVED_TOKENS = 2  # a server's draws: the text of its first two tokens (a speculative chunk holds several)


def limit(policy: Policy) -> int:
    """Draws per sampler: a hosted app shares its CPU with every visitor."""
    return 100 if policy.hosted else 500


@dataclass(frozen=True)
class Controls:
    n: gr.Slider
    engine: gr.Radio
    run: gr.Button
    stop: gr.Button
    status: gr.HTML
    plot: gr.Plot
    result: gr.HTML


def controls(policy: Policy) -> Controls:
    with accordion("Is sampling exact? (first token, many seeds)", "sv-exact-box",
                   "With sampling the two panels differ by chance, so the greedy check cannot apply. "
                   "This draws the first token N times each way with the decoding settings (beside the tabs; "
                   "above them on a phone) and the drafter above (seeds 0..N-1) and asks whether the two "
                   "histograms could come from one distribution."):
        with gr.Row(elem_classes="sv-actions"):
            n = gr.Slider(MIN_DRAWS, limit(policy), value=min(100, limit(policy)), step=10, label="draws each way (N)",
                          elem_id="sv-exact-n", scale=3, min_width=160)
            engine = gr.Radio(list(ENGINES), value=ENGINES[0], label="engine that speculates",
                              elem_id="sv-exact-engine", scale=2, min_width=160,
                              info="the serving engine: the operator's server pair (Serving tab)")
            run = gr.Button("Draw and compare", variant="primary", elem_id="sv-exact-run", min_width=120)
            stop = gr.Button("Stop", variant="stop", elem_id="sv-exact-stop", min_width=80)
        status = gr.HTML(elem_id="sv-exact-status")
        plot = gr.Plot(show_label=False, elem_id="sv-exact-plot")
        result = gr.HTML(elem_id="sv-exact-result")
    return Controls(n, engine, run, stop, status, plot, result)


def figure(spec: Counter, base: Counter, names: dict) -> go.Figure:
    tokens = sorted(set(spec) | set(base), key=lambda t: -(spec[t] + base[t]))
    shown, rest = tokens[:SHOWN], tokens[SHOWN:]
    x = [repr(names.get(t, f"#{t}").translate(VISIBLE_WHITESPACE))[1:-1] or f"#{t}" for t in shown]
    x = distinct(x)
    ys = [[c[t] for t in shown] + ([sum(c[t] for t in rest)] if rest else []) for c in (spec, base)]
    x += ["other tokens"] if rest else []
    fig = new_figure()
    fig.add_bar(x=x, y=ys[0], name="speculative", marker_color=COLORS["speculative"])
    fig.add_bar(x=x, y=ys[1], name="plain sampling", marker_color=COLORS["baseline"])
    fig.update_layout(font=FONT, height=300, barmode="group",
                      margin=dict(l=50, r=10, t=40, b=70), legend=dict(orientation="h", y=1.12, x=0),
                      title=dict(text="first token, counts", font=dict(size=14)), yaxis_title="draws")
    return fig


def verdict_html(spec: Counter, base: Counter, drafted: int | None = None) -> str:
    """The verdict; `drafted`: draft tokens the speculative draws proposed (None: not counted)."""
    stat, dof, p = chi_square(spec, base)
    n = min(sum(spec.values()), sum(base.values()))
    if n < MIN_DRAWS:
        text = (f"Too few draws to judge: {n} each way, and the test needs at least {MIN_DRAWS} each way "
                "before its p-value says anything. Draw again with more.")
        return f'<div class="sv-exact" data-p="none">{text}</div>'
    if drafted == 0:
        text = (f"Nothing was drafted in {n} draws: the speculative side was plain decoding, so agreeing "
                "would prove nothing. Choose a drafter or prompt that drafts.")
        return f'<div class="sv-exact" data-p="none">{text}</div>'
    if not dof:
        text = ("Nothing to test yet: no two tokens came up often enough (5 expected draws each way) to "
                "compare. Draw more, or lower the temperature.")
    else:
        reading = ("consistent with one distribution, as exactness promises" if p >= 0.01 else
                   "surprising if both came from one distribution: worth investigating")
        text = f"chi-square {stat:.2f} on {dof} degrees of freedom, <b>p-value {p:.3f}</b>: {reading}."
    return f'<div class="sv-exact" data-p="{p:.4f}">{text} <span class="sv-muted">({n} draws each way)</span></div>'


def _loading(gen, frame):
    """Pass on a runner generator's progress as status lines; return what it returns."""
    while True:
        try:
            next(gen)
        except StopIteration as done:
            return done.value
        yield status_html(frame.message, "loading", frame.fraction), gr.skip(), gr.skip()


def samplers(engine: str, policy: Policy, target, made, ids: list[int], cfg, prompt: str):
    """(speculative engine, plain engine, a draw's outcome) for the engine chosen (audit/engines.py);
    outcomes are first token ids, or a server's text."""
    if engine == "serving engine":
        if not (policy.server_url and policy.baseline_server_url):
            raise SpecvizError("The serving engine needs both servers named: SPECVIZ_SERVER_URL and "
                               "SPECVIZ_BASELINE_SERVER_URL (the Serving tab's pair).")
        urls, messages = (policy.server_url, policy.baseline_server_url), [{"role": "user", "content": prompt}]
        return *served(urls, messages, cfg.sampling, SERVED_TOKENS), lambda d: d.text
    peer, drafter = None, made  # specviz's own loop; generate's assistant model below
    if engine == "transformers generate":
        from ...drafters.draft_model import DraftModel
        from ...drafters.prompt_lookup import PromptLookup

        if not (isinstance(made, PromptLookup) or type(made) is DraftModel):  # layer skip's view is no assistant
            raise SpecvizError("transformers' generate drafts by prompt lookup or with a draft model: choose one "
                               "of those as the drafter.")
        peer, drafter = ("hf-pld", None) if isinstance(made, PromptLookup) else ("hf-assisted", made.model)
    return *pair(target.model, drafter, ids, cfg, 1, peer), lambda d: d.tokens[0]


def draw(policy: Policy, models, n, drafter, should_stop=lambda: False, engine: str = ENGINES[0], **controls):
    """Stream (status, plot, result) while drawing; a problem is one status line. Stop
    (should_stop) ends the draws after the current one and judges those drawn so far."""
    spec, base, names, drafted = Counter(), Counter(), {}, 0
    frame = runner.Frame(base=Trace("baseline", speculative=False), runs=[Trace("draws")])
    try:
        s = Settings.from_controls(drafter=drafter, **controls)
        if s.greedy:
            raise SpecvizError("Switch Decoding to sampling first: greedy runs are checked token for token above.")
        n = int(float(n))
        if not 1 <= n <= limit(policy):
            raise SpecvizError(f"draws must be from 1 to {limit(policy)} here, got {n}")
        policy.check(s)
        arm = parse_arm(s.drafter, s.config())
        p = yield from _loading(runner.preparing(s, policy, models, frame, should_stop, arm), frame)
        target = p.target
        # k + 1 new tokens: room for a full draft, so the first token really went through verification
        cfg = replace(p.cfg, max_new_tokens=p.cfg.k + 1, dynamic_k=False)
        *engines, outcome = samplers(engine, policy, target, p.drafter, p.ids, cfg, s.prompt)
        start, shown = time.monotonic(), 0.0
        for a, b in draws(engines, n, stop=should_stop):
            spec[outcome(a)] += 1
            base[outcome(b)] += 1
            drafted, drawn, now = drafted + a.drafted, sum(spec.values()), time.monotonic()
            if policy.max_run_seconds and now - start > policy.max_run_seconds:
                break
            if now - shown > 1.0 or drawn == n:
                shown = now
                names.update({t: _name(models, target, t) for t in set(spec) | set(base) if t not in names})
                said = STOPPING if should_stop() else f"Drawn {drawn} of {n} first tokens each way…"
                yield status_html(said, "running", drawn / n), figure(spec, base, names), gr.skip()
    except runner.Stopped:
        yield status_html("Stopped before the first draw.", "stopped"), gr.skip(), ""
        return
    except Exception as e:  # a readable line, never a traceback in the page
        yield status_html(runner.readable(e, policy.hosted), "error"), gr.skip(), ""
        return
    drawn = sum(spec.values())
    names.update({t: _name(models, target, t) for t in set(spec) | set(base) if t not in names})
    if drawn < n and should_stop():
        done = status_html(f"Stopped after {drawn} of {n} first tokens each way.", "stopped")
    else:
        done = status_html(f"Done: {drawn} first tokens each way.", "done")
    yield done, figure(spec, base, names), verdict_html(spec, base, drafted)


def _name(models, target, outcome) -> str:
    """A drawn token's text (a server's draws are text already)."""
    return outcome if isinstance(outcome, str) else models.decode(target, [outcome])


def queued(line: Line, session, run):
    """`run(should_stop)`'s updates once it is this run's turn in the app's one Line of runs (limits.py):
    the draws are model work like any run, so a visitor cannot start them beside a run of the
    playground and double the load a hosted app allows; Stop ends the wait too."""
    def status(message, state, ahead=None):
        return status_html(message, state), gr.skip(), gr.skip()

    yield from line.run(session, None, status, lambda: None, lambda _, should_stop: run(should_stop))


def wire(c: Controls, page: Page) -> None:
    """The button runs `draw` with the playground's drafter and the settings on the left, in
    its turn in the handlers' Line and the visitor's Session, which this block's Stop and the
    page's other Stop buttons stop (the draws held the one line with no
    way to end them: a Generate waited behind 60 draws for 105 s)."""
    policy, handlers, session, controls = page.policy, page.handlers, page.session, page.settings

    def run(session, n, engine, d, *values):
        settings = dict(zip(controls, values))
        yield from queued(handlers.line, session, lambda should_stop: draw(policy, page.models, n, d, engine=engine,
                                                                            should_stop=should_stop, **settings))

    instant = dict(queue=False, api_visibility="private")
    c.run.click(handlers.arm, session, session, **instant).then(
        run, [session, c.n, c.engine, page.drafter, *controls.values()], [c.status, c.plot, c.result],
        api_visibility="private", concurrency_limit=1, concurrency_id="exactness")
    # Named: unnamed, it would take "stop" from the Playground's public /stop (wired later).
    c.stop.click(handlers.stop, session, session, api_name="exactness_stop", **instant)
