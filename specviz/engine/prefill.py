"""How much of a long prompt each prefill forward reads: pieces sized by time, not by a count.

Stop is heard between pieces, so a piece's time is how long Stop can wait. Fixed 512-token
pieces took 3-6 s each on a busy 2-core CPU (a 3,082-token prompt: Stop took 6.3 s) and a blink
on a GPU. So the first piece is small, and each next one is sized from the time per token the
last one measured to take about PIECE_SECONDS; the context's growth (attention reads every
earlier token) is caught piece by piece. The tokens and the cache are those of one pass whatever
the sizes (tests/test_engine.py checks token for token, drafts too) up to rounding: in bfloat16 a
forward over 64 tokens and one over 100 round differently, and on the embedded model a baseline
read in other pieces than its speculative run parted from it at the first token. So the pieces a
model read a prompt in are kept, and the next run of that prompt on that model (the race's other
run, the bench's next arm) reads the very same ones.
"""
from __future__ import annotations

import time
import weakref
from collections import OrderedDict

PIECE_SECONDS = 0.4  # what each piece should take: Stop waits at most about this long
FIRST_PIECE = 64  # tokens read before any time is measured
SMALLEST = 16  # a piece never shrinks below this: a forward's fixed cost would dominate
GROWTH = 4  # a piece at most this many times the last: a fast first piece may have been luck
clock = time.perf_counter  # tests put a fake clock here
KEPT = 8  # prompts whose pieces are kept, per model


class PrefillPieces:
    """Sizes of the pieces one prefill reads: `next()` the size of the next, `took(size, seconds)`
    after each forward. `largest` caps them (the engine's PREFILL_CHUNK, or the whole prompt)."""

    def __init__(self, largest: int, seconds: float = PIECE_SECONDS, sizes: list[int] | None = None):
        self.largest, self.seconds = max(1, largest), seconds
        self.size = min(FIRST_PIECE, self.largest)
        self.sizes = [] if sizes is None else sizes  # decided so far, by this run or an earlier one
        self.read = 0  # pieces read

    def next(self) -> int:
        return self.sizes[self.read] if self.read < len(self.sizes) else self.size

    def took(self, size: int, seconds: float) -> None:
        """The last piece of `size` tokens took `seconds`: the next takes about self.seconds."""
        if self.read == len(self.sizes):
            self.sizes.append(size)  # a new decision, which later runs of the prompt follow
        self.read += 1
        grown = size * GROWTH
        fits = int(size * self.seconds / seconds) if seconds > 0 else grown
        self.size = max(min(SMALLEST, self.largest), min(fits, grown, self.largest))


_kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {prompt key: sizes}


def pieces_for(model, ids: list[int], largest: int) -> PrefillPieces:
    """The pieces to read `ids` in: those an earlier run of the same prompt on `model` read (so two
    runs of one prompt are cut in the same places), sized by time where it stopped or none ran."""
    prompts = _kept.setdefault(model, OrderedDict())
    key = (largest, len(ids), hash(tuple(ids)))
    sizes = prompts.setdefault(key, [])
    prompts.move_to_end(key)
    while len(prompts) > KEPT:
        prompts.popitem(last=False)
    return PrefillPieces(largest, sizes=sizes)
