"""Recipe EAGLE: train the feature-level draft head on the target's cached hidden states.

Two losses per position, as in EAGLE: a feature regression (smooth L1 between the
predicted and the target's next hidden state) and a token loss (cross-entropy to the
target's top-K probabilities, read through the target's frozen LM head).

Drafting feeds the head its own predicted features, which teacher forcing never shows
it. Two things close that gap: Gaussian noise on the input features, and a second
"rollout" pass whose input features are the first pass's predictions (so the head learns
to continue from its own output), with the same targets.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..drafters.eagle import Eagle, EagleHead, eagle_config, init_from_target
from .medusa import SUBSET, agreement, head_subset, lm_head, masked_mean, model_of, pad_batch, soft_ce


class EagleRecipe:
    kind = "eagle"

    def __init__(self, subset: int = SUBSET, reg: float = 1.0, tok: float = 0.5, noise: float = 0.05,
                 rollout: float = 0.5):
        self.subset = subset
        self.reg, self.tok = reg, tok  # weights of the feature and token losses
        self.noise = noise  # input feature noise, relative to the features' RMS
        self.rollout = rollout  # weight of the pass on the head's own predicted features (0 = off)

    def build(self, target_loaded, corpus) -> EagleHead:
        target = model_of(target_loaded)
        subset = head_subset(target_loaded, corpus, self.subset)
        head = EagleHead(eagle_config(target, 0 if subset is None else subset.numel()), subset)
        init_from_target(head, target)
        return head.to(target.get_output_embeddings().weight.device)

    def config(self, module: EagleHead) -> dict:
        return dict(module.config)

    def _pass(self, module, head, b, h_in, e, mask):
        """One pass over all positions: (loss, predicted features, metrics)."""
        if module.training and self.noise:
            rms = h_in.detach().pow(2).mean().sqrt()
            h_in = h_in + torch.randn_like(h_in) * self.noise * rms
        pred = module(h_in, e)  # row i predicts the target's hidden after token i+1
        reg = masked_mean(F.smooth_l1_loss(pred, b.hidden[:, 1:], reduction="none").mean(-1), mask)
        logits = head.logits(pred)
        ce = masked_mean(soft_ce(logits, head, b.top_ids[:, 1:], b.top_p[:, 1:]), mask)
        top1 = masked_mean(agreement(logits.detach(), head, b.top_ids[:, 1:]), mask)
        return self.reg * reg + self.tok * ce, pred, {"reg": reg.item(), "ce": ce.item(), "top1": top1.item()}

    def loss(self, module: EagleHead, target_loaded, seqs):
        target = model_of(target_loaded)
        head = lm_head(module, target)
        b = pad_batch(seqs, module.subset.device)
        with torch.no_grad():
            e = target.get_input_embeddings()(b.ids[:, 1:]).float()  # the token after each feature
        mask = b.real(1, b.ids.shape[1] - 1).float()
        total, pred, metrics = self._pass(module, head, b, b.hidden[:, :-1], e, mask)
        if self.rollout:
            # Position i now reads the head's own guess at h_i (the true h_0 has no guess).
            own = torch.cat([b.hidden[:, :1], pred[:, :-1].detach()], dim=1)
            loss2, _, m2 = self._pass(module, head, b, own, e, mask)
            total = total + self.rollout * loss2
            metrics.update({f"{k}_rollout": v for k, v in m2.items()})
        return total, metrics

    def drafter(self, module: EagleHead, target_loaded) -> Eagle:
        return Eagle(model_of(target_loaded), module)


EAGLE = EagleRecipe()
