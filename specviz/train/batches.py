"""Which sequences each training step sees: seeded batches, and windows cropped out of long sequences.

A function of (seed, step) only, so a resumed run repeats an uninterrupted one exactly.
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from .data import Corpus, Seq


def crop(seq: Seq, start: int, length: int) -> Seq:
    """A window of a sequence (all per-position fields sliced alike)."""
    end = start + length
    return dataclasses.replace(seq, ids=seq.ids[start:end], response_start=max(0, seq.response_start - start),
                               hidden=seq.hidden[start:end], top_ids=seq.top_ids[start:end],
                               top_p=seq.top_p[start:end], taps=None if seq.taps is None else seq.taps[start:end])


def sample_batch(corpus: Corpus, step: int, batch: int, seed: int, window: int) -> list[Seq]:
    """Step `step`'s batch: the next `batch` sequences of a stream of epochs, each epoch a
    seeded shuffle visiting every sequence once. A function of (seed, step) only, so
    resuming repeats it exactly."""
    n = len(corpus.sequences)
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    out = []
    for j in range(step * batch, (step + 1) * batch):
        epoch, i = divmod(j, n)
        s = corpus.sequences[_shuffle(n, seed, epoch)[i]]
        if len(s.ids) > window:
            s = crop(s, int(torch.randint(len(s.ids) - window + 1, (1,), generator=g)), window)
        out.append(s)
    return out


@functools.lru_cache(maxsize=4)
def _shuffle(n: int, seed: int, epoch: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7_919 + epoch)).tolist()
