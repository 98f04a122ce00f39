"""Step-through mode: the replay's stepper (ui/blocks/replay.py) for the run just made, and one step
played in its phases (draft, verify, accept/reject, then the corrected or bonus token), each
phase held on screen for a time the speed slider sets. A sampled tree step plays its sibling
walk between verify and accept/reject, one phase per child judged (render/tree.py).

A live run is stepped through as a replay of itself: the engine has already run to the end,
and the recorded events are played back, so nothing here touches a model.
"""
from __future__ import annotations

import time

from ...core.events import StepEvent
from ...render.html import RESIDUAL, RESIDUAL_GLOSS, VISIBLE_WHITESPACE
from ...render.rules import backward_pass, comparable, expected, summary, token_source
from ...render.status import step_label
from ...render.tree import before_text, ordinal, sibling_walk, walk_end
from ...run import replay as playback
from ..views import inspected

PHASE_SECONDS = 1.5  # each phase's time on screen at speed 1


def _tok(text: str) -> str:
    return f"“{text.translate(VISIBLE_WHITESPACE)}”"  # status_html escapes the message


def _walk(e: StepEvent, labels) -> list[tuple[str, str]]:
    """A sampled tree step's sibling walk, a phase per child judged: p′(x) when its turn came,
    the draw, the verdict and, after a refusal, the mass the next p′ is divided by."""
    tree = e.tree
    if not sibling_walk(tree):  # greedy, a chain, or a trace from before walks were recorded
        return []
    names = labels.tree if len(labels.tree) == len(tree.tokens) else tuple(f"#{t}" for t in tree.tokens)
    out = []
    for j in sibling_walk(tree):
        parent = tree.parents[j.node]
        of = "the text so far" if parent < 0 else _tok(names[parent])
        if j.kept:
            then = "kept" + (", the walk goes down into it" if j.node in tree.parents else "")
        elif j.q is not None:
            then = f"refused; p′ becomes max(p′ − q_j, 0), divided by its mass, {j.left:.3f}"
        else:
            then = f"refused; p′ drops it and is renormalised: the rest of p divided by the mass left, {j.left:.3f}"
        sign = "<" if j.kept else "≥"
        if j.q is not None:  # a drawn child: recursive rejection sampling
            out.append(("recursive rejection", f"{ordinal(j.order)} child of {of}, {_tok(names[j.node])}, drawn "
                        f"from q_j (q_j(x) = {j.q:.3f}): {before_text(j)}, u = {j.u:.3f} {sign} it: {then}"))
            continue
        out.append(("sibling walk", f"{ordinal(j.order)} child of {of}, {_tok(names[j.node])}: "
                                    f"p′(x) = {before_text(j)}, u = {j.u:.3f} {sign} p′(x): {then}"))
    return out


def phases(e: StepEvent, labels) -> list[tuple[str, str]]:
    """(phase, what happens) for one step, in the order the engine does it."""
    walk = [] if e.greedy else _walk(e, labels)
    if walk:
        return _tree_phases(e, labels, walk)
    texts = labels.draft if len(labels.draft) == len(e.draft) else tuple(f"#{t}" for t in e.draft)
    drafted = ", ".join(map(_tok, texts)) or "nothing"
    out = [("draft", f"the drafter proposes {len(e.draft)} token{'s' if len(e.draft) != 1 else ''}: {drafted}")]
    if e.draft:
        ps = ", ".join(f"{p:.3f}" for p in e.p)
        out.append(("verify", f"the target scores all of them in one forward pass: p = {ps}"))
        ratio = "p′(x)" if e.tree is not None else "min(1, p/q)"  # a tree's children: one-hot guesses
        rule = ("kept while each is the target's top token" if e.greedy or e.draws is None else
                f"kept while u < {ratio}: " + ", ".join(f"{u:.2f} vs {a:.2f}" for u, a in zip(e.draws, e.accept_prob)))
        if e.verification == "block" and comparable(e):
            rule = "block verification, the backward pass: " + "; ".join(backward_pass(e))
        rejected = f", {_tok(texts[e.accepted])} rejected" if e.accepted < len(e.draft) else ""
        other = f" {summary(e)}" if comparable(e) else ""
        out.append(("accept/reject", f"{e.accepted} kept{rejected} ({rule}).{other}"))
    # The phase's name leads the status ("4/4 bonus: ..."), so its text does not say it again.
    if not e.draft:  # nothing to keep or reject: neither a bonus nor a correction
        out.append(("target's token", f"nothing was drafted, so the pass gives the target's next token alone: "
                                      f"{_tok(labels.token)}"))
        return out
    if e.token_kind == "bonus":
        own = "every draft was kept, and the same pass gives one more token"
    else:
        own = "the target's token in place of the rejected draft" + (
            "" if e.greedy else ", drawn from p′, p without the refused children, renormalised"
            if e.tree is not None else f", {token_source(e)}"
            if e.verification == "block" and comparable(e) else f", drawn from the residual {RESIDUAL} ({RESIDUAL_GLOSS})")
    out.append(("correction" if e.token_kind == "corrected" else "bonus", f"{own}: {_tok(labels.token)}"))
    return out


def _tree_phases(e: StepEvent, labels, walk: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A sampled tree step: the tree, its one forward, the walk child by child, then what it
    kept and the target's token (drawn from the final p′, or at a leaf from p)."""
    texts = labels.draft if len(labels.draft) == len(e.draft) else tuple(f"#{t}" for t in e.draft)
    n, drawn = len(e.tree.tokens), bool(e.tree.q)
    how = ("children drawn from its q without replacement" if drawn else
           "likeliest tokens, chosen, not drawn (one-hot guesses)")
    out = [("draft", f"the drafter proposes a tree of {n} candidate{'s' if n != 1 else ''}: at each node its {how}"),
           ("verify", "the target scores every candidate in one forward pass, each seeing only its own branch: "
                      "p at every node"),
           *walk]
    kept = ", ".join(map(_tok, texts[:e.accepted])) or "nothing"
    if drawn:
        out.append(("accept/reject", f"{e.accepted} kept along the branch: {kept} (recursive rejection sampling: a "
                                     "child is kept if u < min(1, p′/q_j))"))
    else:
        out.append(("accept/reject", f"{e.accepted} kept along the branch: {kept} (the sibling walk: a child is kept "
                                     f"if u < p′(x)). On average over the draws the walk keeps {expected(e)['walk']:.2f} "
                                     f"of the {n}, the most any exact rule keeps from this tree"))
    what = "correction" if e.token_kind == "corrected" else "bonus"
    out.append((what, f"{walk_end(e, labels.tree)}: {_tok(labels.token)}"))
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
    played = playback.after_steps(r.recording, r.position + 1)[0]  # the run up to this step, for the inspector
    for i, (name, text) in enumerate(steps[:-1]):
        message = f"{step_label(r.position, n)} · {i + 1}/{len(steps)} {name}: {text}"
        frame = frame_of(r, *before, "running", message)
        frame.playing = (e, labels, name)  # the step so far, after the text before it (html.phase_spans)
        shown = values(frame, session, r)
        if i > 0 and session.pinned is None:  # from the verify on, the inspector shows this step, not the last
            shown.update(inspected(played, r.position, n))
        yield shown
        sleep(pause)
    name, text = steps[-1]
    message = f"{step_label(r.position, n)} · {len(steps)}/{len(steps)} {name}: {text}"
    r.position += 1
    yield values(frame_of(r, *playback.after_steps(r.recording, r.position),
                          "done" if r.position == n else "stopped", message), session, r)
