"""An audit's verdict, its side-by-side table and its results file (specviz-audit v1).

The verdict withholds judgement where the sample cannot judge: too few draws, or no drafts at
all (then the speculative side was plain decoding, and agreeing proves nothing). A pass always
carries the power beside it: the smallest total variation the test would have caught.
"""
from __future__ import annotations

import sys

from .stats import MIN_DRAWS, POWER, Comparison, joint

FORMAT = "specviz-audit v1"
EXACT, NOT_EXACT, NO_VERDICT = "consistent with exact", "NOT exact", "no verdict"


def verdict(c: Comparison, drafted: int, accepted: int) -> tuple[str, str]:
    """(word, one sentence) for a comparison and the drafts its speculative side made."""
    n = min(c.draws)
    if n < MIN_DRAWS:
        return NO_VERDICT, (f"No verdict: too few draws to judge: {n} each way, and the test needs at least {MIN_DRAWS} "
                            "each way before its p-value says anything.")
    if not drafted:
        return NO_VERDICT, (f"No verdict: nothing was drafted in {c.draws[0]} speculative draws: they were plain decoding, "
                            "so agreeing proves nothing about speculative sampling. Choose a prompt or drafter "
                            "that drafts.")
    if not any(t.dof for t in c.tests):
        return NO_VERDICT, ("No verdict: nothing to test: no two outcomes came up often enough (5 expected draws each way) "
                            "to compare. Draw more, or lower the temperature.")
    tv = f"TV {c.tv:.3f} (95% interval {c.tv_low:.3f}-{c.tv_high:.3f}; {c.tv_floor:.3f} for one sampler twice)"
    if c.different:
        return NOT_EXACT, (f"NOT exact: p = {c.p:.2g} < {c.alpha:g}, {tv}: the speculative draws do not follow "
                           "the plain ones' distribution.")
    refused = drafted - accepted
    caveat = (" Every draft was accepted, so a wrong rejection rule was never exercised." if not refused else
              " No draft was accepted, so a wrong acceptance rule was never exercised." if not accepted else "")
    return EXACT, (f"Consistent with exact sampling: p = {c.p:.2g}, {tv}; at {c.draws[0]} draws each way the "
                   f"test catches a difference of TV {c.detectable:.3f} or more with {POWER:.0%} probability "
                   f"(smaller ones can pass).{caveat}")


def side_by_side(spec, base, depth: int, show, rows: int = 12) -> list[dict]:
    """The commonest outcomes of the first `depth` tokens, with their counts each way, most
    frequent first; `show(outcome)` writes one as text. The rest are one row."""
    a, b = joint(spec, depth), joint(base, depth)
    order = sorted(set(a) | set(b), key=lambda o: (-(a[o] + b[o]), show(o)))
    table = [{"outcome": show(o), "speculative": a[o], "plain": b[o]} for o in order[:rows]]
    rest = order[rows:]
    if rest:
        table.append({"outcome": f"({len(rest)} other outcomes)", "speculative": sum(a[o] for o in rest),
                      "plain": sum(b[o] for o in rest)})
    return table


def print_result(r: dict, out=None) -> None:
    """One setting's result as text: the verdict, the tests, the drafts, and the outcomes side by side."""
    out = out or sys.stdout
    c = r["comparison"]
    print(f"\n== {r['setting']} ==", file=out)
    print(r["sentence"], file=out)
    drafted, accepted = r["drafted"], r["accepted"]
    print(f"drafts: {drafted} proposed, {accepted} accepted, {drafted - accepted} refused "
          f"over {c['draws'][0]} speculative draws", file=out)
    for t in c["tests"]:
        print(f"  {t['what']:<28} chi-square {t['chi_square']:8.2f} on {t['dof']:>3} dof   p = {t['p']:.3g}", file=out)
    print(f"  all tests (Bonferroni)        p = {c['p']:.3g} (fail below {c['alpha']:g})", file=out)
    print(f"  total variation {c['tv']:.3f}, 95% interval {c['tv_interval'][0]:.3f}-{c['tv_interval'][1]:.3f}, "
          f"{c['tv_floor']:.3f} for one sampler twice; catches TV >= {c['detectable_tv']:.3f} with "
          f"{c['power']:.0%} probability", file=out)
    if r["verdict"] == NOT_EXACT or r.get("show_table"):
        print(f"  {'first tokens':<40} {'speculative':>11} {'plain':>7}", file=out)
        for row in r["outcomes"]:
            print(f"  {row['outcome'][:40]:<40} {row['speculative']:>11} {row['plain']:>7}", file=out)
