"""One verify step: a single target forward over the pending token and the draft, the
acceptance decision, the target's cache cut back to what was kept, and everything the
step reports brought to the host in one transfer.

Chains follow core/verify.py's rule (greedy, or rejection sampling against q) or, sampled and
asked for, block verification (core/block_verify.py); trees follow
the target's argmax (core/tree.py) or, sampled, the sibling walk (core/tree_sampling.py) for
chosen children and recursive rejection sampling (core/tree_drawn.py) for children drawn from q.
Neither asks which drafter drafted: a draft is tokens, maybe q, maybe parents. The engine
owns the run; this module is told all it uses.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.block_verify import verify_block
from ..core.events import BlockCheck, StepEvent, TreeDraft
from ..core.sampling import Processor, fit_vocab, sample
from ..core.tree import check_parents, depths, greedy_walk, tree_mask
from ..core.tree_drawn import keep_chances, sample_drawn_tree
from ..core.tree_sampling import sample_tree, walk_order
from ..core.verify import one_hot_q, verify_greedy, verify_sampled
from ..drafters.base import Draft
from ..modeling.forward import forward, rollback, to_host
from ..modeling.layers import KVCache


@dataclass(frozen=True)
class Verdict:
    """What verification decided, on the host: the StepEvent's fields about the draft (same
    names and meanings; a tree step's `draft` is its chain view), and the target's hidden
    rows that a feature drafter's feedback needs."""

    draft: tuple[int, ...]
    q: tuple[float, ...] | None
    p: tuple[float, ...]
    accept_prob: tuple[float, ...]
    draws: tuple[float, ...] | None
    accepted: int
    token: int
    token_p: float
    top: tuple[tuple[int, float], ...]
    tree: TreeDraft | None = None
    verification: str = "token"
    block: BlockCheck | None = None
    p_top: tuple[tuple[tuple[int, float], ...], ...] = ()
    q_top: tuple[tuple[tuple[int, float], ...], ...] = ()
    p_raw: tuple[tuple[tuple[int, float], ...], ...] = ()
    q_raw: tuple[tuple[tuple[int, float], ...], ...] = ()
    hidden: torch.Tensor | None = None  # rows of the pending token and the kept drafts

    @property
    def token_kind(self) -> str:
        return "bonus" if self.accepted == len(self.draft) else "corrected"

    def event(self, **step) -> StepEvent:
        """The StepEvent of this verdict; `step` gives the engine's fields (step, position,
        emitted, times, greedy)."""
        return StepEvent(draft=self.draft, q=self.q, p=self.p, accept_prob=self.accept_prob, draws=self.draws,
                         accepted=self.accepted, token=self.token, token_p=self.token_p, token_kind=self.token_kind,
                         top=self.top, tree=self.tree, p_top=self.p_top, q_top=self.q_top,
                         p_raw=self.p_raw, q_raw=self.q_raw, verification=self.verification, block=self.block,
                         **step)


def _rows(values: list[float], ids: list[float], width: int) -> tuple[tuple[tuple[int, float], ...], ...]:
    """Flattened (rows, width) torch.topk results back as rows of (token, prob) pairs."""
    return tuple(tuple((int(ids[r + j]), values[r + j]) for j in range(width))
                 for r in range(0, len(values), width)) if width else ()


FLOOR = -1e4  # log-probs of tokens a top-k / top-p cut removed (-inf is not JSON); exp() is 0


def _raw_top(logits: torch.Tensor, processor: Processor, q: torch.Tensor | None, width: int):
    """The top `width` temperature-1 log-probs of the target's raw logits and of the drafter's
    q (its processed probabilities, brought back to temperature 1: q = softmax(l / T), so
    T * log q is l up to a constant; a token a cut removed stays at FLOOR)."""
    if not width:
        return None
    width = min(width, processor.vocab_size)
    lp = torch.log_softmax(fit_vocab(logits.float(), processor.vocab_size), -1)
    p_v, p_i = torch.topk(lp, width)
    if q is None:
        return p_v.clamp_min(FLOOR), p_i, p_v.new_zeros(0), p_i.new_zeros(0)
    lq = torch.log_softmax((processor.s.temperature or 1.0) * torch.log(q.float()), -1)
    q_v, q_i = torch.topk(lq, min(width, q.shape[-1]))
    return p_v.clamp_min(FLOOR), p_i, q_v.clamp_min(FLOOR), q_i


def trees_verifiable(cache) -> bool:
    """Tree drafts need a position-indexed cache (only it keeps scattered rows). Greedy or
    sampled, with or without a repetition penalty: each tree row is processed with its own
    branch, as a chain's row is with its own prefix."""
    return isinstance(cache, KVCache)


def verify_chain(target, cache, context: int, pending: torch.Tensor, draft: Draft, processor: Processor,
                 generator: torch.Generator, *, greedy: bool, top: int, raw_top: int = 0,
                 hidden: bool | tuple = False, rule: str = "token") -> Verdict:
    """Verify a chain draft after `context` tokens (the pending one included; the cache holds
    all but it) and cut the cache back to the context plus the kept drafts. Sampled, `rule`
    ("token" or "block") judges the draft; block verification's arithmetic is reported either
    way, from the same draws, so the step shows what both rules keep."""
    d, k = draft.tokens, draft.tokens.numel()
    # One target forward over the pending token and the draft; row i is the target's
    # distribution after draft[:i], row k the bonus position.
    out = forward(target, torch.cat([pending, d]), cache, hidden=hidden)
    logits, h = out if hidden else (out, None)
    p = processor.probs(logits, d, start=0)
    idx = torch.arange(k, device=pending.device)
    if greedy:
        n, token = verify_greedy(p.argmax(-1), d)
        a = (d == p[:k].argmax(-1)).float()
        draws = a.new_zeros(0)
        b = None
    else:
        q = draft.q if draft.q is not None else one_hot_q(d, processor.vocab_size)
        draws = torch.rand(k, generator=generator, device=pending.device)
        n, dist, a = verify_sampled(p, q, d, draws)
        b = verify_block(p, q, d, draws)
        if rule == "block":
            n, dist = b.accepted, b.dist
        token = sample(dist, generator)
    q_d = draft.q[idx, d] if draft.q is not None else a.new_zeros(0)
    # The top of every row, the target's and (where it gave q) the drafter's: what a reader
    # needs to draw p against q at each position.
    width = min(top, processor.vocab_size)
    top_v, top_i = torch.topk(p, width)
    q_width = min(width, draft.q.shape[-1]) if draft.q is not None else 0
    q_v, q_i = torch.topk(draft.q, q_width) if q_width else (a.new_zeros(0), a.new_zeros(0))
    raw = _raw_top(logits, processor, draft.q, raw_top) or (a.new_zeros(0),) * 4
    block = (b.weight[1:], b.residual_mass, b.stop_prob) if b is not None else (a.new_zeros(0),) * 3

    # One host synchronisation: everything the step reports, in one transfer.
    (n, token, token_p, d_host, p_d, q_d, a, draws, top_v, top_i, q_v, q_i, *raw, b_w, b_r, b_h) = to_host(
        n, token, p[n, token], d, p[idx, d], q_d, a, draws, top_v, top_i, q_v, q_i, *raw, *block)
    n = int(n[0])
    p_top = _rows(top_v, top_i, width)
    rollback(cache, context + n)
    return Verdict(
        draft=tuple(int(x) for x in d_host), q=tuple(q_d) if draft.q is not None else None, p=tuple(p_d),
        accept_prob=tuple(a), draws=None if greedy else tuple(draws), accepted=n, token=int(token[0]),
        verification="token" if greedy else rule, block=None if greedy else BlockCheck(tuple(b_w), tuple(b_r), tuple(b_h)),
        token_p=token_p[0], top=p_top[n] if width else (), hidden=h[: n + 1] if hidden else None,
        p_top=p_top, q_top=_rows(q_v, q_i, q_width),
        # rounded: 6 decimals of a log-prob are plenty, and they are most of a trace file's bytes
        p_raw=_rows([round(v, 6) for v in raw[0]], raw[1], len(raw[1]) // (k + 1)),
        q_raw=_rows([round(v, 6) for v in raw[2]], raw[3], len(raw[3]) // k) if k else (),
    )


def _greedy_path(p: torch.Tensor, parents: tuple, reported: tuple):
    """The walk down the target's argmax, brought to the host with `reported` in the step's one transfer."""
    best, g = p.max(-1)
    *reported, argmax, best_p = to_host(*reported, g, best)
    path, token = greedy_walk([int(x) for x in reported[0]], parents, [int(x) for x in argmax])
    return path, token, best_p[path[-1] + 1 if path else 0], reported, ((),) * 5


def _sampled_path(p: torch.Tensor, draft: Draft, parents: tuple, generator: torch.Generator, reported: tuple):
    """The sibling walk (chosen children) or recursive rejection sampling (drawn from q: the draft has q), then the
    target's token; each node's accept_prob, coin, residual mass and q_j(x) come with `reported`, in one transfer."""
    draws = torch.rand(len(parents), generator=generator, device=draft.tokens.device)
    drawn = draft.q is not None
    s = sample_drawn_tree(draft.tokens, parents, p, draft.q, draws) if drawn else \
        sample_tree(draft.tokens, parents, p, draws)
    token = sample(s.dist, generator)
    host = to_host(*reported, token, p[s.row, token], s.on_path, s.tried, s.accept_prob, s.residual_mass, draws,
                   *([s.q_x] if drawn else []))
    token, token_p, on_path, tried, a, left, u, *qx = host[len(reported):]
    path, walk = walk_order(parents, on_path, tried)
    return path, int(token[0]), token_p[0], host[:len(reported)], (walk, a, u, left, qx)


def _chain_view(parents: tuple, path: list, a, u, greedy: bool):
    """The chain view: the accepted path then the first child that missed, with their accept_prob and draws."""
    last = path[-1] if path else -1
    missed = next((i for i, parent in enumerate(parents) if parent == last), None)
    shown = [*path, *([missed] if missed is not None else [])]
    if greedy:
        return shown, (1.0,) * len(path) + (0.0,) * (len(shown) - len(path)), None
    return shown, tuple(a[i] for i in shown), tuple(u[i] for i in shown)


def _walked_tree(tokens: list, parents: tuple, path: list, node_p, walk, a, u, left, qx) -> TreeDraft:
    """The step's TreeDraft: every node and the path; sampled, each judged node's numbers in walk order."""
    return TreeDraft(tuple(tokens), parents, tuple(path), tuple(node_p), walk=tuple(walk),
                     accept_prob=tuple(a[i] for i in walk), draws=tuple(u[i] for i in walk),
                     residual_mass=tuple(left[i] for i in walk), q=tuple(qx[0][i] for i in walk) if qx else (),
                     keep=tuple(keep_chances(parents, a)) if qx else ())


def verify_tree(target, cache: KVCache, pending: torch.Tensor, draft: Draft, processor: Processor,
                generator: torch.Generator, *, greedy: bool, top: int, hidden: bool | tuple = False) -> Verdict:
    """Verify a tree draft: one forward over the root and every node with the tree mask, then
    greedily a walk down the target's argmax, or sampled the sibling walk of
    core/tree_sampling.py (chosen children) or recursive rejection sampling of core/tree_drawn.py
    (children drawn from q: the draft has q); the cache keeps the root and the accepted path only (entries moved,
    nothing recomputed).

    The verdict's chain view is the winning branch plus the first child that missed, so
    chain renderers show a tree step like any other; a sampled step's TreeDraft also holds
    every judged node's p'(x), coin and residual mass (the sibling walk)."""
    parents = tuple(draft.parents)
    check_parents(parents)
    device = pending.device
    start, m = cache.length, len(parents)
    positions = torch.tensor([0] + depths(parents), device=device) + start
    mask = torch.cat([torch.ones(m + 1, start, dtype=torch.bool, device=device), tree_mask(parents, device)], 1)
    logits, h = forward(target, torch.cat([pending, draft.tokens]), cache, hidden=hidden or True, mask=mask,
                        positions=positions)
    # Each row processed as plain decoding would after its own branch (the penalty sees that
    # branch's tokens only); greedy: the temperature-1 softmax, decided by its argmax.
    p = processor.probs(logits, draft.tokens, parents=parents)
    parent_rows = torch.tensor([q + 1 for q in parents], device=device, dtype=torch.long)
    node_p = p[parent_rows, draft.tokens]
    width = min(top, p.shape[-1])
    top_v, top_i = torch.topk(p, width) if width else (p.new_zeros(m + 1, 0), parent_rows.new_zeros(m + 1, 0))
    # A block drafter's chosen tree: each depth's q, the same for every node there, for the chain view's rows.
    depth_q = draft.position_q if draft.position_q is not None and width else None
    q_v, q_i = torch.topk(depth_q, min(width, depth_q.shape[-1])) if depth_q is not None else \
        (node_p.new_zeros(0, 0),) * 2
    reported = (draft.tokens, node_p, top_v, top_i, q_v, q_i)
    path, token, token_p, reported, judged = _greedy_path(p, parents, reported) if greedy else \
        _sampled_path(p, draft, parents, generator, reported)
    tokens, node_p, top_v, top_i, q_v, q_i = reported
    tokens = [int(x) for x in tokens]
    row = path[-1] + 1 if path else 0
    keep = [0] + [i + 1 for i in path]
    cache.keep_rows(start, keep)
    shown, accept_prob, draws = _chain_view(parents, path, judged[1], judged[2], greedy)
    rows = _rows(top_v, top_i, width)  # every node's; the chain view's are the root's and the shown nodes'
    q_rows = _rows(q_v, q_i, len(q_i) // len(depth_q)) if depth_q is not None else ()
    return Verdict(
        draft=tuple(tokens[i] for i in shown), q=None, p=tuple(node_p[i] for i in shown), accept_prob=accept_prob,
        draws=draws, accepted=len(path), token=token, token_p=token_p, top=rows[row] if width else (),
        tree=_walked_tree(tokens, parents, path, node_p, *judged), hidden=h[keep].float() if hidden else None,
        p_top=tuple(rows[r] for r in [0, *(i + 1 for i in shown)]) if width else (),
        q_top=tuple(q_rows[d] for d in range(len(shown))) if q_rows else (),
    )
