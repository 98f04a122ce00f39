"""Step-through mode: the replay's stepper (ui/replay.py) for the run just made, and one step
played in its phases (draft, verify, accept/reject, then the corrected or bonus token), each
phase held on screen for a time the speed slider sets.

A live run is stepped through as a replay of itself: the engine has already run to the end,
and the recorded events are played back, so nothing here touches a model.
"""
from __future__ import annotations

import time

from ..core.events import StepEvent
from ..render.html import RESIDUAL, RESIDUAL_GLOSS, VISIBLE_WHITESPACE
from ..render.status import step_label
from ..traces import replay as playback

PHASE_SECONDS = 1.5  # each phase's time on screen at speed 1


def _tok(text: str) -> str:
    return f"“{text.translate(VISIBLE_WHITESPACE)}”"  # status_html escapes the message


def phases(e: StepEvent, labels) -> list[tuple[str, str]]:
    """(phase, what happens) for one step, in the order the engine does it."""
    texts = labels.draft if len(labels.draft) == len(e.draft) else tuple(f"#{t}" for t in e.draft)
    drafted = ", ".join(map(_tok, texts)) or "nothing"
    out = [("draft", f"the drafter proposes {len(e.draft)} token{'s' if len(e.draft) != 1 else ''}: {drafted}")]
    if e.draft:
        ps = ", ".join(f"{p:.3f}" for p in e.p)
        out.append(("verify", f"the target scores all of them in one forward pass: p = {ps}"))
        rule = ("kept while each is the target's top token" if e.greedy or e.draws is None else
                "kept while u < min(1, p/q): " + ", ".join(f"{u:.2f} vs {a:.2f}" for u, a in zip(e.draws, e.accept_prob)))
        rejected = f", {_tok(texts[e.accepted])} rejected" if e.accepted < len(e.draft) else ""
        out.append(("accept/reject", f"{e.accepted} kept{rejected} ({rule})"))
    if e.token_kind == "bonus" and e.draft:
        own = "bonus: every draft was kept, and the same pass gives one more token"
    elif not e.draft:
        own = "the target's own token"
    else:
        own = "correction: the target's token in place of the rejected draft" + (
            "" if e.greedy else f", drawn from the residual {RESIDUAL} ({RESIDUAL_GLOSS})")
    out.append(("correction" if e.token_kind == "corrected" and e.draft else "bonus", f"{own}: {_tok(labels.token)}"))
    return out


def play(r, session, speed, values, frame_of, sleep=time.sleep):
    """The next step in phases: the page before it with the step drawn as it stands in each
    phase (drafts pending, being checked, judged) and the phase named, then the page after it.
    `values(frame, session, r)` and `frame_of(r, spec, base, state, message)` are replay's."""
    n = playback.step_count(r.recording)
    if r.position >= n:
        spec, base = playback.after_steps(r.recording, n)
        yield values(frame_of(r, spec, base, "done", f"All {n} steps shown: Previous step to go back."), session, r)
        return
    pairs = [(e, lab) for e, lab in zip(r.recording.spec.events, r.recording.spec.labels) if isinstance(e, StepEvent)]
    e, labels = pairs[r.position]
    before = playback.after_steps(r.recording, r.position)
    steps = phases(e, labels)
    pause = PHASE_SECONDS / max(float(speed or 1.0), 0.1)
    for i, (name, text) in enumerate(steps[:-1]):
        message = f"{step_label(r.position, n)} · {i + 1}/{len(steps)} {name}: {text}"
        frame = frame_of(r, *before, "running", message)
        frame.playing = (e, labels, name)  # the step so far, after the text before it (html.phase_spans)
        yield values(frame, session, r)
        sleep(pause)
    name, text = steps[-1]
    message = f"{step_label(r.position, n)} · {len(steps)}/{len(steps)} {name}: {text}"
    r.position += 1
    yield values(frame_of(r, *playback.after_steps(r.recording, r.position),
                          "done" if r.position == n else "stopped", message), session, r)
