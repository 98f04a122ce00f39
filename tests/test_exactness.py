"""The chi-square test behind the in-app exactness check (specviz.core.exactness)."""
from __future__ import annotations

from collections import Counter

import pytest
from app_server import PROMPT, app_models  # noqa: F401 (app_models is a fixture)

from specviz.core.exactness import OTHER, chi_square, pooled, survival


@pytest.mark.parametrize("stat, dof, want", [(3.841458820694124, 1, 0.05), (0.0, 3, 1.0), (9.21034037197618, 2, 0.01),
                                            (2.0, 2, 0.36787944117144233)])  # dof 2: exp(-x/2)
def test_survival_is_the_chi_square_tail(stat, dof, want):
    assert survival(stat, dof) == pytest.approx(want, rel=1e-6)


def test_a_hand_computed_two_by_two_table():
    # a: 30 x, 10 y; b: 20 x, 20 y. Expected 25/15 in each run: chi2 = 4*(25/25) ... by hand
    stat, dof, p = chi_square(Counter({1: 30, 2: 10}), Counter({1: 20, 2: 20}))
    want = 2 * (5**2 / 25) + 2 * (5**2 / 15)
    assert stat == pytest.approx(want) and dof == 1 and p == pytest.approx(survival(want, 1))


def test_identical_counts_are_not_surprising_and_different_ones_are():
    same = Counter({1: 50, 2: 30, 3: 20})
    assert chi_square(same, same)[2] == pytest.approx(1.0)
    assert chi_square(same, Counter({1: 20, 2: 30, 3: 50}))[2] < 1e-4


def test_rare_tokens_are_pooled_and_one_bin_tests_nothing():
    bins = pooled(Counter({1: 40, 7: 1, 8: 1}), Counter({1: 40, 9: 2}))
    assert bins[0] == (1, 40, 40) and bins[-1] == (OTHER, 2, 2)
    assert chi_square(Counter({5: 10}), Counter({5: 10})) == (0.0, 0, 1.0)


def test_matches_scipy_where_it_is_installed():
    stats = pytest.importorskip("scipy.stats")
    a, b = Counter({1: 33, 2: 21, 3: 26, 4: 20}), Counter({1: 25, 2: 30, 3: 25, 4: 20})
    stat, dof, p = chi_square(a, b)
    want = stats.chi2_contingency([[a[t] for t in (1, 2, 3, 4)], [b[t] for t in (1, 2, 3, 4)]], correction=False)
    assert stat == pytest.approx(want.statistic) and dof == want.dof and p == pytest.approx(want.pvalue)


def test_the_draws_wait_their_turn_in_the_apps_one_line():
    """The draws are model work: they queue behind a playground run, are refused when the
    line is full, and leave the line when done (a hosted app never runs two at once)."""
    from specviz.ui.blocks.exactness import queued
    from specviz.ui.handlers import Session
    from specviz.ui.live.limits import Line

    ran = []

    def run(should_stop):
        ran.append(True)
        yield "drawn", None, "result"

    full = Line(slots=1, waiting=0)
    other = full.join()
    refused = list(queued(full, Session(), run))
    assert len(refused) == 1 and "busy" in refused[0][0] and not ran

    line = Line(slots=1, waiting=2)
    other = line.join()
    updates = queued(line, Session(), run)
    assert "1 run ahead of you" in next(updates)[0] and not ran
    line.leave(other)
    assert next(updates) == ("drawn", None, "result") and ran
    assert list(updates) == [] and len(line) == 0


def test_stop_ends_the_draws_and_judges_those_drawn(app_models, monkeypatch):  # noqa: F811
    """'Is sampling exact?' held the app's one line with no way to end it: its Stop (or the
    page's) now ends the draws after the current one."""
    from specviz.audit import engines
    from specviz.modeling import models
    from specviz.ui import Policy
    from specviz.ui.blocks import exactness

    runs = []
    real = engines.speculative_generate
    monkeypatch.setattr(engines, "speculative_generate", lambda *a, **kw: runs.append(1) or real(*a, **kw))
    controls = dict(prompt=PROMPT, target=app_models["target"], mode="sampling", temperature=1.0, k=2,
                    max_new_tokens=8)
    updates = list(exactness.draw(Policy(), models, 100, "prompt lookup", should_stop=lambda: len(runs) >= 3,
                                  **controls))
    status, _, result = updates[-1]
    assert 'data-state="stopped"' in status and "Stopped after 3 of 100 first tokens each way" in status
    # three draws judge nothing: said in words, never "consistent with one distribution"
    assert "Too few draws to judge: 3 each way" in result and f"at least {exactness.MIN_DRAWS} each way" in result
    assert "consistent" not in result and "p-value 1" not in result


def test_enough_draws_get_a_p_value_and_too_few_get_a_sentence_not_consistent():
    from collections import Counter

    from specviz.ui.blocks.exactness import MIN_DRAWS, verdict_html

    nine = verdict_html(Counter({1: 9}), Counter({1: 9}))  # stopped after 9: p = 1, which proves nothing
    assert "Too few draws to judge: 9 each way" in nine and "consistent" not in nine
    many = verdict_html(Counter({1: 12, 2: 13}), Counter({1: 13, 2: 12}))
    assert MIN_DRAWS <= 25 and "p-value" in many and "consistent with one distribution" in many


def test_no_drafts_get_no_verdict_however_many_draws():
    from specviz.ui.blocks.exactness import verdict_html

    html = verdict_html(Counter({1: 30, 2: 30}), Counter({1: 31, 2: 29}), drafted=0)
    assert "Nothing was drafted in 60 draws" in html and "consistent" not in html and 'data-p="none"' in html


def test_the_check_points_at_transformers_generate_and_at_the_operators_servers(app_models):  # noqa: F811
    """The same draws, verdict and progress with transformers' generate as the engine that
    speculates (prompt lookup: its drafts are counted); a serving engine needs the operator's pair."""
    from specviz.modeling import models
    from specviz.ui import Policy
    from specviz.ui.blocks import exactness

    controls = dict(prompt=PROMPT, target=app_models["target"], mode="sampling", temperature=1.0, k=2,
                    max_new_tokens=8)
    updates = list(exactness.draw(Policy(), models, 20, "prompt lookup", engine="transformers generate", **controls))
    status, _, result = updates[-1]
    assert "Done: 20 first tokens each way" in status and any("Drawn" in u[0] for u in updates[:-1])
    assert "(20 draws each way)" in result and "Nothing was drafted" not in result  # judged, with drafts
    skipped = list(exactness.draw(Policy(), models, 20, "layerskip", engine="transformers generate", **controls))
    assert "drafts by prompt lookup or with a draft model" in skipped[-1][0]  # as the bench and the audit refuse it
    refused = list(exactness.draw(Policy(), models, 20, "prompt lookup", engine="serving engine", **controls))
    assert "SPECVIZ_BASELINE_SERVER_URL" in refused[-1][0] and 'data-state="error"' in refused[-1][0]
