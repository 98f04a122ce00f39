"""The exactness audit (`python -m specviz audit`): its statistics on hand-made samples, its verdicts,
a served engine read over HTTP, and controls that must fail beside exact engines that must pass.

Fixed seeds throughout: every p-value here is the same on every run.
"""
from __future__ import annotations

import json
import random
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from scipy.stats import chisquare, ncx2

from conftest import noisy_copy, tiny_llama
from specviz import DraftModel, Sampling
from specviz.drafters.prompt_lookup import PromptLookup
from specviz.audit import report
from specviz.audit.controls import DELTA, EPSILON, RawQ, Typical, typical_accepted, typical_threshold
from specviz.audit.engines import Generate, Local, config, draws, pair, target_p
from specviz.audit.stats import (chi_square, compare, detectable_tv, exact_tests, fit, joint, noncentral_survival,
                                 total_variation, tv_interval)
from specviz.cli.main import main

OUTCOMES = ("a", "b", "c", "d", "e", "f")
P = (0.3, 0.25, 0.2, 0.12, 0.08, 0.05)


def sample(weights, n, seed, length=2):
    """n completions of `length` tokens, each token drawn independently from `weights`."""
    r = random.Random(seed)
    return [tuple(r.choices(OUTCOMES, weights)[0] for _ in range(length)) for _ in range(n)]


def shifted(tv: float):
    """P with `tv` of mass moved from its two likeliest outcomes to its two rarest."""
    q = list(P)
    q[0] -= tv / 2
    q[1] -= tv / 2
    q[-1] += tv / 2
    q[-2] += tv / 2
    return q


def test_one_distribution_twice_passes_and_a_shift_of_0_1_fails_at_500_draws():
    same = compare(sample(P, 500, 1), sample(P, 500, 2), depth=2)
    assert not same.different and same.p > 0.05
    moved = compare(sample(shifted(0.1), 500, 1), sample(P, 500, 2), depth=2)
    assert moved.different and moved.p < 1e-3
    assert moved.tv > moved.tv_floor and moved.tv_low > same.tv_low
    # each position is tested too, and the verdict's p pays for the three looks
    assert [t.what for t in moved.tests] == ["first 2 tokens together", "token 1", "token 2"]
    assert moved.p == pytest.approx(min(1, 3 * min(t.p for t in moved.tests)))


def test_the_intervals_upper_end_never_falls_below_the_estimate_and_covers_a_small_difference():
    """Near 0 the reversed bootstrap's upper end fell below the estimate (to 0.000-0.000): one
    sample compared with itself is not proof of TV 0. The upper end states what this size allows."""
    s = joint(sample(P, 300, 1, 1), 1)
    low, high = tv_interval(s, s)
    assert low == 0 and high > 0.03  # 300 draws each way cannot pin TV below a few hundredths
    true_tv = 0.03
    for t in range(10):
        a, b = joint(sample(shifted(true_tv), 300, 100 + t, 1), 1), joint(sample(P, 300, 200 + t, 1), 1)
        low, high = tv_interval(a, b, rounds=200)
        assert low <= total_variation(a, b) <= high and high >= true_tv


def test_rare_outcomes_are_pooled_so_a_long_tail_is_testable():
    a = Counter_of([("x",)] * 50 + [(f"rare{i}",) for i in range(40)])
    b = Counter_of([("x",)] * 50 + [(f"other{i}",) for i in range(40)])
    stat, dof, p = chi_square(a, b)
    assert dof == 1 and p > 0.5  # "x" against everything else pooled


def Counter_of(samples):
    return joint(samples, 1)


def test_the_power_bound_matches_scipys_noncentral_chi_square():
    for x, dof, nc in ((11.3, 4, 6.0), (30.0, 17, 25.0), (2.0, 1, 0.5)):
        assert noncentral_survival(x, dof, nc) == pytest.approx(ncx2.sf(x, dof, nc), abs=1e-6)


def test_a_difference_of_the_stated_size_is_caught_at_least_as_often_as_promised():
    """The least favourable shift of the stated TV (moving mass in proportion to P, between two
    halves of equal mass) is caught at the stated 80% or more; a quarter of it mostly is not."""
    n = 300
    half = (0.3, 0.2)  # the first and third outcomes hold half the mass
    tv = detectable_tv(n, n, dof=len(P) - 1, alpha=0.01)
    assert 0.1 < tv < 0.2

    def caught(size, trials=60):
        q = [p * (1 + 2 * size) if p in half and i in (0, 2) else p * (1 - 2 * size) for i, p in enumerate(P)]
        hits = 0
        for t in range(trials):
            a, b = joint(sample(q, n, 1000 + t, 1), 1), joint(sample(P, n, 5000 + t, 1), 1)
            hits += chi_square(a, b)[2] < 0.01
        return hits / trials

    assert caught(tv) >= 0.75
    assert caught(tv / 4) < 0.3


def test_the_verdict_withholds_judgement_without_drafts_or_draws_and_states_the_power_beside_a_pass():
    c = compare(sample(P, 300, 1), sample(P, 300, 2), depth=2)
    word, sentence = report.verdict(c, drafted=0, accepted=0)
    assert word == report.NO_VERDICT and "nothing was drafted" in sentence
    few = compare(sample(P, 10, 1), sample(P, 10, 2), depth=2)
    assert report.verdict(few, drafted=12, accepted=5)[0] == report.NO_VERDICT
    word, sentence = report.verdict(c, drafted=400, accepted=100)
    assert word == report.EXACT and f"TV {c.detectable:.3f} or more with 80% probability" in sentence
    assert "rejection rule was never exercised" in report.verdict(c, drafted=400, accepted=400)[1]
    assert "acceptance rule was never exercised" in report.verdict(c, drafted=400, accepted=0)[1]


# --- a served engine, over HTTP ----------------------------------------------------------------

class Served:
    """A fake OpenAI-compatible server streaming one token per chunk, drawn from `weights` with the
    request's seed, with llama.cpp's running draft counters (it claims one draft per token)."""

    def __init__(self, weights, version=("/props", {"build_info": "b1234-fake",
                                                   "default_generation_settings": {"n_ctx": 4096}})):
        self.weights, self.bodies = weights, []
        served = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # where it tells its version (llama.cpp's /props, vLLM's /version), or the models
                answer = version[1] if self.path == version[0] else {"data": [{"id": "fake"}]}
                self._send(json.dumps(answer).encode(), "application/json")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                served.bodies.append(body)
                r = random.Random(body["seed"])
                lines = []
                for i in range(body["max_tokens"]):
                    t = {"predicted_n": i + 1, "draft_n": i + 1, "draft_n_accepted": i}
                    piece = r.choices(OUTCOMES, served.weights)[0]
                    lines.append({"choices": [{"delta": {"content": piece}}], "timings": t})
                text = "".join(f"data: {json.dumps(e)}\n\n" for e in lines) + "data: [DONE]\n\n"
                self._send(text.encode(), "text/event-stream")

            def _send(self, data, kind):
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"


@pytest.fixture(scope="module")
def servers():
    made = {"spec": Served(P), "base": Served(P), "lossy": Served(shifted(0.15), ("/version", {"version": "0.32.0"}))}
    yield made
    for s in made.values():
        s.server.shutdown()


def audit_cli(capsys, tmp_path, *args):
    out = tmp_path / "audit.json"
    code = main(["audit", "--json", str(out), *args])
    return code, capsys.readouterr(), json.loads(out.read_text()) if out.exists() else None


def test_a_server_pair_is_audited_with_the_requests_sampling_fields_and_its_drafts(servers, capsys, tmp_path):
    code, printed, data = audit_cli(capsys, tmp_path, "--server", servers["spec"].url, "--baseline-server",
                                    servers["base"].url, "--draws", "200", "--tokens", "2", "--top-k", "20",
                                    "--repetition-penalty", "1.1")
    assert code == 0, printed.out
    first, second = data["results"]
    assert first["verdict"] == report.EXACT and first["drafted"] == 1200 and first["accepted"] == 1000
    # 2 tokens tested of the 6 asked for: a server drafts no further than the request's end
    assert servers["spec"].bodies[-1]["max_tokens"] == 6 and first["comparison"]["depth"] == 2
    assert second["setting"] == "temperature 1, top-k 20, top-p 0.9, repetition penalty 1.1"
    body = servers["spec"].bodies[-1]
    assert (body["top_k"], body["top_p"], body["min_p"], body["repeat_penalty"]) == (20, 0.9, 0.0, 1.1)
    assert body["repeat_last_n"] == 4096  # llama.cpp's penalty over its whole context (/props' n_ctx), not 64 tokens
    # the plain side draws from other seeds: the same seed both ways would correlate the two samples
    assert {b["seed"] for b in servers["spec"].bodies}.isdisjoint(b["seed"] for b in servers["base"].bodies)
    assert "catches TV >=" in printed.out and "audit:" not in printed.out  # progress goes to stderr
    assert data["audited"]["server_version"] == first["speculative"]["version"] == "b1234-fake"


def test_a_server_that_samples_another_distribution_fails_and_shows_both_side_by_side(servers, capsys, tmp_path):
    code, printed, data = audit_cli(capsys, tmp_path, "--server", servers["lossy"].url, "--baseline-server",
                                    servers["base"].url, "--draws", "200", "--tokens", "2", "--top-k", "0",
                                    "--top-p", "1")
    assert code == 1 and len(data["results"]) == 1
    result = data["results"][0]
    assert result["verdict"] == report.NOT_EXACT
    rows = {r["outcome"]: (r["speculative"], r["plain"]) for r in result["outcomes"]}
    assert rows["aa"][0] < rows["aa"][1]  # the likeliest outcome lost mass
    assert "first tokens" in printed.out and "NOT exact" in printed.out
    assert data["audited"]["server_version"] == "0.32.0" and "report different builds" in printed.out


@pytest.mark.parametrize("args, words", [
    (["--server", "http://127.0.0.1:9"], "go together"),
    (["--temperature", "0"], "give a temperature above 0"),
    (["--lossy", "raw-q", "--engine", "transformers"], "specviz's own engine"),
    (["--ensemble-weight", "0.5"], "--engine transformers"),
    (["--lossy", "typical", "--verification", "block"], "its own verification rule"),
    (["--against", "target", "--server", "http://127.0.0.1:9", "--baseline-server", "http://127.0.0.1:9"],
     "which a server does not send"),
    (["--engine", "transformers", "--tree-nodes-per-k", "2"], "choose specviz's own rules"),
])
def test_bad_requests_get_one_sentence(capsys, args, words):
    assert main(["audit", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


# --- local engines on a tiny model ----------------------------------------------------------

PROMPT = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
V = 8


@pytest.fixture(scope="module")
def small():
    return tiny_llama(vocab=V, seed=3)


def test_transformers_generate_reports_what_prompt_lookup_drafted_and_kept(small):
    s = Sampling(temperature=1.0)
    e = Generate(small, "hf-pld", PROMPT, s, tokens=3, k=3)
    draws = [e.draw(seed) for seed in range(5)]
    assert all(len(d.tokens) == 3 for d in draws)
    assert sum(d.drafted for d in draws) > 0 and 0 <= sum(d.accepted for d in draws) <= sum(d.drafted for d in draws)
    assert e.kwargs["top_k"] == 0  # off, not the model's own default
    assert Generate(small, "hf", PROMPT, s, tokens=3).draw(0).drafted == 0


def test_specviz_draws_count_the_drafts_behind_the_tokens_under_either_rule(small):
    for rule in ("token", "block"):
        e = Local(small, DraftModel(noisy_copy(small, 0.1, seed=11)), PROMPT,
                  config(Sampling(temperature=1.0), 3, k=3, verification=rule), 3)
        d = e.draw(0)
        assert len(d.tokens) == 3 and d.drafted >= 1 and e.settings()["verification"] == rule
    assert main(["audit", "--engine", "transformers", "--verification", "block"]) == 2  # specviz's own rule only


@pytest.mark.slow  # 900 sampled runs on a tiny model
def test_q_taken_before_the_warpers_is_caught_and_the_exact_rule_passes_at_300_draws(small):
    """transformers #47932's bug, rebuilt (controls.RawQ): at temperature 0.5 the draft's raw q is
    flatter than the q its tokens came from. 300 draws each way catch it (p ~ 3e-5); the same
    drafter verified against its real q passes."""
    draft = noisy_copy(small, 0.1, seed=11)
    s = Sampling(temperature=0.5)
    plain = [Local(small, None, PROMPT, config(s, 3), 3).draw(10**6 + i).tokens for i in range(300)]

    def audit(drafter):
        e = Local(small, drafter, PROMPT, config(s, 3, k=3), 3)
        draws = [e.draw(i) for i in range(300)]
        assert sum(d.drafted for d in draws) > sum(d.accepted for d in draws) > 0  # drafts kept and refused
        return compare([d.tokens for d in draws], plain, 3)

    exact, lossy = audit(DraftModel(draft)), audit(RawQ(DraftModel(draft)))
    assert not exact.different and exact.p > 0.1
    assert lossy.different and lossy.p < 1e-3


def test_medusas_typical_acceptance_keeps_what_passes_its_threshold_without_a_draw():
    flat, sure = torch.full((8,), 1 / 8), torch.tensor([0.97] + [0.03 / 7] * 7)
    assert typical_threshold(flat).item() == pytest.approx(DELTA / 8)  # delta exp(-ln 8)
    assert typical_threshold(sure).item() == pytest.approx(EPSILON)  # a confident row: epsilon
    p = torch.stack([flat, sure, flat])  # two draft rows and the bonus row
    assert typical_accepted(p, torch.tensor([3, 0])) == 2  # 1/8 > 0.0375, 0.97 > 0.09: no u, no q
    assert typical_accepted(p, torch.tensor([3, 5])) == 1  # 0.03 / 7 is below the threshold


def test_medusas_typical_acceptance_is_caught_where_the_same_loop_refusing_every_draft_passes(small):
    """The control (controls.Typical) at 100 draws each way on the tiny model: prompt lookup's copy
    passes every threshold on its near-flat rows and comes out far more often than the target
    writes it (p ~ 7e-33). The same loop with a threshold nothing passes samples every token from
    p, and passes: the acceptance rule is what fails, not the loop around it."""
    s = Sampling(temperature=1.0)
    plain = [Local(small, None, PROMPT, config(s, 3), 3).draw(10**6 + i).tokens for i in range(100)]

    def audit(**threshold):
        draws = [Typical(small, PromptLookup(), PROMPT, s, 3, k=3, **threshold).draw(i) for i in range(100)]
        return compare([d.tokens for d in draws], plain, 3), sum(d.drafted for d in draws), sum(d.accepted for d in draws)

    (lossy, drafted, kept), (refusing, _, none) = audit(), audit(epsilon=1.0, delta=float("inf"))  # threshold 1
    assert drafted > kept > 0 and lossy.different and lossy.p < 1e-6
    assert none == 0 and not refusing.different and refusing.p > 0.05


def test_the_time_cap_judges_what_was_drawn_by_then(servers, capsys, tmp_path):
    code, printed, data = audit_cli(capsys, tmp_path, "--server", servers["spec"].url, "--baseline-server",
                                    servers["base"].url, "--draws", "50", "--top-k", "0", "--top-p", "1",
                                    "--time-cap", "1e-9")
    assert code == 3 and data["results"][0]["comparison"]["draws"] == [0, 0]
    assert "the time cap stopped the draws at 0 each way" in printed.err and "No verdict: too few" in printed.out


# --- against the target's exact p (--against target) -------------------------------------------

def against_target(small, engine, n, s):
    """exact_tests on n speculative draws from `engine`, against the tiny target's own p."""
    got = [d.tokens for d, in draws([engine], n)]
    return exact_tests(got, lambda tokens: target_p(small, PROMPT + list(tokens), s), 3)


def test_against_the_targets_p_the_exact_rule_passes_and_q_before_the_warpers_fails(small):
    """RawQ (transformers #47932) at temperature 0.3, 300 draws, one sample: every token's fit to the
    target's p fails (p ~ 1e-4 or less), where the same drafter verified against its real q passes."""
    s, draft = Sampling(temperature=0.3), noisy_copy(small, 0.1, seed=11)
    exact = against_target(small, pair(small, DraftModel(draft), PROMPT, config(s, 3, 3), 3)[0], 300, s)
    lossy = against_target(small, pair(small, RawQ(DraftModel(draft)), PROMPT, config(s, 3, 3), 3)[0], 300, s)
    assert [t.what for t, _ in exact] == ["token 1", "token 2 given '(4,)'", "token 3 given '(4, 4)'"]
    assert all(t.dof and t.p > 0.05 for t, _ in exact) and exact[0][1] == 300
    assert all(t.p < 1e-3 for t, _ in lossy)
    assert report.fit_verdict([t for t, _ in lossy], 300, 10, 0.01)[0] == report.NOT_EXACT


def test_against_the_targets_p_medusas_typical_acceptance_fails_at_60_draws(small):
    s = Sampling(temperature=1.0)
    (first, n), *_ = against_target(small, Typical(small, PromptLookup(), PROMPT, s, 3, k=3), 60, s)
    assert n == 60 and first.p < 1e-10


def test_the_fit_pools_rare_tokens_into_the_least_cell_and_catches_a_shift():
    p = torch.tensor([0.5, 0.3, 0.17, 0.02, 0.01, 0.0])
    stat, dof, pvalue = fit(Counter({0: 50, 1: 30, 2: 17, 3: 2, 4: 1}), p)
    assert stat == pytest.approx(0, abs=1e-9) and dof == 2  # 3 and 4 (3 expected) folded into 2: three cells
    shifted_p = fit(Counter({0: 30, 1: 50, 2: 20}), p)[2]
    assert shifted_p < 1e-3 and shifted_p == pytest.approx(chisquare([30, 50, 20], [50, 30, 20]).pvalue, rel=1e-5)
    assert fit(Counter({0: 3}), p) == (0.0, 0, 1.0)  # nothing expects 5 draws: nothing to test


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tiny_folder import make_tiny_model_dir

    return str(make_tiny_model_dir(tmp_path_factory.mktemp("audit") / "tiny"))


@pytest.mark.parametrize("engine", ["specviz", "transformers"])
def test_the_audit_against_the_target_prints_a_line_per_token_and_its_verdict(folder, engine, capsys, tmp_path):
    code, printed, data = audit_cli(capsys, tmp_path, "--against", "target", "--target", folder, "--engine", engine,
                                    "--draws", "100", "--temperature", "0.3", "--top-k", "0", "--top-p", "1")
    assert code == 0, printed.out
    (result,) = data["results"]
    assert data["against"] == "target" and result["verdict"] == report.EXACT and result["drafted"] > 0
    assert [t["draws"] for t in result["tests"]][0] == 100 and "plain" not in result
    assert "token 2 given" in printed.out and "p = " in printed.out
    assert ("judged block; on" in printed.out) == (engine == "specviz")  # the rules' counts are specviz's steps'
    code, printed, data = audit_cli(capsys, tmp_path, "--against", "target", "--target", folder, "--draws", "10",
                                    "--engine", engine, "--top-k", "0", "--top-p", "1")
    assert code == 3 and "too few draws to judge: 10, and" in printed.out
