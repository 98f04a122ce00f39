"""The benchmark: its arithmetic against hand-computed values, its run order, its suite
files and its outputs, on tiny in-process models."""
from __future__ import annotations

import argparse
import csv
import json
import types

import pytest
import torch

from conftest import noisy_copy
from specviz.bench import add_arguments, main
from specviz.bench import report
from specviz.bench.drafters import BenchDrafter, make_drafters
from specviz.bench.html import write_html
from specviz.bench.runner import BenchConfig, plan_arms, run_benchmark, schedule
from specviz.bench.summary import summarise
from specviz.core.errors import SpecvizError
from specviz.core import metrics as m
from specviz.core.metrics import predicted_speedup
from specviz.drafters import DraftModel
from specviz.engine.generate import GenerationConfig, collect, speculative_generate
from specviz.run.arms import parse_arm
from specviz.modeling import packing
from specviz.modeling.threads import environment
from specviz.run import suites


def loaded(model, tokenizer=None):
    """What models.load returns, for an in-process model."""
    return types.SimpleNamespace(model=model, tokenizer=tokenizer, eos_token_ids=(), name="tiny",
                                 device=torch.device("cpu"), dtype=torch.float32)


# ------------------------------------------------------------------ the arithmetic

def test_alpha_and_tau_are_plain_ratios():
    assert m.acceptance_rate(accepted=6, drafted=8) == 0.75
    assert m.acceptance_rate(0, 0) == 0.0
    assert m.mean_accepted_length(tokens=30, steps=12) == 2.5


def test_position_acceptance_is_conditional_on_the_tokens_before():
    # (drafted, accepted) per step, k = 3
    steps = [(3, 3), (3, 1), (3, 0), (2, 2), (0, 0)]
    reached, kept = m.position_counts(steps, k=3)
    # position 0: reached by the 4 steps that drafted; kept by 3 of them
    # position 1: reached where position 0 was kept and a 2nd token was drafted: steps 1, 2, 4
    # position 2: reached by step 1 only (step 4 drafted 2 tokens, step 2 stopped at 1)
    assert reached == [4, 3, 1]
    assert kept == [3, 2, 1]
    assert m.position_acceptance(reached, kept) == [0.75, 2 / 3, 1.0]
    assert m.position_acceptance([0], [0]) == [None]


def test_leviathan_closed_form_against_hand_computed_values():
    # alpha 0.5, k 4: expected tokens per step (1 - 0.5^5) / 0.5 = 1.9375;
    # cost per step k*c + v = 4 * 0.1 + 1.5 = 1.9
    assert predicted_speedup(0.5, 4, 0.1, 1.5) == pytest.approx(1.9375 / 1.9)
    # alpha 0.8, k 2, free drafts, free verify beyond one token: 1 + 0.8 + 0.64
    assert predicted_speedup(0.8, 2, 0.0, 1.0) == pytest.approx(2.44)
    # every draft accepted: k + 1 tokens per step
    assert predicted_speedup(1.0, 3, 0.05, 1.2) == pytest.approx(4 / 1.35)
    # nothing accepted: one token per step at the cost of drafting and verifying
    assert predicted_speedup(0.0, 4, 0.1, 1.5) == pytest.approx(1 / 1.9)


def test_step_model_matches_hand_computed_cost():
    # 2 steps drafted nothing (cost v(1) = 1 each), 2 drafted 4 (cost 4*0.1 + v(5) = 2.4):
    # 10 tokens for 6.8 target-forward-equivalents
    v = {1: 1.0, 5: 2.0}
    assert m.predicted_cost({0: 2, 4: 2}, 0.1, v) == pytest.approx(6.8)


def test_step_model_equals_closed_form_for_fixed_k_and_expected_tokens():
    alpha, k, c, v = 0.6, 4, 0.05, 1.7
    tau = (1 - alpha ** (k + 1)) / (1 - alpha)
    steps = 1000
    # a plain step costs one target forward per token, so tokens / cost is the speedup
    got = tau * steps / m.predicted_cost({k: steps}, c, {k + 1: v})
    assert got == pytest.approx(predicted_speedup(alpha, k, c, v))


def test_costs_speedup_and_efficiency():
    assert m.verify_ratios({1: 0.05, 2: 0.055, 5: 0.08}) == pytest.approx({1: 1.0, 2: 1.1, 5: 1.6})
    assert m.cost_ratio(draft_time=0.6, drafted=40, target_step=0.05) == pytest.approx(0.3)
    assert m.cost_ratio(0.0, 0, 0.05) == 0.0
    # baseline 100 tokens in 5 s, speculative 120 tokens in 2 s: 0.05 vs 1/60 s per token
    assert m.speedup(5.0, 100, 2.0, 120) == pytest.approx(3.0)
    assert m.efficiency(2.7, 3.0) == pytest.approx(0.9)
    assert m.efficiency(1.0, 0.0) is None
    assert m.common_prefix([1, 2, 3, 4], [1, 2, 9]) == 2
    assert m.common_prefix([1, 2], [1, 2, 3]) == 2
    assert m.median([3.0, 1.0, 2.0, 10.0]) == 2.5


# ------------------------------------------------------------------ the run order

def test_schedule_interleaves_arms_round_robin():
    assert schedule(["A", "B"], 3) == [(0, "A"), (0, "B"), (1, "A"), (1, "B"), (2, "A"), (2, "B")]


def test_plan_arms_baseline_first_then_drafters_by_k_then_peers(target):
    drafters = [BenchDrafter("none", None), BenchDrafter("pld", object()),
                BenchDrafter("small", object(), model=object())]
    cfg = BenchConfig(ks=(2, 4), dynamic_k=3)
    labels = [a.label for a in plan_arms(drafters, cfg, ["hf", "hf-pld", "hf-assisted"])]
    assert labels == [
        "baseline", "none", "pld k=2", "pld k=4", "pld dynamic k=3", "small k=2", "small k=4",
        "small dynamic k=3", "hf", "hf-pld k=2", "hf-pld k=4",
        "hf-assisted k=2", "hf-assisted k=4", "hf-assisted dynamic k=3",
    ]
    confident = [a for a in plan_arms(drafters[:2], BenchConfig(ks=(2,), dynamic_k=3, confidences=(0.1, 0.3)), [])]
    assert [(a.label, a.cfg.dynamic_k, a.cfg.draft_confidence) for a in confident[-3:]] == [
        ("pld dynamic k=3", True, 0.0), ("pld dynamic k=3 conf=0.1", True, 0.1), ("pld dynamic k=3 conf=0.3", True, 0.3)]
    with pytest.raises(SpecvizError, match="hf-assisted needs a draft model"):
        plan_arms(drafters[:2], cfg, ["hf-assisted"])
    with pytest.raises(SpecvizError, match="unknown peer"):
        plan_arms(drafters, cfg, ["vllm"])


def test_runs_alternate_between_baseline_and_drafter(target, prompts):
    encoded = [(suites.BenchPrompt(f"p{i}", "code", (("user", "x"),)), ids) for i, ids in enumerate(prompts[1:3])]
    cfg = BenchConfig(max_new_tokens=4, repeats=2, warmup=False, cost_repeats=1)
    result = run_benchmark(target, make_drafters(["pld"], loaded(target)), encoded, cfg)
    order = [(r.prompt_id, r.arm, r.repeat) for r in result.records]
    assert order == [
        ("p0", "baseline", 0), ("p0", "pld k=4", 0), ("p0", "baseline", 1), ("p0", "pld k=4", 1),
        ("p1", "baseline", 0), ("p1", "pld k=4", 0), ("p1", "baseline", 1), ("p1", "pld k=4", 1),
    ]


def test_the_thread_count_is_chosen_again_before_each_prompt_and_kept_for_its_arms(target, prompts):
    """A neighbour starting mid-bench: the count drops between prompts, never inside one, each
    run says its count, and the change is said once, naming the prompt it starts from."""
    from specviz.bench.command import threads_again

    encoded = [(suites.BenchPrompt(f"p{i}", "code", (("user", "x"),)), ids) for i, ids in enumerate(prompts[1:4])]
    counts, said, was = iter([2, 1, 1]), [], torch.get_num_threads()

    def choose(role):  # what threads.for_run does, with the machine's answers made up
        n = next(counts)
        torch.set_num_threads(n)
        return f"{n} torch threads ({role})"

    try:
        torch.set_num_threads(2)
        before = threads_again(said.append, choose)
        cfg = BenchConfig(max_new_tokens=4, repeats=2, warmup=False, cost_repeats=1)
        result = run_benchmark(target, make_drafters(["pld"], loaded(target)), encoded, cfg, before_prompt=before)
    finally:
        torch.set_num_threads(was)
    per_prompt = {}
    for r in result.records:
        per_prompt.setdefault(r.prompt_id, set()).add(r.threads)
    assert per_prompt == {"p0": {2}, "p1": {1}, "p2": {1}}
    assert said == ["bench: from prompt p1 on, 1 torch threads (batch)"]
    doc = report.raw_document(result, {}, {})
    assert [run["threads"] for run in doc["runs"]] == [r.threads for r in result.records]


def test_suffix_memory_carries_across_a_series_per_arm_and_repeat_never_from_warm_ups(target):
    """Each (arm, repeat) keeps one memory per series: request 2 of a series (the same prompt
    again, here) drafts from request 1's answer, the other series starts cold, and neither a
    warm-up nor the other repeat leaks into it."""
    ids = [5, 6, 7, 8, 9, 10, 11, 12]
    asked = [suites.BenchPrompt(f"s{i}", "repeated", (("user", "x"),), series="a") for i in (1, 2)]
    other = suites.BenchPrompt("t1", "repeated", (("user", "x"),), series="b")
    encoded = [(asked[0], ids), (asked[1], ids), (other, ids)]
    cfg = BenchConfig(max_new_tokens=12, repeats=2, warmup=True, cost_repeats=1)
    result = run_benchmark(target, make_drafters(["suffix"], loaded(target)), encoded, cfg)
    runs = {(r.prompt_id, r.repeat): r for r in result.records if r.arm == "suffix k=4"}
    for repeat in (0, 1):
        cold, warm, fresh = runs[("s1", repeat)], runs[("s2", repeat)], runs[("t1", repeat)]
        assert warm.accepted > cold.accepted and warm.steps < cold.steps
        assert (fresh.accepted, fresh.steps) == (cold.accepted, cold.steps)  # the same cold start
    rows = {(r["arm"], r["category"]): r for r in summarise(result)["summary"]}
    first, later = rows[("suffix k=4", "repeated, first requests")], rows[("suffix k=4", "repeated, later requests")]
    assert (first["prompts"], later["prompts"], rows[("suffix k=4", "repeated")]["prompts"]) == (2, 1, 3)


# ------------------------------------------------------------------ prompt suites

def test_builtin_suite_covers_every_category():
    prompts = suites.load_suite("default")
    counts = {}
    for p in prompts:
        counts[p.category] = counts.get(p.category, 0) + 1
    assert set(counts) == {"chat", "translation", "summarization", "qa", "math", "rag", "code", "repeated"}
    assert min(counts.values()) >= 5
    series = {}
    for p in prompts:
        assert bool(p.series) == (p.category == "repeated")  # requests of one user, in order
        series.setdefault(p.series, []).append(p.id)
    assert all(len(ids) >= 3 for name, ids in series.items() if name)
    assert all(len(p.messages) >= 3 for p in prompts if p.category == "chat")  # multi-turn
    assert all("```" in p.text for p in prompts if p.category == "code")  # code to rewrite


def test_prompts_longer_than_the_models_context_are_left_out_by_name(capsys):
    """A suite written for long-context models, run on a 512-token one: the bench ended with the
    engine's refusal at the first long prompt, losing the runs before it."""
    from specviz.bench.command import fitting

    short, edge, long = (suites.BenchPrompt(name, "rag", (("user", "x"),)) for name in ("short", "edge", "long"))
    encoded = [(short, [1] * 511), (edge, [1] * 512), (long, [1] * 2_000)]
    assert fitting(encoded, None) == encoded  # no limit the model states (ALiBi): every prompt runs
    assert [p.id for p, _ in fitting(encoded, 512)] == ["short"]
    assert capsys.readouterr().err == ("bench: left out 2 prompts longer than the model's context of 512 tokens: "
                                       "edge (512 tokens), long (2,000 tokens)\n")
    with pytest.raises(SpecvizError, match="no prompt of the suite fits the model's context of 64 tokens"):
        fitting(encoded, 64)


def test_select_by_category_and_limit():
    prompts = suites.load_suite("default")
    chosen = suites.select(prompts, ["code", "rag"], limit=2)
    assert [p.category for p in chosen] == ["rag", "rag", "code", "code"]
    with pytest.raises(SpecvizError, match="no category poetry"):
        suites.select(prompts, ["poetry"])


def _write(tmp_path, lines):
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_user_suite_loads(tmp_path):
    path = _write(tmp_path, [
        '{"id": "a", "category": "qa", "prompt": "Why?"}',
        "",
        '{"id": "b", "category": "chat", "turns": [{"role": "user", "content": "Hi"}, '
        '{"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Again"}]}',
        '{"id": "c", "category": "raw", "prompt": "Once upon", "chat": false}',
    ])
    a, b, c = suites.load_suite(path)
    assert a.messages == (("user", "Why?"),) and a.chat
    assert b.text == "Again" and len(b.messages) == 3
    assert not c.chat


@pytest.mark.parametrize("line, message", [
    ('{"id": "a", "category": "qa", "prompt": "x"', "line 1: not valid JSON"),
    ('["a", "qa"]', "line 1: expected a JSON object"),
    ('{"category": "qa", "prompt": "x"}', "line 1: 'id' must be a non-empty string"),
    ('{"id": "a", "category": "qa"}', "line 1: give exactly one of 'prompt'"),
    ('{"id": "a", "category": "qa", "prompt": "x", "turns": []}', "give exactly one of"),
    ('{"id": "a", "category": "qa", "prompt": ""}', "'prompt' must be a non-empty string"),
    ('{"id": "a", "category": "qa", "prompt": "x", "chat": "yes"}', "'chat' must be true or false"),
    ('{"id": "a", "category": "qa", "prompt": "x", "series": 3}', "'series' must be a string"),
    ('{"id": "a", "category": "c", "turns": [{"role": "user", "content": "x"}, '
     '{"role": "assistant", "content": "y"}]}', "the last turn must be the user's"),
    ('{"id": "a", "category": "c", "turns": [{"role": "robot", "content": "x"}]}', "turn 0 must be"),
])
def test_bad_user_suite_says_where_and_what(tmp_path, line, message):
    with pytest.raises(SpecvizError, match=message):
        suites.load_suite(_write(tmp_path, [line]))


def test_duplicate_ids_and_missing_files_are_reported(tmp_path):
    line = '{"id": "a", "category": "qa", "prompt": "x"}'
    with pytest.raises(SpecvizError, match="line 2: id 'a' appears twice"):
        suites.load_suite(_write(tmp_path, [line, line]))
    with pytest.raises(SpecvizError, match="no prompt suite"):
        suites.load_suite(str(tmp_path / "absent.jsonl"))


class CharTokenizer:
    """Character-level stand-in for a tokenizer: id = code point mod 96."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return types.SimpleNamespace(input_ids=[ord(ch) % 96 for ch in text])


def test_encode_without_chat_template_uses_raw_text():
    p = suites.BenchPrompt("a", "qa", (("user", "hey"),))
    assert suites.encode(CharTokenizer(), p) == [ord("h") % 96, ord("e") % 96, ord("y") % 96]
    convo = suites.BenchPrompt("b", "chat", (("user", "a"), ("assistant", "b"), ("user", "c")))
    with pytest.raises(SpecvizError, match="no chat template"):
        suites.encode(CharTokenizer(), convo)


# ------------------------------------------------------------------ end to end

@pytest.fixture(scope="module")
def tiny_result(target):
    g = torch.Generator().manual_seed(7)
    phrase = torch.randint(0, 96, (12,), generator=g).tolist()
    encoded = [
        (suites.BenchPrompt("copy", "code", (("user", "x"),)), phrase * 3),
        (suites.BenchPrompt("free", "qa", (("user", "y"),)), torch.randint(0, 96, (9,), generator=g).tolist()),
    ]
    drafters = make_drafters(["none", "pld", "layerskip:0"], loaded(target))
    noisy = noisy_copy(target, 0.3)
    drafters.append(BenchDrafter("noisy", DraftModel(noisy), noisy))
    cfg = BenchConfig(max_new_tokens=10, ks=(2, 3), dynamic_k=1, repeats=2, eos_token_ids=(5,), cost_repeats=1)
    result = run_benchmark(target, drafters, encoded, cfg, ["hf", "hf-pld", "hf-assisted"])
    config = {"target": "tiny", "suite": "inline", "greedy": True, "max_new_tokens": 10, "repeats": 2,
              "sampling": {"temperature": 0.0}, "command": "pytest"}
    return result, report.document(result, summarise(result), config, environment("cpu", torch.float32))


def test_greedy_speculative_output_is_identical_to_the_baseline(tiny_result):
    _, doc = tiny_result
    for row in doc["summary"]:
        if row["engine"] == "specviz":
            assert row["identical"] == row["prompts"], row["arm"]
        if row["engine"].startswith("hf"):  # transformers' own greedy agrees where both wrote
            assert row["agree_on_common_prefix"] == row["prompts"], row["arm"]


def test_forward_clocks_see_every_engine_and_peer(tiny_result):
    result, _ = tiny_result
    for r in result.records:
        if r.steps:  # specviz's fast path and transformers' generate are both timed
            assert 0 < r.target_forward <= r.decode_time, r.arm
        if r.arm.startswith("noisy") or r.arm.startswith("hf-assisted"):
            assert r.draft_forward > 0, r.arm


def test_json_document_schema(tiny_result, tmp_path):
    result, doc = tiny_result
    path = tmp_path / "bench.json"
    report.write_json(doc, str(path))
    loaded = json.loads(path.read_text())
    assert loaded["schema"] == "specviz.bench/1"
    assert {"created", "environment", "config", "summary", "prompts", "phases", "costs", "drift", "runs"} <= set(loaded)
    arms = [a.label for a in result.arms]
    assert [p["arm"] for p in loaded["phases"]] == arms
    for row in loaded["summary"]:
        assert set(row) == set(report.SUMMARY_FIELDS)
        assert row["category"] in {"code", "qa", "all"}
        assert row["tokens_per_s"] > 0 and row["speedup"] > 0
    base = [r for r in loaded["summary"] if r["arm"] == "baseline"]
    assert all(r["speedup"] == pytest.approx(1.0) for r in base)
    pld = next(r for r in loaded["summary"] if r["arm"] == "pld k=3" and r["category"] == "code")
    # alpha and tau pool the arm's runs in the category: all drafts kept / all drafted, all tokens / all steps
    runs = [r for r in result.records if r.arm == "pld k=3" and r.category == "code"]
    drafted = sum(r.drafted for r in runs)
    assert drafted > 0  # the prompt repeats a phrase: prompt lookup finds something to copy
    assert pld["alpha"] == pytest.approx(sum(r.accepted for r in runs) / drafted)
    assert pld["tau"] == pytest.approx(sum(r.tokens for r in runs) / sum(r.steps for r in runs))
    assert len(pld["position_acceptance"]) == 3
    assert pld["predicted"] > 0 and pld["efficiency"] == pytest.approx(pld["decode_speedup"] / pld["predicted"])
    assert pld["v"] == pytest.approx(loaded["costs"]["code"]["verify_ratio"]["4"])
    for prompt in loaded["prompts"]:
        if prompt["arm"] != "baseline":
            assert isinstance(prompt["identical_to_baseline"], bool)
    assert len(loaded["runs"]) == len(arms) * 2 * 2  # arms x prompts x repeats
    assert loaded["costs"]["code"]["verify_ratio"]["1"] == 1.0
    # every verify length a run used was timed on its prompt (dynamic k drafts up to 4k)
    for run in loaded["runs"]:
        timed = loaded["prompt_costs"][run["prompt_id"]]["forward_ms"]
        assert {str(int(n) + 1) for n in run["draft_lengths"]} <= set(timed)
    assert {"1", "3", "4"} <= set(loaded["costs"]["qa"]["forward_ms"])


def test_csv_and_html_outputs(tiny_result, tmp_path):
    _, doc = tiny_result
    report.write_csv(doc, str(tmp_path / "bench.csv"))
    rows = list(csv.DictReader(open(tmp_path / "bench.csv")))
    assert len(rows) == len(doc["summary"]) and rows[0]["arm"] == "baseline"
    write_html(doc, str(tmp_path / "bench.html"))
    page = (tmp_path / "bench.html").read_text()
    assert "Plotly.newPlot" in page and "<script src=\"http" not in page  # plotly.js inlined
    assert "pld k=2" in page


def test_terminal_report_lists_every_arm(tiny_result, capsys):
    _, doc = tiny_result
    report.print_report(doc)
    out = capsys.readouterr().out
    for arm in ("baseline", "pld k=2", "pld dynamic k=1", "layerskip:0 k=2", "noisy k=3", "hf-pld k=2",
                "hf-assisted k=3"):
        assert arm in out
    assert "Where a decode step's time goes" in out


def test_main_runs_a_user_suite_and_writes_every_output(target, tmp_path, monkeypatch, capsys):
    handle = loaded(target, CharTokenizer())
    monkeypatch.setattr("specviz.modeling.models.load", lambda *a, **kw: handle)
    path = _write(tmp_path, ['{"id": "a", "category": "qa", "prompt": "abcabcabcabc", "chat": false}'])
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "out"
    args = parser.parse_args(["--suite", path, "--k", "2,3", "--max-new-tokens", "6", "--no-progress",
                              "--json", f"{out}.json", "--csv", f"{out}.csv", "--html", f"{out}.html"])
    assert main(args) == 0
    doc = json.loads(open(f"{out}.json").read())
    assert [r["arm"] for r in doc["summary"] if r["category"] == "all"] == ["baseline", "pld k=2", "pld k=3"]
    assert doc["config"]["ks"] == [2, 3]
    cost = doc["verify_cost"]  # the target's verify-cost curve, measured after the runs
    assert cost["sizes"] == [1, 2, 4, 8, 16, 32] and cost["relative"][0] == 1.0 and cost["weight_bytes"] > 0
    assert 0 < cost["wall_fraction"] and cost["memory_bandwidth_bytes_per_s"] > 1e8
    out = capsys.readouterr().out
    assert "Why checking is cheap" in out and "this machine reads memory at" in out
    sizes = [int(a) * int(b) for a, b in (r["entry"].split()[0].split("x") for r in doc["environment"]["kernels"])]
    assert all(n >= packing.MIN_WEIGHT for n in sizes), "a tiny model's weights all keep F.linear"
    assert (tmp_path / "out.csv").exists() and (tmp_path / "out.html").exists()
    doc["environment"]["kernels"] = [{"entry": "960x576 float32 2t", "buckets": [1, 2], "paths": ["packed@2", "mkl"],
                                      "ms": [0.123, None]}]
    report.print_report(doc)
    out = capsys.readouterr().out
    assert "Kernels chosen on this CPU" in out and "960x576 float32 2t" in out and "packed@2 0.12" in out


def test_bad_options_are_clear_errors(target, monkeypatch):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SpecvizError, match="--k takes integers"):
        main(parser.parse_args(["--k", "four", "--no-progress"]))
    with pytest.raises(SpecvizError, match="no prompt suite"):
        main(parser.parse_args(["--suite", "nope", "--no-progress"]))
    with pytest.raises(SpecvizError, match="--draft-confidence needs --dynamic-k"):
        main(parser.parse_args(["--draft-confidence", "0.2", "--no-progress"]))
    with pytest.raises(SpecvizError, match="^top-k must be from 0 to 200, got 500$"):  # generate's and the app's
        main(parser.parse_args(["--top-k", "500", "--no-progress"]))
    with pytest.raises(SpecvizError, match="^k must be from 1 to 64, got 100$"):  # was refused only after loading
        main(parser.parse_args(["--k", "4,100", "--no-progress"]))
    for bad in ("high", "1.5", "0"):
        with pytest.raises(SpecvizError, match="--draft-confidence takes numbers between 0 and 1"):
            main(parser.parse_args(["--dynamic-k", "4", "--draft-confidence", bad, "--no-progress"]))


def test_chain_suffix_turns_trees_off_and_is_refused_for_chain_drafters(target, tmp_path):
    from test_heads import make

    from specviz.drafters.medusa import heads_config
    from specviz.drafters.trained import save_drafter

    heads = make("medusa", target).heads
    path = tmp_path / "m.safetensors"
    save_drafter(path, "medusa", heads, heads_config(heads), loaded(target))
    tree, chain = make_drafters([f"medusa:{path}", f"medusa:{path}@chain"], loaded(target))
    cfg = GenerationConfig(max_new_tokens=12, k=3)
    trees = [[ev.tree is not None for ev in collect(speculative_generate(
        target, d.drafter, [1, 2, 3], parse_arm(d.name, cfg).cfg))[0]] for d in (tree, chain)]
    assert any(trees[0]) and not any(trees[1])  # the arm's config, not its drafter, makes it draft chains
    with pytest.raises(SpecvizError, match="does not draft trees"):
        make_drafters(["pld@chain"], loaded(target))


def test_each_forward_cost_is_timed_right_after_a_forward_of_the_same_size(monkeypatch):
    """A size measured right after another reads a cold copy of the weights (the packed one
    or the plain one) and would make v(n) = T(n) / T(1) wrong: every timed call follows an
    untimed one of its own size, and sizes still interleave across repeats."""
    from conftest import tiny_llama
    from specviz.engine import timing

    sizes_called = []
    real = timing.forward

    def spy(model, ids, cache, **kw):
        sizes_called.append(ids.numel())
        return real(model, ids, cache, **kw)

    monkeypatch.setattr(timing, "forward", spy)
    costs = timing.forward_costs(tiny_llama(), list(range(3, 20)), [4, 2], repeats=2)
    assert set(costs) == {1, 2, 4} and all(t > 0 for t in costs.values())
    measured = sizes_called[2:]  # after the prefill and the warm-up
    assert measured == [1, 1, 2, 2, 4, 4] * 2


def test_tree_steps_are_costed_by_every_node_the_target_verified(target, prompts):
    """The cost model prices a step by the tokens the target ran: for a tree that is all its
    nodes, not the chain the events show (else tree arms look cheaper than they are)."""
    from test_heads import make

    drafter = make("medusa", target, tree=3)
    encoded = [(suites.BenchPrompt("p0", "code", (("user", "x"),)), prompts[1])]
    cfg = BenchConfig(max_new_tokens=12, ks=(4,), warmup=False, cost_repeats=1)
    result = run_benchmark(target, [BenchDrafter("medusa", drafter)], encoded, cfg)
    rec = next(r for r in result.records if r.arm == "medusa k=4")
    assert sum(n * c for n, c in rec.draft_lengths.items()) == rec.candidates  # every node the target ran
    shown = sum(n_shown for n_shown, _ in rec.step_outcomes)  # the chains the events show
    assert shown == rec.drafted < rec.candidates, "the trees had nodes off the shown chain"
    # alpha counts the branch the target walked, as the page does; the cost model every node.
    row = next(r for r in summarise(result)["summary"] if r["arm"] == "medusa k=4")
    assert row["alpha"] == pytest.approx(rec.accepted / rec.drafted)
    assert row["candidates_per_step"] == pytest.approx(rec.candidates / rec.steps)
    t1 = result.forward_seconds["p0"][1]
    assert row["c"] == pytest.approx(rec.draft_time / t1 / rec.candidates)


def test_progress_line_says_how_far_how_long_and_what_ran():
    from specviz.bench.command import progress_line

    assert progress_line(12, 84, 200, "eagle k=4 chat-03") == (
        "bench: 12/84 runs (14%), 3:20 elapsed, about 20:00 left; last: eagle k=4 chat-03")
    assert progress_line(84, 84, 3725, "x") == "bench: 84/84 runs (100%), 1:02:05 elapsed; last: x"


def test_progress_off_a_terminal_prints_plain_lines_at_most_every_interval(capsys, monkeypatch):
    from specviz.bench.command import _Progress

    bar = _Progress(disabled=False)  # capsys's stderr is not a terminal: no bar, lines
    bar.start(3)
    for label in ("a", "b", "c"):
        bar.step(label)
    bar.close()
    assert capsys.readouterr().err.splitlines() == ["bench: 3/3 runs (100%), 0:00 elapsed; last: c"]  # quick: the end only
    monkeypatch.setattr(_Progress, "every", 0.0)
    bar = _Progress(disabled=False)
    bar.start(3)
    for label in ("a", "b", "c"):
        bar.step(label)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" runs")[0] for line in lines] == ["bench: 1/3", "bench: 2/3", "bench: 3/3"]
    assert lines[-1].endswith("; last: c") and "left" not in lines[-1]
    bar = _Progress(disabled=True)
    bar.start(3)
    bar.step("a")
    bar.close()
    assert capsys.readouterr().err == ""


def test_the_recorded_command_keeps_the_thread_setting_it_ran_with(monkeypatch):
    from specviz.bench.command import command_line

    monkeypatch.setattr("sys.argv", ["specviz", "bench", "--suite", "examples", "--k", "1,2"])
    monkeypatch.delenv("SPECVIZ_THREADS", raising=False)
    assert command_line() == "python -m specviz bench --suite examples --k 1,2"
    monkeypatch.setenv("SPECVIZ_THREADS", "1")
    assert command_line() == "SPECVIZ_THREADS=1 python -m specviz bench --suite examples --k 1,2"


def test_sampled_peers_get_top_k_off_as_transformers_spells_it():
    """top_k 0 (off) went to transformers as None, which leaves a model's own default (often 50) in force:
    the peer then sampled another distribution than the specviz arm it is raced against."""
    from specviz.bench.peers import generate_kwargs
    from specviz.core.sampling import Sampling

    off = generate_kwargs("hf", 4, False, Sampling(temperature=1.0, top_k=0), 8, (1,))
    assert off["do_sample"] and off["top_k"] == 0
    assert generate_kwargs("hf", 4, False, Sampling(temperature=1.0, top_k=7), 8, (1,))["top_k"] == 7
