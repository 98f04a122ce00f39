"""A draft record: at every position of one run's output, what a maximal draft started there would have
drafted, how far the target keeps it, and what the drafter thought of each drafted token.

Greedy output does not depend on k, so one record answers for every draft-length controller: a step at
position i drafting j tokens drafts the first j of the maximal draft there (a chain drafter's draft of j
is the head of its longer one), and the target keeps min(j, match_i) of them. draft_replay.py replays any
controller from it exactly, and finds the best k at every step in hindsight.

It is made by the engine's own loop (`speculative_generate`) with the drafter wrapped: at each position the
drafter drafts K_RECORD tokens (timed: the drafting cost), the wrapper keeps them and hands the engine an
empty draft, so the target verifies only its pending token (timed: a one-token step, the engine's own
overhead included) and the run moves one token a step, through every position. The drafter is told it
kept none, as after a first-token rejection, so its state follows the output as in a live run.

Sampled runs keep, per position, the chance the drafter's first token there is kept (sum over x of
min(p(x), q(x)), from the target's top TOP_P tokens), which replays in expectation, not exactly.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field, replace

import torch

from ..core.errors import SpecvizError
from ..core.events import RunEnd, StepEvent
from ..drafters.base import Drafter, empty_draft
from ..modeling.forward import context_length, synchronize
from .controllers import K_RECORD
from .generate import GenerationConfig, speculative_generate

TOP_P = 64  # the target's top tokens a sampled record sums min(p, q) over (the rest of p is nearly nothing)
FORMAT = 1


@dataclass(frozen=True)
class Identity:
    """What a record belongs to: the target's fingerprint, the tokenizer's and the drafter as named."""

    target: str = ""
    tokenizer: str = ""
    drafter: str = ""

    def refuses(self, other: "Identity") -> str | None:
        """The sentence refusing a record made for `other` where this one is wanted; None when they agree."""
        for what in ("target", "tokenizer", "drafter"):
            mine, theirs = getattr(self, what), getattr(other, what)
            if mine != theirs:
                shown = {"target": "model", "tokenizer": "tokenizer", "drafter": "drafter"}[what]
                return (f"this draft record was made with another {shown} ({theirs[:24] or 'unnamed'}, not "
                        f"{mine[:24] or 'unnamed'}): make a new record for this run before replaying controllers")
        return None


@dataclass(frozen=True)
class DraftRecord:
    identity: Identity
    prompt: tuple[int, ...]
    output: tuple[int, ...]  # the run's tokens, the end-of-turn token included
    budget: int  # tokens the run could emit (max new tokens, or what the context left)
    greedy: bool
    kinds: tuple  # per position: the drafter's kind of draft there (Drafter.plan)
    drafts: tuple[tuple[int, ...], ...]  # per position: the maximal draft (up to K_RECORD tokens, room - 1)
    q: tuple[tuple[float, ...], ...]  # per position: the drafter's probability of each drafted token (1: a copy)
    verify: tuple[float, ...]  # v(m) for m = 1..K_RECORD + 1: a pass over m tokens in one-token passes
    step_seconds: float  # T(1): the median one-token step of the record's run
    prefill_seconds: float
    draft_cost: float  # c: drafting seconds per drafted token / T(1)
    draft_cost_by_kind: dict = field(default_factory=dict)  # {kind: c} where kinds differ
    # Sampled records only, per position: the chance the first drafted token is kept, and the drafter's top q
    accept: tuple[float, ...] = ()
    first_q: tuple[float, ...] = ()
    format: int = FORMAT

    @property
    def matches(self) -> tuple[int, ...]:
        """Per position i: how many leading tokens of the maximal draft there equal the output's next ones."""
        out = []
        for i, draft in enumerate(self.drafts):
            m = 0
            while m < len(draft) and i + m < len(self.output) and draft[m] == self.output[i + m]:
                m += 1
            out.append(m)
        return tuple(out)

    def check(self, identity: Identity) -> "DraftRecord":
        """This record, if it belongs to `identity`; else a SpecvizError in one sentence."""
        refused = identity.refuses(self.identity)
        if refused:
            raise SpecvizError(refused)
        return self

    def to_dict(self) -> dict:
        d = asdict(self)
        d["draft_cost_by_kind"] = [[k, v] for k, v in self.draft_cost_by_kind.items()]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DraftRecord":
        if d.get("format") != FORMAT:
            raise SpecvizError(f"this draft record's format is {d.get('format')!r}; this specviz reads {FORMAT}")
        d = dict(d, identity=Identity(**d["identity"]), draft_cost_by_kind={k: v for k, v in d["draft_cost_by_kind"]})
        tuples = ("prompt", "output", "kinds", "verify", "accept", "first_q")
        d |= {k: tuple(d[k]) for k in tuples} | {k: tuple(map(tuple, d[k])) for k in ("drafts", "q")}
        return cls(**d)


class _Recording(Drafter):
    """The drafter, drafting K_RECORD tokens at every position for the record and none for the target."""

    tree_width = 0

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.name, self.needs_hidden, self.hidden_layers = inner.name, inner.needs_hidden, inner.hidden_layers
        self.kind, self.last = None, None

    def begin(self, prompt_ids, processor, generator, device, hidden=None, trees=False) -> None:
        self.device = device
        self.inner.begin(prompt_ids, processor, generator, device, hidden=hidden, trees=False)

    def plan(self, ids):
        self.kind, self.last = self.inner.plan(ids), None
        return self.kind

    def propose(self, ids, k, min_confidence=0.0):
        t0 = time.perf_counter()
        d = self.inner.propose(ids, k)
        synchronize(self.device)
        seconds = time.perf_counter() - t0
        tokens = d.tokens.tolist()
        q = [1.0] * len(tokens) if d.q is None else d.q[torch.arange(len(tokens)), d.tokens].tolist()
        row = d.q[0] if d.q is not None and tokens else None
        self.last = (tuple(tokens), tuple(q), seconds, row)
        return empty_draft(self.device)

    def feedback(self, accepted, hidden=None, path=None) -> None:
        self.inner.feedback(0, hidden=hidden)


def make_record(target, drafter: Drafter, prompt_ids, cfg: GenerationConfig, verify, identity: Identity = Identity(),
                should_stop=None) -> DraftRecord:
    """Record `drafter` on the run of `prompt_ids` under `cfg` (its k, dynamic k and controller are not read).
    verify: v(m), a pass over m tokens in one-token passes (VerifyCurve.cost: this machine's measured curve)."""
    if drafter is None:
        raise SpecvizError("a draft record needs a drafter: 'none' drafts nothing to size")
    wrapped = _Recording(drafter)  # a tree drafter drafts chains here, as under any controller
    run_cfg = replace(cfg, k=K_RECORD, dynamic_k=False, controller="", top=0 if cfg.sampling.greedy else TOP_P,
                      raw_top=0)
    kinds, drafts, qs, accept, first_q, times, draft_times = [], [], [], [], [], [], {}
    end = None
    for e in speculative_generate(target, wrapped, prompt_ids, run_cfg, should_stop=should_stop, remember=False):
        if isinstance(e, RunEnd):
            end = e
            continue
        tokens, q, seconds, row = wrapped.last or ((), (), 0.0, None)
        kinds.append(wrapped.kind)
        drafts.append(tokens)
        qs.append(q)
        times.append(e.verify_time)
        if tokens:
            spent, count = draft_times.get(wrapped.kind, (0.0, 0))
            draft_times[wrapped.kind] = (spent + seconds, count + len(tokens))
        if not cfg.sampling.greedy:
            accept.append(_first_kept(e, tokens, row))
            first_q.append(float(row.max()) if row is not None else 1.0 if tokens else 0.0)
    if end is None or end.stats.stop_reason == "cancelled":
        raise SpecvizError("the record's run was stopped before it ended: nothing to replay")
    t1 = statistics.median(times) if times else 0.0
    spent = sum(s for s, _ in draft_times.values())
    drafted = sum(n for _, n in draft_times.values())
    c = spent / drafted / t1 if drafted and t1 > 0 else 0.0
    by_kind = {k: s / n / t1 for k, (s, n) in draft_times.items() if n and t1 > 0} if len(draft_times) > 1 else {}
    limit = context_length(target)
    budget = cfg.max_new_tokens if limit is None else min(cfg.max_new_tokens, limit - len(prompt_ids))
    return DraftRecord(identity, tuple(int(t) for t in prompt_ids), tuple(end.token_ids), budget,
                       cfg.sampling.greedy, tuple(kinds), tuple(drafts), tuple(qs),
                       tuple(float(verify(m)) for m in range(1, K_RECORD + 2)), t1, end.stats.prefill_time, c, by_kind,
                       tuple(accept), tuple(first_q))


def _first_kept(e: StepEvent, tokens, row) -> float:
    """The chance a first draft token drawn from q is kept at this position: sum over x of min(p(x), q(x))."""
    if not tokens:
        return 0.0
    if row is None:  # a copy: q is one-hot on its token
        return next((p for t, p in e.top if t == tokens[0]), 0.0)
    ids = torch.tensor([t for t, _ in e.top], dtype=torch.long, device=row.device)
    p = torch.tensor([p for _, p in e.top], dtype=row.dtype, device=row.device)
    return float(torch.minimum(p, row[ids]).sum())
