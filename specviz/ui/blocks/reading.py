"""Reading the panels: a "hide rejected drafts" switch, and the tokens' hover cards opened
by keyboard and touch as well as by the mouse.

Both happen in the browser only (no request, no re-run): the switch puts a CSS class on the
speculative panel, and one small script lets a tap (or Enter) pin a token's card open;
keyboard focus shows it through the stylesheet (assets/style.css, .tok:focus-visible). A run's
text is one listbox (render/html.py token_list): one Tab stop, and the arrow keys, Home and End
move between its tokens, carrying the Tab stop with them (the "roving tabindex" pattern).
"""
from __future__ import annotations

import gradio as gr

# Run in the browser when the switch changes: the panel's wrapper outlives every redraw of its HTML.
# A hidden token cannot be the panel's Tab stop: the stop moves to the first token still shown.
HIDE = """(hide) => {
  const spec = document.querySelector('#sv-spec');
  spec?.classList.toggle('sv-hide-rejected', hide);
  const list = spec?.querySelector('[role=listbox]'), stop = list?.querySelector('.tok[tabindex="0"]');
  if (stop && !stop.checkVisibility()) {
    const shown = [...list.querySelectorAll('.tok[tabindex]')].find(t => t.checkVisibility());
    if (shown) { stop.tabIndex = -1; shown.tabIndex = 0; }
  }
  return hide;
}"""
# A tap or Enter on a token pins its card open (again: closes it); Escape or a tap elsewhere closes it.
CARDS = """
if (!window.svCards) {
  window.svCards = true;
  const close = (keep) => document.querySelectorAll('.tok.sv-tip-open').forEach(t => t !== keep && t.classList.remove('sv-tip-open'));
  // Keep a card inside its token's panel: as wide as the panel at most, shifted left when the
  // token sits near the panel's right edge (on a phone the cards ran off the screen).
  const place = (tok) => {
    const panel = tok.closest('.sv-panel');
    if (!panel) return;
    const box = panel.getBoundingClientRect(), pad = 8;
    tok.style.setProperty('--sv-tip-max', `${Math.max(box.width - 2 * pad, 120)}px`);
    tok.style.setProperty('--sv-tip-x', '0px');
    requestAnimationFrame(() => {
      const card = getComputedStyle(tok, '::after');
      if (card.content === 'none') return;
      const left = tok.getBoundingClientRect().left, width = parseFloat(card.width);
      tok.style.setProperty('--sv-tip-x', `${Math.max(box.left + pad - left, Math.min(0, box.right - pad - left - width))}px`);
    });
  };
  const token = (e) => e.target.closest && e.target.closest('.tok[data-tip]');
  document.addEventListener('pointerover', (e) => { const tok = token(e); if (tok) place(tok); });
  document.addEventListener('focusin', (e) => { const tok = token(e); if (tok) place(tok); });
  document.addEventListener('click', (e) => {
    const tok = token(e);
    close(tok);
    if (tok) { tok.classList.toggle('sv-tip-open'); place(tok); }
  });
  // The roving Tab stop: the token last focused (by keys, a click or a tap) is where Tab returns.
  const rove = (from, to) => { from.tabIndex = -1; to.tabIndex = 0; to.focus(); };
  document.addEventListener('focusin', (e) => {
    const tok = token(e), list = tok && tok.closest('[role=listbox]');
    if (!list || tok.tabIndex !== -1) return;
    list.querySelectorAll('.tok[tabindex="0"]').forEach(t => { t.tabIndex = -1; });
    tok.tabIndex = 0;
  });
  const STEP = {ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1};
  document.addEventListener('keydown', (e) => {
    const tok = e.target.closest && e.target.closest('.tok[data-tip]');
    if (e.key === 'Escape') close(null);
    else if (tok && (e.key === 'Enter' || e.key === ' ')) { e.preventDefault(); close(tok); tok.classList.toggle('sv-tip-open'); }
    else if (tok && (e.key in STEP || e.key === 'Home' || e.key === 'End')) {
      const list = tok.closest('[role=listbox]');
      if (!list) return;
      e.preventDefault();
      // every token that can take focus and is shown ("hide rejected drafts" hides some)
      const all = [...list.querySelectorAll('.tok[tabindex]')].filter(t => t.checkVisibility());
      const at = all.indexOf(tok);
      const to = e.key === 'Home' ? all[0] : e.key === 'End' ? all[all.length - 1]
        : all[Math.min(Math.max(at + STEP[e.key], 0), all.length - 1)];
      if (to && to !== tok) { close(null); rove(tok, to); }
    }
  });
}
"""

# Every plotly chart on the page (the Playground's, Compare's, Serving's, the views') is an image to a
# screen reader, named by its title and what it draws, in words: each series' points when there are
# few (a bar per run, per position), else their count, range and last value. Drawn from the figure
# the browser holds, so it is said again whenever a chart is redrawn, whatever drew it.
# What the page's scripts redo after the page changes: once an animation frame, however many
# changes came in it (a run's frame replaces many nodes at once).
EACH_CHANGE = """
if (!window.svEachChange) {
  const redo = [];
  let queued = false;
  new MutationObserver(() => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; redo.forEach(f => f()); });
  }).observe(document.body, {childList: true, subtree: true});
  window.svEachChange = (f) => redo.push(f);
}
"""
CHARTS = """
if (!window.svCharts) {
  window.svCharts = true;
  // a title's markup to words, in an inert document; values (tokens among them) are text as they are
  const plain = (t) => new DOMParser().parseFromString(String(t ?? '').replace(/<br\\s*\\/?>/gi, ': '), 'text/html')
    .body.textContent.replace(/\\s+/g, ' ').trim();
  const num = (v) => typeof v !== 'number' ? String(v).trim() : Number.isInteger(v) ? String(v) : String(+v.toPrecision(3));
  const title = (axis) => plain(axis && axis.title && axis.title.text);
  const describe = (gd) => {
    const layout = gd.layout || {}, notes = (layout.annotations || []).map(a => plain(a.text)), said = [];
    (gd.data || []).forEach((t, i) => {
      const across = t.orientation === 'h', at = (across ? t.y : t.x) || [], vals = [...((across ? t.x : t.y) || [])];
      if (!vals.length) return;
      // a series without a name is named by its subplot's title (Compare's alpha, tau, passes)
      const sub = Number(String(t.xaxis || 'x').slice(1) || 1) - 1;
      const name = plain(t.name) || (notes.length > 1 && notes[sub]) || title(layout[across ? 'xaxis' : 'yaxis']) || 'values';
      const xs = title(layout[across ? 'yaxis' : 'xaxis']) || 'x';
      if (vals.length <= 12) said.push(`${name}: ${vals.map((v, j) => `${num(at[j])} ${num(v)}`).join(', ')}`);
      else {
        const ys = vals.filter(v => typeof v === 'number');
        said.push(`${name}: ${vals.length} points, ${xs} ${num(at[0])} to ${num(at[at.length - 1])}, ` +
                  `from ${num(Math.min(...ys))} to ${num(Math.max(...ys))}, last ${num(vals[vals.length - 1])}`);
      }
    });
    const axes = [title(layout.yaxis), title(layout.xaxis)].filter(Boolean).join(' against ');
    const what = said.length ? said : notes;  // nothing drawn yet: the chart's own message
    gd.setAttribute('role', 'img');
    gd.setAttribute('aria-label', `Chart: ${plain(layout.title && layout.title.text) || 'untitled'}` +
                    (axes && said.length ? ` (${axes})` : '') + (what.length ? `. ${what.join('. ')}.` : '.'));
  };
  svEachChange(() => document.querySelectorAll('.js-plotly-plot').forEach(gd => {
    if (gd.svSaid !== gd.data) { gd.svSaid = gd.data; describe(gd); }
  }));
}
"""


# Two of Gradio's own blocks that axe-core flags (WCAG 2.1 AA), put right wherever they appear: an
# empty plot is a div named "Empty value" with no role (aria-prohibited-attr), so it becomes an
# image by that name; a file box's button is named "Click to upload or drop files" while it reads
# "Drop File Here - or - Click to Upload" (label-content-name-mismatch, WCAG 2.5.3), so its name is
# what it reads.
GRADIO_NAMES = """
if (!window.svGradioNames) {
  window.svGradioNames = true;
  svEachChange(() => {
    document.querySelectorAll('.empty[aria-label]:not([role])').forEach(e => e.setAttribute('role', 'img'));
    document.querySelectorAll('.upload-container[aria-label]').forEach(e => e.removeAttribute('aria-label'));
  });
}
"""


def controls() -> gr.Checkbox:
    hide = gr.Checkbox(False, label="hide rejected drafts", elem_id="sv-hide-rejected", container=False,
                       info="show only the text the run kept")
    hide.change(None, hide, hide, js=HIDE, queue=False, api_visibility="private")
    gr.HTML("", js_on_load=CARDS + EACH_CHANGE + CHARTS + GRADIO_NAMES, elem_id="sv-cards-script", container=False, elem_classes="sv-hidden")
    return hide
