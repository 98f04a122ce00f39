"""The app below the page: what visitors may ask for, how runs report progress and failure."""
from __future__ import annotations

import copy
import html
import re
import sys
import threading
import time
import types

import pytest
import torch
from app_server import PROMPT, app_models, slow_prefill  # noqa: F401 (app_models is a fixture)
from conftest import tiny_llama

from specviz.core.errors import SpecvizError
from specviz.core.sampling import Sampling
from specviz.drafters.suffix import Suffix
from specviz.drafters.suffix_memory import SuffixMemory
from specviz.engine.generate import GenerationConfig, collect, speculative_generate
from specviz.modeling import models as real_models
from specviz.render import Trace
from specviz.ui import Policy, Settings, build_app, hosted_policy, policy_from_env
from specviz.ui.live import runner
from specviz.run.settings import BOUNDS
from specviz.ui.live.compare import compare_drafters
from specviz.ui.handlers import Session
from specviz.ui.live.limits import Deadline
from specviz.ui.live.runner import Frame, throttle
from specviz.ui.layout import SAMPLING_TEMPERATURE
from specviz.ui.views import playground_summary, playground_values


def never() -> bool:
    return False


def TokenEventFor(token: int):  # noqa: N802 (reads as the event it makes)
    from specviz.core.events import TokenEvent

    return TokenEvent(step=0, token=token, p=0.5, time=0.01, elapsed=0.01)


def final(frames) -> Frame:
    *_, last = frames
    return last


# ---- what a deployment allows ------------------------------------------------------------

def test_hosted_mode_is_on_for_spaces_and_on_request():
    assert not policy_from_env({}).hosted
    for env in ({"SPACE_ID": "someone/specviz"}, {"SPECVIZ_HOSTED": "1"}):
        p = policy_from_env(env)
        assert p.hosted and p.max_new_tokens == 256 and p.concurrency == 1


def test_hosted_mode_refuses_local_paths_unlisted_models_and_long_runs():
    p = hosted_policy()
    p.check(Settings(prompt="hi", target="default", drafter="prompt lookup", max_new_tokens=256))
    with pytest.raises(SpecvizError, match="only runs these targets"):
        p.check(Settings(prompt="hi", target="/home/me/model"))
    with pytest.raises(SpecvizError, match="only offers these drafters"):
        p.check(Settings(prompt="hi", drafter="./my-drafter"))
    with pytest.raises(SpecvizError, match="capped at 256"):
        p.check(Settings(prompt="hi", max_new_tokens=257))
    Policy().check(Settings(prompt="hi", target="/home/me/model", drafter="./my-drafter"))  # local: anything


def test_hosted_app_runs_one_at_a_time_and_offers_only_the_allow_list():
    policy = hosted_policy()
    assert policy.concurrency == 1 and policy.runs_per_visitor == 1  # the handlers' line (test_app_load)
    demo = build_app(policy)
    queued = {f.api_name: f for f in demo.fns.values() if f.api_name in ("generate", "compare")}
    assert queued["generate"].concurrency_id == queued["compare"].concurrency_id  # one queue for both
    assert demo._queue.max_size == queued["generate"].concurrency_limit < 20  # a flood gets Gradio's 503
    props = {c["props"].get("elem_id"): c["props"] for c in demo.config["components"]}
    for menu in ("sv-target", "sv-drafter", "sv-compare-drafters"):
        assert props[menu]["allow_custom_value"] is False
    sliders = {c["props"]["label"]: c["props"] for c in demo.config["components"] if c["type"] == "slider"}
    assert sliders["max new tokens"]["maximum"] == 256


def test_a_refused_request_loads_nothing():
    def load(*args, **kwargs):
        raise AssertionError("a refused request must not load a model")

    stub = types.SimpleNamespace(load=load)
    frame = final(runner.playground(Settings(prompt="hi", target="/etc"), hosted_policy(), stub, never))
    assert frame.state == "error" and "only runs these targets" in frame.message


# ---- controls to settings ---------------------------------------------------------------

CONTROLS = dict(prompt=PROMPT, target="default", drafter="none", k=4, dynamic_k=False, mode="greedy",
                temperature=0.8, top_k=0, top_p=1.0, repetition_penalty=1.0, seed=0, max_new_tokens=8, chat=True)


def test_controls_become_engine_settings():
    s = Settings.from_controls(**dict(CONTROLS, drafter="prompt lookup", k=4.0, dynamic_k=True, mode="sampling",
                                      top_k=50.0, top_p=0.9, repetition_penalty=1.1, seed=7.0, max_new_tokens=32.0,
                                      chat=False))
    assert (s.k, s.top_k, s.seed, s.max_new_tokens) == (4, 50, 7, 32) and not s.greedy and not s.chat
    cfg = s.config(eos_token_ids=(2,))
    assert cfg.sampling.temperature == 0.8 and cfg.dynamic_k and cfg.eos_token_ids == (2,)
    assert cfg.tree_nodes == 8  # EAGLE/Medusa trees of 2k candidates: k = 4 nodes was a straight line
    # ... when greedy, and sampling up to 0.85 (trees paid more at 0.7, chains at 1.0: docs/performance.md)
    assert cfg.trees and Settings.from_controls(**dict(CONTROLS, mode="greedy", temperature=1.0)).config().trees
    assert not Settings.from_controls(**dict(CONTROLS, mode="sampling", temperature=1.0)).config().trees
    assert Settings.from_controls(**dict(CONTROLS, mode="sampling", temperature=0.85)).config().trees
    with pytest.raises(SpecvizError, match="whole number"):
        Settings.from_controls(**dict(CONTROLS, k=2.5))


def test_a_scripts_list_or_number_for_text_is_refused_in_a_sentence_not_run_as_its_printout():
    """The API ran prompt=['a'] as the prompt "['a']"."""
    with pytest.raises(SpecvizError, match=r"^prompt must be one string of text; got \['a'\] \(list\)$"):
        Settings.from_controls(**dict(CONTROLS, prompt=["a"]))
    with pytest.raises(SpecvizError, match=r"drafter must be one string of text; got 3 \(int\)"):
        Settings.from_controls(**dict(CONTROLS, drafter=3))
    with pytest.raises(SpecvizError, match=r"got \['xxxxx.*x\.\.\. \(list\)$"):  # a long one is cut short
        Settings.from_controls(**dict(CONTROLS, prompt=["x" * 500]))
    assert Settings.from_controls(**dict(CONTROLS, prompt=None)).prompt == ""


def test_greedy_is_temperature_zero_whichever_way_it_is_asked_for():
    radio = Settings.from_controls(**CONTROLS)  # the radio says greedy; the hidden slider says 0.8
    assert radio.greedy and radio.temperature == 0 and radio.config().sampling.greedy
    assert Settings(prompt="hi").greedy and not Settings(prompt="hi", temperature=0.5).greedy
    script = dict(CONTROLS)
    del script["mode"]  # no radio: the temperature alone decides
    assert not Settings.from_controls(**script).greedy
    with pytest.raises(SpecvizError, match="sampling needs a temperature above 0"):
        Settings.from_controls(**dict(CONTROLS, mode="sampling", temperature=0))


@pytest.mark.parametrize("bad, words", [(dict(temperature=-1), "temperature must be from 0 to 2, got -1"),
                                        (dict(temperature="nan"), "finite"), (dict(top_p=0), "top-p"),
                                        (dict(repetition_penalty=-2), "repetition penalty")])
@pytest.mark.parametrize("mode", ["greedy", "sampling"])
def test_a_value_the_engine_refuses_is_refused_in_greedy_mode_too(mode, bad, words):
    """One rule: greedy ignores the sampling values, but a script's mistake in them is still told."""
    with pytest.raises(SpecvizError, match=words):
        Settings.from_controls(**dict(CONTROLS, mode=mode, **bad))


@pytest.mark.parametrize("bad, said", [
    (dict(k=10 ** 308), "k must be from 1 to 64, got 1.00e308 (309 digits)"),  # was its 309 digits
    (dict(k="1" + "0" * 308), "k must be from 1 to 64, got 1.00e308 (309 digits)"),
    (dict(top_p=1.0000001), "top-p must be from 0.05 to 1, got 1.0000001"),  # was "got 1"
    (dict(max_new_tokens="x" * 500), "max new tokens must be a whole number, got 'xxxx"),
])
def test_a_refusal_names_the_field_the_value_shortened_and_never_rounded_onto_a_bound_and_the_range(bad, said):
    with pytest.raises(SpecvizError) as refused:
        Settings.from_controls(**dict(CONTROLS, **bad))
    assert str(refused.value).startswith(said) and len(str(refused.value)) < 100, str(refused.value)


def test_the_page_starts_from_the_engines_defaults():
    cfg, sampling = GenerationConfig(), Sampling()
    s = Settings(prompt="hi")
    assert (s.k, s.dynamic_k, s.max_new_tokens) == (cfg.k, cfg.dynamic_k, cfg.max_new_tokens)
    assert s.sampling == sampling
    demo = build_app(Policy(), examples=[])
    props = {c["props"].get("label"): c["props"] for c in demo.config["components"]}
    assert props["k: draft tokens per step"]["value"] == cfg.k
    assert props["max new tokens"]["value"] == cfg.max_new_tokens
    assert props["Decoding"]["value"] == "greedy"
    assert props["temperature"]["value"] == SAMPLING_TEMPERATURE  # offered once sampling is chosen
    # The sliders' ends are the bounds generate and the API check against (run/settings.py): temperature starts
    # a step above 0 (greedy is the radio's), max new tokens ends at the deployment's cap.
    for name, label in (("k", "k: draft tokens per step"), ("temperature", "temperature"), ("top_k", "top-k (0 = off)"),
                        ("top_p", "top-p (1 = off)"), ("repetition_penalty", "repetition penalty (1 = off)"),
                        ("max_new_tokens", "max new tokens")):
        b, slider = BOUNDS[name], props[label]
        assert (slider["minimum"], slider["maximum"], slider["step"]) == (
            b.step if name == "temperature" else b.low, b.high or Policy().max_new_tokens, b.step), name


# ---- runs: progress, failures, throttling --------------------------------------------------

def test_model_loading_reports_progress_before_the_run(app_models):
    def load(name, progress=None, **kwargs):
        for i in range(3):
            progress(f"downloading {i}/3", i / 3)
        return real_models.load(name, progress=progress, **kwargs)

    stub = types.SimpleNamespace(**{n: getattr(real_models, n) for n in ("encode_prompt", "decode",
                                                                        "check_same_vocab")}, load=load)
    s = Settings(prompt=PROMPT, target=app_models["target"], drafter="prompt lookup", max_new_tokens=6)
    seen = [(f.state, f.message, f.fraction) for f in runner.playground(s, Policy(), stub, never)]
    loading = [m for state, m, _ in seen if state == "loading"]
    assert any("downloading 1/3" in m for m in loading)
    assert seen.index(next(x for x in seen if x[0] == "running")) > len(loading) - 1
    assert seen[-1][0] == "done"


def test_the_status_names_each_phase_warm_up_prefill_of_n_tokens_then_tokens_so_far(app_models):  # noqa: F811
    s = Settings(prompt=PROMPT, target=app_models["target"], drafter="prompt lookup", max_new_tokens=6)
    messages = [f.message for f in runner.playground(s, Policy(), real_models, never)]
    n = len(real_models.encode_prompt(real_models.load(app_models["target"]), PROMPT))
    phases = ["Warming up", f"reading the prompt (prefill of {n} tokens)",
              f"the baseline is reading the prompt (prefill of {n} tokens)", "tokens so far", "Done"]
    firsts = [next(i for i, m in enumerate(messages) if phase in m) for phase in phases]
    assert firsts == sorted(firsts), messages  # in that order, each said
    assert runner.model_name("default") == "SmolLM2-135M (embedded)"  # never "Generating with default"


def test_a_long_prefill_says_how_much_of_the_prompt_is_read(app_models, monkeypatch):  # noqa: F811
    """The engine reads a prompt in chunks; while a slow one is read the status counts them,
    with a progress bar (here: chunks of 4 tokens, each taking 0.35 s more than it would)."""
    slow_prefill(monkeypatch)
    s = Settings(prompt=PROMPT, target=app_models["target"], drafter="prompt lookup", max_new_tokens=4)
    frames = [(f.message, f.fraction) for f in runner.playground(s, Policy(), real_models, never)]
    n = len(real_models.encode_prompt(real_models.load(app_models["target"]), PROMPT))
    reading = [(m, f) for m, f in frames if "reading the prompt (prefill: " in m]
    assert reading, [m for m, _ in frames]
    for message, fraction in reading:
        done = int(re.search(r"prefill: ([\d,]+) of", message).group(1).replace(",", ""))
        assert f"of {n:,} tokens read, {fraction:.0%})" in message and done % 4 == 0 and fraction == done / n
    assert frames[-1][0].startswith("Done") and frames[-1][1] is None


def test_a_stop_ends_every_run_of_the_visitor_and_no_runs_end_clears_another():
    """One visitor's runs shared one stop flag, which each run's end cleared: a Generate ending beside
    an exactness check left the check's Stop ignored (busy was already false) or undone. A Stop pressed
    with nothing running stops nothing later either."""
    from specviz.ui import handlers as page
    from specviz.ui.live.limits import Line

    handlers, session, line, checks = page.Handlers(Policy(), real_models), Session(), Line(slots=2), {}

    def start(name):
        def body(_, should_stop):
            checks[name] = should_stop
            yield name
        handlers.arm(session)
        run = line.run(session, None, lambda *said, **_: said, lambda: None, body)
        assert next(run) == name
        return run

    handlers.stop(session)  # nothing is running
    check = start("check")
    assert not checks["check"]()
    generate = start("generate")
    assert list(generate) == [] and session.busy  # the Generate ends; the check goes on
    handlers.stop(session)
    assert checks["check"]()  # its Stop still reaches it
    assert list(check) == [] and not session.busy
    again = start("again")
    assert not checks["again"]()  # the next run starts unstopped
    list(again)


def test_every_update_after_stop_says_stopping_not_the_runs_count(monkeypatch):
    """Stop pressed while a prefill is read: the status went on counting its pieces ("prefill: 1,536
    of 3,082 tokens read"), and a teacher pressed Stop again. From the press (the page's script says
    it at once, svStopping in assets/specviz.js) every update of the run says "Stopping…" until it has stopped."""
    from specviz.ui import handlers as page

    monkeypatch.setattr(page, "UPDATE_EVERY", 0.0)  # every frame shown
    handlers, session = page.Handlers(Policy(), real_models), Session()

    def run(settings, policy, models, should_stop):
        for n in (4, 8, 12, 16):
            yield Frame(base=Trace("baseline", speculative=False), runs=[Trace("x")], state="running",
                        message=f"reading the prompt (prefill: {n} of 16 tokens read)")
        yield Frame(base=Trace("baseline", speculative=False), runs=[Trace("x")], state="stopped",
                    message="Stopped after 0 tokens.", final=True)

    updates = handlers._stream(session, None, dict(prompt="a long prompt"), run, lambda f: {"status": f.message},
                               False)
    said = [next(updates)["status"]]
    handlers.stop(session)
    said += [update["status"] for update in updates]
    assert said == ["reading the prompt (prefill: 4 of 16 tokens read)", "Stopping…", "Stopping…", "Stopping…",
                    "Stopped after 0 tokens."]


def test_an_empty_drafter_runs_as_plain_decoding_and_says_so():
    from specviz.ui import handlers as page

    handlers, asked = page.Handlers(Policy(), real_models), []

    def run(settings, policy, models, should_stop):
        asked.append(settings.drafter)
        yield Frame(base=Trace("baseline", speculative=False), runs=[Trace("x")], state="done",
                    message="Done: 3 tokens each.", final=True)

    said = [u["status"] for u in handlers._stream(Session(), None, dict(prompt="hi", drafter="  "), run,
                                                     lambda f: {"status": f.message}, False)]
    assert asked == ["none"] and said == [f"Done: 3 tokens each. {page.EMPTY_DRAFTER}"]


def test_slow_work_is_counted_in_seconds_while_it_runs():
    release, ticks = threading.Event(), iter(range(0, 1000))
    frame = Frame(base=Trace("baseline", speculative=False), runs=[Trace("x")])
    work = runner.waiting(lambda: release.wait() and 42, frame, lambda s: f"prefill… {s} s",
                          clock=lambda: next(ticks), poll=0.001)
    said = [next(work).message for _ in range(3)]
    assert said == ["prefill… 2 s", "prefill… 3 s", "prefill… 4 s"]  # each new second, from HEARTBEAT on
    release.set()
    with pytest.raises(StopIteration) as done:
        while True:
            next(work)
    assert done.value.value == 42

    def boom():
        raise SpecvizError("the prompt is too long")
    with pytest.raises(SpecvizError, match="too long"):
        list(runner.waiting(boom, frame, str))


def test_a_runs_model_work_happens_on_one_thread_not_one_per_step(app_models):  # noqa: F811
    """The warm-up, the curve and every step of both runs on the run's one worker thread (it
    used to start a thread per engine step), and the thread ends with the run."""
    from specviz.modeling import forward

    class Threads:
        seen: set = set()

        def start(self, model):
            self.seen.add(threading.get_ident())

        def stop(self, model):
            pass

    target = real_models.load(app_models["target"])
    threads, before = Threads(), threading.active_count()
    forward.observe(target.model, threads)
    try:
        s = Settings(prompt=PROMPT, target=app_models["target"], drafter="prompt lookup", max_new_tokens=24)
        frames = list(runner.playground(s, Policy(), real_models, never))
    finally:
        forward.observe(target.model, None)
    assert frames[-1].state == "done" and len(frames[-1].spec.events) > 3
    assert len(threads.seen) == 1 and threading.get_ident() not in threads.seen
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before  # the worker ended with the run


def test_out_of_memory_is_a_sentence_not_a_traceback(app_models):
    def load(name, progress=None, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    frame = final(runner.playground(Settings(prompt=PROMPT, target="big"), Policy(),
                                    types.SimpleNamespace(load=load), never))
    assert frame.state == "error" and frame.message.startswith("out of memory: try a smaller model")


def test_stop_mid_run_compares_the_common_prefix_and_calls_it_identical(app_models):
    """Seen in the app: Stop after ~12 tokens said 'Differs from baseline at token 13' (API
    identical: False) because the speculative run had 15 tokens and the baseline 13."""
    frames = []

    def stop_after_a_few_tokens() -> bool:
        return bool(frames) and len(frames[-1].spec.token_ids) >= 6

    s = Settings(prompt=PROMPT, target=app_models["target"], drafter=app_models["draft"], max_new_tokens=200)
    for frame in runner.playground(s, Policy(), real_models, stop_after_a_few_tokens):
        frames.append(frame)
    spec, base = frame.spec.token_ids, frame.base.token_ids
    assert frame.state == "stopped" and len(spec) != len(base)
    summary = playground_summary(frame)
    assert summary["identical"] is True and summary["compared_tokens"] == min(len(spec), len(base))
    check = playground_values(frame)["check"]
    assert 'data-identical="true"' in check and "both runs produced" in check


def test_the_api_summary_text_ends_before_the_end_of_turn_token(app_models, monkeypatch):  # noqa: F811
    """As the CLI's: the token that ended the turn is not part of the text (token_ids keep it)."""
    s = Settings(prompt=PROMPT, target=app_models["target"], drafter=app_models["draft"], max_new_tokens=8)
    plain = final(runner.playground(s, Policy(), real_models, never)).base
    end = plain.token_ids[3]  # pretend the target's end-of-turn token is its fourth token
    said = real_models.decode(real_models.load(app_models["target"]), [end])
    monkeypatch.setattr(real_models.Loaded, "eos_token_ids", property(lambda self: (end,)))
    summary = playground_summary(final(runner.playground(s, Policy(), real_models, never)))
    for run in ("speculative", "baseline"):
        assert summary[run]["token_ids"][-1] == end and summary[run]["stop_reason"] == "eos"
        assert summary[run]["text"] == "".join(plain.labels[i].token for i in range(3))
        assert not summary[run]["text"].endswith(said)


def test_the_status_says_whose_token_count_is_whose():
    """A sampled run's status gave the larger count ("Done: 48 tokens.") without saying whose."""
    frame = Frame(base=Trace("baseline", speculative=False), runs=[Trace("x")])
    frame.base.add(TokenEventFor(1))
    runner.finish_frame(frame, Deadline(never, None))
    assert frame.message == "Done: speculative 0 tokens, baseline 1."
    frame.spec.add(TokenEventFor(1))
    runner.finish_frame(frame, Deadline(never, None))
    assert frame.message == "Done: 1 token each."
    frame.runs.append(Trace("EAGLE"))  # Compare: every run by its name
    assert runner.tokens_made(frame) == "x 1 token, EAGLE 0, baseline 1"


def test_sampling_run_ends_with_the_same_length_and_an_explanation(app_models):
    s = Settings(prompt=PROMPT, target=app_models["target"], drafter=app_models["draft"], temperature=1.0, seed=3,
                 max_new_tokens=12)
    frame = final(runner.playground(s, Policy(), real_models, never))
    assert frame.state == "done" and not frame.greedy
    assert len(frame.spec.token_ids) == len(frame.base.token_ids) == 12
    assert frame.spec.text() and all(e.draws is not None for e in frame.spec.steps if e.draft)


@pytest.mark.parametrize("temperature, trees", [(0.7, True), (1.0, False)])
def test_the_app_samples_trees_where_they_paid_and_chains_above(app_models, temperature, trees):  # noqa: F811
    """The tiny Medusa in the app: sampled at 0.7 its steps are trees (the sibling walk is recorded
    and the output is the baseline's length), at 1.0 chains."""
    s = Settings(prompt=PROMPT, target=app_models["target"], drafter=app_models["medusa"], temperature=temperature,
                 seed=5, max_new_tokens=16)
    frame = final(runner.playground(s, Policy(), real_models, never))
    assert frame.state == "done" and len(frame.spec.token_ids) == len(frame.base.token_ids) == 16
    drafted = [e for e in frame.spec.steps if e.draft]
    assert drafted and all((e.tree is not None) == trees for e in drafted), [e.tree for e in drafted]
    if trees:
        assert any(len(e.tree.tokens) > s.k for e in drafted)  # the app's 2k-candidate trees, not chains
        assert all(e.tree.walk for e in drafted)  # each step's sibling walk, for the inspector


def test_compare_keeps_going_when_one_drafter_cannot_load(app_models, tmp_path):
    s = Settings(prompt=PROMPT, target=app_models["target"], max_new_tokens=6)
    frame = final(compare_drafters(s, Policy(), real_models, never, rounds=1,
                                   drafters=["prompt lookup", str(tmp_path / "missing"), app_models["draft"]]))
    assert frame.state == "done" and "could not run" in frame.message
    lookup, missing, draft = frame.runs
    assert lookup.done and draft.done and not missing.done
    assert "does not exist" in missing.error


def test_throttle_passes_state_changes_and_the_final_frame_and_drops_the_rest():
    ticks = iter([0.0, 0.1, 0.2, 0.25, 0.35, 0.4, 0.45, 0.5])
    frames = []
    for state in ["loading", "running", "running", "running", "running", "running", "running", "done"]:
        frames.append(Frame(base=Trace("baseline"), runs=[Trace("x")], state=state, final=state == "done"))
    kept = list(throttle(iter(frames), every=0.3, clock=lambda: next(ticks)))
    # t=0.0 loading, t=0.1 running starts, t=0.4 is the first 0.3 s later, then the final frame
    assert [next(i for i, f in enumerate(frames) if f is k) for k in kept] == [0, 1, 5, 7]


def test_gpu_decorator_is_applied_only_when_the_spaces_package_is_present(monkeypatch):
    from specviz.ui.handlers import on_gpu

    def handler():
        yield 1

    monkeypatch.setitem(sys.modules, "spaces", None)  # `import spaces` fails
    assert on_gpu(handler) is handler
    calls = []
    fake = types.SimpleNamespace(GPU=lambda duration: lambda fn: calls.append(duration) or ("on gpu", fn))
    monkeypatch.setitem(sys.modules, "spaces", fake)
    assert on_gpu(handler) == ("on gpu", handler) and calls and calls[0] > 0


# ---- why checking is cheap, and the run re-timed on other hardware -----------------------

def test_a_run_measures_the_verify_curve_first_and_the_hardware_block_re_times_it(app_models):
    from specviz.engine import verify_cost
    from specviz.ui.blocks import hardware, replay
    from specviz.ui.handlers import Session

    model = real_models.load(app_models["target"]).model
    verify_cost._CURVES.pop(model, None)  # measured by an earlier test of this session, perhaps
    s = Settings(prompt=PROMPT, target=app_models["target"], drafter=app_models["draft"], max_new_tokens=24)
    messages = []
    for frame in runner.playground(s, Policy(), real_models, never):
        messages.append((frame.state, frame.message))
    assert frame.state == "done" and frame.curve is verify_cost.known(model)
    measuring = messages.index(next(m for m in messages if m[1].startswith("Measuring the verify cost curve")))
    generating = messages.index(next(m for m in messages if m[1].startswith("Generating with")))
    assert measuring < generating  # after the warm-up, never inside the timed run
    summary = playground_summary(frame)
    assert summary["verify_cost"]["sizes"] == [1, 2, 4, 8, 16, 32] and summary["headline"]["v"] is not None
    again = [f.message for f in runner.playground(s, Policy(), real_models, never)]
    assert not any(m.startswith("Measuring") for m in again)  # once per model

    session = Session()
    session.last, session.run, session.settings = frame, frame, s
    curve_fig, caption, result, bars = hardware.show(session, hardware.THIS, 0.1, 0.05)
    assert 'data-curve="measured"' in caption and "Re-timed, not measured" in result
    as_measured = float(re.search(r'data-speedup="([\d.]+)"', result).group(1))
    assert as_measured == pytest.approx(summary["headline"]["speedup"], rel=0.05)
    assert [t.name for t in curve_fig.data][:3] == ["if each token cost a full step",
                                                   "ideal: memory-bound, extra tokens free", "measured on this machine"]
    _, _, gpu, bars = hardware.show(session, hardware.GPU, 0.1, 0.05)
    assert "GPU-like" in gpu and len(bars.data) == 4
    # After a replay of the run (step-through), the block re-times what is on screen.
    r = replay.step_through(session)["replay"]
    assert 'data-curve="measured"' in hardware.show(session, hardware.GPU, 0, 0)[1]  # no step shown yet
    replay.step(r, session, +3)
    assert session.last is not frame and len(session.last.spec.steps) == 3
    retimed = html.unescape(hardware.show(session, hardware.GPU, 0, 0)[2])
    assert "Re-timed, not measured" in retimed and "this run's accept/reject decisions" not in retimed
    assert re.search(r"the first 3 of this run's \d+ steps \(those on screen so far\)", retimed)  # not the run's


def test_the_hardware_block_is_on_the_page_and_waits_for_a_run():
    from specviz.ui.blocks import hardware
    from specviz.ui.handlers import Session

    demo = build_app(Policy(), examples=[])
    ids = {c["props"].get("elem_id") for c in demo.config["components"]}
    assert {"sv-hardware-box", "sv-cost-curve", "sv-retime-profile", "sv-retime-result"} <= ids
    assert "Generate a run" in hardware.show(Session(), hardware.GPU, 0.1, 0.05)[2]


def test_suffix_decoding_learns_from_the_visitors_runs_and_compare_leaves_the_memory_alone(app_models):
    """The playground's run adds its answer to the visitor's memory (the next run drafts from
    it); Compare reads it but adds nothing, so each round meets the same memory."""
    memory = SuffixMemory(1000)
    s = Settings(prompt=PROMPT, target=app_models["target"], drafter="suffix", max_new_tokens=16)
    first = final(runner.playground(s, Policy(), real_models, never, memory=memory))
    held = memory.sequences
    assert first.state == "done" and len(held) == 1 and held[0][-16:] == list(first.spec.token_ids)
    again = final(runner.playground(s, Policy(), real_models, never, memory=memory))
    assert again.spec.end.stats.accepted > first.spec.end.stats.accepted
    assert any("earlier requests" in e.source for e in again.spec.steps)
    frame = final(compare_drafters(s, Policy(), real_models, never, rounds=2, drafters=["suffix"], memory=memory))
    assert frame.state == "done" and len(memory.sequences) == 2
    policy = hosted_policy()
    assert {"suffix", "suffix+eagle"} <= {v for _, v in policy.drafters} and "suffix" in policy.compare_drafters
    assert Session(policy.suffix_memory_tokens).memory.max_tokens == policy.suffix_memory_tokens < Policy().suffix_memory_tokens


def test_two_visitors_never_share_a_memory():
    """The app keeps each visitor's memory in their Session, which gr.State deep-copies per
    visitor; what one visitor's run remembers the other's never sees."""
    first = Session(memory_tokens=1000)
    a, b = copy.deepcopy(first), copy.deepcopy(first)
    collect(speculative_generate(tiny_llama(), Suffix(a.memory), [5, 6, 7, 5, 6], GenerationConfig(max_new_tokens=8)))
    assert len(a.memory) > 0 and len(b.memory) == 0 and len(first.memory) == 0
    assert a.memory.max_tokens == 1000


# ---- names and sentences the page shows ------------------------------------------------------

def test_every_drafter_has_one_human_name_in_the_menu_compare_and_the_panel_titles():
    """The menu showed a picked example's raw "pld"; Compare said "draft model layerskip" and
    "eagle + suffix decoding"."""
    from specviz.run.spec import parse
    from specviz.ui.layout import menu_value
    from specviz.ui.policy import DRAFTERS

    for label, value in DRAFTERS:  # the menu's label starts with the name the table and titles use
        assert label == parse(value).label or label.startswith(parse(value).label + " ("), (label, value)
    names = {v: parse(v).label for v in ("pld", "layerskip", "layerskip:0-9", "eagle", "eagle+pld", "suffix",
                                              "suffix+eagle", "medusa", "draft", "none", "default")}
    assert names == {"pld": "prompt lookup", "layerskip": "layer skip", "layerskip:0-9": "layer skip (layers 0-9)",
                     "eagle": "EAGLE", "eagle+pld": "EAGLE + prompt lookup", "suffix": "suffix decoding",
                     "suffix+eagle": "suffix decoding + EAGLE", "medusa": "Medusa", "draft": "distilled draft model",
                     "none": "none", "default": "draft model: SmolLM2-135M (embedded)"}
    # an example measured with "pld" picks the menu's own entry, which shows its label
    assert menu_value("pld", Policy()) == "prompt lookup" and menu_value("eagle+pld", Policy()) == "eagle+pld"
    assert menu_value("medusa", Policy(drafters=DRAFTERS[:2])) is None  # not offered: the menu stays
