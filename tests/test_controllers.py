"""Draft-length controllers: each engine's rule on a constructed record, the exact replay against live
runs on tiny models, and the refusals (a record from elsewhere, an unknown name, a parameter out of range)."""
from __future__ import annotations

import pytest
import torch

from conftest import noisy_copy
from specviz import DraftModel, GenerationConfig, PromptLookup, baseline_generate, collect, speculative_generate
from specviz.core.errors import SpecvizError
from specviz.engine import controller_names
from specviz.engine.controllers import K_RECORD, HFConfidence, SGLangAdaptive, min_cost_threshold
from specviz.engine.draft_length import DraftLength, Prices
from specviz.engine.draft_record import DraftRecord, Identity, make_record
from specviz.engine.draft_replay import hindsight, prices, replay

MISS = 999  # a token no constructed output holds: a draft of it is refused at once
ME = Identity("target-a", "tokenizer-a", "draft-model")


def constructed(n: int, match, q=None, verify_slope: float = 0.05, draft_cost: float = 0.1) -> DraftRecord:
    """A greedy record of n output tokens: at position i the maximal draft matches `match(i)` tokens, then
    misses; q(i, j): the drafter's probability of token j of the draft at i (default 1, a copy)."""
    output = tuple(range(n))
    drafts, qs = [], []
    for i in range(n):
        room = min(K_RECORD, n - i - 1)
        m = min(match(i), room)
        drafts.append(output[i:i + m] + (MISS,) * (room - m))
        qs.append(tuple(1.0 if q is None else q(i, j) for j in range(room)))
    verify = tuple(1.0 + verify_slope * (m - 1) for m in range(1, K_RECORD + 2))
    return DraftRecord(ME, (0,), output, n, True, (None,) * n, tuple(drafts), tuple(qs), verify, 0.01, 0.0,
                       draft_cost)


ALWAYS = constructed(200, lambda i: K_RECORD)  # every draft kept whole
NEVER = constructed(200, lambda i: 0)  # every draft refused at its first token


def test_a_constructed_record_matches_as_built():
    assert ALWAYS.matches[:3] == (16, 16, 16) and ALWAYS.matches[-1] == 0
    assert set(NEVER.matches) == {0}


@pytest.mark.parametrize("k", [1, 4, 16])
def test_fixed_k_drafts_k_every_step_and_the_replay_counts_its_passes(k):
    r = replay(ALWAYS, f"fixed:{k}")
    assert set(r.ks[:-1]) == {k} and r.accepted[:-1] == r.drafted[:-1]
    assert r.passes == len(r.ks) == -(-200 // (k + 1))  # k kept + the target's own token a pass
    assert replay(NEVER, f"fixed:{k}").passes == 200


def test_sglang_adaptive_holds_its_tier_through_warm_up_then_moves_every_interval():
    up = replay(ALWAYS, "sglang-adaptive")
    # EMA of accepted lengths from 2 (tier 3 - 1): 3 - 0.8^n, past 2.5 (tier 3's upper edge) by verify 15
    assert up.ks[:15] == (3,) * 15 and up.ks[15] == 7
    down = replay(NEVER, "sglang-adaptive")
    assert down.ks[:15] == (3,) * 15 and set(down.ks[15:-1]) == {1}  # 2 * 0.8^15 <= 1 - 0.5 - 0.25
    quick = replay(ALWAYS, "sglang-adaptive:warmup=0:interval=1")
    assert quick.ks[:5] == (3, 3, 3, 3, 7)  # EMA 2.2, 2.36, 2.49, then 2.59 > 2.5


def test_sglang_adaptive_hysteresis_keeps_a_tier_until_the_ema_is_a_quarter_below_its_edge():
    rule = SGLangAdaptive(warmup=0, interval=1)
    rule.ema = 0.375  # one refused verify brings it to 0.8 * 0.375 = 0.3
    rule.observe(3, 0)
    assert abs(rule.ema - 0.3) < 1e-12 and rule.next() == 3  # round(0.3) + 1 = 1, but 0.3 > 0.25
    rule.observe(3, 0)
    assert rule.next() == 1  # 0.24 <= 0.25


def test_sglang_auto_spec_steps_up_on_full_acceptance_and_down_on_refusals_within_its_range():
    up = replay(ALWAYS, "sglang-auto")
    assert up.ks[:3] == (5, 6, 6) and max(up.ks) == 6  # batch 1's range is 3-6
    down = replay(NEVER, "sglang-auto")
    assert down.ks[:4] == (5, 4, 3, 3) and min(down.ks[:-3]) == 3  # the last steps have no room
    wide = replay(ALWAYS, "sglang-auto:steps=2/8/12:start=2")
    assert wide.ks[:3] == (2, 8, 12)


def test_llama_p_min_judges_every_token_the_first_included():
    # q falls below 0.75 at the third token of each draft; at odd positions the first token is unsure
    rec = constructed(40, lambda i: K_RECORD, q=lambda i, j: 0.5 if (j == 2 or (i % 2 and j == 0)) else 0.9)
    r = replay(rec, "llama-pmin")
    assert set(r.ks[:10]) == {16}  # it asks for --draft-max, and the stop ends the draft
    for i, d in zip(r.positions, r.drafted):
        assert d == (0 if i % 2 else 2), (i, d)
    assert replay(rec, "llama-pmin:p=0.4").drafted[0] == 16  # nothing below 0.4: drafts run to the max
    assert replay(rec, "llama-pmin:max=1").drafted[0] == 1


def test_transformers_heuristic_adds_two_on_full_acceptance_and_takes_one_otherwise():
    assert replay(ALWAYS, "hf-heuristic:start=2").ks[:5] == (2, 4, 6, 8, 10)
    assert replay(NEVER, "hf-heuristic:start=5").ks[:7] == (5, 4, 3, 2, 1, 1, 1)
    assert replay(ALWAYS, "hf-heuristic").ks[0] == 16  # its default 20, within the record's 16


def test_transformers_confidence_keeps_the_unsure_token_and_stops_after_it():
    rec = constructed(40, lambda i: K_RECORD, q=lambda i, j: 0.3 if j == 1 else 0.9)
    fixed = replay(rec, "hf-confidence:adapt=0")
    assert set(fixed.drafted[:-1]) == {2}  # the 0.3 token is drafted, the ones after it are not
    assert set(replay(rec, "hf-confidence:adapt=0:threshold=0.2").drafted[:2]) == {16}


def test_transformers_confidence_adapts_its_threshold_to_the_least_weighted_error():
    assert min_cost_threshold([0.9, 0.8, 0.3, 0.2], [1, 1, 0, 0]) == 0.8
    # a false negative weighs 3: keeping the 0.2 refusal above the threshold is cheaper than losing the 0.1 kept one
    assert min_cost_threshold([0.9, 0.2, 0.1], [1, 0, 1]) == 0.1
    rule = HFConfidence()
    rule.observe(4, 2, q=[0.95, 0.9, 0.6, 0.5])  # judged: two kept, one refused (0.6); 0.5 was never judged
    rule.observe(4, 2, q=[0.97, 0.92, 0.7, 0.2])
    assert rule.stop == 0.9 and rule.stop.after  # every kept token at or above it, the refused ones below


def test_specviz_dynamic_k_lengthens_kept_copies_and_stops_drafting_refused_ones():
    up = replay(ALWAYS, "specviz")
    assert up.ks[0] == 4 and max(up.ks) == K_RECORD
    down = replay(NEVER, "specviz")
    assert down.ks[0] == 4 and max(down.drafted[5:]) == 1, down.ks  # a one-token probe now and then
    assert sum(down.drafted[5:]) < 0.2 * len(down.drafted)  # its idle memory fades, so it looks again


def test_specviz_reads_a_copys_first_token_by_whether_the_step_before_kept_its_draft_whole():
    """Prompt lookup's copies: a draft right after one kept whole goes on being kept, one drafted afresh
    (after a refusal) mostly is not. Counted apart, the same kind of draft is drafted long inside a copy and
    not at all afresh, where one rate for both would draft the same length in both places."""
    steep = Prices(lambda m: 1.0 + 0.3 * (m - 1))  # a one-token draft pays only if kept 30% of the time
    made = {}
    for by_context in (False, True):
        length = DraftLength(4, K_RECORD, True, prices=steep, by_context=by_context)
        for _ in range(8):  # a copy found afresh, kept three steps more, broken, then three refused afresh
            for drafted, kept in ((4, 4), (4, 4), (4, 4), (4, 4), (4, 0), (4, 0), (4, 0), (4, 0)):
                length.record(drafted, kept, 0.0, 0.0, 3)
        afresh = length.next(3)
        length.record(4, 4, 0.0, 0.0, 3)
        made[by_context] = (afresh, length.next(3))
    afresh, inside = made[True]
    assert afresh == 0 and inside >= 8, made
    assert made[False][0] == made[False][1], made


def test_the_hindsight_best_is_no_slower_than_any_controller():
    # copies that hold for a varying stretch: the best k differs step to step
    rec = constructed(80, lambda i: (i * 7) % 11, draft_cost=0.2)
    best = hindsight(rec)
    assert best.exact and best.tokens == 80
    for name in controller_names.ALL:
        r = replay(rec, name)
        assert r.tokens == 80 and r.seconds >= best.seconds - 1e-12, name
    # where every copy holds and a pass costs little more for more tokens, it drafts as far as it can
    assert max(hindsight(ALWAYS).ks) == K_RECORD and hindsight(ALWAYS).passes == -(-200 // 17)


# Replay against live runs: the same drafts step by step, the same passes, the baseline's tokens.
NAMES = [*controller_names.ALL[:6], "fixed:1", "fixed:3", "fixed:16", "llama-pmin:p=0.3",
         "hf-confidence:adapt=0", "sglang-adaptive:warmup=2:interval=1"]


@pytest.fixture(scope="module")
def ids(prompts):
    return prompts[2]


@pytest.mark.parametrize("drafter", ["close model", "far model", "prompt lookup"])
def test_every_controller_replays_exactly_what_it_does_live(target, ids, drafter):
    other = {"close model": 0.05, "far model": 0.3}.get(drafter)
    copy = noisy_copy(target, other) if other else None
    make = (lambda: DraftModel(copy)) if copy is not None else PromptLookup
    cfg = GenerationConfig(max_new_tokens=40)
    _, base = collect(baseline_generate(target, ids, cfg))
    rec = make_record(target, make(), ids, cfg, lambda m: 1.0 + 0.1 * (m - 1), ME)
    assert rec.output == base.token_ids
    for name in NAMES:
        r = replay(rec, name)
        steps, end = collect(speculative_generate(target, make(), ids, cfg, remember=False,
                                                  controller=controller_names.build(name, prices(rec))))
        assert end.token_ids == base.token_ids, name  # greedy output does not depend on the controller
        assert tuple(len(s.draft) for s in steps) == r.drafted, name
        assert end.stats.steps == r.passes and end.stats.tokens == r.tokens, name
        assert r.tokens_per_pass == end.stats.tokens / end.stats.steps
    # The hindsight best is least in time, not in passes: where drafting costs as much as a target pass (tiny
    # models on a busy machine) it drafts nothing, and a controller that drafts makes more tokens per pass.
    assert hindsight(rec).tokens_per_s >= max(replay(rec, n).tokens_per_s for n in NAMES) * (1 - 1e-9)


def test_a_controller_named_in_the_config_runs_live(target, ids):
    cfg = GenerationConfig(max_new_tokens=20, controller="fixed:2")
    steps, end = collect(speculative_generate(target, PromptLookup(), ids, cfg))
    _, base = collect(baseline_generate(target, ids, cfg))
    assert end.token_ids == base.token_ids
    assert all(len(s.draft) <= 2 for s in steps)


# Refusals
@pytest.mark.parametrize("other", [Identity("target-b", "tokenizer-a", "draft-model"),
                                   Identity("target-a", "tokenizer-b", "draft-model"),
                                   Identity("target-a", "tokenizer-a", "prompt-lookup")])
def test_a_record_from_another_model_tokenizer_or_drafter_is_refused_in_one_sentence(other):
    with pytest.raises(SpecvizError) as e:
        ALWAYS.check(other)
    text = str(e.value)
    what = {"target-b": "model", "tokenizer-b": "tokenizer", "prompt-lookup": "drafter"}
    assert f"another {next(w for k, w in what.items() if k in repr(other))}" in text
    assert "\n" not in text and text.count(". ") == 0
    assert ALWAYS.check(ME) is ALWAYS


def test_a_record_survives_a_round_trip_through_json():
    import json
    back = DraftRecord.from_dict(json.loads(json.dumps(ALWAYS.to_dict())))
    assert back == ALWAYS and replay(back, "specviz") == replay(ALWAYS, "specviz")


def test_an_unknown_controller_lists_the_known_ones():
    with pytest.raises(SpecvizError) as e:
        controller_names.build("sglang-adaptiv")
    text = str(e.value)
    assert "did you mean 'sglang-adaptive'" in text
    for name in controller_names.RULES:
        assert f"'{name}'" in text
    with pytest.raises(SpecvizError, match="choose from"):
        GenerationConfig(controller="eagle-magic").validate()


@pytest.mark.parametrize("text, says", [
    ("sglang-adaptive:ema=-0.2", "ema must be above 0 to 1, got -0.2"),
    ("sglang-adaptive:ema=0", "ema must be above 0 to 1, got 0"),
    ("llama-pmin:p=1.5", "p must be from 0 to 1, got 1.5"),
    ("hf-confidence:threshold=2", "threshold must be from 0 to 1, got 2"),
    ("sglang-auto:pos=-0.1", "pos must be from 0 to 1"),
    ("fixed:17", "k must be from 1 to 16, got 17"),
    ("fixed:0", "k must be from 1 to 16, got 0"),
    ("fixed:two", "k must be a whole number"),
    ("sglang-adaptive:steps=3", "needs at least two different values"),
    ("llama-pmin:q=0.5", "llama-pmin has no parameter 'q': it takes p (from 0 to 1), max (from 1 to 16)"),
])
def test_parameters_out_of_range_are_refused_with_the_range(text, says):
    with pytest.raises(SpecvizError) as e:
        controller_names.build(text)
    assert says in str(e.value)


def test_names_are_canonical_and_all_spells_out_every_rule():
    assert controller_names.canonical("Fixed:4") == "fixed:4"
    assert controller_names.canonical("sglang-adaptive:ema=0.3") == "sglang-adaptive:ema=0.3"
    every = controller_names.expand(["all", "fixed:4"])
    assert every[0] == "specviz" and len(every) == 6 + K_RECORD and every.count("fixed:4") == 1


def test_bench_adds_replayed_and_live_controller_arms_to_its_table_and_json(tmp_path, capsys):
    import json

    from specviz.cli.main import main
    from tiny_folder import make_tiny_model_dir

    folder = make_tiny_model_dir(tmp_path / "target", seed=0)
    suite, out = tmp_path / "one.jsonl", tmp_path / "bench.json"
    suite.write_text(json.dumps({"id": "one", "category": "c", "prompt": "the cat sat on the mat"}) + "\n")
    assert main(["bench", "--target", str(folder), "--drafters", "pld", "--max-new-tokens", "16",
                 "--suite", str(suite), "--json", str(out), "--no-progress", "--temperature", "0",
                 "--controllers", "sglang-adaptive,fixed:2,llama-pmin", "--controllers-live"]) == 0
    printed = capsys.readouterr().out
    assert "draft-length controllers (greedy: replayed exactly)" in printed and "hindsight best" in printed
    doc = json.loads(out.read_text())
    assert doc["config"]["controllers"] == ["sglang-adaptive", "fixed:2", "llama-pmin"]
    got = doc["controllers"]
    assert {r["controller"] for r in got["rows"]} == {"sglang-adaptive", "fixed:2", "llama-pmin", "hindsight best"}
    for r in got["rows"]:
        assert r["exact"] and r["of_best"] <= 1.0 + 1e-9
        if r["controller"] != "hindsight best":
            assert r["live"]["agrees"] and r["live"]["identical_output"]
            assert r["live"]["tokens_per_pass"] == r["tokens_per_pass"]
    assert main(["bench", "--target", str(folder), "--suite", str(suite), "--controllers", "nope"]) == 2
    assert "unknown controller 'nope'" in capsys.readouterr().err


def test_a_saved_record_replays_offline_as_the_bench_replayed_it():
    import json

    from specviz.bench import controllers as bench_controllers

    rec = constructed(12, lambda i: 3 if i % 4 else 0)
    saved = [{"prompt": "p", "category": "c", "drafter": "pld", "record": rec.to_dict()}]
    doc = bench_controllers.replayed(json.loads(json.dumps(saved)), ["fixed:2", "specviz"])
    by = {r["controller"]: r for r in doc["rows"]}
    assert by["fixed:2"]["passes"] == replay(rec, "fixed:2").passes
    assert by["hindsight best"]["of_best"] == 1.0 and all(r["of_best"] <= 1.0 + 1e-9 for r in doc["rows"])
