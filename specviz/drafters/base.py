"""The one interface every drafter implements.

A drafter is told the run is starting (`begin`), is asked for up to k tokens after the
current context (`propose`), and is told how many of them the target kept (`feedback`),
so it can roll back its own state. Everything the engine tells a drafter goes through
`begin` and `feedback`; the verifier never asks what kind of drafter it is. Before each
propose the engine asks `plan`, from the context alone, what kind of draft is coming (prompt
lookup: the n-gram length that matched), so dynamic k can size it by what that kind has earned.
A step whose drafter drafted nothing (dynamic k chose 0, or a hybrid's other drafter drafted)
still ends with `feedback(0, hidden)`: hidden then holds the target's states for that step.

Drafters that read the target's features (Medusa, EAGLE) set `needs_hidden`; the engine
then hands them the target's final hidden states (the LM head's input) for every context
token except the newest, which the target has not run yet. A drafter that reads inner
layers instead (EAGLE-3) names them in `hidden_layers` and gets their inputs, concatenated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch


@dataclass(frozen=True)
class Draft:
    tokens: torch.Tensor  # (k,) long, on the target's device
    q: torch.Tensor | None  # (k, vocab) processed drafter probabilities; None = deterministic
    # A tree draft: parents[i] is the index of token i's parent draft token, -1 for the
    # pending token (see core/tree.py). None: a chain. Trees only when `begin` allowed them; a
    # drawn tree's q row i is the q node i was drawn from (its parent's), a chosen tree's q is None.
    parents: tuple[int, ...] | None = None
    # A block drafter's (drafters/block.py): every position came from one forward, and position j's q
    # does not depend on the tokens drafted before it. The step inspector then shows each position's
    # candidates; for a chosen tree, position_q (depth, vocab) holds those positions' processed q.
    parallel: bool = False
    position_q: torch.Tensor | None = None


class Drafter:
    name = "drafter"
    needs_hidden = False  # True: begin/feedback receive the target's hidden states
    # With needs_hidden: the decoder layers whose inputs (transformers' hidden_states[i]) are
    # read instead of the final state, concatenated along the feature axis; () = the final one.
    hidden_layers: tuple[int, ...] = ()
    # Tree drafters (Medusa, EAGLE): candidates expanded per node when trees are allowed;
    # 0 or 1 drafts chains only (the benchmark's NAME@chain arm). Read at every step, after plan.
    tree_width = 0

    def begin(self, prompt_ids: list[int], processor, generator: torch.Generator, device,
              hidden: torch.Tensor | None = None, trees: bool | str = False) -> None:
        """A new run starts with this prompt; reset any state.

        hidden (None unless needs_hidden): (len(prompt_ids) - 1, hidden_size); row i is the
        target's state after prompt_ids[i], the one its LM head turns into the next token's logits
        (with hidden_layers: those layers' inputs at token i, hidden_size each, side by side).
        trees: the engine can verify tree drafts this run (over the fast path's cache), and how a
        sampled run's children are found (GenerationConfig.tree_drafting): "chosen", the likeliest
        tokens, which the sibling walk judges as one-hot guesses (Draft.q None), or "drawn", from q
        without replacement (Draft.q each node's q; drafters/drawn.py); greedy runs always choose.
        False: every draft must be a chain.
        """

    def plan(self, ids: list[int]) -> int | None:
        """What kind of draft the coming propose will make after `ids`, for drafters whose
        guesses differ in reliability: prompt lookup's n, the length of the n-gram that
        matched. None: all of this drafter's drafts are alike. Dynamic k keeps an acceptance
        rate and a drafting cost per kind, so a strong match can draft long while a weak one
        drafts short. It is decided from the context alone, before anything is drawn, never
        from tokens the drafter samples (the rule that keeps sampling exact: autoregressive_draft)."""
        return None

    def describe(self, kind: int | None) -> str:
        """Who makes drafts of this kind, in a few words, for a drafter that mixes sources
        (StepEvent.source); "" when every draft comes from the same place."""
        return ""

    def propose(self, ids: list[int], k: int, min_confidence: float = 0.0) -> Draft:
        """Up to k tokens to follow `ids` (prompt and generated text so far)."""
        raise NotImplementedError

    def feedback(self, accepted: int, hidden: torch.Tensor | None = None,
                 path: Sequence[int] | None = None) -> None:
        """The target kept the first `accepted` tokens of the last draft.

        hidden (None unless needs_hidden): (accepted + 1, hidden_size), the target's states after the
        step's pending token (the context's last token before the step) and the kept drafts.
        path (tree drafts only, else None): the kept node indices, root to leaf.
        """

    def finish(self, output_ids: list[int]) -> None:
        """The run ended having generated `output_ids`. A drafter that learns across requests
        (suffix decoding's memory) remembers them; warm-up runs are not reported."""


class StopRule(float):
    """A chain draft's confidence stop that says which token it judges, for the engines' rules that stop
    otherwise than specviz (engine/controllers.py). As a float it is the threshold, so a drafter that
    only compares (prompt lookup, suffix decoding, trees) reads it as before. `first`: the first token
    is judged too, so a draft may be empty (llama.cpp's --draft-p-min); `after`: the token just drafted
    is judged by its own q and kept, and drafting stops after it (transformers' confidence threshold);
    `judge(i, q_max)`: asked before each position i (0 first) with the largest q there, True stops the draft
    (specviz's dynamic k weighing a token's expected gain against its cost). None judges a token by its own
    draw before keeping it, so sampling stays exact."""

    first: bool
    after: bool
    judge: Callable[[int, float], bool] | None

    def __new__(cls, threshold: float, first: bool = False, after: bool = False,
                judge: Callable[[int, float], bool] | None = None) -> "StopRule":
        rule = super().__new__(cls, threshold)
        rule.first, rule.after, rule.judge = first, after, judge
        return rule


def autoregressive_draft(processor, generator, logits: torch.Tensor, k: int, min_confidence: float,
                         advance: Callable[[torch.Tensor], torch.Tensor]) -> Draft:
    """Draft up to k tokens one at a time, with q processed exactly like the target's rows.

    `logits` (1, vocab) are the drafter's for the next token; `advance(token)` feeds a
    drafted token to the drafter and returns its logits for the token after it. A StopRule
    as `min_confidence` says which token its threshold judges (by default: each one after the
    first, before it is drawn).
    """
    from ..core.sampling import sample

    tokens, rows = [], []
    for i in range(k):
        # Same processing as the target's row i: the context plus the drafts so far.
        drafted = torch.stack(tokens) if tokens else None
        q = processor.probs(logits, drafted, start=i)[0]
        # The confidence stop looks at q before a token is drawn from it. Verification
        # accepts draft i with min(1, p/q) and resamples from norm(max(p - q, 0)), which
        # gives p exactly only if draft i was drawn from q itself. Whether position i is
        # drafted at all may depend on the context and on the drafts before i (those are
        # the target's own tokens by the time i is verified: a stopping rule), never on the
        # token drawn at i: drawing t and discarding it when q(t) is small would draw the
        # kept tokens from q restricted to {q >= c} while they are judged against q.
        # Greedy drafts the argmax, whose q is max(q): the same stop as judging the token.
        first, after = getattr(min_confidence, "first", False), getattr(min_confidence, "after", False)
        judge = getattr(min_confidence, "judge", None)
        if judge is not None and judge(i, q.max().item()):
            break  # not worth its cost
        if min_confidence > 0 and not after and (i > 0 or first) and q.max().item() < min_confidence:
            break  # not sure enough: stop drafting this step
        t = q.argmax() if processor.s.greedy else sample(q, generator)
        tokens.append(t.view(()))
        rows.append(q)
        if after and q[t].item() < min_confidence:
            break  # the token just drafted was unsure: keep it, draft no further (a rule on drafts before i + 1)
        if i + 1 < k:
            logits = advance(t.view(1))
    if not tokens:
        return Draft(logits.new_zeros(0, dtype=torch.long), None)
    return Draft(torch.stack(tokens), torch.stack(rows))


class Autoregressive(Drafter):
    """A small model drafting one token per forward from a cache of its own (a draft model, the
    target with layers skipped, a distilled drafter). It feeds only what its cache has not seen:
    all but the last prompt token at begin, then at each propose the last step's kept tokens and
    the target's; after feedback the cache keeps the context and the accepted drafts. A subclass
    says how: `_start()` (a fresh cache), `_step(tokens)` (feed them; the logits (1, vocab) for
    the token after them), `_length()` (tokens the cache holds) and `_crop(n)`."""

    def __init__(self, model, name: str | None = None):
        self.model = model
        if name:
            self.name = name

    def begin(self, prompt_ids, processor, generator, device, hidden=None, trees=False) -> None:
        self.processor, self.generator, self.device = processor, generator, device
        self.base = 0  # context length at the last propose
        self.drafted = False  # did this step's propose feed drafts the cache must drop again?
        self._start()
        if len(prompt_ids) > 1:  # prefill all but the last prompt token; propose feeds the rest
            self._step(torch.as_tensor(prompt_ids[:-1], dtype=torch.long, device=device))

    def propose(self, ids, k, min_confidence=0.0) -> Draft:
        if k < 1:
            return empty_draft(self.device)
        self.base, self.drafted = len(ids), True
        logits = self._step(torch.as_tensor(ids[self._length():], dtype=torch.long, device=self.device))
        return autoregressive_draft(self.processor, self.generator, logits, k, min_confidence, self._step)

    def feedback(self, accepted: int, hidden=None, path=None) -> None:
        # The cache holds context + drafts[:-1]; only context + drafts[:accepted] stay valid. A step
        # this drafter sat out (dynamic k chose 0, the last token) fed nothing to take back.
        if self.drafted:
            self.drafted = False
            self._crop(min(self._length(), self.base + accepted))


def features_read(drafter: Drafter | None) -> bool | tuple[int, ...]:
    """What a run asks the target's forward for on the drafter's behalf, as forward's `hidden`
    takes it: False (nothing), True (the final hidden states: Medusa, EAGLE) or the decoder
    layers whose inputs it reads (EAGLE-3's hidden_layers)."""
    if drafter is None or not drafter.needs_hidden:
        return False
    return drafter.hidden_layers or True


def empty_draft(device) -> Draft:
    return Draft(torch.empty(0, dtype=torch.long, device=device), None)


def special_ids(tokenizer) -> frozenset[int]:
    """The tokenizer's special tokens (chat-template markers, end of text): never drafted by a
    drafter that copies ids from the text (`without_special`)."""
    return frozenset(int(t) for t in (getattr(tokenizer, "all_special_ids", None) or ()))


def without_special(draft: Draft, special: frozenset[int]) -> Draft:
    """`draft` less its special tokens, the one filter of the drafters that copy ids from the text
    (prompt lookup, suffix decoding): the chat template writes `<|im_start|>` into every prompt and
    every remembered answer, so a copy would otherwise propose it where the answer never holds it,
    and the page would show it struck through. A chain stops before its first special token; a
    tree loses each special node and the nodes under it.

    A sampled chain's kept rows are q restricted to the other tokens and renormalised: row i's
    token was drawn from q_i and kept only if it was not special, so given that it was kept it
    was drawn from that restriction, which is the q the verifier must judge it by; with the rest
    of q_i's mass the chain ends there and the target draws position i from p itself, so the
    output at i is still p exactly (the target writes a special token itself where it belongs)."""
    if not special or not draft.tokens.numel():
        return draft
    ids = draft.tokens.tolist()
    if draft.parents is None:
        cut = next((i for i, t in enumerate(ids) if t in special), len(ids))
        if cut == len(ids):
            return draft
        if not cut:
            return empty_draft(draft.tokens.device)
        q = None
        if draft.q is not None:
            q = draft.q[:cut].clone()
            q[:, sorted(t for t in special if t < q.shape[1])] = 0
            q /= q.sum(dim=1, keepdim=True)
        return Draft(draft.tokens[:cut], q)
    if draft.q is not None:
        raise ValueError("a drawn tree's special tokens cannot be dropped after the draw")
    keep, new = [], {}  # new[i]: node i's index in the kept tree
    for i, (t, parent) in enumerate(zip(ids, draft.parents)):
        if t not in special and (parent < 0 or parent in new):
            new[i] = len(keep)
            keep.append(i)
    if len(keep) == len(ids):
        return draft
    if not keep:
        return empty_draft(draft.tokens.device)
    parents = tuple(-1 if draft.parents[i] < 0 else new[draft.parents[i]] for i in keep)
    tokens = draft.tokens[torch.tensor(keep, device=draft.tokens.device)]
    chain = parents == tuple(range(-1, len(parents) - 1))
    return Draft(tokens, None, None if chain else parents)
