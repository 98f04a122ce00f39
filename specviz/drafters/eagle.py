"""EAGLE: a one-layer draft head that extrapolates the target's features (Li et al. 2024).

Position i of the head reads the pair (h_i, embed(x_{i+1})): the target's final hidden
state after token i and the embedding of the token that followed. One decoder layer (with
its own small KV cache) turns that into a prediction of h_{i+1}, which the target's LM
head (shared; optionally restricted to frequent tokens) reads as the next token. Drafting
is autoregressive at the feature level: the predicted feature and the drafted token form
the next pair.

Cache: after begin/feedback the head has (or will feed) one pair per context token but the
last, all with the target's true features. Draft pairs use predicted features, so feedback
crops them off and feeds the true features of the kept tokens instead.

Feature fusion (EAGLE-3's, optional: config "hidden_layers"): the head may read, instead of
the final state alone, the inputs of a few target layers (its taps) side by side with the
final state last, numbered as Drafter.hidden_layers numbers them (L, the layer count, is the
final state); a learned `fuse` projection turns them into one feature, after an RMS norm of
each inner layer's input. Only true pairs carry them; predicted features
are already one feature wide and skip the projection.

Depth (optional: config "layers", default 1 as in the paper): further pre-norm decoder
layers after the first, each with its own attention over its own cache layer, before the
final norm. More capacity per draft step for more bytes per step; `deepened` grows a head
so that at first it drafts exactly as it did.

Heads the EAGLE authors released (EAGLE-1/2, EAGLE-3) load through published.py and run
in this same drafter.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import SpecvizError
from ..modeling import stack
from ..modeling.layers import KVCache, RMSNorm, causal_mask, inverse_frequencies, rope, rotary, write
from ..modeling.packing import linear
from .base import Draft, Drafter, autoregressive_draft, empty_draft
from .drawn import depth_of, draw_tree
from .medusa import TargetHead, beside, with_weights


def eagle_config(target, subset: int = 0) -> dict:
    """The head's shape, taken from the target's: its layer is a target layer's twin (a
    Llama-style one, whatever the target's family: GPT-2's, Falcon's and OPT's config names
    are read too)."""
    cfg = target.config.get_text_config()
    hidden = target.get_output_embeddings().weight.shape[1]  # the features the LM head reads
    embed = target.get_input_embeddings().weight.shape[1]
    if embed != hidden:
        raise SpecvizError(f"an EAGLE head reads the target's features ({hidden} wide) beside its token embeddings "
                           f"({embed} wide); this target's differ, so it cannot have one: use another drafter")
    heads = cfg.num_attention_heads
    rope = getattr(cfg, "rope_parameters", None) or {}
    mlp = next((v for v in (getattr(cfg, n, None) for n in ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"))
                if isinstance(v, int) and v > 0), 4 * hidden)
    return {
        "hidden_size": hidden,
        "heads": heads,
        "kv_heads": getattr(cfg, "num_key_value_heads", None) or heads,
        "head_dim": getattr(cfg, "head_dim", None) or hidden // heads,
        "intermediate_size": mlp,
        "rms_norm_eps": float(getattr(cfg, "rms_norm_eps", None) or 1e-6),
        "rope_theta": float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))),
        "subset": subset,
    }


class Block(nn.Module):
    """A pre-norm Llama-style decoder layer after the head's first (a deeper head)."""

    def __init__(self, config: dict):
        super().__init__()
        h, d, m, eps = config["hidden_size"], config["head_dim"], config["intermediate_size"], config["rms_norm_eps"]
        self.ln1, self.ln2 = RMSNorm(h, eps), RMSNorm(h, eps)
        bias = config.get("qkv_bias", False)  # as the first layer's (Qwen-style released heads)
        self.q = nn.Linear(h, config["heads"] * d, bias=bias)
        self.k = nn.Linear(h, config["kv_heads"] * d, bias=bias)
        self.v = nn.Linear(h, config["kv_heads"] * d, bias=bias)
        self.o = nn.Linear(config["heads"] * d, h, bias=False)
        self.gate, self.up, self.down = nn.Linear(h, m, bias=False), nn.Linear(h, m, bias=False), nn.Linear(m, h, bias=False)


def qkv(layer: nn.Module, a: torch.Tensor, cos, sin, heads: int, kv_heads: int):
    """A layer's queries, keys and values (B, heads, T, head_dim) from its attention input a (B, T, ·)."""
    B, T, _ = a.shape
    q = rope(linear(layer.q, a).view(B, T, heads, -1).transpose(1, 2), cos, sin)
    k = rope(linear(layer.k, a).view(B, T, kv_heads, -1).transpose(1, 2), cos, sin)
    v = linear(layer.v, a).view(B, T, kv_heads, -1).transpose(1, 2)
    return q, k, v


def mix(layer: nn.Module, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    """A layer's residual stream x (B, T, H) after its attention output att and its MLP."""
    B, T, _ = x.shape
    x = x + linear(layer.o, att.transpose(1, 2).reshape(B, T, -1))
    b = layer.ln2(x)
    return x + linear(layer.down, F.silu(linear(layer.gate, b)) * linear(layer.up, b))


class EagleHead(nn.Module):
    """fc(feature, embedding) -> pre-norm Llama-style decoder layer(s) -> final norm.

    The first layer's weights sit on the head itself (the paper's layout, which released
    heads share); a deeper head's further layers are `blocks`."""

    def __init__(self, config: dict, subset: torch.Tensor | None = None):
        super().__init__()
        self.config = dict(config)  # JSON-able: enough to rebuild the head
        h, d, eps = config["hidden_size"], config["head_dim"], config["rms_norm_eps"]
        self.heads, self.kv_heads, self.head_dim = config["heads"], config["kv_heads"], d
        # Optional keys describe released heads (published.py); specviz's own use the defaults.
        # (feature, token embedding) -> the layer's input
        self.fc = nn.Linear(2 * h, h, bias=config.get("fc_bias", True))
        self.ln1 = RMSNorm(h, eps) if config.get("input_norm", True) else nn.Identity()
        self.ln2 = RMSNorm(h, eps)
        self.norm = RMSNorm(h, eps) if config.get("final_norm", True) else nn.Identity()
        a, bias = config.get("attention_input", h), config.get("qkv_bias", False)
        self.q = nn.Linear(a, self.heads * d, bias=bias)
        self.k = nn.Linear(a, self.kv_heads * d, bias=bias)
        self.v = nn.Linear(a, self.kv_heads * d, bias=bias)
        self.o = nn.Linear(self.heads * d, h, bias=False)
        m = config["intermediate_size"]
        self.gate, self.up, self.down = nn.Linear(h, m, bias=False), nn.Linear(h, m, bias=False), nn.Linear(m, h, bias=False)
        # Linear RoPE scaling divides every position by rope_scale: the same as slower frequencies.
        inv_freq = inverse_frequencies(d, config["rope_theta"]) / config.get("rope_scale", 1.0)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("subset", torch.empty(0, dtype=torch.long) if subset is None else subset.long())
        read = config.get("hidden_layers") or ()  # fused: inner layers, then the final state
        self.fuse = nn.Linear(len(read) * h, h, bias=False) if len(read) > 1 else None
        # Inner layers' inputs are raw residual streams (a few dimensions hundreds of times the
        # rest, as in most LLMs): each is RMS-normed first, as the target's own layers norm them.
        self.tap_norms = nn.ModuleList(RMSNorm(h, eps) for _ in read[:-1])
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.get("layers", 1) - 1))

    @property
    def depth(self) -> int:
        """Decoder layers: 1 + len(blocks)."""
        return 1 + len(self.blocks)

    def new_cache(self) -> KVCache:
        w = self.fc.weight
        return KVCache(self.depth, self.kv_heads, self.head_dim, dtype=w.dtype, device=w.device)

    def forward(self, h: torch.Tensor, e: torch.Tensor, cache: KVCache | None = None,
                positions: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Features (B, T, H) and next-token embeddings (B, T, H) -> predicted next features.

        Without a cache the T positions are a whole sequence (training); with one they follow
        what the cache holds (drafting, batch 1), causally unless a tree passes its own
        `positions` (T,) and `mask` (T, cached + T)."""
        start, T = (cache.length if cache is not None else 0), h.shape[1]
        if positions is None:
            positions = torch.arange(start, start + T, device=h.device)
        if cache is None:
            return self.run(h, e, positions, lambda layer, q, k, v: F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True))
        cache.reserve(start + T)
        if mask is None:
            mask = causal_mask(T, start, h.device)

        def attend(layer, q, k, v):
            keys, values = write(cache.k[layer], cache.v[layer], start, k[0], v[0])
            return F.scaled_dot_product_attention(q, keys[None], values[None], attn_mask=mask, enable_gqa=True)

        out = self.run(h, e, positions, attend)
        cache.length = start + T
        return out

    def run(self, h: torch.Tensor, e: torch.Tensor, positions: torch.Tensor, attend) -> torch.Tensor:
        """The layers on pairs (h, e) at `positions` (T,) -> predicted features (B, T, H).
        attend(layer, q, k, v) -> attention output (B, heads, T, head_dim): what each layer's
        queries see (a cache, a tree's mask, training's unrolled chain) is the caller's."""
        x, a = self.pair(h, e)
        cos, sin = rotary(self.inv_freq, positions, x.dtype)
        x = mix(self, x, attend(0, *qkv(self, a, cos, sin, self.heads, self.kv_heads)))
        for n, block in enumerate(self.blocks, 1):
            x = mix(block, x, attend(n, *qkv(block, block.ln1(x), cos, sin, self.heads, self.kv_heads)))
        return self.norm(x)

    def pair(self, h: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The first layer's residual stream x = fc(h, e) and its attention input, normed x."""
        if self.fuse is not None and h.shape[-1] == self.fuse.in_features:  # the target's taps
            *inner, final = h.split(self.fc.out_features, dim=-1)
            h = linear(self.fuse, torch.cat([norm(x) for norm, x in zip(self.tap_norms, inner)] + [final], dim=-1))
        x = linear(self.fc, torch.cat([h, e], dim=-1))
        return x, self.ln1(x)


def fused(head: EagleHead, hidden_layers: list[int]) -> EagleHead:
    """An unfused `head` reading `hidden_layers` (inner layers, then the final state) through a
    new `fuse` projection that starts as the identity on the final state: at first it drafts
    exactly as `head` did, and training learns what the inner layers add."""
    h = head.config["hidden_size"]
    out = EagleHead({**head.config, "hidden_layers": list(hidden_layers)}, head.subset)
    missing, unexpected = out.load_state_dict(head.state_dict(), strict=False)
    if unexpected or any(not (k == "fuse.weight" or k.startswith("tap_norms.")) for k in missing):
        raise ValueError(f"fused() takes an unfused EagleHead; keys {missing + unexpected} disagree")
    with torch.no_grad():
        out.fuse.weight.zero_()
        out.fuse.weight[:, -h:] = torch.eye(h)
    return out.to(head.fc.weight)


def widened(head: EagleHead, size: int) -> EagleHead:
    """`head` with `size` hidden units in every layer's MLP instead of its own: the new units'
    gate and up rows start small and random (seeded, so the same every time), their down
    columns at zero, so at first it drafts exactly as `head` did and training decides what
    they add."""
    old = head.config["intermediate_size"]
    if size < old:
        raise ValueError(f"cannot narrow an EAGLE head's MLP from {old} to {size} units")
    out = EagleHead({**head.config, "intermediate_size": size}, head.subset)
    state = head.state_dict()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in [""] + [f"blocks.{n}." for n in range(len(head.blocks))]:
            for name in ("gate", "up"):
                w = state[f"{layer}{name}.weight"].float()
                extra = torch.randn(size - old, w.shape[1], generator=g) * w.std()
                state[f"{layer}{name}.weight"] = torch.cat([w, extra])
            down = state[f"{layer}down.weight"].float()
            state[f"{layer}down.weight"] = torch.cat([down, down.new_zeros(down.shape[0], size - old)], 1)
    return _load(out, state, head)


def deepened(head: EagleHead, layers: int) -> EagleHead:
    """`head` with `layers` decoder layers instead of its own: each new layer is appended with
    seeded random weights (at the scale of the head's first layer) but its attention output and
    MLP down projections at zero, so it adds nothing to the residual stream; at first the
    deeper head drafts exactly as `head` did, and training decides what the layers add."""
    if layers < head.depth:
        raise ValueError(f"cannot make an EAGLE head of {head.depth} layers shallower ({layers})")
    out = EagleHead({**head.config, "layers": layers}, head.subset)
    state = head.state_dict()
    g = torch.Generator().manual_seed(0)
    for n in range(head.depth - 1, layers - 1):
        for name, param in out.blocks[n].state_dict().items():
            if name.startswith(("o.", "down.")):
                value = torch.zeros_like(param)
            elif name.startswith("ln"):
                value = torch.ones_like(param)
            else:  # q, k, v, gate, up: like the first layer's, in scale
                value = torch.randn(param.shape, generator=g) * state[name].float().std()
            state[f"blocks.{n}.{name}"] = value
    return _load(out, state, head)


def _load(out: EagleHead, state: dict, like: EagleHead) -> EagleHead:
    """`out` holding `state`, in `like`'s dtype and on its device."""
    dtype = like.fc.weight.dtype
    out.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()})
    return out.to(like.fc.weight.device)


def init_from_target(head: EagleHead, target) -> None:
    """Start the output norm at the target's final norm: the features it predicts live there."""
    found = stack.find(target)
    norm = found.norm if found is not None else None
    if norm is not None and getattr(norm, "weight", None) is not None and norm.weight.shape == head.norm.weight.shape:
        with torch.no_grad():
            head.norm.weight.copy_(norm.weight)


class Eagle(Drafter):
    name = "eagle"
    needs_hidden = True

    def __init__(self, target, head: EagleHead, name: str | None = None, tree_width: int = 3, *,
                 embed: nn.Module | None = None, lm: TargetHead | None = None, hidden_layers: tuple[int, ...] = ()):
        """embed, lm: the token embeddings and LM head the head reads (default: the target's,
        the LM head restricted to the head's subset); hidden_layers: see Drafter (EAGLE-3)."""
        self.target, self.head = target, head.eval()
        self.tree_width = tree_width  # trees: expand the w likeliest nodes per depth, w children each
        self.embed = embed if embed is not None else target.get_input_embeddings()
        self.lm = lm if lm is not None else TargetHead(target, head.subset)
        self.hidden_layers = hidden_layers or tuple(head.config.get("hidden_layers") or ())
        self.dtype = head.fc.weight.dtype
        if name:
            self.name = name

    def begin(self, prompt_ids, processor, generator, device, hidden=None, trees=False) -> None:
        self.processor, self.generator, self.device, self.trees = processor, generator, device, trees
        self.cache = self.head.new_cache()
        self.fed = 0  # pairs in the cache with the target's true features
        self.waiting = []  # true feature rows not fed yet (they continue the fed ones)
        self.last = None  # the head's output at the newest true pair: predicts the pending token's successor
        self._add(hidden)

    def _add(self, hidden) -> None:
        if hidden is not None and len(hidden):
            self.waiting.append(hidden.to(self.dtype))

    def _step(self, h: torch.Tensor, tokens) -> torch.Tensor:
        """Feed pairs (h[i], tokens[i]) after the cache; the head's output rows (T, H)."""
        t = torch.as_tensor(tokens, dtype=torch.long, device=h.device).view(1, -1)
        return self.head(h.view(1, -1, h.shape[-1]), self.embed(t).to(self.dtype), self.cache)[0]

    def _catch_up(self, ids) -> None:
        if self.waiting:
            # The true pairs: feature of token i with token i+1, up to the last context token.
            h = torch.cat(self.waiting)
            n = h.shape[0]
            self.last = self._step(h, ids[self.fed + 1:self.fed + 1 + n])[-1:]
            self.fed += n
            self.waiting = []

    def propose(self, ids, k, min_confidence=0.0) -> Draft:
        if k < 1:
            return empty_draft(self.device)
        self._catch_up(ids)
        if self.last is None:
            return empty_draft(self.device)  # a one-token prompt: no feature yet
        if self.trees and self.tree_width > 1:
            if self.trees == "drawn" and not self.processor.s.greedy:
                return self._drawn(k, min_confidence)
            return self._tree(k, min_confidence)
        feature = [self.last]

        def advance(t):  # predicted feature + drafted token: the next pair
            feature[0] = self._step(feature[0], t)
            return self.lm.full(self.lm.logits(feature[0]))

        return autoregressive_draft(self.processor, self.generator, self.lm.full(self.lm.logits(self.last)), k,
                                    min_confidence, advance)

    def _pairs(self, frontier: list[int], tok: list[int], par: list[int], feat: dict, row: dict, d: int,
               base: int) -> torch.Tensor:
        """Run the head on the depth-d `frontier`'s pairs (its parent's predicted feature, its own
        token) at the position depth d gives them, each attending to the context and its own
        ancestors' pairs only; record each node's predicted feature and cache row, and return them."""
        dev = self.last.device
        inputs = torch.stack([self.last[0] if par[n] < 0 else feat[par[n]] for n in frontier])
        mask = torch.zeros(len(frontier), self.cache.length + len(frontier), dtype=torch.bool, device=dev)
        mask[:, :base] = True
        for r, n in enumerate(frontier):
            a = n
            while a >= 0:  # the node's own pair and its ancestors' pairs
                mask[r, row[a] if a != n else self.cache.length + r] = True
                a = par[a]
        positions = torch.full((len(frontier),), base + d - 1, device=dev)
        e = self.embed(torch.tensor([tok[n] for n in frontier], device=dev)).to(self.dtype)
        out = self.head(inputs.view(1, -1, inputs.shape[-1]), e.view(1, -1, e.shape[-1]), self.cache,
                        positions, mask.view(1, 1, *mask.shape))[0]
        for r, n in enumerate(frontier):
            feat[n], row[n] = out[r], self.cache.length - len(frontier) + r
        return out

    def _tree(self, budget: int, min_confidence: float = 0.0) -> Draft:
        """EAGLE-2-like: grow the tree one depth per head forward, expanding the
        `tree_width` nodes with the likeliest paths (those that may still be kept); then keep
        the `budget` likeliest nodes, and with `min_confidence` only those whose path
        probability reaches it (the likeliest always): the tree is as big as the head is sure.

        Nothing is drawn: the target judges each child as a one-hot guess (core/tree_sampling.py);
        sampled runs may draw instead (`_drawn`)."""
        w, dev = self.tree_width, self.last.device
        base = self.cache.length
        # Per node: token, parent, path probability, depth; feature that predicts its children and
        # its pair's row in the head's cache, once expanded.
        tok, par, score, depth, feat, row = [], [], [], [], {}, {}

        def add_children(parents: list[int], f: torch.Tensor, d: int) -> None:
            """The w likeliest children of each of `parents` (-1: the root), whose predicted
            features are the rows of f: one LM-head multiply for the whole frontier."""
            p, i = torch.softmax(self.lm.logits(f).float(), -1).topk(w)
            ids = self.lm.subset[i] if self.lm.subset is not None else i
            for parent, row_ids, row_p in zip(parents, ids.tolist(), p.tolist()):
                prob = 1.0 if parent < 0 else score[parent]
                for t, pt in zip(row_ids, row_p):
                    tok.append(t)
                    par.append(parent)
                    score.append(prob * pt)
                    depth.append(d)

        add_children([-1], self.last, 1)
        for d in range(1, budget):
            frontier = self._frontier(score, depth, d, budget, min_confidence)
            if not frontier:
                break
            add_children(frontier, self._pairs(frontier, tok, par, feat, row, d, base), d + 1)
        # The likeliest nodes; a child is never likelier than its parent, so parents come first.
        keep = _likeliest(score, depth, budget, min_confidence)
        keep.sort(key=lambda n: (depth[n], -score[n]))
        index = {n: j for j, n in enumerate(keep)}
        parents = tuple(-1 if par[n] < 0 else index[par[n]] for n in keep)
        return Draft(torch.tensor([tok[n] for n in keep], dtype=torch.long, device=dev), None, parents)

    def _drawn(self, budget: int, min_confidence: float = 0.0) -> Draft:
        """A tree whose children are drawn from the head's q (drafters/drawn.py), a depth per head
        forward: each depth's nodes that will have children run the head on their pairs."""
        base, feat, row = self.cache.length, {}, {}

        def expand(level, tokens, parents):
            if level == [-1]:
                return self.lm.full(self.lm.logits(self.last))
            d = depth_of(parents, level[0])
            return self.lm.full(self.lm.logits(self._pairs(level, tokens, parents, feat, row, d, base)))

        return draw_tree(self.processor, self.generator, expand, budget, self.tree_width, budget, min_confidence)

    def _frontier(self, score: list[float], depth: list[int], d: int, budget: int,
                  min_confidence: float = 0.0) -> list[int]:
        """The depth-d nodes to expand: the `tree_width` likeliest among the budget - 1
        likeliest nodes so far that reach `min_confidence`. The others' descendants (never
        likelier, ranked after them on ties) could not be kept, so skipping them keeps the
        same tree for fewer head and LM-head rows, which are most of a tree's drafting time."""
        ranked = _likeliest(score, depth, budget - 1, min_confidence)
        return sorted((n for n in ranked if depth[n] == d), key=lambda n: -score[n])[:self.tree_width]

    def feedback(self, accepted: int, hidden=None, path=None) -> None:
        # Draft pairs were built on predicted features: drop them, queue the true ones.
        self.cache.crop(self.fed)
        self._add(hidden)


def _likeliest(score: list[float], depth: list[int], n: int, min_confidence: float = 0.0) -> list[int]:
    """The n likeliest tree nodes: by path probability, the shallower first on ties, so a
    child never ranks above its parent; after the first, only those whose path probability
    reaches `min_confidence` (as a chain always drafts its first token). The tree's pruning
    and its final cut must rank alike."""
    ranked = sorted(range(len(score)), key=lambda i: (-score[i], depth[i]))[:n]
    return ranked[:1] + [i for i in ranked[1:] if score[i] >= min_confidence]


def head_from(config: dict, state_dict: dict) -> EagleHead:
    """A saved head (see specviz.train.eagle) as a module: its config and weights, on the CPU."""
    return with_weights(EagleHead(config, state_dict.get("subset")), state_dict)


def drafter_from(config: dict, state_dict: dict, target_loaded) -> Eagle:
    """Rebuild a trained head (see specviz.train.eagle) for a loaded target."""
    head, lm = beside(head_from(config, state_dict), target_loaded.model)
    return Eagle(target_loaded.model, head, lm=lm)
