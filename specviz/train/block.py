"""Recipe BLOCK: train the block drafter (drafters/block.py) on the target's cached states.

Each step picks `anchors` positions at random in every sequence's response (the pending token a
block would follow: the prompt's last token counts, where the engine's first step starts) and
runs one block per anchor, all in one forward, as DFlash trains: the anchor's token and K masks,
each block's rows seeing the context features before its anchor and its own block only (the
attention mask below), so every block is what drafting at that anchor computes. Row j is scored
against the target's own top-K distribution for the j-th token after the anchor, given the true
text before it (cross-entropy, as the other recipes), weighted decay**(j-1): a later position is
only worth anything once the earlier ones were kept.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core.errors import SpecvizError
from ..drafters.block import BLOCK, BlockDrafter, BlockHead, block_config, head_from
from .data import taps_text
from .medusa import SUBSET, best_tokens, head_subset, lm_head, model_of, pad_batch, soft_ce


def anchor_rows(start: torch.Tensor, length: torch.Tensor, anchors: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, anchors) anchor positions drawn uniformly (torch's global generator, which the training
    loop seeds per step) from each row's [start - 1, length - 2], and whether the row has any."""
    low = (start - 1).clamp(min=0)
    span = (length - 1 - low).clamp(min=0)  # anchors whose block has at least one token to predict
    a = low[:, None] + (torch.rand(len(start), anchors, device=start.device) * span[:, None]).long()
    return torch.minimum(a, (length - 2).clamp(min=0)[:, None]), (span > 0)[:, None].expand(-1, anchors)


def block_mask(a: torch.Tensor, T: int, rows: int) -> torch.Tensor:
    """(B, 1, A * rows, T + A * rows): block i's rows see the context before its anchor a[:, i]
    and their own block, nothing else."""
    B, A = a.shape
    owner = torch.arange(A, device=a.device).repeat_interleave(rows)  # which block each row belongs to
    context = torch.arange(T, device=a.device)[None, None, :] < a.repeat_interleave(rows, 1)[:, :, None]
    own = (owner[:, None] == owner[None, :]).expand(B, -1, -1)
    return torch.cat([context, own], -1)[:, None]


def run_blocks(module: BlockHead, target, b, a: torch.Tensor) -> torch.Tensor:
    """The blocks at anchors a (B, A) over batch b: their features (B, A, K, H), row j - 1 for the
    j-th token after each anchor."""
    B, T = b.ids.shape
    A, R = a.shape[1], module.size + 1
    h = b.hidden if b.taps is None else torch.cat([b.taps, b.hidden], -1)
    if module.tap_norms and b.taps is None:
        raise SpecvizError("this block drafter reads inner target layers, but the data was loaded without them")
    context = module.context(h, torch.arange(T, device=h.device))
    with torch.no_grad():
        pending = target.get_input_embeddings()(b.ids.gather(1, a)).float()  # (B, A, H)
    x = module.inputs(pending.reshape(B * A, -1)).reshape(B, A * R, -1)
    positions = (a[:, :, None] + torch.arange(R, device=a.device)).reshape(B, A * R)
    mask = block_mask(a, T, R)

    def attend(layer, q, k, v):
        keys, values = context[layer]
        return F.scaled_dot_product_attention(q, torch.cat([keys, k], 2), torch.cat([values, v], 2), attn_mask=mask,
                                              enable_gqa=True)

    return module.block(x, positions, attend).reshape(B, A, R, -1)[:, :, 1:]


@dataclass
class BlockRecipe:
    kind: str = "block"
    subset: int = SUBSET  # rows of the target's LM head the drafts come from (0 = all)
    block: int = BLOCK  # K: the longest block it drafts
    depth: int = 2  # decoder layers
    width: int = 0  # hidden units of each layer's MLP (0: the target layer's own)
    anchors: int = 16  # blocks per sequence per step
    decay: float = 0.8  # position j's loss is weighted decay**(j-1)
    # Inner target layers whose inputs the drafter reads beside the final state (EAGLE-3's taps,
    # recorded beside the data: data.record_taps). () = the final state alone.
    taps: tuple[int, ...] = ()
    eval_blocks: tuple[int, ...] = (8, 16)  # block sizes the card's held-out run also measures (chains)

    def build(self, target_loaded, corpus) -> BlockHead:
        target = model_of(target_loaded)
        subset = head_subset(target_loaded, corpus, self.subset)
        config = block_config(target, self.block, self.depth, 0 if subset is None else subset.numel(),
                              tuple(self.read(target)))
        if self.width:
            config["intermediate_size"] = self.width
        head = BlockHead(config, subset)
        with torch.no_grad():
            # The context feature starts as the target's final state; the mask as an embedding's scale.
            h = config["hidden_size"]
            head.fuse.weight.zero_()
            head.fuse.weight[:, -h:] = torch.eye(h)
            emb = target.get_input_embeddings().weight
            head.mask.normal_(0.0, float(emb.float().std()))
            final = getattr(getattr(target, "model", None), "norm", None)
            if getattr(final, "weight", None) is not None and final.weight.shape == head.norm.weight.shape:
                head.norm.weight.copy_(final.weight)  # the features it predicts live where the target's do
        return head.to(emb.device)

    def read(self, target) -> list[int]:
        """What the drafter reads: the taps, then the final state (numbered L, as forward does); [] without taps."""
        return sorted(self.taps) + [target.config.get_text_config().num_hidden_layers] if self.taps else []

    def rebuild(self, config: dict, state_dict: dict, target_loaded) -> BlockHead:
        target = model_of(target_loaded)
        have = list(config.get("hidden_layers") or ())
        if have != self.read(target):
            raise SpecvizError("this block drafter " + (f"reads layers {taps_text(have[:-1])} beside the final state; "
                               f"train it with --taps {taps_text(have[:-1], ',')}" if have else
                               "reads the final state alone; train it without --taps"))
        for name, want in (("block", self.block), ("layers", self.depth)):
            if want and config[name] != want:
                raise SpecvizError(f"this block drafter has {name} {config[name]}, not {want}: train it with "
                                   f"--{'block' if name == 'block' else 'head-layers'} {config[name]}")
        return head_from(config, state_dict).to(target.get_output_embeddings().weight.device)

    def config(self, module: BlockHead) -> dict:
        return dict(module.config)

    def loss(self, module: BlockHead, target_loaded, seqs):
        target = model_of(target_loaded)
        head = lm_head(module, target)
        b = pad_batch(seqs, module.subset.device)
        a, ok = anchor_rows(b.start, b.length, self.anchors)
        logits = head.logits(run_blocks(module, target, b, a))  # (B, A, K, subset)
        K = module.size
        where = a[:, :, None] + torch.arange(K, device=a.device)  # the row holding position j's target: a + j - 1
        real = ok[:, :, None] & (where + 1 < b.length[:, None, None])
        where = where.clamp(max=b.ids.shape[1] - 1).reshape(len(seqs), -1)
        pick = lambda x: x.gather(1, where[..., None].expand(-1, -1, x.shape[-1])).reshape(*logits.shape[:3], -1)
        top_ids, top_p = pick(b.top_ids), pick(b.top_p)
        ce = soft_ce(logits, head, top_ids, top_p)  # (B, A, K)
        mask = real.float()
        per = (ce * mask).sum((0, 1)) / mask.sum((0, 1)).clamp(min=1)  # each position's mean
        weight = self.decay ** torch.arange(K, device=a.device, dtype=per.dtype)
        total = (weight * per).sum() / weight.sum()
        hit = (best_tokens(logits.detach(), head) == top_ids[..., 0]).float()
        top1 = (hit * mask).sum((0, 1)) / mask.sum((0, 1)).clamp(min=1)
        metrics = {f"top1_{j}": top1[j - 1].item() for j in (1, 2, 4, 8, 16) if j <= K}
        return total, {"ce1": per[0].item(), **metrics}

    @torch.no_grad()
    def drafts(self, module: BlockHead, target_loaded, seqs, depth: int) -> torch.Tensor:
        """(B, T, depth): [b, n, d-1] is draft d after context x_<n, whose pending token is x_{n-1}
        (-1: none); see evaluate.py."""
        target = model_of(target_loaded)
        head = lm_head(module, target)
        b = pad_batch(seqs, module.subset.device)
        B, T = b.ids.shape
        depth = min(depth, module.size)
        out = torch.full((B, T, depth), -1, dtype=torch.long, device=b.ids.device)
        for s in range(0, T - 1, 64):  # anchors a in chunks: the block at a drafts after context x_<a+1
            a = torch.arange(s, min(s + 64, T - 1), device=b.ids.device).expand(B, -1)
            rows = run_blocks(module, target, b, a)[:, :, :depth]
            out[:, s + 1:s + 1 + a.shape[1]] = best_tokens(head.logits(rows), head)
        return out

    def drafter(self, module: BlockHead, target_loaded) -> BlockDrafter:
        return BlockDrafter(model_of(target_loaded), module)


BLOCK_RECIPE = BlockRecipe()
