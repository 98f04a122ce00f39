"""Reading the panels: a "hide rejected drafts" switch, and the tokens' hover cards opened
by keyboard and touch as well as by the mouse.

Both happen in the browser only (no request, no re-run): the switch puts a CSS class on the
speculative panel, and one small script lets a tap (or Enter) pin a token's card open;
keyboard focus shows it through the stylesheet (assets/style.css, .tok:focus-visible).
"""
from __future__ import annotations

import gradio as gr

# Run in the browser when the switch changes: the panel's wrapper outlives every redraw of its HTML.
HIDE = "(hide) => { document.querySelector('#sv-spec')?.classList.toggle('sv-hide-rejected', hide); return hide; }"
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
  document.addEventListener('keydown', (e) => {
    const tok = e.target.closest && e.target.closest('.tok[data-tip]');
    if (e.key === 'Escape') close(null);
    else if (tok && (e.key === 'Enter' || e.key === ' ')) { e.preventDefault(); close(tok); tok.classList.toggle('sv-tip-open'); }
  });
}
"""


def controls() -> gr.Checkbox:
    hide = gr.Checkbox(False, label="hide rejected drafts", elem_id="sv-hide-rejected", container=False,
                       info="show only the text the run kept")
    hide.change(None, hide, hide, js=HIDE, queue=False, api_visibility="private")
    gr.HTML("", js_on_load=CARDS, elem_id="sv-cards-script", container=False, elem_classes="sv-hidden")
    return hide
