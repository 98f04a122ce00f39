"""Compare drafters, as a specification: every arm warmed up, taking turns, repeated; the spread shown.

Run first, once and cold, the baseline paid every one-time cost alone: drafter `none` (the
same work as the baseline) measured 1.77x in the app.
"""
from __future__ import annotations

import time

import pytest
from app_server import PROMPT, app_models  # noqa: F401 (app_models is a fixture)

from specviz.core.events import RunEnd, RunStats, StepEvent, TokenEvent
from specviz.engine.interleave import interleave, interleave_all
from specviz.modeling import forward
from specviz.modeling import models as real_models
from specviz.render.compare import compare_rows, table_values
from specviz.ui import Policy, Settings
from specviz.ui.live.compare import compare_drafters


def never() -> bool:
    return False


def _end():
    return RunEnd((), RunStats(0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, "max_new_tokens"))


def _spec(sizes):
    for n, size in enumerate(sizes):
        yield StepEvent(step=n, position=0, draft=(), q=None, p=(), accept_prob=(), draws=None, accepted=0,
                        token=1, token_p=1.0, token_kind="bonus", emitted=(1,) * size, top=(), draft_time=0.0,
                        verify_time=0.0, elapsed=0.0, greedy=True)
    yield _end()


def _plain(n):
    for i in range(n):
        yield TokenEvent(step=i, token=1, p=1.0, time=0.0, elapsed=0.0)
    yield _end()


def test_arms_take_turns_the_one_with_fewest_tokens_first():
    order = [name for name, ev in interleave_all({"a": _spec([3, 1]), "base": _plain(4), "c": _spec([2, 2])})
             if not isinstance(ev, RunEnd)]
    # a steps (3), base and c catch up (c's 2 then base to 3), ... ties go to the arm listed first.
    assert order == ["a", "base", "c", "base", "base", "c", "a", "base"]
    # The Playground's pair is the same rule: spec steps, the baseline catches up.
    assert [n for n, _ in interleave(_spec([2, 3]), _plain(5))] == ["spec", "base", "base", "spec", "base",
                                                                     "base", "base", "spec", "base"]


def test_queued_runs_say_queued_not_running_at_zero_tokens_per_second(app_models, monkeypatch):
    from specviz.run import prepare

    warmed = []  # every arm is warmed up by the Playground's step (run/prepare.py), plain steps for the baseline
    monkeypatch.setattr(prepare, "warm_up", lambda model, drafter, *a: warmed.append(type(drafter).__name__))
    s = Settings(prompt=PROMPT, target=app_models["target"], max_new_tokens=8)
    frames = compare_drafters(s, Policy(), real_models, never, rounds=1,
                              drafters=["prompt lookup", app_models["draft"]])
    seen = set()
    for frame in frames:
        assert warmed or not frame.message.startswith("Round")
        for row in compare_rows(frame.base, frame.runs, frame.rounds):
            seen.add(row["stop"])
            if row["stop"] == "queued":
                assert row["tokens_per_s"] is None and row["speedup"] is None
            else:
                assert row["tokens_per_s"] > 0, row
    assert "queued" in seen and frame.state == "done"
    assert warmed == ["NoneType", "PromptLookup", "DraftModel"]


class ColdStart:
    """The first forward of a model is slow (allocations, kernel choice), as on a real machine."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def start(self, model) -> None:
        if self.seconds:
            time.sleep(self.seconds)
            self.seconds = 0.0

    def stop(self, model) -> None:
        pass


def test_drafter_none_measures_about_the_baseline_warm_start_and_turns(app_models):
    """`none` does the baseline's work in steps: its speedup is ~1 whatever runs first, cold."""
    target = real_models.load(app_models["target"])
    forward.observe(target.model, ColdStart(0.5))
    try:
        s = Settings(prompt=PROMPT, target=app_models["target"], max_new_tokens=32)
        said = []
        for frame in compare_drafters(s, Policy(), real_models, never, drafters=["none"], rounds=3):
            said.append(frame.message)
    finally:
        forward.observe(target.model, None)
    assert frame.state == "done" and len(frame.rounds) == 3
    n = len(real_models.encode_prompt(target, PROMPT))
    reading = f"Round 1 of 3: 2 runs taking turns, each reading the prompt first (prefill of {n} tokens)"
    assert reading in said
    # once both runs have read it the status says so no longer (it did, 12 s into generation)
    after = said[said.index(reading):]
    first_turns = next(i for i, m in enumerate(after) if m == "Round 1 of 3: 2 runs taking turns")
    assert not any("reading the prompt" in m for m in after[first_turns:] if m.startswith("Round 1 ")), after
    assert f"on a prompt of {n} tokens" in said[-1]
    base, none = compare_rows(frame.base, frame.runs, frame.rounds)
    assert base["speedup"] == 1.0 and none["rounds"] == 3
    assert none["speedup_min"] <= none["speedup"] <= none["speedup_max"]
    assert 0.5 < none["speedup"] < 2.0, none  # one cold round: 0.5 s against ~0.1 s of decoding
    speedup, spread = table_values([none])[0][2:4]
    assert speedup == f"{none['speedup']:.2f}×" and ("–" in spread or none["speedup_min"] == none["speedup_max"])


@pytest.mark.parametrize("rounds", [[[10.0, 20.0], [10.0, 10.0], [5.0, 15.0]]])
def test_rows_give_the_median_speedup_of_the_rounds_and_their_range(rounds):
    from specviz.render import Trace

    base, run = Trace("baseline", speculative=False), Trace("x")
    rows = compare_rows(base, [run], rounds)
    assert rows[1]["speedup"] == 2.0 and rows[1]["speedup_min"] == 1.0 and rows[1]["speedup_max"] == 3.0
    assert rows[1]["tokens_per_s"] == 15.0 and rows[0]["tokens_per_s"] == 10.0


def test_every_runs_model_work_is_on_one_worker_thread_not_the_pages(app_models):  # noqa: F811
    """As in the Playground: the warm-up and every round's steps on the comparison's one worker
    (the page's thread stays free to say how long a slow step is taking)."""
    import threading

    seen = set()

    class Threads:
        def start(self, model):
            seen.add(threading.get_ident())

        def stop(self, model):
            pass

    target = real_models.load(app_models["target"])
    forward.observe(target.model, Threads())
    try:
        s = Settings(prompt=PROMPT, target=app_models["target"], max_new_tokens=16)  # rounds of 16: measured
        *_, frame = compare_drafters(s, Policy(), real_models, never, drafters=["prompt lookup", "none"], rounds=2)
    finally:
        forward.observe(target.model, None)
    assert frame.state == "done" and len(frame.rounds) == 2
    assert len(seen) == 1 and threading.get_ident() not in seen


def test_stop_during_the_warm_up_says_stopped_not_done(app_models):
    """Stop while every arm warmed up left no run ended by Stop, and the status said "Done: 0 rounds"."""
    pressed = []
    s = Settings(prompt=PROMPT, target=app_models["target"], max_new_tokens=16)
    for frame in compare_drafters(s, Policy(), real_models, lambda: bool(pressed), drafters=["prompt lookup"]):
        if frame.message.startswith("Warming up"):
            pressed.append(True)
    assert frame.state == "stopped" and frame.message == "Stopped during the warm-up, before any timed round."


def test_runs_too_short_to_time_show_no_speedup_as_the_playground_shows_none(app_models):
    """Compare showed 0.59x-0.88x after 1-2 tokens, where the Playground withholds a speedup under
    MIN_TOKENS (16) tokens: rounds that short are not kept, and the table says why."""
    s = Settings(prompt=PROMPT, target=app_models["target"], max_new_tokens=4)
    *_, frame = compare_drafters(s, Policy(), real_models, never, drafters=["prompt lookup"], rounds=2)
    assert frame.state == "done" and frame.rounds == []
    base, lookup = compare_rows(frame.base, frame.runs, frame.rounds)
    assert lookup["speedup"] is None and lookup["tokens"] == 4
    assert table_values([base, lookup])[1][2:4] == ["too short", "—"]


def test_a_drafter_races_itself_under_both_verification_rules(app_models):
    """NAME@token and NAME@block: the same drafter, one rule each, whatever the page's setting."""
    s = Settings(prompt=PROMPT, target=app_models["target"], max_new_tokens=16, temperature=1.0,
                 verification="token")
    draft = app_models["draft"]
    *_, frame = compare_drafters(s, Policy(), real_models, never, rounds=1, drafters=[f"{draft}@token", f"{draft}@block"])
    assert frame.state == "done", frame.message
    token, block = frame.runs
    assert token.label.endswith("(token-wise)") and block.label.endswith("(block verification)")
    assert {e.verification for e in token.steps} == {"token"} and {e.verification for e in block.steps} == {"block"}


def test_a_hosted_page_offers_each_drafter_with_q_token_by_token():
    """A hosted Compare list cannot be typed into: it offers NAME@token for the drafters that give q
    (the block is the default), and the policy lets that choice run."""
    from specviz.engine.generate import GenerationConfig
    from specviz.run.arms import parse_arm
    from specviz.ui.policy import hosted_policy

    policy = hosted_policy()
    offered = dict((value, label) for label, value in policy.compare_choices)
    assert offered["eagle@token"].endswith("token by token") and "medusa@token" in offered
    assert "pld@token" not in offered and "eagle+pld@token" not in offered  # one-hot drafts: both rules keep the same
    for value in offered:
        policy.check_drafter(parse_arm(value, GenerationConfig()).spec.text)  # no refusal


def test_a_tree_drafter_races_itself_with_drawn_and_chosen_children(app_models):
    """NAME@drawn and NAME@chosen reach Compare's arms too: it applied a name's verification rule alone, so
    'Medusa (drawn trees)' drafted chosen trees."""
    s = Settings(prompt=PROMPT, target=app_models["target"], max_new_tokens=16, temperature=0.7)
    medusa = app_models["medusa"]
    *_, frame = compare_drafters(s, Policy(), real_models, never, rounds=1, drafters=[f"{medusa}@drawn", f"{medusa}@chosen"])
    assert frame.state == "done", frame.message
    drawn, chosen = frame.runs
    assert drawn.label.endswith("(drawn trees)")
    assert any(e.tree and e.tree.q for e in drawn.steps) and not any(e.tree and e.tree.q for e in chosen.steps)
