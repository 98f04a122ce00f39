"""The page's layout in real Chromium, as a new visitor meets it: the first screen, a phone-width
window, long token runs, a reload during a run. Screenshots go to test-output/ (look at them).

Each check is something a person saw go wrong: settings below the fold, a ~150 px gap of
empty blocks, charts with a y axis from -1, plotly's toolbar over the chart titles, a cut-off
target menu, a max-new-tokens slider squeezed beside the seed, status emoji drawn as empty
boxes, tokens broken over two lines, 130 px wide panels and a cut-off inspector at 400 px,
and a blank page after a reload mid-run.
"""
from __future__ import annotations

import unicodedata

import pytest
from app_server import PROMPT, app_models, app_policy, serve_app  # noqa: F401 (app_models is a fixture)
from test_app_browser import HANG, OUT, browser  # noqa: F401 (browser is a fixture)

from specviz.ui.policy import TARGETS

# slow: drives a real browser. One worker takes the whole module, in order: its tests share one app.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("app-layout")]


@pytest.fixture(scope="module")
def url(app_models):
    # The real menu labels (mapped to the tiny model), so their width is what a visitor sees.
    targets = tuple((label, app_models["target"]) for label, _ in TARGETS[:1])
    with serve_app(app_policy(app_models, max_new_tokens=400, targets=targets)) as address:
        yield address


def _box(page, selector):
    return page.locator(selector).first.bounding_box()


def test_first_screen_has_the_settings_no_gaps_and_clean_empty_charts(browser, url):
    OUT.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(url)
    page.wait_for_selector("#sv-generate", timeout=HANG)
    page.wait_for_selector("#sv-chart-acceptance .main-svg", timeout=HANG)  # plotly draws after the page loads
    page.screenshot(path=str(OUT / "first-screen.png"))
    for what in ("#sv-target", "#sv-k", "#sv-max-new-tokens", "#sv-prompt", "#sv-generate"):
        box = _box(page, what)
        assert box["y"] + box["height"] <= 900, f"{what} is below the fold"
    menu = page.locator("#sv-target input")
    assert menu.evaluate("e => e.scrollWidth <= e.clientWidth"), "the target's name is cut off"
    slider = page.locator("#sv-max-new-tokens")
    assert slider.evaluate("e => e.scrollWidth <= e.clientWidth"), "the max-new-tokens slider scrolls sideways"
    assert "400" in slider.inner_text()  # its maximum, not "1"
    # No empty blocks between the Drafter row and the status, and the panels say what will come.
    gap = _box(page, "#sv-status")["y"] - (_box(page, "#sv-drafter")["y"] + _box(page, "#sv-drafter")["height"])
    assert gap < 40, f"{gap:.0f} px of nothing under the Drafter row"
    assert "Press Generate" in page.locator("#sv-spec").inner_text()
    # Empty charts: no axis from -1, and no toolbar over the title.
    ticks = page.locator("#sv-chart-acceptance .ytick text").all_inner_texts()
    assert not any(t.startswith(("−", "-")) for t in ticks), ticks
    page.locator("#sv-chart-acceptance").hover()
    assert not page.locator("#sv-chart-acceptance .modebar-container").is_visible()
    # The status icon is drawn, not an emoji that needs a font.
    status = page.locator("#sv-status").inner_text()
    assert not [c for c in status if unicodedata.category(c) == "So"], status
    assert _box(page, "#sv-status .sv-icon")["width"] > 8
    page.close()


def _set_tokens(page, n: int) -> None:
    box = page.get_by_label("number input for max new tokens")
    box.fill(str(n))
    box.press("Enter")


def _run(page, url, tokens=48):
    page.goto(url)
    page.locator("#sv-prompt textarea").fill(PROMPT)
    _set_tokens(page, tokens)
    page.locator("#sv-generate").click()
    page.wait_for_selector('#sv-status [data-state="done"]', timeout=HANG)
    # the step buttons come back on with the last event after a run: the page is whole by then
    page.wait_for_function("!document.querySelector('#sv-replay-next').disabled", timeout=HANG)


def test_a_phone_width_window_stacks_the_panels_and_keeps_tokens_whole(browser, url):
    page = browser.new_page(viewport={"width": 400, "height": 900})
    _run(page, url)
    for panel in ("#sv-spec", "#sv-base"):
        assert _box(page, panel)["width"] >= 300, f"{panel} is squeezed"
    # The inspector's tables scroll inside their box instead of running off the page.
    assert page.locator("#sv-inspector .sv-scroll").count() >= 2  # its draft table and its top-5 table
    for box in page.locator("#sv-inspector .sv-scroll").all():
        assert box.evaluate("e => getComputedStyle(e).overflowX") == "auto"
        b = box.bounding_box()
        assert b["x"] + b["width"] <= 400
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"the page scrolls sideways by {overflow}px"
    # A token is drawn as one box: lines break between tokens, never inside one.
    rects = page.locator("#sv-spec .tok:not(.tok-nl), #sv-base .tok:not(.tok-nl)").evaluate_all(
        "els => els.map(e => [e.getClientRects().length, Math.round(e.getBoundingClientRect().y)])")
    assert len({y for _, y in rects}) > 3, "the text should wrap over several lines here"
    assert all(n == 1 for n, _ in rects), f"{sum(n > 1 for n, _ in rects)} tokens broken over two lines"
    page.locator("#sv-spec").screenshot(path=str(OUT / "narrow-panel.png"))
    page.screenshot(path=str(OUT / "playground-400.png"), full_page=True)
    page.close()


def test_a_reload_during_a_run_shows_a_ready_page_not_a_blank_one(browser, url):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(url)
    page.locator("#sv-prompt textarea").fill(PROMPT)
    _set_tokens(page, 400)
    page.locator("#sv-generate").click()
    page.wait_for_selector("#sv-spec .tok", timeout=HANG)  # under way
    page.reload()
    page.wait_for_selector("#sv-generate", timeout=HANG)
    page.wait_for_timeout(1000)  # (nothing to wait for: the page must stay ready, not become so)
    assert "Ready" in page.locator("#sv-status").inner_text()
    assert "Press Generate" in page.locator("#sv-spec").inner_text()
    assert "Press Generate" in page.locator("#sv-base").inner_text()
    page.screenshot(path=str(OUT / "after-reload.png"))
    page.close()
