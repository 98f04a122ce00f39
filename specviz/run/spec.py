"""A drafter as a value: what a user typed (a CLI flag, the app's menu, a benchmark list) parsed once into a
DrafterSpec, and `build`, which makes the drafter it names.

The language: a kind of KINDS by its name ('none', 'pld', 'suffix', 'layerskip[:LAYERS]', 'eagle[:PATH]', ...)
or a draft model's Hub id or folder; 'NAME+pld' pairs a model drafter with prompt lookup and 'suffix+NAME' with
suffix decoding (drafters/hybrid.py). How its drafts are shaped or judged is no part of it: a name's '@'
suffix ('NAME@block', 'NAME@chain', ...) sets a GenerationConfig knob, read in run/arms.py. An application with kinds of
its own (the bench's tiny-random and draft-hf, the matrix's draft-model and its heads trained in place) parses
against KINDS plus those (`with_kinds`): run/ never imports it, and no entry point's names depend on which
application happened to be imported.
"""
from __future__ import annotations

import difflib
import pathlib
from dataclasses import dataclass
from typing import Callable, Mapping

from ..core.errors import SpecvizError
from ..drafters.base import Drafter
from ..drafters.draft_model import DraftModel
from ..drafters.prompt_lookup import PromptLookup, special_ids

NONE = "none"  # plain decoding in steps: the speculative loop with empty drafts
PAIRS = {"pld": "+pld", "suffix": "suffix+"}  # the copier -> how a name pairs a model drafter with it
SHORT_NAMES = {"default": "SmolLM2-135M (embedded)"}  # a model as labels name it


@dataclass(frozen=True)
class Kind:
    """One way of drafting, as a name asks for it."""

    name: str  # as typed: "layerskip"
    label: str  # as a person reads it: "layer skip" (the menus, Compare's table, the panel titles); "{}": the argument
    build: Callable[..., Drafter | None]  # (spec, target, **options) -> a fresh drafter for one run
    argument: str = ""  # what may follow "NAME:" ("LAYERS", "PATH"); "": nothing may
    shows: Callable[[str], str] = str  # the argument as the label says it: "layers 0-9", "draft.safetensors"
    aliases: tuple[str, ...] = ()
    pairs: bool = True  # a model drafter: NAME+pld and suffix+NAME may pair it with a copier
    needs_model: bool = False  # a separate draft model is loaded by its name (the argument)
    says: str = ""  # what it is, for a command's --help: "the target with only LAYERS of its layers"
    trees: bool = False  # it may draft trees: NAME@chain, NAME@drawn and NAME@chosen apply to it (run/arms.py)

    def title(self, argument: str) -> str:
        """The label of this kind with `argument`: "layer skip (layers 0-9)", "draft model: x"."""
        if not argument:
            return self.label
        shown = self.shows(argument)
        return self.label.format(shown) if "{}" in self.label else f"{self.label} ({shown})"

    @property
    def typed(self) -> str:
        return f"{self.name}[:{self.argument}]" if self.argument else self.name


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter as it was asked for, parsed once (`parse`); `build` makes it."""

    text: str  # as typed, stripped
    kind: Kind
    argument: str = ""  # after "NAME:" (layers, a file, a released head), or the draft model's id or folder
    copier: str = ""  # "pld" (NAME+pld) or "suffix" (suffix+NAME): that copier drafts where the text repeats

    @property
    def needs_model(self) -> bool:
        """Does this spec name a separate draft model to load (`argument`)?"""
        return self.kind.needs_model

    @property
    def drafter_label(self) -> str:
        """The drafter's own name, without its pairing: "layer skip (layers 0-9)", "draft model: x"."""
        return self.kind.title(self.argument)

    @property
    def label(self) -> str:
        """A short human name: "prompt lookup", "EAGLE + prompt lookup", "suffix decoding + EAGLE" (the copier
        first where it drafts first), "draft model: SmolLM2-360M-Instruct"."""
        name = self.drafter_label
        if not self.copier:
            return name
        return f"suffix decoding + {name}" if self.copier == "suffix" else f"{name} + prompt lookup"


# The forms a name may take around a kind's, with what each asks for: the error sentences list them, --help says them.
FORMS = (("NAME+pld", "prompt lookup where the text repeats itself, the model drafter NAME elsewhere"),
         ("suffix+NAME", "suffix decoding where it is sure, NAME elsewhere"),
         ("NAME@token", "NAME's sampled chain drafts judged token by token, whatever the settings say"),
         ("NAME@block", "judged as a block"), ("NAME@chain", "EAGLE, Medusa or block drafting chains, not trees"),
         ("NAME@drawn", "a sampled tree's children drawn from q"), ("NAME@chosen", "the likeliest children"))


def names(kinds: Mapping[str, Kind]) -> str:
    """Every name a drafter may be given, in one phrase for a sentence."""
    return ", ".join([*(f"'{k.typed}'" for k in kinds.values() if k.name != MODEL.name),
                      *(f"'{form}'" for form, _ in FORMS)]) + ", or a draft model's Hub id or folder"


def unknown(typed: str, kinds: Mapping[str, Kind]) -> str:
    """The sentence for a drafter name that is no drafter's, no folder and no Hub model: the drafter names,
    the closest first (a typo too far for parse to refuse, 'egale', was tried as a model and got the
    target's advice)."""
    by_name = [alias for k in kinds.values() if k is not MODEL for alias in (k.name, *k.aliases)]
    close = difflib.get_close_matches(typed.strip().lower(), by_name, 1, 0.4)
    nearest = f"; the closest drafter name is {close[0]!r}" if close else ""
    return (f"unknown drafter {typed!r}: no drafter goes by that name, and it is no local folder or Hub model "
            f"either (the Hub did not provide it; offline?){nearest}. The drafters are {names(kinds)}")


def described(kinds: Mapping[str, Kind] | None = None) -> str:
    """Every drafter name with what it is, for a command's --help: from the table, so a new kind is named once."""
    kinds = KINDS if kinds is None else kinds
    each = [f"{k.typed} ({k.says or k.label})" for k in kinds.values() if k.name != MODEL.name]
    return "; ".join([*each, *(f"{form} ({what})" for form, what in FORMS)]) + (
        "; or a draft model's Hub id or folder sharing the target's tokenizer")


def parse(text: str, kinds: Mapping[str, Kind] | None = None) -> DrafterSpec:
    """The spec `text` asks for, or SpecvizError with one sentence naming the drafters."""
    kinds = KINDS if kinds is None else kinds
    s = (text or "").strip()
    if not s:
        raise SpecvizError(f"no drafter given: the drafters are {names(kinds)}")
    inner, copier = _unpaired(s)
    kind, argument = _kind(inner, s, kinds)
    if copier and (not kind.pairs or _unpaired(inner)[1]):
        how = f"'{inner}+pld': '+pld' pairs prompt lookup" if copier == "pld" else \
            f"'suffix+{inner}': 'suffix+NAME' pairs suffix decoding"
        raise SpecvizError(f"{how} with a model drafter (eagle, medusa, block, draft, layerskip or a draft model), "
                           "not with a copying drafter, a pair or none")
    return DrafterSpec(s, kind, argument, copier)


def _unpaired(text: str) -> tuple[str, str]:
    """("eagle", "pld") for "eagle+pld", ("eagle", "suffix") for "suffix+eagle"; (text, "") for any other."""
    if text.lower().endswith(PAIRS["pld"]):
        return text[: -len(PAIRS["pld"])].strip(), "pld"
    if text.lower().startswith(PAIRS["suffix"]):
        return text[len(PAIRS["suffix"]):].strip(), "suffix"
    return text, ""


def _kind(text: str, typed: str, kinds: Mapping[str, Kind]) -> tuple[Kind, str]:
    """(kind, argument) for one drafter's name. A name that is none of the kinds is a draft model's, unless it
    is a typo of one ('eagel', 'sufix+medusa'): that is refused before it is tried as a model, whose failure
    would give the target's advice. A folder that exists, or a Hub id with its '/', is never refused."""
    by_name = {alias: k for k in kinds.values() if k is not MODEL for alias in (k.name, *k.aliases)}
    if text.lower() in by_name:
        return by_name[text.lower()], ""
    head, sep, argument = text.partition(":")
    kind, exists = by_name.get(head.strip().lower()), pathlib.Path(text).expanduser().exists()
    if kind is not None and sep and not exists:
        if not kind.argument:
            raise SpecvizError(f"unknown drafter {typed!r}: '{kind.name}' takes nothing after ':'; "
                               f"the drafters are {names(kinds)}")
        if not argument.strip():
            raise SpecvizError(f"unknown drafter {typed!r}: give a {kind.argument} after '{kind.name}:'; "
                               f"the drafters are {names(kinds)}")
        return kind, argument.strip()
    if not ("/" in text or "\\" in text or exists):
        for word in (part.partition(":")[0].strip().lower() for part in text.split("+")):
            close = [] if word in by_name else difflib.get_close_matches(word, list(by_name), 1, 0.75)
            if close:
                raise SpecvizError(f"unknown drafter {typed!r}: did you mean {close[0]!r}? "
                                   f"The drafters are {names(kinds)}")
    return MODEL, text


def build(spec: DrafterSpec, target, **options) -> Drafter | None:
    """A fresh drafter for one run of `target` (a models.Loaded; drafters hold per-run state such as a
    KV cache, the models behind them come from the shared load cache); None for 'none'.

    options: memory (suffix decoding's SuffixMemory; default: the process's, shared by the CLI's and the
    library's runs, the app passes each visitor's own), draft (the draft model already loaded, by a caller
    that shows its loading: the app), trust_remote_code and progress (loading the draft model), and what an
    application's own kinds read."""
    drafter = spec.kind.build(spec, target, **options)
    if spec.copier:
        from ..drafters.hybrid import Hybrid

        memory = options.get("memory")
        drafter = Hybrid(drafter, suffix(memory, target) if spec.copier == "suffix" else lookup(target, sure_match=2),
                         label=spec.drafter_label)  # "drafted by EAGLE", as the menus and panels name it
    return drafter


def check_length(drafter: Drafter | None, k: int) -> None:
    """Refuse, in a sentence, a draft length `k` longer than the drafter can draft (a block drafter's file
    names its block size); dynamic k, which only asks for up to what it may, is capped by the drafter."""
    model = getattr(drafter, "model", None) or drafter  # a pair's model drafter
    most = getattr(model, "max_draft", None)
    if most is not None and k > most:
        raise SpecvizError(f"{model.name} was trained for blocks of up to {most} tokens and k = {k} asks for a "
                           f"block of {k}: use k <= {most}, or train one with `python -m specviz train block "
                           f"--block {k}`")


def make_drafter(text: str, target, kinds: Mapping[str, Kind] | None = None, **options) -> Drafter | None:
    """build(parse(text), target, **options): for a caller that needs the drafter and nothing else of its spec."""
    return build(parse(text, kinds), target, **options)


def lookup(target=None, **options) -> PromptLookup:
    """Prompt lookup for `target` (a models.Loaded): its special tokens are never proposed."""
    return PromptLookup(special=special_ids(getattr(target, "tokenizer", None)), **options)


def suffix(memory=None, target=None) -> Drafter:
    """Suffix decoding over `memory` (None: this process's) for `target`: its special tokens are never drafted."""
    from ..drafters.suffix import Suffix
    from ..drafters.suffix_memory import process_memory

    return Suffix(memory if memory is not None else process_memory(),
                  special=special_ids(getattr(target, "tokenizer", None)))


def model_name(name: str) -> str:
    """A model as labels name it: the embedded one by what it is, not by "default"."""
    return SHORT_NAMES.get(name, name)


def placed_as(target) -> dict:
    """models.load's device and dtype for a draft model of `target`: where the target is, in its precision."""
    return {"device": str(target.device), "dtype": str(target.dtype).removeprefix("torch.")}


def _draft_model(spec: DrafterSpec, target, *, draft=None, trust_remote_code: bool = False, progress=None,
                 **_) -> DraftModel:
    """The draft model `spec` names, loaded beside the target (or `draft`, already loaded); it must share
    the target's tokenizer."""
    from ..modeling import models  # imported here: the engine's layers never need transformers' loaders

    if draft is None:
        draft = load_draft(models, spec.argument, target, trust_remote_code=trust_remote_code, progress=progress)
    models.check_same_vocab(target, draft)
    return DraftModel(draft.model, name=spec.drafter_label)


def load_draft(models, name: str, target, **options):
    """The draft model `name`, loaded as `target` is placed by `models` (modeling.models or a test's
    loader); a name nothing goes by gets the drafters' sentence, not the target's advice."""
    from ..modeling.models import NotFound

    try:
        return models.load(name, **placed_as(target), **options)
    except NotFound:  # 'egale': a drafter's typo too far for parse to call one
        raise SpecvizError(unknown(name, KINDS)) from None


def _layer_skip(spec: DrafterSpec, target, **_) -> Drafter:
    from ..drafters.layer_skip import LayerSkip, decoder_layers, parse_layers

    keep = parse_layers(spec.argument, len(decoder_layers(target.model))) if spec.argument else None
    return LayerSkip(target.model, keep)


def _trained(spec: DrafterSpec, target, **_) -> Drafter:
    from ..drafters.trained import trained_drafter

    return trained_drafter(spec.kind.name, spec.argument, target)


def _short(model: str) -> str:
    return SHORT_NAMES.get(model) or model.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]


def _file_name(path: str) -> str:
    return pathlib.Path(path).name


# A draft model named by its Hub id or folder: the kind of every name that is none of the others.
MODEL = Kind("model", "draft model: {}", _draft_model, shows=_short, needs_model=True)
KINDS: Mapping[str, Kind] = {k.name: k for k in (
    Kind(NONE, "none", lambda *_, **__: None, aliases=("off", "baseline"), pairs=False,
         says="plain decoding in steps"),
    Kind("pld", "prompt lookup", lambda spec, target, **_: lookup(target),
         aliases=("prompt-lookup", "prompt lookup", "ngram"), pairs=False),
    Kind("suffix", "suffix decoding", lambda spec, target, memory=None, **_: suffix(memory, target), pairs=False,
         says="suffix decoding: this prompt and earlier answers", trees=True),
    Kind("layerskip", "layer skip", _layer_skip, "LAYERS", shows=lambda layers: f"layers {layers}",
         says="the target with only LAYERS of its layers, e.g. layerskip:0-9,20-29"),
    # Trained for the embedded target and shipped ("eagle"), written by `python -m specviz train` ("eagle:FILE"),
    # or a head its authors released ("eagle:FOLDER_OR_HUB_ID", drafters/published.py).
    Kind("eagle", "EAGLE", _trained, "PATH", shows=_file_name,
         says="EAGLE, trained for the embedded target; PATH: your own trained file, or a released head's folder "
              "or Hub id", trees=True),
    Kind("medusa", "Medusa", _trained, "PATH", shows=_file_name, says="Medusa, as eagle", trees=True),
    Kind("block", "block drafter", _trained, "PATH", shows=_file_name,
         says="a block (DFlash-style) drafter trained for the embedded target: up to 16 drafts in one pass; PATH: "
              "your own trained file", trees=True),
    Kind("draft", "distilled draft model", _trained, "PATH", shows=_file_name,
         says="a distilled draft model trained for the embedded target; PATH: your own trained file"),
    MODEL,
)}


def with_kinds(*kinds: Kind) -> Mapping[str, Kind]:
    """KINDS and an application's own kinds, for its parse (the draft model stays the last resort)."""
    table = {name: k for name, k in KINDS.items() if k is not MODEL}
    table.update((k.name, k) for k in kinds)
    return {**table, MODEL.name: MODEL}
