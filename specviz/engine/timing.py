"""Timing what the models themselves cost, apart from the engine around them.

`ForwardClock` adds up the seconds spent inside a model's forward (module hooks for
transformers' forward, forward.observe for specviz's fast path, so the engine needs no changes); `forward_costs` times target forwards over n new tokens on one
fixed cache state, the denominator of every cost ratio the benchmark reports.
Here, below the bench, because the verify-cost curve (verify_cost.py) measures with it too.
"""
from __future__ import annotations

import statistics
import time

import torch

from ..modeling.forward import forward, model_device, new_cache, observe, rollback, synchronize


class ForwardClock:
    """Seconds and calls spent in `model.forward` while attached (CPU-exact; GPU synchronises).

    `first` is the duration of the first call since `reset()`.
    """

    def __init__(self, model):
        self.model = model
        self.device = model_device(model)
        self.reset()
        self._t0 = 0.0
        self._hooks = []

    def __enter__(self) -> "ForwardClock":
        self._hooks = [
            self.model.register_forward_pre_hook(lambda module, args: self.start(module)),
            self.model.register_forward_hook(lambda module, args, output: self.stop(module)),
        ]
        observe(self.model, self)  # specviz's fast path does not call model.forward
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        observe(self.model, None)

    # forward.ForwardObserver, also called by the module hooks. A layer-skip drafter is a
    # shallow copy of the target that shares its hook tables, so hooks also fire for it:
    # count only calls on this very module.
    def start(self, module) -> None:
        if module is not self.model:
            return
        synchronize(self.device)
        self._t0 = time.perf_counter()

    def stop(self, module) -> None:
        if module is not self.model:
            return
        synchronize(self.device)
        dt = time.perf_counter() - self._t0
        if not self.calls:
            self.first = dt  # a run's first forward is its prefill
        self.seconds += dt
        self.calls += 1

    def reset(self) -> None:
        self.seconds, self.calls, self.first = 0.0, 0, 0.0


def forward_costs(model, prompt_ids: list[int], sizes, repeats: int = 3) -> dict[int, float]:
    """Median seconds of one forward over n new tokens, for each n in `sizes`.

    The cache holds the prompt (all but its last token, as the engine leaves it after
    prefill); each timed forward appends n tokens and is rolled back, so every size sees
    the same context. Sizes are interleaved across repeats, so drift hits them all, and
    each timed forward follows an untimed one of its own size: on a CPU whose caches hold
    a good part of the weights, a forward right after one of another size (which may read
    another copy of them, packing's grouped q/k/v and gate/up) runs slower than in a run of its own
    size, as plain decoding's steps do.
    """
    device = model_device(model)
    sizes = sorted(set(sizes) | {1})
    filler = (prompt_ids * (max(sizes) // max(len(prompt_ids), 1) + 1))[: max(sizes)]
    tokens = torch.tensor(filler, device=device)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    with torch.inference_mode():
        cache = new_cache(model)
        base = len(prompt_ids) - 1
        if base:
            forward(model, torch.tensor(prompt_ids[:-1], device=device), cache, logits_to_keep=1)
        forward(model, tokens[:1], cache)  # warm-up: first calls after a prefill run slow
        rollback(cache, base)
        for _ in range(repeats):
            for n in sizes:
                forward(model, tokens[:n], cache)
                rollback(cache, base)
                synchronize(device)
                t0 = time.perf_counter()
                forward(model, tokens[:n], cache)
                synchronize(device)
                times[n].append(time.perf_counter() - t0)
                rollback(cache, base)
    return {n: statistics.median(ts) if ts else 0.0 for n, ts in times.items()}
