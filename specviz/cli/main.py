"""`python -m specviz generate`: one prompt, speculative and baseline, coloured in the terminal."""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
from dataclasses import fields, replace

from .. import bench
from ..audit import command as audit_command
from ..matrix import command as matrix_command
from ..core.errors import SpecvizError
from ..engine.generate import VERIFICATIONS
from ..modeling import threads
from ..run.settings import BOUNDS, Settings
from ..run.spec import described
from ..serving import load_command
from ..train import command as train_command
from . import docs_tables, trace_command
from .terminal import print_coloured, print_summary


def add_generate_arguments(p: argparse.ArgumentParser) -> None:
    d = Settings(prompt="")  # the run's settings and their defaults, as the page's (run/settings.py)
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--target", default=d.target, help="model id or folder ('default': embedded SmolLM2-135M-Instruct)")
    p.add_argument("--drafter", default="pld", help=f"{described()} (default %(default)s)")
    p.add_argument("--suffix-memory", metavar="FILE", help="suffix decoding's earlier answers: read from FILE if it "
                   "exists, and this run's answer saved back to it (default: this process's only)")
    p.add_argument("--k", type=int, default=d.k, help=f"draft length, {BOUNDS['k'].said} (the starting length with "
                   "--dynamic-k; default %(default)s)")
    p.add_argument("--dynamic-k", action="store_true", help="choose each step's draft length (0..4k) from measured costs and acceptance")
    p.add_argument("--controller", metavar="NAME", default="",
                   help="size every draft by an engine's rule instead of --k / --dynamic-k: specviz, sglang-adaptive, "
                   "sglang-auto, llama-pmin, hf-heuristic, hf-confidence or fixed:K, with parameters as "
                   "'llama-pmin:p=0.8' (docs/cli.md, \"Draft-length controllers\")")
    p.add_argument("--draft-confidence", type=float, default=d.draft_confidence,
                   help="with --dynamic-k: stop a chain draft when the drafter's probability falls below this; a tree "
                   "drafter (greedy) keeps the nodes whose path probability reaches it, up to 4k")
    p.add_argument("--verification", choices=VERIFICATIONS, default=d.verification,
                   help="how a sampled chain draft is judged: token by token, or as a block (keeps more, same "
                   "distribution; docs/exactness.md); trees take the sibling walk (default %(default)s)")
    p.add_argument("--temperature", type=float, default=d.temperature,
                   help=f"{BOUNDS['temperature'].said}, 0 = greedy (default %(default)s)")
    p.add_argument("--top-k", type=int, default=d.top_k, help=f"{BOUNDS['top_k'].said}, 0 = off")
    p.add_argument("--top-p", type=float, default=d.top_p, help=f"{BOUNDS['top_p'].said}, 1 = off")
    p.add_argument("--repetition-penalty", type=float, default=d.repetition_penalty,
                   help=f"{BOUNDS['repetition_penalty'].said}, 1 = off")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="(default %(default)s)")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap the prompt in the chat template (default: when the model has one)")
    p.add_argument("--device", default=None, help="cuda, mps or cpu (default: the best available)")
    p.add_argument("--dtype", default="auto", help="auto, fp32, bf16 or fp16 (auto: fp32 on a CPU, bf16 on CUDA)")
    p.add_argument("--device-map", default=None, help="'auto' spreads a large model over devices (accelerate)")
    p.add_argument("--trust-remote-code", action="store_true", help="run model code from the Hub (off by default)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the target's decoder stack (Llama-layout models on a GPU; refused on a CPU, where it was measured slower)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of coloured text")
    p.add_argument("--no-baseline", action="store_true", help="skip the plain decoding run")
    p.add_argument("--trace", metavar="FILE", help="also save the whole run (every step's p and q, the timings, "
                   "the text) as JSON, to replay with 'python -m specviz replay FILE' or in the app")
    s = p.add_argument_group("a serving engine instead of a local model (scripts/serve-vllm.sh starts one)")
    s.add_argument("--server", metavar="URL", help="stream from this OpenAI-compatible server (vLLM, SGLang, "
                   "llama.cpp) and report its speculation fields, e.g. http://127.0.0.1:8000")
    s.add_argument("--baseline-server", metavar="URL", help="the same model served without speculation, for the speedup")
    s.add_argument("--model", help="the served model's name (default: the first the server lists)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specviz", description="See speculative decoding happen.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate_arguments(sub.add_parser("generate", help="run one prompt, speculative vs baseline"))
    bench.add_arguments(sub.add_parser("bench", help="benchmark drafters against the baseline and peers"))
    train_command.add_arguments(sub.add_parser("train", help="train a drafter (draft, medusa, eagle, block) for a target"))
    trace_command.add_arguments(sub.add_parser("replay", help="replay a saved trace (--trace FILE) with no model"))
    load_command.add_arguments(sub.add_parser("load", help="sweep concurrency on two servers, speculation on and off"))
    matrix_command.add_arguments(sub.add_parser("matrix", help="every model family x precision x drafter on tiny "
                                                "random models, against plain decoding"))
    audit_command.add_arguments(sub.add_parser("audit", help="is an engine's speculative sampling exact? many seeded "
                                               "short completions with and without speculation, compared"))
    docs_tables.add_arguments(sub.add_parser("docs", help="redraw the measured tables in README.md and docs/ from "
                                             "their committed results files"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate" and args.server:
            from ..serving import generate_command
            return generate_command.main(args)
        if args.command == "generate" and (args.baseline_server or args.model):
            raise SpecvizError("--baseline-server and --model go with --server")
        return {"generate": generate, "bench": bench.main, "train": train_command.main, "replay": trace_command.replay,
                "load": load_command.main, "matrix": matrix_command.main, "audit": audit_command.main,
                "docs": docs_tables.main}[args.command](args)
    except SpecvizError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def generate(args) -> int:
    from ..core.divergence import first_divergence, tie_tolerance
    from ..core.events import event_to_dict
    from ..modeling import models
    from ..run.prepare import on_stderr, prepare, run_here
    from ..run.race import Race, baseline
    from ..run.arms import parse_arm

    # The run's settings as the page's are read (run/settings.py), checked before any model loads. The chat
    # flag is not among them: None (the template where the model has one) is the page's True.
    s = Settings.from_controls(**{f.name: getattr(args, f.name) for f in fields(Settings) if f.name != "chat"})
    controller = _controller(args)
    arm, sampling, memory = parse_arm(s.drafter, s.config()), s.sampling, _suffix_memory(args.suffix_memory)
    # The steps the app takes too (run/prepare.py), run here, a load's progress on stderr.
    placed = dict(device=args.device, dtype=args.dtype, device_map=args.device_map, compile=args.compile)
    p = run_here(prepare(s, arm, models, chat=args.chat, memory=memory, placed=placed,
                         trust_remote_code=args.trust_remote_code), on_stderr())
    if controller:
        p = replace(p, cfg=replace(p.cfg, controller=controller))
    target, prompt, cfg, drafter = p.target, p.ids, p.cfg, p.drafter
    # Chosen now, after loading, from what the machine is doing as the run starts.
    print(f"specviz: {threads.for_run('batch')}", file=sys.stderr, flush=True)
    # The race the app runs (run/race.py), labelled as the app labels it ("prompt lookup" for pld): the summary,
    # the JSON and a saved trace alike; each token's text as the app shows it.
    arm = replace(arm, label=f"{arm.label}, {cfg.controller}" if cfg.controller else arm.label, cfg=cfg)
    race = Race(models, target, prompt, {"spec": arm} | ({} if args.no_baseline else {"base": baseline(cfg)}),
                {"spec": drafter})
    # The curve only where it is shown: --json and a trace keep it, the coloured text has no place for it.
    curve = run_here(race.warm(cfg, curve=bool(args.json or args.trace)))
    for _ in race.run():  # each turn's event lands in its run's trace
        pass
    traces = race.traces
    steps, end, base = traces["spec"].steps, traces["spec"].end, traces.get("base") and traces["base"].end
    if memory is not None:
        memory.save(args.suffix_memory)
    rec = trace_command.recording(args, target, cfg, traces["spec"], traces.get("base"), curve)
    if args.trace:
        trace_command.save(args.trace, rec)

    result = {
        "text": "".join(models.token_strings(target, _without_eos(target, end.token_ids))),  # whole characters
        "token_ids": list(end.token_ids),
        "prompt_tokens": len(prompt),
        "target": args.target,
        "config": {"k": cfg.k, "dynamic_k": cfg.dynamic_k, "controller": cfg.controller, "max_new_tokens": cfg.max_new_tokens, "verification": cfg.verification,
                   "tree_nodes_per_k": cfg.tree_nodes_per_k, "sampled_trees_up_to": cfg.sampled_trees_up_to,
                   "tree_drafting": cfg.tree_drafting, **sampling.__dict__},
        **trace_command.summary(rec),  # drafter (as asked for), label, stats, the speedup: what replay prints
        "steps": [event_to_dict(s) for s in steps],
    }
    if curve is not None:
        result["verify_cost"] = curve.to_dict()
    if base is not None:
        result["baseline"] |= {"text": "".join(models.token_strings(target, _without_eos(target, base.token_ids))),
                               "token_ids": list(base.token_ids)}
        if sampling.greedy:
            parted = first_divergence(steps, traces["base"].events, tie_tolerance(target.dtype))
            if parted is not None:
                result["divergence"] = {**parted.to_dict(), "sentence": parted.sentence()}
    if args.json:
        print(json.dumps(result))
    else:
        print_coloured(target, steps, sys.stdout, traces["spec"].labels)
        print_summary(result, sys.stdout)
    return 0


def _controller(args) -> str:
    """--controller as the reports spell it, checked before any model loads."""
    from ..engine import controller_names

    if not args.controller:
        return ""
    if args.dynamic_k:
        raise SpecvizError("--controller sizes every draft itself: leave out --dynamic-k (or use --controller specviz)")
    if args.drafter.strip().lower() == "none":
        raise SpecvizError("--controller sizes drafts, and drafter 'none' drafts nothing: choose a drafter")
    return controller_names.canonical(args.controller)


def _suffix_memory(path: str | None):
    """The memory `--suffix-memory FILE` names: the file's, or a new one when it does not exist yet."""
    from ..drafters.suffix_memory import SuffixMemory

    if not path:
        return None
    return SuffixMemory.load(path) if pathlib.Path(path).expanduser().exists() else SuffixMemory()


def _without_eos(target, ids) -> list[int]:
    """The output's ids without the end-of-turn token that stopped it: it ends the text, it is
    not part of it (token_ids keep it: the engine did emit it)."""
    ids = list(ids)
    return ids[:-1] if ids and ids[-1] in target.eos_token_ids else ids
