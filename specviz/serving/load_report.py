"""The load sweep's record and views: a versioned JSON document, a terminal table, and the
plotly figure (the CLI's standalone HTML and the app draw the same `load_figure`).

Everything here reads the document (a dict), so a saved load.json redraws with no server.
"""
from __future__ import annotations

import html
import json
from dataclasses import asdict

from ..core.errors import SpecvizError
from ..modeling.threads import machine
from .load import ARMS, LoadResult
from .load_stats import ArmStats, crossover, policy_threshold, summarize, toggle_policy

SCHEMA, VERSION = "specviz-load", 1


def document(result: LoadResult) -> dict:
    """What the sweep measured and what follows from it, as one JSON-ready dict."""
    cfg = result.config
    config = {k: v for k, v in asdict(cfg).items() if k != "prompts"}
    config.update(concurrency=list(cfg.concurrency), prompts=len(cfg.prompts))  # the texts are in the suite
    levels = []
    for c in cfg.concurrency:
        ran = [a for a in result.arms if a.concurrency == c]
        if not ran:
            continue
        level = {"concurrency": c, "order": [a.arm for a in ran],
                 "max_in_flight": {a.arm: a.max_in_flight for a in ran}}
        for a in ran:
            level[a.arm] = summarize(a.arm, c, a.runs, a.wall_s, a.counters, a.partial).to_dict()
        levels.append(level)
    requests = [{"arm": a.arm, "concurrency": a.concurrency, "sent_s": start, "tokens": r.tokens,
                 "elapsed_s": r.elapsed_s, "ttft_s": r.ttft_s, "inter_token_s": r.inter_token_s,
                 "finish_reason": r.finish_reason, "error": r.error}
                for a in result.arms for start, r in zip(a.starts_s or [None] * len(a.runs), a.runs)]
    env = machine(result.load_average_before)
    doc = {"schema": SCHEMA, "version": VERSION, "started": result.started, "finished": result.finished,
           "config": config, "environment": env, "stopped_early": result.stopped_early,
           "notes": list(result.notes) + busy_notes(env), "levels": levels, "requests": requests}
    doc.update(tradeoff(levels))
    return doc


def tradeoff(levels: list[dict]) -> dict:
    """The crossover and the toggle policy from the levels where both arms ran."""
    points = [(lv["concurrency"], lv["speculative"]["tokens_per_s"], lv["baseline"]["tokens_per_s"])
              for lv in levels if all(arm in lv for arm in ARMS)]
    cross = crossover(points)
    return {"crossover": cross.to_dict(), "policy": toggle_policy(points, policy_threshold(points, cross))}


def busy_notes(env: dict) -> list[str]:
    """A sentence when the machine had other work before the sweep began (the servers sat idle
    then; afterwards their own load is in the number): it slows both arms, not always alike."""
    load = env["load_average_before"]
    if load is None or load <= 0.5 * (env["cpus"] or 1):
        return []
    return [f"the machine's 1-minute load average was {load:.1f} on {env['cpus']} CPUs before the sweep: other "
            "work shares it, so read small differences between the arms with care"]


def write_json(doc: dict, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)


def read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SpecvizError(f"cannot read the load sweep {path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("version") != VERSION:
        raise SpecvizError(f"{path} is not a specviz load sweep (schema {SCHEMA!r}, version {VERSION})")
    return doc


def arm_stats(doc: dict, arm: str) -> list[ArmStats]:
    return [ArmStats.from_dict(lv[arm]) for lv in doc["levels"] if arm in lv]


def _num(x, scale: float = 1.0, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x * scale, fmt)


def table(doc: dict) -> str:
    """The levels as fixed-width text, then the crossover and the policy in sentences."""
    head = (f"{'conc':>4} {'arm':<11} {'req':>5} {'fail':>4} {'tok/s':>8} {'ratio':>5} {'TTFT p50/p95 s':>15} "
            f"{'ITL p50/p95 ms':>15} {'alpha':>5} {'tau':>5}")
    lines = [head, "-" * len(head)]
    for lv in doc["levels"]:
        base = lv.get("baseline", {}).get("tokens_per_s")
        for arm in lv["order"]:
            s = ArmStats.from_dict(lv[arm])
            ratio = s.tokens_per_s / base if arm == "speculative" and base else None
            lines.append(f"{s.concurrency:>4} {arm:<11} {s.requests:>5} {s.failed:>4} {s.tokens_per_s:>8.1f} "
                         f"{_num(ratio):>5} {_num(s.ttft_p50_s) + '/' + _num(s.ttft_p95_s):>15} "
                         f"{_num(s.itl_p50_s, 1e3, '.1f') + '/' + _num(s.itl_p95_s, 1e3, '.1f'):>15} "
                         f"{_num(s.acceptance_rate):>5} {_num(s.mean_accepted_length):>5}"
                         + ("  (partial)" if s.partial else ""))
    lines += ["", f"crossover: {doc['crossover']['reason']}", policy_sentence(doc["policy"])]
    return "\n".join(lines + [f"note: {n}" for n in doc.get("notes", [])])


def policy_sentence(policy: dict) -> str:
    if policy["mean_tokens_per_s"] is None:
        return f"policy: {policy['rule']}"
    past = " (the first measured level past the crossover)" if policy.get("threshold") is not None else ""
    return (f"policy: {policy['rule']}{past}: {policy['mean_tokens_per_s']:.1f} tokens/s, "
            f"{policy['gain_over_always_on']:+.1%} over always-on, {policy['gain_over_always_off']:+.1%} over "
            f"always-off; {policy['weighting']}")


def write_html(doc: dict, path: str) -> None:
    """One page that works offline: plotly.js is inlined (a few MB), the table below the chart."""
    import plotly.io as pio

    chart = pio.to_html(load_figure(doc), full_html=False, include_plotlyjs=True)
    cfg = doc["config"]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>specviz load sweep</title></head>",
        "<body style='font-family: system-ui, sans-serif; margin: 1.5em'>",
        f"<h1>Speculation under load: {html.escape(str(cfg.get('model') or 'the server model'))}</h1>",
        f"<p>speculative {html.escape(cfg['server'])} vs baseline {html.escape(cfg['baseline_server'])}, "
        f"{cfg['requests']} requests per level and arm, {cfg['max_tokens']} tokens at most; "
        f"{html.escape(doc['started'])} to {html.escape(doc['finished'])}</p>",
        chart, f"<pre style='white-space: pre-wrap'>{html.escape(table(doc))}</pre>", "</body></html>",
    ]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))


def load_figure(result):
    """Four panels against concurrency (log axis): total tokens/s of both arms with the crossover
    and the toggle policy, TTFT p50/p95, inter-token latency p50/p95, acceptance.
    result: a document (dict, e.g. a read load.json) or a LoadResult."""
    from .load_chart import build

    return build(result if isinstance(result, dict) else document(result))
