"""A tree step drawn as nested lists: every candidate branch, the winning one highlighted;
and a sampled tree step's sibling walk, child by child.

The inspector shows the tree under the step's table; the branch the target followed is
marked `won`, the first candidate that missed on it `missed` (sampled: every child the walk
tried and refused), and the rest stay grey. A sampled step's walk (core/tree_sampling.py,
recorded in TreeDraft.walk) is also a table: each child in the order it was tried, with
p′(x) when its turn came, the draw u, the verdict and the mass of p a refusal left; the
inspector, the distribution view and step-through all read it from `sibling_walk`.
"""
from __future__ import annotations

from dataclasses import dataclass
from html import escape

from ..core.events import StepEvent, TreeDraft
from .html import visible


@dataclass(frozen=True)
class Judged:
    """One child the sibling walk judged, as the page shows it."""

    node: int  # its index in the tree
    depth: int  # 0: a child of the root, the text so far (the chain view's draft position)
    order: int  # its place among its parent's children, from 1: the order they were tried in
    p: float  # p(x): the target's probability of its token at its parent
    before: float  # p′(x) when its turn came: p(x) divided by `mass`, 0 for a repeat
    u: float  # the draw it was judged by: kept when u < p′(x)
    kept: bool
    mass: float  # the mass of p its refused earlier siblings left (1 for the first child)
    left: float  # the mass of p left once it is refused too: the next child's p′ divides by it
    repeat: bool  # its token is an earlier sibling's, refused already: p′(x) = 0
    # A drawn tree's child (core/tree_drawn.py): q_j(x), the q it was drawn from without its earlier
    # siblings; `before` is then min(1, p′(x) / q_j(x)) and `left` the mass of max(p′ − q_j, 0). None: chosen.
    q: float | None = None


def _depths(parents) -> list[int]:
    out: list[int] = []
    for parent in parents:
        out.append(0 if parent < 0 else out[parent] + 1)
    return out


def sibling_walk(tree: TreeDraft | None) -> list[Judged]:
    """The walk a sampled tree step recorded, in the order it was judged; [] when greedy (or a
    trace from before walks were recorded)."""
    if tree is None or not tree.walk:
        return []
    deep, won = _depths(tree.parents), set(tree.path)
    order, count = [], {}
    for parent in tree.parents:
        count[parent] = count.get(parent, 0) + 1
        order.append(count[parent])
    out, mass, tried = [], {}, {}
    qs = tree.q or (None,) * len(tree.walk)
    for i, a, u, left, q in zip(tree.walk, tree.accept_prob, tree.draws, tree.residual_mass, qs):
        parent = tree.parents[i]
        seen = tried.setdefault(parent, set())
        out.append(Judged(i, deep[i], order[i], tree.p[i], a, u, i in won, mass.get(parent, 1.0), left,
                          tree.tokens[i] in seen and q is None, q))
        seen.add(tree.tokens[i])
        mass[parent] = left
    return out


def _label(tree: TreeDraft, labels, i: int) -> str:
    return labels[i] if i < len(labels) else f"#{tree.tokens[i]}"


def _code(text: str) -> str:
    shown = visible(text)
    return f'<code class="sv-inspect-tok">{escape(shown) if shown else "∅"}</code>'


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def before_text(j: Judged) -> str:
    """p′(x) when the child was tried, with where it came from after a refusal; a drawn child's
    min(1, p′(x) / q_j(x))."""
    if j.q is not None:
        return f"min(1, p′(x) / {j.q:.3f}) = {j.before:.3f}"
    if j.repeat:
        return "0 (its token was refused already)"
    if j.order > 1 and j.mass < 1.0:
        return f"{j.before:.3f} = {j.p:.3f} / {j.mass:.3f}"
    return f"{j.before:.3f}"


def verdict_text(j: Judged) -> str:
    ratio = "p′(x)" if j.q is None else "min(1, p′/q_j)"
    return f"kept: u < {ratio}" if j.kept else f"refused: u ≥ {ratio}"


def walk_table(tree: TreeDraft, labels, depth: int | None = None) -> str:
    """The walk as a table, every depth (the inspector: a column says which node's children)
    or one (the distribution view). Model text is escaped; the rule is said by the caller."""
    walk = [j for j in sibling_walk(tree) if depth is None or j.depth == depth]
    if not walk:
        return ""
    rows = []
    for j in walk:
        at = ""
        if depth is None:
            parent = tree.parents[j.node]
            at = (f'<td data-label="children of">'
                  f'{"the text so far" if parent < 0 else _code(_label(tree, labels, parent))}</td>')
        kind = "accepted" if j.kept else "rejected"
        left = "—" if j.kept else f"{j.left:.3f}"
        rows.append(f'<tr data-kind="{kind}" data-node="{j.node}">{at}<td data-label="tried">{ordinal(j.order)}</td>'
                    f'<td data-label="child">{_code(_label(tree, labels, j.node))}</td>'
                    f'<td data-label="p (target)">{j.p:.3f}</td>'
                    f'<td data-label="{"p′(x)" if j.q is None else "min(1, p′/q_j)"} when tried">{before_text(j)}</td>'
                    f'<td data-label="draw u">{j.u:.3f}</td>'
                    f'<td class="sv-verdict-{kind}" data-label="verdict">{escape(verdict_text(j))}</td>'
                    f'<td data-label="mass left if refused">{left}</td></tr>')
    head = "<th>children of</th>" if depth is None else ""
    ratio = "p′(x) when tried" if not tree.q else "min(1, p′/q_j) when tried"
    return ('<div class="sv-scroll"><table class="sv-table sv-drafts sv-walk"><thead><tr>'
            f'{head}<th>tried</th><th>child</th><th>p (target)</th><th>{ratio}</th><th>draw u</th>'
            f'<th>verdict</th><th>mass left if refused</th></tr></thead><tbody>{"".join(rows)}</tbody></table></div>')


def walk_end(e: StepEvent, labels) -> str:
    """How the walk ended, in words (plain text, to be escaped): the correction drawn from the
    final p′ after every child of a node was refused, or the bonus at a leaf."""
    walk, tree = sibling_walk(e.tree), e.tree
    if not walk:
        return ""
    last = walk[-1]
    if last.kept:
        return (f"“{visible(_label(tree, labels, last.node))}” was kept and has no children (a leaf): "
                "the target's token after it is drawn from its p there (the bonus)")
    parent = tree.parents[last.node]
    whose = "the text so far" if parent < 0 else f"“{visible(_label(tree, labels, parent))}”"
    if last.q is not None:
        return (f"every child of {whose} was refused: the target's token is drawn from the final p′, "
                f"max(p′ − q_j, 0) after the last one divided by its mass ({last.left:.3f})")
    return (f"every child of {whose} was refused: the target's token is drawn from the final p′, p without "
            f"them divided by the mass they leave ({last.left:.3f})")


def tree_html(tree: TreeDraft, labels: tuple[str, ...]) -> str:
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(i)
    won = set(tree.path)
    last = tree.path[-1] if tree.path else -1
    judged = {j.node: j for j in sibling_walk(tree)}

    def node(i: int) -> str:
        text = labels[i] if i < len(labels) else str(tree.tokens[i])
        shown = visible(text)
        if judged:  # sampled: the walk says which children were tried and refused
            kind = "won" if i in won else "missed" if i in judged else "other"
        else:
            kind = "won" if i in won else "missed" if tree.parents[i] == last else "other"
        j = judged.get(i)
        walk = (f'<span class="sv-tree-walk" data-tried="{j.order}"> · tried {ordinal(j.order)}: '
                f'p′ {j.before:.2f}, u {j.u:.2f}, {"kept" if j.kept else "refused"}</span>' if j else "")
        return (f'<li class="sv-tree-{kind}"><code class="sv-inspect-tok">{escape(shown) or "∅"}</code>'
                f'<span class="sv-muted"> p={tree.p[i]:.2f}</span>{walk}{branch(i)}</li>')

    def branch(parent: int) -> str:
        kids = children.get(parent, [])
        return f'<ul>{"".join(node(i) for i in kids)}</ul>' if kids else ""

    how = ("; struck through: the children the sibling walk tried and refused, each with its turn, p′ and u"
           if judged else "")
    return (f'<div class="sv-tree" data-nodes="{len(tree.tokens)}"><p class="sv-muted">Tree draft: '
            f'{len(tree.tokens)} candidates in one target forward; the target followed the highlighted '
            f'branch ({len(tree.path)} kept){how}.</p>'
            f'<div class="sv-tree-root">▸ the text so far (the tree’s root){branch(-1)}</div></div>')
