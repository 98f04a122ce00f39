"""The page's examples: the bench suite assets/bench/examples.jsonl, chosen by measurement.

Each line is a bench prompt (id, category = the lesson: copying, predicting, does not pay) plus
what the page needs: a short name, the drafter it suggests, one sentence of what it teaches and
the check its answer passes (tests/test_examples.py runs it on the real model). The speedups
shown beside them come from the committed bench run over that suite, whose JSON records the
command, machine and date (assets/bench/examples-results.json); re-measure with that command.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field

from ..run.suites import ASSETS, load_suite
from ..run.spec import parse

RESULTS = ASSETS / "examples-results.json"
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
    tokens: int = 128  # enough for the whole answer (the check's test generates this many)
    measured: dict = field(default_factory=dict)  # the suggested drafter's bench entry at K

    @property
    def speedup(self) -> float:
        return self.measured.get("speedup") or 0.0

    @property
    def label(self) -> str:
        """The example's button: what it shows, the drafter it uses, what it measured."""
        name = parse(self.drafter).label
        what = f"{name} {self.speedup:.1f}x" if self.measured else name
        return f"{self.name} · {what}"


def load_results(path: pathlib.Path = RESULTS) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def load_examples(suite: pathlib.Path = ASSETS / "examples.jsonl", results: pathlib.Path = RESULTS) -> list[Example]:
    entries = {(e["prompt_id"], e["arm"]): e for e in load_results(results).get("prompts", [])}
    raw = [json.loads(line) for line in suite.read_text(encoding="utf-8").splitlines() if line.strip()]
    load_suite(str(suite))  # the same checks as the bench's: ids unique, prompts well formed
    return [Example(id=r["id"], category=r["category"], name=r["name"], prompt=r["prompt"], drafter=r["drafter"],
                    teaches=r["teaches"], check=r["check"], tokens=r.get("tokens", 128),
                    measured=entries.get((r["id"], f"{r['drafter']} k={K}"), {}))
            for r in raw]


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
        figures = (f" Measured with {escape(parse(example.drafter).label)} at k = {K}: "
                   f"α {m['alpha']:.2f} (accepted / drafted{along}), "
                   f"τ {m['tau']:.2f} tokens per target pass, {m['speedup']:.2f}x.")
    return f'<div class="sv-example-note"><b>{escape(example.category.capitalize())}.</b> {escape(example.teaches)}{figures}</div>'
