"""The forward paths: the position-indexed fast path computes what transformers computes,
rollback is exact on both paths, and drafters that read the target's features get the right
hidden states at the right moments."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from conftest import noisy_copy, tiny_llama
from specviz import DraftModel, GenerationConfig, PromptLookup, collect
from specviz import baseline_generate, speculative_generate
from specviz.drafters.base import Draft, Drafter
from specviz.modeling import llama_fast
from specviz.modeling.forward import forward, new_cache, rollback


def tiny_qwen2(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
def test_fast_path_logits_match_transformers_in_chunks_and_after_rollback(make):
    model = make()
    assert llama_fast.supports(model)
    ids = torch.randint(0, 96, (300,), generator=torch.Generator().manual_seed(0))  # past one cache block
    with torch.no_grad():
        ref = model(input_ids=ids[None]).logits[0]
        cache = new_cache(model)
        assert isinstance(cache, llama_fast.KVCache)
        chunks = [forward(model, ids[a:b], cache) for a, b in ((0, 7), (7, 8), (8, 250), (250, 300))]
        torch.testing.assert_close(torch.cat(chunks), ref, rtol=1e-4, atol=1e-4)
        rollback(cache, 120)
        assert cache.get_seq_length() == 120
        torch.testing.assert_close(forward(model, ids[120:130], cache), ref[120:130], rtol=1e-4, atol=1e-4)


def test_hidden_states_are_the_lm_head_input_on_both_paths(monkeypatch):
    model = tiny_llama()
    ids = torch.arange(20) % 96
    with torch.no_grad():
        fast_logits, fast_h = forward(model, ids, new_cache(model), hidden=True)
        monkeypatch.setenv("SPECVIZ_FAST", "0")
        cache = new_cache(model)
        assert isinstance(cache, DynamicCache)
        slow_logits, slow_h = forward(model, ids, cache, hidden=True)
    torch.testing.assert_close(fast_h, slow_h, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.lm_head(fast_h), fast_logits)
    torch.testing.assert_close(fast_logits, slow_logits, rtol=1e-4, atol=1e-4)


def test_layer_inputs_are_transformers_hidden_states_on_both_paths(monkeypatch):
    """hidden=(i, j, ...) gives the inputs of those layers side by side (what EAGLE-3 reads),
    in two chunks as in one, and the same logits as hidden=False."""
    model = tiny_llama(layers=8)
    ids = torch.arange(20) % 96
    layers = (2, 4, 5)
    with torch.no_grad():
        states = model.model(input_ids=ids[None], output_hidden_states=True).hidden_states
        want = torch.cat([states[i][0] for i in layers], -1)
        for fast in ("1", "0"):
            monkeypatch.setenv("SPECVIZ_FAST", fast)
            cache = new_cache(model)
            (l1, h1), (l2, h2) = forward(model, ids[:12], cache, hidden=layers), forward(model, ids[12:], cache, hidden=layers)
            torch.testing.assert_close(torch.cat([h1, h2]), want, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(torch.cat([l1, l2]), forward(model, ids, new_cache(model)), rtol=1e-4, atol=1e-4)


def test_layer_number_L_is_the_final_state_and_inner_states_can_stop_early(monkeypatch):
    """A fused specviz EAGLE head reads (2, 4, L): L = the layer count is the final, normed
    state (what hidden=True gives). Recording the data's inner states runs only the layers
    below the last tap, with the same values."""
    model = tiny_llama(layers=8)
    ids = torch.arange(20) % 96
    with torch.no_grad():
        out = model.model(input_ids=ids[None], output_hidden_states=True)
        want = torch.cat([out.hidden_states[2][0], out.hidden_states[4][0], out.last_hidden_state[0]], -1)
        for fast in ("1", "0"):
            monkeypatch.setenv("SPECVIZ_FAST", fast)
            logits, h = forward(model, ids, new_cache(model), hidden=(2, 4, 8))
            torch.testing.assert_close(h, want, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(logits, forward(model, ids, new_cache(model)), rtol=1e-4, atol=1e-4)
        monkeypatch.setenv("SPECVIZ_FAST", "1")
        cache = new_cache(model)
        final, inner = llama_fast.states(model, ids, cache, layers=(2, 4), final=False)
        assert final is None and cache.length == 20
        torch.testing.assert_close(torch.cat(inner, -1), want[:, :128], rtol=1e-4, atol=1e-4)


def test_unsupported_layouts_fall_back_to_transformers(monkeypatch):
    model = tiny_llama()
    monkeypatch.setenv("SPECVIZ_FAST", "0")
    assert not llama_fast.supports(model)
    monkeypatch.delenv("SPECVIZ_FAST")
    model.config.model_type = "something-else"
    assert not llama_fast.supports(model)


def test_greedy_speculation_is_exact_on_the_transformers_path_too(monkeypatch, prompts):
    monkeypatch.setenv("SPECVIZ_FAST", "0")
    target = tiny_llama()
    cfg = GenerationConfig(max_new_tokens=30, k=3)
    for prompt in prompts:
        _, base = collect(baseline_generate(target, prompt, cfg))
        for drafter in (PromptLookup(), DraftModel(noisy_copy(target, 0.05))):
            _, end = collect(speculative_generate(target, drafter, prompt, cfg))
            assert end.token_ids == base.token_ids


class Recorder(Drafter):
    """Drafts fixed junk and records the hidden states the engine hands over."""

    needs_hidden = True

    def begin(self, prompt_ids, processor, generator, device, hidden=None, trees=False):
        self.rows = [hidden]
        self.checks = []
        self.device = device

    def propose(self, ids, k, min_confidence=0.0):
        self.checks.append((len(ids) - 1, sum(r.shape[0] for r in self.rows)))
        return Draft(torch.tensor([(t * 7 + 3) % 96 for t in ids[-k:]], device=self.device), None)

    def feedback(self, accepted, hidden=None, path=None):
        assert hidden.shape[0] == accepted + 1
        self.rows.append(hidden)


@pytest.mark.parametrize("fast", ["1", "0"])
def test_feature_drafters_see_the_target_state_of_every_token_but_the_newest(monkeypatch, fast):
    monkeypatch.setenv("SPECVIZ_FAST", fast)
    target = tiny_llama()
    prompt = [5, 9, 2, 44, 17, 3]
    drafter = Recorder()
    _, end = collect(speculative_generate(target, drafter, prompt, GenerationConfig(max_new_tokens=20, k=3)))
    seen = torch.cat(drafter.rows)
    ids = prompt + list(end.token_ids)
    assert all(want == got for want, got in drafter.checks)  # one row per context token but the newest
    with torch.no_grad():
        _, h = forward(target, torch.tensor(ids), new_cache(target), hidden=True)
    torch.testing.assert_close(seen, h[: seen.shape[0]], rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # torch.compile
def test_compiled_decoder_stack_computes_the_same_logits():
    """--compile: dynamo traces the stack with dynamic lengths (the eager backend keeps the
    test quick; inductor only changes the kernels)."""
    model = tiny_llama()
    ids = torch.randint(0, 96, (30,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = forward(model, ids, new_cache(model))
        llama_fast.compile_stack(model, backend="eager")
        cache = new_cache(model)
        got = torch.cat([forward(model, ids[a:b], cache) for a, b in ((0, 9), (9, 10), (10, 14), (14, 30))])
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_half_precision_rms_norm_survives_a_residual_streams_largest_values():
    """A raw residual stream (a fused EAGLE head's taps) has dimensions in the thousands: squared
    in fp16 they overflow. The norm squares in float32 and matches the float32 result."""
    from specviz.modeling.layers import rms_norm

    x = torch.randn(4, 64)
    x[:, 3] = 20000.0
    weight = torch.rand(64) + 0.5
    want = rms_norm(x, weight, 1e-5)
    for dtype in (torch.float16, torch.bfloat16):
        got = rms_norm(x.to(dtype), weight.to(dtype), 1e-5)
        assert got.dtype == dtype and torch.isfinite(got).all()
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_rolled_rotation_is_rope_bit_for_bit(dtype):
    """The fast path rotates q and k with the sign folded into sin and a roll for the pair swap: the
    very bits of rope's (transformers') result, so a teacher-forced pass and a batched writer agree."""
    from specviz.modeling.layers import rope, rope_rolled, signed_sin

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 12, 64, generator=g).to(dtype)
    angles = torch.randn(5, 1, 64, generator=g)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    assert torch.equal(rope_rolled(x, cos, signed_sin(sin)), rope(x, cos, sin))
