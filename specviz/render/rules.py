"""The verification rules side by side: what token-wise and block verification keep from one
sampled chain step, the same draft and the same draws, with the arithmetic written out.

Every sampled chain step records block verification's numbers (StepEvent.block: the weights,
the residual masses, the stop chances h) whichever rule judged it, so a step can be replayed
under both. Token-wise walks forward and stops at the first u >= min(1, p/q); block
verification walks backward from the block's end and stops at the first position whose
u < h (core/block_verify.py). The inspector and step-through read `compare` and `backward_pass`.

A sampled tree step is shown against its ceiling: each node's keep chance, the target's
probability of its branch, is how often the sibling walk keeps it and the most any exact rule
can (core/tree_sampling.py), beside what the walk kept on the step's draws and its order.
"""
from __future__ import annotations

from dataclasses import dataclass
from html import escape

from ..core.block_verify import block_accepted, block_expected, token_wise_accepted, token_wise_expected
from ..core.events import StepEvent
from ..core.tree_sampling import keep_chances
from .html import visible
from .tree import sibling_walk

RULE_NAMES = {"token": "token-wise", "block": "block verification"}


@dataclass(frozen=True)
class Position:
    """Draft position i (from 1) under both rules."""

    i: int
    p: float
    q: float  # 1 for a drafter that gives no q (a one-hot guess)
    a: float  # min(1, p/q): token-wise keeps it while u < a, from the first position on
    u: float
    w: float  # the block weight w_i = min(1, w_{i-1} p/q)
    mass: float | None  # |r_i|, the residual's mass after i drafts (None at the block's end: the bonus)
    h: float  # the chance the backward pass stops here: |r_i| / (|r_i| + 1 - w_i), or w_k at the end
    token_kept: bool
    block_kept: bool


def comparable(e: StepEvent) -> bool:
    """A sampled chain step that recorded block verification's numbers (not greedy, not a tree,
    not a trace from before the rules were recorded)."""
    return e.block is not None and e.draws is not None and e.tree is None and bool(e.draft)


def kept(e: StepEvent) -> dict[str, int]:
    """How many drafts each rule keeps with this step's draws."""
    return {"token": token_wise_accepted(e.accept_prob, e.draws), "block": block_accepted(e.block.stop_prob, e.draws)}


def expected(e: StepEvent) -> dict[str, float]:
    """What each rule keeps from this step on average over its coins, the draft and the rows as they
    are: a sampled chain step under both rules; a sampled tree step under the sibling walk, which is
    the most any exact rule keeps from that tree (core/tree_sampling.py), or a drawn tree's under
    recursive rejection sampling, given the tree drawn (core/tree_drawn.py); {} otherwise."""
    if comparable(e):
        return {"token": token_wise_expected(e.accept_prob), "block": block_expected(e.block.stop_prob)}
    if e.tree is not None and e.tree.keep:  # a drawn tree: recursive rejection, given the tree drawn
        return {"drawn": sum(e.tree.keep)}
    if e.tree is not None and e.tree.walk and not e.tree.q:
        return {"walk": sum(keep_chances(e.tree.tokens, e.tree.parents, e.tree.p))}
    return {}


def compare(e: StepEvent) -> list[Position]:
    n = kept(e)
    k = len(e.draft)
    return [Position(i + 1, e.p[i], 1.0 if e.q is None else e.q[i], e.accept_prob[i], e.draws[i], e.block.weight[i],
                     e.block.residual_mass[i + 1] if i + 1 < k else None, e.block.stop_prob[i],
                     i < n["token"], i < n["block"])
            for i in range(k)]


def _n(x: float) -> str:
    return f"{x:.3f}"


def weight_text(rows: list[Position], j: int) -> str:
    """w_i written out: min(1, w_{i-1} × p/q)."""
    r = rows[j]
    prev = 1.0 if j == 0 else rows[j - 1].w
    return f"w{r.i} = min(1, {_n(prev)} × {_n(r.p)} / {_n(r.q)}) = {_n(r.w)}"


def stop_text(r: Position) -> str:
    """h_i written out."""
    if r.mass is None:
        return f"h{r.i} = w{r.i} = {_n(r.h)}"
    if r.mass <= 0:
        return f"h{r.i} = 0 (the residual there is empty)"
    return f"h{r.i} = |r{r.i}| / (|r{r.i}| + 1 − w{r.i}) = {_n(r.mass)} / ({_n(r.mass)} + 1 − {_n(r.w)}) = {_n(r.h)}"


def backward_pass(e: StepEvent) -> list[str]:
    """Block verification's pass over this step's block, from its end back to its start, a
    sentence per position it looked at."""
    out = []
    rows = compare(e)
    for r in reversed(rows):
        if r.u < r.h:
            out.append(f"position {r.i}: u = {_n(r.u)} < {stop_text(r)}: stop, keep drafts 1 to {r.i}")
            break
        out.append(f"position {r.i}: u = {_n(r.u)} ≥ {stop_text(r)}: go back")
    else:
        out.append("no position stopped the pass: keep nothing")
    return out


def token_source(e: StepEvent) -> str:
    """Where block verification draws the target's own token from."""
    tau = kept(e)["block"]
    if tau == len(e.draft):
        return "every draft kept: the bonus token is drawn from p after the block"
    w = "1" if tau == 0 else _n(e.block.weight[tau - 1])
    return (f"drawn from r{tau} = max(0, w{tau} × p − q) at position {tau + 1} (w{tau} = {w}), rescaled to sum to 1"
            + (", token-wise's residual" if tau == 0 else ""))


def summary(e: StepEvent) -> str:
    n, mean = kept(e), expected(e)
    alone = (" A deterministic draft: token-wise's mean is the most any exact rule keeps from it."
             if e.q is None else "")
    return (f"Same draft, same draws: token-wise keeps {n['token']}, block verification keeps {n['block']}. "
            f"On average over the draws, this draft as it is: token-wise {mean['token']:.2f}, "
            f"block {mean['block']:.2f}.{alone} "
            f"This run was judged {RULE_NAMES.get(e.verification, e.verification)}.")


def _tok(text: str) -> str:
    shown = visible(text)
    return f'<code class="sv-inspect-tok">{escape(shown) if shown else "∅"}</code>'


def tree_ceiling(e: StepEvent) -> list[tuple[int, float, str]]:
    """A sampled tree step's nodes as (node, keep chance, the chance written out): how often the
    sibling walk keeps each, the target's probability of its branch, the most any exact rule can."""
    t = e.tree
    chance = keep_chances(t.tokens, t.parents, t.p)
    out, seen, blocked = [], {}, []
    for i, (x, parent) in enumerate(zip(t.tokens, t.parents)):
        repeat = x in seen.setdefault(parent, set())
        seen[parent].add(x)
        blocked.append(repeat or (parent >= 0 and blocked[parent]))
        factors = [t.p[n] for n in reversed(_branch(t, i))]
        text = ("0: an earlier sibling holds its token" if repeat else "0: below a repeated token" if blocked[i] else
                _n(chance[i]) if len(factors) == 1 else f"{' × '.join(_n(f) for f in factors)} = {_n(chance[i])}")
        out.append((i, chance[i], text))
    return out


def walk_order_text(e: StepEvent, labels) -> list[str]:
    """The sibling walk's order of traversal this step, a line per node whose children it judged."""
    walk, names = sibling_walk(e.tree), labels.tree
    lines: list[str] = []
    for j in walk:
        parent = e.tree.parents[j.node]
        head = "the text so far" if parent < 0 else f"“{visible(_name(names, e.tree, parent))}”"
        said = f"“{visible(_name(names, e.tree, j.node))}” {'kept' if j.kept else 'refused'}"
        if lines and lines[-1].startswith(f"children of {head}:"):
            lines[-1] += f", then {said}"
        else:
            lines.append(f"children of {head}: {said}")
    return lines


def _name(names, tree, i: int) -> str:
    return names[i] if i < len(names) else f"#{tree.tokens[i]}"


def tree_rules_html(e: StepEvent, labels) -> str:
    """A sampled tree step against its ceiling: each node's keep chance written out, what the walk
    kept on this step's draws, and the walk's order ('' for other steps)."""
    if e.tree is None or not e.tree.walk:
        return ""
    if e.tree.q:
        order = "".join(f"<li>{escape(line)}</li>" for line in walk_order_text(e, labels))
        return ('<div class="sv-rules sv-tree-rules"><p class="sv-inspect-head">A drawn tree: on average over the '
                f"draws it keeps {sum(e.tree.keep):.2f} of these {len(e.tree.tokens)} candidates ({len(e.tree.path)} "
                "this step). Its children are draws "
                "from the drafter's q, so recursive rejection sampling may keep a child more often than the target "
                "writes its branch (min(1, p′/q_j) against p(x) for a chosen child), and no ceiling of p along a "
                "branch applies. The rule is exact over the draws, not for one tree (docs/exactness.md).</p>"
                f'<p class="sv-muted">Its order this step:</p><ol class="sv-walk-order">{order}</ol></div>')
    rows = tree_ceiling(e)
    won = set(e.tree.path)
    body = "".join(
        f'<tr data-ceiling-node="{i}"><td data-label="node">{_tok(_name(labels.tree, e.tree, i))}</td>'
        f'<td data-label="depth">{len(_branch(e.tree, i))}</td>'
        f'<td data-label="keep chance: p along its branch">{escape(text)}</td>'
        f'<td class="sv-verdict-{"accepted" if i in won else "rejected"}" data-label="this step">'
        f'{"kept" if i in won else "not kept"}</td></tr>'
        for i, c, text in rows)
    total = sum(c for _, c, _ in rows)
    order = "".join(f"<li>{escape(line)}</li>" for line in walk_order_text(e, labels))
    return (
        '<div class="sv-rules sv-tree-rules">'
        f'<p class="sv-inspect-head">The tree against its ceiling. On average over the draws the sibling walk keeps '
        f"{total:.2f} of these {len(rows)} candidates ({len(won)} this step): the most any exact rule keeps from "
        "this tree.</p>"
        '<div class="sv-scroll"><table class="sv-table sv-drafts sv-ceiling"><thead><tr><th>node</th><th>depth</th>'
        "<th>keep chance: p along its branch</th><th>this step</th></tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
        '<p class="sv-muted">Why no rule keeps more: the children were chosen, not drawn, so the tokens a step keeps '
        "begin the target's own text, and the target writes a node's branch with the product of p along it. The "
        "walk keeps every node exactly that often. Rules that keep more from a tree (SpecInfer's, recursive "
        "rejection sampling, traversal verification) are exact when the children are draws from q; on chosen children they change the "
        "text's law.</p>"
        f'<p class="sv-muted">The walk\'s order this step:</p><ol class="sv-walk-order">{order}</ol></div>'
    )


def _branch(tree, i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(i)
        i = tree.parents[i]
    return out


def rules_html(e: StepEvent, labels) -> str:
    """The side-by-side table, the weights and the backward pass written out; a sampled tree step
    against its ceiling ('' when the step cannot be compared)."""
    if e.tree is not None:
        return tree_rules_html(e, labels)
    if not comparable(e):
        return ""
    rows = compare(e)
    names = labels.draft if len(labels.draft) == len(e.draft) else tuple(f"#{t}" for t in e.draft)

    def verdict(ok: bool, rule: str) -> str:
        kind = "accepted" if ok else "rejected"
        return f'<td class="sv-verdict-{kind}" data-label="{rule}">{"kept" if ok else "not kept"}</td>'

    body = "".join(
        f'<tr><td data-label="#">{r.i}</td><td data-label="draft">{_tok(names[r.i - 1])}</td>'
        f'<td data-label="draw u">{_n(r.u)}</td><td data-label="token-wise: min(1, p/q)">{_n(r.a)}</td>'
        f'{verdict(r.token_kept, "token-wise")}<td data-label="block: weight w">{_n(r.w)}</td>'
        f'<td data-label="block: residual mass |r|">{"bonus" if r.mass is None else _n(r.mass)}</td>'
        f'<td data-label="block: stop chance h">{_n(r.h)}</td>{verdict(r.block_kept, "block")}</tr>'
        for r in rows)
    weights = "".join(f"<li>{escape(weight_text(rows, j))}</li>" for j in range(len(rows)))
    passes = "".join(f"<li>{escape(line)}</li>" for line in [*backward_pass(e), "the target's token: " + token_source(e)])
    return (
        '<div class="sv-rules">'
        f'<p class="sv-inspect-head">The rules side by side. {escape(summary(e))}</p>'
        '<div class="sv-scroll"><table class="sv-table sv-drafts sv-rules-table"><thead><tr><th>#</th><th>draft</th>'
        '<th>draw u</th><th>token-wise: min(1, p/q)</th><th>token-wise</th><th>block: weight w</th>'
        '<th>block: residual mass |r|</th><th>block: stop chance h</th><th>block</th></tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
        '<p class="sv-muted">Token-wise goes forward and stops at the first u ≥ min(1, p/q). Block verification '
        "first carries a weight along the block (w0 = 1):</p>"
        f"<ol>{weights}</ol>"
        '<p class="sv-muted">then goes backward from the block\'s end and keeps everything up to the first position '
        "whose draw falls below its stop chance h:</p>"
        f'<ol class="sv-backward">{passes}</ol></div>'
    )
