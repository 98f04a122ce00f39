"""Re-timing: a run's recorded decisions costed on a hardware profile, against hand-worked sums."""
from __future__ import annotations

import pytest
from conftest import noisy_copy

from specviz import DraftModel, GenerationConfig, SpecvizError, baseline_generate, speculative_generate
from specviz.core.events import RunEnd, StepEvent, TokenEvent, TreeDraft
from specviz.core.retime import as_measured, custom, draft_cost, from_curve, gpu_like, retime, run_timing
from specviz.render import Trace, headline


def step(draft: int, accepted: int, draft_time: float, verify_time: float, tree=None) -> StepEvent:
    return StepEvent(step=0, position=0, draft=tuple(range(draft)), q=None, p=(0.5,) * draft,
                     accept_prob=(1.0,) * draft, draws=None, accepted=accepted, token=9, token_p=0.9,
                     token_kind="corrected", emitted=tuple(range(accepted)) + (9,), top=(), draft_time=draft_time,
                     verify_time=verify_time, elapsed=0.0, greedy=True, tree=tree)


def token(time: float) -> TokenEvent:
    return TokenEvent(step=0, token=1, p=0.5, time=time, elapsed=0.0)


# Three steps: 4 drafted, 3 kept; 4 drafted, none kept; nothing drafted. 6 tokens, 0.2 s of prefill.
SPEC = run_timing([step(4, 3, 0.01, 0.15), step(4, 0, 0.01, 0.14), step(0, 0, 0.0, 0.10)], elapsed=0.61)
BASE = run_timing([token(0.1)] * 6, elapsed=0.8)  # one plain step: 0.1 s


def test_as_measured_costs_each_step_its_recorded_seconds():
    r = retime(SPEC, BASE, as_measured())
    assert r.step_seconds == pytest.approx(0.1)
    assert r.spec == pytest.approx({"other": 2.0, "passes": 3.0, "extra verify": 0.9, "drafting": 0.2})
    assert r.base == pytest.approx({"other": 2.0, "passes": 6.0, "extra verify": 0.0, "drafting": 0.0})
    assert r.speedup == pytest.approx(0.8 / 0.61)  # = the measured tokens/s ratio


def test_a_profile_costs_each_pass_by_its_tokens_and_each_draft_by_c():
    # verify: v(5) = 1 + 0.1 * 4 = 1.4 twice, v(1) = 1; drafting: 0.05 * 8 drafted tokens
    r = retime(SPEC, BASE, custom(slope=0.1, c=0.05))
    assert r.spec == pytest.approx({"other": 2.0, "passes": 3.0, "extra verify": 0.8, "drafting": 0.4})
    assert r.speedup == pytest.approx(8.0 / 6.2)
    gpu = retime(SPEC, BASE, gpu_like(c=0.05))  # flat to 16 tokens: the passes cost one step each
    assert gpu.spec["extra verify"] == 0.0 and gpu.speedup == pytest.approx(8.0 / 5.4)
    assert gpu.speedup > r.speedup
    assert gpu_like(0.0).verify(32) == pytest.approx(2.0)  # past the knee, time grows with the tokens
    assert draft_cost(SPEC, BASE) == pytest.approx(0.02 / 8 / 0.1)


def test_a_tree_pass_costs_every_node():
    tree = TreeDraft(tokens=tuple(range(9)), parents=(-1,) * 9, path=(0,), p=(0.5,) * 9)
    spec = run_timing([step(2, 1, 0.0, 0.1, tree=tree)], elapsed=0.1)
    assert spec.steps[0].verified == 10 and spec.steps[0].drafted == 9
    assert retime(spec, BASE, custom(slope=0.1, c=0.0)).spec["extra verify"] == pytest.approx(0.9)


def test_without_a_baseline_there_is_no_unit():
    with pytest.raises(SpecvizError, match="needs the baseline run"):
        retime(SPEC, run_timing([], 0.0), as_measured())


def test_this_machine_as_measured_gives_back_a_real_runs_measured_speedup(target, prompts):
    cfg = GenerationConfig(k=4, max_new_tokens=24)
    traces = {"spec": Trace("draft", k=4), "base": Trace("baseline", speculative=False)}
    for which, events in (("spec", speculative_generate(target, DraftModel(noisy_copy(target, 0.05)), prompts[2], cfg)),
                          ("base", baseline_generate(target, prompts[2], cfg))):
        for e in events:
            traces[which].add(e)
    spec, base = traces["spec"], traces["base"]
    assert isinstance(spec.end, RunEnd) and spec.steps
    measured = headline(spec, base).speedup
    timed = (run_timing(spec.events, spec.elapsed), run_timing(base.events, base.elapsed))
    assert retime(*timed, as_measured()).speedup == pytest.approx(measured, rel=0.05)
    # The same decisions, costed by a cost model instead: a flat verify beats a steep one.
    c = draft_cost(*timed)
    steep = retime(*timed, from_curve(lambda m: 1 + 0.5 * (m - 1), c)).speedup
    assert retime(*timed, gpu_like(c)).speedup > steep
