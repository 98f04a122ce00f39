"""How close to the hindsight best can any rule that stops a draft by the drafter's q get?

    python scripts/q_stop_ceiling.py [--drafter eagle] [RECORDS.json ...]

Reads the greedy draft records a bench saved (`bench --controllers`; default: the held-out and
tuning suites' records in assets/bench/) and, per prompt, replays an optimistic q-stopping rule: it
knows the true chance that a drafted token is kept given its depth and q (measured over every
record read, the replayed one included), drafts up to K and stops before a token whose expected
tokens, times S, are worth less than its verify and drafting cost; S and K are then chosen for that
prompt in hindsight. Its share of the hindsight best estimates how far stopping a draft by q can go
on those texts and prices (an estimate, not a bound: specviz's rule, engine/controllers.Specviz, also
learns acceptance by depth from counts, and on a prompt or two it does better).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout

from specviz.engine import controller_names as names  # noqa: E402
from specviz.engine.controllers import BINS, Specviz  # noqa: E402
from specviz.engine.draft_record import DraftRecord  # noqa: E402
from specviz.engine.draft_replay import hindsight, replay  # noqa: E402

ASSETS = pathlib.Path(__file__).resolve().parents[1] / "assets" / "bench"
DEEPEST = 4  # depths from here on share one table row
SCALES = (0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 5)
LENGTHS = (4, 6, 8, 12, 16)


def bin_of(q: float) -> int:
    return next(b for b, edge in enumerate(BINS) if q < edge or edge == BINS[-1])


def kept_table(records) -> dict:
    """(depth, q bin) -> the share of drafted tokens kept, over every drafted token that was judged."""
    counts = defaultdict(lambda: [0, 0])
    for r in records:
        for i, m in enumerate(r.matches):
            for d in range(min(len(r.q[i]), m + 1)):
                c = counts[(min(d, DEEPEST), bin_of(r.q[i][d]))]
                c[0] += d < m
                c[1] += 1
    return {key: (kept + 0.5) / (judged + 1) for key, (kept, judged) in counts.items()}


def optimistic_rule(table: dict):
    class Optimistic(Specviz):
        scale, longest = 1.0, 16

        def next(self, kind=None) -> int:
            super().next(kind)
            return self.longest

        def _judge(self, i: int, q: float) -> bool:
            self.reach = 1.0 if i == 0 else self.reach
            a = table.get((min(i, DEEPEST), bin_of(q)), q)
            v = self.prices.ratios(i + 2)
            if self.reach * a < self.scale * (v[i + 2] - v[i + 1] + self.c):
                return True
            self.reach *= a
            return False

    return Optimistic


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="*", default=[ASSETS / f"controllers-records-{s}.json" for s in ("held-out", "tune")])
    ap.add_argument("--drafter", default="eagle")
    args = ap.parse_args(argv)
    saved = [s for f in args.records for s in json.load(open(f))["controllers"]["records"] if s["drafter"] == args.drafter]
    if not saved:
        print(f"no {args.drafter} records in {', '.join(map(str, args.records))}", file=sys.stderr)
        return 2
    records = [DraftRecord.from_dict(s["record"]) for s in saved]
    rule = optimistic_rule(kept_table(records))
    ours = names.RULES["specviz"]
    shares = []
    for s, r in zip(saved, records):
        best = hindsight(r).tokens_per_s
        mine = replay(r, "specviz").tokens_per_s / best
        names.RULES["specviz"] = names.Rule(rule, ours.params, ours.says)
        try:
            top = (0.0, None)
            for rule.scale in SCALES:
                for rule.longest in LENGTHS:
                    top = max(top, (replay(r, "specviz").tokens_per_s / best, (rule.scale, rule.longest)))
        finally:
            names.RULES["specviz"] = ours
        shares.append((mine, top[0]))
        print(f"{s['prompt']:<20} specviz {mine:.1%}   q-stop ceiling {top[0]:.1%} (S {top[1][0]:g}, K {top[1][1]})")
    print(f"{'mean':<20} specviz {statistics.fmean(m for m, _ in shares):.1%}   q-stop ceiling "
          f"{statistics.fmean(c for _, c in shares):.1%} (worst {min(c for _, c in shares):.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
