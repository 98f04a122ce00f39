"""Token ids to display text, one piece per token, never half a character.

Byte-level BPE (GPT-2, SmolLM2, Llama 3) and SentencePiece byte fallback split one
character's UTF-8 bytes over several tokens: an emoji is often four. Decoding a token that
ends mid-character gives U+FFFD. So a `Detokenizer` decodes the stream cumulatively and
hands out text only once it no longer ends in an incomplete character: the token that
completes a character carries all of it and the tokens before it carry "". A stream that
ends mid-character keeps that last character back: there are no bytes to complete it.

A token's text also depends on the tokens before it (SentencePiece drops a word's leading
space at the start of a decode; byte fallback turns a whole run of byte tokens into U+FFFD
when the run is not valid UTF-8), so every decode starts a few settled tokens back, at a
token where decoding from there gives the same text as decoding from the stream's start:
not a byte-fallback token <0xNN> (a window must not cut a run of them), and with the
window's own text the tail of the text so far (not starting mid-character). Each push
decodes that window and the tokens after it, so labelling costs the same at the ten
thousandth token as at the first. Every piece is the one decoding the whole stream at every
push would give (tests/test_detok.py checks that on adversarial streams), except after a
byte-fallback run longer than REACH tokens that holds whole characters and then turns out
not to be UTF-8: no valid text reads like that.

labels.Labeler labels each run with one Detokenizer: the app, the CLI, the API and a saved
trace all show the same text.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable

INCOMPLETE = "\ufffd"  # what a UTF-8 decoder writes for bytes that are not (yet) a character
CONTEXT = 4  # settled tokens decoded before the new ones, at the least
WINDOW = 12  # settled tokens kept before the window is cut back (each cut costs decodes)
REACH = 64  # the most settled tokens a cut keeps while looking for a byte-fallback run's start
STUCK = 64  # pending tokens after which bytes that never complete a character show as U+FFFD
BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # SentencePiece's byte fallback


class _Starts:
    """Which tokens a window may start at: any but a byte-fallback token (it may be in a run
    the window would cut). Shared by a stream and its forks; without a tokenizer, any."""

    def __init__(self, tokenizer):
        self.tokenizer, self.known = tokenizer, {}

    def __call__(self, token: int) -> bool:
        if self.tokenizer is None:
            return True
        if token not in self.known:
            raw = self.tokenizer.convert_ids_to_tokens(token)
            self.known[token] = not (isinstance(raw, str) and BYTE_TOKEN.fullmatch(raw))
        return self.known[token]


class Detokenizer:
    """The text of a growing token stream, handed out token by token as characters complete.

    decode: token ids to text. context: the tokens before the stream (a prompt), decoded
    once. tokenizer: where decode comes from, to tell byte-fallback tokens (optional:
    without it, a window may start inside a byte-fallback run)."""

    def __init__(self, decode: Callable[[list[int]], str], context: Iterable[int] = (), tokenizer=None):
        self.decode = decode
        self.starts = _Starts(tokenizer)
        ids = [int(t) for t in context]
        # settled tokens (all their text is out) and the length of their own text
        self.context, self.base = self._window(ids, decode(ids)) if ids else ([], 0)
        self.pending: list[int] = []  # tokens after them, some of whose text is still held back
        self.shown = 0  # characters of the pending tokens' text already handed out

    def push(self, token: int, final: bool = False) -> str:
        """Add `token`; return the text it completes ("" while a character is still open).

        final: hand out whatever is there, an open character as U+FFFD (for one-off views
        of a candidate token, never for a run's output).
        """
        self.pending.append(int(token))
        return self._advance(self.decode(self.context + self.pending), final)

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.push(t) for t in ids]

    def peek(self, token: int) -> str:
        """What push(token, final=True) would return, leaving the stream as it is."""
        return self.decode(self.context + self.pending + [int(token)])[self.base + self.shown:]

    def branch(self, token: int) -> tuple[str, "Detokenizer"]:
        """peek(token), and a fork that pushed `token`: from one decode (tree nodes)."""
        other = self.fork()
        other.pending.append(int(token))
        text = self.decode(other.context + other.pending)
        whole = text[other.base + other.shown:]
        other._advance(text, False)
        return whole, other

    def fork(self) -> "Detokenizer":
        """An independent copy: to label drafts that may be thrown away."""
        other = object.__new__(Detokenizer)
        other.__dict__.update(self.__dict__, context=list(self.context), pending=list(self.pending))
        return other

    def _advance(self, text: str, final: bool) -> str:
        """Hand out what `text`, the decode of context + pending, completes."""
        settled = text.rstrip(INCOMPLETE)
        if final or len(self.pending) >= STUCK:
            settled = text
        piece = settled[self.base + self.shown:]
        self.shown += len(piece)
        if len(settled) == len(text):  # nothing held back: the pending tokens become context
            self.context, self.base = self._window(self.context + self.pending, text)
            self.pending, self.shown = [], 0
        return piece

    def _window(self, ids: list[int], text: str) -> tuple[list[int], int]:
        """The settled tokens to decode before new ones, a suffix of `ids` (whose own decode,
        `text`, is right past the current base), and the length of their text.

        Kept whole up to WINDOW tokens: a window that starts where the last one did decodes
        new tokens as the whole stream does. Longer, it is cut back to the shortest suffix of
        at least CONTEXT tokens that starts at a token other than a byte-fallback token and
        decodes to the end of `text`; inside a byte-fallback run longer than REACH tokens,
        to one that at least starts at a character."""
        if len(ids) <= WINDOW:
            return ids, len(text)
        cut = None
        for n in range(CONTEXT, min(REACH, len(ids)) + 1):
            suffix = ids[-n:]
            safe = n == len(ids) or self.starts(suffix[0])
            if not safe and cut is not None:
                continue
            own = text if n == len(ids) else self.decode(suffix)
            if own and text.endswith(own):
                if safe:
                    return suffix, len(own)
                cut = suffix, len(own)
        return cut or (ids[-REACH:], len(self.decode(ids[-REACH:])))


def settled_text(decode: Callable[[list[int]], str], ids: Iterable[int], tokenizer=None) -> str:
    """The text of `ids` without a last character they leave unfinished."""
    return "".join(Detokenizer(decode, tokenizer=tokenizer).pieces(ids))


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE (GPT-2 and its descendants, SmolLM2 among them) writes each byte as a
    printable character: printable Latin-1 bytes stand for themselves, the other bytes for
    the characters from U+0100 on, in byte order. This maps those characters back."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    alphabet = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in alphabet.values()]
    alphabet.update({chr(256 + i): b for i, b in enumerate(others)})
    return alphabet


BYTE_LEVEL = _byte_level_alphabet()


def alone(tokenizer, token: int, text: str) -> str:
    """A candidate token's text on its own (top-k lists, the distribution view). Where it is
    only part of a character, its bytes instead of U+FFFD: 'Hello \\xf0\\x9f' says what the
    token holds, '�' does not. `text` is its plain decode; returned as is when whole."""
    if INCOMPLETE not in text or tokenizer is None:
        return text
    raw = tokenizer.convert_ids_to_tokens(int(token))
    if not isinstance(raw, str) or not raw:
        return text
    if raw.startswith("<0x") and raw.endswith(">") and len(raw) == 6:  # SentencePiece's byte fallback
        data = bytes([int(raw[3:5], 16)])
    elif all(ch in BYTE_LEVEL for ch in raw):
        data = bytes(BYTE_LEVEL[ch] for ch in raw)
    else:
        return text
    return data.decode("utf-8", errors="backslashreplace")
