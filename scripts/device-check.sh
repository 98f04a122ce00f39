#!/usr/bin/env bash
# The local engine on a GPU machine, in one prepared run (issue 13, item 4): greedy output of
# every arm identical to plain decoding on CUDA, in fp32 and bf16, with the whole model on one
# device and spread by accelerate's device_map="auto"; where the layers went; and a quick bench.
#
#   scripts/device-check.sh [DEVICE]      (default cuda; `cpu` is a dry run of the script itself)
#
# Needs no network: a tiny random target and draft model are built in-process
# (tests/tiny_folder.py), and the embedded SmolLM2-135M is used when its converted folder is
# already in ~/.cache/specviz (carry it). Results go to $OUT (default ./device-check): one JSON
# per run and summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
device="${1:-cuda}"
out="${OUT:-device-check}"
py="${PYTHON:-.venv/bin/python}"
[ -x "$py" ] || py=python3
mkdir -p "$out"
prompt="Repeat exactly: red, green, blue, red, green, blue, red, green, blue."

"$py" - "$out" <<'PY'
import sys, torch
sys.path.insert(0, "tests")
from tiny_folder import make_tiny_model_dir
out = sys.argv[1]
make_tiny_model_dir(f"{out}/tiny-target", seed=0, layers=4)
make_tiny_model_dir(f"{out}/tiny-draft", seed=0, layers=1)
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "devices", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    print(" ", i, torch.cuda.get_device_name(i))
PY

targets=("$out/tiny-target")
if "$py" -c "import pathlib, specviz.modeling.embedded as e; raise SystemExit(0 if e._is_complete(e.cache_dir() / e.MODEL_DIR) else 1)" 2>/dev/null; then
    targets+=(default)
fi
for target in "${targets[@]}"; do
    name=$(basename "$target")
    drafters=(pld)
    if [ "$target" = default ]; then drafters+=(eagle medusa draft); else drafters+=("$out/tiny-draft"); fi
    for dtype in fp32 bf16; do
        for map in none auto; do
            for drafter in "${drafters[@]}"; do
                tag="$name-$dtype-map_$map-$(basename "$drafter")"
                extra=(); [ "$map" = auto ] && extra=(--device-map auto)
                "$py" -m specviz generate --target "$target" --drafter "$drafter" --device "$device" --dtype "$dtype" \
                    "${extra[@]}" --prompt "$prompt" --max-new-tokens 48 --json > "$out/$tag.json" 2> "$out/$tag.err" \
                    || echo "$tag: failed (see $out/$tag.err)"
            done
        done
    done
done
if [[ " ${targets[*]} " == *" default "* ]]; then
    "$py" -m specviz bench --target default --drafters pld,eagle,medusa,draft --device "$device" --quick \
        --json "$out/bench.json" --no-progress > "$out/bench.txt" 2>&1 || echo "bench failed (see $out/bench.txt)"
fi

"$py" - "$out" <<'PY' | tee "$out/summary.txt"
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    if f.name == "bench.json":
        continue
    try:
        r = json.loads(f.read_text())
    except ValueError:
        print(f"{f.stem}: no result"); continue
    st = r["stats"]
    print(f"{f.stem}: identical {r.get('identical_to_baseline')}, speedup {r.get('speedup') or 0:.2f}x, "
          f"alpha {st['acceptance_rate']:.2f}, tau {st['mean_accepted_length']:.2f}, {st['tokens_per_s']:.1f} tok/s")
PY
