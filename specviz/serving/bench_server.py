"""`python -m specviz bench --server URL --baseline-server URL2`: the bench suite through a server.

One request at a time (the load sweep is where concurrency goes), the two servers taking turns
prompt by prompt and the order alternating, so drift on a shared machine hits both arms alike.
Per category: median tokens/s of each arm (decode-only where the engine reports it for every run,
as llama.cpp does, else end to end), their ratio, alpha and tau from the engine's own
per-request fields, and for greedy runs how many texts matched the plain server's.
"""
from __future__ import annotations

import json
import statistics
import sys

from ..core import metrics
from ..core.errors import SpecvizError
from ..modeling.chat import chat_messages
from . import client
from .records import ServerRun
from .urls import check_url


def run_suite(prompts, server: str, baseline: str, *, model: str | None, max_tokens: int, repeats: int,
              temperature: float, seed: int | None, send=client.stream_completion, progress=None) -> list[dict]:
    """Every prompt `repeats` times on both servers; one record per (prompt, repeat, arm)."""
    runs = []
    for i, p in enumerate(prompts):
        messages = chat_messages(p.messages)
        for rep in range(repeats):
            arms = [("spec", server), ("base", baseline)]
            if (i + rep) % 2:
                arms.reverse()
            for arm, url in arms:
                r: ServerRun = send(url, p.text, model=model, max_tokens=max_tokens, temperature=temperature,
                                    seed=seed, chat=p.chat, messages=messages if p.chat else None)
                if r.error and not r.chunks:
                    raise SpecvizError(f"prompt {p.id!r}: {r.error}")
                s = r.spec
                runs.append({"prompt": p.id, "category": p.category, "repeat": rep, "arm": arm, "text": r.text,
                             "tokens": r.tokens, "tokens_per_s": r.tokens_per_s, "ttft_s": r.ttft_s,
                             "decode_tokens_per_s": r.decode_tokens_per_s,
                             "drafted": s.drafted if s else 0, "accepted": s.accepted if s else 0,
                             "steps": (s.steps or 0) if s else 0, "error": r.error})
                if progress is not None:
                    progress(f"{p.id} {arm}")
    return runs


def summarise(runs: list[dict], greedy: bool) -> list[dict]:
    """One row per category and one for everything ('all')."""
    rows = []
    for category in sorted({r["category"] for r in runs}) + ["all"]:
        mine = [r for r in runs if category in ("all", r["category"])]
        spec = [r for r in mine if r["arm"] == "spec"]
        base = [r for r in mine if r["arm"] == "base"]
        # decode-only rates where the engine gives them for every run (llama.cpp), else end to end
        key = "decode_tokens_per_s" if all(r.get("decode_tokens_per_s") for r in mine) else "tokens_per_s"
        s_tps = statistics.median(r[key] for r in spec)
        b_tps = statistics.median(r[key] for r in base)
        drafted, accepted, steps = (sum(r[k] for r in spec) for k in ("drafted", "accepted", "steps"))
        row = {"category": category, "prompts": len({r["prompt"] for r in mine}), "spec_tokens_per_s": s_tps,
               "plain_tokens_per_s": b_tps, "speedup": s_tps / b_tps if b_tps else None,
               "rate": "decode" if key == "decode_tokens_per_s" else "end-to-end",
               "acceptance_rate": metrics.acceptance_rate(accepted, drafted) if drafted else None,
               "mean_accepted_length": metrics.mean_accepted_length(accepted + steps, steps) if steps else None}
        if greedy:
            pairs = {}
            for r in mine:
                pairs.setdefault((r["prompt"], r["repeat"]), {})[r["arm"]] = r["text"]
            row["identical"] = f"{sum(p.get('spec') == p.get('base') for p in pairs.values())}/{len(pairs)}"
        rows.append(row)
    return rows


def print_table(rows: list[dict], out=sys.stdout) -> None:
    def f(x, spec):
        return "-" if x is None else format(x, spec)
    cols = ["category", "prompts", "plain tok/s", "spec tok/s", "speedup", "alpha", "tau"] + (
        ["identical"] if "identical" in rows[0] else [])
    out.write(" | ".join(cols) + "\n" + " | ".join("---" for _ in cols) + "\n")
    for r in rows:
        cells = [r["category"], str(r["prompts"]), f(r["plain_tokens_per_s"], ".1f"), f(r["spec_tokens_per_s"], ".1f"),
                 f(r["speedup"], ".2f") + "x", f(r["acceptance_rate"], ".2f"), f(r["mean_accepted_length"], ".2f")]
        if "identical" in r:
            cells.append(r["identical"])
        out.write(" | ".join(cells) + "\n")
    rates = {r["rate"] for r in rows}
    out.write("tokens/s: " + ("decode only, from the engines' own timings (prompt processing left out)"
                              if rates == {"decode"} else "end to end, request sent to stream closed "
                              "(prompt processing included)" if rates == {"end-to-end"} else
                              "decode only where every run gave it, else end to end") + "\n")


def main(args, prompts, progress=None) -> int:
    if not args.baseline_server:
        raise SpecvizError("--server needs --baseline-server: the same model served without speculation, "
                           "to measure what speculation buys (scripts/serve-vllm.sh --spec off --port 8001)")
    check_url(args.server, "--server"), check_url(args.baseline_server, "--baseline-server")
    if args.repeats < 1 or args.max_new_tokens < 1:
        raise SpecvizError("--repeats and --max-new-tokens must be at least 1")
    runs = run_suite(prompts, args.server, args.baseline_server, model=args.model,
                     max_tokens=args.max_new_tokens, repeats=args.repeats, temperature=args.temperature,
                     seed=args.seed, progress=progress)
    rows = summarise(runs, greedy=args.temperature == 0)
    print_table(rows)
    if args.json:
        doc = {"format": "specviz-bench-server", "version": 1, "server": args.server,
               "baseline_server": args.baseline_server, "model": args.model, "max_new_tokens": args.max_new_tokens,
               "repeats": args.repeats, "temperature": args.temperature, "summary": rows, "runs": runs}
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
