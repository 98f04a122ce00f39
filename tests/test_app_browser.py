"""The page in a real browser: Debian's headless Chromium, driven by playwright.

Serves the app with tiny offline models, types a prompt, presses Generate and checks what a
person would see: every token kind in the speculative panel, the baseline, the charts, the
greedy check; then the Compare tab. Screenshots go to test-output/ (look at them).
Without Chromium this test skips locally and fails under CI=true.
"""
from __future__ import annotations

import os
import pathlib

import pytest
from app_server import PROMPT, app_models, app_policy, serve_app, slow_steps  # noqa: F401 (app_models is a fixture)

# slow: drives a real browser. One worker takes the whole module (its apps start once).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("app-browser")]

CHROMIUM = pathlib.Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]
OUT = pathlib.Path(__file__).resolve().parents[1] / "test-output"
# Waits only guard against a hang: a busy machine may take minutes, and no test here times speed.
HANG = 600_000


def _need_browser():
    problem = None
    if not CHROMIUM.exists():
        problem = f"{CHROMIUM} is missing (bash .ci/run installs Debian's chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "the playwright package is missing (pip install -r tests/requirements.txt)"
    if problem and os.environ.get("CI") == "true":
        pytest.fail(problem)
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="module")
def browser():
    _need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield Patient(chromium)
        chromium.close()


class Patient:
    """The browser, whose pages wait up to STEP for anything not given its own timeout
    (playwright's 30 s default is short for a page load beside a whole test suite on 2 cores)."""

    STEP = 120_000

    def __init__(self, browser):
        self._browser = browser

    def new_page(self, **kwargs):
        page = self._browser.new_page(**kwargs)
        page.set_default_timeout(self.STEP)
        return page

    def __getattr__(self, name):
        return getattr(self._browser, name)


def generated(browser, url, drafter: str | None = None):
    """A desktop-sized page of the app at `url` after one finished Generate of PROMPT (with `drafter`
    typed into the drafter box, when given)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    if drafter is not None:
        use_drafter(page, drafter)
    page.locator("#sv-prompt textarea").fill(PROMPT)
    page.locator("#sv-generate").click()
    page.wait_for_selector('#sv-status [data-state="done"]', timeout=HANG)
    return page


def use_drafter(page, name: str) -> None:
    """Pick the drafter menu's entry `name`, or type `name` in when the menu has none (a local app
    takes any drafter); the box then shows `name`."""
    box = page.locator("#sv-drafter input")
    box.click()
    listed = page.get_by_role("option", name=name, exact=True)
    if listed.count():
        listed.click()
    else:
        box.fill(name)
        box.press("Enter")
    page.wait_for_function("name => document.querySelector('#sv-drafter input').value === name", arg=name,
                           timeout=HANG // 20)  # a minute or more: it shows at once, or not at all


def generate_again(page) -> None:
    """Press Generate on a page whose status already says done, and wait for this run's own done.

    Marks the old status element first: a tiny model's run can end before a wait for "running"
    begins, and the old "done" would satisfy a plain wait at once (a clean-clone CI run read the
    next run's "Loading the draft model" in the following test)."""
    page.evaluate("document.querySelector('#sv-status .sv-status').dataset.old = '1'")
    page.locator("#sv-generate").click()
    page.wait_for_function("() => { const s = document.querySelector('#sv-status .sv-status');"
                           " return s && !s.dataset.old && s.dataset.state === 'done'; }", timeout=HANG)


@pytest.fixture(scope="module")
def url(app_models):
    """The app most tests here share (each on a page of its own): a drafter or target they need is typed in."""
    with serve_app(app_policy(app_models, max_new_tokens=24)) as address:
        yield address


def test_generate_shows_every_token_kind_charts_and_the_greedy_check(browser, url):
    OUT.mkdir(exist_ok=True)
    page = generated(browser, url)

    spec = page.locator("#sv-spec")
    for kind in ("accepted", "rejected", "corrected", "bonus"):
        assert spec.locator(f'[data-kind="{kind}"]').count() > 0, kind
    assert page.locator('#sv-base [data-kind="baseline"]').count() == 24
    assert spec.locator("script, img").count() == 0  # the prompt's markup never became elements
    assert "identical to baseline" in page.locator("#sv-check").inner_text()
    for chart in ("acceptance", "throughput", "lengths", "positions"):
        assert page.locator(f"#sv-chart-{chart} .js-plotly-plot .main-svg").count() > 0, chart
    assert page.locator('#sv-headline [data-metric="speedup"]').count() == 1
    assert "target's top token" in page.locator("#sv-inspector").inner_text()  # greedy: the argmax rule
    # Why checking is cheap: the verify-cost curve, and the run re-timed (labelled as such) on a GPU-like profile.
    page.wait_for_selector("#sv-retime-result .sv-retime[data-speedup]", timeout=HANG)
    assert "Re-timed, not measured" in page.locator("#sv-retime-result").inner_text()
    assert page.locator('#sv-cost-caption [data-curve="measured"]').count() == 1
    assert page.locator("#sv-cost-curve .js-plotly-plot .main-svg").count() > 0
    slope = page.locator("#sv-retime-slope input[type=number]")
    slope.fill("0.5")
    slope.press("Enter")  # a custom cost picks the custom profile and re-times at once
    page.wait_for_function("document.querySelector('#sv-retime-result').innerText.includes('+0.50 step')",
                           timeout=HANG)

    spec.locator('[data-kind="rejected"]').first.hover()  # the hover card shows in the screenshot
    page.screenshot(path=str(OUT / "playground.png"), full_page=True)

    page.set_viewport_size({"width": 430, "height": 900})  # a phone, or a narrow window
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    try:  # plotly re-lays each chart out ~100 ms after a resize, one after another
        page.wait_for_function("document.documentElement.scrollWidth - window.innerWidth <= 1", timeout=20_000)
    except PlaywrightTimeoutError:
        pass  # the assertion below says by how much
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    page.screenshot(path=str(OUT / "playground-narrow.png"), full_page=True)
    assert overflow <= 1, f"the page scrolls sideways by {overflow}px in a narrow window"
    page.close()


def test_compare_tab_runs_baseline_prompt_lookup_and_a_draft_model(browser, url):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.get_by_role("tab", name="Compare drafters").click()
    page.locator("#sv-compare").click()
    page.wait_for_selector('#sv-compare-status [data-state="done"]', timeout=HANG)
    panels = page.locator("#sv-compare-panels .sv-panel")
    assert panels.count() == 3  # baseline, prompt lookup, the draft model
    assert panels.nth(2).locator('[data-kind="accepted"]').count() > 0
    assert page.locator("#sv-compare-speed .js-plotly-plot").count() == 1
    assert "prompt lookup" in page.locator("#sv-compare-table").inner_text()
    page.screenshot(path=str(OUT / "compare.png"), full_page=True)
    page.close()


def test_compare_status_stops_saying_reading_the_prompt_once_every_run_has_read_it(browser, app_models, monkeypatch):
    """Issue 66.4: "reading the prompt first" stayed 12 s into generation. Every step is slowed here
    (0.1 s), so each round's generation lasts seconds after the prompt is read: the page must show the
    round's status without those words while the runs are still going (a wait for a state, not a read
    of each frame: the page may drop a throttled frame)."""
    slow_steps(monkeypatch, 0.1)
    with serve_app(app_policy(app_models, max_new_tokens=16)) as address:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(address)
        page.get_by_role("tab", name="Compare drafters").click()
        page.locator("#sv-compare").click()
        seen = page.wait_for_function("""() => {
            const status = document.querySelector('#sv-compare-status');
            const text = status ? status.innerText : '';
            if (status && status.querySelector('[data-state="done"], [data-state="error"], [data-state="stopped"]'))
                return 'ended: ' + text;  // over without the state sought: fail below, not at HANG
            return /Round \\d+ of \\d+: 3 runs taking turns/.test(text) && !text.includes('reading the prompt')
                && 'seen';
        }""", timeout=HANG).json_value()
        assert seen == "seen", seen
        page.locator("#sv-compare-stop").click()  # seen: the rest of the rounds would only cost time
        page.wait_for_selector('#sv-compare-status [data-state="stopped"]', timeout=HANG)
        page.close()


def test_compare_with_ten_drafters_shows_every_row_inside_the_tables_box(browser, app_models):
    """With ten drafters the last row hid below the table's box (Gradio's 500 px max height), and the
    throughput chart reused colours (prompt lookup and layer skip both orange: tests/test_render.py)."""
    draft, medusa = app_models["draft"], app_models["medusa"]
    ten = ("none", "prompt lookup", draft, medusa, "suffix", "layerskip:0", "layerskip:1", f"{draft}+pld",
           f"suffix+{draft}", f"{medusa}+pld")
    with serve_app(app_policy(app_models, max_new_tokens=16, compare_drafters=ten)) as address:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(address)
        page.get_by_role("tab", name="Compare drafters").click()
        page.locator("#sv-compare").click()
        page.wait_for_selector('#sv-compare-status [data-state="done"]', timeout=HANG)
        assert page.locator("#sv-compare-table [role=row]").count() == 12  # the header, the baseline, ten drafters
        clipped = page.locator("#sv-compare-table *").evaluate_all(  # (Gradio keeps a 0 px row for measuring)
            "els => els.filter(e => ['auto', 'scroll', 'hidden'].includes(getComputedStyle(e).overflowY)"
            " && e.clientHeight > 0 && e.scrollHeight > e.clientHeight + 2).map(e => e.className)")
        assert clipped == [], clipped  # nothing inside the table scrolls or hides a row
        page.locator("#sv-compare-table").screenshot(path=str(OUT / "compare-ten-table.png"))
        page.locator("#sv-compare-speed").screenshot(path=str(OUT / "compare-ten-speed.png"))
        page.close()


def test_inspector_draws_the_tree_of_a_tree_drafting_step(browser, url):
    page = generated(browser, url, drafter="tiny medusa")
    box = page.locator("#sv-step input[type=number]")  # the first step drafts the full budget
    box.fill("1")  # the slider counts steps from 1, as every label does
    box.press("Enter")
    page.wait_for_selector('#sv-inspector [data-step="0"]', timeout=HANG)
    tree = page.locator("#sv-inspector .sv-tree")
    assert tree.count() == 1
    assert int(tree.get_attribute("data-nodes")) > 1
    assert tree.locator("li").count() == int(tree.get_attribute("data-nodes"))
    assert "identical to baseline" in page.locator("#sv-check").inner_text()
    page.locator("#sv-inspector").screenshot(path=str(OUT / "tree-inspector.png"))
    page.close()


def test_suffix_decoding_remembers_a_visitors_answer_and_the_inspector_says_so(browser, url):
    """Generate twice with suffix decoding: the second run's first draft comes from the first
    run's answer, and the step inspector says where it came from."""
    page = generated(browser, url, drafter="suffix")
    generate_again(page)
    box = page.locator("#sv-step input[type=number]")
    box.fill("1")  # the first step (the slider counts from 1)
    box.press("Enter")
    page.wait_for_selector('#sv-inspector [data-step="0"]', timeout=HANG)
    head = page.locator("#sv-inspector .sv-inspect-head").inner_text()
    assert "by suffix tree" in head and "in earlier requests" in head, head
    OUT.mkdir(exist_ok=True)
    page.locator("#sv-inspector").screenshot(path=str(OUT / "suffix-inspector.png"))
    page.close()


def test_sliding_window_models_typed_in_as_folders_run_past_their_window(browser, url, tmp_path):
    """A user's own model, by folder path, of a family whose layers slide (Gemma 3: one in two;
    GPT-OSS: one in two, with experts): the prompt is longer than their 16-token window."""
    from tiny_folder import make_family_dir

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(url)
    use_drafter(page, "prompt lookup")
    tokens = page.locator("#sv-max-new-tokens input[type=number]")
    tokens.fill("16")
    tokens.press("Enter")
    page.locator("#sv-prompt textarea").fill(PROMPT)
    for family in ("gemma3", "gpt-oss"):
        target = page.locator("#sv-target input")
        target.fill(str(make_family_dir(tmp_path / family, family)))
        target.press("Enter")
        if family == "gemma3":
            page.locator("#sv-generate").click()
            page.wait_for_selector('#sv-status [data-state="done"]', timeout=HANG)
        else:
            generate_again(page)
        page.screenshot(path=str(OUT / f"family-{family}.png"))
        assert "identical to baseline" in page.locator("#sv-check").inner_text(), family
        assert page.locator('#sv-base [data-kind="baseline"]').count() == 16, family
    page.close()
