"""A Space strangers share: what hosted mode allows, and what any script's input turns into."""
from __future__ import annotations

import threading
import time
import types

import pytest
from app_server import PROMPT, app_models  # noqa: F401 (app_models is a fixture)

from specviz.core.errors import SpecvizError
from specviz.modeling import models as real_models
from specviz.ui import Policy, Settings, build_app, hosted_policy, policy_from_env
from specviz.ui.live import runner
from specviz.ui.live.limits import Busy, Line
from specviz.ui.policy import TARGETS, exposed

GIB = 1 << 30
CONTROLS = dict(prompt="hi", target="default", drafter="none", k=4, dynamic_k=False, mode="greedy",
                temperature=0.7, top_k=0, top_p=1.0, repetition_penalty=1.0, seed=0, max_new_tokens=8, chat=True)


def never() -> bool:
    return False


def final(frames):
    *_, last = frames
    return last


# ---- a script's values ------------------------------------------------------------------

@pytest.mark.parametrize("field, value, says", [
    ("seed", 1e30, "seed must be a whole number from 0 to 2**64 - 1"),
    ("seed", -1, "seed must be a whole number from 0"),
    ("k", "abc", "k must be a whole number, got 'abc'"),
    ("k", True, "k must be a number"),
    ("k", float("inf"), "k must be a finite number"),
    ("temperature", "nan", "temperature must be a finite number"),
    ("temperature", "inf", "temperature must be a finite number"),
    ("top_p", None, "top-p must be a number, got nothing"),  # was "got None": Python's word
    ("seed", None, "seed must be a number, got nothing"),
    ("mode", "banana", "mode must be 'greedy' or 'sampling'"),
    ("chat", "maybe", "chat must be true or false"),
])
def test_bad_values_from_scripts_get_a_sentence(field, value, says):
    with pytest.raises(SpecvizError, match=says.replace("*", r"\*").replace("(", r"\(")):
        Settings.from_controls(**dict(CONTROLS, **{field: value})).config()


def test_numbers_as_strings_and_exact_big_seeds_are_fine():
    s = Settings.from_controls(**dict(CONTROLS, k="6", seed=str(2**64 - 1), temperature="0.5", mode="sampling",
                                      chat="false"))
    assert (s.k, s.seed, s.temperature, s.chat) == (6, 2**64 - 1, 0.5, False)
    s.config()


# ---- who counts as a stranger -------------------------------------------------------------

def test_an_app_reachable_beyond_loopback_is_hosted_unless_visitors_are_trusted():
    assert not any(exposed(h) for h in (None, "127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"))
    assert all(exposed(h) for h in ("0.0.0.0", "::", "192.168.1.20", "myhost.example"))
    assert exposed("127.0.0.1", share=True)
    assert not policy_from_env({}).hosted
    assert policy_from_env({}, host="0.0.0.0").hosted and policy_from_env({}, share=True).hosted
    assert policy_from_env({"GRADIO_SERVER_NAME": "0.0.0.0"}).hosted
    assert not policy_from_env({}, host="0.0.0.0", trust_visitors=True).hosted
    assert not policy_from_env({"GRADIO_SERVER_NAME": "0.0.0.0", "SPECVIZ_TRUST_VISITORS": "1"}).hosted
    assert policy_from_env({"SPECVIZ_HOSTED": "1"}, trust_visitors=True).hosted  # asked for: stays hosted


def test_app_py_serves_the_hosted_policy_on_0000_and_not_with_trust_visitors():
    import app

    demos = [app.demo_for(app.parse_args(argv)) for argv in
             (["--host", "0.0.0.0", "--port", "9"], ["--host", "0.0.0.0", "--trust-visitors"], ["--share"], [])]
    menus = [{c["props"].get("elem_id"): c["props"] for c in demo.config["components"]}["sv-target"]
             for demo in demos]
    assert [m["allow_custom_value"] for m in menus] == [False, True, False, True]


# ---- what a hosted app offers and keeps ---------------------------------------------------

def test_hosted_targets_are_those_that_fit_the_machines_memory():
    names = lambda p: [v for _, v in p.targets]  # noqa: E731
    assert names(hosted_policy(memory=16 * GIB)) == ["default", "HuggingFaceTB/SmolLM2-360M-Instruct"]
    assert names(hosted_policy(memory=64 * GIB)) == [v for _, v in TARGETS]
    assert names(hosted_policy(memory=2 * GIB)) == ["default"]  # the embedded model is always offered
    assert hosted_policy(memory=16 * GIB).model_bytes < 8 * GIB


def test_a_target_left_out_for_memory_is_refused_in_words_that_say_so():
    """The hosted app refused the 1.7B model as if it were an unknown name."""
    policy = hosted_policy(memory=16 * GIB)
    with pytest.raises(SpecvizError, match=r"SmolLM2-1.7B \(Hub\) is not offered here for lack of memory: its "
                                           r"weights take \d+\.\d GB and this machine keeps \d+\.\d GB"):
        policy.check(Settings(prompt="hi", target="HuggingFaceTB/SmolLM2-1.7B-Instruct"))
    with pytest.raises(SpecvizError, match="only runs these targets"):  # a name never on the list
        policy.check(Settings(prompt="hi", target="gpt2"))
    assert hosted_policy(memory=64 * GIB).too_big == ()
    demo = build_app(policy, examples=[])
    menu = {c["props"].get("elem_id"): c["props"] for c in demo.config["components"]}["sv-target"]
    assert "SmolLM2-1.7B (Hub) needs more memory than this machine has" in menu["info"]


def test_hosted_errors_do_not_tell_whether_a_path_exists(app_models, tmp_path):
    (tmp_path / "empty-folder").mkdir()
    (tmp_path / "weights.gguf").write_text("x")
    names = [app_models["target"], str(tmp_path / "empty-folder"), str(tmp_path / "missing"),
             str(tmp_path / "weights.gguf"), f"eagle:{tmp_path / 'missing.safetensors'}", app_models["medusa"]]
    messages = set()
    for name in names:
        for s in (Settings(prompt="hi", target=name), Settings(prompt="hi", drafter=name)):
            frame = final(runner.playground(s, hosted_policy(), real_models, never))
            assert frame.state == "error"
            messages.add(frame.message.replace(repr(name), "NAME"))
    assert len(messages) == 2  # one sentence for every target, one for every drafter


def test_a_hosted_app_keeps_unexpected_error_text_in_its_log():
    def load(name, **kwargs):
        raise ValueError("/srv/secret/path exploded")

    stub = types.SimpleNamespace(load=load)
    hosted = final(runner.playground(Settings(prompt="hi"), hosted_policy(), stub, never))
    local = final(runner.playground(Settings(prompt="hi"), Policy(), stub, never))
    assert "secret" not in hosted.message and "server's log" in hosted.message
    assert "/srv/secret/path" in local.message


def test_prompts_beyond_the_cap_are_refused_and_huge_ones_before_tokenizing(app_models):
    policy = Policy(max_prompt_tokens=5)
    frame = final(runner.playground(Settings(prompt=PROMPT, target=app_models["target"]), policy, real_models, never))
    assert frame.state == "error" and "takes prompts of up to 5 tokens" in frame.message

    def load(*args, **kwargs):
        raise AssertionError("a refused prompt must not load a model")

    huge = final(runner.playground(Settings(prompt="x" * 10_000), policy, types.SimpleNamespace(load=load), never))
    assert huge.state == "error" and "10,000 characters" in huge.message


def test_a_run_past_the_time_limit_stops_with_a_message_and_keeps_its_tokens(app_models):
    s = Settings(prompt=PROMPT, target=app_models["target"], drafter=app_models["draft"], max_new_tokens=450)
    frame = final(runner.playground(s, Policy(max_run_seconds=0.05), real_models, never))
    tokens = max(len(frame.spec.token_ids), len(frame.base.token_ids))
    assert frame.state == "stopped" and tokens < 450
    assert frame.message == f"Stopped at this app's time limit (0.05 s a run) after {runner.tokens_made(frame)}."
    assert f"speculative {len(frame.spec.token_ids)} token" in frame.message or " tokens each" in frame.message


# ---- the line runs wait in -----------------------------------------------------------------

def test_the_line_runs_in_arrival_order_and_turns_away_beyond_its_room():
    line = Line(slots=1, waiting=2, per_visitor=1)
    a, b, c = line.join("a"), line.join("b"), line.join("c")
    assert [line.ahead(t) for t in (a, b, c)] == [0, 1, 2]
    with pytest.raises(Busy, match="3 runs ahead of you"):
        line.join("d")
    with pytest.raises(Busy, match="already have a run"):
        line.join("b")
    line.leave(a)
    assert [line.ahead(t) for t in (b, c)] == [0, 1]
    line.join(None)  # a caller without a session is not limited per visitor, only by room


def test_a_waiting_run_wakes_when_the_line_moves():
    line = Line(slots=1)
    first, second = line.join(), line.join()
    threading.Timer(0.1, line.leave, [first]).start()
    started = time.monotonic()
    # Woken by the leave, not by the timeout: well under it, however busy the machine.
    assert line.wait(second, timeout=120) == 0 and time.monotonic() - started < 60


def status(message, state, ahead=None):
    return message, state, ahead


def queued_run(turn, should_stop=None):
    """A streaming handler as the app's are: its place while it waits, then its run."""
    with turn:
        if (yield from turn.wait(status, poll=0.05, should_stop=should_stop)):
            yield "ran", "done", None


def test_a_turn_shows_its_place_until_the_runs_ahead_leave():
    line = Line(slots=1)
    first, second = line.turn(), line.turn()
    updates = queued_run(line.turn())
    waiting = ("Waiting for a turn: 2 runs ahead of you.", "waiting", 2)
    assert next(updates) == waiting
    assert next(updates) == waiting  # again after the poll: Gradio can end a gone visitor's run only at a yield
    with first:
        pass
    assert next(updates) == ("Waiting for a turn: 1 run ahead of you.", "waiting", 1)

    def second_runs():
        with second:
            time.sleep(0.2)

    threading.Thread(target=second_runs).start()
    *still_waiting, last = updates
    assert set(still_waiting) <= {("Waiting for a turn: 1 run ahead of you.", "waiting", 1)}
    assert last == ("ran", "done", None) and len(line) == 0


def test_a_turn_leaves_the_line_when_its_visitor_goes_stops_or_its_run_fails():
    line = Line(slots=1)
    first = line.turn()
    gone = queued_run(line.turn())
    assert next(gone)[1] == "waiting" and len(line) == 2
    gone.close()  # what Gradio does when the visitor closes the page
    assert len(line) == 1

    stop = []
    stopped = queued_run(line.turn(), should_stop=lambda: bool(stop))
    assert next(stopped)[1] == "waiting"
    stop.append(True)
    assert list(stopped) == [("Stopped before the run started.", "stopped", None)] and len(line) == 1

    with first:
        pass
    failing = queued_run(line.turn())
    assert next(failing) == ("ran", "done", None)  # no one ahead: no waiting update
    with pytest.raises(RuntimeError):
        failing.throw(RuntimeError("the run failed"))
    assert len(line) == 0
