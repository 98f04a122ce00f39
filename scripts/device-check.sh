#!/usr/bin/env bash
# The local engine on a GPU machine, in one prepared run: the model matrix (docs/models.md: every
# family x precision x drafter on tiny models) on CUDA; greedy output of every arm identical to
# plain decoding (or parted at a near-tie the precision explains) in fp32, bf16 and fp16, with the
# whole model on one device and spread by accelerate's device_map="auto"; a quick bench; and, where
# the Hub is reachable, a real pair ($PAIR_TARGET with $PAIR_DRAFT, 1-3B) and a released EAGLE-3
# head ($EAGLE3_TARGET with $EAGLE3_HEAD) in bf16 and fp16.
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

"$py" -m specviz matrix --device "$device" --json "$out/matrix-$device.json" > "$out/matrix.txt" 2> "$out/matrix.err" \
    || echo "matrix: a cell differs beyond rounding, or it failed (see $out/matrix.txt, $out/matrix.err)"

targets=("$out/tiny-target")
if "$py" -c "import pathlib, specviz.modeling.embedded as e; raise SystemExit(0 if e._is_complete(e.cache_dir() / e.MODEL_DIR) else 1)" 2>/dev/null; then
    targets+=(default)
fi
for target in "${targets[@]}"; do
    name=$(basename "$target")
    drafters=(pld)
    if [ "$target" = default ]; then drafters+=(eagle medusa draft); else drafters+=("$out/tiny-draft"); fi
    for dtype in fp32 bf16 fp16; do
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
# A real pair and a released head, when the Hub can be reached (ids overridable; unverified offline).
if "$py" -c "from specviz.modeling.models import _hub_reachable as h; raise SystemExit(0 if h() else 1)" 2>/dev/null; then
    pairs=("${PAIR_TARGET:-Qwen/Qwen2.5-1.5B-Instruct}|${PAIR_DRAFT:-Qwen/Qwen2.5-0.5B-Instruct}"
           "${EAGLE3_TARGET:-Qwen/Qwen3-1.7B}|eagle:${EAGLE3_HEAD:-AngelSlim/Qwen3-1.7B_eagle3}")
    for pair in "${pairs[@]}"; do
        target="${pair%%|*}"; drafter="${pair#*|}"
        for dtype in bf16 fp16; do
            tag="hub-$(basename "$target")-$dtype-$(basename "${drafter#eagle:}")"
            "$py" -m specviz generate --target "$target" --drafter "$drafter" --device "$device" --dtype "$dtype" \
                --prompt "$prompt" --max-new-tokens 64 --json > "$out/$tag.json" 2> "$out/$tag.err" \
                || echo "$tag: failed (see $out/$tag.err)"
        done
    done
else
    echo "the Hugging Face Hub is not reachable: no real pair, no released head"
fi
if [[ " ${targets[*]} " == *" default "* ]]; then
    "$py" -m specviz bench --target default --drafters pld,eagle,medusa,draft --device "$device" --quick \
        --json "$out/bench.json" --no-progress > "$out/bench.txt" 2>&1 || echo "bench failed (see $out/bench.txt)"
fi

"$py" - "$out" <<'PY' | tee "$out/summary.txt"
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    if f.name == "bench.json" or f.name.startswith("matrix-"):
        continue
    try:
        r = json.loads(f.read_text())
    except ValueError:
        print(f"{f.stem}: no result"); continue
    st = r["stats"]
    tie = r.get("divergence") or {}
    print(f"{f.stem}: identical {r.get('identical_to_baseline')}{' (near-tie)' if tie.get('near_tie') else ''}, speedup {r.get('speedup') or 0:.2f}x, "
          f"alpha {st['acceptance_rate']:.2f}, tau {st['mean_accepted_length']:.2f}, {st['tokens_per_s']:.1f} tok/s")
PY
