"""Uploads the app refuses in its own sentence, said in the browser before a file is sent.

Gradio checks its upload limit (launch's max_file_size) in the browser and answers a file over
it with a red "Error" in the file box while the page's status still says "Ready"; a file under
Gradio's limit but over the app's was sent whole, then refused. So the page checks the app's own
limit first: a file over it is never sent, and the sentence the server would say appears in the
status lines named. The server keeps its check (a script does not run this).
"""
from __future__ import annotations

import json

import gradio as gr

from ...render.status import megabytes, status_html

# A capturing listener on the document runs before Gradio's own on the file box's input (or drop).
GUARD = """
window.svGuards = window.svGuards || {};
if (!window.svGuards[RULE.box]) {
  window.svGuards[RULE.box] = true;
  const mb = (n) => (n / 1e6).toFixed(1).replace(/\\.0$/, '') + ' MB';
  const refuse = (e, file) => {
    e.preventDefault();
    e.stopImmediatePropagation();
    const said = RULE.sentence.replace('{name}', file.name).replace('{size}', mb(file.size));
    for (const where of RULE.shown_in) {
      const box = document.querySelector(where + ' .prose');
      if (!box) continue;
      box.innerHTML = RULE.status;
      box.querySelector('.sv-status-text').textContent = said;  // text, never markup: a file name is anyone's
    }
  };
  const over = (files) => [...(files || [])].find(f => f.size > RULE.limit);
  const inside = (e) => e.target.closest && e.target.closest(RULE.box);
  document.addEventListener('change', (e) => {
    if (!inside(e) || e.target.type !== 'file') return;
    const file = over(e.target.files);
    if (file) { refuse(e, file); e.target.value = ''; }
  }, true);
  document.addEventListener('drop', (e) => {
    const file = inside(e) && over(e.dataTransfer && e.dataTransfer.files);
    if (file) refuse(e, file);
  }, true);
}
"""


def guard(box: str, limit: int, sentence, shown_in: tuple[str, ...]) -> gr.HTML:
    """Refuse files over `limit` bytes dropped or chosen in the file box `box` (a CSS selector),
    in the browser: sentence(name, size, limit) says why, as the server would (sizes as
    megabytes() says them), in the status blocks `shown_in`."""
    rule = dict(box=box, limit=limit, shown_in=list(shown_in), status=status_html("", "error"),
                sentence=sentence("{name}", "{size}", megabytes(limit)))
    return gr.HTML("", js_on_load=f"const RULE = {json.dumps(rule)};\n{GUARD}", container=False,
                   elem_classes="sv-hidden")
