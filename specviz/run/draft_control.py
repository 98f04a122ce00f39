"""Draft-length controllers on one prepared run, for every entry point: the record made, its identity (the
target's and tokenizer's fingerprints, the drafter as named), each controller replayed, and a controller
raced live to check its replay (generate --controller, bench --controllers, the page's section)."""
from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass, replace

from ..core.errors import SpecvizError
from ..core.events import RunEnd, StepEvent
from ..drafters.trained import fingerprint
from ..engine import controller_names
from ..engine.draft_record import DraftRecord, Identity, make_record
from ..engine.draft_replay import Rates, Replayed, hindsight, prices, replay
from ..engine.generate import GenerationConfig, speculative_generate

_PRINTS: "weakref.WeakKeyDictionary[object, tuple[str, str]]" = weakref.WeakKeyDictionary()


def identity(target, drafter: str) -> Identity:
    """A models.Loaded's fingerprints (weights sampled, vocabulary hashed; kept while it lives) and the drafter."""
    if target not in _PRINTS:
        vocab = sorted(target.tokenizer.get_vocab().items())
        _PRINTS[target] = (fingerprint(target.model)[:16], hashlib.sha256(repr(vocab).encode()).hexdigest()[:16])
    model, tokenizer = _PRINTS[target]
    return Identity(model, tokenizer, drafter.strip())


def record(target, drafter, ids, cfg: GenerationConfig, drafter_name: str, curve, should_stop=None) -> DraftRecord:
    """The draft record of `drafter` on this prompt and settings; `curve`: the target's VerifyCurve on this
    machine (prepare.warm measures it), whose v(m) prices every replayed step."""
    if curve is None:
        raise SpecvizError("replaying controllers needs this machine's verify-cost curve, which could not be measured")
    return make_record(target.model, drafter, ids, cfg, curve.cost, identity(target, drafter_name), should_stop)


def replay_all(rec: DraftRecord, names: list[str]) -> list[Replayed]:
    """Each controller replayed, then the hindsight best; fastest first."""
    out = [replay(rec, n) for n in controller_names.expand(names)]
    return sorted(out, key=lambda r: -r.tokens_per_s) + [hindsight(rec)]


@dataclass(frozen=True)
class Live(Rates):
    """One controller run live on the record's prompt: what it did, to set beside its replay."""

    controller: str
    token_ids: tuple[int, ...]
    drafted: tuple[int, ...]
    tokens: int
    passes: int
    seconds: float
    stopped: bool = False  # cut short (Stop, or a hosted app's time limit) before the run's end


def live(target, drafter, ids, cfg: GenerationConfig, rec: DraftRecord, name: str, drafter_name: str,
         should_stop=None) -> Live:
    """Controller `name` live, given the record's prices (so specviz's own decides as its replay does); a
    record made for another model, tokenizer or drafter is refused."""
    rec.check(identity(target, drafter_name))
    controller = controller_names.build(name, prices(rec))
    events = speculative_generate(target.model, drafter, ids, replace(cfg, controller=""), should_stop=should_stop,
                                  remember=False, controller=controller)
    steps, end = [], None
    for e in events:
        if isinstance(e, StepEvent):
            steps.append(len(e.draft))
        elif isinstance(e, RunEnd):
            end = e
    s = end.stats
    return Live(controller.name, end.token_ids, tuple(steps), s.tokens, s.steps, s.elapsed,
                s.stop_reason == "cancelled")


def agrees(r: Replayed, run: Live) -> bool:
    """Did the live run do what its replay said: the same drafts step by step, so the same passes (greedy)."""
    return r.exact and run.drafted == r.drafted and run.passes == r.passes
