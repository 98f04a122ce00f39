"""`python -m specviz generate --server URL`: one prompt through a real serving engine.

The JSON has the local run's keys where they mean the same thing (text, stats.acceptance_rate,
stats.mean_accepted_length, stats.tokens_per_s, baseline, speedup) and a `server` block with
what only a server gives: its per-step and per-position acceptance, the streamed chunks and
the engine's raw fields. The terminal shows each chunk as one group: a chunk is one engine
step, and no engine says which of a step's drafts it rejected, so there are no per-token colours.
"""
from __future__ import annotations

import json
import os
import sys

from ..core.errors import SpecvizError
from ..run.settings import Settings
from . import client, prometheus, speed, state, steps
from .records import ServerRun
from .urls import check_url

GROUP = "\033[4;36m"  # underlined cyan: several tokens from one target pass
RESET = "\033[0m"


def check(args) -> None:
    """Sentences for the options a server run cannot honour (before anything is sent); what it sends is checked
    as a local run's is (run/settings.py), in the same sentences."""
    Settings.from_controls(prompt=args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           seed=args.seed)
    local_only = [flag for flag, on in (("--drafter", args.drafter != "pld"), ("--trace", args.trace),
                                        ("--dynamic-k", args.dynamic_k), ("--compile", args.compile),
                                        ("--device-map", args.device_map), ("--target", args.target != "default"))
                  if on]
    if local_only:
        verb = "applies" if len(local_only) == 1 else "apply"
        raise SpecvizError(f"{', '.join(local_only)} {verb} to local runs; with --server the server's own "
                           "configuration decides the model and the drafter (--model picks a served model)")
    check_url(args.server, "--server")
    if args.baseline_server:
        check_url(args.baseline_server, "--baseline-server")


def run(url: str, args, on_chunk=None, counters: bool = True) -> tuple[ServerRun, dict | None]:
    """One streamed request and (with `counters`) the change in the server-wide counters across it."""
    before = prometheus.read_spec_counters(url) if counters else None
    r = client.stream_completion(url, args.prompt, model=args.model, max_tokens=args.max_new_tokens,
                                 temperature=args.temperature, seed=args.seed, chat=args.chat is not False,
                                 on_chunk=on_chunk)
    after = prometheus.read_spec_counters(url) if before is not None else None
    delta = (after - before).to_dict() if after is not None else None
    return r, delta


def stats(r: ServerRun) -> dict:
    s = r.spec
    return {"tokens": r.tokens, "steps": s.steps if s else None, "drafted": s.drafted if s else 0,
            "accepted": s.accepted if s else 0, "acceptance_rate": s.acceptance_rate if s else None,
            "mean_accepted_length": s.mean_accepted_length if s else None, "tokens_per_s": r.tokens_per_s,
            "decode_tokens_per_s": r.decode_tokens_per_s, "prompt_cache": r.prompt_cache,
            "ttft_s": r.ttft_s, "inter_token_s": r.inter_token_s, "elapsed_s": r.elapsed_s}


def result(args, spec: ServerRun, delta: dict | None, base: ServerRun | None) -> dict:
    s = spec.spec
    out = {
        "text": spec.text, "prompt_tokens": spec.prompt_tokens, "target": spec.model, "drafter": "server",
        "config": {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "seed": args.seed,
                   "chat": args.chat is not False},
        "stats": stats(spec),
        "server": {
            "url": spec.url, "model": spec.model, "engine": s.engine if s else spec.engine,
            "finish_reason": spec.finish_reason, "error": spec.error,
            "per_step_accepted": list(s.per_step_accepted) if s and s.per_step_accepted is not None else None,
            "per_step_drafted": list(s.per_step_drafted) if s and s.per_step_drafted is not None else None,
            "per_position_acceptance": (s.per_position_acceptance if s and s.per_step_accepted is not None
                                        else (delta or {}).get("per_position_acceptance")),
            "acceptance_histogram": list(s.histogram) if s and s.histogram is not None else None,
            "chunks": [{"t": c.t, "text": c.text, "tokens": c.tokens} for c in spec.chunks],
            "raw": spec.raw_metrics, "metrics_delta": delta, "steps_from": steps.steps(spec)[1],
        },
    }
    if base is not None:
        out["baseline"] = {"text": base.text, "tokens_per_s": base.tokens_per_s, "stats": stats(base),
                           "server": {"url": base.url, "model": base.model, "error": base.error}}
        c = speed.compare(spec, base)
        out |= {"speedup": c.speedup, "speedup_basis": c.basis, "speedup_withheld": c.withheld,
                "prompt_caches": c.cache}
        if args.temperature == 0 and not spec.error and not base.error:
            out["identical_to_baseline"] = spec.text == base.text
    return out


def main(args) -> int:
    check(args)
    spec, delta = run(args.server, args)
    if spec.error and not spec.chunks:
        raise SpecvizError(spec.error)
    base = None
    if args.baseline_server:
        base, _ = run(args.baseline_server, args, counters=False)  # a plain server has no spec counters
        if base.error and not base.chunks:
            raise SpecvizError(base.error)
    out = result(args, spec, delta, base)
    found = None
    if spec.spec is None or not spec.spec.drafted or delta is None:
        found = state.probe(args.server)
    out["server"]["state"] = state.explain(spec, found)
    out["server"]["metrics"] = found.metrics if found else "ok"
    if args.json:
        print(json.dumps(out))
    else:
        marked = print_groups(spec, sys.stdout)
        print_summary(out, sys.stdout, marked)
    return 1 if spec.error or (base is not None and base.error) else 0


def _tps(st: dict) -> str:
    if st.get("decode_tokens_per_s"):
        return f"{st['decode_tokens_per_s']:.1f} tokens/s decoding ({st['tokens_per_s']:.1f} end to end)"
    return f"{st['tokens_per_s']:.1f} tokens/s end to end"


def print_groups(r: ServerRun, out) -> bool:
    """The text with each step that made several tokens marked; True when there was one (then
    the summary explains the marks, and only then)."""
    colour = out.isatty() and "NO_COLOR" not in os.environ
    groups, found = steps.steps(r)
    marked = False
    for g in groups:
        # a llama.cpp step that drafted nothing is one token, even when a held-back UTF-8 piece
        # made its chunk carry two
        several = bool(g.kept) if found == steps.COUNTERS else (g.tokens or 0) > 1
        marked = marked or several
        if several:
            out.write(f"{GROUP}{g.text}{RESET}" if colour else f"⟨{g.text}⟩")
        else:
            out.write(g.text)
    out.write("\n\n")
    return marked


def print_summary(r: dict, out, marked: bool = True) -> None:
    st, sv = r["stats"], r["server"]
    if sv["error"]:
        out.write(f"stopped early: {sv['error']}\n")
    line = f"server {sv['url']} ({sv['engine'] or 'no speculation fields'}): {st['tokens']} tokens"
    if st["acceptance_rate"] is not None:
        line += (f", {st['steps']} steps that drafted; alpha {st['acceptance_rate']:.2f}, "
                 f"tau {st['mean_accepted_length'] or float('nan'):.2f}")
    out.write(line + f", {_tps(st)}, first token after {1000 * (st['ttft_s'] or 0):.0f} ms\n")
    if sv.get("state"):
        out.write(sv["state"] + "\n")
    elif sv.get("metrics") == "off":
        out.write(f"{sv['url']}/metrics is off, so there are no server-wide counters"
                  + (": start llama-server with --metrics\n" if sv["engine"] == "llama.cpp" else "\n"))
    if sv["per_position_acceptance"]:
        out.write("acceptance by draft position: " +
                  " ".join(f"{i + 1}:{a:.2f}" for i, a in enumerate(sv["per_position_acceptance"])) + "\n")
    if "baseline" in r:
        b = r["baseline"]
        line = f"baseline {b['server']['url']}: {b['stats']['tokens']} tokens, {_tps(b['stats'])}; "
        if r["speedup"] is not None:
            line += f"speedup {r['speedup']:.2f}x ({speed.SAID[r['speedup_basis']]})"
        else:
            line += f"no speedup: {r['speedup_withheld'] or 'the baseline gave no rate'}"
        out.write(line + "\n")
        if r["prompt_caches"]:
            out.write(r["prompt_caches"] + "\n")
        if "identical_to_baseline" in r:
            out.write(f"greedy text identical to the baseline server's: {'yes' if r['identical_to_baseline'] else 'no'}\n")
    if marked:  # the legend only when the text above shows a group
        rebuilt = (" (rebuilt from llama.cpp's running draft counters)" if sv.get("steps_from") == steps.COUNTERS
                   else "")
        out.write(f"groups: ⟨…⟩ (or underlined) = several tokens from one target pass{rebuilt} (kept drafts + its "
                  "own token); servers do not say which drafts they rejected\n")
