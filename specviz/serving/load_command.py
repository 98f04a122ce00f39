"""`python -m specviz load`: the multi-tenant sweep against two servers you run, speculation on
and off (scripts/serve-vllm.sh --spec ngram --port 8000, and --spec off --port 8001)."""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from ..core.errors import SpecvizError
from .load import LoadConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = LoadConfig(server="", baseline_server="")  # the defaults live there
    p.add_argument("--server", required=True, help="the server with speculation on, e.g. http://127.0.0.1:8000")
    p.add_argument("--baseline-server", required=True,
                   help="the same model with speculation off, e.g. http://127.0.0.1:8001")
    p.add_argument("--model", help="model name to ask for (default: what each server lists first at /v1/models)")
    p.add_argument("--concurrency", default=",".join(map(str, d.concurrency)),
                   help="comma-separated closed-loop levels, 1 to 256 (default: %(default)s)")
    p.add_argument("--requests", type=int, default=d.requests, help="requests per level and arm (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="(default: %(default)s)")
    p.add_argument("--max-minutes", type=float, default=d.max_minutes,
                   help="stop issuing after this long, finish what is in flight (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=d.warmup,
                   help="untimed requests per server first (default: %(default)s)")
    p.add_argument("--prompts", default=d.suite, help="bench suite name or JSONL path (default: %(default)s)")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=d.chat,
                   help="send chat completions (default) or raw completions")
    p.add_argument("--out", default="specviz-load", help="folder for load.json and load.html (default: %(default)s)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow servers not on this machine: the server is yours (a sweep floods it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def parse_levels(value: str) -> tuple[int, ...]:
    try:
        levels = {int(x) for x in value.split(",") if x.strip()}
    except ValueError:
        raise SpecvizError(f"--concurrency takes integers, e.g. 1,2,4,8,16; got {value!r}") from None
    return tuple(sorted(levels))


def config(args) -> LoadConfig:
    return LoadConfig(server=args.server, baseline_server=args.baseline_server,
                      concurrency=parse_levels(args.concurrency), requests=args.requests,
                      max_tokens=args.max_tokens, suite=args.prompts, model=args.model, chat=args.chat,
                      max_minutes=args.max_minutes, warmup=args.warmup, allow_remote=args.allow_remote).validate()


def same_model(cfg: LoadConfig) -> str:
    """Both servers' model; a sweep across two different models would compare the models."""
    from .client import server_model

    names = []
    for url in (cfg.server, cfg.baseline_server):
        try:
            names.append(server_model(url))
        except OSError as e:
            raise SpecvizError(f"cannot ask {url} which model it serves: {e}") from None
    if names[0] != names[1]:
        raise SpecvizError(f"the servers serve different models ({names[0]} and {names[1]}): run the same target "
                           "on both, or pass --model if they only name it differently")
    return names[0]


def main(args) -> int:
    from dataclasses import replace

    from . import load_report
    from .load import suite_prompts, sweep

    cfg = config(args)
    cfg = replace(cfg, prompts=suite_prompts(cfg.suite), model=cfg.model or same_model(cfg))
    os.makedirs(args.out, exist_ok=True)
    bar = _Progress(len(cfg.concurrency) * 2 * cfg.requests, args.no_progress)
    try:
        result = sweep(cfg, progress=bar.update)
    finally:
        bar.close()
    doc = load_report.document(result)
    if sys.argv[1:2] == ["load"]:  # run from the command line: record how, so the docs can say how to rerun it
        doc["config"]["command"] = "python -m specviz " + shlex.join(sys.argv[1:])
    paths = os.path.join(args.out, "load.json"), os.path.join(args.out, "load.html")
    load_report.write_json(doc, paths[0])
    load_report.write_html(doc, paths[1])
    print(load_report.table(doc))
    print(f"wrote {paths[0]} and {paths[1]}", file=sys.stderr)
    return 0


class _Progress:
    """A tqdm bar over every request (hidden off a terminal) and one line per finished level."""

    def __init__(self, total: int, disabled: bool):
        from tqdm.auto import tqdm

        self.tqdm = tqdm
        self.bar = tqdm(total=total, unit="req", file=sys.stderr, dynamic_ncols=True, desc="load",
                        disable=True if disabled else None)
        self.base = 0  # requests counted by the levels already finished

    def update(self, arm: str, concurrency: int, done: int, requests: int, stats) -> None:
        if stats is None:
            self.bar.set_postfix_str(f"{arm} c={concurrency}", refresh=False)
            self.bar.n = self.base + done
            self.bar.refresh()
            return
        self.base += requests  # a partial level's skipped requests are skipped, not pending
        self.bar.n = self.base
        alpha = f", alpha {stats.acceptance_rate:.2f}" if stats.acceptance_rate is not None else ""
        ttft = f"{stats.ttft_p50_s:.2f} s" if stats.ttft_p50_s is not None else "-"
        self.tqdm.write(f"concurrency {concurrency:>3} {arm:<11}: {stats.tokens_per_s:8.1f} tokens/s, "
                        f"TTFT p50 {ttft}, {stats.failed} failed{alpha}" + (" (partial)" if stats.partial else ""),
                        file=sys.stderr)

    def close(self) -> None:
        self.bar.close()
