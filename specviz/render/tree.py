"""A tree step drawn as nested lists: every candidate branch, the winning one highlighted.

The inspector shows it under the step's table; the branch the target followed is marked
`won`, the first candidate that missed on it `missed`, and the rest stay grey.
"""
from __future__ import annotations

from html import escape

from ..core.events import TreeDraft
from .html import visible


def tree_html(tree: TreeDraft, labels: tuple[str, ...]) -> str:
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(i)
    won = set(tree.path)
    last = tree.path[-1] if tree.path else -1

    def node(i: int) -> str:
        text = labels[i] if i < len(labels) else str(tree.tokens[i])
        shown = visible(text)
        kind = "won" if i in won else "missed" if tree.parents[i] == last else "other"
        return (f'<li class="sv-tree-{kind}"><code class="sv-inspect-tok">{escape(shown) or "∅"}</code>'
                f'<span class="sv-muted"> p={tree.p[i]:.2f}</span>{branch(i)}</li>')

    def branch(parent: int) -> str:
        kids = children.get(parent, [])
        return f'<ul>{"".join(node(i) for i in kids)}</ul>' if kids else ""

    return (f'<div class="sv-tree" data-nodes="{len(tree.tokens)}"><p class="sv-muted">Tree draft: '
            f'{len(tree.tokens)} candidates in one target forward; the target followed the highlighted '
            f'branch ({len(tree.path)} kept).</p><div class="sv-tree-root">▸ pending token{branch(-1)}</div></div>')
