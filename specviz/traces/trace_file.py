"""A run saved as one JSON file, to replay anywhere with no model loaded.

A teacher records a run where the models are (a GPU, the CLI's `--trace FILE`, the app's
"Download trace") and replays it where they present (the app's replay, `python -m
specviz replay FILE`). The file holds what the run's pictures are drawn from, nothing a
model would be needed to recompute:

    {"format": "specviz-trace", "version": 1,
     "info": {"target", "drafter", "prompt", "greedy", "config", "source", "device", "created"},
     "runs": [{"role": "speculative" | "baseline", "label", "k", "error",
               "events": [{"type": "step" | "token", ...the event's fields..., "text": {...}}],
               "end": {"type": "end", "token_ids", "stats"} | null}],
     "verify_cost": {"sizes", "seconds", "weight_bytes", "device", "dtype"}}   (optional)

Each event is core/events.py's dataclass as a dict (event_to_dict), so a step carries its draft,
p and q, min(1, p/q), the draws u, and the target's and drafter's top (token, prob) at every
position (p_top, q_top), a baseline token its top; "text" is its render.Labels (the tokens'
display text as the run showed them), so no tokenizer is needed either. Times are the
engine's own, which is what replay.py paces a race by. "verify_cost" is the target's
verify-cost curve on the machine that recorded the run (engine/verify_cost.py), so a replay
elsewhere re-times the run with the costs it really had; older files without it still load.

`load` checks everything it reads and refuses a wrong, damaged, oversized or newer file in
one sentence (TraceFileError), so a replay never meets a half-valid event. JSON only: a
trace is data, never code.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import sys
import types
import typing
from dataclasses import dataclass, field

from ..core.errors import SpecvizError
from ..core.events import RunEnd, RunStats, StepEvent, TokenEvent, event_to_dict
from ..core.tree import check_parents
from ..engine.generate import K_MAX, VERIFICATIONS
from ..engine.verify_cost import VerifyCurve
from ..render.status import megabytes
from ..render.trace import Labels, Trace

FORMAT, VERSION = "specviz-trace", 1
MAX_TOKEN_ID = 2**31 - 1  # tokenizers index ids with 32-bit integers
MAX_CURVE_SIZES = 64  # a measured curve has a handful of sizes (1, 2, 4, ..., 32)
ROLES = ("speculative", "baseline")


class TraceFileError(SpecvizError):
    """A file that is not a trace this version of specviz can replay; the message says why."""


@dataclass(frozen=True)
class RunInfo:
    """What was run: shown beside a replay, never used to load anything."""

    target: str  # the target model's id or folder
    drafter: str  # the drafter as it was asked for ("pld", "eagle", a draft model's id)
    prompt: str = ""
    greedy: bool = True
    config: dict = field(default_factory=dict)  # the GenerationConfig (sampling nested), as a dict
    source: str = ""  # "app" or "cli"
    device: str = ""  # where it ran ("cuda: NVIDIA H200", "cpu"): the speeds are that machine's
    created: str = ""  # UTC time of saving, ISO 8601


@dataclass
class Recording:
    """A saved run: the speculative trace and, when one ran beside it, the baseline's."""

    info: RunInfo
    spec: Trace
    base: Trace | None = None
    curve: VerifyCurve | None = None  # the target's verify-cost curve where the run was recorded


# Writing ------------------------------------------------------------------------------------

def describe_device(model=None) -> str:
    """Where a run ran, for RunInfo.device: the model's device (the best one here when no
    model is given) and, on a GPU, its name."""
    import torch

    if model is not None:
        device = next(model.parameters()).device
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return device.type


def _run_dict(role: str, trace: Trace) -> dict:
    events = [{**event_to_dict(e), "text": dataclasses.asdict(labels)} for e, labels in zip(trace.events, trace.labels)]
    return {"role": role, "label": trace.label, "k": trace.k, "error": trace.error, "events": events,
            "end": event_to_dict(trace.end) if trace.end is not None else None}


def dumps(recording: Recording) -> str:
    info = dataclasses.replace(recording.info, created=recording.info.created or
                               datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    runs = [_run_dict("speculative", recording.spec)]
    if recording.base is not None:
        runs.append(_run_dict("baseline", recording.base))
    doc = {"format": FORMAT, "version": VERSION, "info": dataclasses.asdict(info), "runs": runs}
    if recording.curve is not None:
        doc["verify_cost"] = dataclasses.asdict(recording.curve)  # what was measured; the rest is derived
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def save(path, recording: Recording) -> None:
    """Write `recording` to `path` (UTF-8 JSON), replacing it only once the whole file is written."""
    text = dumps(recording)
    tmp = f"{path}.part"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# Reading ------------------------------------------------------------------------------------

def too_large(name: str, size: str, limit: str) -> str:
    """The sentence that refuses a trace file over a size limit (sizes as render.status.megabytes
    says them): load's, and the page's own, said in the browser before a file is sent (ui/blocks/uploads.py)."""
    return f"{name} is {size}: this app replays trace files of up to {limit}"


def load(path, max_bytes: int | None = None, max_steps: int | None = None) -> Recording:
    """Read and check a trace file; `max_bytes` refuses a larger one before reading it, `max_steps`
    one whose runs have more steps (the app's token cap: each step outputs at least one token)."""
    try:
        size = os.path.getsize(path)
        if max_bytes is not None and size > max_bytes:
            raise TraceFileError(too_large(os.path.basename(path), megabytes(size), megabytes(max_bytes)))
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise TraceFileError(f"could not read the trace file: {e.strerror or e}") from None
    return loads(data, max_steps)


def loads(data: str | bytes, max_steps: int | None = None) -> Recording:
    """A Recording from a trace file's text; TraceFileError says what is wrong with it."""
    try:
        doc = json.loads(data, parse_constant=_no_constant, parse_float=_finite, parse_int=_whole)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceFileError(f"not a specviz trace: the file is not valid JSON ({e}); "
                             "was it cut short or edited?") from None
    except RecursionError:  # Python's own message speaks of its decoder's recursion
        raise TraceFileError("not a specviz trace: its lists or objects are nested thousands of levels deep, "
                             "where a trace nests a few") from None
    except ValueError as e:
        raise TraceFileError(f"not a specviz trace: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TraceFileError("not a specviz trace: a trace is the JSON file that 'Download trace' or "
                             "'python -m specviz generate --trace FILE' writes")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TraceFileError(f"this trace file has no valid version number (got {version!r})")
    if version > VERSION:
        raise TraceFileError(f"this trace was written by a newer specviz (trace format version {version}; "
                             f"this one reads up to {VERSION}): update specviz to replay it")
    info = _build(RunInfo, doc.get("info"), "the trace's info")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        raise TraceFileError("the trace holds no runs")
    if len(runs) > len(ROLES):  # a third run was dropped without a word
        raise TraceFileError(f"the trace holds {len(runs):,} runs, where a trace holds a speculative run and at most "
                             "one baseline")
    traces = {}
    for i, run in enumerate(runs[:2]):
        role = run.get("role") if isinstance(run, dict) else None
        if role not in ROLES or role in traces:
            raise TraceFileError(f"run {i + 1} of the trace has role {role!r}; expected one speculative and "
                                 "at most one baseline run")
        traces[role] = _trace(run, role, max_steps)
    if "speculative" not in traces:
        raise TraceFileError("the trace has no speculative run")
    curve = _curve(doc["verify_cost"]) if doc.get("verify_cost") is not None else None
    return Recording(info, traces["speculative"], traces.get("baseline"), curve)


def _curve(d) -> VerifyCurve:
    """The recorded verify-cost curve, checked as the hardware view relies on it: sizes
    ascending from 1, one positive time each."""
    curve = _build(VerifyCurve, d, "the trace's verify-cost curve")
    sizes, seconds = curve.sizes, curve.seconds
    problem = (not sizes and "it has no sizes" or
               len(sizes) > MAX_CURVE_SIZES and f"it has {len(sizes)} sizes, where a curve has a handful" or
               len(seconds) != len(sizes) and "its sizes and times disagree in length" or
               sizes[0] != 1 and "its sizes do not start at one token" or
               any(b <= a for a, b in zip(sizes, sizes[1:])) and "its sizes do not ascend" or
               any(t <= 0 for t in seconds) and "a time is not positive" or
               any(t > MAX_SECONDS for t in seconds) and "a time is more than a week" or
               curve.weight_bytes < 0 and "its weight size is negative")
    if problem:
        raise TraceFileError(f"the trace's verify-cost curve is damaged: {problem}")
    return curve


def _no_constant(name: str):
    raise ValueError(f"the file holds {name}, which a trace never does")


# Every whole number a trace holds (token ids, counts, a seed) fits in this many digits; a longer one
# is damage, refused before Python's own digit limit can speak of sys.set_int_max_str_digits().
MAX_DIGITS = 20  # a seed may be up to 2**64 - 1


def _whole(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"the file holds a whole number of {len(text.lstrip('-'))} digits, where a trace's "
                         f"numbers have at most {MAX_DIGITS}")
    return int(text)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the file holds the number {text[:20]}, too large for any value a trace holds")
    return value


def _trace(run: dict, role: str, max_steps: int | None) -> Trace:
    label, k, error = run.get("label"), run.get("k", 0), run.get("error")
    if not isinstance(label, str) or not isinstance(k, int) or not (error is None or isinstance(error, str)):
        raise TraceFileError(f"the {role} run's label, k or error is not what a trace holds")
    if not 0 <= k <= K_MAX:
        raise TraceFileError(f"the {role} run's k is {k:,}, where a run drafts from 0 to {K_MAX} tokens a step")
    trace = Trace(label, speculative=role == "speculative", k=k, error=error)
    events = run.get("events")
    if not isinstance(events, list):
        raise TraceFileError(f"the {role} run has no event list")
    if max_steps is not None and len(events) > max_steps:
        raise TraceFileError(f"the {role} run has {len(events):,} {'steps' if trace.speculative else 'tokens'}, "
                             f"more than the {max_steps:,} new tokens this app allows a run")
    kind, noun = (StepEvent, "step") if trace.speculative else (TokenEvent, "token")
    for i, d in enumerate(events):
        where = f"{role} event {i + 1}"
        if not isinstance(d, dict) or d.get("type") != noun:
            raise TraceFileError(f"{where} is not a {noun} event")
        event, labels = _build(kind, d, where), _build(Labels, d.get("text", {}), f"{where}'s text")
        problem = _check(event, labels) or _in_order(event, i, trace)
        if problem:
            raise TraceFileError(f"{where} is damaged: {problem}")
        trace.add(event, labels)
    end = run.get("end")
    if end is not None:
        if not isinstance(end, dict) or not isinstance(end.get("stats"), dict):
            raise TraceFileError(f"the {role} run's end is damaged")
        stats = {f.name: end["stats"].get(f.name) for f in dataclasses.fields(RunStats)}
        ended = RunEnd(_convert(end.get("token_ids"), tuple[int, ...], f"the {role} run's token ids"),
                       _build(RunStats, stats, f"the {role} run's statistics"))
        problem = _counts(trace, ended)
        if problem:
            raise TraceFileError(f"the {role} run's statistics do not add up: {problem}")
        trace.add(ended)
    return trace


def _in_order(e, i: int, trace: Trace) -> str | None:
    """The laws an event keeps with the events before it, in words (None: it keeps them): steps numbered
    0, 1, 2, ... in order (duplicates and a last step numbered 1,000,000,000 loaded), each step starting
    where the text so far ends, and an engine clock that never runs backwards."""
    if e.step != i:
        return (f"its step number is {e.step:,} where it is the run's event {i + 1:,} (steps are numbered "
                f"0, 1, 2, ... in order, one per event)")
    if isinstance(e, StepEvent) and e.position != len(trace.token_ids):
        return f"it starts at token {e.position:,}, where the steps before it output {len(trace.token_ids):,}"
    before = trace.events[-1].elapsed if trace.events else 0.0
    if e.elapsed < before - ROUNDING:
        return (f"its elapsed time is {e.elapsed:g} s, before the event before it ({before:g} s): "
                "a clock never runs back")
    return None


def _counts(trace: Trace, end: RunEnd) -> str | None:
    """Where a run's end disagrees with its events, in words (None: its counts add up)."""
    s = end.stats
    emitted = tuple(t for e in trace.events for t in (e.emitted if isinstance(e, StepEvent) else (e.token,)))
    negative = next((f.name for f in dataclasses.fields(RunStats)
                     if isinstance(getattr(s, f.name), (int, float)) and getattr(s, f.name) < 0), None)
    return (negative and f"its {negative.replace('_', ' ')} is negative" or
            end.token_ids != emitted and "its token ids are not those its steps output" or
            s.tokens != len(end.token_ids) and f"it counts {s.tokens} tokens and lists {len(end.token_ids)}" or
            s.steps != len(trace.events) and f"it counts {s.steps} steps and holds {len(trace.events)}" or
            s.accepted > s.drafted and f"it accepted {s.accepted} of {s.drafted} drafts" or
            s.accepted != sum(getattr(e, "accepted", 0) for e in trace.events)
            and "its accepted drafts are not its steps' sum" or
            _too_long(("prefill time", s.prefill_time), ("draft time", s.draft_time),
                      ("verify time", s.verify_time), ("elapsed time", s.elapsed)) or
            trace.events and s.elapsed < trace.events[-1].elapsed - ROUNDING
            and f"its elapsed time {s.elapsed:g} s ends before its last event's {trace.events[-1].elapsed:g} s" or None)


MAX_SECONDS = 7 * 24 * 3600  # no recorded run takes a week: a larger time is an edit, and a replay would wait it out


def _too_long(*times: tuple[str, float]) -> str | None:
    """The first of `times` (name, seconds) over MAX_SECONDS, in words."""
    name, t = next(((n, t) for n, t in times if t > MAX_SECONDS), (None, None))
    return None if name is None else f"its {name} is {t:g} s, more than a week, which no run this file records takes"


def _build(cls, d, where: str):
    """An instance of dataclass `cls` from dict `d`, every field checked against its type."""
    if not isinstance(d, dict):
        raise TraceFileError(f"{where} is not a JSON object")
    hints, values = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        if f.name in d:
            values[f.name] = _convert(d[f.name], hints[f.name], f"{where}, field {f.name!r}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise TraceFileError(f"{where} has no {f.name!r}")
    return cls(**values)


def _convert(value, tp, where: str):
    """`value` as type `tp` (int, float, str, bool, dict, X | None, tuple[X, ...], tuple[X, Y],
    a dataclass): JSON lists become tuples, anything else is refused with `where` named."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(value, inner, where)
    if origin is tuple:
        if not isinstance(value, list) or (Ellipsis not in args and len(value) != len(args)):
            raise TraceFileError(f"{where} should be a list{'' if Ellipsis in args else f' of {len(args)}'}")
        inner = [args[0]] * len(value) if Ellipsis in args else args
        return tuple(_convert(v, t, where) for v, t in zip(value, inner))
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    ok = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
          str: lambda v: isinstance(v, str), bool: lambda v: isinstance(v, bool),
          dict: lambda v: isinstance(v, dict)}
    if tp not in ok or not ok[tp](value):
        raise TraceFileError(f"{where} should be {getattr(tp, '__name__', tp)}, got {type(value).__name__}")
    if tp is str:  # one copy of each text: a step's top-token rows repeat the same few thousand tokens' texts
        return sys.intern(value)
    return float(value) if tp is float else value


ROUNDING = 1e-6  # a probability computed in float32 may pass 1 by this much


def _law(e) -> str | None:
    """The first law of probability or time an event breaks, in words (None: it keeps them all).
    The inspector showed an edited file's "p (target) 7.500", and negative times turned a 2.98x
    GPU re-time into 0.74x: a trace is checked against what its numbers must be, not only their types."""
    times = ((("time", e.time),) if isinstance(e, TokenEvent) else
             (("draft time", e.draft_time), ("verify time", e.verify_time))) + (("elapsed time", e.elapsed),)
    problem = (next((f"its {name} is {t:g} s, and no time is negative" for name, t in times if t < 0), None) or
               _too_long(*times))
    if problem:
        return problem
    if isinstance(e, StepEvent):
        for name, rows in (("p_raw", e.p_raw), ("q_raw", e.q_raw)):  # log-probabilities: at most 0
            if any(lp > ROUNDING for row in rows for _, lp in row):
                return f"a log-probability in its {name} is above 0, so its probability is above 1"
    for name, values in _probabilities(e):
        bad = next((v for v in values if not -ROUNDING <= v <= 1 + ROUNDING), None)
        if bad is not None:
            return f"its {name} holds {bad:g}, and a probability is between 0 and 1"
    for name, rows in (("top", [e.top]), ("p_top", getattr(e, "p_top", ())), ("q_top", getattr(e, "q_top", ()))):
        total = max((sum(p for _, p in row) for row in rows), default=0.0)
        if total > 1 + 1e-4:  # each of a row's probabilities may be a float32 rounding over
            return f"its {name} probabilities sum to {total:g}, and a distribution's sum to at most 1"
    if isinstance(e, StepEvent):
        if e.emitted != (*e.draft[:e.accepted], e.token)[:len(e.emitted)]:
            return "its output is not the accepted drafts followed by its own token"
        if (e.token_kind == "bonus") != (e.accepted == len(e.draft)):
            return (f"it is a {e.token_kind} step with {e.accepted} of its {len(e.draft)} drafts kept (a bonus "
                    "follows every draft kept, a correction a rejection)")
    return None


def _probabilities(e) -> list:
    """Every probability an event holds, (name in a refusal, values), for _law to range-check."""
    probs = [("p", (e.p,) if isinstance(e, TokenEvent) else e.p), ("top", [p for _, p in e.top])]
    if isinstance(e, StepEvent):
        probs += [("q", e.q or ()), ("min(1, p/q)", e.accept_prob), ("draws u", e.draws or ()),
                  ("token p", (e.token_p,)), ("p_top", [p for row in e.p_top for _, p in row]),
                  ("q_top", [p for row in e.q_top for _, p in row])]
        if (tree := e.tree) is not None:
            probs += [("tree p", tree.p), ("tree acceptance", tree.accept_prob), ("tree draws", tree.draws),
                      ("tree residual mass", tree.residual_mass), ("tree q", tree.q), ("tree keep chances", tree.keep)]
    return probs


def _check(e, labels: Labels) -> str | None:
    """What the renderers rely on beyond types, in words (None: it keeps it all): lengths that agree,
    counts in range, and the laws its probabilities and times obey."""
    shape = (_step_shape(e, labels) if isinstance(e, StepEvent) else (e.token < 0 and "a negative token id" or
             e.token > MAX_TOKEN_ID and f"a token id above {MAX_TOKEN_ID}, more than any vocabulary holds"))
    problem = shape or _law(e)
    tree = e.tree.tokens if getattr(e, "tree", None) is not None else ()
    rows = [("top", [labels.top], [e.top]), ("tree", [labels.tree], [tree])]
    rows += [(name, getattr(labels, name), getattr(e, name, ())) for name in ("p_top", "q_top", "p_raw", "q_raw")]
    for name, texts, tokens in rows:
        if any(texts) and [len(r) for r in texts] != [len(r) for r in tokens]:  # texts, when kept, one per token
            problem = problem or f"its {name} texts do not match its {name} tokens"
    return problem


def _step_shape(e: StepEvent, labels: Labels) -> str | None:
    """Where a step's lengths, ids or rules disagree with its draft, in words (None: they agree)."""
    n = len(e.draft)
    if not (len(e.p) == len(e.accept_prob) == n and 0 <= e.accepted <= n and len(labels.draft) == n):
        return "its draft, p, acceptance and texts disagree in length"
    if any(x is not None and len(x) != n for x in (e.q, e.draws)):
        return "its q or draws do not match its draft"
    if any(len(r) not in (0, n + 1) for r in (e.p_top, e.p_raw)) or any(len(r) not in (0, n) for r in (e.q_top, e.q_raw)):
        return "its top-k rows do not match its draft"
    if e.token_kind not in ("corrected", "bonus") or min((e.token, *e.draft, *e.emitted)) < 0:
        return "its token kind or ids are invalid"
    if max((e.token, *e.draft, *e.emitted)) > MAX_TOKEN_ID:
        return f"a token id is above {MAX_TOKEN_ID}, more than any vocabulary holds"
    if e.tree is not None:  # a block check and its rule judge chains; a tree has its walk
        return _tree_problem(e.tree)
    if e.block is not None and any(len(x) != n for x in (e.block.weight, e.block.residual_mass, e.block.stop_prob)):
        return "its block verification does not match its draft"
    if e.verification not in VERIFICATIONS:
        return f"its verification rule {e.verification!r} is unknown"
    return None


def _tree_problem(tree) -> str | None:
    m = len(tree.tokens)
    if len(tree.parents) != m or len(tree.p) != m or any(not 0 <= i < m for i in (*tree.path, *tree.walk)):
        return "its tree's nodes disagree"
    if not len(tree.walk) == len(tree.accept_prob) == len(tree.draws) == len(tree.residual_mass):
        return "its tree's sibling walk disagrees in length"
    if len(tree.q) not in (0, len(tree.walk)) or len(tree.keep) not in (0, m):
        return "its drawn tree's q or keep chances disagree in length"
    try:
        check_parents(tree.parents)
    except ValueError as e:  # check_parents says what is wrong with the tree's shape
        return f"its tree is malformed ({e})"
    return None
