"""A block step from the inside: what each position of a block drafter's one forward pass held.

A block drafter (drafters/block.py) drafts every position of its block at once, none of them
reading the drafts before it. The step inspector shows, per position, the drafter's top candidates
with their q (StepEvent.q_top: a chain's rows, or a tree's chain view, each depth's q being the
same for every node there), which one was drafted, and where acceptance stopped; past that point
the block's guesses were computed but never needed.
"""
from __future__ import annotations

from html import escape

from ..core.events import StepEvent
from .html import visible


def _tok(text: str) -> str:
    shown = visible(text)
    return f'<code class="sv-inspect-tok">{escape(shown) if shown else "∅"}</code>'


def stop_sentence(e: StepEvent) -> str:
    """Where acceptance stopped in the block, in words."""
    n, k = e.accepted, len(e.draft)
    if not k:
        return "The block drafted nothing this step."
    if n == k:
        return f"Every position of the block was kept ({k} of {k}); the target added a bonus token after it."
    return (f"Acceptance stopped at position {n + 1} of {k}: positions 1-{n} were kept" if n else
            f"Acceptance stopped at position 1 of {k}: no draft was kept") + (
        "; the positions after it were drafted in the same pass but never checked." if n + 1 < k else ".")


def _candidates(e: StepEvent, labels, j: int) -> str:
    row = e.q_top[j] if j < len(e.q_top) else ()
    texts = labels.q_top[j] if j < len(labels.q_top) else ()
    if not row:
        return '<span class="sv-muted">not recorded</span>'
    return " ".join(
        f'<span class="sv-cand{" sv-cand-drafted" if t == e.draft[j] else ""}">{_tok(text)} {q:.2f}</span>'
        for (t, q), text in zip(row, texts))


def block_html(e: StepEvent, labels) -> str:
    """The block's positions, each with its top candidates (q), the drafted one marked, the target's p
    of it and the verdict; then where acceptance stopped. "" for a step no block drafter made."""
    if not e.parallel or not e.draft:
        return ""
    rows = []
    for j, t in enumerate(e.draft):
        kind = "accepted" if j < e.accepted else "rejected" if j == e.accepted else "unchecked"
        verdict = {"accepted": "kept", "rejected": "stopped here", "unchecked": "not checked"}[kind]
        rows.append(f'<tr data-kind="{kind}"><td data-label="position">{j + 1}</td>'
                    f'<td data-label="candidates (q)">{_candidates(e, labels, j)}</td>'
                    f'<td data-label="drafted">{_tok(labels.draft[j])}</td>'
                    f'<td data-label="p (target)">{e.p[j]:.3f}</td>'
                    f'<td class="sv-verdict-{kind}" data-label="verdict">{verdict}</td></tr>')
    what = ("the winning branch and the first node refused, each depth's candidates being the same for every node "
            "there" if e.tree is not None else "each position as drafted")
    return ('<div class="sv-block" data-stopped="' + str(e.accepted) + '">'
            '<p class="sv-block-head">Inside the block: one forward pass drafted every position at once, none of '
            f'them reading the drafts before it ({escape(what)}). Candidates are the drafter\'s top tokens at each '
            'position with their q; the drafted one is boxed where it is among them.</p>'
            '<div class="sv-scroll"><table class="sv-table sv-drafts sv-block-table"><thead><tr><th>position</th>'
            '<th>candidates (q)</th><th>drafted</th><th>p (target)</th><th>verdict</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>'
            f'<p class="sv-block-stop">{escape(stop_sentence(e))}</p></div>')
