"""How degenerate a text is, from its token ids: the longest run of one token repeated, and distinct-2
(distinct adjacent token pairs / all adjacent pairs; Li et al. 2016's diversity measure).

A looping text is easy to draft: "and and and" or "a lone soul, a lone soul" is copied from itself, so
acceptance is high exactly where the output is worthless. The page sets this beside the acceptance chart
so that a high acceptance rate over a degenerate text does not read as success.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

LONG_RUN = 4  # one token this many times in a row: "and and and and"
LOW_DISTINCT = 0.5  # under half the adjacent pairs distinct: the text repeats itself
MIN_PAIRS = 8  # fewer adjacent pairs than this say nothing about distinct-2
HIGH_ACCEPTANCE = 0.6  # alpha at or above this, over a degenerate text: the warning


@dataclass(frozen=True)
class Degeneracy:
    tokens: int
    longest_run: int  # the longest run of one token id repeated back to back
    run_token: int | None  # the token of that run
    distinct_2: float | None  # None: too few pairs to judge

    @property
    def degenerate(self) -> bool:
        low = self.distinct_2 is not None and self.distinct_2 < LOW_DISTINCT
        return self.longest_run >= LONG_RUN or low

    def warns(self, alpha: float | None) -> bool:
        """High acceptance over a degenerate text: what must not read as success."""
        return self.degenerate and alpha is not None and alpha >= HIGH_ACCEPTANCE


def longest_run(ids: Sequence[int]) -> tuple[int, int | None]:
    """(length, token) of the longest run of one token back to back (the first such run on ties)."""
    best, token, n = 0, None, 0
    for i, t in enumerate(ids):
        n = n + 1 if i and ids[i - 1] == t else 1
        if n > best:
            best, token = n, t
    return best, token


def distinct_2(ids: Sequence[int]) -> float | None:
    """Distinct adjacent pairs / adjacent pairs (None under MIN_PAIRS pairs)."""
    pairs = list(zip(ids, ids[1:]))
    return len(set(pairs)) / len(pairs) if len(pairs) >= MIN_PAIRS else None


def degeneracy(ids: Sequence[int]) -> Degeneracy:
    ids = [int(t) for t in ids]
    run, token = longest_run(ids)
    return Degeneracy(len(ids), run, token, distinct_2(ids))
