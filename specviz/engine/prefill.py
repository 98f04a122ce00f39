"""How much of a long prompt each prefill forward reads: pieces sized by time, not by a count.

Stop is heard between pieces, so a piece's time is how long Stop can wait. Fixed 512-token
pieces took 3-6 s each on a busy 2-core CPU (a 3,082-token prompt: Stop took 6.3 s) and a blink
on a GPU. So the first piece is small, and each next one is sized from the time per token the
last one measured to take about PIECE_SECONDS; the context's growth (attention reads every
earlier token) is caught piece by piece. The tokens and the cache are those of one pass whatever
the sizes (tests/test_engine.py checks token for token, drafts too).
"""
from __future__ import annotations

import time

PIECE_SECONDS = 0.4  # what each piece should take: Stop waits at most about this long
FIRST_PIECE = 64  # tokens read before any time is measured
SMALLEST = 16  # a piece never shrinks below this: a forward's fixed cost would dominate
GROWTH = 4  # a piece at most this many times the last: a fast first piece may have been luck
clock = time.perf_counter  # tests put a fake clock here


class PrefillPieces:
    """Sizes of the pieces one prefill reads: `next()` the size of the next, `took(size, seconds)`
    after each forward. `largest` caps them (the engine's PREFILL_CHUNK, or the whole prompt)."""

    def __init__(self, largest: int, seconds: float = PIECE_SECONDS):
        self.largest, self.seconds = max(1, largest), seconds
        self.size = min(FIRST_PIECE, self.largest)

    def next(self) -> int:
        return self.size

    def took(self, size: int, seconds: float) -> None:
        """The last piece of `size` tokens took `seconds`: the next takes about self.seconds."""
        grown = size * GROWTH
        fits = int(size * self.seconds / seconds) if seconds > 0 else grown
        self.size = max(min(SMALLEST, self.largest), min(fits, grown, self.largest))
