"""The speculative decoding loop, and the plain loop it is measured against.

Both are generators: they yield one event per step (see core/events.py) and end with a
RunEnd. The caller can stop a run between steps by making `should_stop()` true.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import torch

from ..core.errors import SpecvizError
from ..core.events import RunEnd, RunStats, StepEvent, TokenEvent
from ..core.sampling import Processor, Sampling, sample
from ..drafters.base import Drafter, empty_draft, features_read
from ..modeling import probe
from ..modeling.forward import (RollbackCache, context_length, forward, model_device, new_cache, output_vocab_size,
                                synchronize, to_host)
from . import prefill
from . import controller_names
from .controllers import Controller
from .draft_length import DraftLength
from .verify_step import trees_verifiable, verify_chain, verify_tree

VERIFICATIONS = ("token", "block")  # the rules a chain draft can be judged by (GenerationConfig.verification)
TREE_DRAFTINGS = ("chosen", "drawn")  # how a sampled tree's children are found (GenerationConfig.tree_drafting)
K_MAX = 64  # longer drafts only add verification cost; beyond this it is a typo
TREE_NODES_PER_K_MAX = 4  # a tree of 4k candidates is dynamic k's largest; more only costs verification
# The most prompt tokens one prefill forward reads: pieces show progress and were faster than one pass
# (docs/performance.md, "Measurements behind the defaults"); below it prefill.py sizes them by time.
PREFILL_CHUNK = 512


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    k: int = 4  # draft length (the starting length when dynamic)
    dynamic_k: bool = False  # choose each step's length in 0..4k from measured costs (draft_length.py)
    # With dynamic_k: a chain drafter stops when its q of the next token is below this, and a
    # tree drafter keeps the nodes whose path probability reaches it, up to 4k nodes.
    draft_confidence: float = 0.0
    # The tree policy, one default for every entry point (the CLI, the app, the bench). At fixed k a tree
    # drafter (EAGLE, Medusa) proposes tree_nodes_per_k * k candidates a step (0: k, as a chain would): a
    # tree of k = 4 nodes is most often a straight line, 8 show branches, and 12 verified slower on a
    # 2-core CPU than 6-8 (bench --tree-nodes-per-k).
    tree_nodes_per_k: int = 2
    # Greedy runs may always draft trees; sampled runs up to this temperature, chains above: halfway
    # between 0.7, where trees paid more, and 1.0, where chains did (docs/performance.md, "Trees when
    # sampling"). 0: sampled runs draft chains; inf: trees at any temperature.
    sampled_trees_up_to: float = 0.85
    sampling: Sampling = field(default_factory=Sampling)
    eos_token_ids: tuple[int, ...] = ()
    top: int = 5  # how many of the target's top tokens each step records (0 = none)
    # How many temperature-1 log-probs of p and q each chain step records for the distribution
    # view (0 = none: a run that is only timed skips their cost, docs/performance.md).
    raw_top: int = 32
    # How a sampled chain draft is judged: "token" (each draft token alone, up to the first refusal) or
    # "block" (the block as a whole: never keeps fewer on average; core/block_verify.py). Both keep the
    # target's distribution exactly; greedy runs keep the same tokens under either; trees take the
    # sibling walk (core/tree_sampling.py), the most any exact rule keeps from them. Block by default:
    # on the same sampled steps it kept more than token-wise for every drafter that gives q, the same
    # for prompt lookup's one-hot drafts (docs/performance.md, "Which rule keeps more").
    verification: str = "block"
    # How a sampled tree's children are found: "chosen" (the drafter's likeliest tokens, judged by the
    # sibling walk as one-hot guesses, core/tree_sampling.py) or "drawn" (from the drafter's q without
    # replacement, judged by recursive rejection sampling, core/tree_drawn.py). Greedy trees always take
    # the likeliest tokens and the target's argmax. Chosen by default: up to sampled_trees_up_to drawing
    # keeps no more (level or fewer at 0.7), and at 1.0, where drawn trees keep the most, chains were still
    # faster on a CPU (docs/performance.md, "Drawn trees against chosen trees and chains").
    tree_drafting: str = "chosen"
    chains: bool = False  # a tree drafter (EAGLE, Medusa, block) drafts chains only: the NAME@chain arm
    # A draft-length controller by name (engine/controller_names.py: "sglang-adaptive", "llama-pmin:p=0.8",
    # "fixed:4", ...): it sizes every step's chain draft in place of k and dynamic k; "" = k / dynamic k.
    controller: str = ""

    def validate(self) -> "GenerationConfig":
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= K_MAX:
            raise SpecvizError(f"k (draft length) must be an integer from 1 to {K_MAX}, got {self.k}")
        m = self.max_new_tokens
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise SpecvizError(f"max new tokens must be a positive integer, got {m}")
        t = self.tree_nodes_per_k
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= TREE_NODES_PER_K_MAX:
            raise SpecvizError(f"tree nodes per k must be an integer from 0 (= k) to {TREE_NODES_PER_K_MAX}, got {t}")
        u = self.sampled_trees_up_to
        if isinstance(u, bool) or not isinstance(u, (int, float)) or math.isnan(u) or u < 0:
            raise SpecvizError(f"the temperature up to which sampled runs draft trees must be a number >= 0, got {u}")
        c = self.draft_confidence
        if not isinstance(c, (int, float)) or math.isnan(c) or not 0 <= c < 1:
            raise SpecvizError(f"draft confidence threshold must be in [0, 1), got {c}")
        self.sampling.validate()
        if self.verification not in VERIFICATIONS:
            raise SpecvizError(f"verification must be one of {', '.join(VERIFICATIONS)} (how a sampled draft is judged), "
                               f"got {self.verification!r}")
        if self.tree_drafting not in TREE_DRAFTINGS:
            raise SpecvizError(f"tree drafting must be one of {', '.join(TREE_DRAFTINGS)} (how a sampled tree's "
                               f"children are found), got {self.tree_drafting!r}")
        if self.controller:
            controller_names.parse(self.controller)
        return self

    @property
    def trees(self) -> bool:
        """May a tree drafter propose trees (where the engine can verify them): greedy, or sampled up to
        sampled_trees_up_to; else it drafts chains."""
        return self.sampling.greedy or self.sampling.temperature <= self.sampled_trees_up_to

    @property
    def tree_nodes(self) -> int:
        """A tree drafter's candidates per step at fixed k."""
        return (self.tree_nodes_per_k or 1) * self.k


class _Run:
    """What both loops share: checks, prefill, the stop rules and the clock."""

    def __init__(self, target, prompt_ids, config: GenerationConfig, should_stop, on_prefill=None):
        config.validate()
        self.cfg, self.target = config, target
        self.ids = [int(t) for t in prompt_ids]
        if not self.ids:
            raise SpecvizError("the prompt is empty: give at least one token")
        self.limit = context_length(target)
        if self.limit is not None and len(self.ids) >= self.limit:
            raise SpecvizError(
                f"the prompt is {len(self.ids)} tokens, but the model's context is {self.limit}: shorten it"
            )
        probe.check(target)  # a model the engine cannot verify exactly is refused now, in a sentence
        self.device = model_device(target)
        self.vocab = output_vocab_size(target)
        if max(self.ids) >= self.vocab or min(self.ids) < 0:
            raise SpecvizError(f"prompt token ids must be in [0, {self.vocab})")
        self.should_stop = should_stop or (lambda: False)
        self.generator = torch.Generator(device=self.device).manual_seed(config.sampling.seed)
        self.processor = Processor(config.sampling, self.vocab, self.ids, self.device)
        self.cache = new_cache(target)
        self.prompt_len = len(self.ids)
        self.eos = set(config.eos_token_ids)
        self.calls = 0
        self.elapsed = 0.0
        self.on_prefill = on_prefill  # told (tokens read, tokens to read) after each prefill chunk
        self.cut_short = False  # stopped during the prefill: nothing more to do

    def prefill(self, hidden: bool | tuple[int, ...] = False) -> torch.Tensor | None:
        # The target caches all but the last prompt token; each step then runs that
        # pending token together with the draft, so every step is one forward.
        self.pending = torch.tensor([self.ids[-1]], device=self.device)
        if len(self.ids) < 2:
            width = self.target.config.hidden_size * (len(hidden) if isinstance(hidden, tuple) else 1)
            return self.target.get_output_embeddings().weight.new_zeros(0, width) if hidden else None
        self.calls += 1  # one pass over the prompt, whatever its chunks
        ids = torch.tensor(self.ids[:-1], device=self.device)
        # A long prompt is read in pieces, so its progress can be told and Stop heard between them.
        # Sliding-window layers (RollbackCache) take their prefill whole: they keep only their
        # window of it, and start recording for rollback at the first forward that is not one.
        whole = isinstance(self.cache, RollbackCache) and self.cache.sliding
        pieces = prefill.pieces_for(self.target, self.ids[:-1], len(ids) if whole else PREFILL_CHUNK)
        states, a = [], 0
        while a < len(ids):
            if a and self.should_stop():
                self.cut_short = True
                return None
            piece = ids[a:a + pieces.next()]
            t0 = prefill.clock()
            out = forward(self.target, piece, self.cache, logits_to_keep=1, hidden=hidden)
            synchronize(self.device)
            pieces.took(len(piece), prefill.clock() - t0)
            if hidden:
                states.append(out[1])
            a += len(piece)
            if self.on_prefill is not None:
                self.on_prefill(a, len(ids))
        return (states[0] if len(states) == 1 else torch.cat(states)) if hidden else None

    @property
    def generated(self) -> int:
        return len(self.ids) - self.prompt_len

    def room(self) -> int:
        """How many more tokens this run may emit."""
        left = self.cfg.max_new_tokens - self.generated
        if self.limit is not None:
            left = min(left, self.limit - len(self.ids))
        return left

    def cut(self, tokens: list[int]) -> list[int]:
        """Truncate a step's tokens at the first EOS (kept) and at the room left."""
        tokens = tokens[: self.room()]
        for i, t in enumerate(tokens):
            if t in self.eos:
                return tokens[: i + 1]
        return tokens

    def stop_reason(self) -> str | None:
        if self.cut_short:
            return "cancelled"
        if self.ids[-1] in self.eos and self.generated:
            return "eos"
        if self.generated >= self.cfg.max_new_tokens:
            return "max_new_tokens"
        if self.room() <= 0:
            return "context"
        if self.should_stop():
            return "cancelled"
        return None

    def end(self, steps, drafted, accepted, prefill_time, draft_time, verify_time, reason,
            candidates: int = 0) -> RunEnd:
        stats = RunStats(
            tokens=self.generated, steps=steps, target_calls=self.calls, drafted=drafted, accepted=accepted,
            prefill_time=prefill_time, draft_time=draft_time, verify_time=verify_time,
            elapsed=self.elapsed, stop_reason=reason, candidates=candidates,
        )
        return RunEnd(tuple(self.ids[self.prompt_len:]), stats)


def speculative_generate(
    target, drafter: Drafter | None, prompt_ids, config: GenerationConfig = GenerationConfig(),
    should_stop: Callable[[], bool] | None = None, remember: bool = True,
    on_prefill: Callable[[int, int], None] | None = None, controller: Controller | None = None,
) -> Iterator[StepEvent | RunEnd]:
    """Speculative decoding: yields a StepEvent per draft-and-verify step, then a RunEnd.

    remember: tell the drafter the output at the end (`Drafter.finish`), so a drafter with a
    memory across requests keeps it; off for warm-ups and for runs that must not teach it.
    on_prefill(read, total): called as the prompt is read, chunk by chunk (a long prompt's
    prefill can take minutes on a CPU).
    controller: a fresh draft-length controller for this run (engine/controllers.py), in place of the one
    cfg.controller names; with either, every draft is a chain it sizes."""
    run = _Run(target, prompt_ids, config, should_stop, on_prefill)
    cfg, dev, greedy = run.cfg, run.device, config.sampling.greedy

    start = time.perf_counter()
    features = features_read(drafter)  # Medusa/EAGLE: the final states; EAGLE-3: a few layers' inputs
    if controller is None and cfg.controller:
        controller = controller_names.build(cfg.controller)
    trees = cfg.trees and not cfg.chains and trees_verifiable(run.cache) and controller is None  # may the drafter propose trees?
    length = controller or DraftLength(cfg.k, min(K_MAX, 4 * cfg.k), cfg.dynamic_k,
                                       tree_nodes=cfg.tree_nodes if trees else 0, confidence=cfg.draft_confidence)
    with torch.inference_mode():
        h = run.prefill(hidden=features)
        if drafter is not None and not run.cut_short:
            drafter.begin(run.ids, run.processor, run.generator, dev, hidden=h, trees=trees and cfg.tree_drafting)
        synchronize(dev)
    prefill_time = run.elapsed = time.perf_counter() - start
    steps = drafted = accepted = candidates = 0
    draft_time = verify_time = 0.0
    reason = run.stop_reason()
    while reason is None:
        t0 = time.perf_counter()
        with torch.inference_mode():
            # 1. Draft: as many tokens (a tree: nodes) as the draft-length policy gives this kind of
            # draft (draft_length.py: k, a tree's budget, or what dynamic k has priced), never more
            # than the run can still emit.
            kind, size = length.plan(drafter, run.ids, run.room())
            draft = drafter.propose(run.ids, size, length.confidence) if size else empty_draft(dev)
            n_draft = draft.tokens.numel()
            synchronize(dev)
            t1 = time.perf_counter()

            # 2. Verify in one target forward, which leaves the target's cache holding the
            # context plus the kept drafts (verify_step.py).
            if draft.parents is None:
                v = verify_chain(run.target, run.cache, len(run.ids), run.pending, draft, run.processor,
                                 run.generator, greedy=greedy, top=cfg.top, raw_top=cfg.raw_top, hidden=features,
                                 rule=cfg.verification)
            else:
                v = verify_tree(run.target, run.cache, run.pending, draft, run.processor, run.generator,
                                greedy=greedy, top=cfg.top, hidden=features)
            run.calls += 1
            # 3. Tell the drafter what was kept, so it rolls its own state back to match.
            if drafter is not None:
                drafter.feedback(v.accepted, hidden=v.hidden, path=None if v.tree is None else v.tree.path)
            # 4. Emit the kept drafts and the target's token, cut at EOS and the room left.
            n, token = v.accepted, v.token
            emitted = run.cut(list(v.draft[:n]) + [token])
            position = run.generated
            run.ids.extend(emitted)
            run.processor.update(emitted)
            run.pending = torch.tensor([token], device=dev)
        t2 = time.perf_counter()
        length.record(n_draft, n, t1 - t0, t2 - t1, kind, q=v.q)
        run.elapsed += t2 - t0
        draft_time += t1 - t0
        verify_time += t2 - t1
        drafted += len(v.draft)  # along the chain the target walked (a tree: its winning branch)
        candidates += n_draft  # every node the target verified
        accepted += n
        steps += 1
        yield v.event(step=steps - 1, position=position, emitted=tuple(emitted), draft_time=t1 - t0,
                      verify_time=t2 - t1, elapsed=run.elapsed, greedy=greedy,
                      source=drafter.describe(kind) if drafter is not None else "", parallel=draft.parallel)
        reason = run.stop_reason()
    if drafter is not None and remember:
        drafter.finish(run.ids[run.prompt_len:])
    yield run.end(steps, drafted, accepted, prefill_time, draft_time, verify_time, reason, candidates)


def baseline_generate(
    target, prompt_ids, config: GenerationConfig = GenerationConfig(),
    should_stop: Callable[[], bool] | None = None, on_prefill: Callable[[int, int], None] | None = None,
) -> Iterator[TokenEvent | RunEnd]:
    """Plain autoregressive decoding with the same sampler: a TokenEvent per token."""
    run = _Run(target, prompt_ids, config, should_stop, on_prefill)
    greedy = config.sampling.greedy
    width = min(config.top, run.vocab)
    start = time.perf_counter()
    with torch.inference_mode():
        run.prefill()
        synchronize(run.device)
    prefill_time = run.elapsed = time.perf_counter() - start
    steps = 0
    reason = run.stop_reason()
    while reason is None:
        t0 = time.perf_counter()
        with torch.inference_mode():
            logits = forward(run.target, run.pending, run.cache)  # (1, vocab)
            run.calls += 1
            p = run.processor.probs(logits)[0]
            token = p.argmax() if greedy else sample(p, run.generator)
            top_v, top_i = torch.topk(p, width)  # what the token was chosen from
            (tok,), (prob,), top_v, top_i = to_host(token, p[token], top_v, top_i)  # the one sync
            token_id = int(tok)
            run.ids.append(token_id)
            run.processor.update([token_id])
            run.pending = token.view(1)
        dt = time.perf_counter() - t0
        run.elapsed += dt
        steps += 1
        yield TokenEvent(step=steps - 1, token=token_id, p=prob, time=dt, elapsed=run.elapsed,
                         top=tuple(zip((int(t) for t in top_i), top_v)))
        reason = run.stop_reason()
    yield run.end(steps, 0, 0, prefill_time, 0.0, run.elapsed - prefill_time, reason)


def collect(events) -> tuple[list, RunEnd]:
    """Run a generator to the end: (the step events, the RunEnd)."""
    steps = list(events)
    return steps[:-1], steps[-1]


def warm_up(model, drafter: Drafter, prompt: list[int], cfg: GenerationConfig) -> None:
    """Two untimed tokens of speculative decoding on the prompt's tail, so one-time costs
    (grouping q/k/v and gate/up weights at the first fast forward; allocations; kernel choice)
    count in neither the speculative nor the baseline run's tokens/s."""
    collect(speculative_generate(model, drafter, prompt[-8:], replace(cfg, max_new_tokens=2), remember=False))
