"""The CLI's side of trace files: `generate --trace FILE` saves the run, and
`python -m specviz replay FILE` prints it as `generate` printed it, with no model loaded.

    python -m specviz replay run.json               # the coloured text and the summary
    python -m specviz replay run.json --speed 1     # tokens appear at the pace they were made
    python -m specviz replay run.json --steps       # one line per speculative step
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict
from types import SimpleNamespace

from ..core.errors import SpecvizError
from ..traces import trace_file
from ..traces.trace_file import Recording, RunInfo
from .terminal import print_coloured, print_summary


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a trace saved by 'generate --trace FILE' or the app's 'Download trace'")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--speed", type=float, default=None,
                     help="print the tokens at this multiple of the speed they were made at (1 = as recorded; "
                          "default: all at once)")
    how.add_argument("--steps", action="store_true",
                     help="one line per speculative step: its drafts, kept or rejected, then the target's token")


def recording(args, target, cfg, spec, base, curve=None) -> Recording:
    """`generate`'s run (spec and base Traces, labelled, and the target's verify-cost curve on this machine)."""
    info = RunInfo(target=args.target, drafter=args.drafter, prompt=args.prompt, greedy=cfg.sampling.greedy,
                   config=asdict(cfg), source="cli", device=trace_file.describe_device(target.model))
    return Recording(info, spec, base, curve)


def save(path, rec: Recording) -> None:
    trace_file.save(path, rec)
    print(f"specviz: trace saved to {path}", file=sys.stderr)


def summary(rec: Recording) -> dict:
    """What terminal.print_summary reads and generate's --json holds, from a recording: generate's live runs or
    a saved one, so replay prints what generate printed."""
    spec = rec.spec.end.stats if rec.spec.end else rec.spec.stats()
    r = {"drafter": rec.info.drafter, "label": rec.spec.label, "stats": spec.to_dict()}
    if rec.base is not None and rec.base.end is not None:
        base = rec.base.end.stats
        r["baseline"] = {"stats": base.to_dict(), "tokens_per_s": base.tokens_per_s}
        r["speedup"] = spec.tokens_per_s / base.tokens_per_s if base.tokens_per_s else None
        if rec.info.greedy:
            r["identical_to_baseline"] = rec.spec.token_ids == rec.base.token_ids
    return r


def replay(args) -> int:
    if args.speed is not None and not (math.isfinite(args.speed) and args.speed > 0):
        raise SpecvizError(f"--speed must be a positive number, got {args.speed}")
    rec = trace_file.load(args.file)
    info, out = rec.info, sys.stdout
    where = f" on {info.device}" if info.device else ""
    print(f"specviz: replaying {info.target} with drafter {info.drafter}, recorded{where} "
          f"{info.created or '(no date)'}; speeds are that machine's", file=sys.stderr)
    eos = SimpleNamespace(eos_token_ids=tuple(_eos(info.config)))
    each = None
    if args.steps:
        def each(s):
            by = f" by {s.source}" if s.source else ""
            out.write(f"\nstep {s.step} ({len(s.draft)} drafted{by}, {s.accepted} kept): ")
    elif args.speed is not None:
        start = time.monotonic()

        def each(s):  # wait until the engine's clock, scaled, reaches this step
            out.flush()
            time.sleep(max(0.0, start + s.elapsed / args.speed - time.monotonic()))
    print_coloured(eos, rec.spec.steps, out, rec.spec.labels, each)
    print_summary(summary(rec), out)
    return 0


def _eos(config: dict) -> list[int]:
    ids = config.get("eos_token_ids", ())
    return [i for i in ids if isinstance(i, int)] if isinstance(ids, list) else []
