"""Display text for the tokens each engine event mentions (render/trace.py's Labels).

A token's text depends on the tokens before it (SentencePiece drops a word's leading space
at the start of a decode; byte-level BPE splits one character's UTF-8 bytes over several
tokens), so the panels' text comes from one detok.Detokenizer per run: a token that ends
mid-character shows "" and the one that completes it the whole character. The candidates
of the top-k lists are shown each on its own (a piece of a character as its bytes). The app, the CLI and a saved
trace (trace_file.py) all label with this one class, so a replay shows what the run showed.
"""
from __future__ import annotations

from ..core.events import StepEvent
from ..modeling.detok import Detokenizer, alone
from ..render.trace import Labels


class Labeler:
    """Display text of each event's tokens, in the context of the run's output so far."""

    def __init__(self, models, loaded, prompt_ids: list[int]):
        self.models, self.loaded = models, loaded
        tokenizer = getattr(loaded, "tokenizer", None)
        self.out = Detokenizer(lambda ids: models.decode(loaded, ids), prompt_ids, tokenizer)  # the output so far
        self._alone: dict[int, str] = {}  # a token's text on its own, decoded once per run

    def _text(self, token: int) -> str:
        if token not in self._alone:
            text = self.models.decode(self.loaded, [token])
            self._alone[token] = alone(getattr(self.loaded, "tokenizer", None), token, text)
        return self._alone[token]

    def _row(self, pairs) -> tuple[str, ...]:
        return tuple(self._text(t) for t, _ in pairs)

    def label(self, event) -> Labels:
        if isinstance(event, StepEvent):
            # One pass over the draft: the kept drafts, then the own token where they end (a
            # fork), then the rejected drafts where proposed. The output moves on by the
            # emitted tokens, which are the kept drafts and the own token unless cut at EOS.
            drafts = self.out.fork()
            kept = drafts.pieces(event.draft[: event.accepted])
            at_token = drafts.fork()
            token = at_token.push(event.token)
            draft = tuple(kept + drafts.pieces(event.draft[event.accepted:]))
            tree = self._tree(event.tree) if event.tree is not None else ()
            rows = {name: tuple(map(self._row, getattr(event, name))) for name in ("p_top", "q_top", "p_raw", "q_raw")}
            if tuple(event.emitted) == tuple(event.draft[: event.accepted]) + (event.token,):
                self.out = at_token
            else:
                self.out.pieces(event.emitted)
        else:
            draft, tree, rows = (), (), {}
            token = self.out.push(event.token)
        return Labels(draft=draft, token=token, top=self._row(event.top), tree=tree, **rows)

    def _tree(self, tree) -> tuple[str, ...]:
        """Each node's text in the context of its own branch (an open character as U+FFFD):
        one decode per node, from its parent's stream, whatever the tree's depth."""
        tokens, parents = tree.tokens, tree.parents
        streams, whole = {-1: self.out}, {}  # node -> the output plus its branch; its text

        def stream(i):
            if i not in streams:
                whole[i], streams[i] = stream(parents[i]).branch(tokens[i])
            return streams[i]

        for i in sorted({p for p in parents if p >= 0}):  # nodes with children
            stream(i)
        return tuple(whole[i] if i in whole else stream(parents[i]).peek(t) for i, t in enumerate(tokens))
