"""Prompt lookup where the text repeats itself, a model drafter everywhere else.

Copying and predicting fail in different places. When the context's last n tokens occurred
before (n >= 2), what followed them then is a free and often long guess (on the embedded
model's own answers a 3-gram match kept 2.6 of 4 drafted tokens); when they did not, prompt
lookup has nothing or a weak 1-gram guess, and a trained head (EAGLE, Medusa, a draft model)
predicts instead. The switch is made per step from the context alone (`plan`), before
anything is drawn, so every draft is still one drafter's draft verified by the usual rule:
greedy output stays the target's, and sampling stays exact. Serving engines do the same
(Snowflake's Arctic Inference pairs suffix decoding with its trained speculators).

Both drafters follow the whole run: the one that did not draft a step is told
`feedback(0, hidden)`, as after a step where dynamic k drafted nothing, so a feature-reading
head still receives the target's states of every kept token.
"""
from __future__ import annotations

from .base import Draft, Drafter
from .prompt_lookup import PromptLookup

MODEL = 0  # the plan's kind for a step the model drafts; prompt lookup's kinds are its n >= 1


class Hybrid(Drafter):
    def __init__(self, model: Drafter, lookup: PromptLookup | None = None, min_match: int = 2):
        if isinstance(model, Hybrid) or isinstance(model, PromptLookup):
            raise ValueError("a hybrid pairs prompt lookup with a model drafter (eagle, medusa, draft, ...)")
        self.model, self.lookup, self.min_match = model, lookup or PromptLookup(), min_match
        self.name = f"{model.name} + prompt lookup"
        self.needs_hidden, self.hidden_layers = model.needs_hidden, model.hidden_layers
        self.copying = False  # this step's draft comes from prompt lookup

    @property
    def tree_width(self) -> int:
        """The model's, on the steps it drafts; copied drafts are chains."""
        return 0 if self.copying else self.model.tree_width

    @tree_width.setter
    def tree_width(self, width: int) -> None:
        self.model.tree_width = width

    def begin(self, prompt_ids, processor, generator, device, hidden=None, trees=False) -> None:
        self.lookup.begin(prompt_ids, processor, generator, device)
        self.model.begin(prompt_ids, processor, generator, device, hidden=hidden, trees=trees)
        self.copying = False

    def plan(self, ids) -> int | None:
        n = self.lookup.plan(ids)
        self.copying = n is not None and n >= self.min_match
        return n if self.copying else MODEL

    def describe(self, kind: int | None) -> str:
        return self.model.name if kind == MODEL else f"prompt lookup, {kind}-gram match"

    def propose(self, ids, k, min_confidence=0.0) -> Draft:
        if self.copying:
            return self.lookup.propose(ids, k)
        return self.model.propose(ids, k, min_confidence)

    def feedback(self, accepted: int, hidden=None, path=None) -> None:
        if self.copying:
            self.model.feedback(0, hidden=hidden)  # it drafted nothing: only the target's states
        else:
            self.model.feedback(accepted, hidden=hidden, path=path)
