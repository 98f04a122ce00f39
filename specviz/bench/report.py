"""Writing the benchmark down: terminal tables, JSON, CSV.

The JSON document is the complete record (schema below); the CSV holds the summary rows
and the terminal shows the same rows, the time breakdown per phase and the cost ratios.

JSON schema "specviz.bench/1":
    schema, created, environment{python, platform, processor, cpus, load_average_before/after
                 (threads.environment), torch, transformers, threads, device, dtype}
    config{target, suite, categories, limit, drafters, peers, ks, dynamic_k, max_new_tokens,
           repeats, sampling{...}, greedy, eos_token_ids}
    summary[]   one row per arm and category (plus category "all"): SUMMARY_FIELDS
    prompts[]   one row per arm and prompt: tokens, seconds, tokens_per_s, speedup, ...,
                identical_to_baseline / common_prefix (greedy)
    phases[]    per arm: ms_per_step{draft_forward, draft_other, target_forward, other}, ms_per_token
    costs{}     per category (median over its prompts): forward_ms{n: ms}, verify_ratio{n: v(n)}
    drift{}     median/min/max of (baseline's in-run target step / measured one-token forward)
    runs[]      every run: prompt_id, category, arm, repeat, tokens, seconds, prefill, steps, ...
    prompt_costs{}  per prompt: forward_ms{n: ms of one target forward over n new tokens}
    verify_cost{}   the target's verify-cost curve (verify_cost.VerifyCurve.to_dict): sizes, seconds,
                 relative (T(m) / T(1)), weight_bytes, bandwidth_bytes_per_s, device, dtype; on a CPU
                 memory_bandwidth_bytes_per_s (kernels.bandwidth) and wall_fraction (the one-token pass's
                 bandwidth over it)
    environment.kernels[]  the kernels chosen for each weight shape (kernels.summary): entry, buckets,
                 paths, ms
"""
from __future__ import annotations

import csv
import datetime
import json
import sys

SCHEMA = "specviz.bench/1"
SUMMARY_FIELDS = (
    "arm", "engine", "drafter", "k", "dynamic", "category", "prompts", "tokens", "seconds", "tokens_per_s",
    "speedup", "decode_speedup", "alpha", "tau", "position_acceptance", "c", "v", "predicted",
    "predicted_closed_form", "efficiency", "candidates_per_step", "identical", "agree_on_common_prefix",
)
RUN_FIELDS = ("prompt_id", "category", "arm", "repeat", "tokens", "elapsed", "prefill", "steps", "drafted",
              "accepted", "candidates", "draft_time", "verify_time", "target_forward", "draft_forward", "stop_reason", "threads")


def raw_document(result, config: dict, env: dict) -> dict:
    """What was measured, before any arithmetic: the runs and each prompt's forward costs."""
    runs = [{f: getattr(r, f) for f in RUN_FIELDS} for r in result.records]
    for run, r in zip(runs, result.records):
        run["seconds"] = run.pop("elapsed")
        run["draft_lengths"] = {str(n): c for n, c in sorted(r.draft_lengths.items())}
        if r.kept_by_rule:  # sampled chain steps: what each verification rule keeps on them
            run["kept_by_rule"] = dict(r.kept_by_rule)
        if r.expected_by_rule:  # sampled steps: each rule's mean over the coins, summed, and over how many steps
            run["expected_by_rule"] = {rule: round(v, 6) for rule, v in r.expected_by_rule.items()}
            run["rule_steps"] = dict(r.rule_steps)
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": env,
        "config": config,
        "runs": runs,
        "prompt_costs": {pid: {"forward_ms": {str(n): 1e3 * t for n, t in sorted(secs.items())}}
                         for pid, secs in result.forward_seconds.items()},
    }


def document(result, summary: dict, config: dict, env: dict) -> dict:
    """The JSON-ready record of a benchmark run."""
    doc = raw_document(result, config, env)
    doc.update(
        summary=[{f: row.get(f) for f in SUMMARY_FIELDS} for row in summary["summary"]],
        prompts=summary["prompts"],
        phases=summary["phases"],
        costs={cat: {key: {str(n): v for n, v in table.items()} for key, table in c.items()}
               for cat, c in summary["costs"].items()},
        drift=summary["drift"],
    )
    return doc


def write_json(doc: dict, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def write_csv(doc: dict, path: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_FIELDS)
        w.writeheader()
        for row in doc["summary"]:
            row = dict(row)
            pos = row["position_acceptance"]
            row["position_acceptance"] = "" if pos is None else ";".join(_num(p, 3) for p in pos)
            w.writerow({k: "" if v is None else v for k, v in row.items()})


def _num(x, digits=2) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A plain text table, first column left-aligned, the rest right-aligned."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    def line(cells):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def summary_table(doc: dict) -> str:
    greedy = doc["config"]["greedy"]
    header = ["category / arm", "tok/s", "speedup", "dec.x", "alpha", "tau", "c", "v", "pred", "eff"]
    if greedy:
        header.append("same")
    rows = []
    for cat in dict.fromkeys(r["category"] for r in doc["summary"]):
        for r in (r for r in doc["summary"] if r["category"] == cat):
            row = [f"{cat} / {r['arm']}", _num(r["tokens_per_s"], 1), _num(r["speedup"]),
                   _num(r["decode_speedup"]), _num(r["alpha"]), _num(r["tau"]), _num(r["c"], 3),
                   _num(r["v"]), _num(r["predicted"]), _num(r["efficiency"])]
            if greedy:
                row.append("-" if r["identical"] is None else f"{r['identical']}/{r['prompts']}")
            rows.append(row)
    return table(header, rows)


def phase_table(doc: dict) -> str:
    header = ["arm (ms per step)", "draft fwd", "draft other", "target fwd", "other", "ms/token", "tok/step"]
    rows = []
    for p in doc["phases"]:
        s = p["ms_per_step"]
        rows.append([p["arm"], _num(s["draft_forward"]), _num(s["draft_other"]), _num(s["target_forward"]),
                     _num(s["other"]), _num(p["ms_per_token"]), _num(p["tokens"] / p["steps"])])
    return table(header, rows)


def cost_table(doc: dict) -> str:
    sizes = sorted({int(n) for c in doc["costs"].values() for n in c["forward_ms"]})
    header = ["category", "1 token (ms)"] + [f"v({n})" for n in sizes if n > 1]
    rows = [[cat, _num(c["forward_ms"]["1"], 1)] + [_num(c["verify_ratio"].get(str(n))) for n in sizes if n > 1]
            for cat, c in doc["costs"].items()]
    return table(header, rows)


def verify_table(cost: dict) -> str:
    """The verify-cost curve: one forward over m tokens, in ms and against one token."""
    rows = [[str(m), _num(1e3 * t, 1), f"{v:.2f}x", f"{m}x"]
            for m, t, v in zip(cost["sizes"], cost["seconds"], cost["relative"])]
    return table(["tokens in one pass", "ms", "vs one token", "if each cost a step"], rows)


def kernel_table(rows: list[dict]) -> str:
    """kernels.summary's rows: one line per weight shape, a column per row bucket."""
    buckets = rows[0]["buckets"]
    cells = [[r["entry"]] + [f"{p} {_num(ms, 2)}" if ms is not None else p for p, ms in zip(r["paths"], r["ms"])]
             for r in rows]
    return table(["weight (dtype, threads)"] + [f"{b} rows" for b in buckets], cells)


def print_report(doc: dict, out=None) -> None:
    out = out or sys.stdout
    c = doc["config"]
    mode = "greedy" if c["greedy"] else f"sampling (temperature {c['sampling']['temperature']})"
    print(f"specviz bench: {c['target']} on {doc['environment']['device']} ({doc['environment']['dtype']}), "
          f"{mode}, {c['max_new_tokens']} new tokens, {c['repeats']} repeat(s), suite {c['suite']}", file=out)
    print("\n" + summary_table(doc), file=out)
    print("\ntok/s: new tokens / seconds, prefill included; speedup: vs the baseline on the same prompts; "
          "dec.x: decode-only speedup;\nalpha: accepted/drafted (trees: along the branch the target followed); "
          "tau: tokens per target forward; c: drafting cost per candidate / one target forward;\n"
          "v: verify cost of k+1 tokens / 1 token; pred: speedup the cost model predicts; eff: dec.x / pred; same: prompts identical to the baseline", file=out)
    print("\nWhere a decode step's time goes\n" + phase_table(doc), file=out)
    print("\nTarget forward cost by new tokens (verify cost ratio v(n))\n" + cost_table(doc), file=out)
    if doc.get("verify_cost"):
        cost = doc["verify_cost"]
        print("\nWhy checking is cheap: one target forward over m tokens (fixed short context; ideal: flat)\n"
              + verify_table(cost), file=out)
        wall = ""
        if cost.get("wall_fraction"):
            wall = (f", {cost['wall_fraction']:.0%} of the {cost['memory_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s "
                    "this machine reads memory at")
        print(f"each pass reads {cost['weight_bytes'] / 1e6:.0f} MB of weights; a one-token pass reading them "
              f"once runs at {cost['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s{wall}", file=out)
    if doc["environment"].get("kernels"):
        print("\nKernels chosen on this CPU by timing them (path and ms of one multiply, by rows; @n: padded to n rows)\n"
              + kernel_table(doc["environment"]["kernels"]), file=out)
    d = doc["drift"]
    if d["median"] is not None:
        print(f"\nbaseline's in-run target step / measured one-token forward: median {d['median']:.2f} "
              f"(min {d['min']:.2f}, max {d['max']:.2f})", file=out)
        if d["max"] > 1.25 or abs(d["median"] - 1) > 0.1:
            print("warning: the machine's speed changed during the run (other processes? heat?); "
                  "speedups and efficiencies are unreliable: run again on a quiet machine", file=out)
