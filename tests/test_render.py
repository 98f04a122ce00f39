"""The renderer, as a specification: events in, HTML and figures out, no model anywhere."""
from __future__ import annotations

from dataclasses import replace

import html
import re

import pytest

from specviz.core.events import RunEnd, RunStats, StepEvent, TokenEvent, TreeDraft
from specviz.core.metrics import predicted_speedup
from specviz.render import (Labels, Trace, agreement, agreement_html, compare_figures, compare_rows, headline,
                            headline_html, panel_html, playground_figures, side_by_side_html, step_html, tokens_html)
from specviz.render.charts import position_rates
from specviz.render.numbers import gap_html


def step(n, draft, accepted, token, *, emitted=None, greedy=True, q=None, top=None, elapsed=None, **kw):
    """A hand-made speculative step: `draft` proposed, the first `accepted` kept, then `token`."""
    k = len(draft)
    kind = "bonus" if accepted == k else "corrected"
    fields = dict(
        step=n, position=0, draft=tuple(draft), q=q, p=tuple(0.5 for _ in draft),
        accept_prob=tuple(1.0 if i < accepted else 0.0 for i in range(k)),
        draws=None if greedy else tuple(0.25 for _ in draft), accepted=accepted, token=token, token_p=0.9, token_kind=kind,
        emitted=tuple(draft[:accepted]) + (token,) if emitted is None else tuple(emitted),
        top=top if top is not None else ((token, 0.9), (99, 0.05)), draft_time=0.01, verify_time=0.05,
        elapsed=0.1 * (n + 1) if elapsed is None else elapsed, greedy=greedy,
    )
    fields.update(kw)
    return StepEvent(**fields)


def spec_trace(*steps_and_labels, k=4) -> Trace:
    t = Trace("prompt lookup", k=k)
    for e, lab in steps_and_labels:
        t.add(e, lab)
    return t


def kinds(markup: str) -> list[str]:
    return re.findall(r'data-kind="(\w+)"', markup)


def texts(markup: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r"<span class=\"tok[^>]*>(.*?)</span>", markup, re.S)]


# ---- the token text -------------------------------------------------------------------

def test_every_kind_in_reading_order():
    t = spec_trace(
        (step(0, [1, 2, 3], 2, 7), Labels(draft=("a", "b", "c"), token="C", top=("C", "z"))),
        (step(1, [4, 5], 2, 8), Labels(draft=("d", "e"), token="+", top=("+", "z"))),
    )
    out = tokens_html(t)
    assert kinds(out) == ["accepted", "accepted", "rejected", "corrected", "accepted", "accepted", "bonus"]
    assert texts(out) == ["a", "b", "c", "C", "d", "e", "+"]
    base = Trace("baseline", speculative=False)
    base.add(TokenEvent(step=0, token=1, p=0.4, time=0.05, elapsed=0.1), Labels(token="a"))
    assert kinds(tokens_html(base)) == ["baseline"]


def test_model_text_is_escaped_in_text_and_in_hover_card():
    evil = '<img src=x onerror="alert(1)">&amp;'
    t = spec_trace((step(0, [1], 0, 2), Labels(draft=(evil,), token="</div><script>x()</script>", top=(evil, "z"))))
    out = tokens_html(t)
    assert "<img" not in out and "<script" not in out and "</div><script" not in out
    assert html.escape(evil, quote=False) in out
    assert texts(out) == [evil, "</div><script>x()</script>"]
    assert "<img" not in step_html(t, 0) and "<script" not in panel_html(t, "x</b><i>")


def test_a_token_is_named_for_a_screen_reader_by_its_verdict_text_and_numbers_escaped():
    """A screen reader heard "Paris", never "accepted, p 0.91"; the name comes from the same event
    as the hover card, and model text in it stays text."""
    e = step(2, [1, 2, 3], 1, 7, q=(0.8, 0.5, 0.2), p=(0.91, 0.02, 0.3), greedy=False, token_p=0.6)
    out = tokens_html(spec_trace((e, Labels(draft=(" <b>Paris</b>", "", "  "), token="\n"))))
    names = [html.unescape(n) for n in re.findall(r'<span class="tok[^>]* aria-label="([^"]*)"', out)]
    assert names[0] == ("accepted draft token ' <b>Paris</b>', target p 0.91, drafter q 0.80, "
                        "acceptance probability 1.00, draw u 0.25, step 3")
    assert names[1].startswith("rejected draft token with no text of its own")
    assert names[2].startswith("unchecked draft token (2 spaces)") and "after the first rejection" in names[2]
    assert names[3] == "target's corrected token (line break), target p 0.60, step 3"
    assert "<b>" not in out and "&lt;b&gt;Paris" in out  # never markup, in the text or in the name
    # the run is one listbox and one Tab stop (its first kept token); the arrow keys reach every other
    # token but the empty one (the first bytes of a character)
    assert re.search(r'<div class="sv-text" role="listbox"[^>]* aria-label="[^"]* text, token by token"', out)
    spans = re.findall(r"<span class=\"tok[^>]*>", out)
    assert ['role="option"' in s for s in spans] == [True] * 4
    assert ['tabindex="0"' in s for s in spans] == [True, False, False, False]
    assert ['tabindex="-1"' in s for s in spans] == [False, False, True, True]
    base = Trace("baseline", speculative=False)
    base.add(TokenEvent(step=4, token=1, p=0.4, time=0.05, elapsed=0.1), Labels(token="Paris"))
    assert "aria-label=\"baseline token &#x27;Paris&#x27;, target p 0.40, token 5\"" in tokens_html(base)


def test_every_headline_number_is_explained_in_words_a_keyboard_and_a_screen_reader_reach():
    """alpha, tau, passes saved, "verify 1.40x" and "n/a" were explained only in hover titles."""
    from specviz.engine.verify_cost import VerifyCurve

    spec, base = _measured_pair()
    out = headline_html(headline(spec, base, VerifyCurve((1, 2, 4, 8), (0.1, 0.11, 0.13, 0.17), 1)))
    described = re.findall(r'data-metric="([\w-]+)"[^>]*aria-describedby="([\w-]+)"', out)
    assert [key for key, _ in described] == ["speedup", "predicted", "alpha", "tau", "calls", "spec-tps", "base-tps"]
    details = out[out.index("<details"):]  # one disclosure: a tap, a click or Enter opens it
    for _, why in described:
        assert re.search(f'<dd id="{why}">[^<]{{10,}}</dd>', details), why
    words = html.unescape(details)
    assert "“verify 1.40×” on the card is that v" in words and "share of drafted tokens the target accepted" in words
    assert "forward passes of the target that speculation avoided" in words


def test_whitespace_and_code_layout_survive_but_rejected_newlines_do_not_move_text():
    t = spec_trace((step(0, [1, 2, 3], 2, 4), Labels(draft=("def f():\n", "    return 1", "\n\t"), token="\n")))
    out = tokens_html(t)
    assert texts(out) == ["def f():\n", "    return 1", "↵⇥", "\n"]
    assert 'class="sv-text"' in out  # the stylesheet gives .sv-text white-space: pre-wrap


def test_hover_card_has_step_p_q_acceptance_and_draw():
    sampled = step(3, [1, 2], 1, 5, greedy=False, q=(0.8, 0.4), p=(0.6, 0.1), accept_prob=(0.75, 0.25),
                   draws=(0.5, 0.9))
    t = spec_trace((sampled, Labels(draft=("x", "y"), token="z", top=("z",))))
    tips = [html.unescape(m) for m in re.findall(r'data-tip="([^"]*)"', tokens_html(t))]
    assert "step 4" in tips[0] and "p (target) = 0.600" in tips[0] and "q (drafter) = 0.800" in tips[0]
    assert "min(1, p/q) = 0.750" in tips[0] and "draw u = 0.500" in tips[0]
    assert "rejected" in tips[1] and "draw u = 0.900" in tips[1]
    assert "corrected" in tips[2]
    lookup = spec_trace((step(0, [1], 1, 2), Labels(draft=("x",), token="y")))
    assert "q (drafter) = none: this drafter proposes tokens without probabilities" in html.unescape(
        tokens_html(lookup))  # greedy: no q, no pretend 1
    lookup = spec_trace((step(0, [1], 1, 2, greedy=False), Labels(draft=("x",), token="y")))
    assert "q (drafter) = 1 (one-hot" in html.unescape(tokens_html(lookup))  # sampling verifies against one-hot


def test_tokens_cut_at_eos_are_not_shown():
    # Three drafts accepted, but the second is EOS: the output stops there.
    e = step(0, [1, 2, 3], 3, 9, emitted=(1, 2))
    t = spec_trace((e, Labels(draft=("a", "<|im_end|>", "c"), token="d")))
    assert kinds(tokens_html(t)) == ["accepted", "accepted"]
    assert t.text() == "a<|im_end|>"  # nothing says 2 ends a run yet


@pytest.mark.parametrize("told", ["eos ids", "run end"])
def test_the_end_of_turn_token_is_a_mark_after_the_text_not_text(told):
    """The runner names the target's EOS ids; a replay knows only that the run ended at EOS."""
    e = step(0, [1, 2, 3], 3, 9, emitted=(1, 2))
    t = spec_trace((e, Labels(draft=("a", "<|im_end|>", "c"), token="d")))
    if told == "eos ids":
        t.eos = (2,)
    else:
        _ended(t, tokens=2, steps=1, stop_reason="eos")
    out = tokens_html(t)
    assert t.text() == "a" and "im_end" not in out and kinds(out) == ["accepted"]
    assert "end of answer" in out  # where the model stopped, said once, outside the text
    base = Trace("baseline", speculative=False, eos=(2,))
    for i, token in enumerate((1, 2)):
        base.add(TokenEvent(step=i, token=token, p=0.4, time=0.05, elapsed=0.1), Labels(token=("a", "<|im_end|>")[i]))
    assert base.text() == "a" and kinds(tokens_html(base)) == ["baseline"] and "end of answer" in tokens_html(base)


def test_the_inspector_shows_no_bonus_token_after_an_end_of_turn_token_that_ended_the_run():
    e = step(0, [1, 2, 3], 3, 9, emitted=(1, 2))
    t = spec_trace((e, Labels(draft=("a", "<|im_end|>", "c"), token="d", top=("d", "z"))))
    t.eos = (2,)
    out = step_html(t, 0)
    assert "bonus token:" not in out and "no bonus token was output" in out
    assert "ended with the end-of-turn token" in out
    assert out.count("after the end (not output)") == 1  # draft 3, accepted but past the end
    cut = spec_trace((step(0, [1, 2, 3], 3, 9, emitted=(1, 2)), Labels(draft=("a", "b", "c"), token="d")))
    assert "ended at its token limit" in step_html(cut, 0)


def test_whitespace_drafts_are_visible_marks_in_the_panel_the_inspector_and_the_tree():
    tree = TreeDraft(tokens=(5, 6), parents=(-1, -1), path=(0,), p=(0.6, 0.3))
    e = step(0, [5, 6], 1, 7, tree=tree)
    t = spec_trace((e, Labels(draft=(" ", "  "), token="\t", tree=(" ", "  "))))
    panel = tokens_html(t)
    assert "␣␣" in panel  # the rejected two-space draft
    inspector = step_html(t, 0)
    assert inspector.count('<code class="sv-inspect-tok">␣</code>') >= 2  # the table and the tree
    assert '<code class="sv-inspect-tok">␣␣</code>' in inspector and "∅" not in inspector


def test_a_words_tokens_stay_together_and_lines_break_only_at_spaces():
    t = spec_trace((step(0, [1, 2, 3, 4], 4, 5), Labels(draft=(" Java", "Script", " l'enf", "ant"), token=".")))
    out = tokens_html(t)
    groups = [texts(g) for g in re.findall(r'<span class="sv-word">(.*?</span>)</span>', out, re.S)]
    assert groups == [[" Java", "Script"], [" l'enf", "ant", "."]]
    long = spec_trace((step(0, [1] * 4, 4, 2), Labels(draft=("=" * 15,) * 4, token="=")))
    assert "sv-word" not in tokens_html(long)  # 61 characters of ====: may still break


def test_a_token_holding_a_line_break_flows_inline_and_the_rest_are_whole_boxes():
    t = spec_trace((step(0, [1, 2], 2, 3), Labels(draft=("x", ":\n    "), token=" y")))
    out = tokens_html(t)
    assert re.findall(r'class="(tok [^"]*)"', out) == ["tok tok-accepted", "tok tok-accepted tok-nl", "tok tok-bonus"]


def test_step_without_draft_is_the_targets_own_token():
    t = spec_trace((step(0, [], 0, 4), Labels(token="w")))
    out = tokens_html(t)
    assert kinds(out) == ["bonus"] and "undrafted" in out and "nothing was drafted" in out


@pytest.mark.parametrize("phase, want", [
    ("draft", ["drafted", "drafted", "drafted"]),  # pending: proposed, not yet judged
    ("verify", ["checking", "checking", "checking"]),  # the target's one forward pass over them
    ("accept/reject", ["accepted", "rejected", "rejected"]),  # verdicts, no target token yet
    ("correction", ["accepted", "rejected", "rejected", "corrected"]),  # the target's own token
])
def test_a_step_played_in_phases_draws_after_the_text_so_far(phase, want):
    before = (step(0, [1, 2], 2, 7), Labels(draft=("a", "b"), token="C", top=("C", "z")))
    e, lab = step(1, [3, 4, 5], 1, 8), Labels(draft=("d", "<e>", "\n"), token="+", top=("+", "z"))
    out = tokens_html(spec_trace(before), playing=(e, lab, phase))
    assert kinds(out) == ["accepted", "accepted", "bonus", *want]
    assert texts(out)[3:] == ["d", "<e>", "↵", "+"][: len(want)]  # drafted whitespace shown, text escaped
    assert "<e>" not in out and "&lt;e&gt;" in out
    if phase in ("draft", "verify"):
        assert f'class="tok tok-{want[0]}"' in out and 'data-step="1"' in out


def test_a_bonus_phase_and_an_undrafted_step_play_too():
    e, lab = step(0, [1, 2], 2, 9), Labels(draft=("a", "b"), token="+", top=("+", "z"))
    assert kinds(tokens_html(Trace("x"), playing=(e, lab, "accept/reject"))) == ["accepted", "accepted"]
    assert kinds(tokens_html(Trace("x"), playing=(e, lab, "bonus"))) == ["accepted", "accepted", "bonus"]
    e, lab = step(0, [], 0, 9), Labels(token="+", top=("+", "z"))
    assert 'class="sv-text sv-empty"' in tokens_html(Trace("x"), playing=(e, lab, "draft"))  # nothing drafted


def test_empty_run_renders_placeholders_not_errors():
    spec, base = Trace("prompt lookup"), Trace("baseline", speculative=False)
    assert kinds(tokens_html(spec)) == [] and "No tokens yet" in tokens_html(spec)
    assert len(playground_figures(spec, base)) == 4
    for fig in playground_figures(spec, base):  # plotly's own empty range ran from -1
        assert tuple(fig.layout.yaxis.range) == (0, 1)
    assert step_html(spec, 0).startswith('<div class="sv-inspect sv-empty">')
    assert agreement(spec, base) == (None, None)
    h = headline(spec, base)
    assert h.speedup is None and h.predicted is None and "—" in headline_html(h)
    assert "Pick drafters" in side_by_side_html(base, [])
    failed = Trace("x", error="could not load <model>")
    assert "could not load &lt;model&gt;" in tokens_html(failed)


# ---- numbers --------------------------------------------------------------------------

def _ended(trace: Trace, **stats) -> Trace:
    fields = dict(tokens=0, steps=0, target_calls=0, drafted=0, accepted=0, prefill_time=0.1, draft_time=0.0,
                  verify_time=0.0, elapsed=1.0, stop_reason="max_new_tokens")
    fields.update(stats)
    trace.add(RunEnd(tuple(trace.token_ids), RunStats(**fields)))
    return trace


def _measured_pair() -> tuple[Trace, Trace]:
    """A finished speculative run (16 tokens in 4 steps, 12 of 16 drafts kept) and its baseline."""
    spec = _ended(spec_trace((step(0, [1, 2, 3, 4], 3, 5), Labels(draft=tuple("abcd"), token="e"))),
                  tokens=16, steps=4, target_calls=5, drafted=16, accepted=12, draft_time=0.08, verify_time=0.4,
                  elapsed=0.5)
    base = _ended(Trace("baseline", speculative=False), tokens=16, steps=16, target_calls=17, verify_time=1.6,
                  elapsed=1.0, prefill_time=0.0)  # no prompt to read: the decode formula alone
    return spec, base


def test_headline_uses_the_engines_numbers():
    spec, base = _measured_pair()
    h = headline(spec, base)
    assert h.speedup == pytest.approx(32 / 16) and h.timing == "measured"
    assert h.alpha == pytest.approx(0.75) and h.tau == pytest.approx(4.0) and h.k == pytest.approx(4.0)
    assert h.c == pytest.approx((0.08 / 4 / 4) / (1.6 / 16))  # per draft token / per target token
    assert h.predicted == pytest.approx(predicted_speedup(0.75, 4.0, h.c))
    assert h.calls_saved == 12 and h.base_calls == 16  # plain decoding: one pass per token


def test_predicted_speedup_charges_the_verify_cost_this_machine_measured():
    """The page predicted 1.61x beside a measured 1.06x, assuming a 5-token verify costs one
    step; with the measured curve, v = T(k+1)/T(1) enters the denominator."""
    from specviz.engine.verify_cost import VerifyCurve

    spec, base = _measured_pair()
    curve = VerifyCurve(sizes=(1, 2, 4, 8), seconds=(0.1, 0.11, 0.13, 0.17), weight_bytes=1)  # v(5) = 1.4
    h = headline(spec, base, curve)
    assert h.v == pytest.approx(1.4) and h.verified == pytest.approx(5.0)
    # E = (1 - 0.75^5) / 0.25 = 3.05078125 tokens a step; c = 0.05, so a step costs 4 * 0.05 + 1.4 steps
    assert h.predicted == pytest.approx(3.05078125 / 1.6)
    assert "v = 1.40" in headline_html(h) and "measured verify-cost curve" in headline_html(h)
    assert "predicted speedup (verify 1.40×)" in headline_html(h)  # on the card, not only in its hint
    assumed = headline(spec, base)
    assert assumed.v is None and assumed.predicted == pytest.approx(3.05078125 / 1.2)
    assert "v = 1 (assumed" in headline_html(assumed)


def test_headline_says_measuring_early_and_never_saves_negative_calls():
    """Seen in the app: '3.41x measured speedup' at alpha 0 after one step, '-1 target calls saved'."""
    spec = spec_trace((step(0, [1, 2], 0, 5), Labels(draft=("a", "b"), token="e")),
                      (step(1, [1, 2], 0, 6, elapsed=0.3), Labels(draft=("a", "b"), token="f")))
    base = Trace("baseline", speculative=False)
    base.add(TokenEvent(step=0, token=5, p=0.5, time=0.3, elapsed=0.4), Labels(token="e"))
    h = headline(spec, base)
    assert h.speedup is None and h.predicted is None and h.timing == "measuring"
    assert h.calls_saved == 0 and h.alpha == 0.0
    values = dict(re.findall(r'data-metric="([\w-]+)"[^>]*><div class="sv-card-value[^"]*">([^<]*)<', headline_html(h)))
    assert values["speedup"] == values["predicted"] == "measuring…" and values["calls"] == "0 of 2"
    short = _ended(spec, tokens=2, steps=2, target_calls=3, drafted=4, elapsed=0.3)
    assert headline(short, _ended(base, tokens=1, steps=1, target_calls=2, elapsed=0.4)).timing == "too short"


def test_tree_runs_count_alpha_along_the_branch_and_are_predicted_step_by_step():
    """A tree step's chain view is the branch the target followed plus the first refused node;
    the engine's count is every node (here 9), which would put alpha at 2/9. One k cannot describe
    a tree, so the prediction is tokens per step over cost per step, from the steps themselves."""
    from specviz.engine.verify_cost import VerifyCurve

    tree = TreeDraft(tokens=tuple(range(1, 10)), parents=(-1, -1, -1, 0, 0, 1, 3, 3, 6), path=(0, 3), p=(0.5,) * 9)
    e = step(0, [1, 4, 7], 2, 8, tree=tree)
    labels = Labels(draft=("a", "d", "g"), token="h", tree=tuple("abcdefghi"))
    spec = _ended(spec_trace(*[(e, labels)] * 6), tokens=18, steps=6, target_calls=7, drafted=54, accepted=12,
                  draft_time=0.06, verify_time=0.6, elapsed=0.7)
    base = _ended(Trace("baseline", speculative=False), tokens=18, steps=18, target_calls=19, verify_time=1.8,
                  elapsed=1.9, prefill_time=0.0)
    h = headline(spec, base)
    assert h.alpha == pytest.approx(2 / 3) and h.trees and h.varied
    # tau = 3 tokens a step; drafting 0.01 s a step = 0.1 of a 0.1 s target step; verifying assumed 1 step.
    assert h.predicted == pytest.approx(3 / (0.1 + 1.0))
    assert "n/a" not in headline_html(h) and "step by step" in html.unescape(headline_html(h))
    # A tree is verified whole: its 9 nodes and the pending token ride in one pass of 10.
    curved = headline(spec, base, VerifyCurve((1, 2, 4, 8, 16), (1, 1, 1, 1, 2), 1))
    assert curved.verified == 10 and curved.v == pytest.approx(1.25)
    assert curved.predicted == pytest.approx(3 / (0.1 + 1.25))


def test_dynamic_k_is_predicted_from_each_steps_own_length():
    """Steps of 1 and 7 drafts: the mean k of 4 with the mean alpha would mispredict; each step's
    own verify cost and kept drafts do not."""
    from specviz.engine.verify_cost import VerifyCurve

    short, long = step(0, [1], 1, 2), step(1, [1, 2, 3, 4, 5, 6, 7], 7, 9)
    spec = _ended(spec_trace((short, Labels(draft=("a",), token="b")), (long, Labels(draft=tuple("abcdefg"), token="i"))),
                  tokens=10, steps=2, target_calls=3, drafted=8, accepted=8, draft_time=0.08, verify_time=0.2,
                  elapsed=0.3)
    spec.end = replace(spec.end, stats=replace(spec.end.stats, tokens=16))  # past MIN_TOKENS
    base = _ended(Trace("baseline", speculative=False), tokens=16, steps=16, target_calls=17, verify_time=1.6,
                  elapsed=1.7, prefill_time=0.0)
    curve = VerifyCurve((1, 2, 8), (1.0, 1.2, 1.6), 1)
    h = headline(spec, base, curve)
    assert h.varied and not h.trees
    # (1 + mean kept 4) / (drafting 0.04 s = 0.4 steps + mean of v(2) = 1.2 and v(8) = 1.6)
    assert h.predicted == pytest.approx(5 / (0.4 + 1.4))


def test_chart_titles_and_placeholders_fit_a_phones_chart():
    """Plotly never wraps: "Cost of one target pass, relative to one token" and "Generate a run: this
    machine's verify cost is measured once per model" were cut off at 390 px."""
    from specviz.render import distribution
    from specviz.render.charts import PLACEHOLDER_CHARS, empty_figures
    from specviz.render.hardware import curve_figure, retime_figure
    from specviz.serving.figures import serving_figures

    figures = [*empty_figures(), curve_figure(None), retime_figure(None), distribution.figure(None),
               *serving_figures(None, None)]
    for fig in figures:
        for line in re.sub(r"<[^>]+>", "\n", fig.layout.title.text or "").split("\n"):
            assert len(line) <= 36, line  # ~300 px of a phone's chart at 15 px
        for note in fig.layout.annotations:
            assert all(len(line) <= PLACEHOLDER_CHARS for line in note.text.split("<br>")), note.text
    assert len(retime_figure(None).layout.xaxis.title.text) <= 20  # beside the run names: ~170 px


def test_greedy_check_and_sampling_explanation():
    def run(ids, spec=True):
        t = Trace("r", speculative=spec)
        for i, tok in enumerate(ids):
            t.add(TokenEvent(step=i, token=tok, p=0.5, time=0.01, elapsed=0.01 * (i + 1)), Labels(token="t"))
        return t

    assert agreement(run([1, 2, 3]), run([1, 2, 3, 4])) == (True, None)  # identical so far
    # Stopped at different lengths: compared on the tokens both produced, and said so.
    stopped = [_ended(run(ids), tokens=len(ids), steps=len(ids), stop_reason="cancelled") for ids in ([1, 2, 3], [1, 2])]
    assert agreement(*stopped) == (True, None)
    check = agreement_html(*stopped, greedy=True)
    assert 'data-identical="true"' in check and "2 tokens both runs produced" in check and "at 3" in check
    assert agreement(run([1, 2, 3]), run([1, 5, 3])) == (False, 1)
    assert 'data-identical="true"' in agreement_html(run([1, 2]), run([1, 2]), greedy=True)
    assert 'data-identical="false"' in agreement_html(run([1, 2]), run([1, 3]), greedy=True)
    assert "distribution" in agreement_html(run([1]), run([2]), greedy=False)


# ---- inspector, charts, compare ---------------------------------------------------------

def test_inspector_shows_q_p_ratio_draw_verdict_and_top():
    e = step(0, [1, 2, 3], 1, 7, greedy=False, q=(0.5, 0.5, 0.5), p=(0.6, 0.2, 0.4),
             accept_prob=(1.0, 0.4, 0.8), draws=(0.1, 0.7, 0.2), top=((7, 0.3), (2, 0.2)))
    out = step_html(spec_trace((e, Labels(draft=("a", "b", "c"), token="g", top=("g", "b")))), 0)
    assert kinds(out) == ["accepted", "rejected", "rejected"] and "tok-corrected" in out
    for value in ("0.600", "0.400", "0.700", "accepted", "not checked", "first rejection", "0.300"):
        assert value in out
    assert 'class="sv-chosen"' in out  # the target's own token is marked in its top list


def test_greedy_inspector_shows_the_drafters_q_and_the_argmax_rule_not_min_p_q():
    """Greedy keeps a draft iff it is the target's top token: min(1, p/q) was a 0/1 column
    beside q = 1, hiding the drafter's real q."""
    e = step(0, [1, 2], 1, 7, q=(0.21, 0.34), p=(0.6, 0.2), top=((7, 0.5), (2, 0.2)),
             p_top=(((1, 0.6),), ((7, 0.5),), ((3, 0.4),)))
    out = step_html(spec_trace((e, Labels(draft=("a", "b"), token="g", top=("g", "b"), p_top=(("a",), ("g",), ("c",))))), 0)
    assert "min(1, p/q)" not in out and "draw u" not in out
    assert "0.210" in out and "0.340" in out  # the drafter's own q
    assert "target's top token" in out
    assert out.count("= draft") == 1 and out.count("≠ draft") == 1  # a kept, b refused: the target wanted g
    lookup = step_html(spec_trace((step(0, [1], 0, 7), Labels(draft=("a",), token="g"))), 0)
    assert "no probabilities" in lookup and "<td>1</td><td>0.500</td>" not in lookup  # no pretend q = 1


def test_inspector_says_who_drafted_a_step_when_the_drafter_mixes_sources():
    mixed = step_html(spec_trace((step(0, [1, 2], 2, 7, source="prompt lookup, 3-gram <match>"),
                                  Labels(draft=("a", "b"), token="g"))), 0)
    assert "2 drafted by prompt lookup, 3-gram &lt;match&gt;, 2 accepted" in mixed
    plain = step_html(spec_trace((step(0, [1, 2], 2, 7), Labels(draft=("a", "b"), token="g"))), 0)
    assert "2 drafted, 2 accepted" in plain and " by " not in plain


def walked_step(greedy=False, walk=True):
    """docs/exactness.md's worked step: at the root p gives "the" 0.5, "a" 0.3, "an" 0.1 and the rest
    0.1; the children "the", "a", "an" are tried with coins 0.62, 0.71, 0.35: "the" refused at p′ 0.5
    (mass left 0.5), "a" refused at p′ 0.3 / 0.5 = 0.6 (mass left 0.2), "an" kept at p′ 0.1 / 0.2 = 0.5.
    "an" has a child "<b>" the walk tries at p′ 0.4 and refuses, so the target's token is drawn
    from p after "an" without it. (greedy / walk=False: the same tree without a walk, as greedy
    steps and older traces record it.)"""
    sampled = not greedy and walk
    tree = TreeDraft(tokens=(1, 2, 3, 4), parents=(-1, -1, -1, 2), path=(2,), p=(0.5, 0.3, 0.1, 0.4),
                     **(dict(walk=(0, 1, 2, 3), accept_prob=(0.5, 0.6, 0.5, 0.4), draws=(0.62, 0.71, 0.35, 0.9),
                             residual_mass=(0.5, 0.2, 0.1, 0.6)) if sampled else {}))
    e = step(0, [3, 4], 1, 8, greedy=greedy, p=(0.1, 0.4), accept_prob=(0.5, 0.4) if not greedy else (1.0, 0.0),
             tree=tree, top=((4, 0.4), (8, 0.3)), p_top=(((1, 0.5), (2, 0.3), (3, 0.1), (9, 0.05)),
                                                         ((4, 0.4), (8, 0.3), (9, 0.2)), ((9, 0.9),)),
             **({} if greedy else dict(draws=(0.35, 0.9))))
    labels = Labels(draft=("an", "<b>"), token="x", top=("<b>", "x"), tree=("the", "a", "an", "<b>"),
                    p_top=(("the", "a", "an", "rest"), ("<b>", "x", "rest"), ("rest",)))
    return e, labels


def test_inspector_shows_a_sampled_tree_step_as_its_sibling_walk_not_min_p_q():
    """Issue 46 (3): a tree's children are one-hot guesses judged by u < p′(x), so the table is the
    walk itself: every child tried, in order, with p′(x) when its turn came (renormalised after
    each refusal), u, the verdict and the mass a refusal left."""
    e, labels = walked_step()
    out = step_html(spec_trace((e, labels)), 0)
    assert "min(1, p/q)" not in out and "&lt;b&gt;" in out and "<b>" not in out
    walk = out[out.index('class="sv-table sv-drafts sv-walk"'):out.index("</table>")]
    rows = re.findall(r'<tr data-kind="(\w+)" data-node="(\d)">(.*?)</tr>', walk)
    assert [(kind, int(node)) for kind, node, _ in rows] == [("rejected", 0), ("rejected", 1), ("accepted", 2),
                                                             ("rejected", 3)]
    cells = [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)]
             for *_, r in rows]
    assert cells == [  # children of, tried, child, p, p′(x) when tried, u, verdict, mass left if refused
        ["the text so far", "1st", "the", "0.500", "0.500", "0.620", "refused: u ≥ p′(x)", "0.500"],
        ["the text so far", "2nd", "a", "0.300", "0.600 = 0.300 / 0.500", "0.710", "refused: u ≥ p′(x)", "0.200"],
        ["the text so far", "3rd", "an", "0.100", "0.500 = 0.100 / 0.200", "0.350", "kept: u < p′(x)", "—"],
        ["an", "1st", "<b>", "0.400", "0.400", "0.900", "refused: u ≥ p′(x)", "0.600"]]
    words = html.unescape(out)
    assert "the next child's p′ is p without the refused children, divided by the mass of p they leave" in words
    assert "every child of “an” was refused: the target's token is drawn from the final p′" in words.lower()
    assert words.count("tried 2nd: p′ 0.60, u 0.71, refused") == 1  # the tree drawing marks each turn
    tip = html.unescape(tokens_html(spec_trace((e, labels))))
    assert "p′(x) when tried = 0.500" in tip and "min(1, p/q)" not in tip  # the hover card says the same rule
    assert "drawn from the final p′" in tip and "norm(max" not in tip  # the corrected token: no p − q residual
    twice = TreeDraft(tokens=(1, 1), parents=(-1, -1), path=(), p=(0.5, 0.5), walk=(0, 1), accept_prob=(0.5, 0.0),
                      draws=(0.7, 0.1), residual_mass=(0.5, 0.5))  # a repeated sibling: its mass was taken
    out = step_html(spec_trace((step(0, [1], 0, 7, greedy=False, tree=twice), Labels(draft=("a",)))), 0)
    assert "0 (its token was refused already)" in out and out.count("refused: u ≥ p′(x)") == 2


def test_greedy_trees_and_chains_keep_their_tables_and_an_old_sampled_tree_says_p_prime():
    greedy = step_html(spec_trace(walked_step(greedy=True)), 0)
    assert "sv-walk" not in greedy and "p′" not in greedy and "target's top token" in greedy
    assert greedy.count('class="sv-tree-won"') == 1 and greedy.count('class="sv-tree-missed"') == 1
    old = step_html(spec_trace(walked_step(walk=False)), 0)  # a trace from before walks were recorded
    assert "sv-walk" not in old and "min(1, p/q)" not in old and "<th>p′(x) when tried</th><th>draw u</th>" in old
    chain = step_html(spec_trace((step(0, [1, 2], 1, 7, greedy=False, q=(0.5, 0.5)), Labels(draft=("a", "b")))), 0)
    assert "<th>min(1, p/q)</th><th>draw u</th>" in chain and "p′" not in chain and "sv-walk" not in chain


def test_acceptance_by_position_counts_only_reached_positions():
    t = spec_trace(
        (step(0, [1, 2, 3], 1, 9), Labels(draft=("a", "b", "c"), token="x")),  # pos1 ok, pos2 rejected, pos3 unreached
        (step(1, [1, 2], 2, 9), Labels(draft=("a", "b"), token="x")),
    )
    assert position_rates(t) == [(2, 2), (2, 1)]
    acceptance = playground_figures(t, Trace("baseline", speculative=False))[0]
    assert list(acceptance.data[0].y) == [pytest.approx(1 / 3), 1.0]
    assert list(acceptance.data[1].y) == [pytest.approx(1 / 3), pytest.approx(3 / 5)]


def test_a_run_with_one_speed_point_still_shows_it():
    one = Trace("baseline", speculative=False)
    one.add(TokenEvent(step=0, token=5, p=0.5, time=0.07, elapsed=0.07))
    t = spec_trace((step(0, [1, 2], 2, 9), Labels()), (step(1, [1, 2], 1, 9), Labels()))
    speed = playground_figures(t, one)[1]
    assert [(d.name, d.mode) for d in speed.data] == [("speculative", "lines"), ("baseline", "lines+markers")]


def test_compare_rows_put_the_baseline_first_and_measure_speedup_against_it():
    base = _ended(Trace("baseline", speculative=False), tokens=16, steps=16, target_calls=17, elapsed=2.0,
                  verify_time=1.8)
    lookup = _ended(spec_trace((step(0, [1], 1, 2), Labels(draft=("a",), token="b"))), tokens=16, steps=4,
                    target_calls=5, drafted=8, accepted=6, elapsed=1.0)
    rows = compare_rows(base, [lookup])
    assert [r["run"] for r in rows] == ["baseline", "prompt lookup"]
    assert rows[1]["speedup"] == pytest.approx(2.0) and rows[1]["alpha"] == pytest.approx(0.75)
    speed, quality = compare_figures(rows)
    assert list(speed.data[0].x) == [8.0, 16.0] and list(speed.data[0].y) == ["baseline", "prompt lookup"]
    assert side_by_side_html(base, [lookup]).count('class="sv-panel"') == 2


def test_every_compared_run_has_its_own_colour_with_ten_drafters():
    """The throughput chart took SERIES[i % 7] by row, the baseline's row counted: with ten drafters
    prompt lookup (row 1) and layer skip (row 8) were both orange."""
    names = ["baseline", "prompt lookup", "draft model", "eagle", "medusa", "suffix", "hybrid", "tiny draft",
             "layer skip", "none", "distilled"]
    rows = [dict(run=n, tokens_per_s=10.0, speedup=1.0, alpha=0.5, tau=1.5, target_calls=8) for n in names]
    speed, quality = compare_figures(rows)
    for bars in (speed.data[0], *quality.data):
        looks = list(zip(bars.marker.color, bars.marker.pattern.shape))
        assert len(set(looks)) == len(names) and looks[0][0] == "#7A7A7A"  # the baseline grey, every run apart
    assert speed.data[0].marker.color[1] != speed.data[0].marker.color[8]


def test_compare_and_the_playground_count_target_passes_by_one_rule():
    """Compare said 49 target calls for 48 baseline tokens (the prefill counted) while the
    playground said 96 for 96: both now count the passes while generating, one per step."""
    base = _ended(Trace("baseline", speculative=False), tokens=48, steps=48, target_calls=49, elapsed=2.0)
    spec = _ended(spec_trace((step(0, [1], 1, 2), Labels(draft=("a",), token="b"))), tokens=48, steps=20,
                  target_calls=21, drafted=40, accepted=28, elapsed=1.0)
    rows = compare_rows(base, [spec])
    assert [r["target_calls"] for r in rows] == [48, 20]
    h = headline(spec, base)
    assert (h.base_calls, h.base_calls - h.calls_saved) == (48, 20)  # the same 48 and 20 in the playground
    values = dict(re.findall(r'data-metric="([\w-]+)"[^>]*><div class="sv-card-value">([^<]*)<', headline_html(h)))
    assert values["calls"] == "28 of 48" and "target passes saved" in headline_html(h)


def test_a_prediction_far_from_the_measurement_says_why_in_a_visible_line():
    """The steps took 0.1 s of verify each where the curve prices a pass at 1.25 target steps of 0.05 s:
    the 37.5 ms a step the prediction does not count is said beside the cards, not in a tooltip."""
    from specviz.engine.verify_cost import VerifyCurve

    short, long = step(0, [1], 1, 2), step(1, [1, 2, 3, 4, 5, 6, 7], 7, 9)
    spec = _ended(spec_trace((short, Labels(draft=("a",), token="b")), (long, Labels(draft=tuple("abcdefg"), token="i"))),
                  tokens=16, steps=2, target_calls=3, drafted=8, accepted=8, draft_time=0.0, verify_time=0.2,
                  elapsed=0.3)
    base = _ended(Trace("baseline", speculative=False), tokens=16, steps=16, target_calls=17, verify_time=0.8,
                  elapsed=0.9, prefill_time=0.0)
    h = headline(spec, base, VerifyCurve((1, 2, 8), (1.0, 1.0, 1.5), 1))
    assert h.unmodelled == pytest.approx(0.1 - 1.25 * 0.05)
    line = html.unescape(headline_html(h))
    assert 'class="sv-prediction-gap"' in line and "37.5 ms" in line and f"measured {h.speedup:.2f}" in line
    assert gap_html(replace(h, predicted=h.speedup * 1.05)) == ""  # close enough: nothing to explain


def _gap_curve():
    from specviz.engine.verify_cost import VerifyCurve
    return VerifyCurve((1, 2, 8), (1.0, 1.0, 1.5), 1)


GAP_CURVE = _gap_curve()


def _gap_pair(spec_prefill: float, step_verify: float, base_times=(0.05,) * 32) -> tuple[Trace, Trace]:
    """32 tokens each way; the speculative run's 8 steps keep 24 of 32 drafts, each drafting 10 ms;
    the baseline reads the prompt in 1 s (20 of its 50 ms steps) and takes `base_times` a token.
    Read with GAP_CURVE, a verify pass of 5 tokens is priced at 1.25 steps (62.5 ms)."""
    spec = _ended(spec_trace((step(0, [1, 2, 3, 4], 3, 5), Labels(draft=tuple("abcd"), token="e"))),
                  tokens=32, steps=8, target_calls=9, drafted=32, accepted=24, draft_time=0.08,
                  verify_time=8 * step_verify, prefill_time=spec_prefill,
                  elapsed=spec_prefill + 0.08 + 8 * step_verify)
    base = Trace("baseline", speculative=False)
    for i, t in enumerate(base_times):
        base.add(TokenEvent(step=i, token=1, p=0.5, time=t, elapsed=1.0 + sum(base_times[:i + 1])), Labels(token="a"))
    return spec, _ended(base, tokens=32, steps=32, target_calls=33, verify_time=sum(base_times), prefill_time=1.0,
                        elapsed=1.0 + sum(base_times))


def test_the_gap_line_names_what_made_the_run_faster_than_predicted():
    """Measured beat predicted because the speculative run read the prompt in 0.2 s where the
    baseline took 1 s: the line said its steps "spent 10 ms beyond ..., which the prediction does
    not count", time that would make it slower, and not the faster prompt read."""
    spec, base = _gap_pair(spec_prefill=0.2, step_verify=0.0725)
    h = headline(spec, base, GAP_CURVE)
    assert h.unmodelled == pytest.approx(0.01)  # the case: time left out, and still faster
    assert h.speedup > 1.1 * h.predicted
    line = html.unescape(gap_html(h))
    assert 'data-direction="faster"' in line
    assert "read the prompt 800 ms faster than the baseline" in line
    assert "beyond its drafting" not in line and "does not count" not in line


def test_the_gap_line_names_what_made_the_run_slower_than_predicted():
    spec, base = _gap_pair(spec_prefill=1.0, step_verify=0.15)
    h = headline(spec, base, GAP_CURVE)
    assert h.speedup < h.predicted / 1.1
    line = html.unescape(gap_html(h))
    assert 'data-direction="slower"' in line and "each speculative step spent 87.5 ms beyond" in line
    assert "read the prompt" not in line and "run it again" not in line  # the same prompt read, a steady baseline


def test_the_gap_line_says_when_the_machines_speed_moved_more_than_the_gap():
    """The same prompt's speedup moved 2.04x -> 3.05x between runs: a baseline whose tokens took 50 ms
    in its first half and 80 ms in its second tells the reader the gap may be noise."""
    spec, base = _gap_pair(spec_prefill=1.0, step_verify=0.15, base_times=(0.05,) * 16 + (0.08,) * 16)
    h = headline(spec, base, GAP_CURVE)
    assert h.noise == pytest.approx(0.375)
    line = html.unescape(gap_html(h))
    assert "speed moved by 37% within these runs, more than the gap" in line and "run it again" in line


def test_the_prediction_counts_the_prompt_both_runs_read_as_the_measurement_does():
    """Measured speedups are over engine time, prefill included; a long prompt dilutes them. A 1.6 s
    prefill is 16 target steps: (16 + 16 tokens) / (16 + 16 / decode speedup)."""
    spec, base = _measured_pair()
    decode = headline(spec, base).predicted
    base.end = replace(base.end, stats=replace(base.end.stats, prefill_time=1.6))
    h = headline(spec, base)
    assert h.prefill == pytest.approx(16) and h.predicted == pytest.approx(32 / (16 + 16 / decode))
    assert "both runs first read the prompt (16.0 target steps)" in html.unescape(headline_html(h))


def test_one_acceptance_for_a_tree_run_in_the_engine_the_page_compare_and_the_example_note(target, prompts):
    """alpha is accepted / drafted along the branch the target walked everywhere: the engine's
    stats, the page's card, Compare's column and the bench (tests/test_bench.py); the tree's other
    candidates are counted apart, as candidates, which drafting and verifying cost."""
    from specviz import GenerationConfig, speculative_generate
    from specviz.ui.blocks.examples import K, Example, note_html
    from test_heads import make

    drafter = make("medusa", target, tree=3)
    trace = Trace("medusa")
    for ev in speculative_generate(target, drafter, prompts[2], GenerationConfig(max_new_tokens=16, k=4)):
        trace.add(ev)
    steps = [e for e in trace.events if isinstance(e, StepEvent)]
    assert any(e.tree is not None and len(e.tree.tokens) > len(e.draft) for e in steps), "no tree with hidden nodes"
    end = trace.end.stats
    along = sum(e.accepted for e in steps) / sum(len(e.draft) for e in steps)
    assert end.acceptance_rate == pytest.approx(along)
    assert end.candidates == sum(len(e.tree.tokens) if e.tree else len(e.draft) for e in steps) > end.drafted
    base = Trace("baseline", speculative=False)
    assert headline(trace, base).alpha == pytest.approx(along)
    assert compare_rows(base, [trace])[-1]["alpha"] == pytest.approx(along)
    m = {"alpha": along, "tau": end.mean_accepted_length, "speedup": 1.5,
         "candidates_per_step": end.candidates / end.steps}
    note = note_html(Example(id="x", category="code", name="x", prompt="p", drafter="eagle", teaches="t", check={},
                             measured=m))
    assert f"α {along:.2f} (accepted / drafted, along the branch the target followed" in note
    assert f"in a tree of {end.candidates / end.steps:.1f} candidates a step" in note and f"k = {K}" in note


def test_the_first_screens_picture_shows_every_verdict_once_and_explains_it_in_words():
    """Issue 66 (6): two made-up steps in the panels' classes, each token's verdict also said in words
    (colour tells a screen reader nothing), then one line per colour; the words are escaped."""
    from specviz.render import primer, primer_html

    page = primer_html()
    steps, legend = page.split("<figcaption", 1)
    for kind in ("accepted", "rejected", "corrected", "bonus"):
        assert f"tok tok-{kind}" in steps and f"<span class=\"sv-hidden\"> ({kind})</span>" in steps
        assert f'<span class="tok tok-{kind} sv-swatch">{kind}</span> {html.escape(primer.SAID[kind])}' in legend
    assert "target&#x27;s own token" in legend and "tabindex" not in page


def test_counts_read_with_thousands_separators():
    """Issue 66 (4): a long prompt's "400001 tokens"."""
    from specviz.render.status import count

    assert (count(400_001, "token"), count(1, "token"), count(2, "pass", "passes")) == ("400,001 tokens", "1 token",
                                                                                        "2 passes")
