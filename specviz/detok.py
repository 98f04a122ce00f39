"""Token ids to display text, one piece per token, never half a character.

Byte-level BPE (GPT-2, SmolLM2, Llama 3) and SentencePiece byte fallback split one
character's UTF-8 bytes over several tokens: an emoji is often four. Decoding a token that
ends mid-character gives U+FFFD. So a `Detokenizer` decodes the stream cumulatively and
hands out text only once it no longer ends in an incomplete character: the token that
completes a character carries all of it and the tokens before it carry "". A stream that
ends mid-character keeps that last character back: there are no bytes to complete it.

A token's text also depends on the tokens before it (SentencePiece drops a word's leading
space at the start of a decode), so every decode starts a few settled tokens back.

labels.Labeler labels each run with one Detokenizer: the app, the CLI, the API and a saved
trace all show the same text.
"""
from __future__ import annotations

from typing import Callable, Iterable

INCOMPLETE = "\ufffd"  # what a UTF-8 decoder writes for bytes that are not (yet) a character
CONTEXT = 4  # settled tokens decoded before the new ones: enough for SentencePiece's spaces
STUCK = 64  # pending tokens after which bytes that never complete a character show as U+FFFD


class Detokenizer:
    """The text of a growing token stream, handed out token by token as characters complete."""

    def __init__(self, decode: Callable[[list[int]], str], context: Iterable[int] = ()):
        self.decode = decode
        self.context = list(context)[-CONTEXT:]  # settled tokens: all their text is out
        self.pending: list[int] = []  # tokens after them, some of whose text is still held back
        self.base = len(decode(self.context))  # characters of the context's own text
        self.shown = 0  # characters of the pending tokens' text already handed out

    def push(self, token: int, final: bool = False) -> str:
        """Add `token`; return the text it completes ("" while a character is still open).

        final: hand out whatever is there, an open character as U+FFFD (for one-off views
        of a candidate token, never for a run's output).
        """
        self.pending.append(token)
        text = self.decode(self.context + self.pending)
        settled = text.rstrip(INCOMPLETE)
        if final or len(self.pending) >= STUCK:
            settled = text
        piece = settled[self.base + self.shown:]
        self.shown += len(piece)
        if len(settled) == len(text):  # nothing held back: the pending tokens become context
            self.context = (self.context + self.pending)[-CONTEXT:]
            self.pending, self.shown = [], 0
            self.base = len(self.decode(self.context))
        return piece

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.push(int(t)) for t in ids]

    def fork(self) -> "Detokenizer":
        """An independent copy: to label drafts that may be thrown away."""
        other = object.__new__(Detokenizer)
        other.__dict__.update(self.__dict__, context=list(self.context), pending=list(self.pending))
        return other


def settled_text(decode: Callable[[list[int]], str], ids: Iterable[int]) -> str:
    """The text of `ids` without a last character they leave unfinished."""
    return "".join(Detokenizer(decode).pieces(ids))


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
