// The page's scripts, loaded once through Gradio's head (ui/serve.py, launch_options). Event handlers
// name the functions below (js="svHide"); the rest listen on the document, so they hold for every
// block however often it is redrawn. The words and limits they use are Python's, put on the page
// by ui/page.py's said(name, value) and read here with svData(name).

// Every value the page put under `name`, in page order.
function svData(name) {
  return [...document.querySelectorAll(`[data-sv="${name}"]`)].map((e) => JSON.parse(e.dataset.value));
}

// "hide rejected drafts" (ui/blocks/reading.py): the panel's wrapper outlives every redraw of its HTML.
// A hidden token cannot be the panel's Tab stop: the stop moves to the first token still shown.
function svHide(hide) {
  const spec = document.querySelector('#sv-spec');
  spec?.classList.toggle('sv-hide-rejected', hide);
  const list = spec?.querySelector('[role=listbox]'), stop = list?.querySelector('.tok[tabindex="0"]');
  if (stop && !stop.checkVisibility()) {
    const shown = [...list.querySelectorAll('.tok[tabindex]')].find((t) => t.checkVisibility());
    if (shown) { stop.tabIndex = -1; shown.tabIndex = 0; }
  }
  return hide;
}

// A run's status says "Stopping…" the moment Stop is pressed: a prefill piece or a step may take
// a moment to end, and a status still counting made a teacher press Stop again.
// Said again after any redraw until the run has ended: an update sent before the press could land after it
// and put the count back (CI once read "Drawn 1 of 500" where "Stopping…" had been written).
function svStopping() {
  window.svStopped ??= new Set();
  for (const status of document.querySelectorAll('.sv-status[data-state="running"], .sv-status[data-state="loading"]')) {
    status.querySelector('.sv-status-text').textContent = svData('stopping')[0];
    const box = status.closest('[id]');
    if (box) window.svStopped.add(box.id);
  }
}

svEachChange(() => {
  for (const id of window.svStopped || []) {
    const status = document.getElementById(id)?.querySelector('.sv-status');
    const text = status?.querySelector('.sv-status-text');
    if (!status || !['running', 'loading'].includes(status.dataset.state)) window.svStopped.delete(id);
    else if (text && text.textContent !== svData('stopping')[0]) text.textContent = svData('stopping')[0];
  }
});

// The status while an uploaded trace is read and checked (ui/blocks/replay.py): it said "Ready" for
// the 23 s a 23 MB file took.
function svReading() {
  const status = document.querySelector('#sv-status .sv-status');
  if (status) {
    status.dataset.state = 'loading';
    status.querySelector('.sv-status-text').textContent = svData('reading')[0];
  }
}

// What the page's scripts redo after the page changes: once an animation frame, however many
// changes came in it (a run's frame replaces many nodes at once).
function svEachChange(f) { (window.svRedo ??= []).push(f); }

if (!window.svListening) {
  window.svListening = true;
  let queued = false;
  const redo = () => { queued = false; (window.svRedo || []).forEach((f) => f()); };
  const watch = () => {
    new MutationObserver(() => {
      if (queued) return;
      queued = true;
      requestAnimationFrame(redo);
    }).observe(document.body, {childList: true, subtree: true});
    redo();
  };
  if (document.body) watch(); else document.addEventListener('DOMContentLoaded', watch);

  // Skip links (ui/layout.py SKIP): a link moves focus (an anchor alone only scrolls), opening the
  // Playground tab if another is shown.
  document.addEventListener('click', (e) => {
    const link = e.target.closest && e.target.closest('.sv-skip a[data-focus]');
    if (!link) return;
    e.preventDefault();
    let to = document.querySelector(link.dataset.focus);
    if (to && !to.checkVisibility()) {
      [...document.querySelectorAll('[role=tab]')].find((t) => t.textContent.trim() === 'Playground')?.click();
    }
    requestAnimationFrame(() => {
      to = document.querySelector(link.dataset.focus);
      if (!to) return;
      if (to.tabIndex < 0 && !to.hasAttribute('tabindex')) to.tabIndex = -1;  // the inspector, a chart: focusable
      to.focus({preventScroll: true});
      to.scrollIntoView({block: to.offsetHeight > innerHeight / 2 ? 'start' : 'center'});
    });
  });

  // The tokens' hover cards, opened by keyboard and touch as well as by the mouse (ui/blocks/reading.py):
  // a tap or Enter on a token pins its card open (again: closes it); Escape or a tap elsewhere closes it.
  // Keyboard focus shows a card through the stylesheet (assets/style.css, .tok:focus-visible).
  const close = (keep) => document.querySelectorAll('.tok.sv-tip-open').forEach((t) => t !== keep && t.classList.remove('sv-tip-open'));
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
  // A run's text is one listbox (render/html.py token_list): one Tab stop, and the arrow keys, Home
  // and End move between its tokens, carrying the stop with them (the "roving tabindex" pattern).
  // The token last focused (by keys, a click or a tap) is where Tab returns.
  const rove = (from, to) => { from.tabIndex = -1; to.tabIndex = 0; to.focus(); };
  document.addEventListener('focusin', (e) => {
    const tok = token(e), list = tok && tok.closest('[role=listbox]');
    if (!list || tok.tabIndex !== -1) return;
    list.querySelectorAll('.tok[tabindex="0"]').forEach((t) => { t.tabIndex = -1; });
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
      const all = [...list.querySelectorAll('.tok[tabindex]')].filter((t) => t.checkVisibility());
      const at = all.indexOf(tok);
      const to = e.key === 'Home' ? all[0] : e.key === 'End' ? all[all.length - 1]
        : all[Math.min(Math.max(at + STEP[e.key], 0), all.length - 1)];
      if (to && to !== tok) { close(null); rove(tok, to); }
    }
  });

  // Every plotly chart on the page (the Playground's, Compare's, Serving's, the views') is an image to a
  // screen reader, named by its title and what it draws, in words: each series' points when there are
  // few (a bar per run, per position), else their count, range and last value. Drawn from the figure
  // the browser holds, so it is said again whenever a chart is redrawn, whatever drew it.
  // A title's markup to words, in an inert document; values (tokens among them) are text as they are.
  const plain = (t) => new DOMParser().parseFromString(String(t ?? '').replace(/<br\s*\/?>/gi, ': '), 'text/html')
    .body.textContent.replace(/\s+/g, ' ').trim();
  const num = (v) => typeof v !== 'number' ? String(v).trim() : Number.isInteger(v) ? String(v) : String(+v.toPrecision(3));
  const title = (axis) => plain(axis && axis.title && axis.title.text);
  const describe = (gd) => {
    const layout = gd.layout || {}, notes = (layout.annotations || []).map((a) => plain(a.text)), said = [];
    (gd.data || []).forEach((t) => {
      const across = t.orientation === 'h', at = (across ? t.y : t.x) || [], vals = [...((across ? t.x : t.y) || [])];
      if (!vals.length) return;
      // a series without a name is named by its subplot's title (Compare's alpha, tau, passes)
      const sub = Number(String(t.xaxis || 'x').slice(1) || 1) - 1;
      const name = plain(t.name) || (notes.length > 1 && notes[sub]) || title(layout[across ? 'xaxis' : 'yaxis']) || 'values';
      const xs = title(layout[across ? 'yaxis' : 'xaxis']) || 'x';
      if (vals.length <= 12) said.push(`${name}: ${vals.map((v, j) => `${num(at[j])} ${num(v)}`).join(', ')}`);
      else {
        const ys = vals.filter((v) => typeof v === 'number');
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
  svEachChange(() => document.querySelectorAll('.js-plotly-plot').forEach((gd) => {
    if (gd.svSaid !== gd.data) { gd.svSaid = gd.data; describe(gd); }
  }));

  // Two of Gradio's own blocks that axe-core flags (WCAG 2.1 AA), put right wherever they appear: an
  // empty plot is a div named "Empty value" with no role (aria-prohibited-attr), so it becomes an
  // image by that name; a file box's button is named "Click to upload or drop files" while it reads
  // "Drop File Here - or - Click to Upload" (label-content-name-mismatch, WCAG 2.5.3), so its name is
  // what it reads.
  svEachChange(() => {
    document.querySelectorAll('.empty[aria-label]:not([role])').forEach((e) => e.setAttribute('role', 'img'));
    document.querySelectorAll('.upload-container[aria-label]').forEach((e) => e.removeAttribute('aria-label'));
  });

  // The sliders' number boxes, checked as the API checks their values, with a sentence beside the box.
  // Gradio's slider clamps a typed value into its range when the box loses focus (k "-5" ran as 1, max
  // new tokens "99999" as the cap, "1e400" as 64) and says nothing: the run went ahead with a value the
  // reader never saw named. The API refuses the same values in a sentence (run/settings.py's Bounds).
  // Here the page says that sentence under the box, before Gradio clamps, and then the value it was set
  // to: "k must be from 1 to 64, got -5: set to 1, the nearest allowed value." A value Gradio leaves as
  // typed (k 2.5) reaches the server, which refuses it in the status. The fields are named as sentences
  // name them (said 'box-names': a slider's elem_id -> "top-p"; others by their label).
  const g = (n) => String(Number(n.toPrecision(6)));  // as Python's :g writes a bound
  const shortened = (t) => t.length <= 40 ? t : t.slice(0, 37) + '...';
  const nameOf = (input) => {
    const block = input.closest('[id^="sv-"]'), names = svData('box-names')[0] || {};
    if (block && names[block.id]) return names[block.id];
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
  // A capturing listener on the document runs before the slider's own on its box's change (or Enter).
  const numberBox = (t) => t instanceof HTMLInputElement && t.type === 'number' && t.dataset.testid === 'number-input';
  document.addEventListener('change', (e) => { if (numberBox(e.target)) check(e.target); }, true);
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && numberBox(e.target)) check(e.target);
  }, true);

  // Uploads the app refuses in its own sentence, before a file is sent (ui/blocks/uploads.py, said
  // 'upload-rule': a file box, its limit, the sentence and the status blocks it is said in). A
  // capturing listener on the document runs before Gradio's own on the file box's input (or drop).
  const mb = (n) => (n / 1e6).toFixed(1).replace(/\.0$/, '') + ' MB';
  const refuse = (e, file, rule) => {
    e.preventDefault();
    e.stopImmediatePropagation();
    const said = rule.sentence.replace('{name}', file.name).replace('{size}', mb(file.size));
    for (const where of rule.shown_in) {
      const box = document.querySelector(where + ' .prose');
      if (!box) continue;
      box.innerHTML = rule.status;
      box.querySelector('.sv-status-text').textContent = said;  // text, never markup: a file name is anyone's
    }
  };
  const ruleOf = (e) => e.target.closest && svData('upload-rule').find((rule) => e.target.closest(rule.box));
  const over = (files, rule) => [...(files || [])].find((f) => f.size > rule.limit);
  document.addEventListener('change', (e) => {
    const rule = e.target.type === 'file' && ruleOf(e), file = rule && over(e.target.files, rule);
    if (file) { refuse(e, file, rule); e.target.value = ''; }
  }, true);
  document.addEventListener('drop', (e) => {
    const rule = ruleOf(e), file = rule && over(e.dataTransfer && e.dataTransfer.files, rule);
    if (file) refuse(e, file, rule);
  }, true);
}
