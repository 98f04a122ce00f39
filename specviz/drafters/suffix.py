"""Suffix decoding: draft what followed the context's tail before, in this request and in
earlier answers, the most frequent continuations first.

This follows SuffixDecoding (Oliaro et al., "SuffixDecoding: Extreme Speculative Decoding
for Emerging AI Applications", 2024/2025), the method vLLM ships as `--speculative-config
'{"method": "suffix"}'` through Snowflake's Arctic Inference. Two structures are asked at
every step: one over this request (prompt and answer so far) and one over earlier answers
(SuffixMemory, which outlives the run). Each finds where the context's last m tokens
(m <= max_depth) occurred and counts which tokens followed; a continuation's estimated
probability is the product of those count ratios along its path. The draft is a tree of the
likeliest continuations (greedy runs whose trees the engine can verify) or one chain, never
a node under `min_prob`, at most `factor` tokens per matched token (the paper's
max_spec_factor: a long, specific match may draft long, a one-token match one token), and
of the two structures' drafts the one with the higher score (expected accepted tokens).

Exactness needs nothing new. A greedy draft is a deterministic function of the context and
of the memory as the run found it (answers are added when a run ends, `finish`), verified
like prompt lookup's. Under sampling the chain is drawn: token i from q_i, the frequencies of
what followed the matched tail and the tokens drawn so far, and q is handed to the verifier,
which accepts with min(1, p/q) and resamples from norm(max(p - q, 0)); whether position i is
drafted depends on the drafts before it only. Memory of earlier samples thus makes q an
estimate of the target's own distribution, which raises acceptance beyond a one-hot copy.

Why not Arctic Inference's own suffix tree (`arctic-inference` on PyPI) as a dependency:
version 0.3.0 ships as source only, and building it needs cmake, nanobind, grpcio-tools and
torch >= 2.10 in an isolated build (a second torch download) plus a C++20 compile, for a
package that installs itself as a vLLM plugin. This file and suffix_index.py (~300 lines of
Python, no build) learn from its algorithm (count-ordered children, best-first trees by path
probability, the score, max_spec_factor and min_token_prob) without its code.
"""
from __future__ import annotations

from typing import Iterable

import torch

from ..core.errors import SpecvizError
from ..core.sampling import sample
from .base import Draft, Drafter, empty_draft, without_special
from .suffix_index import Continuation, SuffixIndex, followers, best_match
from .suffix_memory import SuffixMemory

THIS_REQUEST, EARLIER = 1, 2  # where a draft came from; plan's kind is 100 * source + match length
REQUEST = 0  # the one sequence of the per-request index


class Suffix(Drafter):
    name = "suffix decoding"
    tree_width = 4  # followers expanded per node in a tree draft; 0 or 1: chains only

    def __init__(self, memory: SuffixMemory | None = None, max_depth: int = 24, factor: float = 1.0,
                 min_prob: float = 0.1, sure_score: float = 2.0, special: Iterable[int] = ()):
        """memory: earlier answers, shared by the runs that should share it (default: this
        drafter's own). max_depth: the longest tail matched (the paper's tree depth).
        factor: draft at most factor * match length tokens (max_spec_factor). min_prob: no
        node less likely than this (min_token_prob). sure_score: in `suffix+NAME`, the
        expected accepted tokens at which suffix decoding drafts instead of the model
        (Arctic Inference uses its speculator's draft length). special: token ids never drafted
        (base.special_ids: the chat template's markers, which every prompt and answer holds)."""
        self.special = frozenset(int(t) for t in special)
        self.memory = memory if memory is not None else SuffixMemory()
        self.max_depth, self.factor, self.min_prob, self.sure_score = max_depth, factor, min_prob, sure_score
        self.last: tuple[int, Continuation] | None = None  # the latest plan: (source, its draft)

    def begin(self, prompt_ids, processor, generator, device, hidden=None, trees=False) -> None:
        self.processor, self.generator, self.device, self.trees = processor, generator, device, trees
        self.vocab = processor.vocab_size if processor is not None else None
        self.greedy = processor is None or processor.s.greedy
        self.request = SuffixIndex()
        self.prompt_len = len(prompt_ids)
        self.prompt_tail = [int(t) for t in prompt_ids[-self.max_depth:]]
        self.last = self.cached = None
        self.budget = self.max_depth  # the draft size plan asks about: propose's last k
        seqs = self.memory.index.seqs.values()
        if self.vocab is not None and any(s and max(s) >= self.vocab for s in seqs):
            raise SpecvizError("the suffix memory holds token ids beyond this target's vocabulary: it was "
                               "made with another tokenizer; start a new one")

    def _grow(self, ids) -> None:
        """Index the tokens added to the context since the last call (kept ones only)."""
        seen = len(self.request.seqs.get(REQUEST, ()))
        self.request.extend(REQUEST, ids[seen:])

    @property
    def _width(self) -> int:
        # Sampled runs draw a chain from the counts (propose), so plan scores a chain there too.
        return self.tree_width if self.trees and self.greedy and self.tree_width > 1 else 1

    def _best(self, ids, budget: int, min_prob: float) -> tuple[int, Continuation]:
        """The better of this request's and the memory's drafts; on equal scores the longer
        match (more context agreeing), then this request's. Kept for the step: plan and
        propose usually ask the same question (the context only grows between steps)."""
        key = (len(ids), budget, min_prob, self._width)
        if self.cached is not None and self.cached[0] == key:
            return self.cached[1]
        self._grow(ids)
        here = best_match(self.request, ids, self.max_depth, budget, self.factor, min_prob, self._width)
        before = best_match(self.memory.index, ids, self.max_depth, budget, self.factor, min_prob, self._width)
        best = (EARLIER, before) if (before.score, before.match) > (here.score, here.match) else (THIS_REQUEST, here)
        self.cached = (key, best)
        return best

    def plan(self, ids) -> int | None:
        # Sized by the last step's k: with a fixed k, propose then finds the answer ready.
        source, draft = self._best(ids, self.budget, self.min_prob)
        self.last = (source, draft) if draft.tokens else None
        return None if self.last is None else 100 * source + draft.match

    def sure(self, kind: int | None) -> bool:
        """Is this step's match worth more than a model's draft (in `suffix+NAME`)?"""
        return kind is not None and self.last is not None and self.last[1].score >= self.sure_score

    def describe(self, kind: int | None) -> str:
        if self.last is None:
            return ""
        source, d = self.last
        where = "in earlier requests" if source == EARLIER else self._where(d)
        times = "time" if d.seen == 1 else "times"
        return f"suffix tree, {d.match}-token match: followed {d.followed} of {d.seen} {times} {where}"

    def _where(self, d: Continuation) -> str:
        answer = [pos > self.prompt_len for _, pos in d.first]
        return "in this answer" if all(answer) else "in the prompt and this answer" if any(answer) else "in the prompt"

    def propose(self, ids, k, min_confidence=0.0) -> Draft:
        min_prob = max(self.min_prob, min_confidence)
        if k < 1:
            return empty_draft(self.device)
        self.budget = k
        source, d = self._best(ids, k, min_prob)  # the plan's choice, at this step's budget
        self.last = (source, d) if d.tokens else None  # what describe reports for this step
        if not d.tokens:
            return empty_draft(self.device)
        if not self.greedy:
            index = self.memory.index if source == EARLIER else self.request
            found = [(o.seq, o.pos) for o in index.occurrences(ids, self.max_depth) if o.length >= d.match]
            draft = self._sampled(index.seqs, found, min(k, int(d.match * self.factor + 1e-6)), min_prob)
            return without_special(draft, self.special)
        tokens = torch.tensor(d.tokens, dtype=torch.long, device=self.device)
        chain = d.parents == tuple(range(-1, len(d.parents) - 1))  # one branch: verified as a chain
        return without_special(Draft(tokens, None, None if chain else d.parents), self.special)

    def _sampled(self, seqs, found, budget: int, min_prob: float) -> Draft:
        """A chain drawn from the frequencies of what followed, q handed to the verifier."""
        tokens, rows, prob = [], [], 1.0
        for _ in range(budget):
            groups = followers(seqs, found)
            if not groups or prob * max(len(g) for g in groups.values()) / len(found) < min_prob:
                break  # decided from the drafts so far, before anything is drawn here
            q = torch.zeros(self.vocab, dtype=torch.float32, device=self.device)
            for t, g in groups.items():
                q[t] = len(g)
            q /= q.sum()
            t = int(sample(q, self.generator))
            tokens.append(t)
            rows.append(q)
            prob *= len(groups[t]) / len(found)
            found = [(seq, pos + 1) for seq, pos in groups[t]]
        if not tokens:
            return empty_draft(self.device)
        return Draft(torch.tensor(tokens, dtype=torch.long, device=self.device), torch.stack(rows))

    def finish(self, output_ids) -> None:
        """Remember the answer with the prompt's last max_depth tokens before it: the paper keeps
        answers only, but then an answer's first tokens, which follow the prompt's tail (the
        chat template's "assistant" turn), could never be drafted from memory."""
        self.memory.add(self.prompt_tail + list(output_ids))


def suffix_of(drafter) -> Suffix | None:
    """The suffix decoder inside `drafter` (itself, or a `suffix+NAME` pair's copier), if any:
    what a caller that manages memories (the benchmark's series) hands a memory to."""
    drafter = getattr(drafter, "copier", drafter)
    return drafter if isinstance(drafter, Suffix) else None
