"""The page's examples: the bench suite assets/bench/examples.jsonl, chosen by measurement.

Each line is a bench prompt (id, category = the lesson: copying, predicting, little to gain) plus
what the page needs: a short name, the drafter it suggests, one sentence of what it teaches and
the check its answer passes (tests/test_examples.py runs it on the real model). Every figure
an example shows, on its button and in its note, comes from one committed bench run over that
suite at the page's k, whose JSON records the command, CPU and date (RESULTS); re-measure with
that command. Speed is said as the range over the run's repeats, on the CPU named: another CPU
or a busy one gives another speed. Acceptance (alpha), tokens per pass (tau) and what the first
steps do are the same on any machine for a greedy run, and the slow test checks them against one.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field

from ...run.suites import ASSETS, load_suite
from ...run.spec import parse

RESULTS = ASSETS / "examples-k4.json"
K = 4  # the k the results were measured at (the page's default)


@dataclass(frozen=True)
class Example:
    id: str
    category: str  # the lesson
    name: str
    prompt: str
    drafter: str
    teaches: str
    check: dict
    measured: dict = field(default_factory=dict)  # the suggested drafter's bench entry at K
    # What the run's first steps do, as the note says it: {"steps": N, "drafted": d, "kept": a,
    # "refused": r} (r: steps that ended at a refused draft); the slow test checks it on the real model.
    first_steps: dict = field(default_factory=dict)
    speedups: tuple[float, ...] = ()  # one per repeat of the bench run, slowest first
    machine: str = ""  # the CPU and date of that run, in words

    @property
    def speedup(self) -> float:
        return self.measured.get("speedup") or 0.0

    @property
    def speed(self) -> str:
        """The measured speed, as both the button and the note say it: the range over the repeats."""
        low, high = (self.speedups[0], self.speedups[-1]) if self.speedups else (self.speedup, self.speedup)
        return f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"

    @property
    def label(self) -> str:
        """The example's button: what it shows, the drafter it uses, what it measured."""
        name = parse(self.drafter).label
        what = f"{name} {self.speed}" if self.measured else name
        return f"{self.name} · {what}"


def load_results(path: pathlib.Path = RESULTS) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def repeat_speedups(results: dict, prompt_id: str, arm: str) -> tuple[float, ...]:
    """The arm's speedup in each repeat, against the baseline's run of the same repeat, slowest first."""
    runs = {(r["prompt_id"], r["arm"], r["repeat"]): r for r in results.get("runs", [])}
    ratios = []
    for (pid, name, repeat), run in runs.items():
        base = runs.get((pid, "baseline", repeat))
        if pid == prompt_id and name == arm and base and run["seconds"] and base["tokens"]:
            ratios.append((base["seconds"] / base["tokens"]) / (run["seconds"] / run["tokens"]))
    return tuple(sorted(ratios))


def machine_said(results: dict) -> str:
    """"an AMD EPYC (2 cores, 1 torch thread), 2026-12-07": where and when the figures were measured."""
    env = results.get("environment", {})
    cpu = env.get("cpu") or env.get("processor") or "an unnamed CPU"
    threads = env.get("threads")
    with_threads = f", {threads} torch thread{'s' if threads != 1 else ''}" if threads else ""
    return f"{cpu} ({env.get('cpus', '?')} cores{with_threads}), {results.get('created', '')[:10]}"


def load_examples(suite: pathlib.Path = ASSETS / "examples.jsonl", results: pathlib.Path = RESULTS) -> list[Example]:
    doc = load_results(results)
    entries = {(e["prompt_id"], e["arm"]): e for e in doc.get("prompts", [])}
    raw = [json.loads(line) for line in suite.read_text(encoding="utf-8").splitlines() if line.strip()]
    load_suite(str(suite))  # the same checks as the bench's: ids unique, prompts well formed
    arm = lambda r: f"{r['drafter']} k={K}"  # noqa: E731
    return [Example(id=r["id"], category=r["category"], name=r["name"], prompt=r["prompt"], drafter=r["drafter"],
                    teaches=r["teaches"], check=r["check"],
                    measured=entries.get((r["id"], arm(r)), {}), first_steps=r.get("first_steps", {}),
                    speedups=repeat_speedups(doc, r["id"], arm(r)), machine=machine_said(doc) if doc else "")
            for r in raw]


def first_steps_said(first: dict) -> str:
    """The note's sentence on the first steps, from the example's own record of them."""
    if not first:
        return ""
    n, drafted, kept, refused = first["steps"], first["drafted"], first["kept"], first["refused"]
    refuses = ("never refuses a draft" if refused == 0 else "refuses a draft once" if refused == 1 else
               f"refuses a draft {refused} times")
    return f" In its first {n} steps the target keeps {kept} of {drafted} drafted tokens and {refuses}."


def note_html(example: Example) -> str:
    """What a picked example teaches, with its measured figures (escaped: the text is ours, but a
    user may edit the suite)."""
    from html import escape

    m = example.measured
    figures = ""
    if m:
        # The page's measures, named as its cards name them: alpha along the branch the target
        # followed (a tree drafts more candidates than that: said with it), tau, the speedup.
        cands = m.get("candidates_per_step") or 0.0
        along = (f", along the branch the target followed, in a tree of {cands:.1f} candidates a step"
                 if cands > K + 0.5 else "")
        where = f" on {escape(example.machine)}" if example.machine else ""
        figures = (f"{escape(first_steps_said(example.first_steps))} With {escape(parse(example.drafter).label)} "
                   f"at k = {K}: α {m['alpha']:.2f} (accepted / drafted{along}), τ {m['tau']:.2f} tokens per target "
                   f"pass, on any machine (greedy). Speed{where}: {example.speed} as fast as plain decoding; yours "
                   f"depends on this machine's CPU and load.")
    return f'<div class="sv-example-note"><b>{escape(example.category.capitalize())}.</b> {escape(example.teaches)}{figures}</div>'
