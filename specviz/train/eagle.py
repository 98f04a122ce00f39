"""Recipe EAGLE: train the feature-level draft head on the target's cached hidden states.

Two losses per position, as in EAGLE: a feature regression (smooth L1 between the
predicted and the target's next hidden state) and a token loss (cross-entropy to the
target's top-K probabilities, read through the target's frozen LM head).

Drafting feeds the head its own predicted features, which teacher forcing never shows
it. So training drafts as the engine does ("training-time test", EAGLE-3 / HASS): from
every position at once the head is unrolled `unroll` steps on its own features, and step s
is scored as draft s+1 would be. Its queries see the true features before the chain start
and the chain's own earlier steps, exactly the pairs the head's cache holds when it drafts.
Step s's loss is weighted decay**s; input features also get a little Gaussian noise.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core.errors import SpecvizError
from ..drafters.eagle import Eagle, EagleHead, deepened, eagle_config, fused, head_from, init_from_target, widened
from .data import taps_text
from .medusa import (SUBSET, agreement, best_tokens, head_subset, lm_head, masked_mean, model_of, pad_batch,
                     shift, soft_ce)


def unrolled(head: EagleHead, h: torch.Tensor, e: torch.Tensor, depth: int, noise: float = 0.0) -> list[torch.Tensor]:
    """The head's own chain from every position: out[s][:, i] predicts h_{i+1+s}.

    h (B, W, H): the target's features h_0..h_{W-1} (a fused head: (B, W, n * H), its taps);
    e (B, W, H): embeddings of x_1..x_W.
    Step 0 reads the true pairs (h_i, x_{i+1}); step s reads (its own step s-1 output,
    x_{i+1+s}) at position i+s and attends to the true pairs 0..i and to the chain's own
    steps 1..s at row i: what drafting at depth s+1 sees once drafts 1..s were kept.
    Rows past the text (i + s >= W) read zero embeddings; callers mask them out.
    `noise`: Gaussian noise on the true final states, relative to their RMS.
    """
    W = h.shape[1]
    if noise:  # on the final state only: drafting replaces it with predictions (a fused head's taps stay true)
        H = head.fc.out_features
        last = h[..., -H:]
        h = torch.cat([h[..., :-H], last + torch.randn_like(last) * noise * last.detach().pow(2).mean().sqrt()], -1)
    rows = torch.arange(W, device=h.device)
    keys, values = [[] for _ in range(head.depth)], [[] for _ in range(head.depth)]
    out, f = [], h
    for s in range(depth):
        # Row i sees step 0's rows 0..i, then its own row in each later step (every layer alike).
        mask = None if s == 0 else torch.cat([rows[None, :] <= rows[:, None]] + [rows[None, :] == rows[:, None]] * s, 1)

        def attend(layer, q, k, v, mask=mask):
            keys[layer].append(k)
            values[layer].append(v)
            if mask is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return F.scaled_dot_product_attention(q, torch.cat(keys[layer], dim=2), torch.cat(values[layer], dim=2),
                                                  attn_mask=mask, enable_gqa=True)

        f = head.run(f, shift(e, s), rows + s, attend)
        out.append(f)
    return out


@dataclass
class EagleRecipe:
    kind: str = "eagle"
    subset: int = SUBSET  # rows of the target's LM head the drafts come from (0 = all)
    reg: float = 1.0  # weight of the feature regression
    tok: float = 0.5  # weight of the token loss
    noise: float = 0.05  # input feature noise, relative to the features' RMS
    unroll: int = 4  # drafting steps unrolled in training (1 = teacher forcing only)
    decay: float = 0.8  # step s's loss is weighted decay**s
    # EAGLE-3's feature fusion: inner target layers whose inputs the head also reads, beside
    # the final state (their inputs recorded beside the data: data.record_taps). () = EAGLE-1.
    taps: tuple[int, ...] = ()
    # Hidden units of the head's MLP (0: the target layer's own). More is more capacity and more
    # bytes per draft step; from a narrower --init the new units start silent (drafters.eagle.widened).
    width: int = 0
    # Decoder layers in the head (0: one, the paper's). From a shallower --init the new layers
    # start silent (drafters.eagle.deepened).
    depth: int = 0

    def build(self, target_loaded, corpus) -> EagleHead:
        target = model_of(target_loaded)
        subset = head_subset(target_loaded, corpus, self.subset)
        config = eagle_config(target, 0 if subset is None else subset.numel())
        head = EagleHead({**config, "intermediate_size": self.width or config["intermediate_size"],
                          **({"layers": self.depth} if self.depth > 1 else {})}, subset)
        init_from_target(head, target)
        if self.taps:
            head = fused(head, self.layers(target))
        return head.to(target.get_output_embeddings().weight.device)

    def rebuild(self, config: dict, state_dict: dict, target_loaded) -> EagleHead:
        """A saved head; with taps, an unfused one gains the fusion, starting as itself (a
        warm start: a checkpoint resumed so is refused by the loop, its optimiser state differs)."""
        target = model_of(target_loaded)
        head = head_from(config, state_dict)
        have = list(config.get("hidden_layers") or ())
        if self.taps and not have:
            head = fused(head, self.layers(target))
        elif have != (self.layers(target) if self.taps else []):
            raise SpecvizError("this EAGLE head " + (f"fuses layers {taps_text(have[:-1])} with the final state; "
                               f"train it with --taps {taps_text(have[:-1], ',')}" if have else
                               "reads the final state alone; train it without --taps"))
        width = head.config["intermediate_size"]
        if self.width and self.width != width:
            if self.width < width:
                raise SpecvizError(f"this EAGLE head's MLP has {width} units; it can grow, not shrink to {self.width}")
            head = widened(head, self.width)
        if self.depth and self.depth != head.depth:
            if self.depth < head.depth:
                raise SpecvizError(f"this EAGLE head has {head.depth} layers; it can grow, not shrink to {self.depth}")
            head = deepened(head, self.depth)
        return head.to(target.get_output_embeddings().weight.device)

    def layers(self, target) -> list[int]:
        """What a fused head reads: the taps, then the final state (numbered L, as forward does)."""
        return sorted(self.taps) + [target.config.get_text_config().num_hidden_layers]

    def config(self, module: EagleHead) -> dict:
        return dict(module.config)

    def _chain(self, module, target_loaded, seqs, depth, noise=0.0):
        b = pad_batch(seqs, module.subset.device)
        with torch.no_grad():
            e = model_of(target_loaded).get_input_embeddings()(b.ids[:, 1:]).float()  # x_1..x_{T-1}
        h = b.hidden[:, :-1]
        if module.fuse is not None:
            if b.taps is None:
                raise SpecvizError("this EAGLE head fuses inner layers, but the data was loaded without them")
            h = torch.cat([b.taps[:, :-1], h], -1)
        return b, unrolled(module, h, e, depth, noise)

    def loss(self, module: EagleHead, target_loaded, seqs):
        head = lm_head(module, model_of(target_loaded))
        b, preds = self._chain(module, target_loaded, seqs, self.unroll, self.noise if module.training else 0.0)
        W = b.ids.shape[1] - 1
        total, metrics = 0.0, {}
        for s, pred in enumerate(preds):
            mask = b.real(1 + s, W).float()  # row i's answer, the target's row i+1+s, is real text
            reg = masked_mean(F.smooth_l1_loss(pred, shift(b.hidden[:, 1:], s), reduction="none").mean(-1), mask)
            logits = head.logits(pred)
            top_ids = shift(b.top_ids[:, 1:], s)
            ce = masked_mean(soft_ce(logits, head, top_ids, shift(b.top_p[:, 1:], s)), mask)
            total = total + self.decay ** s * (self.reg * reg + self.tok * ce)
            if s == 0:
                metrics["reg"] = reg.item()
            metrics[f"ce{s + 1}"] = ce.item()
            metrics[f"top1_{s + 1}"] = masked_mean(agreement(logits.detach(), head, top_ids), mask).item()
        return total, metrics

    @torch.no_grad()
    def drafts(self, module: EagleHead, target_loaded, seqs, depth: int) -> torch.Tensor:
        """(B, T, depth): [b, n, d-1] is draft d after context x_<n (-1: none); see evaluate.py."""
        head = lm_head(module, model_of(target_loaded))
        b, preds = self._chain(module, target_loaded, seqs, depth)
        T = b.ids.shape[1]
        out = torch.full((len(seqs), T, depth), -1, dtype=torch.long, device=b.ids.device)
        for s, pred in enumerate(preds):
            # Chain start i (true h_i, pending x_{i+1}) is the step after context x_<i+2.
            out[:, 2:, s] = best_tokens(head.logits(pred), head)[:, :T - 2]
        return out

    def drafter(self, module: EagleHead, target_loaded) -> Eagle:
        return Eagle(model_of(target_loaded), module)


EAGLE = EagleRecipe()
