"""The distribution view's maths, checked by enumeration over small hand-made distributions,
and what a step records for it (specviz.core.distribution, verify_step's raw top)."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch

from conftest import noisy_copy
from specviz import DraftModel, GenerationConfig, Sampling, collect, speculative_generate
from specviz.core.distribution import REST, accept_prob, nucleus, one_hot, overlap, reshape, residual
from specviz.render import distribution as view
from specviz.render.trace import Labels, Trace

CASES = [
    ({0: 0.5, 1: 0.3, 2: 0.2}, {0: 0.2, 1: 0.2, 2: 0.6}),
    ({0: 0.7, 1: 0.3}, {0: 0.7, 1: 0.3}),
    ({0: 1.0}, {1: 0.5, 2: 0.5}),
    ({0: 0.1, 1: 0.1, 2: 0.8}, {2: 1.0}),
]


@pytest.mark.parametrize("p, q", CASES)
def test_overlap_is_the_probability_the_drafted_token_is_accepted(p, q):
    # draw x ~ q, keep it with probability min(1, p/q): enumerate every x
    assert sum(qx * accept_prob(p, q, x) for x, qx in q.items()) == pytest.approx(overlap(p, q))


@pytest.mark.parametrize("p, q", CASES)
def test_accept_or_resample_from_the_residual_gives_exactly_p(p, q):
    a, r = overlap(p, q), residual(p, q)
    for x in set(p) | set(q):
        out = q.get(x, 0) * accept_prob(p, q, x) + (1 - a) * r.get(x, 0)
        assert out == pytest.approx(p.get(x, 0))


def test_residual_is_empty_when_the_drafter_is_the_target():
    assert residual({0: 0.4, 1: 0.6}, {0: 0.4, 1: 0.6}) == {}
    assert overlap({0: 0.4, 1: 0.6}, {0: 0.4, 1: 0.6}) == pytest.approx(1.0)


def test_reshape_of_a_whole_vocabulary_is_the_tempered_softmax():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    raw = list(enumerate(torch.log_softmax(logits, -1).tolist()))
    for t in (0.3, 1.0, 1.7):
        want = torch.softmax(logits / t, -1).tolist()
        got = reshape(raw, t)
        assert REST not in got
        assert [got[i] for i in range(4)] == pytest.approx(want)
    assert reshape(raw, 0.0) == {0: 1.0}  # greedy


def test_reshape_keeps_the_tail_mass_as_one_bar_at_temperature_one():
    raw = [(5, math.log(0.5)), (6, math.log(0.3))]
    got = reshape(raw, 1.0)
    assert got == pytest.approx({5: 0.5, 6: 0.3, REST: 0.2})
    assert reshape(raw, 0.5)[REST] < 0.2 < reshape(raw, 2.0)[REST]  # cooler: the tail shrinks


@pytest.mark.parametrize("top_p, kept", [(0.5, {0}), (0.51, {0, 1}), (0.8, {0, 1}), (0.81, {0, 1, 2}), (1.0, {0, 1, 2})])
def test_nucleus_keeps_the_smallest_prefix_reaching_top_p(top_p, kept):
    got = nucleus({0: 0.5, 1: 0.3, 2: 0.2}, top_p)
    assert set(got) == kept and sum(got.values()) == pytest.approx(1.0)


def test_a_drafter_without_q_is_one_hot():
    p = {0: 0.25, 1: 0.75}
    assert overlap(p, one_hot(1)) == 0.75 and residual(p, one_hot(1)) == {0: 1.0, 1: 0.0}


def _same_shape(got: dict, top) -> None:
    """The recorded top tokens in the reshaped row: exactly in the run's proportions (their
    share of the whole differs only by how the unrecorded tail is estimated)."""
    kept = [(t, x) for t, x in top if x > 1e-3 and got.get(t, 0) > 0]
    (t0, x0), rest = kept[0], kept[1:]
    for t, x in rest:
        assert got[t] / got[t0] == pytest.approx(x / x0, rel=1e-3)


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (1.0, 1.0), (0.8, 1.0), (1.3, 0.9)])
def test_a_step_records_raw_top_that_reshapes_to_the_run_s_p_and_q(target, prompts, temperature, top_p):
    sampling = Sampling(temperature=temperature, top_p=top_p, seed=1)
    steps, _ = collect(speculative_generate(target, DraftModel(noisy_copy(target, 0.05)), prompts[2],
                                            GenerationConfig(k=3, max_new_tokens=12, sampling=sampling)))
    t = temperature or 1.0  # greedy runs record the temperature-1 softmax
    for s in steps:
        assert len(s.p_raw) == len(s.draft) + 1 and len(s.q_raw) == len(s.draft)
        for raw, top in [*zip(s.p_raw, s.p_top), *zip(s.q_raw, s.q_top)]:
            got = reshape(raw, t, top_p)
            _same_shape(got, top)
            if t == 1.0 and top_p == 1.0:  # the run's own settings at temperature 1: exact
                assert [got[k] for k, _ in top] == pytest.approx([x for _, x in top], abs=1e-5)


def test_raw_top_0_records_no_log_probs_and_changes_nothing_else(target, prompts):
    """The bench times runs and never shows a distribution: raw_top=0 skips the log-probs
    (~2 ms a step on a real vocabulary), and the run is otherwise the very same."""
    def run(raw_top):
        cfg = GenerationConfig(k=3, max_new_tokens=12, raw_top=raw_top, sampling=Sampling(temperature=0.8, seed=4))
        return collect(speculative_generate(target, DraftModel(noisy_copy(target, 0.05)), prompts[2], cfg))[0]

    with_raw, without = run(32), run(0)
    assert all(len(s.p_raw[0]) == 32 for s in with_raw) and all(not s.p_raw and not s.q_raw for s in without)
    assert [(s.draft, s.q, s.p, s.draws, s.emitted, s.p_top, s.q_top) for s in with_raw] == \
        [(s.draft, s.q, s.p, s.draws, s.emitted, s.p_top, s.q_top) for s in without]


def test_the_view_draws_every_position_of_a_step(target, prompts):
    steps, _ = collect(speculative_generate(target, DraftModel(noisy_copy(target, 0.05)), prompts[2],
                                            GenerationConfig(k=3, max_new_tokens=8,
                                                             sampling=Sampling(temperature=1.0, seed=2))))
    trace = Trace("draft")
    for s in steps:
        trace.add(s, Labels(draft=("x",) * len(s.draft), p_raw=tuple(("t",) * len(r) for r in s.p_raw),
                            q_raw=tuple(("t",) * len(r) for r in s.q_raw)))
    e = steps[0]
    for row in range(len(e.draft) + 1):
        pos = view.position(trace, 0, row, 0.7, 0.95)
        assert sum(pos.p.values()) == pytest.approx(1.0)
        assert bool(pos.q) == (row < len(e.draft))
        assert view.figure(pos).data and "sv-dist" in view.card_html(pos, 0.7, 0.95)
    assert view.position(Trace("empty"), 0, 0, 1.0, 1.0) is None


def test_the_card_quotes_the_drafted_token_with_its_spaces():
    """The card read "drafted by: p = ..." for the token ' by' (its space lost, unquoted)."""
    from specviz.core.events import StepEvent

    e = StepEvent(step=0, position=0, draft=(5,), q=(0.5,), p=(0.25,), accept_prob=(0.5,), draws=(0.7,), accepted=0,
                  token=6, token_p=0.5, token_kind="corrected", emitted=(6,), top=((6, 0.5),), draft_time=0.0,
                  verify_time=0.0, elapsed=0.0, greedy=False, p_top=(((6, 0.5), (5, 0.25)),),
                  q_top=(((5, 0.5), (6, 0.25)),))
    trace = Trace("draft")
    trace.add(e, Labels(draft=(" by",), token=" of", p_top=((" of", " by"),), q_top=((" by", " of"),)))
    card = view.card_html(view.position(trace, 0, 0, 1.0, 1.0), 1.0, 1.0)
    assert "drafted <code class=\"sv-inspect-tok\">' by'</code>: p = 0.250, q = 0.500" in card

    # The position after the draft: a bonus only when every draft was kept; here draft 1 was refused.
    after = view.card_html(view.position(trace, 0, 1, 1.0, 1.0), 1.0, 1.0)
    assert "every draft was accepted" not in after and "did not reach here: draft 1 was rejected" in after
    kept = replace(e, accepted=1, token_kind="bonus", emitted=(5, 6))
    trace = Trace("draft")
    trace.add(kept, Labels(draft=(" by",), token=" of", p_top=((" of", " by"), (" of",)), q_top=((" by", " of"),)))
    assert "every draft was accepted" in view.card_html(view.position(trace, 0, 1, 1.0, 1.0), 1.0, 1.0)


def test_a_step_plays_in_the_engine_s_phases():
    from specviz.core.events import StepEvent
    from specviz.ui.blocks.stepping import phases

    e = StepEvent(step=0, position=0, draft=(5, 6, 7), q=(0.5, 0.4, 0.3), p=(0.6, 0.1, 0.2),
                  accept_prob=(1.0, 0.25, 0.66), draws=(0.3, 0.8, 0.1), accepted=1, token=9, token_p=0.4,
                  token_kind="corrected", emitted=(5, 9), top=(), draft_time=0, verify_time=0, elapsed=0, greedy=False)
    got = phases(e, Labels(draft=("a", "b", "c"), token="z"))
    assert [name for name, _ in got] == ["draft", "verify", "accept/reject", "correction"]
    assert "“b” rejected" in got[2][1] and "0.80 vs 0.25" in got[2][1] and "norm(max(0, p − q))" in got[3][1]
    bonus = StepEvent(**{**e.__dict__, "accepted": 3, "token_kind": "bonus", "emitted": (5, 6, 7, 9)})
    assert phases(bonus, Labels(draft=("a", "b", "c"), token="z"))[-1][0] == "bonus"
    # the phase's name leads the status: its text does not say it again ("4/4 bonus: bonus: ...")
    assert not any(text.startswith(f"{name}:") for name, text in phases(bonus, Labels(draft=("a", "b", "c"),
                                                                                      token="z")) + got)
    # nothing drafted: the target's token alone, neither a bonus nor a correction
    empty = StepEvent(**{**e.__dict__, "draft": (), "q": (), "p": (), "accept_prob": (), "draws": (), "accepted": 0,
                         "token_kind": "bonus", "emitted": (9,)})
    said = phases(empty, Labels(draft=(), token="z"))
    assert [name for name, _ in said] == ["draft", "target's token"] and "bonus" not in str(said)


def test_at_a_sampled_tree_s_depth_the_view_shows_the_children_tried_in_order_and_p_prime():
    """Issue 46 (3): no q for a tree's one-hot children. The bars are the target's p at the node
    and p′ once the refused children are out; the card is the walk there (p′(x), u, verdict, mass
    left) and why the third child was kept after two refusals."""
    import html
    import re

    from test_render import spec_trace, walked_step

    trace = spec_trace(walked_step())
    pos = view.position(trace, 0, 0, 1.0, 1.0)
    fig, card = view.figure(pos), html.unescape(re.sub(r"<[^>]+>", "", view.card_html(pos, 1.0, 1.0)))
    assert [d.name.split(":")[0] for d in fig.data] == ["p (target) at this node", "p′ after the refusals"]
    p, after = ({x: y for x, y in zip(d.x, d.y)} for d in fig.data)
    assert after["an"] == pytest.approx(0.1 / 0.2) and after["the"] == after["a"] == 0  # refused: out of p′
    assert p["the"] == pytest.approx(0.5) and sum(after.values()) == pytest.approx(1.0)
    assert [a.text for a in fig.layout.annotations] == ["1st: refused", "2nd: refused", "3rd: kept"]
    assert "min(1, p/q)" not in card and "q = " not in card
    assert "0.600 = 0.300 / 0.500" in card and card.count("refused: u ≥ p′(x)") == 2
    assert "So 'an', tried after 2 refusals, was judged by p′ = p / mass left = 0.100 / 0.200 = 0.500" in card
    deeper = view.card_html(view.position(trace, 0, 1, 1.0, 1.0), 1.0, 1.0)  # the child "<b>", escaped
    assert '<code class="sv-inspect-tok">&lt;b&gt;</code>' in deeper and "<b>" not in deeper.replace("<b>The", "")
    assert "every child of “an” was refused" in html.unescape(deeper).lower()


def test_a_sampled_tree_step_plays_its_sibling_walk_child_by_child():
    from test_render import kinds, walked_step

    from specviz.render.html import phase_spans
    from specviz.ui.blocks.stepping import phases

    e, labels = walked_step()
    got = phases(e, labels)
    assert [name for name, _ in got] == ["draft", "verify", *["sibling walk"] * 4, "accept/reject", "correction"]
    walk = [text for name, text in got if name == "sibling walk"]
    assert walk[1] == ("2nd child of the text so far, “a”: p′(x) = 0.600 = 0.300 / 0.500, u = 0.710 ≥ p′(x): "
                       "refused; p′ drops it and is renormalised: the rest of p divided by the mass left, 0.200")
    assert "u = 0.350 < p′(x): kept, the walk goes down into it" in walk[2] and "1st child of “an”" in walk[3]
    assert "min(1, p/q)" not in " ".join(text for _, text in got) and "a tree of 4 candidates" in got[0][1]
    assert "drawn from the final p′" in got[-1][1] and got[-1][1].endswith("“x”")
    assert kinds("".join(phase_spans(e, labels, "sibling walk"))) == ["checking", "checking"]
    assert [name for name, _ in phases(*walked_step(greedy=True))] == ["draft", "verify", "accept/reject",
                                                                      "correction"]  # greedy trees: as before
