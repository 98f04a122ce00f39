"""The sliders' number boxes, checked as the API checks their values, with a sentence beside the box.

Gradio's slider clamps a typed value into its range when the box loses focus (k "-5" ran as 1, max
new tokens "99999" as the cap, "1e400" as 64) and says nothing: the run went ahead with a value the
reader never saw named. The API refuses the same values in a sentence (run/settings.py's Bounds).
Here the page says that sentence under the box, before Gradio clamps, and then the value it was set
to: "k must be from 1 to 64, got -5: set to 1, the nearest allowed value." A value Gradio leaves as
typed (k 2.5) reaches the server, which refuses it in the status.
"""
from __future__ import annotations

import json

import gradio as gr

# A capturing listener on the document runs before the slider's own on its box's change (or Enter).
GUARD = """
if (!window.svBoxes) {
  window.svBoxes = true;
  const g = (n) => String(Number(n.toPrecision(6)));  // as Python's :g writes a bound
  const shortened = (t) => t.length <= 40 ? t : t.slice(0, 37) + '...';
  const nameOf = (input) => {
    const block = input.closest('[id^="sv-"]');
    if (block && NAMES[block.id]) return NAMES[block.id];
    return (input.getAttribute('aria-label') || 'this box').replace(/^number input for /, '');
  };
  const noteOf = (input, make) => {
    const block = input.closest('.block') || input.parentElement;
    let note = block.querySelector(':scope > .sv-box-note');
    if (!note && make) {
      note = document.createElement('p');
      note.className = 'sv-box-note';
      note.setAttribute('role', 'status');
      block.appendChild(note);
    }
    return note;
  };
  const check = (input) => {
    const typed = input.value.trim(), low = parseFloat(input.min), high = parseFloat(input.max);
    const value = typed === '' ? NaN : Number(typed);
    if (value >= low && (isNaN(high) || value <= high)) {  // in range (or NaN: refused below)
      noteOf(input, false)?.remove();
      return;
    }
    const range = isNaN(high) ? `at least ${g(low)}` : `from ${g(low)} to ${g(high)}`;
    // Chromium empties a box whose text is no number it can hold ("1e400"): said as such, not as nothing
    const got = typed !== '' ? shortened(typed) : input.validity.badInput
      ? 'a number too large to hold' : 'nothing';
    const set = isNaN(value) ? low : Math.min(Math.max(value, low), isNaN(high) ? Infinity : high);
    setTimeout(() => {  // the box shows the value the run will use, and the slider holds it (an input event)
      input.value = String(set);
      input.dispatchEvent(new Event('input', {bubbles: true}));
      const which = isNaN(value) ? 'the lowest' : 'the nearest';
      noteOf(input, true).textContent =
        `${nameOf(input)} must be ${range}, got ${got}: set to ${g(set)}, ${which} allowed value.`;
    }, 0);
  };
  const numberBox = (t) => t instanceof HTMLInputElement && t.type === 'number' && t.dataset.testid === 'number-input';
  document.addEventListener('change', (e) => { if (numberBox(e.target)) check(e.target); }, true);
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && numberBox(e.target)) check(e.target);
  }, true);
}
"""


def guard(names: dict[str, str]) -> gr.HTML:
    """Check every slider's number box on the page; `names`: a slider's elem_id -> the field as
    sentences name it ("top-p"; others by their label)."""
    return gr.HTML("", js_on_load=f"const NAMES = {json.dumps(names)};\n{GUARD}", container=False,
                   elem_classes="sv-hidden")
