"""The page: the target and decoding settings on the left; the shared prompt, then the
Playground, Compare and Serving engine tabs, on the right."""
from __future__ import annotations

import pathlib

import gradio as gr

from ..engine.generate import GenerationConfig
from ..render import (Trace, compare_figures, empty_figures, legend_html, panel_html, primer_html, side_by_side_html,
                      status_html, step_html)
from ..render.compare import HEADERS, WIDTHS
from ..run.spec import parse
from .blocks import controllers, distribution, exactness, hardware, reading, replay, serving
from .views import CHARTS
from .blocks.examples import Example, load_examples, note_html
from .handlers import STOPPING, Handlers, Session, zero_gpu
from .page import Page, named, said
from .policy import MAX_TRACE_BYTES, Policy, policy_from_env
from . import requests
from .requests import count_values
from ..run.settings import BOUNDS, GREEDY, SAMPLING, Settings, in_words

TREES_UP_TO = GenerationConfig().sampled_trees_up_to  # the engine's tree policy, which the slider states

REFUSING = 2  # handler threads beyond the Line's capacity, free to turn the next visitors away
ASSETS = pathlib.Path(__file__).resolve().parents[2] / "assets"
INTRO = (
    "Speculative decoding makes a language model write faster without changing its answer: a small, fast "
    "<b>drafter</b> guesses the next <i>k</i> <b>tokens</b> (word pieces), and the large <b>target</b> model checks "
    "them all in one <b>forward pass</b> (one costly run of the model), keeping those it agrees with. The "
    "<b>speculative</b> panel below shows a run this way, beside the <b>baseline</b>: the target alone, one pass per "
    "token. Hover or tap a token for its probabilities."
)
# The page's first Tab stops, before the settings column: Generate was 29 Tab presses from the top;
# the inspector and the charts lie past the panels. Shown when focused (style.css).
SKIP = ('<nav class="sv-skip" aria-label="Skip to">'
        '<a href="#sv-prompt" data-focus="#sv-prompt textarea">Skip to prompt</a>'
        '<a href="#sv-generate" data-focus="#sv-generate">Skip to Generate</a>'
        '<a href="#sv-inspector-box" data-focus="#sv-inspector">Skip to step inspector</a>'
        '<a href="#sv-chart-acceptance" data-focus="#sv-chart-acceptance .js-plotly-plot">Skip to charts</a></nav>')
READY = "Ready: pick a drafter and press Generate."
WAITING = "Press Generate: the tokens appear here as they are decoded."


def theme() -> gr.themes.Base:
    # System fonts only: the app must work offline, so nothing is fetched from a font CDN.
    # WCAG AA contrast (4.5:1) in the light theme, which a projector shows: Gradio's subdued text
    # (info lines, slider ends, every label that reads it) is slate-400 on white, 2.56:1, and white on
    # its primary and stop buttons 3.67:1 and 3.76:1. Slate-600 is 7.6:1; blue-600 5.2:1, red-600 4.8:1.
    return gr.themes.Default(
        primary_hue="blue", neutral_hue="slate", radius_size="md",
        font=["Inter", "system-ui", "Segoe UI", "Roboto", "Helvetica Neue", "Arial", "sans-serif"],
        font_mono=["JetBrains Mono", "ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"],
    ).set(
        body_text_color_subdued="*neutral_600",
        button_primary_background_fill="*primary_600", button_primary_background_fill_hover="*primary_700",
        button_primary_background_fill_dark="*primary_600", button_primary_background_fill_hover_dark="*primary_700",
        button_cancel_background_fill="#dc2626", button_cancel_background_fill_hover="#b91c1c",
    )


def launch_options() -> dict:
    """The launch() arguments that style the page (Gradio 6 takes theme and css there)."""
    return {"theme": theme(), "css": (ASSETS / "style.css").read_text(encoding="utf-8"),
            "head": f'<script>{(ASSETS / "specviz.js").read_text(encoding="utf-8")}</script>',  # before any block
            "max_file_size": MAX_TRACE_BYTES,  # the page's only upload is a trace to replay
            "app_kwargs": requests.handlers()}  # a malformed body: specviz's sentence, not FastAPI's bare 422


SAMPLING_TEMPERATURE = 0.7  # what the temperature slider offers when a visitor switches to sampling


def _slider(name: str, low: float | None = None, high: float | None = None, **options) -> gr.Slider:
    """A setting's slider, from its field's Bounds (run/settings.py), which every entry point checks against."""
    b = BOUNDS[name]
    return gr.Slider(b.low if low is None else low, b.high if high is None else high, step=b.step, **options)


def precision_choices() -> list[tuple[str, str]]:
    """The precisions offered, bf16 said slower where this CPU's bf16 multiply measured slower than fp32."""
    import torch

    from ..modeling.packing import native_bf16

    gpu = torch.cuda.is_available()
    half = "bf16" if gpu or native_bf16() else "bf16 (slower: no bf16 in this CPU)"
    return [("auto (bf16)" if gpu else "auto (fp32)", "auto"), ("fp32", "float32"),
            (half, "bfloat16")] + ([("fp16", "float16")] if gpu else [])


def precision_info(target: str) -> str:
    """What each precision costs on this machine, as its kernel table measured it for `target` (the embedded
    model, once converted), or where the figures will come from."""
    from ..modeling import llama_fast, packing
    from ..modeling.embedded import MARKER, MODEL_DIR, cache_dir

    base = "fp32: text identical to plain decoding; bf16: half the bytes, may part from its plain run at a near-tie"
    later = base + "; each one's cost here is timed at its first run"
    folder = cache_dir() / MODEL_DIR
    if target != "default" or not (folder / MARKER).is_file():
        return later
    try:
        from transformers import AutoConfig

        costs = packing.pass_costs(llama_fast.pass_shapes(AutoConfig.from_pretrained(folder)))
    except (OSError, ValueError, AttributeError):
        return later
    said = [f"{name} {one:.0f} ms a token, 9 checked for {nine / one:.2f}x" for name, (one, nine) in
            (("fp32", costs.get("float32", (0, 0))), ("bf16", costs.get("bfloat16", (0, 0)))) if one]
    return base + (f". Measured here (a pass's multiplies): {'; '.join(said)}" if said else
                   "; each one's cost here is timed at its first run")


def _settings(policy: Policy) -> dict:
    """The target and the decoding settings (the left column), keyed by the Settings field (and
    API parameter) each fills; the ones most often changed come first, above the fold."""
    d = Settings(prompt="")  # the defaults, from the engine's
    left_out = " and ".join(label for label, _, _ in policy.too_big)
    info = "the model whose output we want" + ("" if policy.hosted else "; or type a Hub id or a local folder")
    if left_out:  # say why a model the docs promise is missing: this machine's memory
        info += f"; {left_out} needs more memory than this machine has"
    target = gr.Dropdown(list(policy.targets), value=policy.default_target, label="Target model",
                         allow_custom_value=not policy.hosted, elem_id="sv-target", info=info)
    dtype = gr.Dropdown(precision_choices(), value=d.dtype, label="Precision", elem_id="sv-dtype",
                        info=precision_info(policy.default_target))
    with gr.Accordion("Decoding settings", open=True):
        k = _slider("k", value=d.k, label="k: draft tokens per step", elem_id="sv-k")
        mode = gr.Radio([GREEDY, SAMPLING], value=GREEDY if d.greedy else SAMPLING, label="Decoding")
        with gr.Group(visible=not d.greedy) as sampling_group:
            temperature = _slider("temperature", BOUNDS["temperature"].step,  # 0 is the radio's greedy
                                  value=d.temperature or SAMPLING_TEMPERATURE, label="temperature",
                                  elem_id="sv-temperature",
                                  info=f"EAGLE and Medusa draft trees up to {TREES_UP_TO:g}, chains above: "
                                       "what paid more on the examples")
            top_k = _slider("top_k", value=d.top_k, label="top-k (0 = off)", elem_id="sv-top-k")
            top_p = _slider("top_p", value=d.top_p, label="top-p (1 = off)", elem_id="sv-top-p")
            verification = gr.Radio([("token by token", "token"), ("as a block", "block")], value=d.verification,
                                    label="verification of a chain draft", elem_id="sv-verification",
                                    info="both keep the target's distribution exactly; as a block is the default: "
                                         "on the same sampled steps it kept up to 8% more drafts for every drafter "
                                         "with a q, the same for prompt lookup; the step inspector shows both")
        # Full width: beside the seed its maximum read "1" and the row scrolled sideways.
        max_new_tokens = _slider("max_new_tokens", high=policy.max_new_tokens, label="max new tokens",
                                 value=min(d.max_new_tokens, policy.max_new_tokens), elem_id="sv-max-new-tokens")
        dynamic_k = gr.Checkbox(d.dynamic_k, label="dynamic k: each step's length from the acceptance and costs measured so far")
        repetition_penalty = _slider("repetition_penalty", value=d.repetition_penalty,
                                     label="repetition penalty (1 = off)", elem_id="sv-repetition-penalty")
        seed = gr.Number(d.seed, precision=0, label="seed")
        chat = gr.Checkbox(d.chat, label="wrap the prompt in the chat template (where the model has one)")
    mode.change(lambda m: gr.Group(visible=m == SAMPLING), mode, sampling_group, queue=False,
                api_visibility="private")
    return dict(target=target, k=k, dynamic_k=dynamic_k, mode=mode, temperature=temperature,
                top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty, seed=seed,
                max_new_tokens=max_new_tokens, chat=chat, verification=verification, dtype=dtype)


def _prompt(examples: list[Example]):
    """The prompt both tabs run, above them, with the examples that fill it (and what each teaches)."""
    prompt = gr.Textbox(label="Prompt", lines=4, max_lines=8, value=examples[0].prompt if examples else "",
                        elem_id="sv-prompt")
    picker = None
    if examples:
        picker = gr.Examples(examples=[[e.prompt] for e in examples], inputs=[prompt], cache_examples=False,
                             example_labels=[e.label for e in examples],
                             label=f"Examples (speed measured on {examples[0].machine})" if examples[0].machine
                             else "Examples")
    note = gr.HTML(note_html(examples[0]) if examples else "", elem_id="sv-example-note")
    return prompt, picker, note


def _wire_examples(examples: list[Example], picker, prompt, drafter, note, mode, session, runs,
                   policy: Policy) -> None:
    """A picked example also picks the drafter it was measured with and says what it teaches, while
    its prompt is in the box and decoding is greedy (its figures were measured greedy); a prompt of
    one's own, or sampling, hides the note, and the Serving tab hides it too (style.css). Picked
    during a run, the example waits: the note and the drafter change once the run on screen ends."""
    if picker is None:
        return
    by_prompt = {e.prompt: e for e in examples}

    def about(text, m) -> str:
        e = by_prompt.get(text)
        return note_html(e) if e is not None and m == GREEDY else ""

    def drafter_of(text):
        e = by_prompt.get(text)
        value = None if e is None else menu_value(e.drafter, policy)
        return gr.Dropdown() if value is None else gr.Dropdown(value=value)

    def pick(text, m, session: Session):
        if session.busy:
            session.picked = True
            return gr.skip(), gr.skip()
        return drafter_of(text), about(text, m)

    def retell(text, m, session: Session):
        return gr.skip() if session.busy else about(text, m)

    def settle(text, m, session: Session):
        """After a run: what was picked during it takes effect."""
        picked, session.picked = session.picked, False
        return (drafter_of(text) if picked else gr.skip()), about(text, m)

    instant = dict(queue=False, api_visibility="private")
    picker.load_input_event.then(pick, [prompt, mode, session], [drafter, note], **instant)
    prompt.change(retell, [prompt, mode, session], note, **instant)
    mode.change(retell, [prompt, mode, session], note, **instant)
    for run in runs:
        run.then(settle, [prompt, mode, session], [drafter, note], **instant)


def menu_value(drafter: str, policy: Policy) -> str | None:
    """The drafter menu's own entry for `drafter` ("pld" is the entry "prompt lookup"): a value the
    menu does not list showed raw, as "pld". None when the menu offers no such drafter."""
    name = parse(drafter).label
    return next((value for _, value in policy.drafters if parse(value).label == name), None)


def _playground_tab(policy: Policy):
    with gr.Row(elem_classes="sv-actions"):
        drafter = gr.Dropdown(list(policy.drafters), value=policy.default_drafter, label="Drafter", scale=4,
                              allow_custom_value=not policy.hosted, elem_id="sv-drafter",
                              info="none, prompt lookup, suffix decoding (copies from the prompt and your earlier answers), layer skip, the trained EAGLE / Medusa / distilled drafters (NAME+pld: copy where the text repeats, NAME elsewhere; suffix+NAME likewise), or a draft model sharing the target's tokenizer")
        run = gr.Button("Generate", variant="primary", scale=1, min_width=110, elem_id="sv-generate")
        stop = gr.Button("Stop", variant="stop", scale=1, min_width=90, elem_id="sv-stop")
    # What the page shows before (and after a reload during) a run: never blank blocks. By name,
    # as views.playground_values fills them; this order is /generate's.
    shown = dict(status=gr.HTML(status_html(READY), label="status", elem_id="sv-status"),
                 check=gr.HTML(label="greedy check", elem_id="sv-check"),
                 headline=gr.HTML(label="headline numbers", elem_id="sv-headline"))
    gr.HTML(legend_html(short=True), elem_classes="sv-legend-box")
    reading.controls()
    steps = replay.stepper()  # right above the panels it animates
    with gr.Row(equal_height=False, elem_classes="sv-panels"):
        shown["spec"] = gr.HTML(panel_html(Trace("speculative"), "Speculative", placeholder=WAITING),
                                label="speculative text", elem_id="sv-spec", min_width=300)
        shown["base"] = gr.HTML(panel_html(Trace("baseline", speculative=False), "Baseline · plain decoding",
                                           placeholder=WAITING), label="baseline text", elem_id="sv-base", min_width=300)
    # The inspector right under the panels: the step buttons above them change both.
    with gr.Accordion("Step inspector", open=True, elem_id="sv-inspector-box"):
        step = gr.Slider(1, 2, value=1, step=1, label="step", interactive=False, elem_id="sv-step",
                         buttons=[])  # no reset button: step 1 is no default, and it was one more Tab stop
        inspector = gr.HTML(step_html(Trace("speculative"), 0), label="step inspector", elem_id="sv-inspector")
    blank = dict(zip(CHARTS, empty_figures()))
    chart = dict(show_label=False, min_width=300)
    meter = controllers.meter_box()  # right above the acceptance chart: high acceptance over a loop is no success
    with gr.Row(elem_classes="sv-charts"):  # two by two; one column on a phone (assets/style.css)
        shown["acceptance"] = gr.Plot(blank["acceptance"], label="acceptance chart", elem_id="sv-chart-acceptance",
                                      **chart)
        shown["throughput"] = gr.Plot(blank["throughput"], label="throughput chart", elem_id="sv-chart-throughput",
                                      **chart)
    with gr.Row(elem_classes="sv-charts"):
        shown["lengths"] = gr.Plot(blank["lengths"], label="accepted lengths chart", elem_id="sv-chart-lengths",
                                   **chart)
        shown["positions"] = gr.Plot(blank["positions"], label="draft positions chart", elem_id="sv-chart-positions",
                                     **chart)
    shown |= dict(step=step, inspector=inspector)
    with gr.Accordion("Raw numbers (JSON, as the API returns them)", open=False):
        shown["summary"] = gr.JSON(label="summary", elem_id="sv-summary")
    return drafter, run, stop, shown, steps, meter


def _compare_tab(policy: Policy):
    with gr.Row(elem_classes="sv-actions"):
        drafters = gr.Dropdown(list(policy.compare_choices), value=list(policy.compare_drafters), multiselect=True,
                               allow_custom_value=not policy.hosted, label="Drafters to compare", scale=4,
                               elem_id="sv-compare-drafters",
                               info="each runs the same prompt and settings as the baseline: all warmed up, "
                                    "then taking turns, three times")
        run = gr.Button("Compare", variant="primary", scale=1, min_width=110, elem_id="sv-compare")
        stop = gr.Button("Stop", variant="stop", scale=1, min_width=90, elem_id="sv-compare-stop")
    blank = compare_figures([])
    shown = dict(status=gr.HTML(status_html("Pick drafters and press Compare."), label="status",
                                elem_id="sv-compare-status"),
                 # max_height: Gradio's 500 px hid the last of ten drafters' rows below the table's box
                 table=gr.Dataframe(headers=HEADERS, label="comparison", interactive=False,
                                    elem_id="sv-compare-table", wrap=True, column_widths=WIDTHS, max_height=4000),
                 # Full width, one above the other: horizontal bars need room for the run names. Drawn
                 # empty at first: Gradio's own empty plot box is a div with an aria-label and no role (axe: serious)
                 speed=gr.Plot(blank[0], label="throughput chart", show_label=False, elem_id="sv-compare-speed"),
                 quality=gr.Plot(blank[1], label="acceptance chart", show_label=False, elem_id="sv-compare-quality"),
                 panels=gr.HTML(side_by_side_html(Trace("baseline", speculative=False), []),
                                label="outputs side by side", elem_id="sv-compare-panels"))
    with gr.Accordion("Raw numbers (JSON, as the API returns them)", open=False):
        shown["summary"] = gr.JSON(label="summary", elem_id="sv-compare-summary")
    return drafters, run, stop, shown


def build_app(policy: Policy | None = None, models=None, examples: list[Example] | None = None,
              engines=None) -> gr.Blocks:
    """The whole app. `models` defaults to specviz.modeling.models (tests may pass their own loader);
    `engines`, the functions that talk to serving engines, to specviz.serving's (serving.default_backend)."""
    if policy is None:
        policy = policy_from_env()
    if models is None:
        from ..modeling import models
    examples = load_examples() if examples is None else examples
    handlers = Handlers(policy, models)
    # Every run enters its handler at once and waits in the handlers' Line, which can say
    # "busy, N ahead of you"; Gradio's limit only bounds the threads, with room to refuse a few.
    # preprocess=False: Settings checks the raw values, so a script's "abc" or 1e30 gets a sentence.
    slots = policy.concurrency + policy.max_waiting + REFUSING
    queued = dict(concurrency_limit=slots, concurrency_id="models", preprocess=False)
    instant = dict(queue=False, api_visibility="private")
    with gr.Blocks(title="specviz: speculative decoding, visible") as demo:
        session = gr.State(Session(policy.suffix_memory_tokens))
        # a typed -5 said in a sentence, a field named as sentences name it; Stop's word at the press (assets/specviz.js)
        said("box-names", {f"sv-{name.replace('_', '-')}": in_words(name) for name in BOUNDS})
        said("stopping", STOPPING)
        gr.HTML(f'{SKIP}<div class="sv-header"><h1>specviz</h1><div class="sv-intro"><p>{INTRO}</p>{primer_html()}'
                '</div></div>')
        with gr.Row(equal_height=False, elem_classes="sv-main"):
            with gr.Column(scale=1, min_width=300, elem_classes="sv-controls"):
                controls = _settings(policy)
            with gr.Column(scale=3, min_width=320):
                prompt, picker, note = _prompt(examples)
                controls = dict(prompt=prompt) | controls
                with gr.Tabs(overflow_behavior="wrap"):  # a phone hid Compare and Serving behind "..."
                    with gr.Tab("Playground", id="playground"):
                        drafter, run, stop, shown, steps, meter = _playground_tab(policy)
                        page = Page(policy, models, handlers, session, controls, drafter, run, shown["step"], shown,
                                    queued)
                        dist_controls = distribution.controls()
                        exact_controls = exactness.controls(policy)
                        replay_controls = replay.controls(steps, policy)
                        hardware_controls = hardware.controls()
                        controller_controls = controllers.controls()
                    with gr.Tab("Compare drafters", id="compare"):
                        drafters, cmp_run, cmp_stop, cmp_shown = _compare_tab(policy)
                    with gr.Tab("Serving engine", id="serving"):
                        server_controls = serving.controls(policy, serving.ServingRuns(policy, handlers.line, engines))
        # The handlers take the controls by name; /generate lists prompt, target, drafter, then the rest.
        play = dict(prompt=controls["prompt"], target=controls["target"], drafter=drafter) | controls
        outputs = page.shown()
        page.generate = run.click(handlers.arm, session, session, **instant).then(
            named(handlers.generate, outputs), session, list(outputs.values()), inputs_kwargs=play,
            api_name="generate", **queued)
        page.on_screen.append(page.generate)
        replay.wire(replay_controls, page)  # before hardware: it follows the replay's events too
        hardware.wire(hardware_controls, page)
        controllers.wire_meter(meter, page)
        controllers.wire(controller_controls, page)
        distribution.wire(dist_controls, page)
        exactness.wire(exact_controls, page)
        outputs = {**cmp_shown, "session": session}
        comparing = cmp_run.click(handlers.arm, session, session, **instant).then(
            named(handlers.compare, outputs), [session, drafters], list(outputs.values()), inputs_kwargs=controls,
            api_name="compare", **queued)
        serving.wire(server_controls, page)
        _wire_examples(examples, picker, prompt, drafter, note, controls["mode"], session, (page.generate, comparing),
                       policy)
        # ZeroGPU runs handlers in another process, out of reach of the stop flag: cancel there.
        cancels = dict(cancels=[page.generate, comparing]) if zero_gpu() else {}
        stop.click(handlers.stop, session, session, api_name="stop", queue=False, **cancels)
        cmp_stop.click(handlers.stop, session, session, queue=False, api_visibility="private", **cancels)
        # said at the press, before the server hears it: every Stop ends all of the visitor's runs
        for button in (stop, cmp_stop, exact_controls.stop, server_controls.stop):
            button.click(None, js="svStopping", queue=False, api_visibility="private")
        # always_last: a drag sends many values; the one it ends on must arrive, and last
        page.step.input(handlers.inspect, [session, page.step], shown["inspector"], trigger_mode="always_last",
                        **instant)
    demo.queue(default_concurrency_limit=policy.concurrency, max_size=slots)  # a flood beyond: Gradio's 503
    count_values(demo)  # a script's request with a value too few or too many: a sentence, not Gradio's error
    return demo
