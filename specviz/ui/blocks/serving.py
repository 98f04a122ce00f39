"""The "Serving engine" tab: the page's prompt sent to a real OpenAI-compatible server (vLLM,
SGLang, llama.cpp) with speculation on, then to a plain one, drawn with the engine's own
acceptance numbers; and a load sweep's chart.

The two requests go one after the other, never at once, so neither slows the other when
both servers share a machine (scripts/serve-vllm.sh starts them on this one). Server runs
wait in the handlers' Line like every run, within the policy's caps on tokens and time, and
only to URLs the policy allows (policy.check_server: a hosted app's operator names them).
The functions that talk to servers come in as `backend` (default: specviz.serving), so
tests and the browser test pass fakes.
"""
from __future__ import annotations

import os
import time
import types
from dataclasses import dataclass

import gradio as gr

from ...core.errors import SpecvizError
from ...render.status import MB, count, megabytes, status_html
from ...serving.figures import groups_html, headline_html, rate, run_dict, run_note, serving_figures
from ...serving.speed import DECODE, compare
from ...serving.state import explain
from . import uploads
from .following import follow
from ..live.limits import WAIT_POLL, Deadline, Line
from ..page import Page, named
from ..policy import MEASURED_LOAD, Policy
from ..live.runner import readable
from ...run.settings import Settings

UPDATE_EVERY, CHARTS_EVERY = 0.3, 2.0  # seconds, as in the playground (handlers.py)
REQUEST_TIMEOUT = 120.0  # seconds for one request when the policy sets no time limit
GRACE = 10.0  # the client's timeout beyond the time limit: the limit, which keeps the text, ends it first
MAX_MODEL_CHARS = 200
MAX_LOAD_BYTES = 8 * MB  # a sweep's JSON keeps a row per request: ~1 MB for thousands of requests
SETTINGS = ("prompt", "mode", "temperature", "seed", "max_new_tokens", "chat")  # the page's controls a server takes
WAITING = "Press Run: the server's output appears here, one box per step it sent."
CHARTS = ("steps", "positions", "speed")  # serving_figures' order


def sweep_too_large(name: str, size: str, limit: str) -> str:
    """The sentence that refuses a load sweep over the limit: the server's, and the page's own before
    a file is sent (uploads.py)."""
    return f"{name} is {size}: this app reads load sweeps of up to {limit}"


def default_backend():
    """specviz.serving's client and load report, imported at the first run: the page works without them."""
    try:
        from ...serving.client import stream_completion
        from ...serving.load_report import load_figure, read_json as read_result
        from ...serving.state import probe
    except ImportError as e:
        raise SpecvizError(f"this specviz has no serving client ({e})") from None
    return types.SimpleNamespace(stream_completion=stream_completion, read_result=read_result,
                                 load_figure=load_figure, probe=probe)


@dataclass(frozen=True)
class Controls:
    server: gr.Textbox
    baseline: gr.Textbox
    model: gr.Textbox
    run: gr.Button
    stop: gr.Button
    outputs: dict  # status, headline, two panels, three charts, summary: by values()' names
    load_file: gr.File
    load_path: gr.Textbox
    load_show: gr.Button
    load_status: gr.HTML
    load_plot: gr.Plot
    runs: "ServingRuns"  # the tab's handlers


def ready(policy: Policy) -> str:
    if policy.server_url:
        return "Ready: press Run to stream the prompt above from the server."
    if policy.hosted:
        return "This app has no serving engine: its operator names one with python app.py --server URL."
    return ("Start a server (on a CPU, llama-server --metrics --spec-type ngram-mod; on a GPU, "
            "scripts/serve-vllm.sh --spec ngram, or --spec suffix for suffix decoding: docs/serving.md), "
            "put its URL above and press Run.")


def controls(policy: Policy, runs: "ServingRuns") -> Controls:
    locked = "set by whoever runs this app (--server / --baseline-server)"
    gr.Markdown("The prompt above, sent to a real serving engine with speculation on, then to the same model "
                "without it. k and the drafter are the server's own; greedy or sampling, seed, max new tokens "
                "and the chat template come from the decoding settings (beside the tabs; above them on a phone).")
    with gr.Row():
        server = gr.Textbox(policy.server_url, label="Server URL (speculation on)", placeholder="http://127.0.0.1:8000",
                            interactive=not policy.hosted, elem_id="sv-server-url", scale=1,
                            info=locked if policy.hosted else "any OpenAI-compatible server: vLLM, SGLang, llama.cpp")
        baseline = gr.Textbox(policy.baseline_server_url, label="Plain server URL (optional)",
                              placeholder="http://127.0.0.1:8001", interactive=not policy.hosted,
                              elem_id="sv-baseline-url", scale=1,
                              info=locked if policy.hosted else "the same model, speculation off: for the speedup")
    with gr.Row(elem_classes="sv-actions"):
        model = gr.Textbox("", label="Model (optional)", placeholder="the server's first model", scale=4,
                           max_length=MAX_MODEL_CHARS, elem_id="sv-server-model")
        # A hosted app without a server has nothing to run: the button says so by being off.
        run = gr.Button("Run", variant="primary", scale=1, min_width=110, elem_id="sv-server-run",
                        interactive=bool(policy.server_url) or not policy.hosted)
        stop = gr.Button("Stop", variant="stop", scale=1, min_width=90, elem_id="sv-server-stop")
    outputs = dict(status=gr.HTML(status_html(ready(policy)), label="status", elem_id="sv-server-status"),
                   headline=gr.HTML(label="headline numbers", elem_id="sv-server-headline"))
    with gr.Row(equal_height=False, elem_classes="sv-panels"):
        outputs["spec"] = gr.HTML(groups_html(None, "Speculative server", WAITING), label="speculative server text",
                                  elem_id="sv-server-spec", min_width=300)
        outputs["base"] = gr.HTML(groups_html(None, "Plain server", WAITING), label="plain server text",
                                  elem_id="sv-server-base", min_width=300)
    blank = dict(zip(CHARTS, serving_figures(None, None)))
    with gr.Row(elem_classes="sv-charts"):
        outputs["steps"] = gr.Plot(blank["steps"], label="tokens per step chart", show_label=False, min_width=300,
                                   elem_id="sv-server-chart-steps")
        outputs["positions"] = gr.Plot(blank["positions"], label="draft positions chart", show_label=False,
                                       min_width=300, elem_id="sv-server-chart-positions")
    outputs["speed"] = gr.Plot(blank["speed"], label="speed chart", show_label=False, elem_id="sv-server-chart-speed")
    with gr.Accordion("Raw numbers (JSON, as the API returns them)", open=False):
        outputs["summary"] = gr.JSON(label="summary", elem_id="sv-server-summary")
    with gr.Accordion("Load sweep", open=bool(policy.load_result), elem_id="sv-load-box"):
        gr.Markdown("Many requests at once, with speculation on and off: tokens/s, time to first token, "
                    "inter-token latency and acceptance as concurrency grows (`python -m specviz load` writes "
                    "the JSON).")
        load_file = gr.File(label="A load sweep's result (.json)", file_types=[".json"], type="filepath",
                            elem_id="sv-load-file", height=120)
        with gr.Row(visible=not policy.hosted, elem_classes="sv-actions"):  # no paths for strangers
            load_path = gr.Textbox(policy.load_result, label="or a file on this machine", scale=4,
                                   elem_id="sv-load-path")
            load_show = gr.Button("Show", scale=1, min_width=90, elem_id="sv-load-show")
        status, figure = runs.show_path(policy.load_result) if policy.load_result else (status_html(""), None)
        load_status = gr.HTML(status, elem_id="sv-load-status")  # a bad file: its sentence, and the page still starts
        uploads.guard("#sv-load-file", MAX_LOAD_BYTES, sweep_too_large, ("#sv-load-status",))
        load_plot = gr.Plot(None if isinstance(figure, dict) else figure, show_label=False, elem_id="sv-load-plot")
    return Controls(server, baseline, model, run, stop, outputs, load_file, load_path, load_show, load_status,
                    load_plot, runs)


def values(message: str, state: str, spec=None, base=None, charts: bool = True, ahead: int | None = None) -> dict:
    """The tab's outputs by name (controls()'): status, headline, the two panels, three charts (gr.skip()
    unless `charts`), summary."""
    figures = serving_figures(spec, base) if charts else (gr.skip(),) * 3
    c = compare(spec, base)
    summary = {"state": state, "message": message, "ahead": ahead, "speedup": c.speedup,
               "speedup_basis": c.basis, "speedup_withheld": c.withheld, "prompt_caches": c.cache,
               "speculative": run_dict(spec), "baseline": run_dict(base)}
    return {"status": status_html(message, state), "headline": headline_html(spec, base),
            "spec": groups_html(spec, "Speculative server", WAITING if spec is None else "No text yet.", run_note(spec)),
            "base": groups_html(base, "Plain server", WAITING, run_note(base)),
            **dict(zip(CHARTS, figures)), "summary": summary}


class ServingRuns:
    """The tab's handlers: runs on servers (API: /serving) and the load sweep's chart."""

    def __init__(self, policy: Policy, line: Line, backend=None):
        self.policy, self.line, self._backend = policy, line, backend

    @property
    def backend(self):
        return self._backend or default_backend()

    def run(self, session, request: gr.Request = None, *, server, baseline="", model="", **controls):
        """Stream the speculative server, then the plain one; yields values() and the session."""
        def status(message, state, ahead=None):
            return {**values(message, state, ahead=ahead), "session": session}

        def updates(checked, should_stop):
            for update in self._requests(*checked, should_stop):
                yield {**update, "session": session}

        yield from self.line.run(session, request, status, lambda: self._check(server, baseline, model, controls),
                                 updates)

    def _check(self, server, baseline, model, controls) -> tuple[list, str, dict]:
        """The URLs to ask (policy-checked), the prompt and the request's options, or SpecvizError."""
        s = Settings.from_controls(**{name: controls[name] for name in SETTINGS if name in controls})
        self.policy.check_size(s)
        if s.max_new_tokens < 1:
            raise SpecvizError(f"max new tokens must be at least 1, got {s.max_new_tokens}")
        urls = [self.policy.check_server(server, "server")]
        if str(baseline or "").strip():
            urls.append(self.policy.check_server(baseline, "plain server"))
        model = str(model or "").strip()
        if len(model) > MAX_MODEL_CHARS:
            raise SpecvizError(f"the model name is {len(model)} characters: this app takes up to {MAX_MODEL_CHARS}")
        return urls, s.prompt, dict(model=model or None, max_tokens=s.max_new_tokens, temperature=s.temperature,
                                    seed=s.seed, chat=s.chat)

    def _requests(self, urls: list, prompt: str, options: dict, should_stop):
        """values() while each server streams; the last one says how it ended."""
        seconds = self.policy.max_run_seconds and self.policy.max_run_seconds / len(urls)  # a fair share each
        runs: list = [None, None]
        notes = []
        for i, (url, role) in enumerate(zip(urls, ("speculative", "plain"))):
            deadline = Deadline(should_stop, seconds)
            shown = charted = float("-inf")
            try:
                stream = follow(self.backend.stream_completion, url, prompt, deadline, WAIT_POLL,
                                timeout_s=seconds + GRACE if seconds else REQUEST_TIMEOUT, **options)
                while True:
                    run = next(stream)
                    runs[i] = run or runs[i]
                    now = time.monotonic()
                    if now - shown >= UPDATE_EVERY or run is None:
                        charts = now - charted >= CHARTS_EVERY
                        shown, charted = now, now if charts else charted
                        yield values(f"Streaming from the {role} server…", "running", *runs, charts=charts)
            except StopIteration as end:
                runs[i], cut = end.value
            except Exception as e:  # a readable line, never a traceback in the page
                yield values(f"The {role} server: {readable(e, self.policy.hosted)}", "error", *runs)
                return
            if runs[i] is not None and runs[i].error:
                yield values(f"The {role} server failed: {runs[i].error}", "error", *runs)
                return
            if cut:
                made = count(runs[i].tokens if runs[i] else 0, "token")
                if not deadline.passed or should_stop():
                    yield values(f"Stopped after {made} from the {role} server.", "stopped", *runs)
                    return
                # Its share of the time limit is up; the other server still gets its own share.
                notes.append(f" The {role} request stopped at this app's time limit ({seconds:g} s a request) "
                             f"after {made}.")
            elif i == 0:
                said = self._state(url, runs[0])
                notes.append(f" {said}" if said else "")
        yield values(_done(*runs) + "".join(notes), "done", *runs)

    def _state(self, url: str, run) -> str | None:
        """Why the speculative run shows no drafting, for the engine in front of us (None: it drafted)."""
        if run is None or (run.spec is not None and run.spec.drafted):
            return None
        look = getattr(self.backend, "probe", None)  # a test's fake backend may have none
        try:
            found = look(url) if look is not None else None
        except Exception:  # the run is done; a failed look only loses the detail
            found = None
        return explain(run, found)

    def show_path(self, path):
        """The load sweep in a file named by path (any when visitors are trusted; hosted: the operator's)."""
        try:
            path = self.policy.check_load_path(path)
        except SpecvizError as e:
            return status_html(str(e), "error"), gr.skip()
        if os.path.abspath(path) == str(MEASURED_LOAD):
            name = "the sweep measured for the README (vLLM on a 2-core CPU, ngram k = 4 on and off)"
        else:
            name = path if not self.policy.hosted else os.path.basename(path)
        return self._show(path, name)

    def show_upload(self, path):
        if not path:
            return status_html(""), None
        return self._show(str(path), "the uploaded file")

    def _show(self, path: str, name: str):
        try:
            size = os.path.getsize(path)
            if size > MAX_LOAD_BYTES:
                raise SpecvizError(sweep_too_large(name, megabytes(size), megabytes(MAX_LOAD_BYTES)))
            try:
                result = self.backend.read_result(path)
            except (ValueError, KeyError, TypeError) as e:  # JSON that is not a sweep: say so, not a traceback
                raise SpecvizError(f"{name} is not a specviz-load result ({type(e).__name__}: {e})") from None
            figure = self.backend.load_figure(result)
        except OSError:
            return status_html(f"cannot read {name}", "error"), gr.skip()
        except Exception as e:
            return status_html(readable(e, self.policy.hosted), "error"), gr.skip()
        return status_html(f"Load sweep from {name}.", "done"), figure


def _done(spec, base) -> str:
    if spec is None:
        return "Done: the server sent nothing back."
    message = f"Done: {count(spec.tokens, 'token')} at {_tps(spec)}"
    if base is not None:
        c = compare(spec, base)
        message += f"; plain server {_tps(base)}"
        if c.speedup is not None:
            message += f", speedup {c.speedup:.2f}× ({'decode only' if c.basis == DECODE else 'end to end'})"
        elif c.withheld:
            message += f"; no speedup: {c.withheld}"
        if c.cache:
            message += f"; {c.cache}"
    return message + "."


def _tps(run) -> str:
    if run.decode_tokens_per_s:
        return f"{run.decode_tokens_per_s:.1f} tok/s decoding"
    return f"{rate(run):.1f} tok/s"


def wire(c: Controls, page: Page) -> None:
    """Run takes the URLs, the model and the page's shared settings by name (API: /serving),
    in the handlers' Line and their Session (so the page's other Stop buttons and runs agree)."""
    runs, session, handlers, outputs = c.runs, page.session, page.handlers, {**c.outputs, "session": page.session}
    inputs = dict(server=c.server, baseline=c.baseline, model=c.model) | {name: page.settings[name] for name in SETTINGS}
    instant = dict(queue=False, api_visibility="private")
    c.run.click(handlers.arm, session, session, **instant).then(
        named(runs.run, outputs), session, list(outputs.values()), inputs_kwargs=inputs, api_name="serving",
        **page.queued)
    # Named: unnamed, it would take "stop" from the Playground's public /stop (wired later).
    c.stop.click(handlers.stop, session, session, api_name="serving_stop", **instant)
    c.load_file.upload(runs.show_upload, c.load_file, [c.load_status, c.load_plot], **instant)
    c.load_show.click(runs.show_path, c.load_path, [c.load_status, c.load_plot], **instant)
