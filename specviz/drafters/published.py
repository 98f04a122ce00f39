"""Heads their authors released: EAGLE-1/2, EAGLE-3 and Medusa checkpoints, from a folder or the Hub.

`eagle:SOURCE` and `medusa:SOURCE` take a folder or a Hugging Face Hub id. The layouts, as
the upstream code saves and loads them (SafeAILab/EAGLE eagle/model/cnets1.py, cnets.py,
ea_model.py; FasterDecoding/Medusa medusa/model/medusa_model.py, medusa_model_legacy.py):

EAGLE-1/2  config.json, a one-layer Llama config (bias: fc has a bias, default true;
           optional qkv_bias); pytorch_model.bin or model.safetensors. `fc` reads
           (embedding, feature) in that order; `layers.0` is a decoder layer without an
           input norm; there is no final norm: the target's LM head reads the layer's output.
EAGLE-3    config.json adds draft_vocab_size. `fc` fuses the inputs of the target's layers
           2, L//2 and L-3 (L layers), concatenated; `midlayer` attends over
           (input_layernorm(embedding), hidden_norm(feature)), 2 * hidden wide, with the
           feature as its residual stream; its output feature goes on un-normed, and its own
           `norm` + `lm_head` read it over a draft vocabulary: draft id j is target id j + d2t[j].
Medusa     config.json (medusa_num_heads, medusa_num_layers); medusa_lm_head.pt or
           .safetensors: `{head}.{i}.linear` ResBlocks (one block listed medusa_num_layers
           times), then `{head}.{medusa_num_layers}.weight`, the head's own projection to the
           vocabulary. The legacy layout stops at the blocks and uses the target's LM head.
The embeddings are the target's unless the file carries `embed_tokens.weight`.
"""
from __future__ import annotations

import json
import pathlib
import re

import torch
from torch import nn

from ..core.errors import SpecvizError
from .eagle import Eagle, EagleHead
from .medusa import Medusa
from .published_heads import DraftVocab, Eagle3Head, HeadVocabs, RepeatedHeads

# Weight files per kind, in the order they are looked for.
WEIGHTS = {"eagle": ("model.safetensors", "pytorch_model.bin"),
           "medusa": ("medusa_lm_head.safetensors", "medusa_lm_head.pt")}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def load_published(kind: str, source: str, target_loaded):
    """A ready EAGLE or Medusa drafter from a released checkpoint (folder or Hub id)."""
    folder = _folder(kind, source)
    config, state = read(kind, folder)
    model = target_loaded.model
    name = f"{kind} {pathlib.Path(source.rstrip('/')).name}"
    try:
        if kind == "medusa":
            return _medusa(config, state, model, name)
        if any(k.startswith("midlayer.") for k in state):
            return _eagle3(config, state, model, name)
        if "layers.0.self_attn.q_proj.weight" in state:
            return _eagle1(config, state, model, name)
    except KeyError as e:
        raise SpecvizError(f"{folder}: the {kind} head's weight file lacks {e}") from None
    raise SpecvizError(
        f"{folder} holds weights in a layout specviz does not know (keys {_some(state)}); it reads "
        "EAGLE-1/2 heads (fc.*, layers.0.*) and EAGLE-3 heads (fc.*, midlayer.*, norm, lm_head, d2t)")


def _folder(kind: str, source: str) -> pathlib.Path:
    path = pathlib.Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists() or not HUB_ID.match(source):
        raise SpecvizError(f"{kind} head {source!r}: not a drafter file, a folder, or a Hub id like owner/name")
    return _from_hub(kind, source)


def _from_hub(kind: str, repo_id: str) -> pathlib.Path:
    """Download config.json and the first weight file the repository has (never the whole repo:
    some hold a full model beside the head)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        folder = pathlib.Path(hf_hub_download(repo_id, "config.json")).parent
        for name in WEIGHTS[kind]:
            try:
                hf_hub_download(repo_id, name)
                return folder
            except EntryNotFoundError as e:
                if isinstance(e, LocalEntryNotFoundError):
                    raise  # offline and not cached: not the same as absent
    except (OSError, ValueError, EntryNotFoundError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SpecvizError(f"{kind} head {repo_id!r} is not a local folder, and the Hugging Face Hub could not "
                           f"provide it (offline, or no such repository?): {first}") from None
    raise SpecvizError(f"{repo_id!r} on the Hub has no {' or '.join(WEIGHTS[kind])}: not a released {kind} head")


def read(kind: str, folder: pathlib.Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, tensors on the CPU) of a checkpoint folder."""
    config_file = folder / "config.json"
    try:
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    except (OSError, ValueError) as e:
        raise SpecvizError(f"{config_file} is not readable JSON: {e}") from None
    weights = next((folder / n for n in WEIGHTS[kind] if (folder / n).is_file()), None)
    if weights is None:
        found = sorted(p.name for p in folder.iterdir())[:8]
        raise SpecvizError(f"{folder} has no {' or '.join(WEIGHTS[kind])}, the files of a released {kind} "
                           f"head (it holds {found}); for a specviz drafter file pass the file itself")
    try:
        if weights.suffix == ".safetensors":
            from safetensors.torch import load_file
            return config, load_file(str(weights))
        return config, dict(torch.load(weights, map_location="cpu", weights_only=True))
    except Exception as e:  # a corrupt or foreign file: several libraries' error types
        raise SpecvizError(f"{weights} is not a readable weight file: {type(e).__name__}: {e}") from None


def _some(state: dict) -> str:
    return ", ".join(sorted(state)[:6]) + (", ..." if len(state) > 6 else "")


def _dims(model) -> tuple[int, int, int]:
    """The target's (hidden size, output vocabulary, decoder layers)."""
    weight = model.get_output_embeddings().weight
    return weight.shape[1], weight.shape[0], model.config.get_text_config().num_hidden_layers


def _eagle_config(config: dict, hidden: int) -> dict:
    """EagleHead's config from a released head's config.json (EAGLE's defaults where absent)."""
    try:
        heads = config["num_attention_heads"]
        scaling = config.get("rope_scaling")
        if scaling and scaling.get("type") != "linear":
            raise SpecvizError(f"rope_scaling {scaling} is not supported (only none or linear)")
        if config.get("hidden_act", "silu") != "silu":
            raise SpecvizError(f"hidden_act {config['hidden_act']!r} is not supported (only silu)")
        return {"hidden_size": hidden, "heads": heads, "kv_heads": config.get("num_key_value_heads") or heads,
                "head_dim": hidden // heads, "intermediate_size": config["intermediate_size"],
                "rms_norm_eps": float(config.get("rms_norm_eps", 1e-6)),
                "rope_theta": float(config.get("rope_theta", 10000.0)),
                "rope_scale": float(scaling["factor"]) if scaling else 1.0, "subset": 0}
    except KeyError as e:
        raise SpecvizError(f"the head's config.json lacks {e}") from None


def _check(what: str, theirs: int, mine: int, kind: str) -> None:
    if theirs != mine:
        raise SpecvizError(f"this {kind} head was made for a target with {what} {theirs}, but the target here "
                           f"has {mine}: use the head released for this target")


def _layer(state: dict, prefix: str) -> dict:
    """A released decoder layer's weights under EagleHead's names."""
    names = {"self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v", "self_attn.o_proj": "o",
             "mlp.gate_proj": "gate", "mlp.up_proj": "up", "mlp.down_proj": "down", "post_attention_layernorm": "ln2"}
    return {f"{mine}.{p}": state[f"{prefix}{theirs}.{p}"] for theirs, mine in names.items()
            for p in ("weight", "bias") if f"{prefix}{theirs}.{p}" in state}


def _eagle1(config: dict, state: dict, model, name: str) -> Eagle:
    hidden, vocab, _ = _dims(model)
    _check("hidden size", state["fc.weight"].shape[0], hidden, "EAGLE")
    _check("vocabulary size", config.get("vocab_size", vocab), vocab, "EAGLE")
    layers = sorted({int(k.split(".")[1]) for k in state if re.match(r"layers\.\d+\.", k)})
    if layers != list(range(len(layers))):
        raise SpecvizError(f"the EAGLE head's decoder layers are numbered {layers}, not 0 to {len(layers) - 1}")
    cfg = {**_eagle_config(config, hidden), "input_norm": False, "final_norm": False,
           "fc_bias": "fc.bias" in state, "qkv_bias": "layers.0.self_attn.q_proj.bias" in state}
    if len(layers) > 1:
        cfg["layers"] = len(layers)
    fc = state["fc.weight"]  # columns: (embedding, feature); EagleHead reads (feature, embedding)
    weights = {**_layer(state, "layers.0."), "fc.weight": torch.cat([fc[:, hidden:], fc[:, :hidden]], 1)}
    for i in layers[1:]:  # upstream's layer i > 0 normalises its input (input_layernorm): a pre-norm Block
        norm = f"layers.{i}.input_layernorm.weight"
        if norm not in state:
            raise SpecvizError(f"the EAGLE head's weight file lacks {norm} (every layer after the first has one)")
        block = {**_layer(state, f"layers.{i}."), "ln1.weight": state[norm]}
        weights |= {f"blocks.{i - 1}.{k}": v for k, v in block.items()}
    if "fc.bias" in state:
        weights["fc.bias"] = state["fc.bias"]
    head = _build(EagleHead(cfg), weights, model, "EAGLE-1/2")
    return Eagle(model, head, name=name, embed=_embedding(state, model))


def _eagle3(config: dict, state: dict, model, name: str) -> Eagle:
    hidden, vocab, n_layers = _dims(model)
    _check("vocabulary size", config.get("vocab_size", vocab), vocab, "EAGLE-3")
    taps = tuple(sorted({2, n_layers // 2, n_layers - 3}))
    fused = state["fc.weight"].shape[1]
    if len(taps) != 3 or not 0 <= taps[0]:
        raise SpecvizError(f"EAGLE-3 reads the inputs of layers 2, L//2 and L-3 of an L-layer target; "
                           f"this target has {n_layers} layers, too few")
    _check("3 x hidden size", fused, 3 * hidden, "EAGLE-3")
    width = state["midlayer.hidden_norm.weight"].shape[0]
    if width != hidden and "embed_tokens.weight" not in state:
        _check("hidden size", width, hidden, "EAGLE-3")
    draft_vocab = state["lm_head.weight"].shape[0]
    _check("draft vocabulary size", config.get("draft_vocab_size", draft_vocab), draft_vocab, "EAGLE-3")
    head = Eagle3Head(_eagle_config(config, width), fused, draft_vocab)
    weights = {**_layer(state, "midlayer."), "fc.weight": state["fc.weight"], "lm_head.weight": state["lm_head.weight"],
               "embed_norm.weight": state["midlayer.input_layernorm.weight"],
               "hidden_norm.weight": state["midlayer.hidden_norm.weight"], "lm_norm.weight": state["norm.weight"]}
    head = _build(head, weights, model, "EAGLE-3")
    lm = DraftVocab(head, _draft_ids(state, draft_vocab, vocab), vocab)
    return Eagle(model, head, name=name, embed=_embedding(state, model), lm=lm, hidden_layers=taps)


def _draft_ids(state: dict, draft_vocab: int, vocab: int) -> torch.Tensor | None:
    """Target id of each draft id (None: the draft vocabulary is the target's)."""
    if "d2t" not in state:
        if draft_vocab != vocab:
            raise SpecvizError(f"an EAGLE-3 head with a {draft_vocab}-token draft vocabulary needs its d2t map")
        return None
    ids = torch.arange(draft_vocab) + state["d2t"].long()
    if ids.numel() != draft_vocab or ids.min() < 0 or ids.max() >= vocab or ids.unique().numel() != draft_vocab:
        raise SpecvizError("the head's d2t map does not send its draft vocabulary to distinct target tokens")
    return None if torch.equal(ids, torch.arange(vocab)) else ids


def _medusa(config: dict, state: dict, model, name: str) -> Medusa:
    hidden, vocab, _ = _dims(model)
    keys = [re.fullmatch(r"(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)", k) for k in state]
    if not state or not all(keys):
        raise SpecvizError(f"the Medusa head's keys ({_some(state)}) are not Medusa's layout "
                           "({head}.{i}.linear.weight/bias, {head}.{layers}.weight)")
    n_heads = 1 + max(int(m[1]) for m in keys)
    layers = sum(1 for m in keys if m[1] == "0" and m[3] == "linear.weight")
    blocks = [[(state[f"{j}.{i}.linear.weight"], state[f"{j}.{i}.linear.bias"]) for i in range(layers)]
              for j in range(n_heads)]
    if any(not all(torch.equal(w, b[0][0]) for w, _ in b) for b in blocks if b):
        raise SpecvizError("the Medusa head's blocks differ within a head; Medusa repeats one block per head")
    if layers:
        _check("hidden size", blocks[0][0][0].shape[0], hidden, "Medusa")
    heads = RepeatedHeads(hidden, n_heads, max(layers, 1))
    for j, block in enumerate(heads.blocks):
        if layers:  # no blocks: zero weights, x + silu(0) = x
            block.weight.data, block.bias.data = blocks[j][0][0].float(), blocks[j][0][1].float()
    own = [f"{j}.{layers}.weight" for j in range(n_heads)]
    lm = None
    if all(k in state for k in own):  # the released heads: their own projection to the vocabulary
        _check("vocabulary size", state[own[0]].shape[0], vocab, "Medusa")
        lm = HeadVocabs(torch.stack([state[k] for k in own]), model)
    heads = heads.to(model.get_output_embeddings().weight).requires_grad_(False)
    return Medusa(model, heads, name=name, lm=lm)


def _build(head: nn.Module, weights: dict, model, kind: str) -> nn.Module:
    ref = model.get_output_embeddings().weight
    try:
        unplaced = head.load_state_dict(weights, strict=False).unexpected_keys
        missing = set(head.state_dict()) - set(weights) - {"subset"}
    except RuntimeError as e:  # shapes that disagree with config.json
        last = str(e).splitlines()[-1]
        raise SpecvizError(f"the {kind} head's weights do not match its config.json: {last}") from None
    if missing:
        raise SpecvizError(f"the {kind} head's weight file lacks {sorted(missing)[:4]}")
    if unplaced:  # its config.json describes a smaller head than its weights (e.g. no q/k/v bias)
        raise SpecvizError(f"the {kind} head's weights {sorted(unplaced)[:4]} have no place in the head "
                           "its config.json describes")
    return head.to(device=ref.device, dtype=ref.dtype).requires_grad_(False)


def _embedding(state: dict, model) -> nn.Module | None:
    """The head's own token embeddings when its file carries them (else the target's)."""
    if "embed_tokens.weight" not in state:
        return None
    ref = model.get_output_embeddings().weight
    return nn.Embedding.from_pretrained(state["embed_tokens.weight"].to(device=ref.device, dtype=ref.dtype))
