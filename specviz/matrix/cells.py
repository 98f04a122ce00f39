"""The model matrix: every family x precision x drafter, greedy, against plain decoding.

For each family of families.py, in each precision, the same prompt (longer than any sliding
window) is decoded plainly once and speculatively with every drafter that applies; each cell
says whether the texts are identical, part at a near-tie the precision's rounding explains
(core/divergence.py), differ beyond that (a bug), or whether specviz refused the pair before the
run, and why, in the sentence a user would read. The EAGLE and Medusa heads are trained for the
tiny target in a second, on its own greedy text, so their drafts are often right and the accept
paths run too. `python -m specviz matrix` writes the results file docs/models.md's table is drawn
from; tests/test_families.py asserts the same cells.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from types import SimpleNamespace

import torch

from ..core.divergence import first_divergence, tie_tolerance
from ..core.errors import SpecvizError
from ..drafters.draft_model import DraftModel
from ..drafters.suffix_memory import SuffixMemory
from ..engine.generate import GenerationConfig, baseline_generate, collect, speculative_generate
from ..modeling.forward import forward, new_cache
from ..run.spec import Kind, build, parse, with_kinds
from .families import FAMILIES, tiny_model

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DRAFTERS = ("pld", "suffix", "draft-model", "layerskip", "eagle", "medusa")
VOCAB = 128
PROMPT_LEN, NEW_TOKENS, K = 40, 24, 4
LR = 6e-3  # the heads' AdamW rate: high, for a few dozen steps on a few hundred tokens


@dataclass(frozen=True)
class Cell:
    family: str
    dtype: str
    drafter: str
    outcome: str  # identical | near-tie | differs | refused
    detail: str = ""  # the refusal's sentence, or the divergence's
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0


def prompt(seed: int = 1) -> list[int]:
    """PROMPT_LEN ids: a 12-token phrase said over and over, so copying drafters find matches,
    longer than families.WINDOW, so sliding layers drop states and must roll back."""
    g = torch.Generator().manual_seed(seed)
    phrase = torch.randint(2, VOCAB, (12,), generator=g).tolist()
    return (phrase * (PROMPT_LEN // len(phrase) + 1))[:PROMPT_LEN]


def draft_family(family: str) -> str:
    """Another family sharing the vocabulary drafts (as a small model of another lab would)."""
    return "qwen3" if family == "llama" else "llama"


def train_heads(target, steps: int = 30) -> dict:
    """{"eagle": (config, state), "medusa": (config, state)} trained on the fp32 target's own
    greedy continuations of the matrix's prompt and a few random ones (self-distillation in
    miniature: a random tiny model's text cannot be predicted beyond what was seen, so the
    heads see the text the matrix decodes and their drafts are accepted often enough for
    the accept paths to run)."""
    from ..train.data import Corpus, Seq
    from ..train.eagle import EagleRecipe
    from ..train.medusa import MedusaRecipe

    g = torch.Generator().manual_seed(9)
    seqs = []
    with torch.inference_mode():
        for i in range(6):
            start = prompt() if i == 0 else torch.randint(2, VOCAB, (6,), generator=g).tolist()
            _, end = collect(baseline_generate(target, start, GenerationConfig(max_new_tokens=NEW_TOKENS, top=0,
                                                                               raw_top=0)))
            ids = start + list(end.token_ids)
            logits, h = forward(target, torch.tensor(ids, device=target.device), new_cache(target), hidden=True)
            top = torch.softmax(logits, -1).topk(4)
            seqs.append(Seq(torch.tensor(ids), len(start), h.half(), top.indices, top.values.half(), f"m{i}"))
    corpus = Corpus(seqs, {"vocab": VOCAB})
    loaded = SimpleNamespace(model=target, eos_token_ids=(1,))
    out = {}
    for recipe in (EagleRecipe(subset=0, unroll=2), MedusaRecipe(heads=2, subset=0)):
        torch.manual_seed(0)
        module = recipe.build(loaded, corpus)
        opt = torch.optim.AdamW(module.parameters(), lr=LR)
        for _ in range(steps):
            loss, _ = recipe.loss(module, loaded, corpus.sequences)
            opt.zero_grad()
            loss.backward()
            opt.step()
        out[recipe.kind] = (recipe.config(module), {k: v.detach().clone() for k, v in module.state_dict().items()})
    return out


def _draft_model(spec, target, family: str, dtype: torch.dtype, **_) -> DraftModel:
    other = tiny_model(draft_family(family), VOCAB, seed=1, dtype=dtype).to(target.model.device)
    return DraftModel(other, name="draft model")


def _head(spec, target, family: str, heads: dict | None, **_):
    """EAGLE or Medusa as trained for this tiny target (train_heads), not the embedded model's."""
    if heads is None:
        raise SpecvizError(f"no {spec.kind.name} head could be trained for {family}")
    if spec.kind.name == "eagle":
        from ..drafters.eagle import drafter_from
    else:
        from ..drafters.medusa import drafter_from
    return drafter_from(*heads[spec.kind.name], target)


# The names every entry point understands (run/spec.py), the matrix's own draft model, and its heads.
KINDS = with_kinds(Kind("draft-model", "draft model", _draft_model), Kind("eagle", "EAGLE", _head, trees=True),
                   Kind("medusa", "Medusa", _head, trees=True))
SPECS = {"layerskip": "layerskip:0"}  # a cell's drafter as run/spec.py reads it: layer 0 alone drafts


def make_drafter(name: str, target, family: str, heads: dict | None, dtype: torch.dtype):
    """The drafter `name` for this tiny target (SpecvizError: refused, as a user would be)."""
    loaded = SimpleNamespace(model=target, eos_token_ids=(1,), tokenizer=None)
    return build(parse(SPECS.get(name, name), KINDS), loaded, memory=SuffixMemory(), family=family, heads=heads,
                 dtype=dtype)


def run_family(family: str, dtypes=tuple(DTYPES), drafters=DRAFTERS, say=None, device="cpu") -> list[Cell]:
    """Every cell of one family (one target built per precision, heads trained once, in fp32)."""
    say = say or (lambda *_: None)
    ids = prompt()
    cfg = GenerationConfig(max_new_tokens=NEW_TOKENS, k=K, raw_top=0)
    heads, head_error = None, ""
    if {"eagle", "medusa"} & set(drafters):
        try:
            heads = train_heads(tiny_model(family, VOCAB).to(device))
        except SpecvizError as e:
            head_error = str(e)
    cells = []
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        target = tiny_model(family, VOCAB, dtype=dtype).to(device)
        base_events, base_end = collect(baseline_generate(target, ids, cfg))
        for name in drafters:
            try:
                if name in ("eagle", "medusa") and heads is None:
                    raise SpecvizError(head_error or f"no {name} head for {family}")
                drafter = make_drafter(name, target, family, heads, dtype)
                steps, end = collect(speculative_generate(target, drafter, ids, cfg))
            except SpecvizError as e:
                cells.append(Cell(family, dtype_name, name, "refused", str(e)))
                say(family, dtype_name, name, "refused")
                continue
            d = first_divergence(steps, base_events, tie_tolerance(dtype_name))
            if d is None and end.token_ids == base_end.token_ids:
                outcome, detail = "identical", ""
            elif d is None:  # one run stopped early (EOS): a difference in length only
                outcome, detail = "differs", f"lengths differ: {len(end.token_ids)} vs {len(base_end.token_ids)}"
            else:
                outcome, detail = ("near-tie" if d.near_tie else "differs"), d.sentence()
            s = end.stats
            cells.append(Cell(family, dtype_name, name, outcome, detail, s.drafted, s.accepted, s.tokens))
            say(family, dtype_name, name, outcome)
    return cells


def run(families=FAMILIES, dtypes=tuple(DTYPES), drafters=DRAFTERS, say=None, device="cpu") -> dict:
    """The whole matrix as a results file's dict (cells plus the counts docs/models.md shows)."""
    start = time.perf_counter()
    cells = [c for f in families for c in run_family(f, dtypes, drafters, say, device)]
    return {"cells": [asdict(c) for c in cells], "families": list(families), "dtypes": list(dtypes),
            "drafters": list(drafters), "seconds": round(time.perf_counter() - start, 1),
            "settings": {"vocab": VOCAB, "prompt_tokens": PROMPT_LEN, "max_new_tokens": NEW_TOKENS, "k": K}}
