"""The step inspector: one speculative step laid open, draft by draft.

For each drafted token: q (drafter), p (target), the rule the verifier applied (greedy: is
it the target's top token; sampling: min(1, p/q) against the uniform draw u) and the
verdict; then the token the target itself chose, and the target's top tokens at the
position where that choice was made. A sampled tree step has its own rule, the sibling walk
(core/tree_sampling.py): its table is every child the walk tried, in order, with p′(x) when
its turn came, u, the verdict and the mass a refusal left (render/tree.py). A sampled chain
step also shows what token-wise and block verification keep from its draft and its draws, side
by side, with block verification's weights and backward pass written out (render/rules.py). A block
drafter's step also shows each position's candidates and where acceptance stopped (render/block.py).
"""
from __future__ import annotations

from html import escape

from ..core.events import StepEvent
from .html import RESIDUAL, RESIDUAL_GLOSS, WALK_RESIDUAL, WALK_RULE, visible
from .kinds import ended_at
from .block import block_html
from .rules import rules_html
from .status import count, step_label
from .trace import Trace
from .tree import sibling_walk, tree_html, walk_end, walk_table


def _tok(text: str) -> str:
    shown = visible(text)
    return f'<code class="sv-inspect-tok">{escape(shown) if shown else "∅"}</code>'


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _verdict(e: StepEvent, i: int) -> tuple[str, str]:
    if i < e.accepted:
        return "accepted", "accepted" if i < len(e.emitted) else "accepted, after the end (not output)"
    if i == e.accepted:
        return "rejected", "rejected"
    return "rejected", "not checked (after the first rejection)"


def _ratio(e: StepEvent) -> str:
    """What a sampled step's accept_prob is: min(1, p/q) for a chain; p′(x) for a tree's child,
    a one-hot guess judged by the sibling walk."""
    return "p′(x) when tried" if e.tree is not None else "min(1, p/q)"


def _rule_heads(e: StepEvent) -> str:
    """The columns of the rule the verifier applied: the argmax test, or min(1, p/q) (a tree:
    p′(x)) against u."""
    if e.greedy:
        return "<th>target's top token</th>"
    return f"<th>{_ratio(e)}</th><th>draw u</th>"


def _row(e: StepEvent, labels, j: int) -> str:
    kind, verdict = _verdict(e, j)
    if e.q is not None:
        q = _num(e.q[j])
    else:  # prompt lookup, Medusa, EAGLE: a token and no distribution
        q = '1 <span class="sv-muted">(one-hot)</span>' if not e.greedy else '<span class="sv-muted">none</span>'
    # data-label: a phone shows each row as a card of "label  value" lines (assets/style.css)
    if e.greedy:
        rule = f'<td data-label="target\'s top token">{_argmax(e, labels, j)}</td>'
    else:
        u = "—" if e.draws is None else _num(e.draws[j])
        rule = f'<td data-label="{_ratio(e)}">{_num(e.accept_prob[j])}</td><td data-label="draw u">{u}</td>'
    return (f'<tr data-kind="{kind}"><td data-label="draft #">{j + 1}</td><td data-label="draft">'
            f'{_tok(labels.draft[j])}</td><td data-label="q (drafter)">{q}</td><td data-label="p (target)">'
            f'{_num(e.p[j])}</td>{rule}<td class="sv-verdict-{kind}" data-label="verdict">{escape(verdict)}</td></tr>')


def _no_q(e: StepEvent) -> str:
    """Said once under the table, for a drafter that gives a token and no probabilities."""
    if e.q is not None or not e.draft:
        return ""
    how = ("Greedy decoding needs none: each draft is checked against the target's top token" if e.greedy else
           "With sampling each child of a tree is a one-hot guess, judged by the sibling walk: kept if u < p′(x), "
           "p′ being the target's p with the siblings refused before it removed and renormalised"
           if e.tree is not None else
           "With sampling it counts as q = 1 for the token it proposed (one-hot), so min(1, p/q) is p")
    return (f'<p class="sv-muted sv-no-q">q: none. This drafter proposes tokens with no probabilities '
            f"(prompt lookup copies them from the text; tree heads pick their likeliest tokens). {how}.</p>")


def _argmax(e: StepEvent, labels, j: int) -> str:
    """Greedy's rule for draft j: the target's own top token there, and whether the draft is it."""
    if j > e.accepted:
        return "—"
    same = "= draft" if e.accept_prob[j] >= 1.0 else "≠ draft"
    if j < len(e.p_top) and e.p_top[j] and j < len(labels.p_top) and labels.p_top[j]:
        return f'{_tok(labels.p_top[j][0])} {_num(e.p_top[j][0][1])} <span class="sv-muted">{same}</span>'
    return "the draft" if e.accept_prob[j] >= 1.0 else "another token"


def _shape(trace: Trace) -> str:
    """Why the run's drafts have their shape (a chain where a tree could be, fewer than k), when the app said."""
    return f'<p class="sv-muted sv-shape">Why this shape: {escape(trace.shape)}.</p>' if trace.shape else ""


def _rule(e: StepEvent) -> str:
    """The rule the verifier applied this step, in words, for the head line."""
    if e.greedy:
        return ("greedy: a draft is kept only if it is the target's top token (its argmax); "
                "q and p are shown for information")
    if e.tree is not None and e.tree.q:  # drawn children: recursive rejection sampling
        return ("sampling, a drawn tree (recursive rejection sampling): each node's children were drawn from the "
                "drafter's q without replacement; child j is kept if u < min(1, p′(x) / q_j(x)), q_j being q without "
                "the earlier siblings, renormalised, and p′ starting as the target's p there; a refusal sets "
                "p′ to max(p′ − q_j, 0), renormalised; if every child is refused, the target's token is drawn "
                "from the final p′")
    if e.tree is not None:  # the sibling walk: one-hot children, no ratio
        return (f"sampling, a tree (the sibling walk): at each node {WALK_RULE}, p′ starting as the target's p "
                f"there; {WALK_RESIDUAL}; if every child is refused, the target's token is drawn from the final p′")
    if e.verification == "block":
        return ("sampling, block verification: the block judged as a whole, the backward pass below deciding "
                "how many drafts are kept (the token-wise columns are shown for comparison)")
    return (f"sampling: keep draft i if u < min(1, p/q); after a rejection the target draws from the residual "
            f"{RESIDUAL}, {RESIDUAL_GLOSS}")


def _walk_html(e: StepEvent, labels) -> str:
    """Every child the sibling walk judged, in order, in place of the chain view's rows."""
    end = walk_end(e, labels.tree)
    note = ('<p class="sv-muted sv-drawn">Drawn, not chosen: each child is a draw from the drafter\'s q, so '
            "the ratio divides by the q it was drawn from (a first child is kept with 1 − TV(p, q) on average, "
            "a chosen one only with p(x)).</p>" if e.tree.q else
            '<p class="sv-muted sv-no-q">q: none. A tree\'s children are the drafter\'s likeliest tokens, '
            "chosen and not drawn, so each is a one-hot guess and there is no ratio p/q: p′ alone decides.</p>")
    return f'{walk_table(e.tree, labels.tree)}<p class="sv-walk-end">{escape(end[:1].upper() + end[1:])}.</p>' + note


def _drafts_html(e: StepEvent, labels) -> str:
    """The chain view: one row per draft, q, p, the rule's columns and the verdict."""
    rows = [_row(e, labels, j) for j in range(len(e.draft))]
    if not rows:
        rows.append('<tr><td colspan="7" class="sv-muted">the drafter proposed nothing this step</td></tr>')
    return ('<div class="sv-scroll"><table class="sv-table sv-drafts"><thead><tr><th>#</th><th>draft</th>'
            f'<th>q (drafter)</th><th>p (target)</th>{_rule_heads(e)}<th>verdict</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>{_no_q(e)}')


def _target_choice(trace: Trace, e: StepEvent, labels, walked: bool) -> str:
    """The token the target itself chose and its top tokens where it chose, or why none was output."""
    own = "corrected token" if e.token_kind == "corrected" else "bonus token"
    if len(e.emitted) <= e.accepted:  # the run ended inside the step: what the target would have added was never output
        why = "with the end-of-turn token" if ended_at(e, trace.end_ids()) else "at its token limit"
        return f'<p class="sv-inspect-end">The run ended {why} (draft {len(e.emitted)}): no {own} was output.</p>'
    where = ("node where the walk stopped" if walked else
             "first rejection" if e.token_kind == "corrected" else "bonus position")
    top_rows = "".join(
        f'<tr class="{"sv-chosen" if t == e.token else ""}"><td>{_tok(text)}</td><td>{_num(p)}</td></tr>'
        for (t, p), text in zip(e.top, labels.top)
    )
    return (f'<p>The target\'s {own}: {_tok(labels.token)} '
            f'<span class="tok tok-{e.token_kind} sv-swatch">{e.token_kind}</span></p>'
            f"<p class=\"sv-muted\">Target's top {len(e.top)} at the {where}:</p>"
            f'<div class="sv-scroll"><table class="sv-table sv-top"><thead><tr><th>token</th><th>p</th></tr>'
            f"</thead><tbody>{top_rows}</tbody></table></div>")


def step_html(trace: Trace, index: int | None, total: int | None = None) -> str:
    """HTML for step `index` (from 0) of a speculative trace (clamped to the steps there are).
    `total`: the steps the whole run has, when more than the trace holds yet (a replay)."""
    steps = [(e, lab) for e, lab in zip(trace.events, trace.labels) if isinstance(e, StepEvent)]
    if not steps:
        return '<div class="sv-inspect sv-empty">Run something, then pick a step to inspect.</div>'
    i = min(max(int(index or 0), 0), len(steps) - 1)
    e, labels = steps[i]
    walk = [] if e.greedy else sibling_walk(e.tree)
    table = _walk_html(e, labels) if walk else _drafts_html(e, labels)
    table_is = ("every child the sibling walk tried, in order" if walk else "the branch the target followed")
    drafted = (f"a tree of {count(len(e.tree.tokens), 'candidate')} drafted (the table: {table_is}; "
               "the whole tree further down)" if e.tree is not None else f"{len(e.draft)} drafted")
    return (
        f'<div class="sv-inspect" data-step="{e.step}">'
        f'<p class="sv-inspect-head">{step_label(i, max(total or 0, len(steps)))} · {drafted}'
        f'{" by " + escape(e.source) if e.source else ""}, {e.accepted} accepted · {escape(_rule(e))}</p>'
        f'{_shape(trace)}'
        f"{table}{block_html(e, labels)}{rules_html(e, labels)}{_target_choice(trace, e, labels, bool(walk))}"
        f'{tree_html(e.tree, labels.tree) if e.tree is not None else ""}</div>'
    )
