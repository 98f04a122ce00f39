"""What released EAGLE-3 and Medusa heads compute beyond specviz's own EagleHead and MedusaHeads.

Each piece plugs into the Eagle / Medusa drafters unchanged: a head module, or an LM head
with TargetHead's interface (logits over its rows, `full` back to the target's vocabulary).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..modeling.layers import RMSNorm
from .eagle import EagleHead
from .medusa import MedusaHeads, TargetHead


class Eagle3Head(EagleHead):
    """EAGLE-3's draft layer. `fc` fuses the target's low, middle and high states into one
    feature; the layer attends over (normed embedding, normed feature), 2 * hidden wide, with
    the feature as its residual stream. Its output is the next feature, passed on un-normed;
    only its own LM head reads it, through `lm_norm` (see DraftVocab)."""

    def __init__(self, config: dict, fused: int, draft_vocab: int):
        h, eps = config["hidden_size"], config["rms_norm_eps"]
        super().__init__({**config, "input_norm": False, "final_norm": False, "attention_input": 2 * h})
        self.fc = nn.Linear(fused, h, bias=False)
        self.embed_norm, self.hidden_norm, self.lm_norm = RMSNorm(h, eps), RMSNorm(h, eps), RMSNorm(h, eps)
        self.lm_head = nn.Linear(h, draft_vocab, bias=False)

    def pair(self, h: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if h.shape[-1] == self.fc.in_features:  # the target's fused states; predicted features are narrow
            h = self.fc(h)
        return h, torch.cat([self.embed_norm(e), self.hidden_norm(h)], dim=-1)


class DraftVocab(TargetHead):
    """EAGLE-3's own LM head over its draft vocabulary, whose row j is target token
    to_target[j]. `full` scatters the rows back into the target's vocabulary with -inf
    elsewhere, so q is exactly zero off the draft vocabulary and verification stays exact."""

    def __init__(self, head: Eagle3Head, to_target: torch.Tensor | None, vocab: int):
        # Not TargetHead.__init__: the rows are the head's own, not a slice of the target's.
        self.norm, self.weight, self.bias, self.vocab = head.lm_norm, head.lm_head.weight, None, vocab
        self.subset = None if to_target is None else to_target.to(self.weight.device)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return super().logits(self.norm(h.to(self.weight.dtype)))


class HeadVocabs(TargetHead):
    """Released Medusa heads each end in their own projection to the vocabulary:
    row j of the input (head j's hidden) goes through weight[j]."""

    def __init__(self, weight: torch.Tensor, target):
        ref = target.get_output_embeddings().weight
        self.weight, self.bias, self.subset = weight.to(device=ref.device, dtype=ref.dtype), None, None
        self.vocab = weight.shape[1]

    @property
    def size(self) -> int:
        return self.vocab

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(n, H) hidden of heads 0..n-1 -> (n, vocab)."""
        return torch.einsum("jvh,jh->jv", self.weight[: h.shape[0]], h.to(self.weight.dtype))


class RepeatedHeads(MedusaHeads):
    """Medusa's released code lists one ResBlock medusa_num_layers times per head: the same
    block, h + SiLU(W h), applied that many times."""

    def __init__(self, hidden_size: int, heads: int, repeats: int):
        super().__init__(hidden_size, heads)
        self.repeats = repeats

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = []
        for block in self.blocks:
            x = h
            for _ in range(self.repeats):
                x = x + F.silu(block(x))
            out.append(x)
        return torch.stack(out)
