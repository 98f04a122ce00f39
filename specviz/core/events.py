"""Events: the single currency between the engine and everything that shows it.

The engine yields one `StepEvent` per speculative step (or one `TokenEvent` per token
of plain decoding) and finishes with one `RunEnd`. Renderers, the CLI, the app and the
benchmark only ever read these; none of them touches a model or a KV cache.

All times are the engine's own seconds (perf_counter, synchronised on GPU), so a
consumer that renders between steps does not slow the run down on paper.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from . import metrics


@dataclass(frozen=True)
class StepEvent:
    """One speculative step: the drafter proposed `draft`, the target verified it once."""

    step: int  # 0-based step number
    position: int  # tokens generated before this step (where its first token lands)
    draft: tuple[int, ...]  # proposed token ids (may be empty: nothing to propose)
    q: tuple[float, ...] | None  # drafter prob of each draft token; None = deterministic (one-hot)
    p: tuple[float, ...]  # target prob of each draft token, with the same prefix
    accept_prob: tuple[float, ...]  # min(1, p/q); greedy: 1.0 if it is the target's argmax else 0.0
    draws: tuple[float, ...] | None  # the uniform draw u per draft token (None when greedy)
    accepted: int  # how many leading draft tokens were kept
    token: int  # the target's own token this step: corrected (rejection) or bonus
    token_p: float  # the target's probability of `token` at its position (before the residual)
    token_kind: str  # how the step ended: "corrected" (the resample after a rejection) or "bonus" (all drafts accepted)
    emitted: tuple[int, ...]  # appended to the output: draft[:accepted] + (token,), cut at EOS/limit
    top: tuple[tuple[int, float], ...]  # target's top tokens where `token` was chosen
    draft_time: float  # seconds spent drafting
    verify_time: float  # seconds in the target forward and the acceptance maths
    elapsed: float  # engine seconds since the run started (prefill included)
    greedy: bool  # greedy: p and q are the temperature-1 softmax, shown for information
    tree: "TreeDraft | None" = None  # the whole tree when the drafter proposed one; `draft` is then its chain view
    # The distributions behind the verdicts, for drawing p against q and the residual: the
    # top (token, prob) pairs (GenerationConfig.top of them, most probable first) of the
    # target at each draft position and then the bonus position (len(draft) + 1 rows), and
    # of the drafter at each draft position (empty when the drafter gave no q).
    p_top: tuple[tuple[tuple[int, float], ...], ...] = ()
    q_top: tuple[tuple[tuple[int, float], ...], ...] = ()
    # The same rows before temperature, top-k and top-p, for reshaping them live (the
    # distribution view): the top GenerationConfig.raw_top (token, log-prob at temperature 1)
    # of the target's raw logits and of the drafter's q brought back to temperature 1 (empty:
    # not recorded).
    p_raw: tuple[tuple[tuple[int, float], ...], ...] = ()
    q_raw: tuple[tuple[tuple[int, float], ...], ...] = ()
    # Who drafted this step, for a drafter that mixes sources (a hybrid: "prompt lookup,
    # 3-gram match" or its model's name); "" for a drafter whose every draft is alike.
    source: str = ""
    # The rule that judged a sampled chain draft ("token" or "block": GenerationConfig.verification),
    # and block verification's arithmetic over the same draft and draws whichever rule judged it, so
    # a step shows what each rule keeps (None when greedy, for trees and in older traces).
    verification: str = "token"
    block: "BlockCheck | None" = None
    # Drafted in one pass by a block drafter (drafters/block.py): each position's q_top is that position's
    # candidates, none of them depending on the drafts before it (a tree's too: q_top follows its chain view).
    parallel: bool = False

    @property
    def rejected(self) -> tuple[int, ...]:
        """Draft tokens thrown away (the first rejection and everything after it)."""
        return self.draft[self.accepted:]


@dataclass(frozen=True)
class TreeDraft:
    """A tree step: every candidate, its parent (-1: the pending token), and the branch that won.

    The step's `draft` shows the winning branch followed by the first child that missed (if
    any), so chain renderers read a tree step like any other step.
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    path: tuple[int, ...]  # accepted node indices, root to leaf
    p: tuple[float, ...]  # target prob of each node's token after its ancestors
    # A sampled step's sibling walk (core/tree_sampling.py; empty when greedy, and in older
    # traces): the nodes judged, in order (at each depth the accepted path node's earlier
    # siblings, then it), and for each: p'(x), the target's probability of its token with the
    # siblings rejected before it removed and the rest renormalised; the uniform draw u it was
    # judged by (kept when u < p'(x)); and the mass of p left after it, had it been rejected
    # (p' after that rejection is p without it and its earlier siblings, divided by this).
    walk: tuple[int, ...] = ()
    accept_prob: tuple[float, ...] = ()
    draws: tuple[float, ...] = ()
    residual_mass: tuple[float, ...] = ()
    # A drawn tree (children drawn from q, core/tree_drawn.py; empty for chosen trees): for each judged
    # node q_j(x), the q it was drawn from without its earlier siblings, renormalised. Its accept_prob is
    # then min(1, p'(x) / q_j(x)) and its residual_mass that of max(p' - q_j, 0).
    q: tuple[float, ...] = ()
    keep: tuple[float, ...] = ()  # a drawn tree: each node's chance of being kept over the coins, given the tree


@dataclass(frozen=True)
class BlockCheck:
    """Block verification of a chain step (core/block_verify.py), one entry per draft token: the
    weights w_1..w_k, the residual masses |r_0|..|r_{k-1}|, and h_1..h_k, the chance the backward
    pass stops at each position once it got there (it keeps up to the last i whose draw u_i < h_i)."""

    weight: tuple[float, ...]
    residual_mass: tuple[float, ...]
    stop_prob: tuple[float, ...]


@dataclass(frozen=True)
class TokenEvent:
    """One token of plain autoregressive decoding (the baseline)."""

    step: int
    token: int
    p: float  # target prob of the token (greedy: temperature-1 softmax)
    time: float  # seconds for this token's forward and sampling
    elapsed: float  # engine seconds since the run started (prefill included)
    top: tuple[tuple[int, float], ...] = ()  # the target's top (token, prob) pairs where `token` was chosen


@dataclass(frozen=True)
class RunStats:
    """What a whole run did. tau counts every token a target forward produced per step."""

    tokens: int  # new tokens emitted
    steps: int  # decode steps (speculative steps, or tokens for the baseline)
    target_calls: int  # target forward passes, prefill included
    # drafted: draft tokens along the chain the target walked, so alpha reads the same for chains and
    # trees: a chain's drafts; a tree's winning branch and the first candidate it refused there.
    drafted: int
    accepted: int  # draft tokens accepted
    prefill_time: float
    draft_time: float
    verify_time: float
    elapsed: float  # engine seconds, prefill included
    stop_reason: str  # "eos", "max_new_tokens", "cancelled" or "context"
    # Draft tokens the target verified: a tree's every node (what its verify pass and drafting
    # cost), a chain's drafts (= drafted). 0 in traces written before it was counted.
    candidates: int = 0

    @property
    def acceptance_rate(self) -> float:
        """alpha: accepted / drafted, along the chain the target walked (a tree's winning branch)."""
        return metrics.acceptance_rate(self.accepted, self.drafted)

    @property
    def mean_accepted_length(self) -> float:
        """tau: tokens per step (accepted drafts plus the target's own token)."""
        return metrics.mean_accepted_length(self.tokens, self.steps)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed if self.elapsed > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            tokens_per_s=self.tokens_per_s,
        )
        return d


@dataclass(frozen=True)
class RunEnd:
    """The last event of a run: every generated token id and the run's statistics."""

    token_ids: tuple[int, ...]
    stats: RunStats


def event_to_dict(event: StepEvent | TokenEvent | RunEnd) -> dict:
    """A JSON-ready dict of any event, tagged with its type."""
    if isinstance(event, RunEnd):
        return {"type": "end", "token_ids": list(event.token_ids), "stats": event.stats.to_dict()}
    d = asdict(event)
    d["type"] = "step" if isinstance(event, StepEvent) else "token"
    return d
