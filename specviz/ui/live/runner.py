"""Running what a visitor asked for, as a stream of Frames; no Gradio here.

A Frame is the whole picture so far (the traces, a status line); the runner yields the
same Frame object again each time something changed, and a handler renders it. Models
are loaded in a helper thread so download and conversion progress reach the page while
they happen. Every failure ends the stream with a readable message, never an exception:
the page keeps serving.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Generator, Iterator

import torch

from ...core.errors import SpecvizError
from ...drafters.suffix_memory import SuffixMemory
from ...engine.generate import GenerationConfig
from ...render import Trace
from ...render.status import count
from ...run.race import Race, baseline
from ...run.prepare import Prepared, Step, Steps, drive, prepare
from ...run.arms import Arm, parse_arm
from ...run.spec import NONE, model_name
from .limits import Deadline
from ..policy import Policy
from ...run.settings import Settings

log = logging.getLogger(__name__)
OUT_OF_MEMORY = (getattr(torch, "OutOfMemoryError", MemoryError), MemoryError)
HEARTBEAT = 2  # seconds without news from a load before its status counts them


@dataclass
class Frame:
    """Everything the page shows for one request, as it stands now."""

    base: Trace
    runs: list  # speculative Traces: one in the playground, one per drafter in Compare
    message: str = "Starting…"
    state: str = "loading"  # loading | running | done | stopped | error
    fraction: float | None = None  # progress of a load or of the Compare queue
    greedy: bool = True
    final: bool = False
    target: str = ""
    ahead: int | None = None  # runs ahead of this one in the line, while it waits
    charts: bool = True  # redraw the charts and the step inspector with this frame (see throttle)
    playing: tuple | None = None  # a step played in phases, (StepEvent, Labels, phase), after spec's text
    curve: object = None  # the target's verify_cost.VerifyCurve on this machine, once measured
    recorded_on: str | None = None  # a replay whose curve came with its file: the machine that recorded it
    steps: int | None = None  # the whole run's steps, when spec holds only the first ones (a replay)
    dtype: str = ""  # the target's precision ("torch.float16"): how large a margin its rounding explains

    @property
    def spec(self) -> Trace:
        return self.runs[0]


class Stopped(Exception):
    """Stop was pressed before the first token: there is nothing to show but that."""


def loading(step: Step, frame: Frame, should_stop) -> Generator[Frame, None, object]:
    """Load a model (a run/prepare.py load step) in a helper thread, yielding the frame with each
    progress message.

    Returns the loaded model; raises Stopped when the visitor pressed Stop meanwhile (the load
    finishes in the background and lands in the shared cache).
    """
    messages: queue.SimpleQueue = queue.SimpleQueue()
    box: dict = {}

    def work():
        try:
            box["loaded"] = step.work(lambda m, f: messages.put((m, f)))
        except BaseException as e:  # handed to the generator below, which re-raises it
            box["error"] = e
        finally:
            messages.put(None)

    threading.Thread(target=work, name=f"specviz load {step.says}", daemon=True).start()
    frame.state, frame.message, frame.fraction = "loading", f"Loading the {step.says}…", None
    yield frame
    said, since, shown = frame.message, time.monotonic(), 0
    while True:
        try:
            item = messages.get(timeout=0.2)
        except queue.Empty:
            if should_stop():
                raise Stopped
            # A phase can be silent for a minute (converting the embedded model): count its seconds.
            waited = int(time.monotonic() - since)
            if waited >= HEARTBEAT and waited != shown:
                frame.message, shown = f"{said} ({waited} s)", waited
                yield frame
            continue
        if item is None:
            break
        frame.message, frame.fraction = f"{step.says}: {item[0]}", item[1]
        said, since, shown = frame.message, time.monotonic(), 0
        yield frame
    if "error" in box:
        raise box["error"]
    return box["loaded"]


class Worker:
    """One helper thread for a whole run: the warm-up, the curve and every engine step run on
    it in turn, while the handler's thread keeps the page told (see waiting). One thread, not
    one per step: torch's per-thread state is set up once, and a run starts one thread, not
    hundreds."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="specviz work", daemon=True).start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            work, box = job
            try:
                box.put((True, work()))
            except BaseException as e:  # handed back to the caller of waiting
                box.put((False, e))

    def submit(self, work: Callable[[], object]) -> queue.SimpleQueue:
        """Queue work(); its (ok, value or exception) arrives in the returned box."""
        box: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs.put((work, box))
        return box

    def close(self) -> None:
        """The thread ends after the job it is on (a run closed mid-step finishes that step)."""
        self._jobs.put(None)

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def waiting(work: Callable[[], object], frame: Frame, say: Callable[[int], str], clock=time.monotonic,
            poll: float = 0.2, worker: Worker | None = None) -> Generator[Frame, None, object]:
    """Run work() on `worker` (a thread of its own when None) and return what it returns (or
    raise what it raises), yielding the frame with say(seconds) as its message each new second
    from HEARTBEAT on: a prefill of a long prompt, or a warm-up, can take a minute, and the
    page must say so."""
    if worker is None:
        with Worker() as own:
            return (yield from waiting(work, frame, say, clock, poll, own))
    box = worker.submit(work)
    since, shown = clock(), 0
    while True:
        try:
            ok, value = box.get(timeout=poll)
            break
        except queue.Empty:
            waited = int(clock() - since)
            if waited >= HEARTBEAT and waited != shown:
                frame.message, shown = say(waited), waited
                yield frame
    if not ok:
        raise value
    return value


def stepping(steps: Steps, frame: Frame, should_stop, worker: Worker | None = None) -> Generator[Frame, None, object]:
    """Run run/prepare.py's steps (what the CLI runs where it stands), each load on a thread of its own with
    its progress, the rest on `worker`, the frame saying each with its seconds; what the steps return."""
    def work(step: Step):
        if step.load:
            return (yield from loading(step, frame, should_stop))
        frame.state, frame.message, frame.fraction = "running", f"{step.says}…", None
        yield frame
        return (yield from waiting(lambda: step.work(None), frame, lambda s: f"{step.says}… {s} s", worker=worker))

    return (yield from drive(steps, work, through=(Stopped,)))


def readable(error: BaseException, hosted: bool = False) -> str:
    """The message a person sees for an error from anywhere below the UI.

    A hosted app keeps an unexpected error's text (which may hold paths) in its log.
    """
    if isinstance(error, SpecvizError):
        return str(error)
    if isinstance(error, OUT_OF_MEMORY):
        return ("out of memory: try a smaller model, fewer new tokens or a shorter prompt "
                f"({type(error).__name__})")
    log.exception("unexpected error in a run", exc_info=error)
    if hosted:
        return f"unexpected error ({type(error).__name__}); the details are in the server's log"
    return f"unexpected error ({type(error).__name__}): {error}"


def tokens_made(frame: Frame) -> str:
    """How many tokens each run made: "24 tokens each", or whose is whose ("speculative 48 tokens,
    baseline 40": a sampled run may end sooner, and the larger count alone did not say whose)."""
    runs = [("speculative" if len(frame.runs) == 1 else t.label, t) for t in frame.runs] + [("baseline", frame.base)]
    counts = [len(t.token_ids) for _, t in runs]
    if len(set(counts)) == 1:
        return count(counts[0], "token") + (" each" if len(counts) > 1 else "")
    first, *rest = runs
    return ", ".join([f"{first[0]} {count(len(first[1].token_ids), 'token')}"]
                     + [f"{name} {len(t.token_ids)}" for name, t in rest])


CONTEXT_FULL = "The run ended because the model's context is full"


def finish_frame(frame: Frame, deadline: Deadline) -> None:
    traces = [frame.base, *frame.runs]
    stopped = any(t.end and t.end.stats.stop_reason == "cancelled" for t in traces)
    frame.state = "stopped" if stopped else "done"
    made = tokens_made(frame)
    frame.message = f"Stopped after {made}." if stopped else f"Done: {made}."
    if stopped and deadline.passed:
        frame.message = f"Stopped at this app's time limit ({deadline.seconds:g} s a run) after {made}."
    if any(t.end and t.end.stats.stop_reason == "context" for t in traces):
        frame.message += f" {CONTEXT_FULL}."
    frame.fraction = None


def preparing(s: Settings, policy: Policy, models, frame: Frame, should_stop, arm: Arm | None = None,
             memory=None, worker: Worker | None = None) -> Generator[Frame, None, Prepared]:
    """run/prepare.py's steps up to the run's drafter (none by default: Compare makes its arms' own)."""
    # The chat box asks for the template where the model has one, as the CLI's default does: a
    # script's (or the page's) chat=True on a model without one sends the prompt as it is.
    steps = prepare(s, arm or parse_arm(NONE, s.config()), models, chat=None if s.chat else False,
                    check_prompt=policy.check_prompt_tokens, memory=SuffixMemory() if memory is None else memory,
                    cache_bytes=policy.model_bytes)
    return (yield from stepping(steps, frame, should_stop, worker))


def end_frame(frame: Frame, error: BaseException | None, hosted: bool) -> Frame:
    if isinstance(error, Stopped):
        frame.state, frame.message = "stopped", "Stopped before the run started."
    elif error is not None:  # shown in the page; the app keeps serving
        frame.state, frame.message = "error", readable(error, hosted)
    frame.fraction, frame.final = None, True
    return frame


def draft_shape(drafter, cfg: GenerationConfig) -> str:
    """Why this run's drafts have the shape they have, in words for the step inspector: a chain where
    EAGLE or Medusa could draft a tree, fewer drafts than k from Medusa's few heads."""
    model = getattr(drafter, "model", drafter)  # a hybrid's model drafter
    said = []
    if getattr(model, "tree_width", 0) > 1 and not cfg.trees:
        said.append(f"a chain, not a tree: when sampling above temperature {cfg.sampled_trees_up_to:g} EAGLE and "
                    "Medusa draft chains, which paid more there on the examples (trees did at 0.7)")
    heads = getattr(getattr(model, "heads", None), "blocks", None)
    if heads is not None and len(heads) < cfg.k:
        said.append(f"at most {len(heads)} drafts a step although k is {cfg.k}: Medusa drafts with one head per "
                    f"position ahead, and these heads are {len(heads)}")
    return "; ".join(said)


def playground(s: Settings, policy: Policy, models, should_stop: Callable[[], bool],
               memory: SuffixMemory | None = None) -> Iterator[Frame]:
    """The speculative run and the baseline, raced (run/race.py: in turn, never concurrently). memory: the
    visitor's suffix memory, which the speculative run reads and then adds its answer to."""
    frame = Frame(base=Trace("baseline", speculative=False), runs=[Trace(s.drafter, k=s.k)],
                  greedy=s.greedy, target=s.target)
    error, should_stop = None, Deadline(should_stop, policy.max_run_seconds)
    try:
        policy.check(s)
        arm = parse_arm(s.drafter, s.config())
        frame.spec.label = arm.label
        with Worker() as worker:  # the run's one thread for the model's work
            p = yield from preparing(s, policy, models, frame, should_stop, arm, memory, worker)
            race = Race(models, p.target, p.ids, {"spec": replace(arm, cfg=p.cfg), "base": baseline(p.cfg)},
                        {"spec": p.drafter})
            if should_stop():
                raise Stopped
            frame.curve = yield from stepping(race.warm(p.cfg, curve=True), frame, should_stop, worker)
            yield from _run_steps(frame, race, should_stop, time.monotonic, worker)
        finish_frame(frame, should_stop)
    except Exception as e:
        error = e
    end_frame(frame, error, policy.hosted)
    if frame.state == "error":
        frame.spec.error = frame.message  # the panel says why it is empty
    yield frame


def _run_steps(frame: Frame, race: Race, should_stop: Deadline, clock, worker: Worker):
    """Both runs advanced in turn, the status naming each phase with its seconds: reading the prompt
    (prefill of N tokens), then tokens so far."""
    ids = race.ids
    name, n = model_name(race.target.name), f"{len(ids):,} token{'' if len(ids) == 1 else 's'}"  # "4,000 tokens"
    frame.dtype = str(race.target.dtype)
    should_stop.start()
    started = clock()
    turns = race.run(should_stop)
    traces, read = race.traces, race.read
    frame.runs, frame.base = [traces["spec"]], traces["base"]
    frame.spec.shape = draft_shape(race.drafters["spec"], race.arms["spec"].cfg)

    def prefill(which: str) -> str:
        """"prefill of N tokens", with how far it has read once a long prompt's first chunk is in
        (all but the prompt's last token, which rides with the first step)."""
        frame.fraction = read[which] / len(ids) if read[which] else None
        if not read[which]:
            return f"prefill of {n}"
        return f"prefill: {read[which]:,} of {n} read, {frame.fraction:.0%}"  # "1,536 of 4,000 tokens read, 38%"

    def say(_waited: int = 0) -> str:  # seconds since generation began, not since this wait began
        s = int(clock() - started)
        made = max(len(t.token_ids) for t in traces.values())
        if not made:  # each run first reads the whole prompt
            return f"Generating with {name}: reading the prompt ({prefill('spec')})… {s} s"
        if not traces["base"].token_ids and not traces["base"].done:  # runs take turns: now the baseline's prefill
            return (f"Generating with {name}: the speculative run has {count(made, 'token')}; the baseline is "
                    f"reading the prompt ({prefill('base')})… {s} s")
        frame.fraction = None
        return f"Generating with {name}: {count(made, 'token')} so far, {s} s"

    frame.message = say()
    yield frame
    while (yield from waiting(lambda: next(turns, None), frame, say, clock, worker=worker)) is not None:
        frame.message = say()
        yield frame


def throttle(frames: Iterator[Frame], every: float = 0.3, clock=time.monotonic, charts_every: float = 2.0,
             duty: float = 0.1, timer=time.perf_counter) -> Iterator[Frame]:
    """Pass on at most one frame per `every` seconds, plus every change of state and the final one.

    The text grows at that pace; the charts and the step inspector (frame.charts) only every
    `charts_every` seconds, and less often when drawing them takes more than `duty` of the
    time. Four plotly figures cost the server 70-200 ms and the browser more: drawn with every
    text update they took most of the page's time, and a browser on the same 2-core machine
    took CPU from the engine. Their cost is what `timer` measures between passing a frame on
    and being asked for the next one (the handler renders it and Gradio sends it meanwhile).
    """
    last = last_charts = float("-inf")
    last_state, charts_cost = None, 0.0
    for frame in frames:
        now = clock()
        changed = frame.final or frame.state != last_state
        if changed or now - last >= every:
            frame.charts = changed or now - last_charts >= max(charts_every, charts_cost / duty)
            last, last_state = now, frame.state
            started = timer()
            yield frame
            if frame.charts:
                last_charts, charts_cost = now, timer() - started
