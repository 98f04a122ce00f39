"""The headline numbers: measured speedup beside what the theory predicts, alpha, tau, calls saved.

The predicted speedup is Leviathan et al.'s (2023), (1 - alpha^(k+1)) / ((1 - alpha)(c k + v)),
step by step for trees and varied draft lengths (core/metrics.py). Here c is measured: drafting
time per drafted token over the baseline's mean time per token; v is read off this machine's
measured verify-cost curve (verify_cost.py) at k + 1 tokens. The paper's v = 1 (verifying
is free of its length) holds on a GPU, not on a CPU: with no curve it is only assumed.
"""
from __future__ import annotations

from dataclasses import dataclass
from html import escape

from ..core import metrics
from ..core.divergence import Divergence, first_divergence, tie_tolerance
from ..core.events import TokenEvent
from .status import count
from .trace import Trace


MIN_TOKENS = 16  # tokens each run needs before a speedup means anything (prefill dominates before)


@dataclass(frozen=True)
class Headline:
    spec_tps: float  # tokens/s of the speculative run
    base_tps: float  # tokens/s of the baseline
    speedup: float | None  # spec_tps / base_tps (None until both runs have MIN_TOKENS)
    alpha: float  # acceptance rate: accepted / drafted, along the chain the target walked
    tau: float  # mean tokens per step
    k: float  # mean draft tokens verified per step: a chain's length (the configured k), a tree's nodes
    c: float | None  # draft cost per token / baseline cost per token
    predicted: float | None  # Leviathan's speedup from alpha, k and c; step by step for trees and dynamic k
    calls_saved: int  # target passes the speculative run's tokens would have cost plain decoding, minus its own
    base_calls: int  # target passes plain decoding needs for the speculative run's tokens (one per token)
    timing: str = "measured"  # measured | measuring (too few tokens yet) | too short (done with too few)
    trees: bool = False  # the drafter proposed trees: predicted step by step (core/metrics.py)
    varied: bool = False  # draft lengths differ between steps (dynamic k, trees): predicted step by step
    # Seconds a speculative step took beyond what the prediction counts (drafting, plus each verify
    # pass at the verify-cost curve's price): picking tokens, host copies, what the views record.
    unmodelled: float | None = None
    prefill: float = 0.0  # the prompt's pass, in target decode steps: both runs pay it, so the prediction counts it
    v: float | None = None  # verify cost of k + 1 tokens / one token, from the measured curve (None: assumed 1)
    verified: float = 1.0  # mean tokens in one verify pass: k + 1, or a tree's nodes + 1
    # Where the speculative run's time parted from the prediction's, in seconds (positive: slower than
    # predicted): all of it, its prompt read against the baseline's, and its steps beyond the costs counted.
    gap_time: float | None = None
    gap_prefill: float = 0.0
    gap_steps: float = 0.0
    # How much this machine's speed moved within these runs, as a fraction: the baseline's time per
    # token between its two halves, and the two runs' reading of the same prompt (None: too little to tell).
    noise: float | None = None
    # A block drafter's chains (drafters/block.py): the acceptance at each position of the block, given the
    # positions before it were kept, and the speedup a block of 1, 2, ... tokens predicts from them and the
    # verify curve (its one pass costs about the same whatever the block's size). Empty for other runs.
    positions: tuple[float, ...] = ()
    by_block: tuple[float, ...] = ()

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _timing(spec: Trace, base: Trace, tokens: int) -> str:
    """measured, or why not yet: a speedup needs MIN_TOKENS from each run (`tokens`: the fewer)."""
    if tokens >= MIN_TOKENS:
        return "measured"
    return "too short" if spec.done and base.done else "measuring"


def headline(spec: Trace, base: Trace, curve=None) -> Headline:
    """curve: the target's verify_cost.VerifyCurve on this machine (None: verifying assumed free)."""
    s, b = spec.stats(), base.stats()
    timing = _timing(spec, base, min(s.tokens, b.tokens))
    speedup = s.tokens_per_s / b.tokens_per_s if timing == "measured" and b.tokens_per_s > 0 else None
    steps = spec.steps
    # What drafting cost scales with: a chain's drafts, every node of a tree (alpha counts only
    # the branch the target walked, so that a tree's alpha compares with a chain's).
    k = s.candidates / s.steps if s.steps else 0.0  # Trace.stats counts them for older traces too
    base_step = b.verify_time / b.steps if b.steps else 0.0  # the baseline's time per token
    c = metrics.cost_ratio(s.draft_time, s.candidates, base_step) if s.candidates and base_step > 0 else None
    # Tokens in each verify pass: a tree is verified whole, every node rides in the one pass.
    sizes = [1 + (len(e.tree.tokens) if e.tree else len(e.draft)) for e in steps]
    trees = any(e.tree is not None for e in steps)
    verified = sum(sizes) / len(sizes) if trees else 1 + k
    varied = trees or len(set(sizes)) > 1  # one k no longer describes the run: predicted step by step
    prefill = b.prefill_time / base_step if base_step > 0 else 0.0  # target steps both runs spend on the prompt
    positions = block_positions(steps) if not trees else ()
    measured = c is not None and timing == "measured"
    return Headline(
        spec_tps=s.tokens_per_s, base_tps=b.tokens_per_s, speedup=speedup,
        alpha=s.acceptance_rate, tau=s.mean_accepted_length, k=k, c=c,
        calls_saved=max(0, s.tokens - s.steps), base_calls=s.tokens, timing=timing, trees=trees,
        v=curve.cost(verified) if curve is not None and steps else None, verified=verified, varied=varied,
        prefill=prefill, noise=noise(spec, base), positions=positions,
        **(_predicted(spec, s, b, c, prefill, (sizes, positions, varied), curve, speedup) if measured else
           {"predicted": None}),
    )


def _predicted(spec: Trace, s, b, c: float, prefill: float, shape, curve, speedup) -> dict:
    """The headline's prediction (core/metrics.Prediction) and where the run parted from it; `shape`:
    the steps' verify sizes, block positions, and whether their lengths vary. Tokens a step come from
    the acceptance at each position of a block (one pass drafts it whole), from the steps as they came
    where their lengths vary, else from Leviathan's closed form at alpha and k."""
    sizes, positions, varied = shape
    costs = [1.0 if curve is None else curve.cost(n) for n in sizes] or [1.0]  # target steps a verify pass
    k, base_step, step = s.candidates / s.steps, b.verify_time / b.steps, s.verify_time / s.steps
    per_step = (metrics.expected_from_positions(list(positions)) if positions else
                1 + sum(e.accepted for e in spec.steps) / len(spec.steps) if varied else
                metrics.expected_tokens(s.acceptance_rate, k))
    p = metrics.Prediction(per_step, c * k, sum(costs) / len(costs), s.tokens, prefill)
    out = {"predicted": p.speedup, "unmodelled": p.unmodelled(step, base_step)}
    if positions:  # the speedup a block of 1, 2, ... tokens predicts, its prompt read counted as the run's
        by_size = metrics.predicted_by_block(list(positions), c * k, (lambda n: 1.0) if curve is None else curve.cost)
        out["by_block"] = tuple(metrics.with_prefill(x, s.tokens, prefill) if s.tokens else x for x in by_size)
    if p.speedup > 0 and speedup is not None:
        # Where the speculative run's time parted from the prediction's (the gap line explains it part
        # by part): all of it, its prompt read against the baseline's, its steps beyond the costs counted.
        out.update(gap_time=p.gap(s.elapsed, b.elapsed / b.tokens), gap_prefill=s.prefill_time - b.prefill_time,
                   gap_steps=s.steps * out["unmodelled"])
    return out


def block_positions(steps) -> tuple[float, ...]:
    """A block drafter's chain run: the acceptance at each position reached, given the ones before it were
    kept (() when any step came from another drafter, or none drafted)."""
    drafted = [e for e in steps if e.draft]
    if not drafted or not all(e.parallel for e in drafted):
        return ()
    reached, kept = metrics.position_counts([(len(e.draft), e.accepted) for e in drafted],
                                            max(len(e.draft) for e in drafted))
    return tuple(kp / r for r, kp in zip(reached, kept) if r)


NOISE_PREFILL = 0.05  # seconds each prompt read must take before comparing the two says anything


def noise(spec: Trace, base: Trace) -> float | None:
    """How far this machine's speed moved within the two runs, as a fraction: the baseline's mean time
    per token in its second half against its first, and the two runs' reads of the same prompt (the
    same work twice). A speedup measured here can move by as much from one run to the next."""
    times = [e.time for e in base.events if isinstance(e, TokenEvent)]
    moved = []
    half = len(times) // 2
    if half >= MIN_TOKENS // 2:
        first, second = sum(times[:half]) / half, sum(times[half:]) / (len(times) - half)
        if min(first, second) > 0:
            moved.append(abs(second - first) / max(first, second))
    s, b = spec.stats(), base.stats()
    if min(s.prefill_time, b.prefill_time) >= NOISE_PREFILL:
        moved.append(abs(s.prefill_time - b.prefill_time) / max(s.prefill_time, b.prefill_time))
    return max(moved) if moved else None


def card(label: str, value: str, hint: str, key: str) -> tuple[str, str, str, str]:
    """One headline card, drawn by cards_html with the others."""
    return label, value, hint, key


def cards_html(cards: list[tuple[str, str, str, str]], scope: str = "sv") -> str:
    """The cards in a row, then one disclosure that explains every card in words: a hover title
    reaches no phone, projector, keyboard or screen reader, and a <details> opens by tap, click
    or Enter. Each card names that explanation with aria-describedby (it is read even while
    closed); `scope` keeps the ids apart when two blocks of cards share the page."""
    shown, explained = [], []
    for label, value, hint, key in cards:
        why = f"{scope}-why-{key}"
        # A word in place of a number ("measuring…") is set smaller, so it fits a number's card.
        word = " sv-card-word" if value[:1].isalpha() else ""
        shown.append(
            f'<div class="sv-card" data-metric="{key}" title="{escape(hint)}" role="group" '
            f'aria-label="{escape(label)}: {escape(value)}" aria-describedby="{why}">'
            f'<div class="sv-card-value{word}">{escape(value)}</div>'
            f'<div class="sv-card-label">{escape(label)}</div></div>')
        explained.append(f'<dt>{escape(label)}</dt><dd id="{why}">{escape(hint)}</dd>')
    details = (f'<details class="sv-why"><summary>What these numbers mean</summary>'
               f'<dl>{"".join(explained)}</dl></details>')
    return f'<div class="sv-cards">{"".join(shown)}{details}</div>'


def _x(value: float | None, h: Headline) -> str:
    if value is not None:
        return f"{value:.2f}×"
    return {"measuring": "measuring…", "too short": "too short"}.get(h.timing, "—")


def headline_html(h: Headline) -> str:
    c = "—" if h.c is None else f"{h.c:.2f}"
    prefill = (f"; both runs first read the prompt ({h.prefill:.1f} target steps), which the prediction counts as the "
               "measurement does" if h.prefill >= 0.5 else "")
    wait = f"; shown once both runs have {MIN_TOKENS} tokens" if h.timing != "measured" else ""
    if h.v is None:
        v = "v = 1 (assumed: verifying k + 1 tokens costs one step; no verify-cost curve measured)"
    else:
        v = (f"v = {h.v:.2f} (verifying {h.verified:.1f} tokens in one pass, from this machine's measured "
             "verify-cost curve)")
    # Said in words on the page (cards_html's disclosure), so each term on the card is explained there:
    # the formula and "verify 1.40×".
    verify = "" if h.v is None else f"; “verify {h.v:.2f}×” on the card is that v"
    formula = (f"what the theory (Leviathan et al.) predicts from the acceptance rate and the costs: "
               f"(1 − α^(k+1)) / ((1 − α)(c·k + v)) with α = {h.alpha:.2f}, k = {h.k:.2f} "
               f"(mean draft length), c = {c} (draft token cost / target step cost), {v}{verify}{prefill}{wait}")
    if h.varied:
        what = ("tree drafts" if h.trees else
                "draft lengths that differ from step to step (dynamic k, a match of any length, the room left)")
        formula = (f"{what}: one k does not describe the run, so the prediction is taken step by step: "
                   f"(1 + mean drafts kept per step) / (drafting cost per step + mean verify cost per step) with "
                   f"τ = {h.tau:.2f}, drafting {'—' if h.c is None else f'{h.c * h.k:.2f}'} target steps a step, "
                   + ("verifying assumed to cost one step (no verify-cost curve measured)" if h.v is None else
                      f"verifying {h.verified:.1f} tokens a pass on average at this machine's measured costs"
                      f"{verify}")
                   + prefill + wait)
    if h.positions:
        best = max(range(len(h.by_block)), key=lambda i: h.by_block[i]) if h.by_block else None
        formula = (f"a block drafter drafts its whole block in one pass, so the prediction reads the acceptance at "
                   f"each position of the block, given the ones before it were kept (α by position "
                   f"{' / '.join(f'{a:.2f}' for a in h.positions)}): tokens a step 1 + α₁ + α₁α₂ + … = "
                   f"{metrics.expected_from_positions(list(h.positions)):.2f}, over drafting "
                   f"{'—' if h.c is None else f'{h.c * h.k:.2f}'} target steps a step plus "
                   + ("one target step of verifying (no verify-cost curve measured)" if h.v is None else
                      f"verifying {h.verified:.1f} tokens at this machine's measured cost{verify}")
                   + (f". From the same α and costs a block of {best + 1} would give {h.by_block[best]:.2f}× "
                      f"(blocks of 1-{len(h.by_block)}: {', '.join(f'{x:.2f}×' for x in h.by_block)}; its one pass "
                      "costs about the same whatever the block's size)" if best is not None else "")
                   + prefill + wait)
    cards = [
        card("measured speedup", _x(h.speedup, h),
              f"speculative tokens/s divided by baseline tokens/s, measured (engine time, prefill included){wait}",
              "speedup"),
        card("predicted speedup" + ("" if h.v is None else f" (verify {h.v:.2f}×)"),
              _x(h.predicted, h), formula, "predicted"),
        card("α acceptance rate", f"{h.alpha:.2f}",
              "α: the share of drafted tokens the target accepted (accepted / drafted"
              + (", along the branch the target followed)" if h.trees else ")"),
              "alpha"),
        card("τ tokens per step", f"{h.tau:.2f}",
              "τ: tokens each target pass produced, on average: accepted drafts plus the target's own token "
              "(plain decoding: 1)" + (f"; a tree of {h.k:.1f} candidates a step can run deeper than the draft "
                                       "length k, so τ can pass k + 1" if h.trees else ""), "tau"),
        card("target passes saved", f"{h.calls_saved} of {h.base_calls}",
              f"forward passes of the target that speculation avoided: {count(h.base_calls, 'token')} cost plain decoding {count(h.base_calls, 'target pass', 'target passes')}"
              f" (one per token); the speculative run made them in "
              f"{count(h.base_calls - h.calls_saved, 'pass', 'passes')}. Passes are counted while generating: "
              "the prefill, one pass over the prompt, is the same for both runs", "calls"),
        card("tokens/s speculative", f"{h.spec_tps:.1f}", "engine time, prefill included", "spec-tps"),
        card("tokens/s baseline", f"{h.base_tps:.1f}", "engine time, prefill included", "base-tps"),
    ]
    return cards_html(cards) + gap_html(h)


GAP = 0.10  # predicted and measured further apart than this: the page says why, in a visible line
PART = 0.15  # a part of the gap smaller than this share of it is not worth a clause


def gap_html(h: Headline) -> str:
    """One visible line when the prediction misses the measurement by more than GAP: by how much, which
    way, what pushed the run that way (the parts of its time the prediction does not count, or counts
    differently), and whether this machine's speed moved by more than the gap while the runs ran."""
    if h.predicted is None or h.speedup is None or abs(h.predicted / h.speedup - 1) <= GAP:
        return ""
    slower = h.speedup < h.predicted
    why = [clause for size, clause in sorted(_gap_parts(h, slower), reverse=True)]
    where = f": {'; '.join(why)}" if why else ""
    moved = abs(h.speedup / h.predicted - 1)
    if h.noise is not None and h.noise >= moved:
        where += (f". This machine's speed moved by {h.noise:.0%} within these runs, more than the gap "
                  f"({moved:.0%}): run it again before reading much into it")
    return (f'<div class="sv-prediction-gap" data-gap="{h.predicted / h.speedup:.2f}" '
            f'data-direction="{"slower" if slower else "faster"}">Predicted {h.predicted:.2f}×, '
            f"measured {h.speedup:.2f}×{escape(where)}.</div>")


def _gap_parts(h: Headline, slower: bool) -> list[tuple[float, str]]:
    """(seconds, clause) for each part of the run's time that pushed it the way it went: slower than
    predicted (time the prediction does not count) or faster (time it counts that was not spent)."""
    sign = 1 if slower else -1
    total = abs(h.gap_time) if h.gap_time else 0.0
    parts = []
    if h.unmodelled is not None and sign * h.unmodelled > 0:
        ms = 1e3 * abs(h.unmodelled)
        if h.v is None:
            said = (f"each speculative step's verify pass took {ms:.1f} ms {'more' if slower else 'less'} than the "
                    "one target step assumed (no verify-cost curve was measured)")
        elif slower:
            said = (f"each speculative step spent {ms:.1f} ms beyond its drafting and its verify pass at the "
                    "curve's price (picking tokens, copies to the host, what the views record), which the "
                    "prediction does not count")
        else:
            said = (f"each speculative step's verify pass took {ms:.1f} ms less than this machine's verify-cost "
                    "curve prices it (the machine ran faster than when the curve was measured)")
        parts.append((abs(h.gap_steps), said))
    if sign * h.gap_prefill > 0:
        parts.append((abs(h.gap_prefill),
                      f"the speculative run read the prompt {1e3 * abs(h.gap_prefill):.0f} ms "
                      f"{'slower' if slower else 'faster'} than the baseline read the same prompt"))
    rest = (h.gap_time or 0.0) - h.gap_prefill - h.gap_steps
    if sign * rest > 0 and h.varied:  # predicted from each step's own kept drafts: only the prices differ
        parts.append((abs(rest), f"{1e3 * abs(rest):.0f} ms {'more' if slower else 'less'} went to steps of "
                                 "uneven sizes than their mean verify price counts"))
    elif sign * rest > 0:
        parts.append((abs(rest), f"its steps produced {'fewer' if slower else 'more'} tokens each than "
                                 f"α = {h.alpha:.2f} predicts ({1e3 * abs(rest):.0f} ms "
                                 f"{'lost' if slower else 'saved'})"))
    return [(size, said) for size, said in parts if not total or size >= PART * total]


def agreement(spec: Trace, base: Trace) -> tuple[bool | None, int | None]:
    """(identical, first differing token index) over the tokens both runs have produced.

    Runs of different lengths (Stop, a time limit) are compared on their common prefix:
    a run that was cut short differs from nothing it did not produce.
    """
    a, b = spec.token_ids, base.token_ids
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return False, i
    return (True, None) if n or (spec.done and base.done) else (None, None)


def divergence(spec: Trace, base: Trace, dtype: str | None = None) -> Divergence | None:
    """Where the greedy runs first differ, with both targets' margins there (core/divergence.py)."""
    return first_divergence(spec.events, base.events, tie_tolerance(dtype))


def agreement_html(spec: Trace, base: Trace, greedy: bool, dtype: str | None = None) -> str:
    """The greedy check (identical to baseline?) or, for sampling, why the texts differ. dtype: the
    target's precision, which says how large a margin its rounding explains at a difference."""
    if not greedy:
        return (
            '<div class="sv-check sv-check-sampling" data-identical="sampling">Sampling: the two runs '
            "draw different random numbers, so their texts differ, but speculative sampling gives "
            "every token exactly the target's distribution.</div>"
        )
    same, at = agreement(spec, base)
    if same is None:
        return ""
    ns, nb = len(spec.token_ids), len(base.token_ids)
    n = min(ns, nb)
    if same:
        if ns != nb and spec.done and base.done:
            scope = (f"over the {count(n, 'token')} both runs produced (the speculative run stopped at {ns}, "
                     f"the baseline at {nb})")
        else:
            scope = f"{'' if spec.done and base.done else 'so far '}({count(n, 'token')})"
        return (
            f'<div class="sv-check sv-check-ok" data-identical="true" data-compared="{n}">Greedy output '
            f"identical to baseline {scope}: speculative decoding changed the speed, not the text.</div>"
        )
    d = divergence(spec, base, dtype)
    tie = d is not None and d.near_tie
    why = d.sentence() if d is not None else f"The texts part at token {at}."
    return (
        f'<div class="sv-check {"sv-check-tie" if tie else "sv-check-bad"}" data-identical="false" '
        f'data-near-tie="{str(tie).lower()}" data-compared="{n}">Differs from baseline: {escape(why)}</div>'
    )
