"""`bench --controllers NAMES`: an arm per draft-length controller for each drafter, replayed on one draft
record per prompt (exact for a greedy bench, in expectation for a sampled one) and, with
`--controllers-live`, also run live, so each replay's tokens per pass and predicted tok/s sit beside the
live run's. Every row carries its gap to the hindsight best on the same record (engine/draft_replay.py)."""
from __future__ import annotations

import statistics
from dataclasses import replace

from ..core.errors import SpecvizError
from ..engine import controller_names
from ..engine.draft_record import DraftRecord
from ..engine.draft_replay import HINDSIGHT
from ..engine.generate import GenerationConfig
from ..run import draft_control
from .drafters import BenchDrafter


def names(text: str) -> list[str]:
    """The controllers named (checked before any model loads), canonical, 'all' spelled out."""
    given = [x.strip() for x in (text or "").split(",") if x.strip()]
    return controller_names.expand(given) if given else []


def run(target, drafters: list[BenchDrafter], encoded: list, cfg, wanted: list[str], live: bool, curve,
        progress=None) -> dict:
    """Rows per (prompt, drafter, controller) and their means per (drafter, controller). target: models.Loaded;
    curve: its VerifyCurve on this machine; cfg: the BenchConfig."""
    gen = GenerationConfig(max_new_tokens=cfg.max_new_tokens, sampling=cfg.sampling, eos_token_ids=cfg.eos_token_ids,
                           raw_top=0)
    rows, records = [], []
    for d in drafters:
        if d.drafter is None:
            continue  # 'none' drafts nothing to size
        for prompt, ids in encoded:
            rec = draft_control.record(target, d.drafter, ids, gen, d.name, curve)
            records.append({"prompt": prompt.id, "category": prompt.category, "drafter": d.name,
                            "record": rec.to_dict()})
            for row, r in _replayed(records[-1], rec, wanted):
                if live and r.controller != HINDSIGHT:
                    ran = draft_control.live(target, d.drafter, ids, replace(gen), rec, r.controller, d.name)
                    row["live"] = {"tokens_per_pass": ran.tokens_per_pass, "tokens_per_s": ran.tokens_per_s,
                                   "agrees": draft_control.agrees(r, ran) if r.exact else None,
                                   "identical_output": ran.token_ids == rec.output if r.exact else None}
                rows.append(row)
                if progress:
                    progress(f"{d.name} {r.controller} {prompt.id}")
    return {"names": wanted, "live": live, "rows": rows, "summary": summarise(rows), "records": records}


def replayed(records: list[dict], wanted: list[str]) -> dict:
    """The controllers' rows and means replayed on records a bench saved (its JSON's controllers.records):
    no model runs, so a rule can be changed and judged again on the same texts and prices."""
    rows = [row for saved in records for row, _ in _replayed(saved, DraftRecord.from_dict(saved["record"]), wanted)]
    return {"names": wanted, "live": False, "rows": rows, "summary": summarise(rows)}


def _replayed(saved: dict, rec: DraftRecord, wanted: list[str]):
    """(row, Replayed) per controller on one record, the hindsight best last."""
    replays = draft_control.replay_all(rec, wanted)
    best = replays[-1].tokens_per_s
    for r in replays:
        yield {"prompt": saved["prompt"], "category": saved["category"], "drafter": saved["drafter"],
               "controller": r.controller, "exact": r.exact, "tokens": r.tokens, "passes": r.passes,
               "tokens_per_pass": r.tokens_per_pass, "predicted_tokens_per_s": r.tokens_per_s,
               "of_best": r.tokens_per_s / best if best else 0.0, "ks": list(r.ks)}, r


def summarise(rows: list[dict]) -> list[dict]:
    """Per (drafter, controller): the means over prompts, and the worst prompt's share of the best."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["drafter"], r["controller"]), []).append(r)
    out = []
    for (drafter, controller), rs in groups.items():
        s = {"drafter": drafter, "controller": controller, "prompts": len(rs),
             "tokens_per_pass": statistics.fmean(r["tokens_per_pass"] for r in rs),
             "predicted_tokens_per_s": statistics.fmean(r["predicted_tokens_per_s"] for r in rs),
             "of_best": statistics.fmean(r["of_best"] for r in rs), "worst_of_best": min(r["of_best"] for r in rs)}
        ran = [r["live"] for r in rs if "live" in r]
        if ran:
            s["live_tokens_per_pass"] = statistics.fmean(x["tokens_per_pass"] for x in ran)
            s["live_tokens_per_s"] = statistics.fmean(x["tokens_per_s"] for x in ran)
            s["live_agrees"] = sum(bool(x["agrees"]) for x in ran)
        out.append(s)
    return sorted(out, key=lambda s: (s["drafter"], -s["predicted_tokens_per_s"]))


def table(doc: dict) -> str:
    """The controllers' table as the bench prints it."""
    live = doc["live"]
    head = f"{'drafter':<14} {'controller':<28} {'tok/pass':>8} {'pred tok/s':>10} {'of best':>8} {'worst':>6}"
    if live:
        head += f" {'live t/p':>8} {'live tok/s':>10} {'exact':>6}"
    lines = [f"draft-length controllers ({'greedy: replayed exactly' if all(r['exact'] for r in doc['rows']) else 'sampled: replayed in expectation'})", head]
    for s in doc["summary"]:
        line = (f"{s['drafter'][:14]:<14} {s['controller'][:28]:<28} {s['tokens_per_pass']:>8.2f} "
                f"{s['predicted_tokens_per_s']:>10.1f} {s['of_best']:>8.0%} {s['worst_of_best']:>6.0%}")
        if live and "live_tokens_per_s" in s:
            line += (f" {s['live_tokens_per_pass']:>8.2f} {s['live_tokens_per_s']:>10.1f} "
                     f"{s['live_agrees']:>3}/{s['prompts']:<2}")
        lines.append(line)
    return "\n".join(lines)


def check(text: str, live: bool) -> list[str]:
    wanted = names(text)
    if live and not wanted:
        raise SpecvizError("--controllers-live races the controllers --controllers names: give --controllers")
    return wanted
