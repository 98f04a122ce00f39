"""The model card of a trained drafter: what it was trained on and how, and where it is saved.

The held-out measurements come from evaluate.py, through the loop; this file only describes
and writes.
"""
from __future__ import annotations

import dataclasses
import pathlib

from ..drafters.trained import fingerprint, model_card, save_drafter
from .config import Progress, TrainConfig
from .data import Corpus


def describe_data(corpus: Corpus, train_c: Corpus, held_c: Corpus) -> dict:
    meta = corpus.meta
    # Prompts are counted from the sequences themselves: meta["prompts"] names only the last build's
    # pool, and a folder grown over several builds holds answers to prompts from earlier pools too.
    variants, prompts = {}, {}
    for s in corpus.sequences:
        variants[s.variant] = variants.get(s.variant, 0) + 1
        prompts.setdefault(s.source, set()).add(s.prompt_id)
    temperature = meta.get("settings", {}).get("temperature", "?")
    by_size = sorted(prompts.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    which = (f"{sum(map(len, prompts.values())):,} prompts ({', '.join(f'{k} {len(v):,}' for k, v in by_size)})"
             if prompts else meta.get("prompts", "a prompt set"))
    how = (f"greedy, and sampled at T={temperature}" if any(v != "greedy" for v in variants)
           else "greedy only")  # a --passes 1 build draws nothing
    return {"source": f"self-distillation: the target's own responses to {which} ({how})",
            "sequences (train / held-out)": f"{len(train_c.sequences)} / {len(held_c.sequences)}",
            "responses per pass": ", ".join(f"{k} {v}" for k, v in sorted(variants.items())),
            "tokens (all / target-written)": f"{corpus.tokens} / {corpus.response_tokens}",
            "generation seconds": round(float(meta.get("seconds", 0.0)), 1)}


def describe_target(target_loaded) -> str:
    return f"{target_loaded.name} (fingerprint {fingerprint(target_loaded.model)[:12]})"


def describe_recipe(recipe) -> dict:
    """The recipe's settings (a dataclass's fields), e.g. EAGLE's unroll depth; unused
    optional ones (empty, like an unfused EAGLE head's taps) are left out."""
    if not dataclasses.is_dataclass(recipe):
        return {}
    return {k: v for k, v in dataclasses.asdict(recipe).items() if k != "kind" and v != ()}


def describe_training(cfg: TrainConfig, state: Progress, sequences: int) -> dict:
    return {"steps": cfg.steps if state.step >= cfg.steps else f"{state.step} of {cfg.steps} (time cap)",
            "epochs": round(state.step * cfg.batch / max(1, sequences), 2),
            "schedule": f"AdamW, {cfg.warmup} warm-up steps, then cosine decay to a tenth of the lr",
            "batch": cfg.batch, "window": cfg.window, "lr": cfg.lr, "seed": cfg.seed,
            "precision": "fp32 weights, bf16 autocast" if cfg.autocast else "fp32",
            "seconds": round(state.seconds, 1),
            "train loss (mean of last 10%)": _tail_mean(state.history),
            "train loss (first 10 steps)": _head_mean(state.history),
            **({"saved weights": f"{1 - cfg.average_init:g} x trained + {cfg.average_init:g} x the --init "
                                 "weights (a weight average; held-out measures it)"} if cfg.average_init else {})}


def save_with_card(recipe, module, target_loaded, card: dict, out: pathlib.Path) -> dict:
    """Write the drafter (<kind>.safetensors) and its model card (<kind>.md); the card."""
    path = save_drafter(out / f"{recipe.kind}.safetensors", recipe.kind, module, recipe.config(module),
                        target_loaded, card)
    card["file"] = f"{path.name} ({path.stat().st_size / 1e6:.2f} MB, fp16)"
    path.with_suffix(".md").write_text(model_card(recipe.kind, card))
    return card


def _tail_mean(history: list[float]) -> float:
    tail = history[-max(1, len(history) // 10):]
    return round(sum(tail) / len(tail), 4) if tail else float("nan")


def _head_mean(history: list[float]) -> float:
    head = history[:10]
    return round(sum(head) / len(head), 4) if head else float("nan")
