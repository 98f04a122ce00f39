"""A verifier that is deliberately not exact, so an audit can show it would catch one.

`RawQ` wraps a drafter that drafts autoregressively (a draft model, the distilled drafter) and
repeats transformers issue #47932: each draft token is drawn from the drafter's *processed*
distribution (temperature, top-k, top-p), but the q handed to verification is the drafter's raw
softmax, taken before those warpers. Rejection sampling then accepts with min(1, p / q_raw) and
resamples from max(p - q_raw, 0): the tokens no longer follow p. With no warper to skip
(temperature 1, no top-k or top-p) the two q's are one and the control is exact again.

The other lossy rule the audit is shown against is transformers' own `assistant_ensemble_weight`
(DIVERSE verification: accept against w p + (1 - w) q), lossy by design (engines.Generate).
"""
from __future__ import annotations

import torch

from ..core.sampling import fit_vocab
from ..drafters.base import Draft, Drafter


class _Recording:
    """The run's processor, noting the raw softmax of every row of logits it processes."""

    def __init__(self, processor):
        self.processor, self.raw = processor, []

    @property
    def s(self):
        return self.processor.s

    def probs(self, logits, draft=None, start=0, parents=None):
        rows = fit_vocab(logits.float(), self.processor.vocab_size)
        self.raw.extend(torch.softmax(rows, -1))
        return self.processor.probs(logits, draft, start, parents)

    def __getattr__(self, name):
        return getattr(self.processor, name)


class RawQ(Drafter):
    """`inner`'s drafts, verified against its raw q (module doc). `inner` must draft with the
    processor it is given (autoregressive_draft); a copying drafter (q None) has no q to spoil."""

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.name = f"{inner.name}, q before the warpers"
        self.needs_hidden, self.hidden_layers = inner.needs_hidden, inner.hidden_layers

    def begin(self, prompt_ids, processor, generator, device, hidden=None, trees=False) -> None:
        self.recording = _Recording(processor)
        self.inner.begin(prompt_ids, self.recording, generator, device, hidden=hidden, trees=False)

    def plan(self, ids):
        return self.inner.plan(ids)

    def propose(self, ids, k, min_confidence=0.0) -> Draft:
        self.recording.raw.clear()
        draft = self.inner.propose(ids, k, min_confidence)
        n = draft.tokens.numel()
        if draft.q is None or not n:
            return draft
        return Draft(draft.tokens, torch.stack(self.recording.raw[:n]))

    def feedback(self, accepted, hidden=None, path=None) -> None:
        self.inner.feedback(accepted, hidden=hidden, path=path)
