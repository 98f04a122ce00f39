"""What a teacher projecting the page shows a room (issue 39, items 5 and 8), in a real browser:
a replayed run (no model) whose text wraps without splitting words, ends with a mark instead of
<|im_end|>, whose inspector says no bonus followed the end-of-turn token, and whose tree step
draws a whitespace candidate as a visible mark. Screenshots go to test-output/ (look at them)."""
from __future__ import annotations

import pytest
from app_server import app_models, app_policy, serve_app  # noqa: F401 (app_models is a fixture)
from test_app_browser import HANG, OUT, browser  # noqa: F401 (browser is a fixture)
from test_render import step
from test_replay_app import no_models

from specviz.core.events import RunEnd, RunStats, TokenEvent, TreeDraft
from specviz.render import Labels, Trace
from specviz.traces import trace_file
from specviz.traces.trace_file import Recording, RunInfo

EOS = 2
WAIT = HANG
WORDS = {10: " Java", 11: "Script", 12: ",", 13: " is", 14: " a", 15: " great", 16: " Type", 17: "Scr",
         18: ".", 19: "\n", 20: " the", 21: " fun", 22: " ", 23: " done", EOS: "<|im_end|>"}


def lesson() -> Recording:
    """40 steps of " JavaScript," (two kept drafts and a bonus each), a tree step, then a step
    that keeps the end-of-turn token, which ends the run before its bonus token."""
    spec, base, t = Trace("tiny medusa", k=4), Trace("baseline", speculative=False), 0.0
    for i in range(40):
        t += 0.005
        spec.add(step(i, [10, 11], 2, 12, elapsed=t, top=((12, 0.9),), position=len(spec.token_ids)),
                 Labels(draft=(" Java", "Script"), token=",", top=(",",)))
    # The tree: " Java" -> "Script" -> " is" won; " a" missed after it; a whitespace candidate " ".
    parents = (-1, -1, -1, 0, 0, 0, 3, 3, 3, 6, 6, 6)
    tokens = (10, 16, 22, 11, 17, 18, 13, 12, 19, 14, 20, 21)
    tree = TreeDraft(tokens=tokens, parents=parents, path=(0, 3, 6), p=tuple(0.9 - 0.07 * i for i in range(12)))
    spec.add(step(40, [10, 11, 13, 14], 3, 15, elapsed=t + 0.01, tree=tree, top=((15, 0.9),),
                  position=len(spec.token_ids)),
             Labels(draft=(" Java", "Script", " is", " a"), token=" great", top=(" great",),
                    tree=tuple(WORDS[x] for x in tokens)))
    spec.add(step(41, [23, EOS, 18], 3, 15, emitted=(23, EOS), elapsed=t + 0.02, top=((15, 0.9),),
                  position=len(spec.token_ids)),
             Labels(draft=(" done", "<|im_end|>", "."), token=" great", top=(" great",)))
    ids = spec.token_ids
    for i, token in enumerate(ids):
        base.add(TokenEvent(step=i, token=token, p=0.5, time=0.002, elapsed=0.002 * (i + 1)),
                 Labels(token=WORDS[token]))
    for trace, steps, elapsed in ((spec, 42, t + 0.02), (base, len(ids), 0.002 * len(ids))):
        # counts that add up: a trace file's loader checks them against the steps
        drafted = sum(len(getattr(e, "draft", ())) for e in trace.events)
        accepted = sum(getattr(e, "accepted", 0) for e in trace.events)
        trace.add(RunEnd(tuple(ids), RunStats(tokens=len(ids), steps=steps, target_calls=steps + 1, drafted=drafted,
                                              accepted=accepted, prefill_time=0.0, draft_time=0.0, verify_time=0.0,
                                              elapsed=elapsed, stop_reason="eos")))
    info = RunInfo(target="tiny", drafter="tiny medusa", prompt="Say JavaScript forty times.", config={"k": 4})
    return Recording(info, spec, base)


@pytest.mark.slow  # a real browser
def test_a_projected_replay_keeps_words_whole_marks_the_end_and_draws_a_legible_tree(browser, app_models,  # noqa: F811
                                                                                      tmp_path):
    path = tmp_path / "lesson.json"
    trace_file.save(path, lesson())
    with serve_app(app_policy(app_models), models=no_models()) as url:
        OUT.mkdir(exist_ok=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url)
        page.locator("#sv-replay-box").get_by_text("Export and replay").click()  # opens the accordion
        page.locator("#sv-replay-file input[type=file]").set_input_files(str(path))
        # the trace is refused in a sentence or ready to play: either ends the wait, not the hang's timeout
        page.wait_for_selector('#sv-status:has-text("Play race"), #sv-status [data-state="error"]', timeout=WAIT)
        assert "Play race" in page.locator("#sv-status").inner_text()
        page.locator("#sv-replay-play").click()
        page.wait_for_selector('#sv-status [data-state="done"]:has-text("Replay finished")', timeout=WAIT)

        spec = page.locator("#sv-spec")
        assert "im_end" not in spec.inner_text() and spec.locator(".sv-end").is_visible()  # a mark, not text
        # Every " Java" sits on the line of its "Script": lines break between words only.
        tops = page.evaluate("""() => [...document.querySelectorAll('#sv-spec .tok')]
            .filter(t => t.textContent === ' Java' && t.nextElementSibling)
            .map(t => [t.getBoundingClientRect().top, t.nextElementSibling.getBoundingClientRect().top])""")
        assert len(tops) >= 40 and all(a == b for a, b in tops), tops
        lines = {a for a, _ in tops}
        assert len(lines) > 3  # the text did wrap, so the words were tested at line ends

        inspector = page.locator("#sv-inspector")
        assert "no bonus token was output" in inspector.inner_text()
        assert "The target's bonus token" not in inspector.inner_text()
        inspector.screenshot(path=str(OUT / "projector-inspector-eos.png"))

        page.locator("#sv-replay-previous").click()
        page.wait_for_selector('#sv-inspector .sv-tree', timeout=WAIT)
        tree = page.locator("#sv-inspector .sv-tree")
        assert "a tree of 12 candidates" in inspector.inner_text()
        blank = tree.locator("code", has_text="␣")
        assert blank.count() == 1 and blank.bounding_box()["width"] > 5  # the whitespace candidate shows
        sizes = tree.locator("code").evaluate_all("cs => cs.map(c => parseFloat(getComputedStyle(c).fontSize))")
        assert len(sizes) == 12 and min(sizes) >= 15, sizes  # every depth read from the back of a room
        inspector.screenshot(path=str(OUT / "projector-tree.png"))
        page.screenshot(path=str(OUT / "projector-page.png"), full_page=True)
        page.close()
