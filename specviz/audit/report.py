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


def withheld(n: int, drafted: int, tested: bool, each: str = " each way") -> str | None:
    """Why n draws (`each` side) with `drafted` drafts, `tested` on more than one cell, cannot be judged, or None."""
    if n < MIN_DRAWS:
        return (f"No verdict: too few draws to judge: {n}{each}, and the test needs at least {MIN_DRAWS}"
                f"{each} before its p-value says anything.")
    if not drafted:
        return (f"No verdict: nothing was drafted in {n} speculative draws: they were plain decoding, "
                "so agreeing proves nothing about speculative sampling. Choose a prompt or drafter that drafts.")
    if not tested:
        return (f"No verdict: nothing to test: no two outcomes came up often enough (5 expected draws{each}) to "
                "compare. Draw more, or lower the temperature.")
    return None


def verdict(c: Comparison, drafted: int, accepted: int) -> tuple[str, str]:
    """(word, one sentence) for a comparison and the drafts its speculative side made."""
    held = withheld(c.draws[0], drafted, any(t.dof for t in c.tests))  # as many each way
    if held:
        return NO_VERDICT, held
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


def fit_verdict(tests, n: int, drafted: int, alpha: float) -> tuple[str, str]:
    """(word, one sentence) for n speculative draws whose tokens were tested against the target's own p."""
    held = withheld(n, drafted, any(t.dof for t in tests), "")
    if held:
        return NO_VERDICT, held
    failed = [t for t in tests if t.p < alpha]
    if failed:
        return NOT_EXACT, (f"NOT exact: {failed[0].what}: p = {failed[0].p:.2g} < {alpha:g}: the speculative draws "
                           "do not follow the target's own distribution.")
    return EXACT, f"Consistent with exact sampling: every token's p >= {alpha:g} against the target's own distribution."


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


def print_head(r: dict, draws: int, tests: list[dict], out) -> None:
    """A setting's heading, its verdict, its speculative draws' drafts and its tests."""
    print(f"\n== {r['setting']} ==", file=out)
    print(r["sentence"], file=out)
    print(f"drafts: {r['drafted']} proposed, {r['accepted']} accepted, {r['refused']} refused "
          f"over {draws} speculative draws", file=out)
    for t in tests:
        counted = f" ({t['draws']} draws)" if "draws" in t else ""
        print(f"  {t['what']:<28} chi-square {t['chi_square']:8.2f} on {t['dof']:>3} dof   p = {t['p']:.3g}{counted}",
              file=out)


def print_fit(r: dict, out=None) -> None:
    """One setting's result against the target's p: the verdict, a line per token, and what the steps drafted."""
    out, steps = out or sys.stdout, r["steps"]
    print_head(r, r["draws"], r["tests"], out)
    if steps:
        print(f"  {steps['trees']} steps drafted a tree ({steps['drawn']} drawn from q); {steps['siblings']} of them "
              "judged a sibling after a rejection", file=out)
        print(f"  judged {r['speculative']['verification']}; on {steps['differed']} chain steps token-wise and block "
              "verification would have kept different counts with the same draws", file=out)


def print_result(r: dict, out=None) -> None:
    """One setting's result as text: the verdict, the tests, the drafts, and the outcomes side by side."""
    out = out or sys.stdout
    c = r["comparison"]
    print_head(r, c["draws"][0], c["tests"], out)
    print(f"  all tests (Bonferroni)        p = {c['p']:.3g} (fail below {c['alpha']:g})", file=out)
    print(f"  total variation {c['tv']:.3f}, 95% interval {c['tv_interval'][0]:.3f}-{c['tv_interval'][1]:.3f}, "
          f"{c['tv_floor']:.3f} for one sampler twice; catches TV >= {c['detectable_tv']:.3f} with "
          f"{c['power']:.0%} probability", file=out)
    if r["verdict"] == NOT_EXACT or r.get("show_table"):
        print(f"  {'first tokens':<40} {'speculative':>11} {'plain':>7}", file=out)
        for row in r["outcomes"]:
            print(f"  {row['outcome'][:40]:<40} {row['speculative']:>11} {row['plain']:>7}", file=out)
