"""The page's first picture: two made-up steps of speculative decoding in the panels' own colours,
so a class sees what the app shows before anything is run or scrolled to.

Static and ours (no model text), but escaped all the same: the words are data, the markup is here.
Each token says its verdict in words too (visually hidden), since colour alone tells a screen reader nothing.
"""
from __future__ import annotations

from html import escape

from .html import KIND_HELP

# (text, verdict) per token; None: the text before the run. Step 1 keeps all 3 drafts and gets a
# bonus token; step 2 keeps 1, the target rejects the next and writes its own token in its place.
STEPS = (
    ("step 1: 3 drafts, all kept", ((" sat", "accepted"), (" on", "accepted"), (" the", "accepted"), (" mat", "bonus"))),
    ("step 2: 2 drafts, 1 kept", ((".", "accepted"), (" The", "rejected"), (" It", "corrected"))),
)
BEFORE = "The cat"
# The legend's words: what each colour means, where a reader first meets it.
SAID = {
    "accepted": "a draft the target agreed with",
    "rejected": "a draft it refused (struck through)",
    "corrected": "the target's own token in its place",
    "bonus": "a free extra token when every draft is kept",
}


def _token(text: str, kind: str) -> str:
    return (f'<span class="tok tok-{kind}" title="{escape(KIND_HELP[kind])}">{escape(text)}'
            f'<span class="sv-hidden"> ({kind})</span></span>')


def primer_html() -> str:
    """The two steps, each in a box with what happened, then the legend of the four colours."""
    steps = "".join(
        f'<li class="sv-primer-step"><span class="sv-primer-head">{escape(head)}</span>'
        f'<span class="sv-text">{"".join(_token(t, k) for t, k in tokens)}</span></li>'
        for head, tokens in STEPS)
    legend = "".join(f'<li><span class="tok tok-{k} sv-swatch">{k}</span> {escape(said)}</li>'
                     for k, said in SAID.items())
    return (f'<figure class="sv-primer" aria-labelledby="sv-primer-caption">'
            f'<div class="sv-primer-line"><span class="sv-primer-before sv-text">{escape(BEFORE)}</span>'
            f'<ol class="sv-primer-steps" aria-label="two steps of a made-up run">{steps}</ol></div>'
            f'<figcaption id="sv-primer-caption"><span class="sv-hidden">Two made-up steps, in the colours the '
            f'panels use: </span><ul class="sv-primer-legend" aria-label="token colours">{legend}</ul>'
            f'</figcaption></figure>')
