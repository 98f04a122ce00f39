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
  document.addEventListener('click', (e) => {
    const tok = e.target.closest && e.target.closest('.tok[data-tip]');
    close(tok);
    if (tok) tok.classList.toggle('sv-tip-open');
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
