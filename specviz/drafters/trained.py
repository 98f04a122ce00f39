"""Trained drafters on disk: which target they belong to, saving, loading, model cards.

A file is safetensors (weights stored fp16, loaded fp32) with metadata: the drafter kind,
its config as JSON, and the fingerprint of the target it was trained for. Loading checks
the fingerprint, so a drafter never silently attaches to a different target.

The fingerprint hashes weights rounded to bfloat16, so fp32, bf16 and any device agree; fp16
does not (fp32 -> fp16 -> bf16 rounds twice and lands elsewhere at ties). A file therefore also
keeps a few hundred of the target's weights as numbers (`target_probe`): a target whose hash
differs but whose weights match those within half precision's rounding is the same model in
another precision, and the drafter loads.
"""
from __future__ import annotations

import hashlib
import json
import pathlib

import torch

from ..core.errors import SpecvizError

FORMAT = 1
SAMPLE = 4096  # values hashed per tensor: enough to tell models apart, cheap for big ones
SHIPPED = pathlib.Path(__file__).resolve().parents[2] / "assets" / "drafters" / "smollm2-135m-instruct"


def fingerprint(model) -> str:
    """A hex digest of a model's architecture and (a sample of) its weights.

    Values are rounded to bfloat16 before hashing, so the same weights loaded in fp32,
    bf16 or on another device give the same fingerprint.
    """
    digest = hashlib.sha256()
    config = model.config.to_dict()
    for key in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size",
                "num_attention_heads", "num_key_value_heads", "tie_word_embeddings"):
        digest.update(f"{key}={config.get(key)};".encode())
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // SAMPLE)
        values = flat[::step][:SAMPLE].to("cpu", torch.bfloat16).view(torch.int16)
        digest.update(f"{name}:{tuple(tensor.shape)};".encode())
        digest.update(values.numpy().tobytes())
    return digest.hexdigest()


PROBE_TENSORS, PROBE_VALUES = 8, 32
# Half precision's rounding is 2^-11 (fp16) or 2^-8 (bf16) of a value, and fp16 flushes values
# below ~6e-5 toward zero; weights of another model differ from these by far more than this.
PROBE_RTOL, PROBE_ATOL = 2.0 ** -7, 1e-4


def weight_probe(model) -> list[float]:
    """PROBE_VALUES evenly spaced weights from each of the first PROBE_TENSORS floating-point
    tensors (by name) with enough values, in float32: the same numbers in any precision, up to its rounding."""
    out = []
    tensors = [t for _, t in sorted(model.state_dict().items()) if t.is_floating_point() and t.numel() >= PROBE_VALUES]
    for tensor in tensors[:PROBE_TENSORS]:
        flat = tensor.detach().reshape(-1)
        step = flat.numel() // PROBE_VALUES
        out += [float(f"{v:.7g}") for v in flat[::step][:PROBE_VALUES].float().cpu().tolist()]
    return out


def same_weights(probe: list[float], model) -> bool:
    """Are `model`'s weights the probed ones, up to half precision's rounding?"""
    mine = weight_probe(model)
    return len(mine) == len(probe) > 0 and all(abs(a - b) <= PROBE_RTOL * abs(a) + PROBE_ATOL
                                               for a, b in zip(probe, mine))


def save_drafter(path, kind: str, module, config: dict, target_loaded, card: dict | None = None) -> pathlib.Path:
    """Write `module`'s own weights (fp16) and what is needed to rebuild and check it.

    Only the module's state_dict is saved: weights it shares with the target must be plain
    attributes, not parameters or buffers. A markdown model card goes beside it (`.md`).
    """
    from safetensors.torch import save_file

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: (t.detach().half() if t.is_floating_point() else t.detach()).cpu().contiguous()
               for name, t in module.state_dict().items()}
    meta = {"format": "specviz-drafter", "version": str(FORMAT), "kind": kind,
            "config": json.dumps(config), "target_fingerprint": fingerprint(target_loaded.model),
            "target_probe": json.dumps(weight_probe(target_loaded.model)), "target_name": target_loaded.name}
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)
    if card is not None:
        path.with_suffix(".md").write_text(model_card(kind, card))
    return path


_READ: dict[tuple, tuple[dict, dict]] = {}  # (path, mtime, size) -> read file; files are small


def read_drafter(path) -> tuple[dict, dict]:
    """(metadata with config decoded, state_dict in fp32) of a saved drafter file.

    Cached per file version; callers must not modify what they get (drafters copy it).
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise SpecvizError(f"drafter file {path} not found")
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _READ:
        _READ[key] = _read(path)
    meta, state = _READ[key]
    return dict(meta), dict(state)


def _read(path: pathlib.Path) -> tuple[dict, dict]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
        state = load_file(str(path))
    except OSError as e:
        raise SpecvizError(f"drafter file {path} cannot be read ({(e.strerror or 'an error').lower()})") from None
    except (SafetensorError, ValueError):
        # The library's own words ("header too large") describe its parser, not the visitor's mistake.
        raise SpecvizError(f"{path} is not a drafter file: specviz reads the safetensors files "
                           "`python -m specviz train` writes, and this is not one") from None
    if meta.get("format") != "specviz-drafter" or "kind" not in meta:
        raise SpecvizError(f"{path} is a safetensors file but not a specviz drafter (no drafter metadata)")
    try:
        meta["config"] = json.loads(meta.get("config") or "{}")
    except json.JSONDecodeError:
        raise SpecvizError(f"{path}: its drafter config is not valid JSON") from None
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    return meta, state


def load_drafter(path, target_loaded, kind: str | None = None):
    """A ready Drafter from a file saved by `save_drafter`, for `target_loaded` only."""
    meta, state = read_drafter(path)
    check_target(meta, target_loaded, path)
    found = meta["kind"]
    if kind is not None and found != kind:
        raise SpecvizError(f"{path} holds a {found!r} drafter, not a {kind!r} one")
    if found == "draft":
        from .distilled import drafter_from
    elif found == "medusa":
        from .medusa import drafter_from
    elif found == "eagle":
        from .eagle import drafter_from
    elif found == "block":
        from .block import drafter_from
    else:
        raise SpecvizError(f"{path}: unknown drafter kind {found!r} (expected draft, medusa, eagle or block)")
    return drafter_from(meta["config"], state, target_loaded)


def trained_drafter(kind: str, path: str, target) -> object:
    """A trained drafter of `kind` (draft, medusa, eagle, block): shipped for the embedded target (`path` ""),
    from a file ("medusa:PATH"), or a released head from a folder or the Hub
    ("eagle:yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", published.py)."""
    if path:
        file = pathlib.Path(path).expanduser()
        if kind in ("draft", "block") or file.is_file() or file.suffix == ".safetensors":
            return load_drafter(file, target, kind=kind)
        from .published import load_published

        return load_published(kind, path, target)
    shipped = SHIPPED / f"{kind}.safetensors"
    if not shipped.is_file():
        raise SpecvizError(f"no shipped {kind!r} drafter in this install ({shipped} is missing); "
                           f"train one with `python -m specviz train {kind}` and pass '{kind}:PATH'")
    from ..modeling.models import is_embedded

    meta, _ = read_drafter(shipped)
    try:
        check_target(meta, target, shipped)
    except SpecvizError:
        if is_embedded(target.name):  # the embedded model itself: say what differs, not that it is another model
            raise
        raise SpecvizError(
            f"the shipped {kind!r} drafter is trained for the embedded SmolLM2-135M-Instruct "
            f"('default'), not for {target.name!r}; train one for it with "
            f"`python -m specviz train {kind} --target {target.name}` and pass '{kind}:PATH'"
        ) from None
    return load_drafter(shipped, target, kind=kind)


def check_target(meta: dict, target_loaded, path) -> None:
    """Refuse a drafter trained for another model; the same weights in another precision pass."""
    model = target_loaded.model
    mine = fingerprint(model)
    theirs = meta.get("target_fingerprint", "")
    if theirs == mine:
        return
    try:
        probe = json.loads(meta.get("target_probe") or "[]")
    except json.JSONDecodeError:
        probe = []
    if probe and same_weights(probe, model):
        return
    name, trained_for = target_loaded.name, meta.get("target_name", "?")
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if not probe and dtype == "float16":
        why = (f"its fingerprint ({theirs[:12]}) was taken in float32 and this file keeps no weights to compare a "
               f"float16 copy with: load {name!r} in float32 or bfloat16 (--dtype bf16), or train it again")
    elif trained_for == name:
        why = (f"the {name!r} loaded here ({dtype}) has other weights than the one it was trained on "
               f"(fingerprint {mine[:12]}, not {theirs[:12]})")
    else:
        why = (f"it was trained for {trained_for!r} (fingerprint {theirs[:12]}), and {name!r} here has other weights "
               f"(fingerprint {mine[:12]})")
    raise SpecvizError(
        f"{pathlib.Path(path).name} cannot draft for this target: {why}; a drafter only works with the weights it "
        f"was trained for: train one with `python -m specviz train {meta.get('kind', 'draft')} --target {name}`"
    )


def model_card(kind: str, card: dict) -> str:
    """A short markdown card: a title, then one line per entry (nested dicts as sub-lists)."""
    lines = [f"# specviz {kind} drafter", ""]
    for key, value in card.items():
        if isinstance(value, dict):
            lines.append(f"- **{key}**:")
            lines += [f"  - {k}: {_fmt(v)}" for k, v in value.items()]
        else:
            lines.append(f"- **{key}**: {_fmt(value)}")
    return "\n".join(lines) + "\n"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return " / ".join(_fmt(x) for x in v)
    return str(v)
