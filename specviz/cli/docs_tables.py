"""`python -m specviz docs`: the measured tables in README.md and docs/*.md, drawn from the
results files committed beside them.

A table sits between two markers that name its results file and how to draw it:

    <!-- table: assets/serving/load-cpu.json load -->
    (generated: the table, then what was measured where, when and by which command)
    <!-- /table -->

Re-measuring is running the command the file records and committing the new file; this
command then redraws every table. tests/test_docs.py fails when a table differs from what
its file draws, so a table cannot go stale unnoticed.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

from ..core.errors import SpecvizError

ROOT = pathlib.Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!-- table: (?P<path>\S+) (?P<kind>[\w-]+) -->\n(?P<body>.*?)<!-- /table -->", re.S)
COMMAND = "python -m specviz docs"


def pages(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """The markdown a reader sees: the front page and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _x(v, digits=2) -> str:
    return "-" if v is None else f"{v:.{digits}f}x"


def _f(v, digits=2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _same(row: dict) -> str:
    return "-" if row.get("identical") is None else f"{row['identical']}/{row['prompts']}"


# --- the bench (schema specviz.bench/1) ---------------------------------------------------

def _arms(doc: dict, category: str = "all") -> list[dict]:
    return [r for r in doc["summary"] if r["category"] == category and r["arm"] != "baseline"]


# transformers' generate, as the bench's --peers name it
PEERS = {"hf": "transformers", "hf-pld": "transformers pld", "hf-assisted": "transformers assisted"}


def _best_per_drafter(rows: list[dict]) -> dict[str, dict]:
    """Each drafter's (or peer's) fastest arm among `rows`, in first-seen order."""
    best: dict[str, dict] = {}
    for r in rows:
        name = r["drafter"] if r["engine"] == "specviz" and r["drafter"] else PEERS.get(r["engine"], r["engine"])
        if name not in best or (r["speedup"] or 0) > (best[name]["speedup"] or 0):
            best[name] = r
    return best


def _baseline(doc: dict, category: str = "all") -> dict:
    return next(r for r in doc["summary"] if r["category"] == category and r["arm"] == "baseline")


def bench_headline(doc: dict) -> str:
    """Each drafter's best arm over the whole suite: the front page's table."""
    rows = [[name, f"`{r['arm']}`", _x(r["speedup"]), _f(r["tau"]), _same(r)]
            for name, r in _best_per_drafter(_arms(doc)).items()]
    base = _baseline(doc)
    rows.insert(0, ["plain decoding", f"{base['tokens_per_s']:.1f} tokens/s", "1.00x", "1.00", "-"])
    return _md(["drafter", "best arm", "speedup", "tau (tokens per target pass)", "same text as plain"], rows)


def bench_arms(doc: dict) -> str:
    """Every arm over the whole suite, with the cost model's view of it."""
    base = _baseline(doc)
    rows = [["baseline (plain decoding)", _f(base["tokens_per_s"], 1), "1.00x", "-", "-", "-", "-", "-"]]
    rows += [[f"`{r['arm']}`", _f(r["tokens_per_s"], 1), _x(r["speedup"]), _f(r["alpha"]), _f(r["tau"]),
              _f(r["c"], 3), _f(r["efficiency"]), _same(r)] for r in _arms(doc)]
    return _md(["arm", "tokens/s", "speedup", "alpha", "tau", "c", "efficiency", "identical"], rows)


def bench_rules(doc: dict) -> str:
    """Each arm beside the same drafter under block verification (bench --verification token,block):
    tau and speedup by rule, and the drafts each rule keeps on the very same steps (both arms' runs,
    every sampled chain step judged by both rules with its own draws)."""
    arms = {r["arm"]: r for r in _arms(doc)}
    rows = []
    for label, token in arms.items():
        block = arms.get(f"{label} block")
        if block is None:
            continue
        kept = {"token": 0, "block": 0}
        for run in doc["runs"]:
            if run["arm"] in (label, f"{label} block"):
                for rule in kept:
                    kept[rule] += run.get("kept_by_rule", {}).get(rule, 0)
        gain = f"{kept['token']} → {kept['block']} ({100 * (kept['block'] / kept['token'] - 1):+.1f}%)" if kept["token"] else "-"
        change = (f"{100 * (block['tau'] / token['tau'] - 1):+.1f}%" if token["tau"] and block["tau"] else "-")
        rows.append([f"`{label}`", _f(token["tau"]), _f(block["tau"]), change, _x(token["speedup"]),
                     _x(block["speedup"]), gain])
    return _md(["drafter", "tau token-wise", "tau block", "tau change", "speedup token-wise", "speedup block",
                "drafts kept on the same steps, token-wise → block"], rows)


def bench_rule_means(doc: dict) -> str:
    """Accepted length per step by rule on each arm's own sampled steps: every step judged by every
    rule that could judge it, each rule's mean over the draws (the step's draft and rows as they
    were; a tree's under the sibling walk, which is its ceiling), and what the steps' own draws
    kept under each chain rule."""
    rows = []
    for label in dict.fromkeys(r["arm"] for r in doc["runs"] if r.get("rule_steps")):
        runs = [r for r in doc["runs"] if r["arm"] == label]
        mean, steps, kept = {}, {}, {}
        for run in runs:
            for rule, v in run.get("expected_by_rule", {}).items():
                mean[rule] = mean.get(rule, 0.0) + v
                steps[rule] = steps.get(rule, 0) + run["rule_steps"][rule]
            for rule, n in run.get("kept_by_rule", {}).items():
                kept[rule] = kept.get(rule, 0) + n
        per = {rule: mean[rule] / steps[rule] for rule in mean if steps[rule]}
        tree = "walk" in per
        change = (f"{100 * (per['block'] / per['token'] - 1):+.1f}%" if per.get("token") and "block" in per else "-")
        realised = f"{kept['token']} → {kept['block']}" if {"token", "block"} <= set(kept) else "-"
        rows.append([f"`{label}`", "tree" if tree else "chain", str(max(steps.values(), default=0)),
                     _f(per.get("token"), 3), _f(per.get("block"), 3), change, _f(per.get("walk"), 3), realised])
    return _md(["arm", "draft", "sampled steps", "token-wise", "block", "block vs token-wise",
                "sibling walk (the ceiling)", "kept by the steps' own draws, token-wise → block"], rows)


def bench_tree_drafting(doc: dict) -> str:
    """Each tree drafter as drawn trees, chosen trees and chains (NAME@drawn, NAME@chosen, NAME@chain):
    drafts kept per sampled step, as the mean over each step's coins (drawn trees: recursive
    rejection given the tree drawn; chosen: the sibling walk; chains: the arm's rule) and as the
    steps' own draws kept them, tokens per target pass, and the mean against the drafter's chosen
    trees and chains."""
    shape = {"drawn": "drawn tree", "chosen": "chosen tree", "chain": "chain"}
    means, rows = {}, []
    for r in _arms(doc):
        name, _, rest = r["arm"].partition("@")
        how = rest.split()[0] if rest else ""
        runs = [run for run in doc["runs"] if run["arm"] == r["arm"]]
        rule = {"drawn": "drawn", "chosen": "walk"}.get(how, r["arm"].split()[-1] if r["arm"].endswith(" block") else "token")
        total = sum(run.get("expected_by_rule", {}).get(rule, 0.0) for run in runs)
        steps = sum(run.get("rule_steps", {}).get(rule, 0) for run in runs)
        mean = total / steps if steps else None
        means[name, how] = mean
        done = sum(run["steps"] for run in runs)
        rows.append((name, how, r, steps, mean, sum(run["accepted"] for run in runs) / done if done else None))

    def gain(name, how, other):
        a, b = means.get((name, how)), means.get((name, other))
        return f"{round(100 * (a / b - 1), 1) + 0.0:+.1f}%" if how == "drawn" and a and b else "-"  # never "-0.0%"

    return _md(["arm", "draft", "sampled steps", "kept per step (mean over the coins)", "kept per step (the draws)",
                "tokens per target pass", "drawn vs chosen", "drawn vs chain"],
               [[f"`{r['arm']}`", shape.get(how, how), str(steps), _f(mean, 3), _f(own, 3), _f(r["tau"]),
                 gain(name, how, "chosen"), gain(name, how, "chain")] for name, how, r, steps, mean, own in rows])


def bench_categories(doc: dict) -> str:
    """Per category, each drafter's best speedup; the fastest in bold."""
    cats = list(dict.fromkeys(r["category"] for r in doc["summary"]))
    cats = [c for c in cats if c != "all"] + ["all"]
    names = list(_best_per_drafter(_arms(doc)))
    rows = []
    for cat in cats:
        best = _best_per_drafter(_arms(doc, cat))
        top = max((b["speedup"] or 0 for b in best.values()), default=0)
        cells = [(f"**{_x(best[n]['speedup'])}**" if best[n]["speedup"] == top else _x(best[n]["speedup"]))
                 if n in best else "-" for n in names]
        rows.append([cat, _f(_baseline(doc, cat)["tokens_per_s"], 1), *cells])
    return _md(["category", "plain tokens/s", *names], rows)


def bench_verify(doc: dict) -> str:
    """What one target forward over n new tokens costs, per category: v(n) = t(n) / t(1)."""
    sizes = sorted({int(n) for c in doc["costs"].values() for n in c["forward_ms"]} - {1})
    rows = [[cat, _f(c["forward_ms"]["1"], 1), *(_f(c["verify_ratio"].get(str(n))) for n in sizes)]
            for cat, c in doc["costs"].items()]
    return _md(["category", "1 token (ms)", *(f"v({n})" for n in sizes)], rows)


def bench_kernels(doc: dict) -> str:
    """The kernel each weight shape took at each row count (environment.kernels), ms a multiply, then how
    near the one-token pass ran to this machine's memory wall (verify_cost)."""
    rows = doc["environment"].get("kernels") or []
    if not rows:
        return "No kernel table in this file (every weight kept F.linear, or it predates the table)."
    buckets = rows[0]["buckets"]
    body = _md(["weight, dtype, threads", *(f"{b} row{'s' * (b > 1)}" for b in buckets)],
               [[r["entry"], *(f"{p} {_f(ms, 3)}" for p, ms in zip(r["paths"], r["ms"]))] for r in rows])
    cost = doc.get("verify_cost") or {}
    if cost.get("wall_fraction"):
        body += (f"\n\nA one-token pass read its {cost['weight_bytes'] / 1e6:.0f} MB of weights at "
                 f"{cost['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s: {cost['wall_fraction']:.0%} of the "
                 f"{cost['memory_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s this machine read memory at; verifying "
                 + ", ".join(f"{m} tokens cost {v:.2f}x" for m, v in zip(cost["sizes"], cost["relative"]) if m in (2, 4, 8, 16))
                 + " one.")
    return body


def bench_caption(doc: dict, path: str) -> str:
    env, cfg = doc["environment"], doc["config"]
    load = env.get("load_average_before")
    where = ", ".join(filter(None, [
        f"{env.get('cpu') or env['processor']}, {env['cpus']} CPUs" + (f" (load {load:.1f} before)" if load is not None else ""),
        f"{env['device']}, {env['dtype']}", f"{env['threads']} torch thread{'s' if env['threads'] != 1 else ''}",
        f"Python {env['python']}, torch {env['torch']}, transformers {env['transformers']}"]))
    how = f"`{cfg['command']}`" if cfg.get("command") else "the command is not recorded"
    return f"Measured {doc['created'][:10]} on {where}; {how}. Results: [`{path}`](/{path})."


# --- the load sweep (schema specviz-load) -------------------------------------------------

def load_table(doc: dict) -> str:
    ms = 1e3
    rows = []
    for lv in doc["levels"]:
        b, s = lv.get("baseline"), lv.get("speculative")
        if not (b and s):
            continue
        ratio = s["tokens_per_s"] / b["tokens_per_s"] if b["tokens_per_s"] else None
        rows.append([str(lv["concurrency"]), _f(b["tokens_per_s"], 1), _f(s["tokens_per_s"], 1), _f(ratio),
                     f"{_f(b['ttft_p50_s'])} / {_f(s['ttft_p50_s'])} s",
                     f"{_f(b['itl_p50_s'] * ms, 1)} / {_f(s['itl_p50_s'] * ms, 1)} ms",
                     _f(s["acceptance_rate"]), _f(s["mean_accepted_length"])])
    table = _md(["concurrency", "plain tokens/s", "speculative tokens/s", "ratio", "TTFT p50 plain / spec",
                 "inter-token p50 plain / spec", "alpha", "tau"], rows)
    lines = [table]
    if doc.get("crossover", {}).get("reason"):
        lines.append(f"\nCrossover: {doc['crossover']['reason']}.")
    policy = doc.get("policy") or {}
    if policy.get("rule"):
        lines.append(f"Policy \"{policy['rule']}\": {policy['mean_tokens_per_s']:.0f} tokens/s averaged over the "
                     f"levels, {100 * policy['gain_over_always_on']:+.1f}% over always on, "
                     f"{100 * policy['gain_over_always_off']:+.1f}% over always off.")
    return "\n".join(lines)


def load_caption(doc: dict, path: str) -> str:
    env, cfg = doc["environment"], doc["config"]
    load = env.get("load_average_before")
    where = f"{env['processor']}, {env['cpus']} CPUs" + (f" (load {load:.1f} before)" if load is not None else "")
    if cfg.get("command"):
        how = f"`{cfg['command']}`"
    else:  # sweeps written before the command was recorded: say what they ran
        how = (f"model {cfg['model']}, {cfg['requests']} requests per level and arm, {cfg['max_tokens']} tokens "
               f"each, prompts from the {cfg['suite']} suite")
    servers = cfg.get("servers")  # what the sweep's servers ran, where the file says
    on = (f" Servers: {servers['engine']}; speculative `{servers['speculative']}`, baseline `{servers['baseline']}`."
          if servers else "")
    return (f"Measured {doc['started'][:10]} on {where}, Python {env['python']}; {how}.{on} "
            f"Results: [`{path}`](/{path}).")


# --- llama.cpp and specviz on one prompt (schema specviz-engine-speed) ------------------------

def engine_speed_table(doc: dict) -> str:
    """Each engine's arms with its speedup over its own plain decoding."""
    rows = [[r["engine"], r["setting"], r["weights"], _f(r["tokens_per_s"], 1),
             " / ".join(f"{t:.1f}" for t in r["runs_tokens_per_s"]), _x(r["speedup"]), _f(r["alpha"]),
             _f(r["tau"]), r["identical"] or "-"] for r in doc["rows"]]
    return _md(["engine", "setting", "weights", "tokens/s (median)", "each run", "vs its own plain", "alpha", "tau",
                "same text as plain"], rows)


def engine_speed_caption(doc: dict, path: str) -> str:
    env, cfg = doc["environment"], doc["config"]
    load = env.get("load_average_before")
    where = f"{env['processor']}, {env['cpus']} CPUs" + (f" (load {load:.1f} before)" if load is not None else "")
    return (f"Measured {doc['created'][:10]} on {where}: the `{cfg['prompt']}` prompt, greedy, {cfg['max_new_tokens']} "
            f"new tokens, medians of {cfg['repeats']} interleaved runs, {cfg['threads']} thread per engine; "
            f"{cfg['llamacpp']}; specviz through `{cfg['specviz_bench']}`; `{cfg['command']}`. "
            f"Results: [`{path}`](/{path}).")


# --- the model matrix (schema specviz-matrix/1) -----------------------------------------------

MARKS = {"identical": "=", "near-tie": "≈", "differs": "✗", "refused": "-"}


def matrix_table(doc: dict) -> str:
    """Family x drafter; each cell one mark per precision (fp32 / bf16 / fp16), refusals' reasons below."""
    cells = {(c["family"], c["drafter"], c["dtype"]): c for c in doc["cells"]}
    reasons: list[str] = []
    rows = []
    for family in doc["families"]:
        row = [family]
        for drafter in doc["drafters"]:
            found = [cells.get((family, drafter, d)) for d in doc["dtypes"]]
            marks = " ".join(MARKS[c["outcome"]] if c else "?" for c in found)
            refused = [c["detail"] for c in found if c and c["outcome"] == "refused"]
            if refused:
                why = refused[0].split(":")[0]
                reasons += [why] if why not in reasons else []
                marks += f" ({reasons.index(why) + 1})"
            row.append(marks)
        rows.append(row)
    legend = (f"Each cell: {' / '.join(doc['dtypes'])}. `=` identical to plain decoding; `≈` parted at a near-tie "
              "within the precision's rounding (docs/exactness.md); `✗` differs beyond it (a bug); `-` refused "
              "before the run" + (":" if reasons else " (none was)."))
    notes = [f"({i}) {r}." for i, r in enumerate(reasons, 1)]
    return "\n".join([_md(["family", *doc["drafters"]], rows), "", legend, *notes])


def matrix_caption(doc: dict, path: str) -> str:
    env, s = doc["environment"], doc["settings"]
    how = f"`{doc['config']['command']}`" if doc["config"].get("command") else "the command is not recorded"
    return (f"Measured {doc['created'][:10]} on {env['processor']}, {env['cpus']} CPUs, {env['device']}, "
            f"torch {env['torch']}, transformers {env['transformers']}: greedy, a {s['prompt_tokens']}-token prompt, "
            f"{s['max_new_tokens']} new tokens, k = {s['k']}, in {doc['seconds']:.0f} s; {how}. "
            f"Results: [`{path}`](/{path}).")


# --- the exactness audit (schema specviz-audit-set v1) ----------------------------------------

def audit_table(doc: dict) -> str:
    """One row per engine and setting: the verdict with the power beside it; then, for each that
    failed, its commonest outcomes side by side."""
    rows, failed = [], []
    for a in doc["audits"]:
        for r in a["results"]:
            c = r["comparison"]
            name = f"{a['name']} (must fail)" if a["control"] else a["name"]
            word = "**NOT exact**" if r["verdict"] == "NOT exact" else r["verdict"]
            rows.append([name, r["setting"], str(c["draws"][0]), f"{r['drafted']} / {r['refused']}", f"{c['p']:.2g}",
                         f"{c['tv']:.3f} ({c['tv_interval'][0]:.3f}-{c['tv_interval'][1]:.3f}; floor {c['tv_floor']:.3f})",
                         f"{c['detectable_tv']:.3f}", word])
            if r["verdict"] == "NOT exact":
                failed.append((name, r))
    lines = [_md(["engine", "setting", "draws each way", "drafted / refused", "p (all tests)",
                  "TV (95% interval; one sampler twice)", "catches TV >= (80%)", "verdict"], rows)]
    for name, r in failed:
        depth = r["comparison"]["depth"]
        what = (f"the first {depth} tokens" if depth > 1 else
                "whole completions (the server sent several tokens per chunk)")
        lines += ["", f"{name}, {r['setting']}: {what}, speculative against plain:",
                  "", _md(["first tokens", "speculative", "plain"],
                          [[o["outcome"] if o["outcome"].startswith("(") else f"`{_cell(o['outcome'])}`",
                            str(o["speculative"]), str(o["plain"])] for o in r["outcomes"][:8]])]
    return "\n".join(lines)


def _cell(text: str) -> str:
    """Text for a markdown table's cell: a bare | would end the cell (<|im_end|>), a newline the row."""
    return text.replace("|", "\\|").replace("\n", "\\n")


def audit_caption(doc: dict, path: str) -> str:
    v = doc["versions"]
    load = doc.get("load_average_before")
    served = {a["audited"].get("engine"): a["audited"] for a in doc["audits"]}
    llamacpp, vllm = served.get("llama.cpp"), served.get("vLLM")
    servers = "".join([
        f" llama.cpp: llama-server built from PyPI's {llamacpp['built_from']} (its /props says "
        f"{llamacpp['server_version']}), {llamacpp['threads']} thread, on {llamacpp['model']} both ways, the "
        f"flags in the file." if llamacpp else "",
        f" vLLM {vllm['server_version']}: {vllm['model']} both ways, k = {vllm['k']}." if vllm else ""])
    return (f"Measured {doc['date']} on {doc['processor']} (load {load:.1f} before), {doc['threads']} torch thread, "
            f"Python {v['python']}, torch {v['torch']}, transformers {v['transformers']}: the embedded "
            f"SmolLM2-135M, the audit's repeated question, {doc['draws']} seeded draws each way of 3 tokens, "
            f"temperature {doc['temperature']:g}; {', then '.join(f'`{c}`' for c in doc.get('commands') or [doc['command']])}. "
            f"Results: [`{path}`](/{path}).{servers}{' Amended ' + doc['amended'] + '.' if doc.get('amended') else ''}")


# The bench file's tables, by the kind after "bench-": one run, so one caption serves them all.
BENCH = {"headline": bench_headline, "arms": bench_arms, "categories": bench_categories, "rules": bench_rules,
         "rule-means": bench_rule_means, "tree-drafting": bench_tree_drafting, "verify": bench_verify,
         "kernels": bench_kernels}
KINDS = {
    **{f"bench-{kind}": (table, bench_caption) for kind, table in BENCH.items()},
    "load": (load_table, load_caption),
    "engine-speed": (engine_speed_table, engine_speed_caption),
    "matrix": (matrix_table, matrix_caption),
    "audit": (audit_table, audit_caption),
}


def render(path: str, kind: str, root: pathlib.Path = ROOT) -> str:
    """The text between a table's markers: the table, a blank line, then its caption."""
    if kind not in KINDS:
        raise SpecvizError(f"unknown table kind {kind!r} (known: {', '.join(KINDS)})")
    if not (root / path).exists():  # named before it is measured: the page says so, honestly, until it is
        return (f"Not measured for this version yet: the command under [Re-measuring](/docs/performance.md#re-measuring) "
                f"writes `{path}`, and `{COMMAND}` draws this table from it.\n")
    try:
        doc = json.loads((root / path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise SpecvizError(f"results file {path} is not JSON: {e}") from None
    draw, caption = KINDS[kind]
    try:
        return f"{draw(doc)}\n\n{caption(doc, path)}\n"
    except (KeyError, TypeError, StopIteration) as e:
        raise SpecvizError(f"results file {path} cannot be drawn as {kind}: missing {e}") from None


def rewrite(text: str, root: pathlib.Path = ROOT) -> str:
    """`text` with every marked table drawn again from its results file."""
    def draw(m: re.Match) -> str:
        head = m.group(0)[: m.start("body") - m.start()]
        return f"{head}{render(m.group('path'), m.group('kind'), root)}<!-- /table -->"
    return MARKER.sub(draw, text)


def stale(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """The pages whose tables differ from what their results files draw."""
    return [p for p in pages(root) if p.exists() and rewrite(p.read_text(encoding="utf-8"), root)
            != p.read_text(encoding="utf-8")]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 and name the pages whose tables are stale")


def main(args: argparse.Namespace, root: pathlib.Path = ROOT) -> int:
    changed = stale(root)
    for page in changed:
        rel = page.relative_to(root)
        if args.check:
            print(f"{rel}: its tables differ from their results files; run `{COMMAND}`", file=sys.stderr)
        else:
            page.write_text(rewrite(page.read_text(encoding="utf-8"), root), encoding="utf-8")
            print(f"redrew the tables in {rel}", file=sys.stderr)
    return 1 if args.check and changed else 0
