"""The distilled draft model as a plain transformers LlamaForCausalLM.

transformers' assisted generation (`generate(assistant_model=...)`) takes only a full
causal LM. To compare specviz with it on the *same pair*, the benchmark exports the
distilled drafter into that shape and runs both libraries with the export:

- the shared target embedding and the input projection fold into one (vocab, hidden) table;
- the target's output rows and the up-projection fold into a full-vocabulary LM head
  (the distilled drafter scores only its frequent-token subset, with a learned bias; the
  export scores every token and has no bias, so it drafts nearly, not exactly, the same);
- fused q/k/v and gate/up matrices split into Llama's separate projections.
"""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .distilled import DistilledDrafter


def to_transformers(drafter: DistilledDrafter, target) -> LlamaForCausalLM:
    """`drafter` attached to `target` (the target's nn.Module) -> an equivalent LlamaForCausalLM."""
    lm = drafter.model
    c = lm.config
    embed = lm.embed.float()
    cfg = LlamaConfig(
        vocab_size=embed.shape[0], hidden_size=c.hidden, intermediate_size=c.ffn, num_hidden_layers=c.layers,
        num_attention_heads=c.heads, num_key_value_heads=c.heads, rms_norm_eps=1e-6,
        rope_theta=c.rope_theta, max_position_embeddings=8192, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False,
    )
    model = LlamaForCausalLM(cfg).eval().requires_grad_(False)
    h = c.hidden
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embed @ lm.inp.weight.T)
        for block, layer in zip(lm.blocks, model.model.layers):
            qkv = block.qkv.weight
            layer.self_attn.q_proj.weight.copy_(qkv[:h])
            layer.self_attn.k_proj.weight.copy_(qkv[h:2 * h])
            layer.self_attn.v_proj.weight.copy_(qkv[2 * h:])
            layer.self_attn.o_proj.weight.copy_(block.out.weight)
            gate, up = block.gate_up.weight.chunk(2, dim=0)
            layer.mlp.gate_proj.weight.copy_(gate)
            layer.mlp.up_proj.weight.copy_(up)
            layer.mlp.down_proj.weight.copy_(block.down.weight)
            layer.input_layernorm.weight.copy_(block.norm1.weight)
            layer.post_attention_layernorm.weight.copy_(block.norm2.weight)
        model.model.norm.weight.copy_(lm.norm.weight)
        head = target.get_output_embeddings().weight.detach().float()
        model.lm_head.weight.copy_(head @ lm.up.weight)
    return model.to(embed.device)
