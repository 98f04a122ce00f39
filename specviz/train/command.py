"""`python -m specviz train {draft,medusa,eagle,block}`: build the data if needed, train, evaluate, save.

    python -m specviz train draft                       # embedded target, CPU, ~30 min data + training
    python -m specviz train medusa --target Qwen/Qwen2.5-0.5B-Instruct --device cuda --out my-medusa
    python -m specviz train eagle --resume --out my-eagle   # continue after a kill
    python -m specviz train eagle --init assets/drafters/smollm2-135m-instruct/eagle.safetensors  # fine-tune
    python -m specviz train eagle --data-only --data-tokens 3000000   # self-distillation data at scale
    python -m specviz train block --taps 2,15 --minutes 10 --resume   # a block drafter, in resumable chunks
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import pathlib
import re
import shlex
import sys
from collections import Counter

from ..core.errors import SpecvizError

KINDS = {"draft": ("specviz.train.draft", "DRAFT"), "medusa": ("specviz.train.medusa", "MEDUSA"),
         "eagle": ("specviz.train.eagle", "EAGLE"), "block": ("specviz.train.block", "BLOCK_RECIPE")}
DEFAULT_STEPS = {"draft": 1500, "medusa": 1500, "eagle": 1500, "block": 1500}
DEFAULT_SOURCES = "written,self:500,code:4000,docs:6000"
# Flags that set a field of the kind's recipe, for the kinds whose recipe has it (EAGLE's): flag -> field.
RECIPE_FIELDS = {"unroll": "unroll", "feature_loss": "reg", "mlp_width": "width", "head_layers": "depth",
                 "block": "block"}


def _number(kind, test, says: str):
    """An argparse type: `kind` of the text, refused with "`says`, got TEXT" unless test(value)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not test(value):  # `not test`: NaN fails every comparison
            raise argparse.ArgumentTypeError(f"{says}, got {text}")
        return value
    return parse


positive = _number(int, lambda n: n >= 1, "must be a positive integer")
positive_float = _number(float, lambda x: x > 0, "must be positive")


def taps_flag(spec: str) -> tuple[int, ...]:
    """--taps "2,15" -> (2, 15); their bound is checked once the target is loaded."""
    from .data import check_taps

    try:
        taps = tuple(int(x) for x in spec.split(","))
        check_taps(taps)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes decoder layer numbers separated by commas, e.g. 2,15; got {spec!r}") \
            from None
    except SpecvizError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return taps


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=sorted(KINDS), help="which drafter family to train")
    p.add_argument("--target", default="default", help="model id or folder ('default': embedded SmolLM2-135M-Instruct)")
    p.add_argument("--out", default=None, help="folder for <kind>.safetensors, <kind>.md and checkpoint.pt "
                   "(default: trained-drafters/<target>)")
    p.add_argument("--steps", type=positive, default=None, help="optimiser steps (default 1500)")
    p.add_argument("--epochs", type=positive_float, default=None,
                   help="passes over the training sequences instead of --steps (the schedule spans them)")
    p.add_argument("--unroll", type=positive, default=None,
                   help="eagle: drafting steps unrolled on its own features in training (default 4)")
    p.add_argument("--feature-loss", type=_number(float, lambda w: 0 <= w < 1e3, "must be a weight in [0, 1000)"),
                   default=None, metavar="WEIGHT",
                   help="eagle: weight of the feature regression beside the token loss (default 1; 0 trains on the "
                        "token loss alone, as EAGLE-3 does)")
    p.add_argument("--taps", type=taps_flag, default=None, metavar="LAYERS",
                   help="eagle: EAGLE-3's feature fusion: also read the inputs of these target layers, e.g. 2,15 "
                        "(a low and a middle one), fused with the final state by a learned projection; recorded "
                        "once beside the data. With --init from an unfused head it starts as that head; a fused "
                        "--init or --resume keeps its own")
    p.add_argument("--mlp-width", type=_number(int, lambda n: 1 <= n <= 1 << 16, "must be a number of units from 1 to "
                                                                                   "65536"), default=None, metavar="UNITS",
                   help="eagle: hidden units of the head's MLP (default: the target layer's, 1536 for the embedded "
                        "model). Growing an --init head adds units that start silent, so it starts as that head")
    p.add_argument("--head-layers", type=_number(int, lambda n: 1 <= n <= 16, "must be a number of layers from 1 to 16"),
                   default=None, metavar="N",
                   help="eagle: decoder layers in the head (default 1, the paper's). Deepening an --init head "
                        "adds layers that start silent, so it starts as that head; block: its layers (default 2)")
    p.add_argument("--block", type=_number(int, lambda n: 1 <= n <= 64, "must be a block size from 1 to 64"),
                   default=None, metavar="K",
                   help="block: the longest block it drafts in one pass (default 16, DFlash's); a run asking "
                        "for a longer draft is refused")
    p.add_argument("--average-init", type=_number(float, lambda w: 0 <= w < 1, "must be the init's share in [0, 1), "
                                                                                 "e.g. 0.5"), default=0.0, metavar="SHARE",
                   help="with --init: save SHARE x the --init weights + (1 - SHARE) x the trained ones, e.g. 0.5 "
                        "(a weight average: a fine-tune on a narrow slice forgets less; default 0 = off)")
    p.add_argument("--init", default=None, metavar="FILE",
                   help="start from a saved drafter of this kind and target instead of new weights, e.g. "
                        "assets/drafters/smollm2-135m-instruct/eagle.safetensors (fine-tuning)")
    p.add_argument("--batch", type=positive, default=16, help="sequences per step")
    p.add_argument("--lr", type=_number(float, lambda x: 0 < x < 1, "must be in (0, 1)"), default=2e-3,
                   help="peak learning rate (warm-up, then cosine decay)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from <out>/checkpoint.pt")
    p.add_argument("--checkpoint-every", type=positive, default=100, help="steps between checkpoints")
    p.add_argument("--device", default=None, help="cuda, mps or cpu (default: the best available)")
    p.add_argument("--dtype", default=None, help="the target's dtype (default: fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--minutes", type=positive_float, default=None,
                   help="time cap for training: evaluate and save what there is then (--resume finishes)")
    p.add_argument("--threads", type=positive, default=None, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--autocast", choices=("auto", "on", "off"), default="auto",
                   help="bf16 autocast for training's forward passes (auto: on for eagle, draft and block on CUDA, and "
                        "on a CPU with native bf16, where it measured 1.93x / 1.08x / 2.0x; medusa stays fp32)")
    data = p.add_argument_group("data (self-distillation from the target)")
    data.add_argument("--data", default=None, help="data folder (default: $SPECVIZ_CACHE/train/<target fingerprint>)")
    data.add_argument("--prompts", default=None, help="a JSONL prompt file to answer instead of the --sources pool")
    data.add_argument("--data-minutes", type=positive_float, default=None,
                      help="generate data for this long first (default: only when there is none, for 30 min)")
    data.add_argument("--data-tokens", type=positive, default=None,
                      help="build until the data holds this many target-written tokens (e.g. 3000000)")
    data.add_argument("--sources", default=DEFAULT_SOURCES,
                      help="prompt sources, NAME or NAME:COUNT (written: assets/train; self: user turns the "
                      "target writes; code: stdlib editing tasks; docs: summarising/rewriting doc text)")
    data.add_argument("--data-batch", type=positive, default=64,
                      help="sequences generated per forward (2-core CPU, bf16, sampled: 32 / 64 / 128 gave "
                           "~170 / ~205 / ~181 tok/s). Memory: a batch's KV cache holds batch x (longest "
                           "prompt + --max-new-tokens) positions per layer, ~2.5 GB for 64 x 866 on the "
                           "embedded target in fp32; lower it on a small machine")
    data.add_argument("--generate-dtype", choices=("auto", "fp32", "bf16"), default="auto",
                      help="precision of the copy that writes the responses (auto: on a CPU the target itself, "
                      "recording its states as it writes, 1.1-1.3x a bf16 copy writing + a teacher-forced pass "
                      "here; elsewhere bf16 when the target is fp32). The features and probabilities always come "
                      "from the target as loaded")
    data.add_argument("--data-only", action="store_true", help="build or extend the data, then stop")
    data.add_argument("--passes", type=positive, default=3, help="responses per prompt: 1 greedy, then sampled")
    data.add_argument("--max-new-tokens", type=positive, default=160, help="longest response generated per prompt")
    ev = p.add_argument_group("evaluation (held-out prompts, through the engine, greedy)")
    ev.add_argument("--held-out", type=positive, default=20, help="prompts kept out of training")
    ev.add_argument("--eval-k", type=positive, default=4, help="draft length for the held-out acceptance run")
    ev.add_argument("--eval-tokens", type=positive, default=64, help="new tokens per held-out prompt")


def recipe_for(kind: str):
    module, name = KINDS[kind]
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise SpecvizError(f"training {kind!r} drafters is not available in this install ({e})") from None


def use_autocast(choice: str, kind: str, device) -> bool:
    """--autocast: 'on'/'off' as given; 'auto' where it was measured faster (EAGLE, draft model) and
    the hardware has bf16 (CUDA, or a CPU with AMX / AVX512-BF16)."""
    if choice != "auto":
        return choice == "on"
    from ..modeling.packing import native_bf16

    return kind in ("eagle", "draft", "block") and (device.type == "cuda" or (device.type == "cpu" and native_bf16()))


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", pathlib.Path(name.rstrip("/\\")).name or name).strip("-") or "target"


def main(args) -> int:
    import torch

    from ..modeling import models
    from ..run.prepare import on_stderr
    from .config import TrainConfig
    from .data import check_taps, data_dir, load_data, record_taps

    sources = parse_sources(args.sources)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    steps = DEFAULT_STEPS[args.kind] if args.steps is None else args.steps
    out = pathlib.Path(args.out) if args.out else pathlib.Path("trained-drafters") / _slug(args.target)
    recipe = None if args.data_only else with_flags(recipe_for(args.kind), args)  # fail before the slow parts
    taps = starting_taps(args, out)
    if recipe is not None and taps:
        recipe = dataclasses.replace(recipe, taps=taps)
    target = models.load(args.target, args.device, args.dtype, progress=on_stderr())
    if taps:
        try:
            check_taps(taps, target.model.config.get_text_config().num_hidden_layers)
        except SpecvizError as e:
            raise SpecvizError(f"--taps: {e}") from None
    folder = pathlib.Path(args.data) if args.data else data_dir(target)
    if args.data_minutes is not None or args.data_tokens is not None or not any(folder.glob("shard-*.pt")):
        _build(args, target, folder, sources)
    if taps:
        record_taps(target, folder, taps, log=say)
    corpus = load_data(target, folder, taps=taps)
    say(f"data: {len(corpus.sequences)} sequences, {corpus.tokens} tokens "
        f"({corpus.response_tokens} written by the target)")
    if args.data_only:
        return 0
    config = TrainConfig(steps=steps, epochs=args.epochs, lr=args.lr, batch=args.batch, seed=args.seed,
                         checkpoint_every=args.checkpoint_every, held_out=args.held_out, eval_k=args.eval_k,
                         eval_tokens=args.eval_tokens, max_seconds=None if args.minutes is None else 60 * args.minutes,
                         autocast=use_autocast(args.autocast, args.kind, target.device),
                         average_init=args.average_init)
    from .loop import train

    train(recipe, target, corpus, out, config, resume=args.resume, init=args.init, log=say,
          note={"command": f"`{command_line(args, steps, taps)}`"})
    path = out / f"{args.kind}.safetensors"
    say(f"saved {path} and its model card; use it with --drafter {args.kind}:{path}")
    return 0


def with_flags(recipe, args):
    """The kind's recipe with the RECIPE_FIELDS flags given; a flag its recipe has no field for is refused."""
    given = {field: getattr(args, flag) for flag, field in RECIPE_FIELDS.items() if getattr(args, flag) is not None}
    for flag, field in RECIPE_FIELDS.items():
        if field in given and not hasattr(recipe, field):
            owner = "block" if flag == "block" else "eagle"
            raise SpecvizError(f"--{flag.replace('_', '-')} is for {owner}, not {args.kind}")
    return dataclasses.replace(recipe, **given)


def starting_taps(args, out: pathlib.Path) -> tuple[int, ...]:
    """The EAGLE-3 taps the run trains with: --taps, else those of the head it starts from (--init,
    or the checkpoint --resume continues); --init and --average-init are checked on the way,
    before the slow parts."""
    import torch

    taps = args.taps or ()
    if taps and not hasattr(recipe_for(args.kind), "taps"):
        raise SpecvizError(f"--taps is for eagle and block, not {args.kind}")
    if args.average_init and args.init is None:
        raise SpecvizError("--average-init averages with the weights a run started from: give them with --init FILE")
    if args.init is not None:  # a readable drafter file (train checks its kind and target)
        from ..drafters.trained import read_drafter

        try:
            init_config = read_drafter(args.init)[0]["config"]
        except SpecvizError as e:
            raise SpecvizError(f"--init: {e}") from None
        taps = _same_taps(taps, args.taps, init_config, f"--init {args.init}")
    if args.resume and not args.data_only and (out / "checkpoint.pt").is_file():
        taps = _same_taps(taps, args.taps, torch.load(out / "checkpoint.pt", weights_only=False)["config"],
                          f"the checkpoint in {out}", may_fuse=False)
    return taps


def _build(args, target, folder: pathlib.Path, sources: dict[str, int]) -> None:
    """Self-distillation data: the target answers the prompt pool (or --prompts) into `folder`."""
    from .data import build_data
    from .prompt_sources import gather

    minutes = args.data_minutes or (None if args.data_tokens else 30.0)
    say(f"building training data in {folder}" + (f" for up to {minutes:g} min" if minutes else "")
        + (f" until it holds {args.data_tokens:,} target-written tokens" if args.data_tokens else "")
        + " (the target answers the prompt pool; resumable)")
    writer = generation_model(target, args.generate_dtype)
    if args.prompts:
        prompts = args.prompts
    else:
        folder.mkdir(parents=True, exist_ok=True)
        prompts = gather(sources, args.seed, target_loaded=target, cache=folder, model=writer)
        counts = Counter(r["source"] for r in prompts)
        say(f"prompts: {len(prompts)} ({', '.join(f'{k} {v}' for k, v in counts.items())})")
    build_data(target, folder, prompts=prompts, passes=args.passes, max_new_tokens=args.max_new_tokens,
               batch=args.data_batch, budget_s=None if minutes is None else 60 * minutes,
               budget_tokens=args.data_tokens, seed=args.seed, generate_model=writer, log=say)


def command_line(args, steps: int, taps: tuple[int, ...]) -> str:
    """The command that trains this drafter again, for its model card: the flags that shape the weights."""
    from .data import taps_text

    shaping = [("--epochs", f"{args.epochs:g}") if args.epochs else ("--steps", steps),
               ("--unroll", args.unroll),
               ("--feature-loss", None if args.feature_loss is None else f"{args.feature_loss:g}"),
               ("--taps", taps_text(taps, ",") if taps else None),
               ("--mlp-width", args.mlp_width), ("--head-layers", args.head_layers), ("--block", args.block),
               ("--init", args.init),
               ("--average-init", f"{args.average_init:g}" if args.average_init else None),
               ("--batch", args.batch), ("--lr", args.lr), ("--seed", args.seed)]
    words = ["python", "-m", "specviz", "train", args.kind, "--target", args.target]
    return shlex.join(words + [str(w) for flag, value in shaping if value is not None for w in (flag, value)])


def _same_taps(taps: tuple[int, ...], flag: tuple[int, ...] | None, config: dict, where: str,
               may_fuse: bool = True) -> tuple[int, ...]:
    """The taps a run continues with: those of the head it starts from, unless --taps fuses an
    unfused one (`may_fuse`: a warm start, not a checkpoint, whose optimiser state would not
    fit). Anything else is refused here, before the slow parts."""
    from .data import taps_text

    have = tuple((config.get("hidden_layers") or ())[:-1])
    if flag is None or have == taps or (may_fuse and not have):
        return taps if flag is not None else have
    raise SpecvizError(f"{where} " + (f"fuses layers {taps_text(have)}" if have else "reads the final state alone")
                       + f": --taps {taps_text(flag, ',')} cannot change that")


def parse_sources(spec: str) -> dict[str, int]:
    """--sources "written,self:500,code:4000" -> {"written": 0, "self": 500, "code": 4000} (0: the whole set)."""
    from .prompt_sources import SOURCES

    out = {}
    for part in filter(None, (x.strip() for x in spec.split(","))):
        name, _, count = part.partition(":")
        if name not in SOURCES or (count and not (count.isdigit() and int(count) > 0)):
            raise SpecvizError(f"--sources: {part!r} is not NAME or NAME:COUNT with NAME one of {', '.join(SOURCES)}")
        if name != "written" and not count:
            raise SpecvizError(f"--sources: say how many prompts {name!r} should make, e.g. {name}:1000")
        out[name] = int(count or 0)
    if not out:
        raise SpecvizError("--sources names no prompt source")
    return out


def generation_model(target, dtype: str):
    """The model that writes the responses: a bf16 copy when asked (auto: when the target is
    fp32 and cannot record its states as it writes, see generate.write_and_force)."""
    import torch

    from .generate import bf16_copy, can_write_and_force

    if dtype == "bf16" or (dtype == "auto" and target.dtype == torch.float32 and not can_write_and_force(target.model)):
        return bf16_copy(target.model) if target.dtype != torch.bfloat16 else target.model
    return target.model


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
