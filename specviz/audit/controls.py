"""Verifiers that are deliberately not exact, so an audit can show it would catch one.

`RawQ` wraps a drafter that drafts autoregressively (a draft model, the distilled drafter) and
repeats transformers issue #47932: each draft token is drawn from the drafter's *processed*
distribution (temperature, top-k, top-p), but the q handed to verification is the drafter's raw
softmax, taken before those warpers. Rejection sampling then accepts with min(1, p / q_raw) and
resamples from max(p - q_raw, 0): the tokens no longer follow p. With no warper to skip
(temperature 1, no top-k or top-p) the two q's are one and the control is exact again.

`Typical` is Medusa's typical acceptance (Cai et al. 2024, arXiv 2401.10774), lossy by design: a
draft token is kept when the target gives it more than min(epsilon, delta exp(-H(p))), H the
entropy of the target's row, with no random draw and no q; the token after the kept ones is then
sampled from the target's p (Medusa also cuts that row at the threshold: not done here, so the
acceptance alone is on trial). Tokens the drafter likes and the target finds plausible come out
more often than the target would write them. The engine holds only exact rules, so this one runs
in a loop of its own (the engine's steps, with the rule swapped) that no setting of `generate` reaches.

The other lossy rule the audit is shown against is transformers' own `assistant_ensemble_weight`
(DIVERSE verification: accept against w p + (1 - w) q), lossy by design (engines.Generate).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from ..core.errors import SpecvizError
from ..core.sampling import Processor, Sampling, fit_vocab, sample
from ..core.verify import accepted_length
from ..drafters.base import Draft, Drafter, features_read
from ..modeling.forward import forward, model_device, new_cache, output_vocab_size, rollback
from .engines import Draw

# Medusa's defaults: posterior_threshold (epsilon) and posterior_alpha (delta).
EPSILON, DELTA = 0.09, 0.3


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


def typical_threshold(p: torch.Tensor, epsilon: float = EPSILON, delta: float = DELTA) -> torch.Tensor:
    """Medusa's acceptance threshold per row of target probabilities: min(epsilon, delta exp(-H(p)))."""
    entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    return torch.clamp(delta * torch.exp(-entropy), max=epsilon)


def typical_accepted(p: torch.Tensor, draft: torch.Tensor, epsilon: float = EPSILON,
                     delta: float = DELTA) -> torch.Tensor:
    """How many leading draft tokens typical acceptance keeps (p: k + 1 rows, draft: k tokens)."""
    k = draft.numel()
    return accepted_length(p[torch.arange(k), draft] > typical_threshold(p[:k], epsilon, delta))


class Typical:
    """specviz's steps with Medusa's typical acceptance (module doc), as an audit engine like
    engines.Local: one short completion per seed. `drafter` drafts chains without the target's
    hidden states (prompt lookup, a draft model); its q, if any, is ignored, as Medusa ignores it."""

    def __init__(self, model, drafter: Drafter, prompt_ids: list[int], sampling: Sampling, tokens: int, k: int = 4,
                 eos: tuple[int, ...] = (), epsilon: float = EPSILON, delta: float = DELTA):
        if features_read(drafter):
            raise SpecvizError(f"Medusa's typical acceptance is a control for drafters that read no hidden states "
                               f"(pld, a draft model), not {drafter.name}")
        self.model, self.drafter, self.prompt = model, drafter, list(prompt_ids)
        self.sampling, self.tokens, self.k, self.eos = sampling, tokens, k, set(eos)
        self.epsilon, self.delta = epsilon, delta

    def settings(self) -> dict:
        shown = {k: v for k, v in self.sampling.__dict__.items() if k != "seed"}
        return {"engine": "specviz", **shown, "k": self.k,
                "verification": f"Medusa's typical acceptance (epsilon {self.epsilon:g}, delta {self.delta:g}; lossy by design)",
                "mapping": "the settings as given (the engine's own sampler)"}

    @torch.inference_mode()
    def draw(self, seed: int) -> Draw:
        dev, ids = model_device(self.model), list(self.prompt)
        generator = torch.Generator(device=dev).manual_seed(seed)
        processor = Processor(replace(self.sampling, seed=seed), output_vocab_size(self.model), ids, dev)
        # The cache holds all but the pending token; each step verifies it with the draft in one forward.
        cache = new_cache(self.model)
        if len(ids) > 1:
            forward(self.model, torch.tensor(ids[:-1], device=dev), cache, logits_to_keep=1)
        pending = torch.tensor(ids[-1:], device=dev)
        self.drafter.begin(ids, processor, generator, dev)
        out, drafted, accepted = [], 0, 0
        while len(out) < self.tokens and not self.eos.intersection(out):
            d = self.drafter.propose(ids, self.k).tokens  # may be empty (prompt lookup found nothing)
            p = processor.probs(forward(self.model, torch.cat([pending, d]), cache), d, start=0)
            n = int(typical_accepted(p, d, self.epsilon, self.delta))  # kept for passing the threshold: no draw, no q
            token = int(sample(p[n], generator))  # the target's own row, not a residual
            rollback(cache, len(ids) + n)
            self.drafter.feedback(n)
            emitted = d[:n].tolist() + [token]
            for i, t in enumerate(emitted):
                if t in self.eos:  # an end of turn ends the completion, as the engine cuts it
                    emitted = emitted[:i + 1]
                    break
            ids += emitted
            processor.update(emitted)
            out += emitted
            pending = torch.tensor([token], device=dev)
            drafted, accepted = drafted + d.numel(), accepted + n
        return Draw(tuple(out[:self.tokens]), drafted=drafted, accepted=accepted)
