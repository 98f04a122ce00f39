"""What suffix decoding remembers: token sequences, where the context's tail occurred in
them, and how often each continuation followed.

SuffixDecoding (Oliaro et al., "SuffixDecoding: Extreme Speculative Decoding for Emerging
AI Applications", 2024/2025; shipped as vLLM's `suffix` method from Snowflake's Arctic
Inference) keeps a suffix tree whose node counts say how many times a string occurred.
Asked about a context, it walks down the context's last m tokens and reads, under that
node, which tokens followed and how often. This module answers the same questions from an
occurrence index instead (for each sequence, token -> the positions right after it): the
occurrences of a tail are found by comparing backwards from the positions that follow its
last token, and a continuation's count is the number of those occurrences it follows. The
counts are the suffix tree's; the memory is one entry per token rather than a tree node per
token and depth (a depth-24 tree of Python objects would take ~24 nodes a token).

`continuations` builds the draft: best first, a node's estimated probability is the product
of count ratios along its path (the paper's frequency score), nodes below `min_prob` are
never drafted, and the draft's score is the sum of its nodes' probabilities, the expected
number of accepted tokens. Pure functions and one small class; no torch.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from typing import Iterable, NamedTuple, Sequence

Place = tuple[int, int]  # (sequence, position): a point in the remembered text (plain tuples: made by the thousand)


class Occurrence(NamedTuple):
    seq: int  # which sequence
    pos: int  # the position right after the matched tail: seqs[seq][pos] followed it
    length: int  # how many tokens of the context's tail matched there


@dataclass(frozen=True)
class Continuation:
    """A draft read off the occurrences: tokens, tree parents (-1: follows the context),
    each node's estimated probability, and how often the first token followed."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()
    followed: int = 0  # times the first token followed the matched tail
    seen: int = 0  # times the matched tail occurred with something after it
    match: int = 0  # tokens of the context's tail that matched
    first: tuple[Place, ...] = ()  # where the first token followed the matched tail

    @property
    def score(self) -> float:
        """Expected accepted tokens if the estimates are right: the sum of node probabilities."""
        return sum(self.probs)


class SuffixIndex:
    """Token sequences by id, each with its occurrence index; sequences grow at the end."""

    def __init__(self):
        self.seqs: dict[int, list[int]] = {}
        self.after: dict[int, dict[int, list[int]]] = {}  # seq -> token -> positions right after it

    def __len__(self) -> int:
        return sum(len(s) for s in self.seqs.values())

    def extend(self, seq: int, tokens: Iterable[int]) -> None:
        """Append tokens to sequence `seq` (a new one if it is not there)."""
        s, after = self.seqs.setdefault(seq, []), self.after.setdefault(seq, {})
        for t in tokens:
            s.append(int(t))
            after.setdefault(s[-1], []).append(len(s))

    def remove(self, seq: int) -> None:
        self.seqs.pop(seq, None)
        self.after.pop(seq, None)

    def occurrences(self, context: Sequence[int], max_depth: int, limit: int = 64) -> list[Occurrence]:
        """Where the context's last token occurred with something after it, each with how far
        back the context matched there (up to max_depth), newest first. A frequent token keeps
        its `limit` longest matches only (the newest among equals): a long match in an old
        answer is never crowded out, and the drafts' cost stays bounded."""
        if not context:
            return []
        last, out, tail = context[-1], [], list(context[-max_depth:])
        for seq in reversed(list(self.seqs)):  # newest sequence first
            s = self.seqs[seq]
            for pos in reversed(self.after[seq].get(last, ())):
                if pos >= len(s):
                    continue  # nothing followed yet (the context's own tail, when it is this sequence)
                depth = min(max_depth, len(context), pos)
                if s[pos - depth:pos] == tail[len(tail) - depth:]:
                    n = depth  # the whole depth at once: repetitive text matches this way everywhere
                else:
                    n = 1
                    while s[pos - 1 - n] == context[-1 - n]:  # stops before depth: that failed
                        n += 1
                out.append(Occurrence(seq, pos, n))
        return sorted(out, key=lambda o: -o.length)[:limit] if len(out) > limit else out


def continuations(seqs: dict[int, list[int]], found: Sequence[Occurrence], budget: int, min_prob: float,
                  width: int) -> Continuation:
    """The best-first tree (width >= 2) or path (width <= 1) of at most `budget` tokens that
    followed the occurrences `found`, every node at least `min_prob` likely."""
    if budget < 1 or not found:
        return Continuation()
    width = max(1, width)
    tokens, parents, probs = [], [], []
    root = followers(seqs, [(o.seq, o.pos) for o in found])
    followed = max(len(g) for g in root.values())
    first = ()
    heap, tie = [], 0  # (-prob, tie, parent, token, occurrences): ties go to the earlier push

    def push(groups: dict[int, list[Place]], parent: int, prob: float, total: int) -> None:
        nonlocal tie
        # The most frequent followers first; equal counts keep the newest occurrence's order.
        for token, group in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:width]:
            p = prob * len(group) / total
            if p >= min_prob:
                heapq.heappush(heap, (-p, tie, parent, token, group))
                tie += 1

    push(root, -1, 1.0, len(found))
    while heap and len(tokens) < budget:
        neg, _, parent, token, group = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        probs.append(-neg)
        if parent == -1 and not first:
            first = tuple(group)
        moved = [(seq, pos + 1) for seq, pos in group]
        # Every occurrence that reached this node counts in the denominator, also those whose
        # sequence ends here: the estimate is how often the text went on this way.
        push(followers(seqs, moved), len(tokens) - 1, -neg, len(moved))
    return Continuation(tuple(tokens), tuple(parents), tuple(probs), followed, len(found),
                        max(o.length for o in found), first)


def followers(seqs, places: Sequence[Place]) -> dict[int, list[Place]]:
    """Places grouped by the token at them (those at a sequence's end dropped)."""
    groups: dict[int, list[Place]] = {}
    for seq, pos in places:
        s = seqs[seq]
        if pos < len(s):
            groups.setdefault(s[pos], []).append((seq, pos))
    return groups


def best_match(index: SuffixIndex, context: Sequence[int], max_depth: int, budget: int, factor: float,
               min_prob: float, width: int) -> Continuation:
    """The highest-scoring draft over every match length, as the paper's speculate does: a
    longer match (fewer, more specific occurrences) may draw up to `factor` tokens per matched
    token, a short one fewer, so the draft's size follows how sure the match is."""
    found = index.occurrences(context, max_depth)
    best = Continuation()
    # Longest match first. A draft's score is at most its size, so once the budget a shorter
    # match would get cannot beat the best score, no shorter match can (ties go to the longer).
    # Only lengths some occurrence reaches change the set of occurrences; between them a
    # longer m only raises the budget, so the longest m with the same set is the one to try.
    for m in sorted({o.length for o in found}, reverse=True):
        cap = min(budget, int(m * factor + 1e-6))
        if cap <= best.score:
            break
        draft = continuations(index.seqs, [o for o in found if o.length >= m], cap, min_prob, width)
        if draft.tokens and draft.score > best.score:
            best = replace(draft, match=m)
    return best
