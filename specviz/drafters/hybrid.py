"""A copying drafter where the text repeats, a model drafter everywhere else.

Copying and predicting fail in different places. When the context's tail occurred before
(prompt lookup: its last n >= 2 tokens; suffix decoding: a match whose continuations are
expected to keep at least a couple of tokens), what followed then is a free and often long
guess (on the embedded model's own answers a 3-gram match kept 2.6 of 4 drafted tokens);
when it did not, the copier has nothing or a weak guess, and a trained head (EAGLE, Medusa,
a draft model) predicts instead. The switch is made per step from the context alone
(`plan`, then the copier's `sure`), before anything is drawn, so every draft is still one
drafter's draft verified by the usual rule: greedy output stays the target's, and sampling
stays exact. Serving engines do the same (Snowflake's Arctic Inference pairs suffix decoding
with its trained speculators and drafts from the suffix tree when its score beats theirs).

Both drafters follow the whole run: the one that did not draft a step is told
`feedback(0, hidden)`, as after a step where dynamic k drafted nothing, so a feature-reading
head still receives the target's states of every kept token.
"""
from __future__ import annotations

from .base import Draft, Drafter
from .prompt_lookup import PromptLookup

MODEL = 0  # the plan's kind for a step the model drafts; the copiers' kinds are >= 1


class Hybrid(Drafter):
    def __init__(self, model: Drafter, copier: Drafter | None = None, min_match: int = 2, label: str = ""):
        """copier: prompt lookup (default; it copies after an n-gram match of at least
        `min_match` tokens) or suffix decoding; anything with plan, sure and propose. label: the model
        drafter as the page names it ("EAGLE"), for the steps it drafts (its code name, "eagle", otherwise)."""
        copier = copier if copier is not None else PromptLookup(sure_match=min_match)
        if isinstance(model, Hybrid) or getattr(model, "sure", None) is not None:
            raise ValueError("a hybrid pairs a copying drafter with a model drafter (eagle, medusa, draft, ...)")
        self.model, self.copier = model, copier
        self.name = f"{model.name} + {copier.name}"
        self.needs_hidden, self.hidden_layers = model.needs_hidden, model.hidden_layers
        self.copying = False  # this step's draft comes from the copier
        self.label = label or model.name

    @property
    def tree_width(self) -> int:
        """The drafter's whose step it is (prompt lookup's copies are chains)."""
        return self.copier.tree_width if self.copying else self.model.tree_width

    def begin(self, prompt_ids, processor, generator, device, hidden=None, trees=False) -> None:
        self.copier.begin(prompt_ids, processor, generator, device, trees=trees)
        self.model.begin(prompt_ids, processor, generator, device, hidden=hidden, trees=trees)
        self.copying = False

    def plan(self, ids) -> int | None:
        kind = self.copier.plan(ids)
        self.copying = self.copier.sure(kind)
        return kind if self.copying else MODEL

    def describe(self, kind: int | None) -> str:
        return self.label if kind == MODEL else self.copier.describe(kind)

    def propose(self, ids, k, min_confidence=0.0) -> Draft:
        if self.copying:
            return self.copier.propose(ids, k, min_confidence)
        return self.model.propose(ids, k, min_confidence)

    def feedback(self, accepted: int, hidden=None, path=None) -> None:
        if self.copying:
            self.model.feedback(0, hidden=hidden)  # it drafted nothing: only the target's states
        else:
            self.model.feedback(accepted, hidden=hidden, path=path)

    def finish(self, output_ids) -> None:
        self.copier.finish(output_ids)
        self.model.finish(output_ids)
