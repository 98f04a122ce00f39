"""A block drafter (DFlash-style, Chen et al. 2026): a whole block of drafts in one forward pass.

The drafter reads the target's features of the context (with taps: the inputs of a few inner
target layers beside the final state, RMS-normed and fused by a learned projection, as EAGLE-3
reads them) as keys and values in every one of its layers: DFlash's "KV injection". After them
it runs one block of K + 1 positions: the pending token (the target's own, already decided) and
K placeholders, a learned mask vector. Inside the block attention is non-causal: every position
sees the context and the whole block. Placeholder j's output, through the target's LM head
(restricted to a subset of frequent tokens), is q_j, the drafter's distribution for the j-th
token after the pending one. A step drafts d_1..d_k from q_1..q_k, k <= K.

Why sampled runs stay exact: no position reads a drafted token, so q_j is the same whatever was
drafted before j. Drawing each d_j from q_j is then drawing it from q_j(. | context, d_<j), which
is all rejection sampling asks (core/verify.py), and a tree of each position's likeliest tokens
is fixed before any coin falls, which is all the sibling walk asks (core/tree_sampling.py): the
Medusa heads' argument, for one network instead of one head per position.

The block is always run whole (K + 1 rows cost about what k + 1 do on a CPU, where reading the
weights is the work), so q_j does not depend on how many tokens a step drafts.

Cache: keys and values of the context features, per layer (projections only: context positions
run no layer). A step appends the features of the tokens it kept; the block itself is never
cached.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import SpecvizError
from ..core.tree import best_first
from ..modeling.layers import KVCache, RMSNorm, inverse_frequencies, rope, rotary, write
from ..modeling.packing import linear
from .base import Draft, Drafter, autoregressive_draft, empty_draft
from .drawn import depth_of, draw_tree
from .eagle import Block, mix, qkv
from .medusa import TargetHead, beside, with_weights

BLOCK = 16  # the largest block trained by default: DFlash's


class BlockHead(nn.Module):
    """Context features -> per-layer keys and values; a block (pending token, K masks) -> features
    that the target's LM head reads as q_1..q_K.

    config: the target layer's shape (eagle.eagle_config), "block" (K), "layers", and with taps
    "hidden_layers" (inner layers, then the final state, as Drafter.hidden_layers numbers them)."""

    def __init__(self, config: dict, subset: torch.Tensor | None = None):
        super().__init__()
        self.config = dict(config)  # JSON-able: enough to rebuild the head
        h, d, eps = config["hidden_size"], config["head_dim"], config["rms_norm_eps"]
        self.heads, self.kv_heads, self.head_dim, self.size = config["heads"], config["kv_heads"], d, config["block"]
        read = config.get("hidden_layers") or ()
        # Inner layers' inputs are raw residual streams (a few dimensions hundreds of times the rest): each
        # is RMS-normed first, as the target's own layers norm them; the fused feature is normed again.
        self.tap_norms = nn.ModuleList(RMSNorm(h, eps) for _ in read[:-1])
        self.fuse = nn.Linear(max(1, len(read)) * h, h, bias=False)
        self.context_norm = RMSNorm(h, eps)
        self.mask = nn.Parameter(torch.zeros(h))  # the placeholder's input, learned
        self.layers = nn.ModuleList(Block(config) for _ in range(config["layers"]))
        self.norm = RMSNorm(h, eps)
        self.register_buffer("inv_freq", inverse_frequencies(d, config["rope_theta"]), persistent=False)
        self.register_buffer("subset", torch.empty(0, dtype=torch.long) if subset is None else subset.long())

    def new_cache(self) -> KVCache:
        w = self.fuse.weight
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, dtype=w.dtype, device=w.device)

    def context(self, h: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The target's features h (B, T, n * H) at `positions` (T,) -> each layer's (keys, values),
        (B, kv_heads, T, head_dim): what every block position may attend to."""
        H = self.fuse.out_features
        if self.tap_norms:
            *inner, final = h.split(H, dim=-1)
            h = torch.cat([norm(x) for norm, x in zip(self.tap_norms, inner)] + [final], dim=-1)
        c = self.context_norm(linear(self.fuse, h))
        B, T, _ = c.shape
        cos, sin = rotary(self.inv_freq, positions, c.dtype)
        return [(rope(linear(layer.k, c).view(B, T, self.kv_heads, -1).transpose(1, 2), cos, sin),
                 linear(layer.v, c).view(B, T, self.kv_heads, -1).transpose(1, 2)) for layer in self.layers]

    def block(self, e: torch.Tensor, positions: torch.Tensor, attend) -> torch.Tensor:
        """The block's rows: e (B, R, H), the pending token's embedding at each block's first row
        (the caller puts `mask` in the others) at `positions` (R,) or (B, R) -> features (B, R, H).
        attend(layer_index, q, k, v) -> attention output: which context a row sees is the caller's."""
        x = e
        cos, sin = rotary(self.inv_freq, positions.reshape(-1), x.dtype)
        if positions.dim() == 2:  # one row of positions per batch row (training): broadcast over the heads
            cos, sin = (t.view(*positions.shape, -1)[:, None] for t in (cos, sin))
        for n, layer in enumerate(self.layers):
            x = mix(layer, x, attend(n, *qkv(layer, layer.ln1(x), cos, sin, self.heads, self.kv_heads)))
        return self.norm(x)

    def inputs(self, pending: torch.Tensor) -> torch.Tensor:
        """(B, H) embeddings of the pending tokens -> (B, K + 1, H): each then K masks."""
        B, H = pending.shape
        return torch.cat([pending[:, None], self.mask.to(pending.dtype).expand(B, self.size, H)], 1)


def block_config(target, block: int = BLOCK, layers: int = 2, subset: int = 0,
                 hidden_layers: tuple[int, ...] = ()) -> dict:
    """The head's shape: its layers are target layers' twins (eagle_config), K = `block`."""
    from .eagle import eagle_config

    return {**eagle_config(target, subset), "block": block, "layers": layers,
            **({"hidden_layers": list(hidden_layers)} if hidden_layers else {})}


class BlockDrafter(Drafter):
    name = "block"
    needs_hidden = True

    def __init__(self, target, head: BlockHead, name: str | None = None, tree_width: int = 3, *,
                 embed: nn.Module | None = None, lm: TargetHead | None = None):
        self.target, self.head = target, head.eval()
        self.tree_width = tree_width  # trees: each position's top candidates, best paths first (as Medusa's)
        self.embed = embed if embed is not None else target.get_input_embeddings()
        self.lm = lm if lm is not None else TargetHead(target, head.subset)
        self.hidden_layers = tuple(head.config.get("hidden_layers") or ())
        self.dtype = head.fuse.weight.dtype
        if name:
            self.name = name

    @property
    def max_draft(self) -> int:
        """The longest block its file was trained for: a longer draft is refused (spec.check_length)."""
        return self.head.size

    def begin(self, prompt_ids, processor, generator, device, hidden=None, trees=False) -> None:
        self.processor, self.generator, self.device, self.trees = processor, generator, device, trees
        self.cache = self.head.new_cache()
        self._feed(hidden)

    def _feed(self, hidden) -> None:
        """Append the keys and values of the target's features of kept tokens (they follow the fed ones)."""
        if hidden is None or not len(hidden):
            return
        start, n = self.cache.length, hidden.shape[0]
        self.cache.reserve(start + n)
        positions = torch.arange(start, start + n, device=hidden.device)
        for layer, (k, v) in enumerate(self.head.context(hidden.to(self.dtype)[None], positions)):
            write(self.cache.k[layer], self.cache.v[layer], start, k[0], v[0])
        self.cache.length = start + n

    def logits(self, ids) -> torch.Tensor:
        """The whole block after `ids`: (K, subset) logits, row j - 1 for the j-th token after the pending one."""
        n = self.cache.length  # features of every context token but the pending one, at positions 0..n-1
        if n != len(ids) - 1:
            raise SpecvizError(f"the block drafter holds features of {n} tokens, not of the {len(ids) - 1} "
                               "before the pending one: the engine and the drafter disagree")
        pending = self.embed(torch.tensor([ids[-1]], device=self.device)).to(self.dtype)
        positions = torch.arange(n, n + self.head.size + 1, device=self.device)

        def attend(layer, q, k, v):  # the context and the whole block: no mask
            keys, values = write(self.cache.k[layer], self.cache.v[layer], n, k[0], v[0])
            return F.scaled_dot_product_attention(q, keys[None], values[None], enable_gqa=True)

        self.cache.reserve(n + self.head.size + 1)  # block rows are written past the context, never kept
        out = self.head.block(self.head.inputs(pending), positions, attend)[0, 1:]
        return self.lm.logits(out)

    def propose(self, ids, k, min_confidence=0.0) -> Draft:
        if k < 1 or self.cache.length == 0:
            return empty_draft(self.device)  # a one-token prompt: no feature to draft from
        k = min(k, self.head.size)  # dynamic k may ask for more; a fixed k above it is refused before the run
        logits = self.logits(ids)
        if self.trees and self.tree_width > 1:
            if self.trees == "drawn" and not self.processor.s.greedy:
                return self._drawn(logits, k, min_confidence)
            return self._tree(logits, k, min_confidence)
        full = self.lm.full(logits[:k])
        later = iter(full[1:])  # no position reads the drafts: the next row is already there
        draft = autoregressive_draft(self.processor, self.generator, full[:1], k, min_confidence,
                                     lambda t: next(later)[None])
        return Draft(draft.tokens, draft.q, parallel=True)

    def _tree(self, logits: torch.Tensor, budget: int, min_confidence: float = 0.0) -> Draft:
        """Each position's top candidates, combined into the `budget` likeliest paths (positions
        treated as independent, which they are given the context: no position reads another's draft);
        nothing is drawn, so the target judges each as a one-hot guess (core/tree_sampling.py)."""
        q = torch.softmax(logits[:budget].float(), -1)
        top_p, top_i = q.topk(min(self.tree_width, q.shape[-1]), dim=-1)
        ids = self.lm.subset[top_i] if self.lm.subset is not None else top_i
        cands = [list(zip(i_row, p_row)) for i_row, p_row in zip(ids.tolist(), top_p.tolist())]
        tokens, parents = best_first(cands, budget, min_confidence)
        return Draft(torch.tensor(tokens, dtype=torch.long, device=self.device), None, tuple(parents),
                     parallel=True, position_q=self.processor.probs(self.lm.full(logits[:budget])))

    def _drawn(self, logits: torch.Tensor, budget: int, min_confidence: float = 0.0) -> Draft:
        """A tree whose children are drawn from q (drafters/drawn.py): a depth-d node's children from
        position d + 1's q, the same for every node of a depth (as Medusa's heads)."""
        full = self.lm.full(logits[:budget])

        def expand(level, tokens, parents):
            return full[depth_of(parents, level[0]) if level[0] >= 0 else 0].expand(len(level), -1)

        draft = draw_tree(self.processor, self.generator, expand, budget, self.tree_width, budget, min_confidence)
        return Draft(draft.tokens, draft.q, draft.parents, parallel=True)

    def feedback(self, accepted: int, hidden=None, path=None) -> None:
        # The block's rows were never counted in the cache's length: nothing to drop.
        self._feed(hidden)  # the pending token's and the kept drafts' features: context from now on


def head_from(config: dict, state_dict: dict) -> BlockHead:
    """A saved head (see specviz.train.block) as a module: its config and weights, on the CPU."""
    return with_weights(BlockHead(config, state_dict.get("subset")), state_dict)


def drafter_from(config: dict, state_dict: dict, target_loaded) -> BlockDrafter:
    """Rebuild a trained block drafter for a loaded target."""
    head, lm = beside(head_from(config, state_dict), target_loaded.model)
    return BlockDrafter(target_loaded.model, head, lm=lm)
