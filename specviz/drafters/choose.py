"""From what a user typed (CLI flag, app dropdown, benchmark list) to a drafter.

`make_drafter` returns a *fresh* drafter for one run (drafters hold per-run state such as
a KV cache); the models behind them come from the shared, read-only load cache.
"""
from __future__ import annotations

import difflib
import pathlib
from typing import Callable

from ..core.errors import SpecvizError
from .base import Drafter
from .draft_model import DraftModel
from .prompt_lookup import PromptLookup, special_ids

NONE_NAMES = ("none", "off", "baseline")
PLD_NAMES = ("pld", "prompt-lookup", "prompt lookup", "ngram")
LAYER_SKIP = "layerskip"  # "layerskip" (default subset) or "layerskip:0-9,14,20-29"
WITH_LOOKUP = "+pld"  # "eagle+pld": prompt lookup where the context repeats, that drafter elsewhere
SUFFIX = "suffix"  # suffix decoding (drafters/suffix.py): this request and earlier answers
WITH_SUFFIX = "suffix+"  # "suffix+eagle": suffix decoding where it is sure, that drafter elsewhere
# Trained drafters: "draft" | "medusa" | "eagle" = shipped for the embedded target,
# "draft:PATH" etc. = a file written by `python -m specviz train`; "eagle:FOLDER_OR_HUB_ID" and
# "medusa:FOLDER_OR_HUB_ID" = a head its authors released (published.py).
# Each kind's name as a person reads it (drafter_label): the menus, Compare's table and the panel
# titles all say these, never "pld" or "draft model layerskip".
TRAINED = {"draft": "distilled draft model", "medusa": "Medusa", "eagle": "EAGLE"}
SHIPPED = pathlib.Path(__file__).resolve().parents[2] / "assets" / "drafters" / "smollm2-135m-instruct"


NAMES = ("'none', 'pld', 'suffix', 'layerskip[:LAYERS]', 'eagle', 'medusa', 'draft' (or 'eagle:PATH' etc.), "
         "'NAME+pld', 'suffix+NAME', or a draft model's Hub id or folder")


def check_name(spec: str) -> None:
    """Refuse a drafter name that is a typo of one of ours ('eagel', 'sufix'), in a sentence that says
    what the drafter names are, before it is tried as a draft model (whose failure would give the
    target's advice). A folder that exists, or a Hub id with its '/', is never refused here."""
    s = (spec or "").strip()
    if not s or "/" in s or "\\" in s or pathlib.Path(s).expanduser().exists():
        return
    known = [*NONE_NAMES, *PLD_NAMES, SUFFIX, LAYER_SKIP, *TRAINED]
    for word in (part.partition(":")[0].strip().lower() for part in s.split("+")):  # "sufix+eagle", "eagel:PATH"
        close = [] if word in known else difflib.get_close_matches(word, known, 1, 0.75)
        if close:
            raise SpecvizError(f"unknown drafter {s!r}: did you mean {close[0]!r}? The drafters are {NAMES}")


def _trained(spec: str) -> tuple[str, str] | None:
    """(kind, path or "") for a trained-drafter spec, else None."""
    s = (spec or "").strip()
    kind, sep, path = s.partition(":")
    if kind.lower() in TRAINED and (not sep or path.strip()):
        return kind.lower(), path.strip()
    return None


def split_hybrid(spec: str) -> tuple[str, str | None]:
    """("eagle", "pld") for "eagle+pld", ("eagle", "suffix") for "suffix+eagle" (hybrid.py: that
    copier where the text repeats, the model drafter elsewhere); (spec, None) for any other spec."""
    s = (spec or "").strip()
    if s.lower().endswith(WITH_LOOKUP):
        return s[: -len(WITH_LOOKUP)].strip(), "pld"
    if s.lower().startswith(WITH_SUFFIX):
        return s[len(WITH_SUFFIX):].strip(), SUFFIX
    return s, None


def paired(drafter: Drafter | None, spec: str, copier: str = "pld", memory=None, target=None) -> Drafter:
    """`drafter` paired with prompt lookup or suffix decoding, or a sentence saying why it cannot be.
    target: its tokenizer's special tokens are never proposed by the lookup."""
    from .hybrid import Hybrid

    if drafter is None or isinstance(drafter, Hybrid) or getattr(drafter, "sure", None) is not None:
        how = f"'{spec}{WITH_LOOKUP}': '{WITH_LOOKUP}' pairs prompt lookup" if copier == "pld" else \
            f"'{WITH_SUFFIX}{spec}': '{WITH_SUFFIX}NAME' pairs suffix decoding"
        raise SpecvizError(f"{how} with a model drafter (eagle, medusa, draft, layerskip or a draft model), "
                           "not with a copying drafter, a pair or none")
    return Hybrid(drafter, suffix(memory) if copier == SUFFIX else lookup(target, sure_match=2))


def suffix(memory=None) -> Drafter:
    """Suffix decoding over `memory` (default: this process's, shared by the CLI's and the
    library's runs; the app passes each visitor's own)."""
    from .suffix import Suffix
    from .suffix_memory import process_memory

    return Suffix(memory if memory is not None else process_memory())


def lookup(target=None, **options) -> PromptLookup:
    """Prompt lookup for `target` (a models.Loaded): its special tokens are never proposed."""
    return PromptLookup(special=special_ids(getattr(target, "tokenizer", None)), **options)


def drafter_label(spec: str) -> str:
    """A short human name for a drafter spec: "prompt lookup", "layer skip", "EAGLE + prompt lookup",
    "suffix decoding + EAGLE" (the copier first where it drafts first), "draft model NAME"."""
    inner, copier = split_hybrid(spec)
    if copier == SUFFIX:
        return f"suffix decoding + {drafter_label(inner)}"
    if copier:
        return f"{drafter_label(inner)} + prompt lookup"
    s = spec.strip().lower()
    if s in NONE_NAMES:
        return "none"
    if s in PLD_NAMES:
        return "prompt lookup"
    if s == SUFFIX:
        return "suffix decoding"
    if s == LAYER_SKIP or s.startswith(LAYER_SKIP + ":"):
        layers = s.partition(":")[2].strip()
        return "layer skip" + (f" (layers {layers})" if layers else "")
    trained = _trained(spec)
    if trained:
        kind, path = trained
        return TRAINED[kind] if not path else f"{TRAINED[kind]} ({pathlib.Path(path).name})"
    return f"draft model {spec.strip()}"


def needs_model(spec: str) -> bool:
    """Does this drafter spec name a separate draft model to load?"""
    s = split_hybrid(spec)[0].lower()
    return (bool(s) and s not in NONE_NAMES and s not in PLD_NAMES and s != SUFFIX
            and not s.startswith(LAYER_SKIP) and _trained(s) is None)


def draft_model(target, draft, spec: str) -> DraftModel:
    """Wrap a loaded draft model after checking it shares the target's tokenizer."""
    from ..modeling import models

    models.check_same_vocab(target, draft)
    return DraftModel(draft.model, name=drafter_label(spec))


def make_drafter(spec: str, target, *, trust_remote_code: bool = False,
                 progress: Callable[[str, float], None] | None = None, memory=None, draft=None) -> Drafter | None:
    """`none` -> None (plain decoding in steps), `pld` -> prompt lookup, `suffix` -> suffix
    decoding over `memory` (a SuffixMemory; default: the process's), `layerskip[:layers]`
    -> the target with layers skipped, `draft`/`medusa`/`eagle` -> the shipped trained drafter
    (embedded target only), `draft:PATH` etc. -> a trained file, else a draft model id or folder;
    any of those but none, pld and suffix with `+pld` -> paired with prompt lookup, as
    `suffix+NAME` with suffix decoding (hybrid.py).

    A draft model is loaded on the target's device and dtype and must share its tokenizer; `draft`:
    one already loaded (models.Loaded) by a caller that shows its loading (the app).
    """
    from ..modeling import models  # imported here: the engine layers never need transformers' loaders

    s = (spec or "").strip()
    if not s:
        raise SpecvizError(f"no drafter given: the drafters are {NAMES}")
    check_name(s)
    inner, copier = split_hybrid(s)
    if copier:
        model = make_drafter(inner, target, trust_remote_code=trust_remote_code, progress=progress, memory=memory,
                             draft=draft)
        return paired(model, inner, copier, memory, target)
    if s.lower() in NONE_NAMES:
        return None
    if s.lower() in PLD_NAMES:
        return lookup(target)
    if s.lower() == SUFFIX:
        return suffix(memory)
    if s.lower().startswith(LAYER_SKIP):
        return _layer_skip(s, target)
    if _trained(s):
        return trained_drafter(s, target)
    if draft is None:
        draft = models.load(s, device=str(target.device), dtype=_dtype_name(target.dtype),
                            trust_remote_code=trust_remote_code, progress=progress)
    return draft_model(target, draft, s)


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _layer_skip(spec: str, target) -> Drafter:
    from .layer_skip import LayerSkip, decoder_layers, parse_layers

    _, _, layers = spec.partition(":")
    keep = parse_layers(layers, len(decoder_layers(target.model))) if layers.strip() else None
    return LayerSkip(target.model, keep)


def trained_drafter(spec: str, target) -> Drafter:
    """A trained drafter: shipped ("medusa") for the embedded target, from a file ("medusa:PATH"),
    or a released head from a folder or the Hub ("eagle:yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")."""
    from .trained import load_drafter, read_drafter

    kind, path = _trained(spec)
    if path:
        file = pathlib.Path(path).expanduser()
        if kind == "draft" or file.is_file() or file.suffix == ".safetensors":
            return load_drafter(file, target, kind=kind)
        from .published import load_published

        return load_published(kind, path, target)
    shipped = SHIPPED / f"{kind}.safetensors"
    if not shipped.is_file():
        raise SpecvizError(f"no shipped {kind!r} drafter in this install ({shipped} is missing); "
                           f"train one with `python -m specviz train {kind}` and pass '{kind}:PATH'")
    from .trained import check_target

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
