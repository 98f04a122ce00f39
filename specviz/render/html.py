"""HTML for the text panels: every token a <span> coloured by what happened to it.

Colours come from the event that produced a token (accepted draft, rejected draft, the
target's corrected token, the bonus token, a baseline token; which tokens show, and as
what, is kinds.shown_tokens, shared with the terminal), never from searching the
decoded text. All model text is HTML-escaped; whitespace is kept by `white-space:
pre-wrap` in the stylesheet (assets/style.css), so code keeps its layout, and each token is
one inline box; a word's tokens are held together in an `sv-word` span (see `words`), so
lines break where the text has whitespace, not inside "Java|Script"; a token holding a line
break is marked `tok-nl` and flows inline, so its break is a break. The end-of-turn token that
ended a run is not text: a small "end of answer" mark stands after the text instead.

Each token element carries `data-kind` (accepted | rejected | corrected | bonus | baseline),
`data-step` and `data-tip` (the hover card's text) for the stylesheet, tests and scripts. A run's
text is one ARIA listbox and each token an option in it (`token_list`): the whole panel is one Tab
stop, and the arrow keys, Home and End move between its tokens (ui/blocks/reading.py), where a token a
Tab stop each put the step inspector ~100 Tab presses past Generate. A screen reader hears a
token's `aria-label`, built from the same event as the card: "accepted draft token 'Paris',
target p 0.91, drafter q 0.80, step 3", not only "Paris". A token that shows no text (the first
bytes of a character that a later token completes) is labelled but never focused.
"""
from __future__ import annotations

import re
from html import escape

from ..core.events import StepEvent, TokenEvent
from .kinds import ended_at, shown_tokens
from .trace import Labels, Trace

# Shown in the legend and in the README; the stylesheet gives each kind its colour
# (Okabe-Ito, safe for colour-blind readers) and a second cue that is not colour.
KIND_HELP = {
    "accepted": "draft token the target agreed with",
    "rejected": "draft token the target threw away (struck through, shown where it was proposed)",
    "corrected": "the target's own token in place of the first rejected draft",
    "bonus": "free extra token from the same target pass after every draft was accepted",
    "baseline": "plain decoding, one target pass per token",
}
# Drafted text is not part of the output, so its line breaks must not move the layout.
VISIBLE_WHITESPACE = str.maketrans({"\n": "↵", "\t": "⇥", "\r": "␍"})
SPACE_MARK = "␣"
WORD_CHARS = 40  # a run of tokens longer than this (a URL, a rule of ====) may still break between them
# Tokens drawn one by one while a run is part-shown (views.playground_values): more than a screen of a
# panel holds at 1280 px, and a fixed cost per frame however long the run (tokens_html's window).
WINDOW = 256
END_MARK = ('<span class="sv-end" title="The model ended its answer here with its end-of-turn token, '
            'which is not part of the text">end of answer</span>')


def visible(text: str) -> str:
    """Text that is not output (a draft, a table cell), with its whitespace made visible: line
    breaks and tabs always, spaces when they are all there is (an empty-looking cell)."""
    shown = text.translate(VISIBLE_WHITESPACE)
    return shown.replace(" ", SPACE_MARK) if shown and not shown.strip(" ") else shown


def token_span(kind: str, text: str, tip: str, step: int, extra_class: str = "", label: str = "") -> str:
    """One token element, an option of its run's listbox (token_list). `text`, `tip` and `label`
    (what a screen reader says for it) are model-derived and therefore escaped. A token with no
    text to show is never focused: its card still opens on hover and tap, and its label says
    what it is."""
    classes = f"tok tok-{kind}" + (f" {extra_class}" if extra_class else "") + (" tok-nl" if "\n" in text else "")
    name = f' aria-label="{escape(label, quote=True)}"' if label else ""
    return (
        f'<span class="{classes}" data-kind="{kind}" data-step="{step}" {token_focus(text)}{name} '
        f'data-tip="{escape(tip, quote=True)}">{escape(text, quote=False)}</span>'
    )


def token_focus(text: str) -> str:
    """A token's role and focus: an option of its run's listbox, focused by the arrow keys (tabindex
    -1; token_list makes one of them the panel's Tab stop); with no text, an option never focused."""
    return 'role="option" tabindex="-1"' if text else 'role="option"'


# The first token a Tab lands on: the first that can be focused and is not a rejected draft ("hide
# rejected drafts" may hide those, and a hidden Tab stop would leave the panel unreachable).
_FIRST_STOP = re.compile(r'(<span class="tok tok-(?!rejected)[^"]*"[^>]*? tabindex=")-1"')
_ANY_STOP = re.compile(r'( tabindex=")-1"')


def token_list(spans: list[str], label: str, run: str = "", before: str = "") -> str:
    """A run's tokens as one ARIA listbox named `label`: one Tab stop (its first kept token), the
    arrow keys between tokens (ui/blocks/reading.py moves the stop); `before`, the text before them when
    only the last are drawn (tokens_html's window)."""
    body = "".join(spans)
    body, found = _FIRST_STOP.subn(r'\g<1>0"', body, count=1)
    if not found:
        body = _ANY_STOP.sub(r'\g<1>0"', body, count=1)
    data = f' data-run="{escape(run)}"' if run else ""
    return (f'<div class="sv-text" role="listbox" aria-orientation="horizontal" '
            f'aria-label="{escape(label, quote=True)}"{data}>{before}{body}</div>')


WHITESPACE_NAMES = {" ": ("space", "spaces"), "\n": ("line break", "line breaks"), "\t": ("tab", "tabs"),
                    "\r": ("carriage return", "carriage returns")}


def spoken(text: str) -> str:
    """A token's text as a screen reader should hear it: quoted, or its whitespace named ("(2 spaces)",
    "(line break)"), or that it is a piece of a character a later token completes."""
    if not text:
        return "with no text of its own (a piece of a character, shown with the token that completes it)"
    if text.strip():
        return f"'{text}'"
    names = []
    for c in text:
        one, many = WHITESPACE_NAMES.get(c, ("blank", "blanks"))
        if names and names[-1][0] == one:
            names[-1][2] += 1
        else:
            names.append([one, many, 1])
    return "(" + ", ".join(one if n == 1 else f"{n} {many}" for one, many, n in names) + ")"


def _two(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.2f}"


# The words for what a drafter without probabilities gives, and for the residual, everywhere they show.
NO_Q = "none: this drafter proposes tokens without probabilities (prompt lookup copies them)"
RESIDUAL = "norm(max(0, p − q))"
RESIDUAL_GLOSS = "where the target wanted a token more than the drafter did, rescaled to sum to 1"
# A sampled tree's rule, the sibling walk (docs/exactness.md): its children are chosen, not drawn,
# so each is a one-hot guess and there is no ratio to take.
WALK_RULE = "the children are tried in order, each a one-hot guess: child x is kept if u < p′(x)"
WALK_RESIDUAL = ("after a refusal p′(x) = 0 and p′ is renormalised: the next child's p′ is p without the "
                 "refused children, divided by the mass of p they leave")

# The legend above the panels: one line on a wide screen; the full sentence is its tooltip.
KIND_SHORT = {"accepted": "kept draft", "rejected": "refused draft", "corrected": "target's own token",
              "bonus": "free extra token", "baseline": "plain decoding"}


def legend_html(kinds=("accepted", "rejected", "corrected", "bonus", "baseline"), short: bool = False) -> str:
    items = "".join(
        f'<span class="sv-legend-item" role="listitem" title="{escape(KIND_HELP[k])}">'
        f'<span class="tok tok-{k} sv-swatch">{k}</span>'
        f'<span class="sv-legend-text">{escape(KIND_SHORT[k] if short else KIND_HELP[k])}</span></span>'
        for k in kinds
    )
    return f'<div class="sv-legend" role="list" aria-label="token colours">{items}</div>'


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _draft_tip(e: StepEvent, i: int, verdict: str) -> str:
    head = f"step {e.step + 1} · draft {i + 1} of {len(e.draft)} · {verdict}"
    q = _fmt(e.q[i]) if e.q is not None else NO_Q if e.greedy else "1 (one-hot: a token, no distribution)"
    lines = [head, f"p (target) = {_fmt(e.p[i])}   q (drafter) = {q}"]
    if e.greedy:
        lines.append("greedy: kept only if it is the target's top token")
    elif e.tree is not None:  # a tree's child: the sibling walk's p′(x), no ratio
        lines.append(f"p′(x) when tried = {_fmt(e.accept_prob[i])}   draw u = {_fmt(e.draws[i])}"
                     "   (a tree's child: kept if u < p′(x))")
    else:
        lines.append(f"accept prob min(1, p/q) = {_fmt(e.accept_prob[i])}   draw u = {_fmt(e.draws[i])}")
    return "\n".join(lines)


def _draft_label(e: StepEvent, i: int, kind: str, text: str) -> str:
    """What a screen reader says for draft i: its verdict, text and numbers (the card's, shorter)."""
    verdict = kind if i <= e.accepted else "unchecked"
    q = (f"drafter q {_two(e.q[i])}" if e.q is not None else
         "drafter gave no probability" if e.greedy else "drafter q 1 (one-hot)")
    said = f"{verdict} draft token {spoken(text)}, target p {_two(e.p[i])}, {q}"
    if i > e.accepted:
        said += ", not checked: it came after the first rejection"
    if not e.greedy and i <= e.accepted:
        u = "" if e.draws is None else f", draw u {_two(e.draws[i])}"
        said += f", acceptance probability {_two(e.accept_prob[i])}{u}"
    return f"{said}, step {e.step + 1}"


def _own_label(e: StepEvent, text: str) -> str:
    what = ("target's own token (nothing drafted)" if not e.draft else
            "bonus token (every draft accepted)" if e.token_kind == "bonus" else "target's corrected token")
    return f"{what} {spoken(text)}, target p {_two(e.token_p)}, step {e.step + 1}"


def _draft_verdict(e: StepEvent, i: int) -> str:
    if i < e.accepted:
        return "accepted"
    if i == e.accepted:
        if e.greedy:
            return "rejected"
        return "rejected (u ≥ p′(x))" if e.tree is not None else "rejected (u ≥ min(1, p/q))"
    return "discarded: after the first rejection"


def _own_tip(e: StepEvent) -> str:
    if not e.draft:
        what = "nothing was drafted: the target's own token"
    elif e.token_kind == "bonus":
        what = "bonus: every draft accepted, the same target pass gives one more token"
    else:
        what = "corrected: the target's token in place of the rejected draft"
        if not e.greedy and e.tree is not None:  # the sibling walk's final p′, not p − q
            what += ", drawn from the final p′: p without the children the walk refused, renormalised"
        elif not e.greedy:
            what += f", drawn from the residual {RESIDUAL}: {RESIDUAL_GLOSS}"
    return f"step {e.step + 1} · {what}\np (target) = {_fmt(e.token_p)}"


def _step_pieces(e: StepEvent, labels: Labels, eos=frozenset()) -> list[tuple[str, str]]:
    """(shown text, element) per token of step_spans."""
    texts = labels.draft + (labels.token,)
    pieces = []
    for kind, i in shown_tokens(e, eos):
        if kind == "accepted":
            pieces.append((texts[i], token_span(kind, texts[i], _draft_tip(e, i, "accepted"), e.step,
                                                label=_draft_label(e, i, kind, texts[i]))))
        elif kind == "rejected":
            text = visible(texts[i])
            pieces.append((text, token_span(kind, text, _draft_tip(e, i, _draft_verdict(e, i)), e.step,
                                            label=_draft_label(e, i, kind, texts[i]))))
        else:
            pieces.append((texts[i], token_span(kind, texts[i], _own_tip(e), e.step, "" if e.draft else "undrafted",
                                                label=_own_label(e, texts[i]))))
    return pieces


def step_spans(e: StepEvent, labels: Labels, eos=frozenset()) -> list[str]:
    """A speculative step in reading order: accepted drafts, rejected drafts, the target's token
    (an end-of-turn token in `eos` that was output is left out: it is not text)."""
    return [html for _, html in _step_pieces(e, labels, eos)]


# One step played in phases (ui/blocks/stepping.py): its drafts pending, then being checked, then judged,
# then the whole step. The names are stepping.phases' own.
# A sampled tree's sibling walk is played child by child between verify and accept/reject: the
# drafts stay boxed while the walk judges them.
PHASE_KINDS = {"draft": "drafted", "verify": "checking", "sibling walk": "checking"}
PHASE_TIPS = {"draft": "drafted: not yet checked by the target",
              "verify": "being checked: the target scores every draft in one forward pass",
              "sibling walk": "being judged: the sibling walk tries each node's children in order"}


def phase_spans(e: StepEvent, labels: Labels, phase: str) -> list[str]:
    """Step `e` as it stands in `phase`: draft and verify show every draft pending (drafted
    text is not output yet, so its whitespace is shown, as a rejected draft's is);
    accept/reject shows the verdicts without the target's token; correction or bonus, the
    whole step, as step_spans draws it. A sampled tree's sibling walk shows them being checked."""
    if phase in PHASE_KINDS:
        kind, tip = PHASE_KINDS[phase], PHASE_TIPS[phase]
        return [token_span(kind, visible(text), f"step {e.step + 1} · draft {i + 1} of {len(e.draft)} · {tip}",
                           e.step, label=f"draft token {spoken(text)}, {tip}, step {e.step + 1}")
                for i, text in enumerate(labels.draft)]
    spans = step_spans(e, labels)
    if phase == "accept/reject":
        return [s for (kind, _), s in zip(shown_tokens(e), spans) if kind in ("accepted", "rejected")]
    return spans


def baseline_span(e: TokenEvent, labels: Labels) -> str:
    return token_span("baseline", labels.token, f"token {e.step + 1} · p (target) = {_fmt(e.p)}", e.step,
                      label=f"baseline token {spoken(labels.token)}, target p {_two(e.p)}, token {e.step + 1}")


def words(pieces: list[tuple[str, str]]) -> list[str]:
    """Elements with each word's tokens held together: a line may break between tokens only
    where the text has whitespace ("Java|Script" and "l'enf|ant" stay on one line). A run
    longer than WORD_CHARS may still break, so it never pushes out of its panel."""
    out, word, chars = [], [], 0

    def close():
        if len(word) > 1 and chars <= WORD_CHARS:
            out.append(f'<span class="sv-word">{"".join(word)}</span>')
        else:
            out.extend(word)
        word.clear()

    previous = " "
    for text, html in pieces:
        if not text or previous[-1:].isspace() or text[0].isspace() or "\n" in text or "↵" in text:
            close()
            chars = 0
        word.append(html)
        chars += len(text)
        previous = text or " "
    close()
    return out


def _window_start(trace: Trace, window: int, eos) -> int:
    """The first event of the last whole steps (or baseline tokens) that show `window` tokens or more."""
    shown, i = 0, len(trace.events)
    while i > 0 and shown < window:
        i -= 1
        shown += len(shown_tokens(trace.events[i], eos))
    return i


def _earlier(trace: Trace, start: int, eos) -> str:
    """The output of the events before `start` as plain text (kept tokens only), one option of the listbox
    that is never focused: what a run part-shown summarises instead of drawing every token."""
    texts = []
    for e, labels in zip(trace.events[:start], trace.labels[:start]):
        both = labels.draft + (labels.token,)
        texts.extend(both[i] for kind, i in shown_tokens(e, eos) if kind != "rejected")
    what = "steps" if trace.speculative else "tokens"
    note = f"{what.capitalize()} 1–{start:,} in plain text: each token’s colour and card return when the run is shown to its end."
    # no space after the note: it is a line of its own (the stylesheet), and a space would indent the text
    return (f'<span class="sv-earlier" role="option"><span class="sv-earlier-note">{note}</span>'
            f'{escape("".join(texts), quote=False)}</span>')


def tokens_html(trace: Trace, placeholder: str = "No tokens yet.", playing: tuple | None = None,
                window: int | None = None) -> str:
    """The run's text, token by token, inside a whitespace-preserving block; `playing`, a step
    being played in phases as (StepEvent, Labels, phase), is drawn after it (phase_spans).
    The end-of-turn token that ended the run is a mark after the text, not a token in it.
    `window`: draw only the last steps showing that many tokens, each token whole, and the text before
    them plain (_earlier): a run part-shown is redrawn several times a second, and drawing every
    token of a 1,024-step run was 2.2 MB of HTML a frame."""
    pieces, eos = [], trace.end_ids()
    start = _window_start(trace, window, eos) if window else 0
    for event, labels in zip(trace.events[start:], trace.labels[start:]):
        if isinstance(event, StepEvent):
            pieces.extend(_step_pieces(event, labels, eos))
        elif event.token not in eos:
            pieces.append((labels.token, baseline_span(event, labels)))
    if playing is not None:
        pieces.extend(("", h) for h in phase_spans(*playing))  # a step in play: each token on its own
    spans = words(pieces)
    if trace.events and ended_at(trace.events[-1], eos):
        spans.append(END_MARK)
    if not spans:
        body = f'<span class="sv-placeholder">{escape(trace.error or placeholder)}</span>'
        return f'<div class="sv-text sv-empty" data-run="{escape(trace.label)}">{body}</div>'
    return token_list(spans, f"{trace.label} text, token by token", trace.label,
                      _earlier(trace, start, eos) if start else "")


def panel_html(trace: Trace, title: str, note: str = "", placeholder: str = "No tokens yet.",
               playing: tuple | None = None, window: int | None = None) -> str:
    """A titled panel around `tokens_html`, with a one-line note (speed, state) on the right."""
    note_html = f'<span class="sv-panel-note">{escape(note)}</span>' if note else ""
    return (
        f'<section class="sv-panel"><header class="sv-panel-head"><span class="sv-panel-title">'
        f"{escape(title)}</span>{note_html}</header>{tokens_html(trace, placeholder, playing, window)}</section>"
    )
