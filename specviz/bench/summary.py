"""From raw runs to the numbers the report shows: per prompt, per arm and category, per phase.

Repeats are reduced to their median first (per prompt and arm); categories then add up
tokens and seconds over their prompts, so tokens/s is total tokens over total time and a
speedup is a ratio of per-token times measured side by side.

Predictions are made run by run, each with the costs measured just before its prompt
(metrics.predicted_cost in units of that prompt's one-token forward), then added up:
predicted speedup of a group = its tokens / its predicted cost.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..core import metrics as m
from .peers import PEERS
from .runner import BASELINE, Arm, BenchResult, RunRecord, draft_length

ALL = "all"


@dataclass
class PromptRow:
    """One arm on one prompt, repeats reduced to medians."""

    arm: str
    prompt_id: str
    category: str
    tokens: float
    elapsed: float
    decode: float
    records: list[RunRecord]


def prompt_rows(result: BenchResult) -> dict[tuple[str, str], PromptRow]:
    """{(arm label, prompt id): PromptRow}, in run order."""
    groups: dict[tuple[str, str], list[RunRecord]] = defaultdict(list)
    for r in result.records:
        groups[r.arm, r.prompt_id].append(r)
    return {
        key: PromptRow(key[0], key[1], recs[0].category, m.median(r.tokens for r in recs),
                       m.median(r.elapsed for r in recs), m.median(r.decode_time for r in recs), recs)
        for key, recs in groups.items()
    }


class Costs:
    """The measured forward costs of each prompt, and predictions made with them."""

    def __init__(self, result: BenchResult):
        self.seconds = result.forward_seconds
        self.v = {pid: m.verify_ratios(secs) for pid, secs in self.seconds.items()}

    def t1(self, prompt_id: str) -> float:
        return self.seconds[prompt_id][1]

    def drafting(self, records: list[RunRecord]) -> float:
        """Seconds drafting, in target forwards of each run's own prompt."""
        return sum(r.draft_time / self.t1(r.prompt_id) for r in records)

    def c(self, records: list[RunRecord]) -> float:
        """Drafting cost per candidate (a tree's every node), in target forwards."""
        drafted = sum(r.verified for r in records)
        return self.drafting(records) / drafted if drafted else 0.0

    def predicted(self, records: list[RunRecord]) -> float:
        """Step-model speedup: tokens / sum over runs of their predicted cost."""
        cost = sum(m.predicted_cost(r.draft_lengths, m.cost_ratio(r.draft_time, r.verified, self.t1(r.prompt_id)),
                                    self.v[r.prompt_id]) for r in records)
        return sum(r.tokens for r in records) / cost if cost > 0 else 0.0

    def v_at(self, records: list[RunRecord], n: int) -> float:
        """Median v(n) over the prompts these runs used."""
        return m.median(self.v[pid][n] for pid in {r.prompt_id for r in records})


def summarise(result: BenchResult) -> dict:
    """Everything the reports print: summary rows, per-prompt rows, phases, costs, drift."""
    rows = prompt_rows(result)
    costs = Costs(result)
    greedy = result.config.greedy
    base_rows = {pid: row for (a, pid), row in rows.items() if a == BASELINE}
    per_prompt = [_prompt_entry(arm, row, base_rows[row.prompt_id], greedy, costs)
                  for arm in result.arms for (a, _), row in rows.items() if a == arm.label]
    categories = list(dict.fromkeys(p.category for p in result.prompts))
    groups = {cat: {p.id for p in result.prompts if p.category == cat} for cat in categories}
    groups |= memory_groups(result.prompts) | {ALL: {p.id for p in result.prompts}}
    summary = []
    for arm in result.arms:
        for cat, ids in groups.items():
            mine = [row for (a, pid), row in rows.items() if a == arm.label and pid in ids]
            if mine:
                entries = [e for e in per_prompt if e["arm"] == arm.label and e["prompt_id"] in ids]
                summary.append(_aggregate(arm, cat, mine, [base_rows[r.prompt_id] for r in mine], entries, costs))
    return {
        "summary": summary,
        "prompts": per_prompt,
        "phases": [phases(arm, [r for r in result.records if r.arm == arm.label]) for arm in result.arms],
        "costs": _category_costs(result, costs, categories),
        "drift": drift(result, costs),
    }


def memory_groups(prompts) -> dict[str, set[str]]:
    """For categories of request series (run/suites.py): "<category>, first requests" (each series'
    first: a memory across requests starts empty) and "<category>, later requests" (warm)."""
    out, seen = {}, set()
    for p in prompts:
        if p.series:
            warm = p.memory_scope in seen
            seen.add(p.memory_scope)
            out.setdefault(f"{p.category}, {'later' if warm else 'first'} requests", set()).add(p.id)
    return dict(sorted(out.items()))


def _aggregate(arm: Arm, category: str, mine: list[PromptRow], base: list[PromptRow],
               entries: list[dict], costs: Costs) -> dict:
    recs = [r for row in mine for r in row.records]
    tokens, elapsed, decode = (sum(getattr(row, f) for row in mine) for f in ("tokens", "elapsed", "decode"))
    b_tokens, b_elapsed, b_decode = (sum(getattr(row, f) for row in base) for f in ("tokens", "elapsed", "decode"))
    s = {
        "arm": arm.label, "engine": arm.engine, "drafter": arm.drafter, "k": draft_length(arm),
        "dynamic": arm.cfg.dynamic_k, "confidence": arm.cfg.draft_confidence,
        "category": category, "prompts": len(mine), "tokens": tokens, "seconds": elapsed,
        "tokens_per_s": tokens / elapsed if elapsed else 0.0,
        "speedup": m.speedup(b_elapsed, b_tokens, elapsed, tokens),
        "decode_speedup": m.speedup(b_decode, b_tokens, decode, tokens),
        "v": costs.v_at(recs, arm.cfg.k + 1) if draft_length(arm) else None,
    }
    if arm.engine == "specviz":
        s.update(_speculative(recs, s["decode_speedup"], costs))
        k = max([n for r in recs for n in r.draft_lengths] + [arm.cfg.k])
        reached, kept = m.position_counts((o for r in recs for o in r.step_outcomes), k)
        s.update(position_acceptance=m.position_acceptance(reached, kept), c=costs.c(recs),
                 predicted_closed_form=m.predicted_speedup(s["alpha"], arm.cfg.k, costs.c(recs), s["v"])
                 if any(r.drafted for r in recs) and not arm.cfg.dynamic_k else None)
    if "identical_to_baseline" in (entries[0] if entries else {}):
        s["identical"] = sum(e["identical_to_baseline"] for e in entries)
        if arm.engine in PEERS:
            s["agree_on_common_prefix"] = sum(e["common_prefix"] == e["common_length"] for e in entries)
    return s


def _speculative(recs: list[RunRecord], decode_speedup: float, costs: Costs) -> dict:
    """alpha, tau, the step model's predicted speedup, the measured one's share of it, and the draft tokens
    the target verified per step (a chain's length, a tree's nodes: alpha counts only the branch it walked)."""
    steps, predicted = sum(r.steps for r in recs), costs.predicted(recs)
    return {"alpha": m.acceptance_rate(sum(r.accepted for r in recs), sum(r.drafted for r in recs)),
            "tau": m.mean_accepted_length(sum(r.tokens for r in recs), steps), "predicted": predicted,
            "efficiency": m.efficiency(decode_speedup, predicted),
            "candidates_per_step": sum(r.verified for r in recs) / steps if steps else 0.0}


def _prompt_entry(arm: Arm, row: PromptRow, base: PromptRow, greedy: bool, costs: Costs) -> dict:
    recs = row.records
    entry = {
        "arm": arm.label, "prompt_id": row.prompt_id, "category": row.category,
        "tokens": row.tokens, "seconds": row.elapsed, "tokens_per_s": row.tokens / row.elapsed if row.elapsed else 0,
        "speedup": m.speedup(base.elapsed, base.tokens, row.elapsed, row.tokens),
        "decode_speedup": m.speedup(base.decode, base.tokens, row.decode, row.tokens),
        "stop_reason": recs[0].stop_reason,
    }
    if arm.engine == "specviz":
        entry.update(_speculative(recs, entry["decode_speedup"], costs))
    if greedy and arm.label != BASELINE:
        pairs = list(zip(recs, base.records))
        entry["identical_to_baseline"] = all(a.token_ids == b.token_ids for a, b in pairs)
        # Peers may stop at another length: compare what both produced.
        entry["common_prefix"] = min(m.common_prefix(a.token_ids, b.token_ids) for a, b in pairs)
        entry["common_length"] = min(min(a.tokens, b.tokens) for a, b in pairs)
        entry["baseline_tokens"] = base.tokens
    return entry


def phases(arm: Arm, records: list[RunRecord]) -> dict:
    """Where a decode step's time goes, in milliseconds per step and per token.

    draft forward / draft other: inside the draft model's forwards / the rest of drafting;
    target forward: inside the target's forwards; other: everything else in the step
    (acceptance maths, cache rollback, host syncs, Python). Prefill is left out.
    """
    steps = sum(r.steps for r in records) or 1
    tokens = sum(r.tokens for r in records) or 1
    decode = sum(r.decode_time for r in records)
    parts = {"draft_forward": sum(r.draft_forward for r in records), "draft_other": 0.0,
             "target_forward": sum(r.target_forward for r in records)}
    if arm.engine == "specviz":  # only specviz's own clock separates drafting from the rest
        parts["draft_other"] = sum(r.draft_time for r in records) - parts["draft_forward"]
    parts["other"] = decode - sum(parts.values())
    return {
        "arm": arm.label, "steps": steps, "tokens": tokens,
        "ms_per_step": {name: 1e3 * t / steps for name, t in parts.items()},
        "ms_per_token": 1e3 * decode / tokens,
    }


def _category_costs(result: BenchResult, costs: Costs, categories: list[str]) -> dict:
    """Per category, the median over its prompts of each forward's milliseconds and v(n)."""
    out = {}
    for cat in categories:
        pids = [p.id for p in result.prompts if p.category == cat]
        sizes = sorted({n for p in pids for n in costs.seconds[p]})
        out[cat] = {"forward_ms": {n: 1e3 * m.median(costs.seconds[p][n] for p in pids if n in costs.seconds[p])
                                   for n in sizes},
                    "verify_ratio": {n: m.median(costs.v[p][n] for p in pids if n in costs.v[p]) for n in sizes}}
    return out


def drift(result: BenchResult, costs: Costs) -> dict:
    """How the baseline's in-run one-token forwards compare with the measured one: far from
    1 means the machine changed speed between measuring and running (shared CPU, heat)."""
    ratios = []
    for r in result.records:
        if r.arm == BASELINE and r.steps:
            ratios.append(r.target_forward / r.steps / costs.t1(r.prompt_id))
    if not ratios:
        return {"median": None, "max": None, "min": None}
    return {"median": m.median(ratios), "max": max(ratios), "min": min(ratios)}
