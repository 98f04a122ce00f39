"""Suffix decoding's memory across requests: the earlier answers, capped, savable.

The paper keeps one global suffix tree over earlier responses beside each request's own
tree over its prompt (SuffixDecoding, Oliaro et al. 2024/2025; Arctic Inference's
SuffixDecodingCache). Here that global part is a SuffixMemory: answers are added when a run
ends (never during it, so a run's drafts depend on its context and on what came before it
only), and the oldest are dropped when the total passes `max_tokens`.

Whose memory it is decides what it may leak. The CLI and the library share one per process
(`process_memory`, or a file: `--suffix-memory FILE`); the app gives each visitor their own,
inside the visitor's session, so one visitor's answers never draft for another and leave
with the session.
"""
from __future__ import annotations

import json
import os
import pathlib

from ..core.errors import SpecvizError
from .suffix_index import SuffixIndex

FORMAT = "specviz-suffix-memory"
DEFAULT_TOKENS = 65536  # ~6 MB of Python ints and index lists; a visitor's cap is the app policy's
MAX_FILE_BYTES = 64 << 20


class SuffixMemory:
    """Earlier answers (token ids), oldest first, at most `max_tokens` tokens in all."""

    def __init__(self, max_tokens: int = DEFAULT_TOKENS):
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise SpecvizError(f"a suffix memory holds at least one token, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.index = SuffixIndex()
        self.next_id = 0

    def __len__(self) -> int:
        """Tokens held."""
        return len(self.index)

    @property
    def sequences(self) -> list[list[int]]:
        return [list(s) for s in self.index.seqs.values()]

    def add(self, tokens) -> None:
        """Remember one answer; drop the oldest answers while the total is over the cap (an
        answer longer than the cap keeps its last `max_tokens` tokens)."""
        tokens = [int(t) for t in tokens][-self.max_tokens:]
        if not tokens:
            return
        self.index.extend(self.next_id, tokens)
        self.next_id += 1
        while len(self.index) > self.max_tokens:
            self.index.remove(next(iter(self.index.seqs)))

    def clear(self) -> None:
        self.index = SuffixIndex()

    def save(self, path) -> None:
        """Write the memory as JSON (token ids only: no text)."""
        doc = {"format": FORMAT, "version": 1, "max_tokens": self.max_tokens, "sequences": self.sequences}
        path = pathlib.Path(path).expanduser()
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
            os.replace(tmp, path)  # a crash mid-write leaves the old file whole
        except OSError as e:
            raise SpecvizError(f"cannot write the suffix memory to {path}: {e.strerror or e}") from None

    @classmethod
    def load(cls, path, max_tokens: int | None = None) -> "SuffixMemory":
        """A memory saved by `save`; SpecvizError with one sentence for anything else."""
        path = pathlib.Path(path).expanduser()
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                raise SpecvizError(f"{path} is over {MAX_FILE_BYTES >> 20} MB: not a suffix memory this app reads")
            doc = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise SpecvizError(f"cannot read the suffix memory {path}: {e.strerror or e}") from None
        except (ValueError, UnicodeDecodeError):
            raise SpecvizError(f"{path} is not a suffix memory (not JSON)") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise SpecvizError(f"{path} is not a suffix memory (no \"format\": \"{FORMAT}\")")
        seqs, cap = doc.get("sequences"), doc.get("max_tokens")
        ok_cap = isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1
        if not ok_cap or not isinstance(seqs, list) or not all(_token_list(s) for s in seqs):
            raise SpecvizError(f"{path} is a damaged suffix memory: it needs a positive max_tokens and "
                               "sequences that are lists of token ids")
        memory = cls(max_tokens if max_tokens is not None else cap)
        for s in seqs:
            memory.add(s)
        return memory


def _token_list(s) -> bool:
    return isinstance(s, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 31 for t in s)


_PROCESS = None


def process_memory() -> SuffixMemory:
    """The CLI's and the library's memory: one per process, made when first asked for. The
    app never uses it (a visitor's memory lives in their session)."""
    global _PROCESS
    if _PROCESS is None:
        _PROCESS = SuffixMemory()
    return _PROCESS
