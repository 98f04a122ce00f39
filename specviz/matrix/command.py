"""`python -m specviz matrix`: every family x precision x drafter on tiny models (cells.py),
printed as it goes and written as the results file docs/models.md's table is drawn from."""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

import torch

from ..core.errors import SpecvizError
from ..modeling.threads import environment
from . import cells as matrix
from .families import FAMILIES


def _names(text: str | None, known, what: str) -> list[str]:
    if not text:
        return list(known)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SpecvizError(f"unknown {what} {', '.join(unknown)}: choose from {', '.join(known)}")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--families", help=f"comma-separated (default: all {len(FAMILIES)}: {', '.join(FAMILIES)})")
    p.add_argument("--dtypes", help=f"comma-separated (default: {','.join(matrix.DTYPES)})")
    p.add_argument("--drafters", help=f"comma-separated (default: {','.join(matrix.DRAFTERS)})")
    p.add_argument("--device", default="cpu", help="where the tiny models run: cpu or cuda (default %(default)s)")
    p.add_argument("--json", metavar="FILE", help="write the results file (e.g. assets/models/matrix-cpu.json)")


def main(args: argparse.Namespace) -> int:
    families = _names(args.families, FAMILIES, "family")
    dtypes = _names(args.dtypes, tuple(matrix.DTYPES), "dtype")
    drafters = _names(args.drafters, matrix.DRAFTERS, "drafter")
    if args.device not in ("cpu", "cuda") or (args.device == "cuda" and not torch.cuda.is_available()):
        raise SpecvizError(f"device {args.device!r}: use cpu, or cuda where torch sees a GPU")

    def say(family, dtype, drafter, outcome):
        print(f"{family:>20} {dtype:>5} {drafter:>12}  {outcome}", file=sys.stderr, flush=True)

    torch.set_num_threads(1)  # 64-wide models: more threads only contend (tests/conftest.py measured 10-27x)
    doc = matrix.run(families, dtypes, drafters, say, device=args.device)
    counts = {}
    for c in doc["cells"]:
        counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
    print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f" in {doc['seconds']} s")
    if args.json:
        command = "python -m specviz " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["matrix"] else None
        doc = {"schema": "specviz-matrix/1",
               "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "environment": environment(args.device, "float32/bfloat16/float16"),
               "config": {"command": command}, **doc}
        path = pathlib.Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)
    return 1 if counts.get("differs") else 0
