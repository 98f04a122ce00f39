"""Display text for the tokens each engine event mentions (render/trace.py's Labels).

A token's text depends on the tokens before it (SentencePiece drops a word's leading space
at the start of a decode; byte-level BPE splits one character's UTF-8 bytes over several
tokens), so the panels' text is worked out in the context of the run's output so far. The
candidates of the top-k lists are shown each on its own. The app, the CLI and a saved
trace (trace_file.py) all label with this one class, so a replay shows what the run showed.
"""
from __future__ import annotations

from .events import StepEvent
from .render.trace import Labels


class Labeler:
    """Display text of each event's tokens, in the context of the run's output so far."""

    WINDOW = 4  # tokens of context: enough for leading spaces and split UTF-8 characters

    def __init__(self, models, loaded, prompt_ids: list[int]):
        self.models, self.loaded = models, loaded
        self.context = list(prompt_ids[-self.WINDOW:])
        self._alone: dict[int, str] = {}  # a token's text on its own, decoded once per run

    def _tail(self, ids: list[int], n: int) -> list[str]:
        pieces = self.models.token_strings(self.loaded, self.context + ids)
        return pieces[len(pieces) - n:] if n else []

    def _text(self, token: int) -> str:
        if token not in self._alone:
            self._alone[token] = self.models.token_strings(self.loaded, [token])[0]
        return self._alone[token]

    def _row(self, pairs) -> tuple[str, ...]:
        return tuple(self._text(t) for t, _ in pairs)

    def label(self, event) -> Labels:
        if isinstance(event, StepEvent):
            draft = tuple(self._tail(list(event.draft), len(event.draft)))
            token = self._tail(list(event.draft[: event.accepted]) + [event.token], 1)[0]
            tree = self._tree(event.tree) if event.tree is not None else ()
            rows = {"p_top": tuple(map(self._row, event.p_top)), "q_top": tuple(map(self._row, event.q_top))}
            emitted = event.emitted
        else:
            draft, tree, rows, emitted = (), (), {}, (event.token,)
            token = self._tail([event.token], 1)[0]
        self.context = (self.context + list(emitted))[-self.WINDOW:]
        return Labels(draft=draft, token=token, top=self._row(event.top), tree=tree, **rows)

    def _tree(self, tree) -> tuple[str, ...]:
        """Each node's text in the context of its own branch."""
        out = []
        for i in range(len(tree.tokens)):
            branch, j = [], i
            while j >= 0:
                branch.insert(0, tree.tokens[j])
                j = tree.parents[j]
            out.append(self._tail(branch, 1)[0])
        return tuple(out)
