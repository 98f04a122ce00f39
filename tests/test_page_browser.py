"""Issue 39 in a real browser (Chromium via playwright), at a projector's 1280x900 and a
phone's 390x844: the step buttons beside the panels and off before a run, the inspector
staying where a reader put it while the run goes on, nothing cut off or pushed off screen.
Full-page screenshots go to test-output/page-*.png (look at them)."""
from __future__ import annotations

import re
import threading

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from app_server import PROMPT, app_models, app_policy, serve_app  # noqa: F401 (app_models is a fixture)
from test_app_browser import HANG, OUT, browser  # noqa: F401 (browser is a fixture)

# slow: drives a real browser. One worker takes the whole module, in order: its tests share one app.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("page-browser")]

DESKTOP, PHONE = {"width": 1280, "height": 900}, {"width": 390, "height": 844}
STEPPER = ("#sv-step-live", "#sv-replay-previous", "#sv-replay-next", "#sv-step-phases", "#sv-replay-play",
           "#sv-replay-pause")
NEAR = 100  # px: the step buttons end at most this far above the panels they animate
# The right edge of a token's hover card (its ::after), in page coordinates.
CARD_RIGHT = """tok => { const s = getComputedStyle(tok, '::after'), r = tok.getBoundingClientRect();
  const pad = s.boxSizing === 'border-box' ? 0 : parseFloat(s.paddingLeft) + parseFloat(s.paddingRight);
  return s.content === 'none' ? null : r.left + parseFloat(s.left) + parseFloat(s.width) + pad; }"""


@pytest.fixture(scope="module")
def url(app_models):  # noqa: F811
    with serve_app(app_policy(app_models, max_new_tokens=400)) as address:
        OUT.mkdir(exist_ok=True)
        yield address


def progress_bar_width(page) -> float:
    """The status's progress bar, in px, beside the longest message it comes with (a long
    prompt's prefill count): drawn into the page as the app draws it."""
    from specviz.render.status import status_html

    long = status_html("Generating with SmolLM2-135M (embedded): the speculative run has 0 tokens; the baseline is "
                       "reading the prompt (prefill: 1,536 of 3,960 tokens read, 39%)… 12 s", "running", 0.39)
    page.locator("#sv-status .sv-status").evaluate("(el, html) => { el.outerHTML = html; }", long)
    return page.locator("#sv-status progress").bounding_box()["width"]


def run(page, tokens: int) -> None:
    box = page.locator("#sv-max-new-tokens input[type=number]")
    box.fill(str(tokens))
    box.press("Enter")
    page.locator("#sv-prompt textarea").fill(PROMPT)
    page.locator("#sv-generate").click()


def test_the_step_buttons_sit_above_the_panels_and_wait_for_a_run(browser, url):
    page = browser.new_page(viewport=DESKTOP)
    page.goto(url)
    for button in STEPPER:
        assert page.locator(button).is_disabled(), f"{button} is on before any run or trace"
    buttons = page.locator("#sv-replay-next").bounding_box()
    panels = page.locator("#sv-spec").bounding_box()
    assert progress_bar_width(page) >= 80, "a long status message squeezes its progress bar away"
    assert 0 <= panels["y"] - (buttons["y"] + buttons["height"]) <= NEAR, (buttons, panels)
    run(page, 24)
    page.wait_for_selector('#sv-status [data-state="done"]', timeout=HANG)
    page.wait_for_function("!document.querySelector('#sv-replay-next').disabled", timeout=HANG)
    assert all(page.locator(b).is_enabled() for b in STEPPER)
    rows = page.locator(".sv-legend-box .sv-legend-item").evaluate_all(
        "items => new Set(items.map(i => Math.round(i.getBoundingClientRect().top))).size")
    assert rows == 1, "the token legend wraps onto a second line at 1280 px"
    # A word where a number goes ("measuring…", the first 16 tokens) fits its card at 1280 px
    from specviz.render.numbers import Headline, headline_html

    measuring = headline_html(Headline(spec_tps=12.3, base_tps=10.1, speedup=None, alpha=0.47, tau=2.86, k=4.0,
                                       c=None, predicted=None, calls_saved=26, base_calls=40, timing="measuring"))
    page.locator("#sv-headline .sv-cards").evaluate("(el, html) => { el.outerHTML = html; }", measuring)
    clipped = page.locator("#sv-headline .sv-card-value").evaluate_all(
        "els => els.filter(e => e.scrollWidth > e.clientWidth).map(e => e.textContent)")
    assert clipped == [], f"cut off in their cards: {clipped}"
    page.locator("#sv-replay-next").click()  # Next step plays the run just made
    page.wait_for_selector('#sv-status:has-text("Step 1 of")', timeout=HANG)
    head = page.locator("#sv-inspector .sv-inspect-head").inner_text()
    assert re.match(r"Step 1 of \d+", head) and head.split(" ·")[0] in page.locator("#sv-status").inner_text()
    page.close()


class Held:
    """A target whose passes the test can hold: once armed, `n` more passes go through, then
    each waits until released. Armed before the run starts, so the run is held part-way however
    busy the machine is (a fixed 30 ms a pass was not, once, beside other browser tests; arming
    it once the status said "so far" was not either: on a slow CI machine the speculative run
    had all its 84 steps by then)."""

    def __init__(self):
        self.lock, self.going, self.left = threading.Lock(), threading.Event(), None
        self.going.set()

    def hold_after(self, n: int) -> None:
        with self.lock:
            self.left = n

    def release(self) -> None:
        with self.lock:
            self.left = None
            self.going.set()

    def start(self, model) -> None:
        with self.lock:
            if self.left is not None:
                self.left -= 1
                if self.left < 0:
                    self.going.clear()
        assert self.going.wait(HANG / 1000), "the test never released the run"

    def stop(self, model) -> None:
        pass


@pytest.fixture
def held_target(app_models):  # noqa: F811
    from specviz.modeling import forward, models

    from specviz.engine import verify_cost

    target = models.load(app_models["target"])  # the app's own copy, from the shared cache
    verify_cost.curve(target.model)  # measured now, so its passes are not among those counted
    held = Held()
    forward.observe(target.model, held)
    yield held
    held.release()
    forward.observe(target.model, None)


def test_the_inspector_stays_on_the_step_the_reader_chose_while_the_run_goes_on(browser, url, held_target):
    page = browser.new_page(viewport=DESKTOP)
    page.goto(url)
    # The warm-up's few passes and the two prefills, then ~4.5 passes a step (one verify, the baseline
    # catching up ~3.5 tokens): the run waits at ~12 of its ~35 steps.
    held_target.hold_after(60)
    run(page, 120)
    head = page.locator("#sv-inspector .sv-inspect-head")
    # while held, the status's heartbeat redraws the inspector with the steps so far
    page.wait_for_function("(document.querySelector('#sv-inspector .sv-inspect-head')?.innerText || '')"
                           ".match(/of ([5-9]|\\d\\d+) /)", timeout=HANG)
    box = page.locator("#sv-step input[type=number]")
    # the reader moves the slider to step 2 (with the keyboard: typing into the number box could
    # mix with the run's own update of it)
    # (a heartbeat can redraw the slider between the two presses and take its focus or its range:
    # under load the keys then went nowhere and the test waited out its 10 minutes, so it tries again)
    slider = page.locator("#sv-step input[type=range]")
    for _ in range(10):
        slider.focus()
        page.keyboard.press("Home")
        page.keyboard.press("ArrowRight")
        try:
            page.wait_for_selector('#sv-inspector .sv-inspect-head:has-text("Step 2 of")', timeout=HANG // 20)
            break
        except PlaywrightTimeout:
            continue
    else:
        pytest.fail("the step slider never showed step 2 while the run was held")
    seen = int(re.search(r"of (\d+)", head.inner_text()).group(1))
    assert page.locator('#sv-status [data-state="running"]').count() == 1  # (held: more to go)
    held_target.release()
    page.wait_for_selector('#sv-status [data-state="done"]', timeout=HANG)
    # the step buttons come back on with the last event after a run: everything is redrawn by then
    page.wait_for_function("!document.querySelector('#sv-replay-next').disabled", timeout=HANG)
    assert head.inner_text().startswith("Step 2 of"), "the inspector jumped away from the reader's step"
    assert int(re.search(r"of (\d+)", head.inner_text()).group(1)) > seen  # it was redrawn meanwhile
    assert box.input_value() == "2"
    last = re.search(r"of (\d+)", head.inner_text()).group(1)
    box.fill(last)  # the newest step: the inspector follows again (the next run would move it)
    box.press("Enter")
    page.wait_for_selector(f'#sv-inspector .sv-inspect-head:has-text("Step {last} of {last}")', timeout=HANG)
    page.close()


def test_stop_is_acknowledged_on_the_page_while_the_run_is_still_busy(browser, url, held_target):
    """Stop pressed while the run is held in a pass (as in a long prefill piece): the status went on
    counting with nothing acknowledging the click, and a teacher pressed it again. It says
    "Stopping…" while the pass is still under way, then "Stopped"."""
    page = browser.new_page(viewport=DESKTOP)
    page.goto(url)
    held_target.hold_after(20)
    run(page, 120)
    page.wait_for_selector('#sv-status [data-state="running"]', timeout=HANG)
    page.locator("#sv-stop").click()
    page.wait_for_function("document.querySelector('#sv-status .sv-status-text')?.innerText === 'Stopping…'",
                           timeout=HANG)
    assert page.locator('#sv-status [data-state="running"]').count() == 1  # still held: the run has not ended
    held_target.release()
    page.wait_for_selector('#sv-status [data-state="stopped"]', timeout=HANG)
    page.close()


def test_a_phone_sees_every_tab_every_verdict_and_hover_cards_inside_their_panel(browser, url):
    page = browser.new_page(viewport=PHONE, has_touch=True)
    page.goto(url)
    page.locator("#sv-generate").wait_for(timeout=HANG)
    for tab in ("Playground", "Compare drafters", "Serving engine"):
        assert page.get_by_role("tab", name=tab).is_visible(), f"the {tab} tab is hidden on a phone"
    intro = page.locator(".sv-header").inner_text()
    assert "Left:" not in intro and "Right:" not in intro  # the panels are stacked here
    assert progress_bar_width(page) >= 80, "a long status message squeezes its progress bar away"
    run(page, 40)
    page.wait_for_selector('#sv-status [data-state="done"]', timeout=HANG)
    page.wait_for_function("!document.querySelector('#sv-replay-next').disabled", timeout=HANG)
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 1
    panel = page.locator("#sv-spec .sv-panel").bounding_box()
    right = panel["x"] + panel["width"]
    tokens = page.locator("#sv-spec .tok[data-tip]")
    lefts = tokens.evaluate_all("ts => ts.map(t => t.getBoundingClientRect().left)")
    assert max(tokens.evaluate_all("ts => ts.map(t => t.getBoundingClientRect().right)")) <= right + 0.5
    edge = tokens.nth(lefts.index(max(lefts)))  # the token nearest the panel's right edge
    edge.scroll_into_view_if_needed()
    edge.tap()  # a tap pins its hover card open
    page.wait_for_function("el => el.classList.contains('sv-tip-open')", arg=edge.element_handle(), timeout=HANG)
    # the card is placed in the next animation frame: wait two (a chart's redraw may hold one up)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    card = edge.evaluate(CARD_RIGHT)
    assert card is not None and card <= page.locator("#sv-spec .sv-panel").bounding_box()["x"] + panel["width"] + 0.5, \
        f"the hover card ends at {card}, past its panel's right edge"
    page.screenshot(path=str(OUT / "page-390-card.png"))
    edge.tap()
    page.locator("#sv-inspector").scroll_into_view_if_needed()
    verdict = page.locator("#sv-inspector td[class^=sv-verdict]").first  # seen without scrolling the table
    box = verdict.bounding_box()
    assert box["x"] + box["width"] <= PHONE["width"], "the inspector's verdict column is off screen"
    # the drafter's name stops before the dropdown's arrow
    clear = page.locator("#sv-drafter input").evaluate(
        "i => i.getBoundingClientRect().right - parseFloat(getComputedStyle(i).paddingRight)"
        " <= i.parentElement.querySelector('.icon-wrap').getBoundingClientRect().left + 1")
    assert clear, "the drafter dropdown's text runs under its arrow"
    page.screenshot(path=str(OUT / "page-390.png"), full_page=True)
    page.set_viewport_size(DESKTOP)
    page.wait_for_timeout(300)
    page.screenshot(path=str(OUT / "page-1280.png"), full_page=True)
    page.close()


# The element with keyboard focus, as "tag#id.class" of itself or the nearest block with an id.
FOCUSED = """() => { const a = document.activeElement, box = a.closest('[id]');
  return `${a.tagName.toLowerCase()} ${a.textContent.trim().slice(0, 30)} in #${box ? box.id : ''}`; }"""


def test_the_keyboard_a_screen_reader_and_a_phone_reach_generate_tokens_and_what_numbers_mean(browser, url):
    """Issue 47 (3): the skip links are the first Tab stops and move focus; every token has a name
    built from its event, escaped; a token with no text takes no Tab stop; the headline numbers are
    explained where a keyboard, a tap and a screen reader reach them, at 1280 px and at 390 px."""
    from specviz.core.events import StepEvent
    from specviz.render import Labels, Trace, tokens_html

    page = browser.new_page(viewport=DESKTOP, has_touch=True)
    page.goto(url)
    page.locator("#sv-generate").wait_for(timeout=HANG)
    page.keyboard.press("Tab")
    assert page.evaluate(FOCUSED).startswith("a Skip to prompt"), "the skip link is not the first Tab stop"
    page.keyboard.press("Enter")
    page.wait_for_function("document.activeElement.closest('#sv-prompt') !== null", timeout=HANG)
    page.locator(".sv-skip a").nth(1).focus()
    page.keyboard.press("Enter")  # the second stop goes straight to Generate (it was 29 Tab presses down)
    page.wait_for_function("document.activeElement.id === 'sv-generate'", timeout=HANG)
    run(page, 24)
    page.wait_for_selector('#sv-status [data-state="done"]', timeout=HANG)
    page.wait_for_function("!document.querySelector('#sv-replay-next').disabled", timeout=HANG)

    tokens = page.locator("#sv-spec .tok, #sv-base .tok")
    names = tokens.evaluate_all("ts => ts.map(t => [t.dataset.kind, t.getAttribute('aria-label') || ''])")
    assert names and all(name.startswith(("accepted draft token", "rejected draft token", "unchecked draft token",
                                          "target's", "bonus token", "baseline token")) and " p " in name
                         for _, name in names), names[:5]
    assert page.locator("#sv-spec .tok:empty[tabindex], #sv-base .tok:empty[tabindex]").count() == 0
    # Model text with markup and a token with no text (the first bytes of a character), drawn by the
    # page's own renderer into the panel: the markup stays text in the name, the empty token is skipped
    e = StepEvent(step=0, position=0, draft=(1, 2, 3), q=(0.8, 0.5, 0.4), p=(0.91, 0.9, 0.1), accept_prob=(1, 1, 0),
                  draws=None, accepted=2, token=4, token_p=0.7, token_kind="corrected", emitted=(1, 2, 4), top=((4, 0.7),),
                  draft_time=0.0, verify_time=0.0, elapsed=0.0, greedy=True)
    trace = Trace("x")
    trace.add(e, Labels(draft=("<b>Paris</b>", "", " x"), token="y"))
    page.locator("#sv-spec .sv-text").evaluate("(el, html) => { el.outerHTML = html; }", tokens_html(trace))
    made = page.locator("#sv-spec .tok")
    assert page.locator("#sv-spec .sv-text b").count() == 0
    assert made.first.get_attribute("aria-label") == "accepted draft token '<b>Paris</b>', target p 0.91, drafter q 0.80, step 1"
    made.first.focus()
    page.keyboard.press("ArrowRight")  # over the empty token, to the next one with text
    assert page.evaluate("document.activeElement.textContent") == " x"
    assert "no text of its own" in made.nth(1).get_attribute("aria-label")

    why = page.locator("#sv-headline details.sv-why")
    cards = page.locator("#sv-headline .sv-card")
    described = cards.evaluate_all("cs => cs.map(c => document.getElementById(c.getAttribute('aria-describedby'))"
                                   "?.textContent || '')")
    assert len(described) == 7 and all(len(d) > 10 for d in described)  # read by a screen reader, even closed
    why.locator("summary").focus()
    page.keyboard.press("Enter")  # a keyboard opens the explanations
    assert why.evaluate("d => d.open")
    assert "share of drafted tokens the target accepted" in why.inner_text()
    page.screenshot(path=str(OUT / "page-a11y-1280.png"), full_page=True)

    page.set_viewport_size(PHONE)
    page.evaluate("window.scrollTo(0, 0)")
    dd = why.locator("dd").nth(2)
    dd.scroll_into_view_if_needed()
    box = dd.bounding_box()
    assert dd.is_visible() and box["x"] + box["width"] <= PHONE["width"], box  # explained on the phone too
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 1
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(OUT / "page-a11y-390.png"), full_page=True)
    page.locator(".sv-skip a").nth(1).focus()  # a keyboard on the phone: Generate, on its screen
    page.keyboard.press("Enter")
    page.wait_for_function("document.activeElement.id === 'sv-generate'", timeout=HANG)
    generate = page.locator("#sv-generate").bounding_box()
    assert 0 <= generate["y"] and generate["y"] + generate["height"] <= PHONE["height"], generate  # on screen
    page.close()


FIRST_SCREEN = {"width": 1280, "height": 720}  # a classroom projector's


def test_a_class_sees_coloured_tokens_and_what_each_colour_means_on_the_first_screen(browser, url):
    """Issue 66 (6): the first screen at 1280 x 720 was words and settings, no coloured token until one
    scrolled. The header's picture of two steps shows every verdict's colour, each explained beside it,
    in light and dark, without scrolling; its tokens say their verdict in words and take no Tab stop."""
    page = browser.new_page(viewport=FIRST_SCREEN)
    page.goto(url)
    page.locator("#sv-generate").wait_for(timeout=HANG)
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        page.wait_for_function(f"document.body.classList.contains('dark') === {str(scheme == 'dark').lower()}",
                               timeout=HANG)
        page.evaluate("window.scrollTo(0, 0)")
        tokens = page.locator(".sv-primer .sv-primer-steps .tok")
        kinds = tokens.evaluate_all("ts => ts.map(t => [...t.classList].find(c => c.startsWith('tok-')))")
        assert set(kinds) == {"tok-accepted", "tok-rejected", "tok-corrected", "tok-bonus"}, kinds
        legend = page.locator(".sv-primer-legend li")
        for shown in (tokens, legend):
            boxes = shown.evaluate_all("es => es.map(e => e.getBoundingClientRect().toJSON())")
            assert all(0 <= b["top"] and b["bottom"] <= FIRST_SCREEN["height"] and b["right"] <= FIRST_SCREEN["width"]
                       for b in boxes), f"below the first screen in {scheme}: {boxes}"
        fills = tokens.evaluate_all("ts => ts.map(t => getComputedStyle(t).backgroundColor)")
        assert "rgba(0, 0, 0, 0)" not in fills, fills  # each token is coloured, not plain text
        said = legend.all_inner_texts()
        assert len(said) == 4 and all(len(s.split()) >= 4 for s in said), said  # each colour explained in words
        page.screenshot(path=str(OUT / f"page-first-screen-{scheme}.png"))
    assert tokens.evaluate_all("ts => ts.every(t => t.tabIndex < 0 && t.textContent.includes('('))")
    page.close()


def test_a_typed_value_out_of_its_sliders_range_is_said_under_its_box_with_the_value_used(browser, url):
    """Issue 66 (1): Gradio clamped k "-5" to 1 and max new tokens "99999" to the cap at the box's blur and
    said nothing; the run went ahead. The page says the API's sentence under the box and the value set.
    Screenshot: test-output/page-boxes.png."""
    page = browser.new_page(viewport=DESKTOP)
    page.goto(url)
    typed = {"#sv-k": "-5", "#sv-max-new-tokens": "99999"}
    for box, value in typed.items():
        page.locator(f"{box} input[type=number]").fill(value)
    page.locator("#sv-prompt textarea").fill(PROMPT)  # the boxes lose focus: Gradio clamps them there
    said = {"#sv-k": "k must be from 1 to 64, got -5: set to 1, the nearest allowed value.",
            "#sv-max-new-tokens": "max new tokens must be from 1 to 400, got 99999: set to 400, the nearest allowed "
                                  "value."}
    for box, sentence in said.items():
        page.wait_for_selector(f"{box} .sv-box-note", timeout=HANG)
        assert page.locator(f"{box} .sv-box-note").inner_text() == sentence
    assert page.locator("#sv-k input[type=number]").input_value() == "1"
    box = page.locator("#sv-max-new-tokens input[type=number]")
    assert box.input_value() == "400"
    box.fill("-0")
    box.press("Enter")
    page.wait_for_function("document.querySelector('#sv-max-new-tokens .sv-box-note').textContent.includes('-0')")
    assert page.locator("#sv-max-new-tokens .sv-box-note").inner_text() == (
        "max new tokens must be from 1 to 400, got -0: set to 1, the nearest allowed value.")
    page.screenshot(path=str(OUT / "page-boxes.png"), clip={"x": 0, "y": 0, "width": 520, "height": 900})
    page.locator("#sv-generate").click()
    page.wait_for_selector('#sv-status [data-state="done"]', timeout=HANG)
    assert "Done: 1 token each" in page.locator("#sv-status").inner_text()  # the value the box says was used
    box = page.locator("#sv-k input[type=number]")
    box.fill("4")
    box.press("Enter")
    page.wait_for_selector("#sv-k .sv-box-note", state="detached")  # a value in range: the sentence goes
    page.close()
