"""One training loop for every drafter family.

A Recipe says what to build and what to minimise; `train` does the rest: epochs of
seeded shuffled batches, AdamW with warm-up and cosine decay, a progress bar, atomic
checkpoints every N steps, `resume` from the last one, the held-out measurements
(evaluate.py: loss, teacher-forced top-1 by depth, alpha and tau through the real engine),
and the saved drafter with its model card.

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

from ..core.errors import SpecvizError
from .batches import sample_batch
from .card import describe_data, describe_recipe, describe_target, describe_training, save_with_card
from .config import Progress, TrainConfig
from .data import Corpus, Seq
from .evaluate import evaluate

CHECKPOINT = "checkpoint.pt"


class Recipe(Protocol):
    kind: str  # "draft" | "medusa" | "eagle"

    def build(self, target_loaded, corpus: Corpus) -> nn.Module: ...
    def config(self, module: nn.Module) -> dict: ...
    def loss(self, module: nn.Module, target_loaded, batch: list[Seq]) -> tuple[torch.Tensor, dict]: ...
    def drafter(self, module: nn.Module, target_loaded): ...
    def drafts(self, module: nn.Module, target_loaded, batch: list[Seq], depth: int) -> torch.Tensor: ...
    # Optional: rebuild(config, state_dict, target_loaded) -> nn.Module, used to resume
    # (else build() on the same corpus, then load_state_dict) and to start from a saved drafter.


def learning_rate(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train(recipe: Recipe, target_loaded, corpus: Corpus, out_dir, config: TrainConfig = TrainConfig(), *,
          resume: bool = False, init: str | pathlib.Path | None = None, progress: bool = True, stop_after: int | None = None,
          log: Callable[[str], None] | None = None, note: dict | None = None) -> dict:
    """Train `recipe` on `corpus`; write <out_dir>/<kind>.safetensors and .md. Returns the card.

    resume: continue from <out_dir>/checkpoint.pt (from step 0 when there is none).
    init: a saved drafter file (same kind, same target) whose weights step 0 starts from instead
    of new ones: fine-tuning on new data or with another recipe. A checkpoint to resume wins.
    stop_after: end (with a checkpoint, no saved drafter) after this step; for tests of resume.
    note: extra card entries shown first (e.g. the command that reproduces the run).
    """
    from tqdm.auto import tqdm

    cfg = config.check()
    if cfg.average_init and init is None:
        raise SpecvizError("averaging with the starting weights needs an init file to start from (--init)")
    say = log or (lambda m: None)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_c, held_c = corpus.split(cfg.held_out)
    if not train_c.sequences:
        raise SpecvizError("no training sequences left after holding out prompts: build more data")
    cfg = cfg.for_data(len(train_c.sequences))
    module, opt, state = _start(recipe, target_loaded, train_c, cfg, out / CHECKPOINT if resume else None, say,
                                init)

    bar = tqdm(total=cfg.steps, initial=state.step, desc=f"train {recipe.kind}", unit="step", disable=not progress)
    clock = time.perf_counter()
    running = None  # the loss, smoothed for the progress bar
    for step in range(state.step, cfg.steps):
        # The batch is a function of (seed, step): a resumed run sees what an unbroken one would.
        batch = sample_batch(train_c, step, cfg.batch, cfg.seed, cfg.window)
        torch.manual_seed(cfg.seed * 1_000_003 + step)  # so is any noise the recipe draws
        with torch.autocast(target_loaded.device.type, dtype=torch.bfloat16, enabled=cfg.autocast):
            loss, metrics = recipe.loss(module, target_loaded, batch)
        if not torch.isfinite(loss):
            raise SpecvizError(f"training diverged at step {step} (loss {loss.item()}): try a lower --lr")
        _update(opt, loss, learning_rate(step, cfg.steps, cfg.lr, cfg.warmup))
        value = loss.item()
        state.step = step + 1
        state.history.append(round(value, 5))
        running = value if running is None else 0.95 * running + 0.05 * value
        bar.update(1)
        bar.set_postfix(loss=f"{running:.3f}", **{k: f"{v:.3f}" for k, v in metrics.items()})
        # Checkpoint every so often, at the end, before a deliberate stop and at the time cap.
        elapsed = time.perf_counter() - clock
        capped = cfg.max_seconds is not None and elapsed > cfg.max_seconds and state.step < cfg.steps
        if state.step % cfg.checkpoint_every == 0 or state.step in (cfg.steps, stop_after) or capped:
            _save_checkpoint(out / CHECKPOINT, recipe, module, opt, state, state.seconds + elapsed)
        if state.step == stop_after:
            bar.close()
            return {"stopped_at": state.step}
        if capped:
            say(f"time cap reached at step {state.step} of {cfg.steps}: saving what there is (--resume continues)")
            break
    bar.close()
    state.seconds += time.perf_counter() - clock
    module.eval()
    if cfg.average_init:
        # The init again (read_drafter caches the file); quiet: its "starting from" line would mislead here.
        _average_with(module, _warm_start(recipe, init, target_loaded, lambda m: None), cfg.average_init)
        say(f"saved weights: {1 - cfg.average_init:g} x trained + {cfg.average_init:g} x {init}")

    card = {
        **(note or {}),
        "target": describe_target(target_loaded),
        "data": describe_data(corpus, train_c, held_c),
        "recipe": describe_recipe(recipe),
        "training": describe_training(cfg, state, len(train_c.sequences)),
        **evaluate(recipe, module, target_loaded, held_c, cfg, say),
        "config": recipe.config(module),
    }
    return save_with_card(recipe, module, target_loaded, card, out)


def _start(recipe, target_loaded, train_c: Corpus, cfg: TrainConfig, checkpoint: pathlib.Path | None, say,
           init: str | pathlib.Path | None = None):
    """The module (new, from the drafter file `init`, or as `checkpoint` left it), its AdamW
    optimiser, and the progress so far."""
    ckpt = _read_checkpoint(checkpoint, recipe, say) if checkpoint is not None else None
    if ckpt is not None and hasattr(recipe, "rebuild"):
        module = recipe.rebuild(ckpt["config"], ckpt["module"], target_loaded)
        if recipe.config(module) != ckpt["config"]:
            raise SpecvizError(f"{checkpoint} was made with other settings ({ckpt['config']}); resume it with "
                               "the flags it was started with, or start a new run in another --out")
    elif ckpt is None and init is not None:
        module = _warm_start(recipe, init, target_loaded, say)
    else:
        torch.manual_seed(cfg.seed)  # the initial weights
        module = recipe.build(target_loaded, train_c)
        if ckpt is not None:
            module.load_state_dict(ckpt["module"])
    module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    if ckpt is None:
        return module, opt, Progress()
    opt.load_state_dict(ckpt["optimizer"])
    return module, opt, Progress(ckpt["step"], ckpt["history"], ckpt["seconds"])


def _warm_start(recipe, path, target_loaded, say) -> nn.Module:
    """The drafter saved in `path`, as a module to train further."""
    from ..drafters.trained import check_target, read_drafter

    meta, state = read_drafter(path)
    if meta["kind"] != recipe.kind:
        raise SpecvizError(f"{path} holds a {meta['kind']!r} drafter: it cannot start a {recipe.kind!r} run")
    check_target(meta, target_loaded, path)
    if not hasattr(recipe, "rebuild"):
        raise SpecvizError(f"{recipe.kind!r} drafters cannot start from saved weights")
    say(f"starting from the weights in {path}")
    return recipe.rebuild(meta["config"], state, target_loaded)


def _average_with(module: nn.Module, start: nn.Module, share: float) -> None:
    """Set module's weights to (1 - share) * its own + share * start's (same recipe and layout)."""
    ref = start.state_dict()
    with torch.no_grad():
        for name, value in module.state_dict().items():
            other = ref.get(name)
            if other is None or other.shape != value.shape:
                raise SpecvizError(f"cannot average with the init: its {name!r} differs in shape or is missing")
            if value.is_floating_point():
                value.mul_(1 - share).add_(other.to(value.dtype), alpha=share)
            elif not torch.equal(value, other):
                raise SpecvizError(f"cannot average with the init: its {name!r} (not weights) differs")


def _update(opt, loss: torch.Tensor, lr: float) -> None:
    """One AdamW step on `loss` at learning rate `lr`, the gradient clipped to norm 1."""
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_([p for group in opt.param_groups for p in group["params"]], 1.0)
    opt.step()


def _read_checkpoint(path: pathlib.Path, recipe, say) -> dict | None:
    if not path.is_file():
        say(f"no checkpoint in {path.parent}: starting from step 0")
        return None
    ckpt = torch.load(path, weights_only=False)
    if ckpt["kind"] != recipe.kind:
        raise SpecvizError(f"{path} is a {ckpt['kind']!r} checkpoint, not {recipe.kind!r}")
    say(f"resuming from step {ckpt['step']} ({path})")
    return ckpt


def _save_checkpoint(path, recipe, module, opt, state: Progress, seconds: float) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"kind": recipe.kind, "step": state.step, "config": recipe.config(module),
                "module": module.state_dict(), "optimizer": opt.state_dict(),
                "history": state.history, "seconds": seconds}, tmp)
    tmp.replace(path)  # atomic: a kill mid-save keeps the previous checkpoint
