"""Medusa heads: extra prediction heads on the target's final hidden state (Cai et al. 2024).

Head j (1-based) is one residual block, h + SiLU(W_j h), whose output the target's own
LM head reads as the token j+1 positions after h's position (the LM head itself predicts
the next one). Each step drafts from the newest hidden state the drafter has, the one
that predicts the target's pending token, so one pass gives drafts 1..n at once.

The LM head is the target's, shared, never copied into the heads' weights. It can be
restricted to a subset of frequent tokens: q is then zero off the subset and the
verification stays exact, while the head costs a fraction of the full vocabulary's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.tree import best_first
from ..modeling.packing import dense, draft_dtype, linear
from .base import Draft, Drafter, autoregressive_draft, empty_draft
from .drawn import depth_of, draw_tree


class TargetHead:
    """The target's LM head, optionally restricted to `subset` rows (sliced once)."""

    def __init__(self, target, subset: torch.Tensor | None = None, dtype: torch.dtype | None = None):
        """dtype: compute in this dtype (a copy of the rows) instead of the target's."""
        out = target.get_output_embeddings()
        weight = out.weight.detach()
        bias = out.bias.detach() if getattr(out, "bias", None) is not None else None
        self.vocab = weight.shape[0]
        self.subset = subset.to(weight.device) if subset is not None and subset.numel() else None
        if self.subset is not None:
            weight = weight[self.subset]
            bias = bias[self.subset] if bias is not None else None
        if dtype is not None:
            weight, bias = weight.to(dtype), bias.to(dtype) if bias is not None else None
        self.weight, self.bias = weight, bias

    @property
    def size(self) -> int:
        return self.weight.shape[0]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the head's rows (the subset, or the whole vocabulary)."""
        return dense(h.to(self.weight.dtype), self.weight, self.bias)

    def full(self, logits: torch.Tensor) -> torch.Tensor:
        """Scatter subset logits into a full-vocabulary float32 row filled with -inf."""
        if self.subset is None:
            return logits.float()
        out = logits.new_full((*logits.shape[:-1], self.vocab), float("-inf"), dtype=torch.float32)
        out[..., self.subset] = logits.float()
        return out

    def positions(self, ids: torch.Tensor) -> torch.Tensor:
        """Each token id's column in `logits` (-1 where the subset lacks it)."""
        if self.subset is None:
            return ids
        where = torch.full((self.vocab,), -1, dtype=torch.long, device=ids.device)
        where[self.subset.to(ids.device)] = torch.arange(self.size, device=ids.device)
        return where[ids]


class MedusaHeads(nn.Module):
    def __init__(self, hidden_size: int, heads: int = 3, subset: torch.Tensor | None = None):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(heads))
        for block in self.blocks:  # start as the target's LM head: a useful guess at every depth
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)
        self.register_buffer("subset", torch.empty(0, dtype=torch.long) if subset is None else subset.long())

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (heads, ..., H): the hidden each head hands to the LM head."""
        return torch.stack([h + F.silu(linear(block, h)) for block in self.blocks])


def heads_config(heads: MedusaHeads) -> dict:
    return {"hidden_size": heads.blocks[0].in_features, "heads": len(heads.blocks), "subset": heads.subset.numel()}


class Medusa(Drafter):
    name = "medusa"
    needs_hidden = True

    def __init__(self, target, heads: MedusaHeads, name: str | None = None, tree_width: int = 3,
                 lm: TargetHead | None = None):
        """lm: what turns head j's hidden into logits (default: the target's LM head, shared)."""
        self.target, self.heads = target, heads.eval()
        self.tree_width = tree_width  # trees: each head's top candidates, best paths first
        self.head = lm if lm is not None else TargetHead(target, heads.subset)
        if name:
            self.name = name

    def begin(self, prompt_ids, processor, generator, device, hidden=None, trees=False) -> None:
        self.processor, self.generator, self.device, self.trees = processor, generator, device, trees
        self.last = None  # the newest target hidden row: it predicts the pending token
        self._keep(hidden)

    def _keep(self, hidden) -> None:
        if hidden is not None and len(hidden):
            self.last = hidden[-1:].to(self.head.weight.dtype)

    def propose(self, ids, k, min_confidence=0.0) -> Draft:
        if k < 1 or self.last is None:
            return empty_draft(self.device)
        if self.trees and self.tree_width > 1:
            if self.trees == "drawn" and not self.processor.s.greedy:
                return self._drawn(k, min_confidence)
            return self._tree(k, min_confidence)
        k = min(k, len(self.heads.blocks))
        # One pass: head j's hidden, through the (shared) LM head, is draft j.
        logits = self.head.full(self.head.logits(self.heads(self.last)[:k, 0]))
        later = iter(logits[1:])  # heads do not read the drafts: the next row is already there
        return autoregressive_draft(self.processor, self.generator, logits[:1], k, min_confidence,
                                    lambda t: next(later)[None])

    def _tree(self, budget: int, min_confidence: float = 0.0) -> Draft:
        """Every head's top candidates, combined into the `budget` likeliest paths (heads are
        treated as independent, as Medusa's own trees do); with `min_confidence`, only paths at
        least that likely (the likeliest always). Nothing is drawn: the target judges each candidate as
        a one-hot guess (core/tree_sampling.py); sampled runs may draw instead (`_drawn`)."""
        logits = self.head.logits(self.heads(self.last)[:, 0])  # (heads, subset)
        top_p, top_i = torch.softmax(logits.float(), -1).topk(self.tree_width, dim=-1)
        ids = self.head.subset[top_i] if self.head.subset is not None else top_i
        cands = [list(zip(i_row, p_row)) for i_row, p_row in zip(ids.tolist(), top_p.tolist())]
        tokens, parents = best_first(cands, budget, min_confidence)
        return Draft(torch.tensor(tokens, dtype=torch.long, device=self.device), None, tuple(parents))

    def _drawn(self, budget: int, min_confidence: float = 0.0) -> Draft:
        """A tree whose children are drawn from the heads' q (drafters/drawn.py): a depth-d node's
        children from head d + 1's, which reads no draft, so every node of a depth shares it."""
        logits = self.head.full(self.head.logits(self.heads(self.last)[:, 0]))  # (heads, vocab)

        def expand(level, tokens, parents):
            return logits[depth_of(parents, level[0]) if level[0] >= 0 else 0].expand(len(level), -1)

        return draw_tree(self.processor, self.generator, expand, budget, self.tree_width, len(self.heads.blocks),
                         min_confidence)

    def feedback(self, accepted: int, hidden=None, path=None) -> None:
        self._keep(hidden)  # rows for the pending token and the kept drafts: keep the newest


def with_weights(module: torch.nn.Module, state_dict: dict) -> torch.nn.Module:
    """`module` holding a saved state, its `subset` buffer as token ids (EAGLE's head and Medusa's)."""
    module.load_state_dict({k: v.long() if k == "subset" else v for k, v in state_dict.items()})
    return module


def beside(module: torch.nn.Module, target) -> tuple[torch.nn.Module, TargetHead]:
    """A trained head where `target`'s LM head is, in the drafting dtype and frozen, with that LM
    head restricted to the head's subset in the same dtype: what a drafter drafts with."""
    ref = target.get_output_embeddings().weight
    dtype = draft_dtype(ref)
    module = module.to(device=ref.device, dtype=dtype).requires_grad_(False)
    return module, TargetHead(target, module.subset, dtype)


def heads_from(config: dict, state_dict: dict) -> MedusaHeads:
    """Saved heads (see specviz.train.medusa) as a module: their config and weights, on the CPU."""
    return with_weights(MedusaHeads(config["hidden_size"], config["heads"], state_dict.get("subset")), state_dict)


def drafter_from(config: dict, state_dict: dict, target_loaded) -> Medusa:
    """Rebuild trained heads (see specviz.train.medusa) for a loaded target."""
    heads, lm = beside(heads_from(config, state_dict), target_loaded.model)
    return Medusa(target_loaded.model, heads, lm=lm)
