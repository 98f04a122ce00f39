"""Audit every engine here for exact speculative sampling, into one results file (docs/exactness.md's table).

    python scripts/audit_engines.py [--draws 300] [--out assets/audit/engines.json] [--only NAME ...]

--only runs the audits named and keeps the file's others (its commands are all recorded).

Runs `python -m specviz audit`'s steps for specviz's drafters and transformers' `generate` (prompt
lookup; the distilled draft model exported as an assistant), then the two controls that must fail
(specviz with q taken before the warpers; transformers' lossy assistant_ensemble_weight), on the
embedded SmolLM2-135M, one torch thread. Each engine family's plain draws (same seeds, same
settings) are drawn once and shared by its audits. Fixed seeds; every audit runs once and is
written as it came out. The file is rewritten after each audit, so a stopped run keeps what it did.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout

import torch  # noqa: E402

from specviz.audit import command, report  # noqa: E402
from specviz.cli.main import build_parser  # noqa: E402

# (name, engine, drafter, extra flags, must it fail?)
AUDITS = (
    ("specviz pld", "specviz", "pld", [], False),
    ("specviz draft", "specviz", "draft", [], False),
    ("specviz eagle", "specviz", "eagle", [], False),
    ("specviz medusa", "specviz", "medusa", [], False),
    ("specviz draft, block verification", "specviz", "draft", ["--verification", "block"], False),
    ("transformers prompt lookup", "transformers", "pld", [], False),
    ("transformers assisted", "transformers", "draft", [], False),
    ("control: specviz draft, q before the warpers", "specviz", "draft", ["--lossy", "raw-q"], True),
    ("control: transformers assisted, ensemble weight 0.5", "transformers", "draft", ["--ensemble-weight", "0.5"],
     True),
    ("specviz suffix", "specviz", "suffix", [], False),
    ("specviz layerskip", "specviz", "layerskip", [], False),
)


class Shared:
    """A plain engine whose draws are kept by (family, setting, seed) and reused by the next audit."""

    def __init__(self, engine, store: dict, key):
        self.engine, self.store, self.key = engine, store, key

    def draw(self, seed):
        k = (*self.key, seed)
        if k not in self.store:
            self.store[k] = self.engine.draw(seed)
        return self.store[k]

    def settings(self):
        return self.engine.settings()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=300)
    ap.add_argument("--temperature", type=float, default=0.7,
                    help="(default 0.7: the warpers then change q, so the raw-q control has something to get wrong)")
    ap.add_argument("--out", default="assets/audit/engines.json")
    ap.add_argument("--only", nargs="*", help="audit only these names, keeping the file's others (default: all)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    store, rows, path = {}, [], pathlib.Path(args.out)
    command_line = "python scripts/audit_engines.py " + " ".join(argv if argv is not None else sys.argv[1:])
    kept = json.loads(path.read_text()) if args.only and path.exists() else None
    doc = {"format": "specviz-audit-set v1", "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
           "processor": platform.processor() or platform.machine(), "load_average_before": load,
           "versions": command.versions(), "threads": 1, "draws": args.draws, "temperature": args.temperature,
           "commands": (kept.get("commands") or [kept["command"]] if kept else []) + [command_line], "audits": rows}
    if kept:  # the others, as they were measured (the versions must match: one table, one stack)
        if kept["versions"] != doc["versions"] or kept["draws"] != args.draws or kept["temperature"] != args.temperature:
            raise SystemExit(f"{path} was measured with other versions or settings: re-run every audit")
        doc.update(date=kept["date"], load_average_before=kept["load_average_before"])
        rows += [a for a in kept["audits"] if a["name"] not in args.only]
    for name, engine, drafter, extra, control in AUDITS:
        if args.only and name not in args.only:
            continue
        a = build_parser().parse_args(["audit", "--engine", engine, "--drafter", drafter, "--draws",
                                       str(args.draws), "--temperature", str(args.temperature), *extra])
        command.check(a)
        make, show, what = command.engines(a)
        start, results = time.monotonic(), []
        for s in command.settings(a):
            spec, plain = make(s)
            plain = Shared(plain, store, (engine, s))
            results.append(command.audit_one(spec, plain, s, a, show, None))
            report.print_result(results[-1])
        rows.append({"name": name, "control": control, "audited": what, "flags": " ".join(
            ["--engine", engine, "--drafter", drafter, *extra]), "seconds": round(time.monotonic() - start),
            "results": results})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"audit_engines: {name} done in {rows[-1]['seconds']} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
