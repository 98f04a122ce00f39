"""Issue 64 in a real browser (axe-core judging the opened block in both themes): after a run, the degeneracy meter stands above the acceptance chart, and the
"Draft-length controllers on this run" block replays every controller beside the hindsight best, then races
the top two live (greedy: the same tokens per pass). Screenshot: test-output/controllers.png."""
from __future__ import annotations

import pytest
from app_server import PROMPT, app_models, app_policy, serve_app  # noqa: F401 (app_models is a fixture)
from test_a11y_browser import DESKTOP, every_view
from test_app_browser import HANG, OUT, browser  # noqa: F401 (browser is a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("controllers-browser")]


def test_a_finished_run_shows_its_controllers_side_by_side_and_races_the_top_two(browser, app_models):  # noqa: F811
    with serve_app(app_policy(app_models, max_new_tokens=40, default_drafter="prompt lookup")) as url:
        OUT.mkdir(exist_ok=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url)
        box = page.locator("#sv-max-new-tokens input[type=number]")
        box.fill("24")
        box.press("Enter")
        page.locator("#sv-prompt textarea").fill(PROMPT)
        page.locator("#sv-generate").click()
        page.wait_for_selector('#sv-status [data-state="done"]', timeout=HANG)
        meter = page.locator("#sv-degeneracy .sv-degeneracy")
        # The meter's box stands from the first screen, its words come with the run's last update, which
        # a loaded machine can paint a moment after the status says done: wait for the words themselves.
        page.wait_for_selector('#sv-degeneracy .sv-degeneracy:has-text("distinct-2")', timeout=HANG // 10)
        assert "distinct-2" in meter.inner_text()
        assert meter.bounding_box()["y"] < page.locator("#sv-chart-acceptance").bounding_box()["y"]
        page.locator("#sv-controllers-box button").first.click()  # open the block
        page.locator("#sv-controllers-replay").click()
        ended = '#sv-controllers-status [data-state="done"], #sv-controllers-status [data-state="error"]'
        page.wait_for_selector(ended, timeout=HANG)  # an error ends the wait too, and is read out below
        assert page.locator('#sv-controllers-status [data-state="done"]').count() == 1, \
            page.locator("#sv-controllers-status").inner_text()
        table = page.locator("#sv-controllers-table").inner_text()
        assert "hindsight best" in table and "specviz" in table and "sglang-adaptive" in table
        assert page.locator("#sv-controllers-plot .js-plotly-plot").count() == 1
        page.locator("#sv-controllers-race").click()
        page.wait_for_selector(f'#sv-controllers-status:has-text("Raced"), {ended.split(", ")[1]}', timeout=HANG)
        assert "Raced" in page.locator("#sv-controllers-status").inner_text()
        rows = page.locator("#sv-controllers-race-table tbody tr")
        assert rows.count() == 2
        for i in range(2):
            cells = rows.nth(i).locator("td").all_inner_texts()
            assert cells[0] == cells[1] and cells[-1] == "yes", cells  # replayed == live tokens per pass
        page.locator("#sv-controllers-box").screenshot(path=str(OUT / "controllers.png"))
        assert every_view(page, "controllers", widths=(DESKTOP,)) == {}  # axe: the block open, light and dark
        page.locator("#sv-degeneracy").screenshot(path=str(OUT / "degeneracy.png"))
