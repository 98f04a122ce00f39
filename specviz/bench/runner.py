"""Running the benchmark: every arm on every prompt, interleaved, with its costs measured.

An arm is one way of generating: the plain baseline, specviz with a drafter at some k, or
a transformers peer. For each prompt the arms run round-robin, repeat after repeat
(A B C A B C ...), so slow drift of the machine (heat, other processes) hits every arm
alike. Before the first prompt each arm runs once briefly, unrecorded, to warm up.

Suffix decoding remembers earlier answers. Each arm and repeat keeps one memory per series of
requests (run/suites.py: a series, else the category), filled in the suite's order, so a series'
first request runs cold and the later ones warm, and no run ever sees its own earlier repeat;
warm-ups get an empty memory and teach nothing.

Cost ratios are measured on the spot: right after each prompt's runs, target forwards
over every number of new tokens those runs verified, on that prompt's cache state
(timing.forward_costs); and during every run, the seconds inside the target's and the
draft model's forwards (timing.ForwardClock).
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from ..core.errors import SpecvizError
from ..core.events import RunEnd, StepEvent
from ..core.sampling import Sampling
from ..drafters.suffix import suffix_of
from ..drafters.suffix_memory import SuffixMemory
from ..engine.generate import GenerationConfig, baseline_generate, speculative_generate
from ..engine.timing import ForwardClock, forward_costs
from ..render.rules import comparable, expected, kept
from . import peers
from .drafters import KINDS, BenchDrafter
from ..run.arms import BASELINE, Arm, parse_arm
from ..run.spec import check_length
from ..run.suites import BenchPrompt


# Half of generate's default on purpose: the bench runs every arm on every prompt, repeat
# after repeat, so a default run on a CPU stays within minutes. Pass --max-new-tokens to
# time the lengths `generate` and the app produce (GenerationConfig.max_new_tokens).
BENCH_MAX_NEW_TOKENS = 64


@dataclass(frozen=True)
class BenchConfig:
    """What the bench runs; its defaults are `python -m specviz bench`'s."""

    max_new_tokens: int = BENCH_MAX_NEW_TOKENS
    ks: tuple[int, ...] = (GenerationConfig().k,)
    dynamic_k: int = 0  # > 0: also run each drafter with dynamic k starting here
    confidences: tuple[float, ...] = ()  # with dynamic_k: also a dynamic arm per draft-confidence threshold
    # The engine's tree policy (GenerationConfig), which `generate` and the app run by: overridable to measure it
    tree_nodes_per_k: int = GenerationConfig().tree_nodes_per_k
    sampled_trees_up_to: float = GenerationConfig().sampled_trees_up_to
    # An arm per rule for each drafter at each k when sampling (GenerationConfig.verification); greedy runs
    # keep the same tokens under every rule, so a greedy bench runs one arm, token-wise.
    verifications: tuple[str, ...] = (GenerationConfig().verification,)
    sampling: Sampling = field(default_factory=Sampling)
    repeats: int = 1
    eos_token_ids: tuple[int, ...] = ()
    warmup: bool = True
    cost_repeats: int = 3  # timed forwards per size when measuring verify cost ratios

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy


@dataclass
class RunRecord:
    """One generation: one prompt, one arm, one repeat."""

    prompt_id: str
    category: str
    arm: str
    repeat: int
    token_ids: list[int]
    elapsed: float  # seconds, prefill included
    prefill: float = 0.0  # seconds before the first decode step (peers: their first target forward)
    steps: int = 0
    drafted: int = 0  # along the chain the target walked (a tree: its winning branch); alpha's count
    accepted: int = 0
    candidates: int = 0  # draft tokens verified (a tree: every node); drafting's cost scales with it
    draft_time: float = 0.0  # decode-phase seconds drafting (the engine's own clock)
    verify_time: float = 0.0  # decode-phase seconds verifying and committing
    target_forward: float = 0.0  # decode-phase seconds inside target forwards
    draft_forward: float = 0.0  # decode-phase seconds inside draft-model forwards
    draft_lengths: dict[int, int] = field(default_factory=dict)  # {n drafted (tree: nodes): steps}
    step_outcomes: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per step
    # Sampled chain steps: the drafts each verification rule keeps with those steps' own draws, whichever
    # rule ran ({"token": n, "block": m}): the two rules compared on the very same steps.
    kept_by_rule: dict[str, int] = field(default_factory=dict)
    # The same steps' means over the coins ({"token", "block"}; a sampled tree step's under the sibling
    # walk, "walk"), over `rule_steps` steps: the rules compared without the coins' noise.
    expected_by_rule: dict[str, float] = field(default_factory=dict)
    rule_steps: dict[str, int] = field(default_factory=dict)
    stop_reason: str = ""
    threads: int = 0  # torch's thread count for this run (the bench may change it between prompts)

    @property
    def verified(self) -> int:
        """Draft tokens the target verified: candidates, or drafted in records made before they were counted."""
        return self.candidates or self.drafted

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    @property
    def decode_time(self) -> float:
        return self.elapsed - self.prefill


@dataclass
class BenchResult:
    config: BenchConfig
    arms: list[Arm]
    prompts: list[BenchPrompt]
    prompt_tokens: dict[str, int]  # prompt id -> prompt length in tokens
    forward_seconds: dict[str, dict[int, float]]  # prompt id -> {n new tokens: seconds of one forward}
    records: list[RunRecord]


def _rule(rule: str) -> str:
    """An arm label's tail: the verification rule when it is not token-wise (the labels older results keep)."""
    return "" if rule == "token" else f" {rule}"


def draft_length(arm: Arm) -> int | None:
    """The arm's k; None where it has none (the baseline, transformers' plain generate)."""
    return None if arm.engine in (BASELINE, "hf") else arm.cfg.k


def plan_arms(drafters: list[BenchDrafter], config: BenchConfig, peer_names: list[str]) -> list[Arm]:
    """The baseline first, then each drafter at each k (and dynamic k), then the peers."""
    # Every arm's config before its own k, rule and shape; no raw log-probs: the bench only times and counts.
    base = GenerationConfig(max_new_tokens=config.max_new_tokens, k=1, tree_nodes_per_k=config.tree_nodes_per_k,
                            sampled_trees_up_to=config.sampled_trees_up_to, sampling=config.sampling,
                            eos_token_ids=config.eos_token_ids, raw_top=0, verification="token")
    arms = [Arm(BASELINE, None, base, BASELINE)]
    for d in drafters:
        if d.drafter is None:  # "none": k is irrelevant
            arms.append(Arm("none", None, base, drafter=d.name))
            continue
        # A rule in the drafter's name (NAME@token) holds whatever --verification says, as in generate and the app;
        # greedy runs keep the same tokens under every rule: one arm, token-wise.
        own = {r: parse_arm(d.name, replace(base, verification=r), KINDS) for r in config.verifications}
        shaped = {replace(a.cfg, verification="token") if config.greedy else a.cfg: a.spec for a in own.values()}
        for k in config.ks:
            check_length(d.drafter, k)  # a block drafter's file names the longest block it drafts
        arms += [Arm(f"{d.name} k={k}{_rule(c.verification)}", spec, replace(c, k=k), drafter=d.name)
                 for k in config.ks for c, spec in shaped.items()]
        if config.dynamic_k:  # dynamic arms under the first rule asked for
            c, spec = next(iter(shaped.items()))
            dyn, rule, c = f"{d.name} dynamic k={config.dynamic_k}", _rule(c.verification), replace(
                c, k=config.dynamic_k, dynamic_k=True)
            arms.append(Arm(f"{dyn}{rule}", spec, c, drafter=d.name))
            arms += [Arm(f"{dyn} conf={conf:g}{rule}", spec, replace(c, draft_confidence=conf), drafter=d.name)
                     for conf in config.confidences]
    return arms + _peer_arms(drafters, config, peer_names, base)


def _peer_arms(drafters: list[BenchDrafter], config: BenchConfig, peer_names: list[str],
               base: GenerationConfig) -> list[Arm]:
    """Each transformers peer at each k (hf-assisted: with each draft model)."""
    arms, model_drafters = [], [d for d in drafters if d.model is not None]
    for peer in peer_names:
        if peer not in peers.PEERS:
            raise SpecvizError(f"unknown peer {peer!r}: choose from {', '.join(peers.PEERS)}")
        if peer == "hf":
            arms.append(Arm("hf", None, base, "hf"))
            continue
        if peer == "hf-assisted" and not model_drafters:
            raise SpecvizError("hf-assisted needs a draft model: add a model id, folder or tiny-random to --drafters")
        owners = model_drafters if peer == "hf-assisted" else [None]
        for d in owners:
            name = f"{peer}:{d.name}" if d is not None and len(owners) > 1 else peer
            arms += [Arm(f"{name} k={k}", None, replace(base, k=k), peer, d and d.name) for k in config.ks]
            if config.dynamic_k and peer == "hf-assisted":  # transformers' prompt lookup has no schedule
                arms.append(Arm(f"{name} dynamic k={config.dynamic_k}", None,
                                replace(base, k=config.dynamic_k, dynamic_k=True), peer, d and d.name))
    return arms


def schedule(arms: list, repeats: int) -> list[tuple[int, object]]:
    """Round-robin order: every arm once per repeat, in the same order (A B A B ...)."""
    return [(r, arm) for r in range(repeats) for arm in arms]


class Runner:
    def __init__(self, target, drafters: list[BenchDrafter], config: BenchConfig, arms: list[Arm]):
        self.target, self.cfg, self.arms = target, config, arms
        self.drafters = {d.name: d for d in drafters}
        self.target_clock = ForwardClock(target)
        self.draft_clocks = {d.name: ForwardClock(d.model) for d in drafters if d.model is not None}
        self.memories: dict[tuple[str, int, str], SuffixMemory] = {}  # (arm, repeat, scope) -> answers

    def generation_config(self, arm: Arm, repeat: int, max_new_tokens: int | None = None) -> GenerationConfig:
        s = arm.cfg.sampling
        return replace(arm.cfg, max_new_tokens=max_new_tokens or arm.cfg.max_new_tokens,
                       sampling=replace(s, seed=s.seed + repeat))

    def run(self, prompt: BenchPrompt, ids: list[int], arm: Arm, repeat: int,
            max_new_tokens: int | None = None, remember: bool = True) -> RunRecord:
        """One generation; remember=False (warm-ups): with an empty memory, adding nothing to it."""
        if arm.engine in peers.PEERS:
            return self._run_peer(prompt, ids, arm, repeat, max_new_tokens)
        cfg = self.generation_config(arm, repeat, max_new_tokens)
        drafter = self.drafters[arm.drafter] if arm.engine == "specviz" else None
        draft_clock = self.draft_clocks.get(arm.drafter) if drafter else None
        if arm.engine == "baseline":
            events = baseline_generate(self.target, ids, cfg)
        else:
            suffix = suffix_of(drafter.drafter)
            if suffix is not None:
                key = (arm.label, repeat, prompt.memory_scope)
                suffix.memory = self.memories.setdefault(key, SuffixMemory()) if remember else SuffixMemory()
            events = speculative_generate(self.target, drafter.drafter, ids, cfg, remember=remember)
        rec = RunRecord(prompt.id, prompt.category, arm.label, repeat, [], 0.0, threads=torch.get_num_threads())
        lengths = Counter()
        with self.target_clock, (draft_clock or contextlib.nullcontext()):
            self.target_clock.reset()
            if draft_clock:
                draft_clock.reset()
            for ev in events:
                if isinstance(ev, StepEvent):
                    # The target verified every node of a tree, not only the chain shown.
                    lengths[len(ev.tree.tokens) if ev.tree is not None else len(ev.draft)] += 1
                    rec.step_outcomes.append((len(ev.draft), ev.accepted))
                    if comparable(ev):
                        for rule, n in kept(ev).items():
                            rec.kept_by_rule[rule] = rec.kept_by_rule.get(rule, 0) + n
                    for rule, mean in expected(ev).items():
                        rec.expected_by_rule[rule] = rec.expected_by_rule.get(rule, 0.0) + mean
                        rec.rule_steps[rule] = rec.rule_steps.get(rule, 0) + 1
                elif isinstance(ev, RunEnd):
                    end = ev
        stats = end.stats
        # The first forward of each model is its prefill (when the prompt has > 1 token).
        prefilled = len(ids) > 1
        rec.target_forward = self.target_clock.seconds - (self.target_clock.first if prefilled else 0.0)
        if draft_clock:
            rec.draft_forward = draft_clock.seconds - (draft_clock.first if prefilled else 0.0)
        rec.token_ids = list(end.token_ids)
        rec.elapsed, rec.prefill = stats.elapsed, stats.prefill_time
        rec.steps, rec.drafted, rec.accepted = stats.steps, stats.drafted, stats.accepted
        rec.candidates = stats.candidates
        rec.draft_time, rec.verify_time = stats.draft_time, stats.verify_time
        rec.draft_lengths, rec.stop_reason = dict(lengths), stats.stop_reason
        return rec

    def _run_peer(self, prompt, ids, arm, repeat, max_new_tokens) -> RunRecord:
        assistant = self.drafters[arm.drafter].model if arm.engine == "hf-assisted" else None
        kwargs = peers.generate_kwargs(arm.engine, draft_length(arm), arm.cfg.dynamic_k, self.cfg.sampling,
                                       max_new_tokens or self.cfg.max_new_tokens, self.cfg.eos_token_ids, assistant)
        clock = self.target_clock
        draft_clock = self.draft_clocks.get(arm.drafter) if assistant is not None else None
        with clock, (draft_clock or contextlib.nullcontext()):
            clock.reset()
            if draft_clock:
                draft_clock.reset()
            token_ids, seconds = peers.run_peer(self.target, ids, kwargs, self.cfg.sampling.seed + repeat)
        # generate()'s first target forward is its prefill; its set-up counts as decoding.
        rec = RunRecord(prompt.id, prompt.category, arm.label, repeat, token_ids, seconds, prefill=clock.first,
                        threads=torch.get_num_threads())
        rec.target_forward = clock.seconds - clock.first
        if draft_clock:  # the assistant's prefill is inside its first call too
            rec.draft_forward = draft_clock.seconds - draft_clock.first
        rec.steps = clock.calls - 1
        rec.stop_reason = "eos" if token_ids and token_ids[-1] in self.cfg.eos_token_ids else "max_new_tokens"
        return rec


def run_benchmark(target, drafters: list[BenchDrafter], prompts: list[tuple[BenchPrompt, list[int]]],
                  config: BenchConfig, peer_names: list[str] = (),
                  progress: Callable[[str], None] | None = None, total: Callable[[int], None] | None = None,
                  before_prompt: Callable[[BenchPrompt], None] | None = None) -> BenchResult:
    """Run every arm on every prompt; `progress(label)` is called after each unit of work and
    `before_prompt(prompt)` before each prompt's runs (the command re-chooses torch's thread
    count there: every arm of a prompt then runs with the same count, so its ratios stay fair)."""
    if not prompts:
        raise SpecvizError("no prompts to run")
    arms = plan_arms(drafters, config, list(peer_names))
    runner = Runner(target, drafters, config, arms)
    order = schedule(arms, config.repeats)
    if total:
        total(len(prompts) * (len(order) + 1) + (len(arms) if config.warmup else 0))
    tick = progress or (lambda label: None)

    if config.warmup:
        first, ids = prompts[0]
        for arm in arms:
            runner.run(first, ids, arm, 0, max_new_tokens=min(8, config.max_new_tokens), remember=False)
            tick(f"warm-up {arm.label}")

    forward_seconds, records = {}, []
    for prompt, ids in prompts:
        if before_prompt:
            before_prompt(prompt)
        mine = []
        for repeat, arm in order:
            mine.append(runner.run(prompt, ids, arm, repeat))
            tick(f"{prompt.id} {arm.label}")
        records += mine
        # Costs on this prompt's own cache state, right after its runs (same machine state),
        # for every verify length the runs used and each arm's k + 1.
        sizes = {1} | {a.cfg.k + 1 for a in arms if draft_length(a)} | {n + 1 for r in mine for n in r.draft_lengths}
        forward_seconds[prompt.id] = forward_costs(target, ids, sizes, config.cost_repeats)
        tick(f"{prompt.id} forward costs")
    return BenchResult(config, arms, [p for p, _ in prompts], {p.id: len(ids) for p, ids in prompts},
                       forward_seconds, records)

