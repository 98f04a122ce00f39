"""Is dynamic k within 10% of the best fixed k (issue 38)? Per prompt, on the real model.

    python scripts/dynamic_k_check.py --drafters pld,eagle+pld [--suite default|examples|PATH]
                                      [--repeats 3] [--max-new-tokens 128] [--json bench.json]
    python scripts/dynamic_k_check.py --from-json bench.json

The bench already runs every arm interleaved (A B C A B C ..., medians of the repeats): this
runs `python -m specviz bench --k 1,2,4,8 --dynamic-k 4` and then prints, per drafter and
prompt, each arm's tokens/s and dynamic / best fixed, with the median and the worst ratio.
`--suite examples` benches the app's examples (assets/examples.json). Extra arguments after
`--` go to the bench (e.g. `-- --device cuda --dtype bf16`).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXED = "1,2,4,8"


def examples_suite(folder: pathlib.Path) -> pathlib.Path:
    """The app's examples as a bench suite (JSONL)."""
    path = folder / "examples.jsonl"
    items = json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))
    with open(path, "w", encoding="utf-8") as f:
        for i, item in enumerate(items):
            f.write(json.dumps({"id": f"example-{i}", "category": "examples", "prompt": item["prompt"]}) + "\n")
    return path


def run_bench(args, extra: list[str], folder: pathlib.Path) -> pathlib.Path:
    out = pathlib.Path(args.json) if args.json else folder / "bench.json"
    suite = str(examples_suite(folder)) if args.suite == "examples" else args.suite
    cmd = [sys.executable, "-m", "specviz", "bench", "--drafters", args.drafters, "--k", FIXED,
           "--dynamic-k", "4", "--suite", suite, "--repeats", str(args.repeats),
           "--max-new-tokens", str(args.max_new_tokens), "--json", str(out), *extra]
    print("running:", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, cwd=ROOT)
    return out


def compare(doc: dict) -> int:
    """Print the table; the exit status is 1 when the median ratio of some drafter is under 0.9."""
    arms = {row["arm"]: row for row in doc["summary"] if row["category"] == "all"}
    rates: dict[tuple[str, str], float] = {(p["arm"], p["prompt_id"]): p["tokens_per_s"] for p in doc["prompts"]}
    prompts = list(dict.fromkeys(pid for _, pid in rates))
    status = 0
    for drafter in dict.fromkeys(a["drafter"] for a in arms.values() if a["engine"] == "specviz" and a["dynamic"]):
        mine = [a for a in arms.values() if a["drafter"] == drafter and a["engine"] == "specviz"
                and not a.get("confidence")]
        fixed = sorted((a for a in mine if not a["dynamic"]), key=lambda a: a["k"])
        dynamic = next(a for a in mine if a["dynamic"])
        print(f"\n{drafter}: tokens/s per prompt (dynamic / best fixed k)")
        print("prompt".ljust(24) + "".join(f"k={a['k']}".rjust(8) for a in fixed) + "dynamic".rjust(9) + "ratio".rjust(7))
        ratios = []
        for pid in prompts:
            row = [rates.get((a["arm"], pid), 0.0) for a in fixed]
            dyn = rates.get((dynamic["arm"], pid), 0.0)
            ratio = dyn / max(row) if max(row) else 0.0
            ratios.append(ratio)
            print(pid[:23].ljust(24) + "".join(f"{r:8.1f}" for r in row) + f"{dyn:9.1f}{ratio:7.2f}")
        median = statistics.median(ratios)
        print(f"median ratio {median:.2f}, worst {min(ratios):.2f} ({sum(r < 0.9 for r in ratios)} of "
              f"{len(ratios)} prompts under 0.90); whole suite: dynamic {dynamic['tokens_per_s']:.1f} tok/s, "
              f"best fixed {max(a['tokens_per_s'] for a in fixed):.1f}")
        status |= median < 0.9
    return status


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafters", default="pld")
    p.add_argument("--suite", default="default", help="a bench suite, or 'examples' for the app's examples")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--json", help="keep the bench's JSON record here")
    p.add_argument("--from-json", help="only compare: read an earlier bench JSON (run with --k 1,2,4,8 --dynamic-k 4)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(args.from_json) if args.from_json else run_bench(args, extra, pathlib.Path(folder))
        return compare(json.loads(path.read_text(encoding="utf-8")))


if __name__ == "__main__":
    sys.exit(main())
