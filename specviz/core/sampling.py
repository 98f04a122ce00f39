"""Turning logits into the distributions that speculative decoding compares.

"Exact" means: the tokens come from the target's *processed* distribution, the one plain
decoding with the same settings would sample from. So the drafter's q and the target's p
go through the very same processing here, row by row, each row with its own prefix
(repetition penalty depends on which tokens came before that row).

Order of processing follows transformers: repetition penalty, then temperature, top-k,
top-p. Greedy (temperature 0) keeps the penalty and takes the argmax.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import SpecvizError


# The lowest temperature that samples: lower ones are greedy in all but name, and below ~1e-38
# the logits divided by them overflow to inf (torch then refused the distribution).
MIN_TEMPERATURE = 0.01


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 = greedy; otherwise divide logits by it
    top_k: int = 0  # keep the k most likely tokens (0 = all)
    top_p: float = 1.0  # keep the smallest set whose probability reaches top_p (nucleus)
    repetition_penalty: float = 1.0  # >1 discourages tokens already in the context
    seed: int = 0  # seeds the run's one random generator (drafts, draws, resamples)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def validate(self) -> "Sampling":
        t, p, r = self.temperature, self.top_p, self.repetition_penalty
        if not isinstance(t, (int, float)) or math.isnan(t) or math.isinf(t) or t < 0:
            raise SpecvizError(f"temperature must be a number >= 0 (0 = greedy), got {t}")
        if 0 < t < MIN_TEMPERATURE:
            raise SpecvizError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {t:.3g}: below "
                               "that, sampling picks the top token all but always, and dividing the logits by "
                               "a temperature under about 1e-38 overflows")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise SpecvizError(f"top-k must be an integer >= 0 (0 = off), got {self.top_k}")
        if not isinstance(p, (int, float)) or math.isnan(p) or not 0 < p <= 1:
            raise SpecvizError(f"top-p must be in (0, 1], got {p}")
        if not isinstance(r, (int, float)) or math.isnan(r) or math.isinf(r) or r <= 0:
            raise SpecvizError(f"repetition penalty must be a number > 0 (1 = off), got {r}")
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:  # torch's seed range
            raise SpecvizError(f"seed must be a whole number from 0 to 2**64 - 1, got {seed:.4g}"
                               if isinstance(seed, (int, float)) else f"seed must be a whole number, got {seed!r}")
        return self


class Processor:
    """Applies one run's sampling settings to rows of logits.

    Holds the set of tokens seen so far (for the repetition penalty), so each call only
    has to say which extra tokens (drafts) precede each row.
    """

    def __init__(self, sampling: Sampling, vocab_size: int, context: list[int], device):
        self.s = sampling
        self.vocab_size = vocab_size
        self.penalise = sampling.repetition_penalty != 1.0
        self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        self.update(context)

    def update(self, tokens) -> None:
        """Add committed tokens to the context the penalty looks at."""
        if self.penalise and len(tokens):
            t = torch.as_tensor(tokens, device=self.seen.device).long()
            self.seen[t[t < self.vocab_size]] = True

    def _penalty(self, logits: torch.Tensor, draft: torch.Tensor | None, start: int) -> torch.Tensor:
        # Row r sees the committed context plus draft[:start + r].
        rows = logits.shape[0]
        seen = self.seen.expand(rows, -1)
        if draft is not None and draft.numel() and start + rows - 1 > 0:
            extra = torch.zeros(rows, self.vocab_size, dtype=torch.int32, device=logits.device)
            for r in range(rows):
                n = min(start + r, draft.numel())
                if n:
                    extra[r, draft[:n]] = 1
            seen = seen | extra.bool()
        return torch.where(seen, self._scored(logits), logits)

    def _scored(self, logits: torch.Tensor) -> torch.Tensor:
        pen = self.s.repetition_penalty
        return torch.where(logits > 0, logits / pen, logits * pen)

    def _tree_penalty(self, logits: torch.Tensor, tokens: torch.Tensor, parents) -> torch.Tensor:
        # Row 0 (the root) sees the committed context; row i + 1 also node i and its ancestors,
        # its own branch and nothing of its cousins'. Only those (row, token) cells change.
        out = self._penalty(logits, None, 0)
        rows, nodes = [], []
        for i in range(len(parents)):
            a = i
            while a >= 0:
                rows.append(i + 1)
                nodes.append(a)
                a = parents[a]
        if rows:
            r = torch.tensor(rows, device=logits.device)
            t = tokens[torch.tensor(nodes, device=logits.device)]
            out[r, t] = self._scored(logits[r, t])  # a token twice on a branch: the same value twice
        return out

    def probs(self, logits: torch.Tensor, draft: torch.Tensor | None = None, start: int = 0,
              parents=None) -> torch.Tensor:
        """Processed probabilities, one row per logits row.

        A chain's row r follows draft[:start + r]. With `parents` (core/tree.py's) the draft is
        a tree's tokens and the rows are its root's and then each node's, each following its own
        branch. Greedy runs get the temperature-1 softmax (for display only: greedy decisions
        use `argmax` of the same processed logits).
        """
        logits = logits.float()
        if logits.shape[-1] != self.vocab_size:
            logits = fit_vocab(logits, self.vocab_size)
        if self.penalise:
            logits = (self._penalty(logits, draft, start) if parents is None
                      else self._tree_penalty(logits, draft, parents))
        if self.s.greedy:
            return torch.softmax(logits, dim=-1)
        logits = logits / self.s.temperature
        if self.s.top_k and self.s.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.s.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.s.top_p < 1.0:
            probs = top_p_filter(probs, self.s.top_p)
        return probs


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Crop or pad (with -inf) a model's logits to the shared tokenizer's vocabulary.

    Models often pad their embedding matrix past the tokenizer's size; those extra rows
    are never real tokens, so they get probability zero on both sides.
    """
    v = logits.shape[-1]
    if v > vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - v), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the most likely tokens until their mass reaches top_p (always at least one), renormalise."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly before each token
    keep_sorted = before < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(dim=-1, keepdim=True)


def sample(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from non-negative (not necessarily normalised) weights."""
    return torch.multinomial(weights, 1, generator=generator).squeeze(-1)
