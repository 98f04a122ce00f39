"""Block verification is exact, and keeps more than token-wise: proven by enumeration.

What is compared. One chain step drafts d_1..d_k from the drafter's conditionals q, keeps a
prefix of it, and emits the target's own token after it. To compare what steps of different
lengths emit, each outcome is continued by the target itself up to k + 1 tokens, which is what
the next steps do in law (they restart from the emitted context: test_verify.py's argument).
The step is exact when the law of those k + 1 tokens equals the target's joint law. Every draft
of length k over a 3-token vocabulary is enumerated with its probability; for each, every way
the coins can fall is a branch whose probability the rule's own numbers give (token-wise:
accepted with a_i, block: the backward pass stops at i with h_i), and the token drawn at the end
contributes its whole normalised distribution. float64, compared to 1e-12.

Rules known to be wrong, built from the same numbers, give another law on the same cases.
"""
from __future__ import annotations

import dataclasses
import itertools
from fractions import Fraction

import pytest
import torch

from specviz.core.block_verify import (block_accepted, block_expected, block_weights, token_wise_accepted,
                                      token_wise_expected, verify_block)
from specviz.core.verify import verify_sampled

V = 3
ACCEPT, REJECT = 0.0, 1.0  # a coin u = 0 passes any positive probability, u = 1 none


class Model:
    """A context-dependent model over V tokens: each prefix gets its own random row (cached)."""

    def __init__(self, seed: int, zeros=0, one_hot=False, sharp=3.0):
        self.g = torch.Generator().manual_seed(seed)
        self.rows: dict[tuple, torch.Tensor] = {}
        self.zeros, self.one_hot, self.sharp = zeros, one_hot, sharp

    def __call__(self, prefix: tuple) -> torch.Tensor:
        if prefix not in self.rows:
            w = torch.rand(V, generator=self.g, dtype=torch.float64) ** self.sharp
            if self.one_hot:  # a deterministic drafter (prompt lookup): q is one-hot on its guess
                w = torch.nn.functional.one_hot(w.argmax(), V).double()
            elif self.zeros:  # some tokens impossible under this model
                w[torch.randperm(V, generator=self.g)[: self.zeros]] = 0
            self.rows[prefix] = w / w.sum()
        return self.rows[prefix]


def token_outcomes(p, q, d):
    """(probability, kept, token distribution) of each way token-wise verification can end."""
    k = d.numel()
    _, _, a = verify_sampled(p, q, d, torch.zeros(k, dtype=p.dtype))
    out, reach = [], 1.0
    for n in range(k + 1):
        stop = reach * (1 - a[n].item()) if n < k else reach
        if stop > 0:
            kept, dist, _ = verify_sampled(p, q, d, torch.tensor([ACCEPT] * n + [REJECT] * (k - n), dtype=p.dtype))
            assert kept.item() == n
            out.append((stop, n, dist))
        if n < k:
            reach *= a[n].item()
    return out


def block_stops(h):
    """P(tau = i) for i = 0..k from the stop probabilities: the backward pass from k stops at
    the first i whose coin passes; tau = 0 when none does."""
    k = len(h)
    return [torch.prod(1 - h[i:]).item() if i == 0 else (h[i - 1] * torch.prod(1 - h[i:])).item()
            for i in range(k + 1)]


def block_outcomes(p, q, d, dist_of=None, stops=None):
    k = d.numel()
    s = verify_block(p, q, d, torch.zeros(k, dtype=p.dtype))
    out = []
    for i, prob in enumerate(stops(s) if stops else block_stops(s.stop_prob)):
        if prob > 0:
            coins = [REJECT] * k
            if i:
                coins[i - 1] = ACCEPT
            r = verify_block(p, q, d, torch.tensor(coins, dtype=p.dtype))
            if not stops:
                assert r.accepted.item() == i
            out.append((prob, i, dist_of(s, i, p, q) if dist_of else r.dist))
    return out


def law(target, drafter, k, outcomes):
    """The law of the first k + 1 tokens when one step of the rule runs, then the target."""
    joint: dict[tuple, float] = {}

    def spread(prefix, mass):  # continue with the target to k + 1 tokens
        if len(prefix) == k + 1:
            joint[prefix] = joint.get(prefix, 0.0) + mass
            return
        row = target(prefix)
        for t in range(V):
            if row[t] > 0:
                spread(prefix + (t,), mass * row[t].item())

    for x in itertools.product(range(V), repeat=k):
        qs = [drafter(x[:i]) for i in range(k)]
        w = 1.0
        for i in range(k):
            w *= qs[i][x[i]].item()
        if w == 0:
            continue
        p = torch.stack([target(x[:i]) for i in range(k + 1)])
        q = torch.stack(qs)
        for prob, n, dist in outcomes(p, q, torch.tensor(x)):
            dist = dist / dist.sum()
            for t in range(V):
                if dist[t] > 0:
                    spread(x[:n] + (t,), w * prob * dist[t].item())
    return joint


def target_law(target, k):
    joint = {}
    for s in itertools.product(range(V), repeat=k + 1):
        w = 1.0
        for i in range(k + 1):
            w *= target(s[:i])[s[i]].item()
        if w > 0:
            joint[s] = w
    return joint


def gap(a, b):
    return max(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


CASES = [  # (target kwargs, drafter kwargs): drafters that miss the target's support, one-hot drafts, sharp rows
    (dict(), dict()),
    (dict(zeros=1), dict()),
    (dict(), dict(zeros=1)),
    (dict(), dict(one_hot=True)),
    (dict(sharp=0.5), dict(sharp=6.0)),
]


@pytest.mark.parametrize("case, k", [(c, k) for c in range(len(CASES)) for k in (1, 2, 3)] + [(0, 4)])
@pytest.mark.parametrize("rule", ["token", "block"])
def test_one_step_emits_the_targets_law(rule, case, k):
    for seed in range(2):
        target, drafter = Model(10 * seed + case, **CASES[case][0]), Model(100 + 10 * seed + case, **CASES[case][1])
        outcomes = token_outcomes if rule == "token" else block_outcomes
        assert gap(law(target, drafter, k, outcomes), target_law(target, k)) < 1e-12


WRONG = {
    # the bonus or residual drawn from the target's row itself: the mass the draft already took counts twice
    "residual is p": dict(dist_of=lambda s, i, p, q: p[i]),
    # token-wise's residual max(p - q, 0) without the weight w_i
    "unweighted residual": dict(dist_of=lambda s, i, p, q: torch.clamp(p[i] - q[i], min=0) if i < len(q) else p[i]),
    # stop where the weight's coin passes (h_i = w_i everywhere): forgets the residual's share
    "stop with w_i": dict(stops=lambda s: block_stops(s.weight[1:])),
}


@pytest.mark.parametrize("name", WRONG)
def test_known_wrong_variants_fail_the_same_proof(name):
    # k = 3: with k = 2 the unweighted residual happens to give the right law
    target, drafter = Model(3), Model(103)
    wrong = law(target, drafter, 3, lambda p, q, d: block_outcomes(p, q, d, **WRONG[name]))
    assert gap(wrong, target_law(target, 3)) > 1e-4  # the right rule is within 1e-12


def test_token_wise_without_its_residual_fails_too():
    target, drafter = Model(0), Model(100)
    skip = law(target, drafter, 2, lambda p, q, d: [(w, n, p[n]) for w, n, _ in token_outcomes(p, q, d)])
    assert gap(skip, target_law(target, 2)) > 1e-3


def expected_kept(target, drafter, k, outcomes):
    total = 0.0
    for x in itertools.product(range(V), repeat=k):
        w = 1.0
        for i in range(k):
            w *= drafter(x[:i])[x[i]].item()
        if w:
            p = torch.stack([target(x[:i]) for i in range(k + 1)])
            q = torch.stack([drafter(x[:i]) for i in range(k)])
            total += w * sum(prob * n for prob, n, _ in outcomes(p, q, torch.tensor(x)))
    return total


def test_the_papers_motivating_example():
    """Two context-free models over {a, b}: the target 1/3, 2/3, the drafter 2/3, 1/3, k = 2.
    Token-wise keeps 10/9 tokens a step on average, block verification 11/9 (the paper's
    section 2; an ideal verifier that saw the joint law would keep 12/9)."""
    global V
    old, V = V, 2
    try:
        target = lambda prefix: torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)  # noqa: E731
        drafter = lambda prefix: torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)  # noqa: E731
        assert expected_kept(target, drafter, 2, token_outcomes) == pytest.approx(10 / 9, abs=1e-12)
        assert expected_kept(target, drafter, 2, block_outcomes) == pytest.approx(11 / 9, abs=1e-12)
        assert gap(law(target, drafter, 2, block_outcomes), target_law(target, 2)) < 1e-12
    finally:
        V = old
    # the ideal: keep the pair with min(p, q) of the joint law, summed: 12/9
    p, q = {"a": Fraction(1, 3), "b": Fraction(2, 3)}, {"a": Fraction(2, 3), "b": Fraction(1, 3)}
    pairs = [x + y for x in "ab" for y in "ab"]
    kept2 = sum(min(p[s[0]] * p[s[1]], q[s[0]] * q[s[1]]) for s in pairs)
    assert 2 * kept2 + 1 * (sum(min(p[x], q[x]) for x in "ab") - kept2) == Fraction(12, 9)


@pytest.mark.parametrize("seed", range(6))
def test_block_keeps_at_least_as_many_as_token_wise(seed):
    target, drafter = Model(seed, sharp=1.5), Model(50 + seed)
    token = expected_kept(target, drafter, 3, token_outcomes)
    block = expected_kept(target, drafter, 3, block_outcomes)
    assert block >= token - 1e-12
    if seed == 0:
        assert block > token + 1e-3  # and strictly more on a case where they differ


def test_one_token_block_is_token_wise():
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(2, 7, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(1, 7, generator=g, dtype=torch.float64), -1)
    d = torch.tensor([2])
    for u in torch.rand(20, generator=g, dtype=torch.float64):
        n, dist, a = verify_sampled(p, q, d, u.view(1))
        s = verify_block(p, q, d, u.view(1))
        assert s.accepted.item() == n.item() and torch.allclose(s.dist, dist) and torch.allclose(s.stop_prob, a)


def test_the_same_coins_replay_either_rule():
    """The host helpers the inspector uses decide as the device functions do."""
    g = torch.Generator().manual_seed(7)
    for _ in range(50):
        k = int(torch.randint(1, 6, (1,), generator=g))
        p = torch.softmax(2 * torch.randn(k + 1, 9, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(2 * torch.randn(k, 9, generator=g, dtype=torch.float64), -1)
        d = torch.multinomial(q, 1, generator=g)[:, 0]
        u = torch.rand(k, generator=g, dtype=torch.float64)
        n, _, a = verify_sampled(p, q, d, u)
        s = verify_block(p, q, d, u)
        assert token_wise_accepted(a.tolist(), u.tolist()) == n.item()
        assert block_accepted(s.stop_prob.tolist(), u.tolist()) == s.accepted.item()


def test_weights_are_the_clamped_running_product():
    ratios = [0.5, 3.0, 0.2, 10.0, 0.0, 4.0]
    w, want = block_weights(torch.tensor(ratios, dtype=torch.float64), torch.ones(6, dtype=torch.float64)), [1.0]
    for r in ratios:
        want.append(min(1.0, want[-1] * r))
    assert w.tolist() == pytest.approx(want, abs=1e-15)


def test_an_empty_draft_draws_from_the_target():
    p = torch.tensor([[0.2, 0.8]], dtype=torch.float64)
    s = verify_block(p, p.new_zeros(0, 2), torch.zeros(0, dtype=torch.long), p.new_zeros(0))
    assert s.accepted.item() == 0 and s.dist.tolist() == [0.2, 0.8] and s.stop_prob.numel() == 0


# ------------------------------------------------------------------ the whole loop

def engine_drafters(target):
    from conftest import noisy_copy

    from specviz import DraftModel, PromptLookup

    from test_heads import make

    return {"pld": PromptLookup, "draft-model": lambda: DraftModel(noisy_copy(target, 0.3, seed=11)),
            "eagle": lambda: make("eagle", target), "medusa": lambda: make("medusa", target)}


@pytest.mark.parametrize("name", ["pld", "draft-model"])
def test_greedy_output_is_plain_greedy_under_either_rule(target, prompts, name):
    from specviz import GenerationConfig, baseline_generate, collect, speculative_generate

    for rule in ("token", "block"):
        cfg = GenerationConfig(max_new_tokens=24, k=4, verification=rule)
        for prompt in prompts[:2]:
            _, base = collect(baseline_generate(target, prompt, cfg))
            steps, end = collect(speculative_generate(target, engine_drafters(target)[name](), prompt, cfg))
            assert end.token_ids == base.token_ids
            assert all(s.block is None and s.verification == "token" for s in steps)  # greedy: no coins to judge


@pytest.mark.parametrize("name", ["draft-model", "eagle", "medusa"])  # EAGLE and Medusa: chains fed their hidden rows
def test_a_sampled_step_records_both_rules_on_the_same_coins(target, prompts, name):
    """Whichever rule judged it, a step says what the other would have kept with its draws."""
    from specviz import GenerationConfig, Sampling, collect, speculative_generate

    seen = {"token": 0, "block": 0}
    for rule in ("token", "block"):
        cfg = GenerationConfig(max_new_tokens=40, k=4, verification=rule, sampling=Sampling(temperature=1.0, seed=4))
        steps, end = collect(speculative_generate(target, engine_drafters(target)[name](), prompts[2], cfg))
        assert end.stats.tokens == 40 and end.stats.drafted > 20
        for s in steps:
            assert s.verification == rule and len(s.block.stop_prob) == len(s.draft) == len(s.block.weight)
            token, block = token_wise_accepted(s.accept_prob, s.draws), block_accepted(s.block.stop_prob, s.draws)
            assert s.accepted == (token if rule == "token" else block)
            seen[rule] += block != token
    assert seen["block"] + seen["token"] > 0 or name != "draft-model"  # the rules disagreed on some step


def test_the_rule_is_validated_in_a_sentence():
    from specviz import GenerationConfig, SpecvizError

    with pytest.raises(SpecvizError, match="verification must be one of token, block"):
        GenerationConfig(verification="tree").validate()


def block_runs(name, runs):
    """(counts of the first three tokens, their exact law, runs where the rules kept different counts)."""
    import test_sampling_distribution as sd
    from test_tree_sampling import exact_joint

    from specviz import GenerationConfig, Sampling, collect, speculative_generate

    small = sd.tiny_llama(vocab=sd.V, seed=3)
    with torch.no_grad():
        small.lm_head.weight.mul_(0.3)
    # prompt lookup's draft after the suite's prompt starts with a token top-k removes: nothing to judge
    prompt = [0, 2, 0, 2, 0, 2, 0, 2] if name == "pld" else sd.PROMPT
    make = engine_drafters(small)[name]
    counts, differed = {}, 0
    for seed in range(runs):
        cfg = GenerationConfig(max_new_tokens=4, k=3, top=0, raw_top=0, verification="block",
                               sampling=Sampling(**{**sd.SAMPLING.__dict__, "seed": seed}))
        steps, end = collect(speculative_generate(small, make(), prompt, cfg))
        key = tuple(end.token_ids[:3])
        counts[key] = counts.get(key, 0) + 1
        differed += any(s.accepted != token_wise_accepted(s.accept_prob, s.draws) for s in steps)
    return counts, exact_joint(small, sd.SAMPLING, prompt), differed


@pytest.mark.slow  # 700 seeded runs per drafter for a chi-square test
@pytest.mark.parametrize("name", ["pld", "draft-model"])
def test_block_verified_runs_follow_the_target(name):
    """The whole loop under block verification against the exact law of its first three tokens
    (test_sampling_distribution.py's check: 4 tokens, temperature 1.3, top-k 3, repetition
    penalty 1.2). Four tokens a run, so the first step drafts three and the block rule matters."""
    import test_sampling_distribution as sd

    counts, joint, differed = block_runs(name, sd.N)
    assert differed > sd.N // 50, "block verification kept another count than token-wise on some runs"
    sd.assert_matches(counts, joint)


def test_a_block_verified_step_survives_a_trace_file(target, prompts):
    import json

    from specviz import GenerationConfig, Sampling, collect, speculative_generate
    from specviz.render.trace import Labels, Trace
    from specviz.traces import trace_file

    cfg = GenerationConfig(max_new_tokens=12, k=3, verification="block", sampling=Sampling(temperature=1.0, seed=2))
    steps, end = collect(speculative_generate(target, engine_drafters(target)["draft-model"](), prompts[1], cfg))
    trace = Trace("draft-model", k=3)
    for s in steps:
        trace.add(s, Labels(draft=tuple(map(str, s.draft))))
    trace.add(end)
    text = trace_file.dumps(trace_file.Recording(trace_file.RunInfo("t", "draft-model"), trace))
    assert trace_file.loads(text).spec.events == steps
    doc = json.loads(text)  # a trace written before the rules were recorded loads as token-wise
    for e in doc["runs"][0]["events"]:
        e.pop("block", None), e.pop("verification", None)
    assert all(e.block is None and e.verification == "token" for e in trace_file.loads(json.dumps(doc)).spec.steps)
    doc = json.loads(text)
    doc["runs"][0]["events"][0]["block"]["stop_prob"].append(0.5)
    with pytest.raises(trace_file.TraceFileError, match="block verification does not match"):
        trace_file.loads(json.dumps(doc))


@pytest.mark.slow
def test_the_chi_square_catches_block_verification_without_its_residual(monkeypatch):
    """The same whole-loop check, on a third of the runs, fails a block rule whose token after a
    stop comes from the target's row instead of the weighted residual."""
    import test_sampling_distribution as sd

    from specviz.engine import verify_step

    def wrong(p, q, d, draws):
        s = verify_block(p, q, d, draws)
        return dataclasses.replace(s, dist=p[s.accepted])

    monkeypatch.setattr(verify_step, "verify_block", wrong)
    counts, joint, _ = block_runs("draft-model", sd.N // 3)
    with pytest.raises(AssertionError):
        sd.assert_matches(counts, joint)


# ------------------------------------------------------------------ shown step by step

def worked_step(draft=(0, 1), draws=(0.7, 0.4), rule="block"):
    """docs/exactness.md's worked example: the paper's two models over {a, b} (target 1/3, 2/3;
    drafter 2/3, 1/3), the draft "a b" and draws 0.7, 0.4."""
    from specviz.core.events import BlockCheck, StepEvent

    p = torch.tensor([[1 / 3, 2 / 3]] * 3, dtype=torch.float64)
    q = torch.tensor([[2 / 3, 1 / 3]] * 2, dtype=torch.float64)
    d, u = torch.tensor(draft), torch.tensor(draws, dtype=torch.float64)
    n, _, a = verify_sampled(p, q, d, u)
    s = verify_block(p, q, d, u)
    kept = s.accepted.item() if rule == "block" else n.item()
    return StepEvent(step=0, position=0, draft=tuple(draft), q=tuple(q[0, list(draft)].tolist()),
                     p=tuple(p[0, list(draft)].tolist()), accept_prob=tuple(a.tolist()), draws=tuple(draws),
                     accepted=kept, token=1, token_p=2 / 3, token_kind="bonus" if kept == 2 else "corrected",
                     emitted=tuple(draft[:kept]) + (1,), top=(), draft_time=0.0, verify_time=0.0, elapsed=0.0,
                     greedy=False, verification=rule, p_top=(((1, 2 / 3), (0, 1 / 3)),) * 3,
                     q_top=(((0, 2 / 3), (1, 1 / 3)),) * 2,
                     block=BlockCheck(tuple(s.weight[1:].tolist()), tuple(s.residual_mass.tolist()),
                                      tuple(s.stop_prob.tolist())))


def test_the_worked_example_by_hand():
    """Draft "a b": token-wise refuses a (u = 0.7 >= 1/2) and keeps nothing; block verification
    carries w1 = 1/2, then w2 = min(1, 1/2 x 2) = 1, so h2 = 1 and it keeps both."""
    from specviz.render.rules import backward_pass, compare, kept, token_source

    e = worked_step()
    assert kept(e) == {"token": 0, "block": 2}
    rows = compare(e)
    assert [r.w for r in rows] == pytest.approx([0.5, 1.0]) and [r.h for r in rows] == pytest.approx([0.0, 1.0])
    assert rows[0].mass == pytest.approx(0.0) and rows[1].mass is None
    assert backward_pass(e) == ["position 2: u = 0.400 < h2 = w2 = 1.000: stop, keep drafts 1 to 2"]
    assert token_source(e).startswith("every draft kept")
    # "b a" with u = 0.3, 0.6: both rules keep b, refuse a; block draws from r1 = max(0, 1 x p - q)
    e = worked_step((1, 0), (0.3, 0.6))
    assert kept(e) == {"token": 1, "block": 1}
    assert backward_pass(e) == ["position 2: u = 0.600 ≥ h2 = w2 = 0.500: go back",
                                "position 1: u = 0.300 < h1 = |r1| / (|r1| + 1 − w1) = 0.333 / (0.333 + 1 − 1.000) "
                                "= 1.000: stop, keep drafts 1 to 1"]
    assert "r1 = max(0, w1 × p − q) at position 2 (w1 = 1.000)" in token_source(e)


@pytest.mark.parametrize("rule", ["token", "block"])
def test_the_inspector_shows_both_rules_on_the_same_draws(rule):
    from specviz.render.inspect import step_html
    from specviz.render.trace import Labels, Trace
    from specviz.ui.blocks.stepping import phases

    e = worked_step(rule=rule)
    labels = Labels(draft=("a", "b"), token="b")
    trace = Trace("x", k=2)
    trace.add(e, labels)
    html = step_html(trace, 0)
    assert "token-wise keeps 0, block verification keeps 2" in html
    assert f"This run was judged {'block verification' if rule == 'block' else 'token-wise'}" in html
    assert "w2 = min(1, 0.500 × 0.667 / 0.333) = 1.000" in html  # the weights written out
    assert "position 2: u = 0.400 &lt; h2 = w2 = 1.000" in html  # the backward pass
    assert ("block verification: the block judged as a whole" in html) == (rule == "block")
    said = dict(phases(e, labels))["accept/reject"]
    assert said.startswith(f"{e.accepted} kept") and "token-wise keeps 0, block verification keeps 2" in said
    assert ("backward pass" in said) == (rule == "block")


def test_steps_without_block_numbers_show_no_comparison():
    from dataclasses import replace

    from specviz.render.rules import rules_html
    from specviz.render.trace import Labels

    e = worked_step()
    for other in (replace(e, block=None), replace(e, draws=None, greedy=True), replace(e, draft=())):
        assert rules_html(other, Labels(draft=tuple("ab"[: len(other.draft)]))) == ""


def test_the_apps_control_reaches_the_engine():
    from specviz import SpecvizError
    from specviz.run.settings import Settings

    s = Settings.from_controls(prompt="hi", mode="sampling", temperature=1.0, verification="token")
    assert s.config().verification == "token" and Settings(prompt="hi").config().verification == "block"
    with pytest.raises(SpecvizError, match="verification must be one of token, block"):
        Settings.from_controls(prompt="hi", verification="walk").config()


def test_the_bench_runs_an_arm_per_rule_and_counts_both_on_the_same_steps(target, prompts):
    from test_bench import loaded

    from specviz import Sampling
    from specviz.run import suites
    from specviz.bench.drafters import make_drafters
    from specviz.bench.runner import BenchConfig, run_benchmark

    encoded = [(suites.BenchPrompt("p0", "code", (("user", "x"),)), prompts[2])]
    cfg = BenchConfig(max_new_tokens=16, warmup=False, cost_repeats=1, verifications=("token", "block"),
                      sampling=Sampling(temperature=1.0))
    result = run_benchmark(target, make_drafters(["pld"], loaded(target)), encoded, cfg)
    by_arm = {r.arm: r for r in result.records}
    assert set(by_arm) == {"baseline", "pld k=4", "pld k=4 block"}
    for label, rule in (("pld k=4", "token"), ("pld k=4 block", "block")):
        assert by_arm[label].kept_by_rule[rule] == by_arm[label].accepted  # the rule that ran is the one counted
        assert set(by_arm[label].kept_by_rule) == {"token", "block"}
        # each rule's mean over the coins, on every step that drafted (prompt lookup's one-hot
        # draft: the same under both rules, docs/performance.md)
        r = by_arm[label]
        assert r.rule_steps["token"] == r.rule_steps["block"] == sum(1 for n, _ in r.step_outcomes if n)
        assert r.expected_by_rule["block"] == pytest.approx(r.expected_by_rule["token"], rel=1e-5)  # float32 rows
    assert by_arm["baseline"].kept_by_rule == by_arm["baseline"].expected_by_rule == {}


def test_the_bench_follows_the_engines_rule_and_runs_greedy_once():
    """The bench's default rule is GenerationConfig's (block since issue 55's measurement), each arm's label
    names a rule other than token-wise, and a greedy bench runs one arm per k: every rule keeps the same."""
    from specviz import GenerationConfig, Sampling
    from specviz.bench.drafters import BenchDrafter
    from specviz.bench.runner import BenchConfig, plan_arms

    d = [BenchDrafter("pld", object())]
    sampled = BenchConfig(sampling=Sampling(temperature=1.0), dynamic_k=4, confidences=(0.5,))
    assert GenerationConfig().verification == "block"
    assert [(a.label, a.cfg.verification) for a in plan_arms(d, sampled, [])][1:] == [
        ("pld k=4 block", "block"), ("pld dynamic k=4 block", "block"), ("pld dynamic k=4 conf=0.5 block", "block")]
    both = BenchConfig(sampling=Sampling(temperature=1.0), verifications=("token", "block"))
    assert [a.label for a in plan_arms(d, both, [])][1:] == ["pld k=4", "pld k=4 block"]
    named = [BenchDrafter("eagle@token", object())]  # the name's rule holds, as elsewhere
    assert [(a.label, a.cfg.verification) for a in plan_arms(named, both, [])][1:] == [("eagle@token k=4", "token")]
    greedy = BenchConfig(verifications=("token", "block"))
    assert [(a.label, a.cfg.verification) for a in plan_arms(d, greedy, [])][1:] == [("pld k=4", "token")]


def test_the_docs_table_of_rules_is_drawn_from_the_results():
    from specviz.cli.docs_tables import bench_rules

    def row(arm, tau, speedup):
        return dict(arm=arm, category="all", tau=tau, speedup=speedup)

    doc = {"summary": [row("baseline", None, 1.0), row("eagle@chain k=4", 2.0, 1.10), row("eagle@chain k=4 block", 2.1, 1.14),
                       row("pld k=4", 1.5, 1.0)],
           "runs": [dict(arm="eagle@chain k=4", kept_by_rule={"token": 30, "block": 33}),
                    dict(arm="eagle@chain k=4 block", kept_by_rule={"token": 20, "block": 22}), dict(arm="baseline")]}
    table = bench_rules(doc).splitlines()
    assert len(table) == 3  # the header, its rule, one drafter with both arms (pld ran token-wise only)
    assert table[2] == "| `eagle@chain k=4` | 2.00 | 2.10 | +5.0% | 1.10x | 1.14x | 50 → 55 (+10.0%) |"


def test_the_docs_table_of_rule_means_is_drawn_from_the_results():
    from specviz.cli.docs_tables import bench_rule_means

    chain = dict(arm="eagle@chain k=4", expected_by_rule={"token": 8.0, "block": 9.0}, rule_steps={"token": 10, "block": 10},
                 kept_by_rule={"token": 7, "block": 9})
    doc = {"runs": [dict(arm="baseline"), chain, {**chain, "expected_by_rule": {"token": 2.0, "block": 3.0}},
                    dict(arm="eagle k=4", expected_by_rule={"walk": 6.0}, rule_steps={"walk": 8})]}
    assert bench_rule_means(doc).splitlines()[2:] == [
        "| `eagle@chain k=4` | chain | 20 | 0.500 | 0.600 | +20.0% | - | 14 → 18 |",
        "| `eagle k=4` | tree | 8 | - | - | - | 0.750 | - |"]


def test_the_distribution_card_says_the_block_decided():
    from specviz.render.distribution import card_html, position
    from specviz.render.trace import Labels, Trace

    for rule in ("token", "block"):
        trace = Trace("x", k=2)
        trace.add(worked_step(rule=rule), Labels(draft=("a", "b"), token="b", p_top=(("b", "a"),) * 3,
                                                  q_top=(("a", "b"),) * 2))
        card = card_html(position(trace, 0, 0, 1.0, 1.0), 1.0, 1.0)
        if rule == "block":  # "a": u = 0.7 >= 0.5, refused token-wise, kept by the block
            assert "this draft was kept" in card and "would have rejected it" in card
        else:
            assert "0.700 ≥ 0.500: rejected" in card and "block" not in card


@pytest.mark.parametrize("seed", range(4))
def test_a_deterministic_draft_gains_nothing_from_the_block(seed):
    """Prompt lookup's draft is one-hot: any exact rule keeps d1..di with probability at most the
    target's p(d1)...p(di), which token-wise already reaches, so the block keeps the same on
    average (docs/performance.md: what the bench found for prompt lookup)."""
    target, drafter = Model(seed, sharp=1.5), Model(50 + seed, one_hot=True)
    assert expected_kept(target, drafter, 3, block_outcomes) == pytest.approx(
        expected_kept(target, drafter, 3, token_outcomes), abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_each_rules_mean_over_the_coins(seed):
    """token_wise_expected and block_expected are the means of what each rule keeps over every way
    its coins can fall (each coin passes with its a_i, or h_i), one draft and its rows fixed."""
    g = torch.Generator().manual_seed(seed)
    a, h = torch.rand(2, 4, generator=g, dtype=torch.float64).tolist()
    h[1] = 0.0  # an empty residual: the backward pass never stops there
    means = {"token": 0.0, "block": 0.0}
    for passes in itertools.product([True, False], repeat=4):
        draws = [ACCEPT if ok else REJECT for ok in passes]
        for rule, chance, kept in (("token", a, token_wise_accepted), ("block", h, block_accepted)):
            weight = 1.0
            for ok, c in zip(passes, chance):
                weight *= c if ok else 1 - c
            means[rule] += weight * kept(chance, draws)
    assert token_wise_expected(a) == pytest.approx(means["token"], abs=1e-12)
    assert block_expected(h) == pytest.approx(means["block"], abs=1e-12)
