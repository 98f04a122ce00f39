"""The distilled draft model as a plain transformers LlamaForCausalLM, logit for logit.

transformers' assisted generation (`generate(assistant_model=...)`) takes only a full
causal LM. To compare specviz with it on the *same pair*, the benchmark exports the
distilled drafter into that shape and runs both libraries with the export. The export
computes the drafter's logits (to float rounding) on the tokens the drafter scores, its
frequent-token subset, learned bias included, and -1e9 on every other token (where the
drafter's q is 0), so both draft the same tokens. It loads with plain
`AutoModelForCausalLM.from_pretrained` after `save_pretrained`: no code of ours is needed.

- The target's embedding table and the input projection fold into one (vocab, hidden) table;
  fused q/k/v and gate/up matrices split into Llama's separate projections.
- The subset head and its bias. Llama's LM head has no bias, and everything it reads has
  passed the final RMSNorm, which divides by the hidden state's size: no weight there can add
  a per-token constant. So the export carries a few more hidden channels (one per attention
  head: Llama wants the width a multiple of the head count), equal to 1 after the final norm;
  the head's column for the first holds each token's bias (-1e9 off the subset), the other
  columns the target's output rows times the up-projection.
- What makes those channels constant: one more decoder layer (attention weights zero, MLP
  biases on) writes the drafter's normalised last hidden state x / rms(x) and the 1s into the
  residual stream. Its gate is saturated (silu(32) is exactly 32), so its MLP is a linear map
  of its normalised input. The drafter's own residual stream runs 2^-40 times smaller
  (embedding, o_proj and down_proj scaled; RMSNorm ignores the scale, and its epsilon is
  scaled with it), so the sum is [x / rms(x), 1, ..., 1] to float precision, whose RMS is 1:
  the final norm then only applies the drafter's norm weight. Inside the drafter's layers the
  extra channels are 0 but still counted in each norm's mean: the norm weights undo that.

So the export is one decoder layer deeper and a few channels wider than the drafter, and its
hidden states are not the drafter's (only its logits are meant to be read). Run it in float32
or bfloat16: float16's range cannot hold the 2^-40 residual stream.
"""
from __future__ import annotations

import math

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .distilled import DistilledDrafter

OFF_SUBSET = -1e9  # the logit of a token the drafter never scores: exp() of it is 0 at any temperature
SHRINK = 2.0 ** -40  # the drafter's residual stream in the export: exact to scale (a power of two), then negligible
GATE = 32.0  # silu(32) == 32 in float32 and bfloat16: a saturated gate makes the last MLP linear


def to_transformers(drafter: DistilledDrafter, target) -> LlamaForCausalLM:
    """`drafter` attached to `target` (the target's nn.Module) -> a LlamaForCausalLM with the
    drafter's logits on its token subset and OFF_SUBSET elsewhere (float32)."""
    lm = drafter.model
    c = lm.config
    embed = lm.embed.float()
    # Channels h.. are extra, 0 inside the drafter's layers and 1 after the last one; the bias
    # column reads channel h. Llama wants the width a multiple of the head count: one per head.
    h, wide = c.hidden, c.hidden + c.heads
    norm_eps = lm.norm.eps  # every norm of the drafter has the same (Llama has one epsilon)
    # Every norm averages over `wide` channels, the extra ones 0 until the last layer: the mean
    # of squares is h/wide of the drafter's. Scaling epsilon the same way (and by SHRINK^2, the
    # residual stream's scale) leaves x / rms(x) off by sqrt(wide/h), undone in the norm weights.
    fix = math.sqrt(h / wide)
    cfg = LlamaConfig(
        vocab_size=embed.shape[0], hidden_size=wide, intermediate_size=max(c.ffn, h),
        num_hidden_layers=c.layers + 1, num_attention_heads=c.heads, num_key_value_heads=c.heads,
        head_dim=h // c.heads, rms_norm_eps=norm_eps * (h / wide) * SHRINK ** 2,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        max_position_embeddings=8192, tie_word_embeddings=False, attention_bias=False, mlp_bias=True,
    )
    model = LlamaForCausalLM(cfg).eval().requires_grad_(False)
    ffn = c.ffn
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.embed_tokens.weight[:, :h] = embed @ lm.inp.weight.T * SHRINK
        for block, layer in zip(lm.blocks, model.model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            q, k, v = block.qkv.weight.split(h)
            attn.q_proj.weight[:, :h] = q
            attn.k_proj.weight[:, :h] = k
            attn.v_proj.weight[:, :h] = v
            attn.o_proj.weight[:h] = block.out.weight * SHRINK
            gate, up = block.gate_up.weight.chunk(2, dim=0)
            mlp.gate_proj.weight[:ffn, :h] = gate
            mlp.up_proj.weight[:ffn, :h] = up
            mlp.down_proj.weight[:h, :ffn] = block.down.weight * SHRINK
            layer.input_layernorm.weight[:h] = block.norm1.weight * fix
            layer.post_attention_layernorm.weight[:h] = block.norm2.weight * fix
        # The last layer: attention all zero (adds 0); MLP = x / rms(x) on channels < h, 1 on the rest.
        last = model.model.layers[-1]
        last.post_attention_layernorm.weight[:h] = fix
        last.mlp.gate_proj.bias[:h] = GATE
        last.mlp.up_proj.weight[:h, :h] = torch.eye(h) / GATE
        last.mlp.down_proj.weight[:h, :h] = torch.eye(h)
        last.mlp.down_proj.bias[h:] = 1.0
        # [x / rms(x), 1, ..., 1] has RMS 1: the final norm applies the drafter's weight (1 on the rest).
        model.model.norm.weight[:h] = lm.norm.weight
        model.model.norm.weight[h:] = 1.0
        head = model.lm_head.weight
        keep = lm.keep.to(head.device)
        rows = target.get_output_embeddings().weight.detach().float()[keep.to(embed.device)]
        head[:, h] = OFF_SUBSET
        head[keep, :h] = (rows @ lm.up.weight).to(head.device)
        head[keep, h] = lm.bias.detach().float().to(head.device)
    return model.to(embed.device)
