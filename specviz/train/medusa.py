"""Recipe MEDUSA: train residual heads on the target's cached hidden states.

Head j at position i learns the target's own distribution for token i+j+1 (the top-K
probabilities the data cached after token i+j): self-distillation as in Medusa-2, so on
greedy self-distilled text it learns the target's greedy continuation j+1 tokens ahead.
When drafting, the heads read h_i while x_{i+1} is the pending token (the target's own
token, or the prompt's last one at the first step) and x_{i+2}.. are the target's own
continuation, so positions count from the prompt's second-last token on (i + 2 >= the
response start). The target's LM head stays frozen and shared (over a subset of rows);
the heads alone learn.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..drafters.medusa import Medusa, MedusaHeads, TargetHead, heads_config, heads_from
from .data import choose_subset

SUBSET = 8192  # rows of the LM head the drafters read (0 = the full vocabulary)


@dataclass
class Batch:
    ids: torch.Tensor  # (B, T) long, right-padded with 0
    hidden: torch.Tensor  # (B, T, H) float32 target final hidden after each token
    top_ids: torch.Tensor  # (B, T, K) long
    top_p: torch.Tensor  # (B, T, K) float32, 0 on padding
    length: torch.Tensor  # (B,) real tokens per row
    start: torch.Tensor  # (B,) where each response begins
    taps: torch.Tensor | None = None  # (B, T, n * H) float32 inner layers' inputs (EAGLE-3), when loaded

    def real(self, offset: int, width: int) -> torch.Tensor:
        """(B, width) mask: position offset + t is a real token."""
        pos = torch.arange(offset, offset + width, device=self.ids.device)
        return pos.view(1, -1) < self.length.view(-1, 1)


def pad_batch(seqs, device, dtype=torch.float32) -> Batch:
    """Right-pad a list of corpus sequences into tensors (causal layers need no mask then)."""
    T, B = max(len(s.ids) for s in seqs), len(seqs)
    H, K = seqs[0].hidden.shape[-1], seqs[0].top_ids.shape[-1]
    ids = torch.zeros(B, T, dtype=torch.long)
    hidden = torch.zeros(B, T, H, dtype=dtype)
    top_ids = torch.zeros(B, T, K, dtype=torch.long)
    top_p = torch.zeros(B, T, K, dtype=dtype)
    for b, s in enumerate(seqs):
        n = len(s.ids)
        ids[b, :n], hidden[b, :n] = s.ids, s.hidden.to(dtype)
        top_ids[b, :n], top_p[b, :n] = s.top_ids, s.top_p.to(dtype)
    length = torch.tensor([len(s.ids) for s in seqs])
    start = torch.tensor([int(s.response_start) for s in seqs])
    taps = None
    if seqs[0].taps is not None:
        taps = torch.zeros(B, T, seqs[0].taps.shape[-1], dtype=dtype)
        for b, s in enumerate(seqs):
            taps[b, :len(s.ids)] = s.taps.to(dtype)
        taps = taps.to(device)
    return Batch(*(t.to(device) for t in (ids, hidden, top_ids, top_p, length, start)), taps)


def model_of(target_loaded):
    return target_loaded.model


def lm_head(module, target) -> TargetHead:
    """The target's (frozen) LM head over the module's subset, sliced once per module."""
    cached = getattr(module, "_lm", None)
    if cached is None or cached[0] is not target:
        cached = (target, TargetHead(target, module.subset))
        module._lm = cached  # a plain attribute: not a parameter, not saved
    return cached[1]


def soft_ce(logits: torch.Tensor, head: TargetHead, top_ids: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Cross-entropy to the target's top-K probabilities, per position (..,)."""
    logq = torch.log_softmax(logits.float(), dim=-1)
    pos = head.positions(top_ids)
    picked = logq.gather(-1, pos.clamp(min=0)) * (pos >= 0)  # targets off the subset cannot be drafted
    return -(top_p * picked).sum(-1)


def best_tokens(logits: torch.Tensor, head: TargetHead) -> torch.Tensor:
    """The token id of each row's argmax (through the subset): what a greedy draft picks."""
    best = logits.argmax(-1)
    return head.subset[best] if head.subset is not None else best


def agreement(logits: torch.Tensor, head: TargetHead, top_ids: torch.Tensor) -> torch.Tensor:
    """1.0 where the head's argmax is the target's most likely token."""
    return (best_tokens(logits, head) == top_ids[..., 0]).float()


def shift(x: torch.Tensor, s: int) -> torch.Tensor:
    """(B, T, ...) moved s rows earlier along T, zero-filled at the end: row i holds row i+s."""
    return x if s == 0 else F.pad(x[:, s:], (0, 0) * (x.dim() - 2) + (0, s))


def head_subset(target_loaded, corpus, size: int) -> torch.Tensor | None:
    """The rows of the target's LM head to draft from: the most frequent tokens (plus every
    EOS), or None for the full vocabulary."""
    vocab = TargetHead(model_of(target_loaded)).vocab
    if not size or size >= vocab or corpus is None:
        return None
    return choose_subset(corpus.token_counts(vocab)[:vocab], size, always=getattr(target_loaded, "eos_token_ids", ()))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


@dataclass
class MedusaRecipe:
    kind: str = "medusa"
    heads: int = 3  # head j drafts the token j+1 after the newest target state
    subset: int = SUBSET  # rows of the target's LM head the drafts come from (0 = all)

    def build(self, target_loaded, corpus) -> MedusaHeads:
        target = model_of(target_loaded)
        h = target.get_output_embeddings().weight
        module = MedusaHeads(h.shape[1], self.heads, head_subset(target_loaded, corpus, self.subset))
        return module.to(h.device)

    def rebuild(self, config: dict, state_dict: dict, target_loaded) -> MedusaHeads:
        return heads_from(config, state_dict).to(model_of(target_loaded).get_output_embeddings().weight.device)

    def config(self, module: MedusaHeads) -> dict:
        return heads_config(module)

    def loss(self, module: MedusaHeads, target_loaded, seqs):
        target = model_of(target_loaded)
        head = lm_head(module, target)
        b = pad_batch(seqs, module.subset.device)
        T = b.ids.shape[1]
        z = module(b.hidden)  # (heads, B, T, H)
        total, metrics = 0.0, {}
        for j in range(1, len(module.blocks) + 1):
            if T <= j:
                break
            # Head j at position i reads h_i and answers for the target's row i+j.
            width = T - j
            pos = torch.arange(width, device=b.ids.device).view(1, -1)
            mask = (b.real(j, width) & (pos + 2 >= b.start.view(-1, 1))).float()
            logits = head.logits(z[j - 1, :, :width])
            ce = masked_mean(soft_ce(logits, head, b.top_ids[:, j:], b.top_p[:, j:]), mask)
            total = total + ce
            metrics[f"ce{j}"] = ce.item()
            metrics[f"top1_{j}"] = masked_mean(agreement(logits.detach(), head, b.top_ids[:, j:]), mask).item()
        return total, metrics

    @torch.no_grad()
    def drafts(self, module: MedusaHeads, target_loaded, seqs, depth: int) -> torch.Tensor:
        """(B, T, depth): [b, n, d-1] is draft d after context x_<n (-1: none); see evaluate.py."""
        head = lm_head(module, model_of(target_loaded))
        b = pad_batch(seqs, module.subset.device)
        T = b.ids.shape[1]
        out = torch.full((len(seqs), T, depth), -1, dtype=torch.long, device=b.ids.device)
        z = module(b.hidden)
        for d in range(1, min(depth, len(module.blocks)) + 1):
            # Head d reads h_i, the newest state the drafter has after context x_<i+2.
            out[:, 2:, d - 1] = best_tokens(head.logits(z[d - 1]), head)[:, :T - 2]
        return out

    def drafter(self, module: MedusaHeads, target_loaded) -> Medusa:
        return Medusa(model_of(target_loaded), module)


MEDUSA = MedusaRecipe()
