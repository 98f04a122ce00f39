"""Loading causal language models and talking to their tokenizers.

`load` turns what a user typed ("default", a local folder, a Hub id) into a `Loaded`
handle: model in eval mode plus tokenizer, shared read-only by everyone who asks for the
same thing, and kept in a small LRU cache under a memory budget. The tokenizer helpers live in
text.py; they are named here too, since the app and the CLI hand this module around as their
loader (load, encode_prompt, decode, token_strings; tests pass their own).
"""
from __future__ import annotations

import functools
import gc
import os
import pathlib
import socket
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

import torch

from ..core.errors import SpecvizError
from . import llama_fast, probe
from .text import check_same_vocab, decode, encode_chat, encode_prompt, token_strings  # noqa: F401 (the face)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

EMBEDDED_NAMES = ("default", "smollm2-135m")  # compared case-insensitively
EMBEDDED_HINT = "use 'default' for the embedded SmolLM2-135M-Instruct"


class NotFound(SpecvizError):
    """No local folder and no Hub model goes by the name: its sentence advises on targets, so a caller
    that asked for a draft model (run/spec.py) says its own."""

DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}

# "org/name" or a bare legacy name such as "gpt2": how a Hub id looks.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


@dataclass(frozen=True, eq=False)
class Loaded:
    """A loaded model and its tokenizer. Shared between callers: never mutate it."""

    model: "PreTrainedModel"  # eval mode, requires_grad off
    tokenizer: "PreTrainedTokenizerBase"
    name: str  # what the user typed
    source: str  # resolved local path or Hub id
    device: torch.device  # where inputs go (the input embeddings' device)
    dtype: torch.dtype

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: the generation config's and the tokenizer's."""
        config = getattr(self.model, "generation_config", None)
        ids = getattr(config, "eos_token_id", None)
        ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return tuple(dict.fromkeys(int(i) for i in ids))

    @property
    def pad_token_id(self) -> int:
        """The id batched generation pads with: the tokenizer's, else the first eos."""
        pad = self.tokenizer.pad_token_id
        return self.eos_token_ids[0] if pad is None else int(pad)

    @property
    def is_chat(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))


def is_embedded(name: str) -> bool:
    return name.strip().lower() in EMBEDDED_NAMES


def pick_device(name: str | None = None) -> torch.device:
    """The device to run on: `None`/"auto" picks cuda, then mps, then cpu."""
    if name is None or name.strip().lower() == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name.strip().lower())
    except (RuntimeError, ValueError):
        raise SpecvizError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SpecvizError(f"device {name!r} asked for, but this torch sees no CUDA GPU")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise SpecvizError(f"device {name!r} asked for, but there are only {count} GPU(s)")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise SpecvizError(f"device {name!r} asked for, but Apple's MPS is not available here")
    elif device.type != "cpu":
        raise SpecvizError(f"unsupported device {name!r}: use auto, cpu, cuda, cuda:N or mps")
    return device


def pick_dtype(device: torch.device, name: str | None = None) -> torch.dtype:
    """The weights' dtype: `None`/"auto" is float32 on cpu and mps, bfloat16 on cuda."""
    if name is not None and name.strip().lower() != "auto":
        try:
            return DTYPES[name.strip().lower()]
        except KeyError:
            raise SpecvizError(
                f"unknown dtype {name!r}: use auto, {', '.join(DTYPES)}"
            ) from None
    if device.type == "cuda":
        # GPUs before Ampere have no fast bf16; fp16 is their half precision.
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    # cpu: fp32 keeps speculative output token-for-token equal to plain greedy (bf16's batched
    # verify rounds differently at near-ties); bf16 is the faster choice where the CPU has it.
    # mps: bf16 needs macOS 14+ and fp16 overflows in some models' activations; fp32 works
    # everywhere, and a 135M-500M model fits easily.
    return torch.float32


# ---------------------------------------------------------------------------------------
# load


# Why compile is refused on a CPU: measured, docs/performance.md ("torch.compile on a CPU").
COMPILE_ON_CPU = ("--compile is for GPUs: on a CPU, torch.compile took minutes for each new draft length and its "
                  "steps were slower than specviz's own, which already multiply on the kernels timed fastest on "
                  "this CPU (oneDNN's packed weights, as inductor's freezing would); leave --compile off")
_LOADED: "OrderedDict[tuple, Loaded]" = OrderedDict()  # least recently used first
_KEY_LOCKS: dict[tuple, threading.Lock] = {}
_GUARD = threading.Lock()  # protects _KEY_LOCKS and _LOADED's order; each key's lock protects its load


def load(name: str, device: str | None = None, dtype: str | None = None, *,
         trust_remote_code: bool = False, device_map: str | None = None, compile: bool = False,
         progress: Callable[[str, float], None] | None = None, cache_bytes: int | None = None) -> Loaded:
    """Load a causal LM by name: "default", a local folder (or .gguf file), or a Hub id.

    Cached per (source, device, dtype, device_map, trust_remote_code): a second call, from
    any thread, returns the same model and tokenizer without loading again.
    cache_bytes: after this load, drop the least recently used other models until the cache's
    weights fit it (None: keep every model). A dropped model lives on while a caller holds it.
    compile: run the decoder stack through torch.compile (llama_fast.compile_stack; Llama-
    layout models only, others ignore it). The model is shared, so every caller gets it so.
    """
    dev = pick_device(device)
    if compile and dev.type == "cpu":
        raise SpecvizError(COMPILE_ON_CPU)
    source = _resolve(name, progress)
    dt = pick_dtype(dev, dtype)
    key = (source, str(dev), dt, device_map, trust_remote_code)
    with _GUARD:
        key_lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with key_lock:  # a second thread asking for the same model waits for the first load
        loaded = _LOADED.get(key)
        if loaded is None:
            loaded = _load_uncached(name, source, dev, dt, device_map, trust_remote_code, progress)
            with _GUARD:
                _LOADED[key] = loaded
        if compile and llama_fast.supports(loaded.model):
            llama_fast.compile_stack(loaded.model)
    with _GUARD:
        if key in _LOADED:
            _LOADED.move_to_end(key)
        dropped = cache_bytes is not None and _evict(cache_bytes, keep=key)
    if dropped:
        gc.collect()  # models hold reference cycles: free their memory now, not at a later collection
    return loaded if loaded.name == name else replace(loaded, name=name)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers (tied weights counted once)."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _evict(cache_bytes: int, keep: tuple) -> bool:
    """Drop least recently used models (never `keep`) until the cache's weights fit cache_bytes;
    True if any was dropped."""
    sizes = {k: weight_bytes(v.model) for k, v in _LOADED.items()}
    dropped = False
    for k in [k for k in _LOADED if k != keep]:
        if sum(sizes.values()) <= cache_bytes:
            break
        del _LOADED[k], sizes[k]
        dropped = True
    return dropped


def _resolve(name: str, progress) -> str:
    """A local path (absolute) or a Hub id for `name`; raises for a missing local path."""
    if not name or not name.strip():
        raise SpecvizError(f"no model name given: {EMBEDDED_HINT}")
    name = name.strip()
    if is_embedded(name):
        from .embedded import embedded_model_dir

        return str(embedded_model_dir(progress))
    path = pathlib.Path(name).expanduser()
    if path.exists():
        return str(path.resolve())
    looks_like_path = name.startswith((".", "/", "~")) or (
        (os.sep in name or "/" in name) and not HUB_ID.fullmatch(name)
    )
    if looks_like_path:
        raise SpecvizError(f"model folder {name!r} does not exist")
    return name


def _load_uncached(name, source, device, dtype, device_map, trust_remote_code, progress):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from .forward import transformers_problem

    too_old = transformers_problem()
    if too_old:  # before a download of gigabytes it could not use
        raise SpecvizError(too_old)
    if not trust_remote_code:
        # transformers fetches "hub kernels" (code from the Hub) for some layers on CUDA when the
        # kernels package is installed: code run without asking, and offline a ValueError per load
        os.environ.setdefault("USE_HUB_KERNELS", "NO")
    path = pathlib.Path(source)
    folder, kwargs = source, {"trust_remote_code": trust_remote_code}
    if not path.exists() and not _hub_reachable():
        kwargs["local_files_only"] = True  # fail in a moment, not after a minute of retries
    if path.is_file():
        if path.suffix != ".gguf":
            raise SpecvizError(f"{name!r} is a file: give the model's folder (or a .gguf file)")
        folder, kwargs["gguf_file"] = str(path.parent), path.name
    elif path.is_dir() and not (path / "config.json").is_file():
        raise SpecvizError(f"folder {name!r} has no config.json: it is not a transformers model")
    if progress is not None:
        progress(f"loading {name}", 0.0)
    try:
        config = AutoConfig.from_pretrained(folder, **kwargs)
        # Refuse before reading gigabytes of weights when the class is known up front
        # (it is not for trust_remote_code models: those are checked once loaded).
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)] if type(config) in \
            MODEL_FOR_CAUSAL_LM_MAPPING else None
        _check_rollback(name, model_class, config)
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            folder, config=config, dtype=dtype, device_map=device_map or device, **kwargs
        )
    except (torch.cuda.OutOfMemoryError, MemoryError) as e:
        raise SpecvizError(
            f"out of memory loading {name!r} on {device} in {dtype}: try a smaller model, "
            f"--dtype bf16, or another device ({type(e).__name__})"
        ) from None
    except (OSError, ValueError, ImportError) as e:
        said = _load_failure(name, path.exists(), e)
        raise (NotFound if said.endswith(EMBEDDED_HINT) else SpecvizError)(said) from None
    model.eval()
    model.requires_grad_(False)
    if model_class is None:
        _check_rollback(name, type(model), model.config)
    probe.check(model, repr(name))  # the first run would fail, or not be exact: say so now
    if device_map:  # accelerate placed the layers; inputs go where the embeddings are
        device = model.get_input_embeddings().weight.device
    if progress is not None:
        progress(f"loaded {name}", 1.0)
    return Loaded(model=model, tokenizer=tokenizer, name=name, source=source,
                  device=device, dtype=dtype)


@functools.cache
def _hub_reachable() -> bool:
    """Can this process open a connection to the Hub (or the mirror in HF_ENDPOINT)?"""
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=3).close()
        return True
    except OSError:
        return False


def _load_failure(name: str, local: bool, error: Exception) -> str:
    """A readable sentence for why from_pretrained failed."""
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if "custom code" in str(error):  # transformers' words; not a hub kernel's trust check
        return (f"{name!r} needs code from its own repository to run (its config names classes transformers does not "
                "ship), and specviz runs such code only when you allow it: pass --trust-remote-code to the command "
                "line if you trust that repository (the app never runs it)")
    if isinstance(error, ValueError) and ("Unrecognized configuration class" in str(error)
                                          or "kind of AutoModel" in str(error)):
        # transformers' words for "no causal-LM class for this config"
        return f"{name!r} is not a causal language model transformers can load: {first_line}"
    if local:
        return f"could not load model folder {name!r}: {type(error).__name__}: {first_line}"
    return (f"could not load model {name!r}: not a local folder, and the Hugging Face Hub "
            f"did not provide it (offline?) — {EMBEDDED_HINT}")


def _check_rollback(name: str, model_class, config) -> None:
    """Refuse models whose KV cache the engine could not roll back after a rejection."""
    from .forward import RollbackCache, keeps_state, rollback_problem

    problem = None
    if model_class is not None and hasattr(model_class, "_supports_default_dynamic_cache") \
            and not model_class._supports_default_dynamic_cache() and not keeps_state(model_class):
        problem = "it needs its own cache type, which cannot be cropped"
    else:
        problem = rollback_problem(RollbackCache(config=config), model_class)
    if problem:
        raise SpecvizError(f"{name!r} cannot be used for speculative decoding: {problem}")
