"""Recipe DRAFT: the distilled draft model (specviz/drafters/distilled.py).

Loss: cross-entropy of the drafter's subset distribution against the target's top-K
probabilities at every position (prompt and response), renormalised over the top-K
tokens the subset holds: the forward KL to the target up to a constant, so it learns
the target's whole ranking, not only its argmax.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..drafters.distilled import DistilledDrafter, DistilledLM, build, config_of
from .data import Corpus, Seq, choose_subset


@dataclass
class DraftRecipe:
    kind: str = "draft"
    subset: int = 8192  # head rows: the most frequent tokens in the training data
    hidden: int = 256
    layers: int = 3
    heads: int = 4
    ffn: int = 768

    def build(self, target_loaded, corpus: Corpus) -> DistilledLM:
        model = target_loaded.model
        vocab = model.get_output_embeddings().weight.shape[0]
        counts = corpus.token_counts(vocab)
        # Only tokens the data shows: the head's bias starts at their frequencies.
        keep = choose_subset(counts, self.subset, target_loaded.eos_token_ids, unseen=False)
        config = {"vocab": vocab, "target_hidden": model.get_input_embeddings().weight.shape[1],
                  "subset": int(keep.numel()), "hidden": self.hidden, "layers": self.layers,
                  "heads": self.heads, "ffn": self.ffn}
        module = build(config, keep)
        with torch.no_grad():
            # Start from the unigram distribution with small logits on top: the loss begins near
            # the data's token entropy instead of wherever a random projection lands.
            module.up.weight.mul_(0.1)
            logf = torch.log(counts[keep].float() + 1)
            module.bias.copy_(logf - torch.logsumexp(logf, 0))
        return module.to(target_loaded.device).attach(model)

    def rebuild(self, config: dict, state_dict: dict, target_loaded) -> DistilledLM:
        module = build(config, state_dict["keep"])
        module.load_state_dict(state_dict)
        return module.to(target_loaded.device).attach(target_loaded.model)

    def config(self, module: DistilledLM) -> dict:
        return config_of(module)

    def loss(self, module: DistilledLM, target_loaded, batch: list[Seq]) -> tuple[torch.Tensor, dict]:
        device = module.keep.device
        ids, top_ids, top_p, valid = _pad(batch, device)
        logq = torch.log_softmax(module(ids), dim=-1)  # (B, T, subset)
        index = _subset_index(module)
        j = index[top_ids]  # (B, T, K): subset position of each top-K token, -1 if outside
        p = top_p * (j >= 0)
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-6)
        ce = -(p * logq.gather(-1, j.clamp_min(0))).sum(-1)  # (B, T)
        n = valid.sum().clamp_min(1)
        loss = (ce * valid).sum() / n
        with torch.no_grad():
            agree = (module.keep[logq.argmax(-1)] == top_ids[..., 0]).float()
            top1 = (agree * valid).sum() / n
        return loss, {"top1": top1.item()}

    @torch.no_grad()
    def drafts(self, module: DistilledLM, target_loaded, batch: list[Seq], depth: int) -> torch.Tensor:
        """(B, T, depth): [b, n, d-1] is draft d after context x_<n (-1: none); see evaluate.py.

        The model reads tokens only, so once drafts 1..d-1 were kept its draft d is its
        next-token guess after x_<n+d-1: row n+d-2 of one causal pass."""
        ids, _, _, _ = _pad(batch, module.keep.device)
        guess = module.keep[module(ids).argmax(-1)]  # (B, T): row r guesses x_{r+1}
        T = ids.shape[1]
        out = torch.full((len(batch), T, depth), -1, dtype=torch.long, device=ids.device)
        for d in range(1, depth + 1):
            lo, hi = max(0, 2 - d), min(T, T + 2 - d)
            out[:, lo:hi, d - 1] = guess[:, lo + d - 2:hi + d - 2]
        return out

    def drafter(self, module: DistilledLM, target_loaded) -> DistilledDrafter:
        module.fused = None  # weights changed since the last fold of the head
        return DistilledDrafter(module)


DRAFT = DraftRecipe()


def _subset_index(module: DistilledLM) -> torch.Tensor:
    """(vocab,) long: position of each token in the subset, -1 when it has none."""
    cached = getattr(module, "_index", None)
    if cached is None or cached.device != module.keep.device:
        cached = torch.full((module.config.vocab,), -1, dtype=torch.long, device=module.keep.device)
        cached[module.keep] = torch.arange(module.keep.numel(), device=module.keep.device)
        module._index = cached
    return cached


def _pad(batch: list[Seq], device):
    """Right-padded ids, top_ids, top_p (float) and a mask of positions with a next token."""
    width = max(len(s.ids) for s in batch)
    k = batch[0].top_ids.shape[1]
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    top_ids = torch.zeros(len(batch), width, k, dtype=torch.long)
    top_p = torch.zeros(len(batch), width, k)
    valid = torch.zeros(len(batch), width)
    for i, s in enumerate(batch):
        t = len(s.ids)
        ids[i, :t], top_ids[i, :t], top_p[i, :t] = s.ids, s.top_ids, s.top_p.float()
        valid[i, :max(0, t - 1)] = 1  # the last row predicts past the end of the text
    return ids.to(device), top_ids.to(device), top_p.to(device), valid.to(device)
