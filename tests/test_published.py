"""Heads their authors released, in their own layouts: EAGLE-1/2, EAGLE-3 and Medusa.

Each test writes a tiny checkpoint exactly as the upstream code saves one (SafeAILab/EAGLE
cnets1.py / cnets.py, FasterDecoding/Medusa medusa_model.py: the same key names and
config.json fields), loads it as a user would (`eagle:FOLDER`), and checks that the
drafter computes what the upstream maths computes (a reference written out here with plain
tensor operations), that speculative output is the target's, and that what cannot load
says why. Nothing here touches the Hugging Face Hub.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_llama
from specviz import GenerationConfig, Sampling, baseline_generate, collect, speculative_generate
from specviz.core.errors import SpecvizError
from specviz.core.sampling import Processor
from specviz.run.spec import make_drafter, parse
from test_sampling_distribution import N, PROMPT, SAMPLING, assert_matches, exact_joint

HEADS, KV = 4, 2  # the tiny targets' attention shape, which the heads copy
LAYOUTS = ["eagle1", "eagle1-safetensors", "eagle1-deep", "eagle3", "medusa", "medusa-legacy"]


def loaded(model):
    return SimpleNamespace(model=model, name="tiny", device=torch.device("cpu"), dtype=torch.float32)


def write(folder, config: dict, state: dict, name: str):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if name.endswith(".safetensors"):
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / name))
    else:
        torch.save(state, folder / name)
    return folder


def decoder_layer(prefix: str, g, width: int, h: int, m: int) -> dict:
    """A Llama decoder layer's weights as EAGLE names them; attention reads `width` inputs."""
    d = h // HEADS
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.3  # noqa: E731
    return {f"{prefix}self_attn.q_proj.weight": r(HEADS * d, width),
            f"{prefix}self_attn.k_proj.weight": r(KV * d, width),
            f"{prefix}self_attn.v_proj.weight": r(KV * d, width), f"{prefix}self_attn.o_proj.weight": r(h, HEADS * d),
            f"{prefix}mlp.gate_proj.weight": r(m, h), f"{prefix}mlp.up_proj.weight": r(m, h),
            f"{prefix}mlp.down_proj.weight": r(h, m), f"{prefix}post_attention_layernorm.weight": 1 + r(h)}


def eagle_config(model, **extra) -> dict:
    """A one-layer Llama config.json, as EAGLE's training scripts write one."""
    h, vocab = model.config.hidden_size, model.config.vocab_size
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": h,
            "intermediate_size": 2 * h, "num_attention_heads": HEADS, "num_key_value_heads": KV, "num_hidden_layers": 1,
            "rms_norm_eps": 1e-5, "rope_theta": 500.0, "vocab_size": vocab, "torch_dtype": "float16", **extra}


def checkpoint(layout: str, model, folder, seed: int = 0):
    """(folder, config, state) of a random head for `model` in `layout`."""
    g = torch.Generator().manual_seed(seed)
    h, vocab = model.config.hidden_size, model.config.vocab_size
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.3  # noqa: E731
    if layout.startswith("eagle1"):
        config = eagle_config(model, bias=True)
        state = {"fc.weight": r(h, 2 * h), "fc.bias": r(h), **decoder_layer("layers.0.", g, h, h, 2 * h)}
        if layout == "eagle1-deep":  # num_hidden_layers 2: layer 1 norms its input, layer 0 does not;
            config["num_hidden_layers"] = 2  # and q/k/v biases, as heads for Qwen targets have
            state |= {**decoder_layer("layers.1.", g, h, h, 2 * h), "layers.1.input_layernorm.weight": 1 + r(h)}
            d = h // HEADS
            state |= {f"layers.{i}.self_attn.{n}_proj.bias": r(heads * d) for i in (0, 1)
                      for n, heads in (("q", HEADS), ("k", KV), ("v", KV))}
        name = "model.safetensors" if layout.endswith("safetensors") else "pytorch_model.bin"
    elif layout == "eagle3":
        draft = vocab - vocab // 4  # the draft vocabulary leaves every fourth token out
        used = torch.tensor([t for t in range(vocab) if t % 4 != 1][:draft])
        config = eagle_config(model, draft_vocab_size=draft)
        state = {"fc.weight": r(h, 3 * h), **decoder_layer("midlayer.", g, 2 * h, h, 2 * h),
                 "midlayer.input_layernorm.weight": 1 + r(h), "midlayer.hidden_norm.weight": 1 + r(h),
                 "norm.weight": 1 + r(h), "lm_head.weight": r(draft, h) * 8,
                 "d2t": used - torch.arange(draft), "t2d": torch.isin(torch.arange(vocab), used)}
        name = "pytorch_model.bin"
    else:  # Medusa: two heads of one ResBlock each; the released ones add a vocabulary projection
        config = {"medusa_num_heads": 2, "medusa_num_layers": 1, "base_model_name_or_path": "tiny"}
        state = {}
        for j in range(2):
            state |= {f"{j}.0.linear.weight": r(h, h), f"{j}.0.linear.bias": r(h)}
            if layout == "medusa":
                state[f"{j}.1.weight"] = r(vocab, h) * 8
        name = "medusa_lm_head.pt" if layout == "medusa" else "medusa_lm_head.safetensors"
    return write(folder, config, state, name), config, state


def spec(layout: str, folder) -> str:
    return f"{'medusa' if layout.startswith('medusa') else 'eagle'}:{folder}"


# --- the upstream maths, written out -------------------------------------------------

def rms(x, w, eps=1e-5):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def layer(x, a, s: dict, p: str, theta: float = 500.0):
    """An EAGLE draft decoder layer over a whole sequence: residual x, attention input a."""
    t, d = a.shape[0], x.shape[-1] // HEADS
    proj = lambda n: a @ s[f"{p}self_attn.{n}_proj.weight"].T + s.get(f"{p}self_attn.{n}_proj.bias", 0)  # noqa: E731
    q = proj("q").view(t, HEADS, d).transpose(0, 1)
    k = proj("k").view(t, KV, d).transpose(0, 1).repeat_interleave(HEADS // KV, 0)
    v = proj("v").view(t, KV, d).transpose(0, 1).repeat_interleave(HEADS // KV, 0)
    angles = torch.arange(t)[:, None] / theta ** (torch.arange(0, d, 2) / d)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = lambda z: torch.cat([-z[..., d // 2:], z[..., : d // 2]], -1)  # noqa: E731
    q, k = q * cos + half(q) * sin, k * cos + half(k) * sin
    scores = (q @ k.transpose(1, 2)) / d ** 0.5 + torch.full((t, t), float("-inf")).triu(1)
    x = x + (scores.softmax(-1) @ v).transpose(0, 1).reshape(t, -1) @ s[p + "self_attn.o_proj.weight"].T
    b = rms(x, s[p + "post_attention_layernorm.weight"])
    gate, up, down = (s[f"{p}mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
    return x + (F.silu(b @ gate.T) * (b @ up.T)) @ down.T


def model_layers(state: dict) -> int:
    return len({k.split(".")[1] for k in state if k.startswith("layers.")})


def reference_q(layout: str, model, state: dict, ids: list[int], k: int) -> torch.Tensor:
    """The first k greedy draft distributions, as the upstream code computes them."""
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.model(input_ids=x, output_hidden_states=True)
        embed = model.model.embed_tokens
        if layout.startswith("medusa"):
            h, rows = out.last_hidden_state[0, -2], []
            for j in range(k):  # each head from the newest state the target has run
                z = h + F.silu(h @ state[f"{j}.0.linear.weight"].T + state[f"{j}.0.linear.bias"])
                rows.append(z @ state[f"{j}.1.weight"].T if layout == "medusa" else model.lm_head(z))
            return torch.softmax(torch.stack(rows), -1)
        n = model.config.num_hidden_layers
        features = (torch.cat([out.hidden_states[i][0, :-1] for i in (2, n // 2, n - 3)], -1) if layout == "eagle3"
                    else out.last_hidden_state[0, :-1])
        tokens, rows, predicted = list(ids[1:]), [], []
        for _ in range(k):  # feed each prediction back with the token drafted from it
            e = embed(torch.tensor(tokens))
            if layout == "eagle3":  # fc fuses the target's states once; predictions are already narrow
                hid = torch.cat([features @ state["fc.weight"].T, *predicted])
                y = layer(hid, torch.cat([rms(e, state["midlayer.input_layernorm.weight"]),
                                          rms(hid, state["midlayer.hidden_norm.weight"])], -1), state, "midlayer.")
                logits = torch.full((model.config.vocab_size,), float("-inf"))
                draft = state["lm_head.weight"].shape[0]
                row = rms(y[-1], state["norm.weight"]) @ state["lm_head.weight"].T
                logits[torch.arange(draft) + state["d2t"]] = row  # draft id j is target id j + d2t[j]
            else:  # EAGLE-1/2: fc over (embedding, feature), no input norm, the target's LM head
                xin = torch.cat([e, torch.cat([features, *predicted])], -1) @ state["fc.weight"].T + state["fc.bias"]
                y = layer(xin, xin, state, "layers.0.")
                for i in range(1, model_layers(state)):
                    y = layer(y, rms(y, state[f"layers.{i}.input_layernorm.weight"]), state, f"layers.{i}.")
                logits = model.lm_head(y[-1])
            q = torch.softmax(logits, -1)
            rows.append(q)
            tokens.append(int(q.argmax()))
            predicted.append(y[-1:])
        return torch.stack(rows)


@pytest.fixture(scope="module")
def deep():
    """Eight layers: EAGLE-3 reads the inputs of layers 2, 4 and 5."""
    return tiny_llama(layers=8)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_drafts_are_what_the_upstream_code_computes(deep, layout, tmp_path):
    folder, _, state = checkpoint(layout, deep, tmp_path / layout)
    drafter = make_drafter(spec(layout, folder), loaded(deep))
    ids = list(range(30, 47))
    k = 2 if layout.startswith("medusa") else 3
    with torch.inference_mode():
        hidden = deep.model(torch.tensor([ids]), output_hidden_states=True)
        if drafter.hidden_layers:
            h = torch.cat([hidden.hidden_states[i][0, :-1] for i in drafter.hidden_layers], -1)
        else:
            h = hidden.last_hidden_state[0, :-1]
        drafter.begin(ids, Processor(Sampling(), 96, ids, "cpu"), torch.Generator(), torch.device("cpu"), hidden=h)
        draft = drafter.propose(ids, k)
    want = reference_q(layout, deep, state, ids, k)
    torch.testing.assert_close(draft.q, want, rtol=1e-4, atol=1e-5)
    if layout == "eagle3":  # q is exactly zero off the draft vocabulary, so verification stays exact
        assert (draft.q[:, 1::4] == 0).all() and (draft.tokens % 4 != 1).all()


@pytest.fixture(scope="module")
def baselines(deep, prompts):
    """Greedy baselines on the 96-token target and on an 8-token one (drafts often right)."""
    out = []
    for model in (deep, tiny_llama(vocab=8, layers=8, seed=5)):
        for prompt in prompts[1:]:
            prompt = [t % model.config.vocab_size for t in prompt]
            _, base = collect(baseline_generate(model, prompt, GenerationConfig(max_new_tokens=20)))
            out.append((model, prompt, base))
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("k,tree", [(3, 0), (4, 3)])
def test_greedy_speculative_equals_greedy_baseline(baselines, layout, k, tree, tmp_path):
    cfg = GenerationConfig(max_new_tokens=20, k=k)
    accepted = drafted = 0
    for i, (model, prompt, base) in enumerate(baselines):
        folder = checkpoint(layout, model, tmp_path / f"{layout}{i}")[0]
        drafter = make_drafter(spec(layout, folder), loaded(model))
        drafter.tree_width = tree
        steps, end = collect(speculative_generate(model, drafter, prompt, cfg))
        assert end.token_ids == base.token_ids
        assert all((s.tree is not None) == (tree > 1 and bool(s.draft)) for s in steps)
        accepted, drafted = accepted + end.stats.accepted, drafted + end.stats.drafted
    assert 0 < accepted < drafted


def test_greedy_is_exact_on_the_transformers_path_too(baselines, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIZ_FAST", "0")  # EAGLE-3's layer inputs from output_hidden_states
    model, prompt, base = baselines[-1]
    drafter = make_drafter(spec("eagle3", checkpoint("eagle3", model, tmp_path)[0]), loaded(model))
    _, end = collect(speculative_generate(model, drafter, prompt, GenerationConfig(max_new_tokens=20, k=3)))
    assert end.token_ids == base.token_ids and end.stats.accepted


@pytest.mark.slow
def test_eagle3_sampled_tokens_follow_the_target(tmp_path):
    """Chi-square of the first three sampled tokens against the exact joint, with an EAGLE-3
    head whose draft vocabulary lacks token 1 of the four."""
    model = tiny_llama(vocab=4, layers=8, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.3)
    joint = exact_joint(model, SAMPLING)
    drafter = make_drafter(spec("eagle3", checkpoint("eagle3", model, tmp_path)[0]), loaded(model))
    counts = {}
    for seed in range(N):
        cfg = GenerationConfig(max_new_tokens=3, k=3, sampling=Sampling(**{**SAMPLING.__dict__, "seed": seed}))
        _, end = collect(speculative_generate(model, drafter, PROMPT, cfg))
        counts[end.token_ids] = counts.get(end.token_ids, 0) + 1
    assert_matches(counts, joint)


# --- what does not load says why --------------------------------------------------------

def test_unknown_layouts_and_missing_files_are_named(deep, tmp_path):
    target = loaded(deep)
    write(tmp_path / "odd", {"hidden_size": 64}, {"encoder.weight": torch.zeros(2, 2)}, "model.safetensors")
    with pytest.raises(SpecvizError, match="layout specviz does not know.*encoder.weight"):
        make_drafter(f"eagle:{tmp_path / 'odd'}", target)
    write(tmp_path / "m", {"medusa_num_heads": 1}, {"heads.0.weight": torch.zeros(2, 2)}, "medusa_lm_head.pt")
    with pytest.raises(SpecvizError, match="not Medusa's layout"):
        make_drafter(f"medusa:{tmp_path / 'm'}", target)
    with pytest.raises(SpecvizError, match="has no model.safetensors or pytorch_model.bin.*medusa_lm_head.pt"):
        make_drafter(f"eagle:{tmp_path / 'm'}", target)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "pytorch_model.bin").write_bytes(b"not a checkpoint")
    with pytest.raises(SpecvizError, match="not a readable weight file"):
        make_drafter(f"eagle:{tmp_path / 'bad'}", target)


def test_a_deep_eagle_head_with_a_layer_missing_or_unlike_its_first_is_refused(deep, tmp_path):
    folder, config, state = checkpoint("eagle1-deep", deep, tmp_path / "deep")
    gap = {k.replace("layers.1.", "layers.2."): v for k, v in state.items()}
    write(tmp_path / "gap", config, gap, "pytorch_model.bin")
    with pytest.raises(SpecvizError, match=r"layers are numbered \[0, 2\], not 0 to 1"):
        make_drafter(spec("eagle1", tmp_path / "gap"), loaded(deep))
    unnormed = {k: v for k, v in state.items() if k != "layers.1.input_layernorm.weight"}
    write(tmp_path / "unnormed", config, unnormed, "pytorch_model.bin")
    with pytest.raises(SpecvizError, match="lacks layers.1.input_layernorm.weight"):
        make_drafter(spec("eagle1", tmp_path / "unnormed"), loaded(deep))
    no_mlp = {k: v for k, v in state.items() if k != "layers.1.mlp.up_proj.weight"}
    write(tmp_path / "no_mlp", config, no_mlp, "pytorch_model.bin")
    with pytest.raises(SpecvizError, match="lacks.*up"):
        make_drafter(spec("eagle1", tmp_path / "no_mlp"), loaded(deep))
    # biases on layer 1 only: the head is built from layer 0's shape, so they would be dropped
    half_biased = {k: v for k, v in state.items() if not (k.startswith("layers.0.") and k.endswith("_proj.bias"))}
    write(tmp_path / "half_biased", config, half_biased, "pytorch_model.bin")
    with pytest.raises(SpecvizError, match=r"weights \['blocks.0.k.bias'.*have no place"):
        make_drafter(spec("eagle1", tmp_path / "half_biased"), loaded(deep))


def test_a_head_for_another_target_is_refused(deep, tmp_path):
    wide = tiny_llama(layers=8, hidden=96)
    for layout, message in (("eagle1", "hidden size 64.*has 96"), ("eagle3", "3 x hidden size 192.*has 288"),
                            ("medusa", "hidden size 64.*has 96")):
        folder = checkpoint(layout, deep, tmp_path / layout)[0]
        with pytest.raises(SpecvizError, match=message):
            make_drafter(spec(layout, folder), loaded(wide))
    with pytest.raises(SpecvizError, match="vocabulary size 96.*has 8"):
        make_drafter(spec("eagle1", tmp_path / "eagle1"), loaded(tiny_llama(vocab=8, layers=8)))
    with pytest.raises(SpecvizError, match="layers 2, L//2 and L-3.*has 2 layers"):
        make_drafter(spec("eagle3", tmp_path / "eagle3"), loaded(tiny_llama()))


def test_hub_ids_download_only_the_head_files(deep, tmp_path, monkeypatch):
    """A Hub id fetches config.json and the first weight file the repository has (a stand-in
    for hf_hub_download serves a local folder); offline, the error says so."""
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError

    folder = checkpoint("eagle3", deep, tmp_path / "hub")[0]
    asked = []

    def download(repo_id, filename):
        asked.append((repo_id, filename))
        if not (folder / filename).is_file():
            raise EntryNotFoundError(f"{filename} not in {repo_id}")
        return str(folder / filename)

    with monkeypatch.context() as m:
        m.setattr(huggingface_hub, "hf_hub_download", download)
        drafter = make_drafter("eagle:someone/EAGLE3-tiny", loaded(deep))
    assert drafter.hidden_layers == (2, 4, 5) and drafter.name == "eagle EAGLE3-tiny"
    assert asked == [("someone/EAGLE3-tiny", n) for n in ("config.json", "model.safetensors", "pytorch_model.bin")]
    assert not parse("eagle:someone/EAGLE3-tiny").needs_model
    with pytest.raises(SpecvizError, match="not a local folder.*Hub could not provide it"):
        make_drafter("medusa:someone/not-cached-here", loaded(deep))  # HF_HUB_OFFLINE (conftest)
