"""What a consumer has seen of one run: its events, in order, with each token's display text.

The engine's events carry token ids only. Turning ids into text needs the tokenizer, and a
token's text depends on the tokens before it (SentencePiece spaces, UTF-8 split over
several byte tokens), so the caller works it out once per event, in context, and hands it
over with the event. Everything in render/ then reads a Trace and never a tokenizer.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..core.events import RunEnd, RunStats, StepEvent, TokenEvent
from .kinds import shown_tokens


@dataclass(frozen=True)
class Labels:
    """Display text for the tokens one event mentions."""

    draft: tuple[str, ...] = ()  # one per drafted token (StepEvent.draft)
    token: str = ""  # the target's own token (StepEvent.token / TokenEvent.token)
    top: tuple[str, ...] = ()  # one per StepEvent.top (or TokenEvent.top) entry
    tree: tuple[str, ...] = ()  # one per tree node (StepEvent.tree.tokens), when the step drafted a tree
    p_top: tuple[tuple[str, ...], ...] = ()  # one per StepEvent.p_top entry, row by row (each token on its own)
    q_top: tuple[tuple[str, ...], ...] = ()  # one per StepEvent.q_top entry, row by row
    p_raw: tuple[tuple[str, ...], ...] = ()  # one per StepEvent.p_raw entry, row by row
    q_raw: tuple[tuple[str, ...], ...] = ()  # one per StepEvent.q_raw entry, row by row


@dataclass
class Trace:
    """One run as seen so far: `events[i]` is labelled by `labels[i]`; `end` once finished."""

    label: str  # what the panel calls this run ("baseline", "prompt lookup", a model id)
    speculative: bool = True
    events: list = field(default_factory=list)  # StepEvent (speculative) or TokenEvent
    labels: list = field(default_factory=list)
    end: RunEnd | None = None
    k: int = 0  # the configured draft length (0 for the baseline)
    error: str | None = None  # why the run could not start or finish, for the person
    eos: tuple[int, ...] = ()  # the ids that end a run (the target's), when the caller knows them
    shape: str = ""  # why the drafts have their shape (a chain where a tree could be, fewer than k), in words

    def end_ids(self) -> frozenset[int]:
        """The end-of-turn ids this run's text leaves out: `eos`, and the last token of a run
        the engine says ended at EOS (so a replay, which has no tokenizer, knows it too)."""
        ids = set(self.eos)
        if self.end is not None and self.end.stats.stop_reason == "eos" and self.end.token_ids:
            ids.add(self.end.token_ids[-1])
        return frozenset(ids)

    def add(self, event, labels: Labels | None = None) -> None:
        if isinstance(event, RunEnd):
            self.end = event
            return
        self.events.append(event)
        self.labels.append(labels or Labels())

    @property
    def done(self) -> bool:
        return self.end is not None

    @property
    def steps(self) -> list[StepEvent]:
        return [e for e in self.events if isinstance(e, StepEvent)]

    @property
    def token_ids(self) -> list[int]:
        """Every token emitted so far."""
        if self.end is not None:
            return list(self.end.token_ids)
        ids: list[int] = []
        for e in self.events:
            ids.extend(e.emitted if isinstance(e, StepEvent) else (e.token,))
        return ids

    def text(self) -> str:
        """The output so far as display text (the emitted tokens' labels, joined), without the
        end-of-turn token that ended it (the CLI's text leaves it out too)."""
        parts: list[str] = []
        eos = self.end_ids()
        for e, labels in zip(self.events, self.labels):
            texts = labels.draft + (labels.token,)
            parts.extend(texts[i] for kind, i in shown_tokens(e, eos) if kind != "rejected")
        return "".join(parts)

    @property
    def elapsed(self) -> float:
        """Engine seconds so far (prefill included once the run has ended)."""
        if self.end is not None:
            return self.end.stats.elapsed
        return self.events[-1].elapsed if self.events else 0.0

    def stats(self) -> RunStats:
        """The run's statistics: the engine's own at the end, a running tally before.

        Drafts count along each step's chain (for a tree: the branch the target followed and
        the first candidate it refused), so alpha reads the same for chains and trees, as the
        engine counts them; candidates count every node the target verified. A trace written
        before the engine counted candidates carried every node as drafted: recounted here.
        """
        if self.end is not None:
            stats = self.end.stats
            if not stats.candidates and stats.drafted:  # an older trace: its drafted counted every node
                trees = any(e.tree is not None for e in self.steps)
                stats = replace(stats, drafted=sum(len(e.draft) for e in self.steps) if trees else stats.drafted,
                                candidates=stats.drafted)
            return stats
        steps = self.steps
        draft_time = sum(e.draft_time for e in steps)
        step_time = sum(e.verify_time for e in steps) + sum(
            e.time for e in self.events if isinstance(e, TokenEvent)
        )
        return RunStats(
            tokens=len(self.token_ids), steps=len(self.events), target_calls=len(self.events),
            drafted=sum(len(e.draft) for e in steps), accepted=sum(e.accepted for e in steps),
            candidates=sum(len(e.tree.tokens) if e.tree is not None else len(e.draft) for e in steps),
            prefill_time=max(0.0, self.elapsed - draft_time - step_time),
            draft_time=draft_time, verify_time=step_time, elapsed=self.elapsed,
            stop_reason="running",
        )
