"""`python -m specviz bench`: options, loading, the run, the reports."""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import sys
import time

from ..core.errors import SpecvizError
from ..core.sampling import Sampling
from ..engine.generate import K_MAX, TREE_NODES_PER_K_MAX, VERIFICATIONS
from ..modeling.forward import context_length
from ..modeling import kernels, packing
from ..modeling.threads import environment, for_run, load_average
from ..run import suites
from ..run.settings import BOUNDS, in_words
from ..run.spec import described
from . import controllers as bench_controllers
from .drafters import KINDS, make_drafters
from .peers import PEERS
from .runner import BenchConfig, run_benchmark

QUICK = dict(limit=1, max_new_tokens=32)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = BenchConfig()  # the defaults live there (and, through it, in GenerationConfig and Sampling)
    p.add_argument("--target", default="default", help="target model: 'default' (embedded SmolLM2-135M), "
                   "a folder or a Hub id (default: %(default)s)")
    p.add_argument("--drafters", default="pld", help=f"comma-separated: {described(KINDS)}; suffix decoding's memory "
                   "is carried across a series of requests (run/suites.py) (default: %(default)s)")
    p.add_argument("--k", default=",".join(map(str, d.ks)),
                   help=f"draft length (1 to {K_MAX}), or a comma-separated sweep, e.g. 2,4,8 (default: %(default)s)")
    p.add_argument("--tree-nodes-per-k", type=int, default=d.tree_nodes_per_k, metavar="N",
                   help="tree drafters (EAGLE, Medusa) propose N*k candidates a step at fixed k; 0: k, as a chain "
                   "would (default: %(default)s, as generate and the app)")
    p.add_argument("--sampled-trees-up-to", type=float, default=d.sampled_trees_up_to, metavar="T",
                   help="sampled runs draft trees up to this temperature and chains above; greedy runs always may "
                   "(default: %(default)s, as generate and the app)")
    p.add_argument("--verification", default=",".join(d.verifications), metavar="RULE[,RULE]",
                   help="how sampled chain drafts are judged, an arm per rule: token, block or token,block "
                   "(default: %(default)s)")
    p.add_argument("--dynamic-k", type=int, default=d.dynamic_k, metavar="START",
                   help="also run each drafter with dynamic k starting at START (0 = off)")
    p.add_argument("--draft-confidence", default="", metavar="C[,C...]",
                   help="with --dynamic-k: also a dynamic arm per threshold (chains stop below it, trees keep the "
                   "nodes whose path probability reaches it), e.g. 0.1,0.3")
    p.add_argument("--controllers", default="", metavar="NAME[,NAME...]",
                   help="also an arm per draft-length controller for each drafter (specviz, sglang-adaptive, "
                   "sglang-auto, llama-pmin, hf-heuristic, hf-confidence, fixed:K; 'all'), replayed on one draft record "
                   "per prompt, with the hindsight best")
    p.add_argument("--controllers-live", action="store_true",
                   help="with --controllers: also run each controller live, beside its replay")
    p.add_argument("--peers", default="", help=f"comma-separated transformers peers: {', '.join(PEERS)}")
    p.add_argument("--suite", default="default", help="built-in suite name or a JSONL path (default: %(default)s)")
    p.add_argument("--category", action="append", help="only this category (repeat or comma-separate)")
    p.add_argument("--limit", type=int, help="at most this many prompts per category")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens,
                   help="(default: %(default)s, shorter than generate's to keep a full run short)")
    p.add_argument("--repeats", type=int, default=d.repeats, help="interleaved repeats per prompt; medians are "
                   "reported (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="a smoke run: {limit} prompt per category, "
                   "{max_new_tokens} new tokens".format(**QUICK))
    p.add_argument("--temperature", type=float, default=d.sampling.temperature, help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=d.sampling.top_k, help="0 = off")
    p.add_argument("--top-p", type=float, default=d.sampling.top_p, help="1 = off")
    p.add_argument("--seed", type=int, default=d.sampling.seed)
    p.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N, mps (default: auto)")
    p.add_argument("--dtype", default="auto", help="auto, fp32, bf16, fp16 (default: auto: fp32 on a CPU, bf16 on CUDA)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the target's decoder stack for every specviz arm on a GPU (peers stay eager; refused on a CPU)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--json", metavar="PATH", help="write the full record as JSON")
    p.add_argument("--csv", metavar="PATH", help="write the summary rows as CSV")
    p.add_argument("--html", metavar="PATH", help="write a self-contained HTML report with charts")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    s = p.add_argument_group("a serving engine instead of local models (the server's config picks the drafter)")
    s.add_argument("--server", metavar="URL", help="an OpenAI-compatible server with speculation (vLLM, SGLang, llama.cpp)")
    s.add_argument("--baseline-server", metavar="URL", help="the same model served without speculation")
    s.add_argument("--model", help="the served model's name (default: the first the server lists)")


def split(value: str | list | None) -> list[str]:
    items = value if isinstance(value, list) else [value or ""]
    return [x.strip() for item in items for x in (item or "").split(",") if x.strip()]


def parse_ks(value: str) -> tuple[int, ...]:
    try:
        ks = tuple(dict.fromkeys(int(x) for x in split(value)))
    except ValueError:
        raise SpecvizError(f"--k takes integers, e.g. 4 or 2,4,8; got {value!r}") from None
    if not ks:
        raise SpecvizError(f"--k takes integers, e.g. 4 or 2,4,8; got {value!r}")
    for k in ks:  # before minutes of loading, in generate's and the app's sentence
        BOUNDS["k"].check(k, "k")
    return ks


def bench_config(args) -> BenchConfig:
    for name in ("repeats", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise SpecvizError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("temperature", "top_k", "top_p"):  # generate's and the app's ranges (run/settings.py)
        BOUNDS[name].check(getattr(args, name), in_words(name))
    sampling = Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed).validate()
    confidences = parse_confidences(args.draft_confidence)
    if confidences and args.dynamic_k < 1:
        raise SpecvizError("--draft-confidence needs --dynamic-k: the threshold sizes dynamic drafts")
    if not 0 <= args.tree_nodes_per_k <= TREE_NODES_PER_K_MAX:
        raise SpecvizError(f"--tree-nodes-per-k must be from 0 (= k) to {TREE_NODES_PER_K_MAX}")
    if not 0 <= args.sampled_trees_up_to < math.inf:
        raise SpecvizError("--sampled-trees-up-to must be a temperature >= 0")
    rules = tuple(dict.fromkeys(split(args.verification)))
    if not rules or set(rules) - set(VERIFICATIONS):
        raise SpecvizError(f"--verification takes {', '.join(VERIFICATIONS)} or a comma-separated list; got {args.verification!r}")
    return BenchConfig(max_new_tokens=args.max_new_tokens, ks=parse_ks(args.k), dynamic_k=max(0, args.dynamic_k),
                       verifications=rules,
                       confidences=confidences, sampling=sampling, repeats=args.repeats,
                       tree_nodes_per_k=args.tree_nodes_per_k, sampled_trees_up_to=args.sampled_trees_up_to)


def parse_confidences(text: str) -> tuple[float, ...]:
    """'0.1,0.3' -> (0.1, 0.3); each in (0, 1)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            c = float(part)
        except ValueError:
            raise SpecvizError(f"--draft-confidence takes numbers between 0 and 1, got {part!r}") from None
        if not 0 < c < 1:
            raise SpecvizError(f"--draft-confidence takes numbers between 0 and 1 (exclusive), got {part}")
        out.append(c)
    return tuple(dict.fromkeys(out))


def command_line() -> str:
    """How this run was started, for the reports (so anyone can run it again)."""
    argv = sys.argv[1:]
    if argv[:1] == ["bench"]:
        argv = argv[1:]
    # The environment variables that change what is measured ride along (SPECVIZ_THREADS: torch's threads).
    env = "".join(f"{name}={shlex.quote(os.environ[name])} " for name in ("SPECVIZ_THREADS",) if os.environ.get(name))
    return env + "python -m specviz bench " + " ".join(shlex.quote(a) for a in argv)


def main(args: argparse.Namespace) -> int:
    from ..modeling.models import load
    from ..run.prepare import on_stderr
    from . import html, report

    if args.quick:
        args.limit = args.limit or QUICK["limit"]
        args.max_new_tokens = min(args.max_new_tokens, QUICK["max_new_tokens"])
    if args.server:
        from ..serving import bench_server

        bar = _Progress(args.no_progress)
        prompts = suites.select(suites.load_suite(args.suite), split(args.category), args.limit)
        bar.start(2 * len(prompts) * args.repeats)
        try:
            return bench_server.main(args, prompts, progress=bar.step)
        finally:
            bar.close()
    if args.baseline_server or args.model:
        raise SpecvizError("--baseline-server and --model go with --server")
    drafter_names, peer_names = split(args.drafters), split(args.peers)
    if not drafter_names and not peer_names:
        raise SpecvizError("nothing to compare: give --drafters and/or --peers")
    cfg = bench_config(args)  # options are checked before minutes of loading
    wanted = bench_controllers.check(args.controllers, args.controllers_live)
    prompts = suites.select(suites.load_suite(args.suite), split(args.category), args.limit)

    # With --compile the warm-up runs compile before anything is timed.
    target = load(args.target, args.device, args.dtype, trust_remote_code=args.trust_remote_code,
                  compile=args.compile, progress=on_stderr())  # converting the embedded model takes minutes
    cfg = dataclasses.replace(cfg, eos_token_ids=target.eos_token_ids)

    drafters = make_drafters(drafter_names, target, args.trust_remote_code)
    encoded = fitting([(p, suites.encode(target.tokenizer, p)) for p in prompts], context_length(target.model))

    load_before = load_average()
    # Every idle core, chosen as the timed runs start (environment() records the count).
    print(f"bench: {for_run('batch')}", file=sys.stderr, flush=True)
    bar = _Progress(args.no_progress)
    try:
        result = run_benchmark(target.model, drafters, encoded, cfg, peer_names,
                               progress=bar.step, total=bar.start, before_prompt=threads_again(bar.say))
        if wanted:
            bar.say(f"bench: recording drafts for {len(wanted)} controllers")
            from ..engine.verify_cost import curve as measured

            controlled = bench_controllers.run(target, drafters, encoded, cfg, wanted, args.controllers_live,
                                               measured(target.model))
    finally:
        bar.close()

    from .summary import summarise

    config = {
        "command": command_line(),
        "target": args.target, "suite": args.suite, "categories": split(args.category) or None,
        "limit": args.limit, "drafters": drafter_names, "peers": peer_names, "ks": list(cfg.ks),
        "dynamic_k": cfg.dynamic_k, "controllers": wanted, "controllers_live": bool(args.controllers_live), "tree_nodes_per_k": cfg.tree_nodes_per_k, "sampled_trees_up_to": cfg.sampled_trees_up_to, "verifications": list(cfg.verifications), "confidences": list(cfg.confidences), "max_new_tokens": cfg.max_new_tokens, "repeats": cfg.repeats,
        "sampling": dataclasses.asdict(cfg.sampling), "greedy": cfg.greedy, "eos_token_ids": list(cfg.eos_token_ids),
        "prompt_tokens": result.prompt_tokens,
        "left_out": [p.id for p in prompts if p.id not in result.prompt_tokens],  # longer than the context
    }
    env = environment(target.device, target.dtype, load_before)
    from ..engine.verify_cost import curve

    verify = curve(target.model).to_dict()  # after the runs, never inside one (cached per model)
    env["kernels"] = packing.chosen(target.model)  # which kernel multiplied each shape at each row count
    verify |= wall(verify["bandwidth_bytes_per_s"]) if target.device.type == "cpu" else {}
    try:
        doc = report.document(result, summarise(result), config, env) | {"verify_cost": verify}
    except Exception:
        if args.json:  # never lose a long run to a slip in the arithmetic: keep the raw runs
            report.write_json(report.raw_document(result, config, env), args.json)
            print(f"wrote the raw runs to {args.json}", file=sys.stderr)
        raise
    if wanted:
        doc["controllers"] = controlled
    report.print_report(doc)
    if wanted:
        print("\n" + bench_controllers.table(controlled))
    if args.json:
        report.write_json(doc, args.json)
    if args.csv:
        report.write_csv(doc, args.csv)
    if args.html:
        html.write_html(doc, args.html)
    for path in filter(None, (args.json, args.csv, args.html)):
        print(f"wrote {path}", file=sys.stderr)
    return 0


def wall(pass_bytes_per_s: float) -> dict:
    """This machine's memory read bandwidth (measured now, after the runs) and the fraction of it a
    one-token pass reads its weights at: how near plain decoding runs to the memory wall."""
    read = kernels.bandwidth()
    return {"memory_bandwidth_bytes_per_s": read, "wall_fraction": pass_bytes_per_s / read if read else None}


def fitting(encoded: list, limit: int | None) -> list:
    """The prompts the model's context holds with room for a token; the others are named on stderr and
    left out (a suite written for 8k-token models must not end a bench on a 512-token one midway)."""
    if limit is None:
        return encoded
    kept = [(p, ids) for p, ids in encoded if len(ids) < limit]
    left = [f"{p.id} ({len(ids):,} tokens)" for p, ids in encoded if len(ids) >= limit]
    if not kept:
        raise SpecvizError(f"no prompt of the suite fits the model's context of {limit:,} tokens: "
                           "give a suite of shorter prompts (--suite FILE.jsonl)")
    if left:
        print(f"bench: left out {len(left)} prompt{'s' * (len(left) > 1)} longer than the model's context of "
              f"{limit:,} tokens: {', '.join(left)}", file=sys.stderr, flush=True)
    return kept


def threads_again(say, choose=for_run):
    """Before each prompt: torch's thread count again, from what the machine is doing then.
    A neighbour that starts mid-bench turns a 2-thread run into a crawl (docs/performance.md);
    re-choosing between prompts keeps every arm of one prompt on one count, so a prompt's ratios
    stay fair, and each run's count is in the JSON. Says so when the count changes."""
    import torch

    current = torch.get_num_threads()

    def before(prompt) -> None:
        nonlocal current
        line = choose("batch")
        if torch.get_num_threads() != current:
            current = torch.get_num_threads()
            say(f"bench: from prompt {prompt.id} on, {line}")
    return before


class _Progress:
    """Progress on stderr: a tqdm bar on a terminal; elsewhere (a log file, CI, a Space's logs)
    a plain line at most every `every` seconds and at the end, so a long run is never silent.
    Nothing when asked (--no-progress)."""

    every = 30.0

    def __init__(self, disabled: bool):
        from tqdm.auto import tqdm

        self.lines = not disabled and not _is_terminal(sys.stderr)
        self.bar = tqdm(total=0, unit="run", file=sys.stderr, disable=disabled or self.lines,
                        dynamic_ncols=True, desc="bench")
        self.total = self.done = 0
        self.t0 = self.last = time.perf_counter()

    def start(self, total: int) -> None:
        self.bar.reset(total=total)
        self.total, self.done = total, 0
        self.t0 = self.last = time.perf_counter()

    def step(self, label: str) -> None:
        self.bar.set_postfix_str(label[:40], refresh=False)
        self.bar.update(1)
        self.done += 1
        now = time.perf_counter()
        if self.lines and (now - self.last >= self.every or self.done == self.total):
            self.last = now
            print(progress_line(self.done, self.total, now - self.t0, label), file=sys.stderr, flush=True)

    def say(self, line: str) -> None:
        """A line on stderr that does not break the bar."""
        self.bar.write(line, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def progress_line(done: int, total: int, elapsed: float, label: str) -> str:
    """"bench: 12/84 runs (14%), 3:20 elapsed, about 20:00 left; last: eagle k=4 chat-03"."""
    def clock(s: float) -> str:
        s = int(round(s))
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"

    left = f", about {clock(elapsed * (total - done) / done)} left" if 0 < done < total else ""
    share = f" ({100 * done // total}%)" if total else ""
    return f"bench: {done}/{total or '?'} runs{share}, {clock(elapsed)} elapsed{left}; last: {label}"
