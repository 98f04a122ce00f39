"""One training loop for every drafter family.

A Recipe says what to build and what to minimise; `train` does the rest: seeded batches,
AdamW with warm-up and cosine decay, a progress bar, atomic checkpoints every N steps,
`resume` from the last one, a held-out loss, held-out acceptance (alpha, tau) measured
through the real engine, and the saved drafter with its model card.

Resuming gives the same result as an uninterrupted run: step s's batch depends only on
(seed, s), and the checkpoint holds the weights, the optimiser state and the loss log.
"""
from __future__ import annotations

import math
import pathlib
import time
from typing import Callable, Protocol

import torch
from torch import nn

from ..errors import SpecvizError
from .data import Corpus, Seq

CHECKPOINT = "checkpoint.pt"


class Recipe(Protocol):
    kind: str  # "draft" | "medusa" | "eagle"

    def build(self, target_loaded, corpus: Corpus) -> nn.Module: ...
    def config(self, module: nn.Module) -> dict: ...
    def loss(self, module: nn.Module, target_loaded, batch: list[Seq]) -> tuple[torch.Tensor, dict]: ...
    def drafter(self, module: nn.Module, target_loaded): ...
    # Optional: rebuild(config, state_dict, target_loaded) -> nn.Module, used to resume
    # (else build() on the same corpus, then load_state_dict).


def crop(seq: Seq, start: int, length: int) -> Seq:
    """A window of a sequence (all per-position fields sliced alike)."""
    end = start + length
    return Seq(seq.ids[start:end], max(0, seq.response_start - start), seq.hidden[start:end],
               seq.top_ids[start:end], seq.top_p[start:end], seq.prompt_id, seq.variant)


def sample_batch(corpus: Corpus, step: int, batch: int, seed: int, window: int) -> list[Seq]:
    """Step `step`'s batch: a function of (seed, step) only, so resuming repeats it exactly."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    picks = torch.randint(len(corpus.sequences), (batch,), generator=g).tolist()
    out = []
    for i in picks:
        s = corpus.sequences[i]
        if len(s.ids) > window:
            s = crop(s, int(torch.randint(len(s.ids) - window + 1, (1,), generator=g)), window)
        out.append(s)
    return out


def learning_rate(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train(recipe: Recipe, target_loaded, corpus: Corpus, out_dir, *, steps: int = 1000, lr: float = 1e-3,
          batch: int = 8, seed: int = 0, checkpoint_every: int = 100, resume: bool = False,
          progress: bool = True, held_out: int = 20, window: int = 384, eval_prompts: int | None = None,
          eval_k: int = 4, eval_tokens: int = 64, stop_after: int | None = None,
          max_seconds: float | None = None, log: Callable[[str], None] | None = None,
          note: dict | None = None) -> dict:
    """Train `recipe` on `corpus`; write <out_dir>/<kind>.safetensors and .md. Returns the card.

    stop_after: end (with a checkpoint, no saved drafter) after this step; for tests of resume.
    note: extra card entries shown first (e.g. the command that reproduces the run).
    max_seconds: a time cap for this call's training; when it is reached the drafter is
        evaluated and saved as it is (the card says so) and --resume can finish the schedule.
    """
    from tqdm.auto import tqdm

    check_positive(steps=steps, batch=batch, checkpoint_every=checkpoint_every, window=window)
    if not 0 < lr < 1:
        raise SpecvizError(f"learning rate must be in (0, 1), got {lr}")
    say = log or (lambda m: None)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_c, held_c = corpus.split(held_out)
    if not train_c.sequences:
        raise SpecvizError("no training sequences left after holding out prompts: build more data")

    torch.manual_seed(seed)
    module = recipe.build(target_loaded, train_c)
    start, history, seconds = 0, [], 0.0
    ckpt_path = out / CHECKPOINT
    ckpt = None
    if resume:
        if ckpt_path.is_file():
            ckpt = torch.load(ckpt_path, weights_only=False)
            if ckpt["kind"] != recipe.kind:
                raise SpecvizError(f"{ckpt_path} is a {ckpt['kind']!r} checkpoint, not {recipe.kind!r}")
            if hasattr(recipe, "rebuild"):
                module = recipe.rebuild(ckpt["config"], ckpt["module"], target_loaded)
            else:
                module.load_state_dict(ckpt["module"])
            start, history, seconds = ckpt["step"], ckpt["history"], ckpt["seconds"]
            say(f"resuming from step {start} ({ckpt_path})")
        else:
            say(f"no checkpoint in {out}: starting from step 0")
    module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    if ckpt is not None:
        opt.load_state_dict(ckpt["optimizer"])
    warmup = max(1, min(50, steps // 10))

    bar = tqdm(total=steps, initial=start, desc=f"train {recipe.kind}", unit="step", disable=not progress)
    clock = time.perf_counter()
    running = None
    done = start
    for step in range(start, steps):
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, steps, lr, warmup)
        loss, metrics = recipe.loss(module, target_loaded, sample_batch(train_c, step, batch, seed, window))
        if not torch.isfinite(loss):
            raise SpecvizError(f"training diverged at step {step} (loss {loss.item()}): try a lower --lr")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        value = loss.item()
        history.append(round(value, 5))
        running = value if running is None else 0.95 * running + 0.05 * value
        bar.update(1)
        bar.set_postfix(loss=f"{running:.3f}", **{k: f"{v:.3f}" for k, v in metrics.items()})
        done = step + 1
        if done % checkpoint_every == 0 or done == steps or done == stop_after:
            seconds_now = seconds + time.perf_counter() - clock
            _save_checkpoint(ckpt_path, recipe, module, opt, done, history, seconds_now)
        if done == stop_after:
            bar.close()
            return {"stopped_at": done}
        if max_seconds is not None and time.perf_counter() - clock > max_seconds and done < steps:
            _save_checkpoint(ckpt_path, recipe, module, opt, done, history, seconds + time.perf_counter() - clock)
            say(f"time cap reached at step {done} of {steps}: saving what there is (--resume continues)")
            break
    else:
        done = steps
    bar.close()
    seconds += time.perf_counter() - clock
    module.eval()

    card = _evaluate(recipe, module, target_loaded, held_c, eval_prompts, eval_k, eval_tokens, batch, window, say)
    card = {
        **(note or {}),
        "target": f"{target_loaded.name} (fingerprint {_fp(target_loaded)[:12]})",
        "data": _describe(corpus, train_c, held_c),
        "training": {"steps": done if done == steps else f"{done} of {steps} (time cap)",
                     "batch": batch, "window": window, "lr": lr, "seed": seed,
                     "seconds": round(seconds, 1),
                     "train loss (mean of last 10%)": _tail_mean(history),
                     "train loss (first 10 steps)": _head_mean(history)},
        **card,
        "config": recipe.config(module),
    }
    from ..drafters.trained import save_drafter

    path = save_drafter(out / f"{recipe.kind}.safetensors", recipe.kind, module, recipe.config(module),
                        target_loaded, card)
    card["file"] = f"{path.name} ({path.stat().st_size / 1e6:.2f} MB, fp16)"
    path.with_suffix(".md").write_text(_card_text(recipe.kind, card))
    return card


def check_positive(**values) -> None:
    """SpecvizError unless every value is an int >= 1."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecvizError(f"{name.replace('_', ' ')} must be a positive integer, got {v}")


def _save_checkpoint(path, recipe, module, opt, step, history, seconds) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"kind": recipe.kind, "step": step, "config": recipe.config(module),
                "module": module.state_dict(), "optimizer": opt.state_dict(),
                "history": history, "seconds": seconds}, tmp)
    tmp.replace(path)  # atomic: a kill mid-save keeps the previous checkpoint


@torch.no_grad()
def _evaluate(recipe, module, target_loaded, held: Corpus, eval_prompts, k, tokens, batch, window, say) -> dict:
    """Held-out loss, then greedy alpha/tau through the engine on held-out prompts."""
    from ..engine import GenerationConfig, collect, speculative_generate

    if not held.sequences:
        return {"held-out": "none (no prompts held out)"}
    losses = []
    for i in range(0, len(held.sequences), batch):
        chunk = [crop(s, 0, window) for s in held.sequences[i:i + batch]]
        losses.append(recipe.loss(module, target_loaded, chunk)[0].item() * len(chunk))
    held_loss = sum(losses) / len(held.sequences)
    seqs = held.sequences[:eval_prompts] if eval_prompts else held.sequences
    cfg = GenerationConfig(max_new_tokens=tokens, k=k, eos_token_ids=target_loaded.eos_token_ids)
    drafted = accepted = emitted = steps = 0
    t0 = time.perf_counter()
    for s in seqs:
        prompt = s.ids[:max(1, s.response_start)].tolist()
        _, end = collect(speculative_generate(target_loaded.model, recipe.drafter(module, target_loaded), prompt, cfg))
        drafted, accepted = drafted + end.stats.drafted, accepted + end.stats.accepted
        emitted, steps = emitted + end.stats.tokens, steps + end.stats.steps
    alpha = accepted / drafted if drafted else 0.0
    tau = emitted / steps if steps else 0.0
    say(f"held-out: loss {held_loss:.3f}, alpha {alpha:.3f}, tau {tau:.2f} (k={k}, {len(seqs)} prompts)")
    return {"held-out": {"prompts": len(seqs), "loss": round(held_loss, 4),
                         f"alpha (greedy, k={k})": round(alpha, 4), f"tau (greedy, k={k})": round(tau, 3),
                         "max new tokens": tokens, "seconds": round(time.perf_counter() - t0, 1),
                         "measured with": "specviz.engine.speculative_generate"}}


def _describe(corpus: Corpus, train_c: Corpus, held_c: Corpus) -> dict:
    meta = corpus.meta
    variants = {}
    for s in corpus.sequences:
        variants[s.variant] = variants.get(s.variant, 0) + 1
    temperature = meta.get("settings", {}).get("temperature", "?")
    return {"source": f"self-distillation: the target's own responses to {meta.get('prompts', 'a prompt set')} "
                      f"(greedy, and sampled at T={temperature})",
            "sequences (train / held-out)": f"{len(train_c.sequences)} / {len(held_c.sequences)}",
            "responses per pass": ", ".join(f"{k} {v}" for k, v in sorted(variants.items())),
            "tokens (all / target-written)": f"{corpus.tokens} / {corpus.response_tokens}",
            "generation seconds": round(float(meta.get("seconds", 0.0)), 1)}


def _fp(target_loaded) -> str:
    from ..drafters.trained import fingerprint

    return fingerprint(target_loaded.model)


def _tail_mean(history: list[float]) -> float:
    tail = history[-max(1, len(history) // 10):]
    return round(sum(tail) / len(tail), 4) if tail else float("nan")


def _head_mean(history: list[float]) -> float:
    head = history[:10]
    return round(sum(head) / len(head), 4) if head else float("nan")


def _card_text(kind: str, card: dict) -> str:
    from ..drafters.trained import model_card

    return model_card(kind, card)
